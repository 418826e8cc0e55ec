"""`headroom export`: pruned models that load without headroom. A global-scope pruned decoder (different head counts
per layer), a pruned encoder (headroom's rotary BERT), a pruned GPT-2 and a uniformly pruned decoder are exported
and loaded in a virtual environment that has torch and transformers but not headroom — the first three through the
modeling file each carries (trust_remote_code), the last as a plain checkpoint — and give headroom's own logits;
the decoder generates. The global decoder and the encoder are also exported to ONNX: onnxruntime, in the same bare
environment, gives headroom's logits on a batch of another shape than the export's sample. Bad input is one line,
exit 2, nothing written."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import textwrap

import pytest
import torch
from conftest import headroom

from lightning_modules.declarations.config import model_config_for
from lightning_modules.models.build import build_model, save_model
from lightning_modules.models.heads import prune_heads

X = torch.tensor([[10, 20, 30, 40, 50, 60, 70, 80], [5, 4, 3, 2, 1, 0, 9, 8]])
X3 = torch.randint(0, 256, (3, 11), generator=torch.Generator().manual_seed(3))  # not the ONNX export's 2 x 8


def _bare_python(root):
    """A venv without headroom: this environment's packages (torch, transformers) on its path through a .pth line,
    which does not run the .pth files there (headroom's editable install is one); -I keeps the working directory
    off the path."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=120)
    py = root / "venv" / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with open(f"{site}/deps.pth", "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    return py


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=260, n_positions=64)).eval()


# name: (the model, the heads each layer keeps, the Auto class it loads through, whether it needs the modeling file)
ONNX = ("global", "encoder")  # exported with --onnx too
CASES = {
    "global": (lambda: build_model(model_config_for("xs"), seed=0), [[0, 3, 5], [1, 2, 4, 6, 7]],
               "AutoModelForCausalLM", True),
    "encoder": (lambda: build_model(model_config_for("xs", "encoder"), seed=0), [[0, 1, 2, 3], [4, 5, 6, 7]],
                "AutoModelForMaskedLM", True),
    "gpt2": (_gpt2, [[0, 2], [1, 2, 3]], "AutoModelForCausalLM", True),  # head size tied to n_embd / n_head
    "uniform": (lambda: build_model(model_config_for("xs"), seed=0), [[0, 1, 2, 3], [4, 5, 6, 7]],
                "AutoModelForCausalLM", False),
}

