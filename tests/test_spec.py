"""Sweep files: every shipped one validates; malformed ones fail with one line naming the field, before torch,
Ray or MLflow is imported, and leave nothing behind (the plan they make: test_plan.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT

GOOD = textwrap.dedent("""\
    name: t
    family: decoder
    data: {source: stdlib}
    scales:
      xs: {steps: 20, overrides: {batch_size: 4, seq_len: 32}}
    seeds: [0, 1]
    prune: {ratios: [0.5], methods: [gradient, random]}
    controls: [scratch_e]
""")

# (name, sweep text, the field path the one error line must name)
BAD = [
    ("seeds-wrong-type", GOOD.replace("seeds: [0, 1]", "seeds: abc"), "seeds"),
    ("unknown-top-key", GOOD + "epochs: 3\n", "epochs: unknown key"),
    ("unknown-nested-key", GOOD.replace("methods:", "metods:"), "prune.metods: unknown key"),
    ("empty-methods", GOOD.replace("[gradient, random]", "[]"), "prune.methods"),
    ("ratio-one", GOOD.replace("ratios: [0.5]", "ratios: [0.5, 1.0]"), "prune.ratios[1]: must be in [0, 1)"),
    ("unknown-method", GOOD.replace("[gradient, random]", "[gradient, magic]"), "prune.methods[1]: unknown method"),
    ("ratio-empties-layer", GOOD.replace("ratios: [0.5]", "ratios: [0.95]"), "prune.ratios[0]"),
    ("missing-data-path", GOOD.replace("source: stdlib", "source: 'path:/nonexistent/dir/*.txt'"), "data.source"),
    # executables are not text: refused (naming the first), never decoded with replacement characters
    ("binary-data-path", GOOD.replace("source: stdlib", "source: 'path:/usr/bin/l*'"), "holds NUL bytes"),
    ("duplicate-seeds", GOOD.replace("seeds: [0, 1]", "seeds: [0, 0]"), "seeds: duplicate value 0"),
    ("unknown-scale", GOOD.replace("  xs: {", "  xxl: {"), "scales: unknown scale 'xxl'"),
    ("negative-steps", GOOD.replace("steps: 20", "steps: -5"), "scales.xs.steps"),
    ("unknown-family", GOOD.replace("family: decoder", "family: transformer"), "family[0]"),
    ("negative-lr", GOOD + "lr: -1\n", "lr.value"),
    ("lr-search-bounds", GOOD + "lr: {search: {trials: 4, low: 0.1, high: 0.01, steps: 5}}\n", "lr.search"),
    ("lr-search-too-long", GOOD + "lr: {search: {trials: 4, low: 0.001, high: 0.01, steps: 50}}\n", "lr.search.steps"),
    ("missing-prune", GOOD.replace("prune: {ratios: [0.5], methods: [gradient, random]}\n", ""), "prune: required"),
    ("missing-name", GOOD.replace("name: t\n", ""), "name: required"),
    ("bad-name", GOOD.replace("name: t", "name: 'my sweep!'"), "name"),
    ("bad-scope", GOOD.replace("methods: [gradient, random]}", "methods: [random], scope: both}"), "prune.scope[0]"),
    ("bad-schedule", GOOD.replace("methods: [gradient, random]}", "methods: [random], schedule: [gradual]}"),
     "prune.schedule[0]"),
    ("unknown-control", GOOD.replace("[scratch_e]", "[scratch_c]"), "controls[0]"),
    ("negative-gpu", GOOD + "resources: {cpu: 1, gpu: -1}\n", "resources.gpu"),
    ("yaml-syntax", GOOD + "prune: [unclosed\n", "line "),
    ("duplicate-key", GOOD + "seeds: [3]\n", "duplicate key 'seeds'"),
    ("top-level-list", "- name: t\n", "expected a mapping"),
    ("pretrained-missing", "name: p\npretrained: {checkpoint: /nonexistent/model}\nprune: {ratios: [0.5], "
                           "methods: [random]}\n", "pretrained.checkpoint"),
    ("seq-len-over-max", GOOD.replace("seq_len: 32", "seq_len: 4096"), "scales.xs: seq_len 4096 exceeds"),
    ("unknown-override", GOOD.replace("batch_size: 4", "lr: 0.1"), "scales.xs.overrides.lr: unknown key"),
    ("budgets-repeated", GOOD.replace("steps: 20,", "steps: [20, 20],"), "scales.xs.steps: duplicate value 20"),
    ("budget-not-positive", GOOD.replace("steps: 20,", "steps: [0, 20],"), "scales.xs.steps: must be a positive"),
    ("prune-at-over-one", GOOD.replace("random]}", "random], at: [1.5]}"), "prune.at[0]"),
    # an early prune cannot distil from the dense model at T, whose training its compute counts only to p·T
    ("early-prune-distilled", GOOD.replace("random]}", "random], at: [0.5, 1.0], finetune_steps: 5, "
                                                       "recovery: [lm, distill]}"),
     "prune.at: a prune at p < 1 recovering by distill"),
    ("bad-tokenizer", GOOD.replace("{source: stdlib}", "{source: stdlib, tokenizer: wordpiece}"), "data.tokenizer"),
    ("negative-finetune", GOOD.replace("methods: [gradient, random]}", "methods: [random], finetune_steps: -1}"),
     "prune.finetune_steps"),
    ("zero-heads", GOOD.replace("steps: 20,", "steps: 20, heads: 0,"), "scales.xs.heads"),
    ("zero-tolerance", GOOD.replace("methods: [gradient, random]}", "methods: [random], tolerance: 0}"),
     "prune.tolerance"),
    ("unknown-source", GOOD.replace("source: stdlib", "source: 'ftp:x'"), "data.source"),
    ("no-scales", GOOD.replace("scales:\n  xs: {steps: 20, overrides: {batch_size: 4, seq_len: 32}}\n", ""),
     "scales: required"),
    ("empty-file", "", "expected a mapping"),
    ("probes-every-zero", GOOD + "probes: {every: 0}\n", "probes.every"),
    ("probes-unknown-method", GOOD + "probes: {every: 10, method: psychic}\n", "probes.method: unknown method"),
    ("probes-unknown-key", GOOD + "probes: {every: 10, cka: true}\n", "probes.cka: unknown key"),
    ("workers-zero", GOOD + "resources: {workers: 0}\n", "resources.workers"),
    ("workers-share-a-gpu", GOOD + "resources: {gpu: 0.5, workers: 2}\n",
     "resources: data-parallel workers cannot share a GPU"),
    ("gpus-per-worker", GOOD + "resources: {gpu: 2}\n", "resources: one worker trains on one GPU"),
    ("workers-split-batch", GOOD + "resources: {workers: 3}\n",
     "resources.workers: scale xs's batch_size 4 is not divisible by 3 workers"),
    ("scale-workers-split-batch", GOOD.replace("seq_len: 32}}", "seq_len: 32}, resources: {workers: 3}}"),
     "scales.xs.resources.workers: scale xs's batch_size 4 is not divisible by 3 workers"),
    ("scale-workers-share-a-gpu", GOOD.replace("seq_len: 32}}", "seq_len: 32}, resources: {workers: 2}}")
     + "resources: {gpu: 0.25}\n", "scales.xs.resources: data-parallel workers cannot share a GPU"),
    ("scale-resources-unknown-key", GOOD.replace("seq_len: 32}}", "seq_len: 32}, resources: {tpu: 1}}"),
     "scales.xs.resources.tpu: unknown key"),
]

_PROBE = """
import contextlib, io, json, sys
from orchestration.cli import main
out = {}
for f in sys.argv[1:]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(["sweep", f])
    out[f] = [rc, err.getvalue()]
