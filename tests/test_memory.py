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

from lightning_modules.declarations.config import ModelConfig, model_config_for
from lightning_modules.declarations.costs import param_counts
from lightning_modules.declarations.memory import (
    activation_bytes,
    attention_memory,
    backward_memory,
    forward_bytes,
    train_memory,
    weights_memory,
)
from lightning_modules.models.build import build_model, token_losses


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
    assert "80 GB per GPU" in note and "0.5 GB per trial for its CUDA context" in note


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
    """scales.yaml's s trials (4 to a GPU; the largest, an ablation prune, plans at 7.3 GB + 0.5 GB of CUDA context)
    on 30 GB GPUs: one line naming the stage and trials, exit 2, from --plan and from the sweep itself (before Ray
    starts). At gpu 0.4 two share a GPU (not three: floor(1/0.4)) and
    fit 16 GB."""
    def over(spec):
        spec["scales"] = {"s": spec["scales"]["s"]}
        spec["resources"]["gpu_memory_gb"] = 30

    f = _sweep_file(tmp_path, "over.yaml", over)
    rc, _, err = _plan(capsys, f)
    assert rc == 2
    (line,) = err.strip().splitlines()
    assert line.startswith("headroom: error: prune: 4 × s-decoder-pruned-ablation-r0.25-s0 (7.3 GB, gpu 0.25) "
                           "can share one GPU and need 31.3 GB") and "give scale s gpu: 0.333" in line, line
    # the sweep itself plans once its data is prepared (here the embedded default, TinyStories being offline: bytes,
    # 1.1 GB per trial, on 4 GB GPUs), and refuses with the line --plan gives for the same file, before Ray starts or
    # its storage is created
    def local_data(spec):
        over(spec)
        spec["data"], spec["resources"]["gpu_memory_gb"] = {"source": "stdlib"}, 4

    local = _sweep_file(tmp_path, "local.yaml", local_data)
    rc, _, want = _plan(capsys, local)
    assert rc == 2
    r = subprocess.run([sys.executable, "-m", "orchestration.cli", "sweep", local, "--storage",
                        str(tmp_path / "results")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert rc == r.returncode == 2 and "can share one GPU" in want
    assert [x for x in r.stderr.strip().splitlines() if x.startswith("headroom: error")] == want.strip().splitlines()
    assert not (tmp_path / "results").exists()

    def two(spec):
        over(spec)
        spec["resources"]["gpu_memory_gb"] = 16
        spec["scales"]["s"]["resources"]["gpu"] = 0.4

    assert _plan(capsys, _sweep_file(tmp_path, "two.yaml", two))[0] == 0


def test_trials_of_different_scales_sharing_a_gpu_are_counted_together(capsys, tmp_path):
    """Ray fills a GPU with any trials whose fractions fit, across scales: m at gpu 0.4 (two fit, 33.8 GB) and s at
    0.2 (five fit, 39.2 GB) each fit 40 GB alone, but two m and one s (0.4 + 0.4 + 0.2) need 41.7 GB."""
    def mixed(spec):
        spec["scales"] = {"s": spec["scales"]["s"], "m": spec["scales"]["m"]}
        spec["scales"]["s"]["resources"]["gpu"], spec["scales"]["m"]["resources"]["gpu"] = 0.2, 0.4
        spec["resources"]["gpu_memory_gb"] = 40

    rc, _, err = _plan(capsys, _sweep_file(tmp_path, "mixed.yaml", mixed))
    assert rc == 2 and err.startswith("headroom: error: prune: ") and len(err.strip().splitlines()) == 1
    for part in ("2 × m-decoder-pruned-ablation-r0.25-s0 (16.4 GB, gpu 0.4)",
                 "1 × s-decoder-pruned-ablation-r0.25-s0 (7.3 GB, gpu 0.2)", "need 41.7 GB", "give scale m gpu: 0.5"):
        assert part in err, (part, err)


KINDS = """
name: kinds
family: decoder
data: {source: "hf:roneneldan/TinyStories", tokenizer: bpe, bpe_vocab_size: 8192}
scales:
  s: {steps: 2000, overrides: {batch_size: 32, seq_len: 256}, resources: {cpu: 2, gpu: 0.25}}
  xl: {steps: 20000, overrides: {batch_size: 64, seq_len: 1024, precision: bf16-mixed}, resources: {workers: 4}}
seeds: [0]
prune: {ratios: [0.5], methods: [gradient, ablation, entropy, magnitude], recovery: [lm, distill],
        finetune_steps: 500}
controls: [scratch_e, scratch_kd]
lr: 1.0e-3
resources: {cpu: 4, gpu: 1}
"""


def test_each_unit_kind_is_planned_with_its_own_batch_precision_model_and_scoring():
    """Which estimate each kind of unit gets, spelled out with explicit arguments: a trained unit at its batch
    (a data-parallel worker at its share), precision auto as bf16-mixed on a GPU, a distilled control with its
    teacher, a prune unit as the larger of its method's scoring of the dense model and the recovery fine-tune of the
    pruned one beside the dense weights (the teacher when it distils), ablation at a GPU's 256 rows per pass."""
    from orchestration.design.plan import build_plan
    from orchestration.design.preflight import plan_rows
    from orchestration.design.schema import Sweep

    rows = {r.name: r.memory_bytes for r in plan_rows(build_plan(Sweep(**yaml.safe_load(KINDS)), "plan", 8192))}
    v = 8192
    dense_s, half_s = model_config_for("s", vocab_size=v), model_config_for("s", n_heads=4, vocab_size=v)
    dense_xl = model_config_for("xl", vocab_size=v)
    weights_s = 4 * param_counts(dense_s).total
    bf = "bf16-mixed"
    assert rows["s-decoder-dense-s0"] == train_memory(dense_s, 32, 256, bf).peak
    assert rows["xl-decoder-dense-s0"] == train_memory(dense_xl, 64, 1024, bf, workers=4).peak
    assert rows["xl-decoder-dense-s0"] < train_memory(dense_xl, 64, 1024, bf).peak  # a worker holds 16 of 64
    assert rows["s-decoder-scratch_e-r0.5-s0"] == train_memory(half_s, 32, 256, bf).peak
    assert rows["s-decoder-scratch_kd-r0.5-kd-s0"] == train_memory(half_s, 32, 256, bf, teacher=dense_s).peak
    fine_tune = train_memory(half_s, 32, 256, bf).peak + weights_s
    distilled = train_memory(half_s, 32, 256, bf, teacher=dense_s).peak
    # by hand for ablation: 256 rows a pass on a GPU (8 masks of 32 sequences), each a forward at fp32
    ablation = weights_s + forward_bytes(dense_s, 256 * 256)
    for method, scoring in (("gradient", backward_memory(dense_s, 32, 256)), ("ablation", ablation),
                            ("entropy", attention_memory(dense_s, 32, 256)), ("magnitude", weights_memory(dense_s, 32, 256))):
        assert rows[f"s-decoder-pruned-{method}-r0.5-s0"] == max(scoring, fine_tune), method
        assert rows[f"s-decoder-pruned-{method}-r0.5-kd-s0"] == max(scoring, distilled), method
    # ablation's 256 rows (8 masks of 32 sequences a pass) outgrow its fine-tune; magnitude holds only weights
    assert rows["s-decoder-pruned-ablation-r0.5-s0"] > 2 * fine_tune
    assert rows["s-decoder-pruned-magnitude-r0.5-s0"] == fine_tune