OUTSIDE = textwrap.dedent("""
    import importlib.util, json, os, sys, torch, transformers
    assert not [m for m in ("lightning_modules", "orchestration") if importlib.util.find_spec(m)], "headroom found"
    cases, x, out = json.loads(sys.argv[1]), torch.tensor(json.loads(sys.argv[2])), {}
    x3 = torch.tensor(json.loads(sys.argv[3]))
    for name, (d, auto, trust) in cases.items():
        m = getattr(transformers, auto).from_pretrained(d, trust_remote_code=trust).eval()
        with torch.no_grad():
            r = {"logits": m(input_ids=x).logits.tolist(), "class": type(m).__name__}
        if os.path.exists(d + "/onnx/model.onnx"):
            import onnxruntime
            s = onnxruntime.InferenceSession(d + "/onnx/model.onnx", providers=["CPUExecutionProvider"])
            r["onnx"] = s.run(["logits"], {"input_ids": x3.numpy()})[0].tolist()
            if name == "global":
                r["generated"] = m.generate(x[:1], max_new_tokens=4, do_sample=False).tolist()
        r["tokens"] = transformers.AutoTokenizer.from_pretrained(d)("def f", add_special_tokens=False)["input_ids"]
        out[name] = r
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Every case pruned, saved as a run directory and exported (the global one through the CLI, the others
    in-process), then loaded in one process of the bare venv: (headroom's models, the CLI's output, the results)."""
    from lightning_modules.models.export import export

    root = tmp_path_factory.mktemp("export")
    models, cases, said = {}, {}, {}
    for name, (make, keep, auto, remote) in CASES.items():
        model = prune_heads(make().eval(), keep)
        save_model(model, root / name / "model")
        if name == "global":
            r = headroom("export", root / name, "--out", root / f"{name}-out", "--onnx")
            assert r.returncode == 0, r.stderr
            said[name] = r.stdout
        else:
            said[name] = export(str(root / name), root / f"{name}-out", onnx=name in ONNX)
        models[name], cases[name] = model, (str(root / f"{name}-out"), auto, remote)
    r = subprocess.run([str(_bare_python(root)), "-I", "-c", OUTSIDE, json.dumps(cases), json.dumps(X.tolist()),
                        json.dumps(X3.tolist())],
                       capture_output=True, text=True, timeout=600, cwd=root)
    assert r.returncode == 0, r.stderr[-3000:]
    return root, models, said, json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", list(CASES))
def test_an_exported_model_matches_headroom_outside_headroom(exported, name):
    root, models, said, got = exported
    remote = CASES[name][3]
    cfg = json.loads((root / f"{name}-out" / "config.json").read_text())
    assert ("auto_map" in cfg) == remote == (root / f"{name}-out" / "modeling_headroom.py").exists()
    with torch.no_grad():
        want = models[name](input_ids=X).logits
    torch.testing.assert_close(torch.tensor(got[name]["logits"]), want, rtol=1e-4, atol=1e-5)
    assert ("onnx" in got[name]) == (name in ONNX)
    if name in ONNX:  # batch and length are the graph's inputs: another shape than its export sample
        with torch.no_grad():
            want3 = models[name](input_ids=X3).logits
        torch.testing.assert_close(torch.tensor(got[name]["onnx"]), want3, rtol=1e-4, atol=1e-5)
        assert said[name]["onnx"]["max_abs_diff"] < 1e-4 if name != "global" else "max |logit difference|" in said[name]
    assert got[name]["class"].startswith("Headroom") == remote
    assert got[name]["tokens"] == list(b"def f")  # headroom's byte tokenizer, as a transformers one
    if name == "global":
        assert "AutoModelForCausalLM.from_pretrained(..., trust_remote_code=True)" in said[name]
        assert cfg["auto_map"] == {"AutoModelForCausalLM": "modeling_headroom.HeadroomLlamaForCausalLM"}
        with torch.no_grad():
            gen = models[name].generate(X[:1], max_new_tokens=4, do_sample=False)
        assert got[name]["generated"] == gen.tolist() and len(gen[0]) == X.shape[1] + 4
    else:
        assert said[name]["remote_code"] == remote


def test_export_refuses_bad_input_in_one_line(exported, tmp_path):
    root = exported[0]
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "f").write_text("x")
    for args, needle in (([tmp_path / "nothing", "--out", tmp_path / "o"], "no such directory"),
                         ([root / "uniform", "--out", tmp_path / "busy"], "exists and is not empty")):
        r = headroom("export", *args)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and needle in lines[0], r.stderr
    assert not (tmp_path / "o").exists() and [p.name for p in (tmp_path / "busy").iterdir()] == ["f"]


def test_a_failed_onnx_check_leaves_nothing_behind(tmp_path, monkeypatch):
    """write_onnx raises when onnxruntime disagrees with PyTorch past its tolerance (here: any difference at all is
    too much); the export then writes nothing — no output directory, no temporary one beside it."""
    from lightning_modules.models import export as ex

    monkeypatch.setattr(ex, "ONNX_ATOL", -1.0)
    model = prune_heads(build_model(model_config_for("xs"), seed=0).eval(), [[0, 3, 5], [1, 2, 4, 6, 7]])
    with pytest.raises(ValueError, match="differ from PyTorch's"):
        ex.write_export(model, tmp_path / "out", onnx=True)
    assert list(tmp_path.iterdir()) == []
