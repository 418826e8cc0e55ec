"""`headroom export`: pruned models that load without headroom. A global-scope pruned decoder (different head counts
per layer) and a pruned encoder (headroom's rotary BERT, pruned per layer) are exported and loaded in a virtual
environment that has torch and transformers but not headroom — through the modeling file each carries, with
trust_remote_code — and give headroom's own logits; the decoder generates. A uniformly pruned decoder exports as a
plain checkpoint. Bad input is one line, exit 2, nothing written."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import textwrap

import pytest
import torch
from conftest import headroom

from lightning_modules.config import model_config_for
from lightning_modules.heads import prune_heads
from lightning_modules.models import build_model, save_model

X = torch.tensor([[10, 20, 30, 40, 50, 60, 70, 80], [5, 4, 3, 2, 1, 0, 9, 8]])


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory):
    """A venv without headroom: this environment's packages (torch, transformers) on its path through a .pth line,
    which does not run the .pth files there (headroom's editable install is one), and -I keeps the working
    directory off the path."""
    root = tmp_path_factory.mktemp("bare")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=120)
    py = root / "venv" / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with open(f"{site}/deps.pth", "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    probe = "import importlib.util as u; print([m for m in ('lightning_modules', 'orchestration') if u.find_spec(m)])"
    out = subprocess.run([str(py), "-I", "-c", probe], capture_output=True, text=True, cwd=root, check=True)
    assert out.stdout.strip() == "[]", out.stdout  # headroom's code is not importable there
    return py


def _load_outside(py, d, auto: str, generate: bool = False, trust: bool = True) -> torch.Tensor:
    script = textwrap.dedent(f"""
        import json, sys, torch, transformers
        m = transformers.{auto}.from_pretrained({str(d)!r}, trust_remote_code={trust}).eval()
        x = torch.tensor({X.tolist()})
        with torch.no_grad():
            out = {{"logits": m(input_ids=x).logits.tolist(), "class": type(m).__name__}}
            if {generate}:
                out["generated"] = m.generate(x[:1], max_new_tokens=4, do_sample=False).tolist()
        tok = transformers.AutoTokenizer.from_pretrained({str(d)!r})
        out["tokens"] = tok("def f", add_special_tokens=False)["input_ids"]
        print(json.dumps(out))
    """)
    r = subprocess.run([str(py), "-I", "-c", script], capture_output=True, text=True, timeout=300, cwd=d)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _run_dir(tmp_path, model):
    save_model(model, tmp_path / "run" / "model")
    return tmp_path / "run"


def test_a_global_prune_exports_with_its_modeling_file_and_matches_outside_headroom(tmp_path, bare_python):
    model = build_model(model_config_for("xs"), seed=0).eval()
    prune_heads(model, [[0, 3, 5], [1, 2, 4, 6, 7]])  # 3 and 5 heads: no config of transformers says that
    r = headroom("export", _run_dir(tmp_path, model), "--out", tmp_path / "out")
    assert r.returncode == 0 and "trust_remote_code=True" in r.stdout, r.stderr
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["auto_map"] == {"AutoModelForCausalLM": "modeling_headroom.HeadroomLlamaForCausalLM"}
    got = _load_outside(bare_python, tmp_path / "out", "AutoModelForCausalLM", generate=True)
    with torch.no_grad():
        want = model(input_ids=X).logits
        gen = model.generate(X[:1], max_new_tokens=4, do_sample=False)
    assert got["class"] == "HeadroomLlamaForCausalLM"
    torch.testing.assert_close(torch.tensor(got["logits"]), want, rtol=1e-4, atol=1e-5)
    assert got["generated"] == gen.tolist() and len(got["generated"][0]) == X.shape[1] + 4
    assert got["tokens"] == list(b"def f")  # headroom's byte tokenizer, as a transformers one


def test_a_pruned_rotary_encoder_exports_and_matches_outside_headroom(tmp_path, bare_python):
    model = build_model(model_config_for("xs", "encoder"), seed=0).eval()
    prune_heads(model, [[0, 1, 2, 3], [4, 5, 6, 7]])
    assert headroom("export", _run_dir(tmp_path, model), "--out", tmp_path / "out").returncode == 0
    got = _load_outside(bare_python, tmp_path / "out", "AutoModelForMaskedLM")
    with torch.no_grad():
        want = model(input_ids=X).logits
    assert got["class"] == "HeadroomBertForMaskedLM"
    torch.testing.assert_close(torch.tensor(got["logits"]), want, rtol=1e-4, atol=1e-5)


def test_a_uniform_prune_exports_as_a_plain_checkpoint(tmp_path, bare_python):
    model = build_model(model_config_for("xs"), seed=0).eval()
    prune_heads(model, [[0, 1, 2, 3], [4, 5, 6, 7]])
    r = headroom("export", _run_dir(tmp_path, model), "--out", tmp_path / "out")
    assert r.returncode == 0 and "plain transformers" in r.stdout
    assert not (tmp_path / "out" / "modeling_headroom.py").exists()
    got = _load_outside(bare_python, tmp_path / "out", "AutoModelForCausalLM", trust=False)
    with torch.no_grad():
        torch.testing.assert_close(torch.tensor(got["logits"]), model(input_ids=X).logits, rtol=1e-4, atol=1e-5)


def test_a_pruned_gpt2_exports_and_matches_outside_headroom(tmp_path, bare_python):
    """GPT-2 ties head size to n_embd / n_head: a pruned one (2 and 3 heads of 8 on n_embd 32) needs the file."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=260, n_positions=64)).eval()
    prune_heads(model, [[0, 2], [1, 2, 3]])
    assert headroom("export", _run_dir(tmp_path, model), "--out", tmp_path / "out").returncode == 0
    got = _load_outside(bare_python, tmp_path / "out", "AutoModelForCausalLM")
    with torch.no_grad():
        want = model(input_ids=X).logits
    assert got["class"] == "HeadroomGPT2LMHeadModel"
    torch.testing.assert_close(torch.tensor(got["logits"]), want, rtol=1e-4, atol=1e-5)


def test_export_refuses_bad_input_in_one_line(tmp_path):
    run = _run_dir(tmp_path, build_model(model_config_for("xs"), seed=0))
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "f").write_text("x")
    for args, needle in (([tmp_path / "nothing", "--out", tmp_path / "o"], "no such directory"),
                         ([run, "--out", tmp_path / "busy"], "exists and is not empty")):
        r = headroom("export", *args)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and needle in lines[0], r.stderr
    assert not (tmp_path / "o").exists() and [p.name for p in (tmp_path / "busy").iterdir()] == ["f"]
