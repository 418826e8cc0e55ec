"""Trunks and cooldown branches (orchestration/design/trunks.py): a wsd run of B steps started from a longer run's
checkpoint at B's cooldown start is the run of B steps trained alone — checked against that run, trained from
scratch — and the plan groups exactly the units that may share a trunk."""

from __future__ import annotations

import math

import pytest

from lightning_modules.declarations.config import TrainConfig, cooldown_start
from orchestration.design.spec import parse_sweep


def test_the_wsd_rate_is_the_same_for_every_budget_until_its_cooldown_then_decays_as_one_minus_sqrt():
    from lightning_modules.training.lm import lr_lambda

    short = TrainConfig(steps=100, warmup_steps=10, schedule="wsd", cooldown_fraction=0.2, min_lr_ratio=0.1)
    long = short.model_copy(update={"steps": 1000})
    f, g = lr_lambda(short), lr_lambda(long)
    assert cooldown_start(short) == 80 and cooldown_start(long) == 800
    assert [f(i) for i in range(80)] == [g(i) for i in range(80)]  # the trunk's rate up to the branch point
    assert f(5) == pytest.approx(6 / 10) and f(79) == 1.0
    for step in (80, 85, 90, 99):  # hand-computed: min + (1 - min)(1 - sqrt(progress))
        assert f(step) == pytest.approx(0.1 + 0.9 * (1 - math.sqrt((step - 80) / 20)))


@pytest.mark.slow
def test_a_branch_from_the_trunk_equals_the_run_of_its_own_budget(tmp_path, cache_dir):
    """Trained here three ways on the stdlib corpus: B = 40 steps from scratch; a 100-step trunk keeping its
    checkpoint at cooldown_start(B) = 32; B again, from that checkpoint. The branch's weights and losses are the
    from-scratch run's."""
    import torch

    from lightning_modules.declarations.config import DataConfig, model_config_for, train_config_for
    from lightning_modules.training.loop import Snapshots, train_lm

    model = model_config_for("xs", "decoder", n_heads=4)
    short = train_config_for("xs", steps=40, seed=3, warmup_steps=5, schedule="wsd", val_every=20, val_batches=2,
                             eval_batches=2)
    trunk = short.model_copy(update={"steps": 100})
    step = cooldown_start(short)
    assert step == 32
    alone = train_lm(model, short, DataConfig(), progress=False)
    snaps = tmp_path / "snaps"
    train_lm(model, trunk, DataConfig(), callbacks=[Snapshots([step], snaps)], progress=False, final_eval=False)
    branch = train_lm(model, short, DataConfig(), ckpt_path=str(Snapshots.path(snaps, step)), progress=False)
    a, b = alone.lm.model.state_dict(), branch.lm.model.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6, msg=k)
    for split in alone.metrics["final"]:
        assert branch.metrics["final"][split]["loss"] == pytest.approx(alone.metrics["final"][split]["loss"],
                                                                       abs=1e-5)
    # the branch trained its cooldown only
    assert [s for s, _ in branch.metrics["train_loss"]] == list(range(step + 1, 41))
    # and a different trunk (another seed) would not have matched: the comparison can fail
    other = train_lm(model, short.model_copy(update={"seed": 4}), DataConfig(), progress=False)
    assert abs(other.metrics["final"]["val"]["loss"] - alone.metrics["final"]["val"]["loss"]) > 1e-4


SWEEP = """
name: trunks
data: {source: stdlib}
scales:
  xs: {steps: 400, overrides: {schedule: wsd, warmup_steps: 10, val_every: 100}}
seeds: [0, 1]
prune: {ratios: [0.5], methods: [gradient], finetune_steps: [10, 40]}
controls: [scratch_e, scratch_b]
trust: {half_budget: every}
"""


def test_the_plan_branches_every_shorter_budget_of_one_architecture_and_seed_from_its_longest_run():
    from orchestration.design.plan import build_plan

    sweep = parse_sweep(SWEEP)
    plan = build_plan(sweep, "h")
    by = {u.key: u for u in plan.trained}
    for seed in (0, 1):
        mine = [u for u in plan.trained if u.seed == seed]
        dense = next(u for u in mine if u.arm == "dense")
        half = next(u for u in mine if u.arm == "dense_half")
        assert dense.trunk_key is None and dense.branch_points == (cooldown_start(half.train),)
        assert half.trunk_key == dense.key and half.branch_step == 160  # 200 steps, the last 40 decay
        shaped = [u for u in mine if u.arm in ("scratch_e", "scratch_b")]
        trunk = max(shaped, key=lambda u: u.train.steps)
        assert trunk.arm == "scratch_b" and trunk.trunk_key is None
        assert sorted(trunk.branch_points) == sorted(cooldown_start(u.train) for u in shaped if u is not trunk)
        for u in shaped:
            if u is not trunk:
                assert by[u.trunk_key] is trunk and u.branch_step == cooldown_start(u.train)
    # the keys are those of the same units trained alone: how a unit is computed is not what it computes
    alone = build_plan(sweep, "h")
    from orchestration.design.plan import train_units

    assert [u.key for u in train_units(sweep, "h")] == [u.key for u in alone.trained + list(alone.taught)]


def test_a_cosine_sweep_has_no_trunks():
    from orchestration.design.plan import build_plan

    plan = build_plan(parse_sweep(SWEEP.replace("schedule: wsd, ", "")), "h")
    assert all(u.trunk_key is None and not u.branch_points for u in plan.trained)


def test_a_budget_shorter_than_its_warmup_trains_alone():
    """Its warmup spans its own steps (lm.lr_lambda), not the trunk's: a branch would not be its run."""
    from orchestration.design.plan import build_plan

    sweep = parse_sweep(SWEEP.replace("warmup_steps: 10", "warmup_steps: 300"))
    half = [u for u in build_plan(sweep, "h").trained if u.arm == "dense_half"]
    assert half and all(u.trunk_key is None for u in half)  # 200 steps, warmup 300
