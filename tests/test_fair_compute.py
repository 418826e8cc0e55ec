"""The comparison's two tilts, closed: the recovery fine-tune continues the dense run's order at step T + 1 (the
samples Scratch-B's steps past T read; within the first epoch, text the dense run never saw), and the compute spent scoring heads
is part of the pruned arm's compute that Scratch-B and Scratch-KD are given. References: the dense run's own loader
iterated step by step, and the scoring FLOPs counted by hand from forward passes."""

from __future__ import annotations

import textwrap

import pytest
import torch

from lightning_modules.declarations.config import DataConfig, TrainConfig, model_config_for
from lightning_modules.declarations.costs import flops_per_token, train_flops_per_token


def _batches_seen(model_cfg, train_cfg, data, base, start=None):
    """The input batches a recovery fine-tune of `train_cfg.steps` steps trains on (its clock sees each one)."""
    from lightning_modules.models.build import build_model
    from lightning_modules.pruning.recover import finetune
    from lightning_modules.training.loop import TrainClock

    class Recorder(TrainClock):
        def __init__(self):
            super().__init__()
            self.batches = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.batches.append(batch["input_ids"].clone())
            super().on_train_batch_start(trainer, pl_module, batch, batch_idx)

    rec = Recorder()
    finetune(build_model(model_cfg, seed=0), data, train_cfg.steps, 1e-4, base, clock=rec, start=start)
    return rec.batches


@pytest.mark.parametrize("source", ["stdlib", "mqar"])
def test_recovery_fine_tune_continues_the_dense_order_at_step_t_plus_1(source, cache_dir):
    from lightning_modules.data.datamodule import HeadroomData

    T, F = 7, 3
    dense_cfg = TrainConfig(steps=T, batch_size=4, seq_len=32, seed=3)
    data = HeadroomData(DataConfig(source=source), dense_cfg).prepare()
    # the reference: the batches a dense run of T + F steps takes, in order, from its own loader
    longer = HeadroomData(DataConfig(source=source), dense_cfg.model_copy(update={"steps": T + F})).prepare()
    reference = [b["input_ids"] for b in longer.train_dataloader()]
    assert len(reference) == T + F
    seen = _batches_seen(model_config_for("xxxs"), TrainConfig(steps=F, batch_size=4, seq_len=32), data, dense_cfg)
    assert len(seen) == F
    for k in range(F):  # fine-tune step k + 1 takes the dense order's batch T + k + 1
        assert torch.equal(seen[k], reference[T + k])
    for k in range(T):  # and never one the dense run trained on
        assert not any(torch.equal(s, reference[k]) for s in seen)
    # `headroom prune --batch-size 2` of a run trained at batch 4: the fine-tune still starts at T × 4 samples (its
    # batches are the halves of the dense order's batch T + 1, T + 2, ...)
    half = _batches_seen(model_config_for("xxxs"), TrainConfig(steps=2, batch_size=2, seq_len=32), data,
                         dense_cfg.model_copy(update={"batch_size": 2}), start=T * 4)
    assert torch.equal(torch.cat(half), reference[T])


def _sweep(methods: str, scope: str, schedule: str = "one_shot", extra: str = ""):
    from orchestration.design.spec import parse_sweep

    return parse_sweep(textwrap.dedent(f"""\
        name: charge
        scales:
          xs: {{steps: 50, overrides: {{batch_size: 4, seq_len: 32}}}}
        seeds: [0]
        prune: {{ratios: [0.5], methods: {methods}, scope: [{scope}], schedule: [{schedule}], step: 0.25,
                 finetune_steps: 10, finetune_lr: 1.0e-4, calibration_batches: 6{extra}}}
        controls: [scratch_e, scratch_b]
        """))


def _budget_by_hand(dense, small, T, F, seq, forward_passes_per_calibration_token, calibration_batches):
    """(T·C_dense + S + F·C_small) / C_small, every FLOP count per token of one training step; S = the scoring's
    forward passes per calibration token × calibration batches (each a training batch's tokens) × a forward pass."""
    c_dense, c_small = train_flops_per_token(dense, seq), train_flops_per_token(small, seq)
    s = forward_passes_per_calibration_token * calibration_batches * flops_per_token(dense, seq).total
    return round((T * c_dense + s + F * c_small) / c_small)


@pytest.mark.parametrize("methods,passes", [("[gradient, random]", 2), ("[random]", 0), ("[ablation]", 2 * 8 + 1)])
def test_per_layer_scratch_b_is_charged_the_primary_methods_scoring(methods, passes):
    """Per-layer controls stand for every method: charged gradient's scoring (a forward and a gate-only backward, 2
    forward passes, per calibration token; counted below) when the sweep prunes with it, else its first method's (ablation: one reference pass and
    one pass per head of all 16)."""
    from orchestration.design.plan import train_units

    sweep = _sweep(methods, "per_layer")
    units = train_units(sweep, "-")
    dense = next(u for u in units if u.arm == "dense")
    sb = next(u for u in units if u.arm == "scratch_b")
    assert sb.train.steps == _budget_by_hand(dense.model, sb.model, 50, 10, 32, passes, 6)
    assert next(u for u in units if u.arm == "scratch_e").train.steps == 50  # Scratch-E: the dense steps only


