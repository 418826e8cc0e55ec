"""The memory a plan gives each trial: the activation formula against what autograd really saves on the built
models, `--plan`'s memory per unit and trials per GPU, and the refusal of a sweep that overpacks a GPU.
(The whole estimate against a real training step's peak RSS: tests/test_benchmarks.py, benchmarks/plan_memory.py.)"""

import json
import subprocess
import sys

import pytest
import torch
import yaml
from conftest import ROOT

from lightning_modules.config import ModelConfig
from lightning_modules.memory import activation_bytes
from lightning_modules.models import build_model, token_losses


def _saved_bytes(model, tokens: torch.Tensor, bf16: bool) -> int:
    """Bytes of the distinct storages autograd saves for backward in one loss (the parameters left out)."""
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st._cdata not in params:
            seen[st._cdata] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        token_losses(model, {"input_ids": tokens, "labels": tokens.clone()})
    return sum(seen.values())


CONFIGS = [
    dict(d_model=64, n_layers=2, n_heads=4, head_dim=16, d_ff=256, vocab_size=260),
    dict(d_model=96, n_layers=3, n_heads=6, head_dim=8, d_ff=384, vocab_size=1024, heads_per_layer=(6, 2, 4)),
]


@pytest.mark.parametrize("family", ["decoder", "encoder"])
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=["uniform", "pruned-shape"])
def test_activation_bytes_are_what_autograd_saves(family, bf16, cfg):
    """Per token of the batch: the slope between two batch sizes (a mixed precision's cached weight copies are the
    constant, counted apart in the plan's static memory). A decoder predicts T-1 of T tokens: its loss's share is
    (T-1)/T of the formula's, within the tolerance."""
    mc = ModelConfig(family=family, max_seq_len=256, **cfg)
    model = build_model(mc, seed=0)
    g = torch.Generator().manual_seed(0)
    seq = 64
    small, large = (_saved_bytes(model, torch.randint(0, 256, (b, seq), generator=g), bf16) for b in (2, 4))
    per_token = (large - small) / (2 * seq)
    assert per_token == pytest.approx(activation_bytes(mc, "bf16-mixed" if bf16 else "32-true"), rel=0.01)


def _plan(capsys, path, *extra) -> tuple[int, str, str]:
    """`headroom sweep PATH --plan ...` in this process (the meta builds are cached across calls)."""
    from orchestration.cli import main

    capsys.readouterr()
    rc = main(["sweep", str(path), "--plan", *extra])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _sweep_file(tmp_path, name, change) -> str:
    spec = yaml.safe_load((ROOT / "sweeps" / "scales.yaml").read_text())
    change(spec)
    f = tmp_path / name
    f.write_text(yaml.safe_dump(spec))
    return str(f)


def test_plan_shows_memory_per_unit_and_trials_per_gpu(capsys):
    rc, text, _ = _plan(capsys, ROOT / "sweeps" / "scales.yaml")
    assert rc == 0
    lines = text.splitlines()
    assert "memory" in lines[0].split()
    note = next(x for x in lines if x.startswith("GPU memory"))
    # sweeps/scales.yaml: s at gpu 0.25, m at 0.5, l and xl one per GPU (xl per worker)
    for scale, n in (("s", 4), ("m", 2), ("l", 1), ("xl", 1)):
        assert f"{n} per GPU" in note.split(f"; {scale}: " if scale != "s" else " s: ", 1)[1].split(";")[0]
    assert "80 GB per GPU" in note


def test_plan_json_memory_grows_with_the_model_and_the_batch(capsys, tmp_path):
    """Each unit's planned peak, read from --plan --json: larger at a larger scale; doubling a scale's batch doubles
    the batch-dependent part (activations and logits) and keeps the weights, gradients and moments."""
    rows = json.loads(_plan(capsys, ROOT / "sweeps" / "scales.yaml", "--json")[1])
    assert all(r["memory_bytes"] > 0 for r in rows)
    dense = {r["scale"]: r for r in rows if r["stage"] == "train" and r["arm"] == "dense" and r["seed"] == 0}
    assert dense["s"]["memory_bytes"] < dense["m"]["memory_bytes"] < dense["l"]["memory_bytes"]

    def double(spec):
        spec["scales"]["s"]["overrides"]["batch_size"] = 64

    doubled = json.loads(_plan(capsys, _sweep_file(tmp_path, "double.yaml", double), "--json")[1])
    d2 = next(r for r in doubled if r["scale"] == "s" and r["stage"] == "train" and r["arm"] == "dense")
    static = 18 * d2["params"]  # fp32 weights, gradients, two moments; bf16 copies of the weights (gpu: auto)
    assert d2["memory_bytes"] - static == pytest.approx(2 * (dense["s"]["memory_bytes"] - static), rel=1e-6)


def test_a_sweep_that_overpacks_a_gpu_is_refused_before_anything_starts(capsys, tmp_path):
    """scales.yaml's s trials (4 to a GPU, 2.5 GB each) on 9 GB GPUs: one line naming the scale, exit 2, from --plan
    and from the sweep itself (which would otherwise start Ray and prepare TinyStories first)."""
    def over(spec):
        spec["scales"] = {"s": spec["scales"]["s"]}
        spec["resources"]["gpu_memory_gb"] = 9

    f = _sweep_file(tmp_path, "over.yaml", over)
    for r in (_plan(capsys, f), subprocess.run(
            [sys.executable, "-m", "orchestration.cli", "sweep", f, "--storage", str(tmp_path / "results")],
            cwd=ROOT, capture_output=True, text=True, timeout=300)):
        rc, err = (r[0], r[2]) if isinstance(r, tuple) else (r.returncode, r.stderr)
        assert rc == 2
        (line,) = err.strip().splitlines()
        assert line.startswith("headroom: error: scale s: 4 trials share a GPU (gpu: 0.25)") and "at most 3 fit" in line
    assert not (tmp_path / "results").exists()

    def two(spec):  # at gpu 0.34 two trials share a GPU, and fit
        over(spec)
        spec["scales"]["s"]["resources"]["gpu"] = 0.34

    assert _plan(capsys, _sweep_file(tmp_path, "two.yaml", two))[0] == 0