out["__modules__"] = sorted(m for m in ("torch", "ray", "mlflow", "pytorch_lightning", "transformers")
                            if m in sys.modules)
print(json.dumps(out))
"""


def test_malformed_sweeps_exit_2_naming_the_field_and_start_nothing(tmp_path):
    files = []
    for name, text, _ in BAD:
        (tmp_path / f"{name}.yaml").write_text(text)
        files.append(f"{name}.yaml")
    r = subprocess.run([sys.executable, "-c", _PROBE, *files], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env={"PYTHONPATH": str(ROOT), **__import__("os").environ})
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    for name, _, field in BAD:
        rc, err = res[f"{name}.yaml"]
        assert rc == 2, (name, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1, (name, err)
        assert lines[0].startswith(f"headroom: error: {name}.yaml: "), (name, lines[0])
        assert field in lines[0], (name, field, lines[0])
    # validated before any framework was imported, and nothing was started or written
    assert res["__modules__"] == [], res["__modules__"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(files)


@pytest.mark.parametrize("name", ["ratio-one", "unknown-top-key"])
def test_cli_exit_status_and_one_line(tmp_path, name):
    text = dict((b[0], b[1]) for b in BAD)[name]
    (tmp_path / "s.yaml").write_text(text)
    r = subprocess.run([sys.executable, "-m", "orchestration.cli", "sweep", "s.yaml"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]


def test_bad_flags_exit_2(tmp_path):
    (tmp_path / "s.yaml").write_text(GOOD)
    for args, needle in ([["--tracking-uri", "http://127.0.0.1:9"], "unreachable"],
                         [["--tracking-uri", "sqlite:////nonexistent/dir/x.db"], "does not exist"],
                         [["--bogus"], "unrecognized arguments"]):
        r = subprocess.run([sys.executable, "-m", "orchestration.cli", "sweep", "s.yaml", *args], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "orchestration.cli", "sweep", "missing.yaml"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "missing.yaml: no such file" in r.stderr
    (tmp_path / "off.yaml").write_text(GOOD + "log_models: false\n")
    r = subprocess.run([sys.executable, "-m", "orchestration.cli", "sweep", "off.yaml", "--register"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "log_models: false" in r.stderr
    (tmp_path / "off.yaml").unlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]


def save_tiny_gpt2(directory: Path) -> Path:
    """A tiny GPT-2 checkpoint (12 heads per layer, as GPT-2 small) with its own BPE tokenizer, as
    `huggingface-cli download` would leave it."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from lightning_modules.data.corpus import load_corpus
    from lightning_modules.data.tokens import train_bpe
    from lightning_modules.declarations.config import DataConfig
    from lightning_modules.models.build import save_model

    corpus = load_corpus(DataConfig())
    tok = train_bpe(corpus.splits["train"][:40], 300, "tiny-gpt2-test")
    cfg = GPT2Config(vocab_size=tok.vocab_size, n_positions=1024, n_embd=48, n_layer=2, n_head=12,
                     bos_token_id=tok.eos_id, eos_token_id=tok.eos_id, pad_token_id=tok.pad_id)
    import torch

    torch.manual_seed(0)
    save_model(GPT2LMHeadModel(cfg).eval(), directory, tok)
    return directory