@pytest.mark.parametrize("schedule,rounds", [("one_shot", 1), ("iterative", 2)])
def test_global_scratch_b_is_charged_its_own_prunes_scoring_rounds(schedule, rounds):
    """A global prune's controls copy that prune: its method (gradient) and its rounds (iterative at step 0.25 to
    ratio 0.5: scored twice)."""
    from orchestration.design.plan import global_control_units, prune_units, train_units

    sweep = _sweep("[gradient]", "global", schedule)
    dense = next(u for u in train_units(sweep, "-") if u.arm == "dense")
    p = prune_units(sweep, [dense])[0]
    assert p.plan.scoring_rounds == rounds
    sb = next(u for u in global_control_units(sweep, p, dense, [3, 5]) if u.arm == "scratch_b")
    assert sb.train.steps == _budget_by_hand(dense.model, sb.model, 50, 10, 32, 2 * rounds, 6)


def test_plan_rows_charge_the_pruned_arm_its_scoring():
    """--plan: the pruned row's arm_train_flops = dense training + scoring + fine-tune, by hand; Scratch-B's
    train_flops is within one of its steps of the gradient prune's."""
    from orchestration.design.plan import build_plan
    from orchestration.design.preflight import plan_rows

    sweep = _sweep("[gradient, random]", "per_layer")
    rows = plan_rows(build_plan(sweep, "-", 260))
    d8, d4 = model_config_for("xs"), model_config_for("xs", n_heads=4)
    bt = 4 * 32
    f8, f4 = flops_per_token(d8, 32).total, flops_per_token(d4, 32).total
    grad = next(r for r in rows if r.stage == "prune" and r.method == "gradient")
    rand = next(r for r in rows if r.stage == "prune" and r.method == "random")
    assert grad.arm_train_flops == 3 * f8 * 50 * bt + 2 * 6 * bt * f8 + 3 * f4 * 10 * bt
    assert rand.arm_train_flops == 3 * f8 * 50 * bt + 3 * f4 * 10 * bt
    sb = next(r for r in rows if r.arm == "scratch_b")
    assert abs(sb.train_flops - grad.arm_train_flops) <= 3 * f4 * bt / 2 + 1


def test_each_prune_run_records_the_flops_its_method_spent_scoring(smoke):
    """The smoke sweep's prune runs: cost/scoring_flops is gradient's 2 forward passes over 2 calibration batches of
    8 × 64 tokens through the dense model (its recorded forward FLOPs per token), random's 0."""
    from test_sweep import client, runs_of, split

    _, children = split(runs_of(client(smoke["cwd"]), "smoke"))
    pruned = [r for r in children if r.data.tags.get("headroom.arm") == "pruned"]
    assert pruned
    for r in pruned:
        m = r.data.metrics
        passes = {"gradient": 2, "random": 0}[r.data.tags["headroom.method"]]
        assert m["cost/scoring_flops"] == pytest.approx(passes * 2 * 8 * 64 * m["flops_per_token_dense"])


@pytest.mark.parametrize("method,options,declared_tol", [("gradient", {}, 0.06), ("ablation", {}, 0.03),
                                                         ("l0", {"steps": 3}, 0.06)])
def test_declared_scoring_passes_match_the_flops_the_scorer_runs(method, options, declared_tol):
    """The independent reference: torch's FLOP counter over the scorer itself, in units of one forward pass of the
    same batch (matmuls and attention, as costs.py counts them). Each method's declared passes per calibration
    token (methods.Method.passes, what Scratch-B is charged) are within a few percent of what it runs."""
    from torch.utils.flop_counter import FlopCounterMode

    from lightning_modules.declarations.methods import get_method
    from lightning_modules.models.build import build_model
    from lightning_modules.pruning.scoring import default_loss, score_heads

    cfg = model_config_for("xs")
    model = build_model(cfg, seed=0).eval()
    x = torch.randint(0, 256, (4, 64), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": x, "labels": x.clone()}
    loss_fn = default_loss(model)

    def count(f):
        with FlopCounterMode(display=False) as fc:
            f()
        return fc.get_total_flops()

    with torch.no_grad():
        fwd = count(lambda: loss_fn(model, batch))
    measured = count(lambda: score_heads(model, [batch], method, loss_fn=loss_fn, **options)) / fwd
    m = get_method(method)
    declared = m.passes(sum(cfg.layer_heads), x.numel(), x.numel(), {**m.options, **options})
    assert measured == pytest.approx(declared, rel=declared_tol, abs=1e-9), (method, measured, declared)