def test_every_shipped_sweep_validates(tmp_path, cache_dir):
    from orchestration.design.spec import load_sweep

    files = sorted((ROOT / "sweeps").glob("*.yaml"))
    names = {f.stem for f in files}
    assert {"quickstart", "smoke", "scales", "pretrained"} <= names
    for f in files:
        if f.stem == "pretrained":
            continue
        sweep, _ = load_sweep(f)
        assert sweep.spec_hash() == load_sweep(f)[0].spec_hash()
    # the pretrained sweep names a checkpoint directory relative to where it runs: put a tiny one there
    import os

    save_tiny_gpt2(tmp_path / "checkpoints" / "gpt2")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        sweep, _ = load_sweep(ROOT / "sweeps" / "pretrained.yaml")
    finally:
        os.chdir(cwd)
    assert sweep.pretrained is not None and sweep.scales is None


def test_shipped_sweeps_say_what_the_issue_asks():
    from orchestration.design.spec import load_sweep

    q, _ = load_sweep(ROOT / "sweeps" / "quickstart.yaml")
    assert list(q.scales) == ["xs", "s"] and len(q.seeds) == 3 and q.prune.ratios == [0.5]
    # random is there for the informed-beats-random diagnostic; s keeps 4 heads (its 8-head model trains worse)
    assert q.prune.methods == ["gradient", "random"] and q.controls == ["scratch_e", "scratch_b"]
    assert (q.dense_heads("xs"), q.dense_heads("s")) == (8, 4) and q.prune.finetune_lr is None
    xs, s = q.scales["xs"], q.scales["s"]
    # the two scales are scored on the same windows (eval batches × batch size: the same evenly spaced windows)
    assert xs.overrides.eval_batches * xs.overrides.batch_size == s.overrides.eval_batches * s.overrides.batch_size
    s, _ = load_sweep(ROOT / "sweeps" / "smoke.yaml")
    assert list(s.scales) == ["xs"] and s.families == ["decoder"] and len(s.seeds) == 2
    assert s.prune.methods == ["gradient", "random"] and s.lr.search.trials == 2
    c, _ = load_sweep(ROOT / "sweeps" / "scales.yaml")
    assert list(c.scales) == ["s", "m", "l", "xl"] and c.prune.ratios == [0.25, 0.5, 0.75]
    assert len(c.prune.methods) == 7 and len(c.seeds) == 3 and c.controls == ["scratch_e", "scratch_b", "wide"]
    assert c.data.source.startswith("hf:")


def test_spec_hash_ignores_where_it_runs():
    from orchestration.design.spec import parse_sweep

    a = parse_sweep(GOOD)
    b = parse_sweep(GOOD + "storage: s3://bucket/x\ntracking_uri: http://mlflow:5000\nresources: {cpu: 4}\n"
                           "log_models: false\n")
    c = parse_sweep(GOOD.replace("seeds: [0, 1]", "seeds: [0, 2]"))
    d = parse_sweep(GOOD.replace("seq_len: 32}}", "seq_len: 32}, resources: {gpu: 0.25}}"))
    assert a.spec_hash() == b.spec_hash() == d.spec_hash() != c.spec_hash()
    # pinned: a sweep resumed after an upgrade finds its parent only while the hash stays. It changed on purpose
    # when the trust section became non-inferiority margins and the doubling check (and Scratch-B began counting
    # every candidate fine-tune): an older sweep's runs, planned by other rules, start a new parent rather than
    # mix with new ones in one report.
    assert a.spec_hash() == "aa11906a3f13"




def test_a_gpu_share_too_small_to_pack_is_refused_in_one_line(tmp_path):
    """`resources.gpu` between 0 and 0.01 (5e-324 overflowed, 1e-5 made `--plan` loop for minutes): one line."""
    import yaml

    from lightning_modules.declarations.config import HeadroomInputError
    from orchestration.design.spec import parse_sweep

    doc = yaml.safe_load((Path(__file__).resolve().parents[1] / "sweeps" / "quickstart.yaml").read_text())
    for gpu in (5e-324, 1e-5, 0.0099):
        with pytest.raises(HeadroomInputError, match="shares one GPU among more than 100 trials"):
            parse_sweep(yaml.safe_dump({**doc, "resources": {"cpu": 1, "gpu": gpu}}))
    for gpu in (0, 0.01, 0.5):
        parse_sweep(yaml.safe_dump({**doc, "resources": {"cpu": 1, "gpu": gpu}}))
