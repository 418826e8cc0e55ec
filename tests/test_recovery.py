"""The pruned arm's recovery as axes (issue 28): the recovery budget F as a list and the objective (lm, distill),
each with its own prune units and budget-matched Scratch-B, and the `scratch_kd` control (the pruned shape from
scratch, distilled from the same dense teacher). The plan's compute against a hand computation from the config
formulas; bad sweep files; and one CI-sized sweep end to end (Ray, MLflow, the report's recovery section)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT
from test_spec import GOOD
from test_sweep import client, run_sweep, runs_of, split, steps_of

RECOVERY = GOOD.replace("methods: [gradient, random]}", "methods: [gradient], finetune_steps: [4, 10], "
                        "recovery: [lm, distill]}").replace("[scratch_e]", "[scratch_e, scratch_b, scratch_kd]")


def _plan_json(tmp_path, text: str) -> list[dict]:
    (tmp_path / "s.yaml").write_text(text)
    r = subprocess.run([sys.executable, "-m", "orchestration.cli", "sweep", str(tmp_path / "s.yaml"), "--plan",
                        "--json"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def test_the_plan_lists_every_recovery_with_matched_compute(tmp_path):
    """Every (F, objective) gets its prune units and its own Scratch-B; scratch_kd exists for the distilled ones
    only; Scratch-E once. Compute from the config formulas (costs.flops_per_token, not the built models the plan
    measures): the pruned arm T·C_dense + S + R·(C_pruned + [kd] C_dense/3) per token, R = F × the candidate rates,
    S its gradient scoring;
    Scratch-B and scratch_kd spend the same to within one of their steps."""
    from lightning_modules.declarations.config import model_config_for
    from lightning_modules.declarations.costs import flops_per_token
    from orchestration.design.spec import parse_sweep

    sweep = parse_sweep(RECOVERY)
    rows = _plan_json(tmp_path, RECOVERY)
    assert len({r["name"] for r in rows}) == len(rows)
    T, bt, lrs = 20, 4 * 32, len(sweep.prune.finetune_lr_grid)
    fwd_d = flops_per_token(model_config_for("xs", vocab_size=rows[0]["vocab_size"]), 32).total
    fwd_p = flops_per_token(model_config_for("xs", n_heads=4, vocab_size=rows[0]["vocab_size"]), 32).total
    for seed in (0, 1):
        mine = [r for r in rows if r["seed"] == seed and r["stage"] != "lr_search"]
        pruned = {(r["finetune_steps"], r["recovery"]): r for r in mine if r["arm"] == "pruned"}
        assert set(pruned) == {(4, "lm"), (4, "distill"), (10, "lm"), (10, "distill")}
        sb = {(r["finetune_steps"], r["recovery"]): r for r in mine if r["arm"] == "scratch_b"}
        kd = {(r["finetune_steps"], r["recovery"]): r for r in mine if r["arm"] == "scratch_kd"}
        assert set(sb) == set(pruned) and set(kd) == {(4, "distill"), (10, "distill")}
        assert [r["steps"] for r in mine if r["arm"] == "scratch_e"] == [T]
        for (f, kind), p in pruned.items():
            R = f * lrs
            # ... + the gradient scoring of its heads: 2 forward passes per token of each calibration batch
            scoring = 2 * sweep.prune.calibration_batches * fwd_d
            want = bt * (T * 3 * fwd_d + scoring + R * (3 * fwd_p + (fwd_d if kind == "distill" else 0)))
            assert p["arm_train_flops"] == want, (f, kind)
            assert abs(sb[(f, kind)]["arm_train_flops"] - want) <= bt * 3 * fwd_p / 2 + 1
            assert sb[(f, kind)]["steps"] == round(want / (bt * 3 * fwd_p))
            if kind == "distill":
                step = bt * (3 * fwd_p + fwd_d)  # a scratch_kd step pays its teacher's forward pass
                assert abs(kd[(f, kind)]["arm_train_flops"] - want) <= step / 2 + 1
                assert kd[(f, kind)]["stage"] == "controls"  # after its dense teacher
        # the distilled Scratch-B trains longer than the LM one: the teacher's passes are the pruned arm's compute
        assert sb[(10, "distill")]["steps"] > sb[(10, "lm")]["steps"] > sb[(4, "lm")]["steps"]


def test_a_prune_during_training_counts_its_continued_steps(tmp_path):
    """Pruned at p = 0.5 of T, the arm trains p·T dense steps, scores, trains the other (1 - p)·T at pruned size,
    then R recovery steps: `--plan`'s row is the plan's account (plan.unit_arm), by hand from the config formulas;
    its steps are every step at pruned size. (A distilled recovery with p < 1 is refused by the schema.)"""
    from lightning_modules.declarations.config import model_config_for
    from lightning_modules.declarations.costs import flops_per_token
    from orchestration.design.spec import parse_sweep

    text = RECOVERY.replace("recovery: [lm, distill]}", "recovery: [lm], at: [0.5, 1]}").replace(", scratch_kd]", "]")
    sweep = parse_sweep(text)
    rows = _plan_json(tmp_path, text)
    T, bt, lrs = 20, 4 * 32, len(sweep.prune.finetune_lr_grid)
    fwd_d = flops_per_token(model_config_for("xs", vocab_size=rows[0]["vocab_size"]), 32).total
    fwd_p = flops_per_token(model_config_for("xs", n_heads=4, vocab_size=rows[0]["vocab_size"]), 32).total
    scoring = 2 * sweep.prune.calibration_batches * fwd_d
    seen = set()
    for p in (r for r in rows if r["arm"] == "pruned"):
        R, at = p["finetune_steps"] * lrs, p["prune_at"]
        snap = T // 2 if at == 0.5 else T
        want = bt * (snap * 3 * fwd_d + scoring + (R + T - snap) * 3 * fwd_p)
        assert p["arm_train_flops"] == want and p["steps"] == R + T - snap, (at, p["finetune_steps"])
        seen.add(at)
    assert seen == {0.5, 1.0}


def test_units_name_their_recovery_and_single_recovery_sweeps_keep_their_keys():
    from orchestration.design.plan import build_plan
    from orchestration.design.spec import parse_sweep

    plan = build_plan(parse_sweep(RECOVERY), "-")
    names = [u.name for u in plan.trained + plan.pruned + list(plan.taught)]
    assert len(set(names)) == len(names)
    assert "xs-decoder-pruned-gradient-r0.5-F10-kd-s0" in names and "xs-decoder-scratch_b-r0.5-F4-s1" in names
    assert "xs-decoder-scratch_kd-r0.5-F10-kd-s0" in names and "xs-decoder-scratch_e-r0.5-s0" in names
    kd = next(u for u in plan.taught if u.finetune_steps == 10 and u.seed == 0)
    assert kd.dense_key == next(u.key for u in plan.dense if u.seed == 0) and kd.distill is not None
    assert kd.tags()["headroom.recovery"] == "distill" and kd.tags()["headroom.finetune_steps"] == "10"
    # Scratch-B matched to a distilled arm spends its compute but trains on the LM loss: no teacher
    sb = [u for u in plan.trained if u.arm == "scratch_b" and u.recovery == "distill"]
    assert len(sb) == 4 and all(u.distill is None and u.dense_key is None for u in sb)
    # a sweep that states today's defaults has the keys of one that leaves them out, and the same spec hash
    base = parse_sweep(GOOD)
    same = parse_sweep(GOOD.replace("methods: [gradient, random]}", "methods: [gradient, random], "
                                    "finetune_steps: [0], recovery: lm, distill: {temperature: 1.0}}"))
    assert same.spec_hash() == base.spec_hash()
    keys = lambda s: [u.key for u in build_plan(s, "c").trained + build_plan(s, "c").pruned]
    assert keys(same) == keys(base)


def test_a_units_recovery_budget_lives_on_the_unit_alone():
    """F is held once, on the unit: a prune unit's settings have no budget of their own, its plan (what the prune
    runs) reads the unit's; the label the names, tags and groups read (`f_label`) is F exactly where the scale
    lists several. A unit serialised in the layout before (the budget on its prune settings, the label on the
    unit) comes back as the unit it is now, with its key."""
    from orchestration.design.plan import build_plan
    from orchestration.design.spec import parse_sweep
    from orchestration.design.unit import Unit

    for text, several in ((RECOVERY, True), (GOOD.replace("methods: [gradient, random]}",
                                                         "methods: [gradient], finetune_steps: 6, finetune_lr: 1.0e-3}").replace(
                                                  "[scratch_e]", "[scratch_e, scratch_b]"), False)):
        plan = build_plan(parse_sweep(text), "-")
        pruned, scratch_b = plan.pruned, [u for u in plan.trained if u.arm == "scratch_b"]
        assert pruned and scratch_b
        for u in pruned:
            assert "finetune_steps" not in type(u.prune).model_fields and u.plan.finetune_steps == u.finetune_steps
            assert u.tags()["headroom.finetune_steps"] == str(u.finetune_steps)
            assert (f"-F{u.finetune_steps}" in u.name) == several
        for u in pruned + scratch_b:
            assert u.f_label == (u.finetune_steps if several else None)
            old = u.to_dict()
            old.pop("f_varies")
            old["finetune_steps"] = u.f_label
            if old["prune"] is not None:
                old["prune"]["finetune_steps"] = u.finetune_steps
            elif not several:
                old.pop("finetune_steps")  # a control of a one-F scale held none
            back = Unit.from_dict(json.loads(json.dumps(old)))
            assert back.with_key().key == u.key and back.name == u.name
            assert back.finetune_steps == (u.finetune_steps if u.prune or several else None)


@pytest.mark.parametrize("edit,message", [
    (("[scratch_e]", "[scratch_kd]"), "controls: scratch_kd is matched to a recovery by distill; add it to prune.recovery"),
    (("methods: [gradient, random]}", "methods: [gradient], recovery: [distill]}"),
     "prune.recovery: distill fine-tunes towards the dense teacher; give a recovery budget"),
    (("methods: [gradient, random]}", "methods: [gradient], recovery: [lm, kd]}"), "prune.recovery[1]"),
    (("methods: [gradient, random]}", "methods: [gradient], finetune_steps: 5, distill: {temperature: 0}}"),
     "prune.distill.temperature"),
])
def test_bad_recovery_settings_exit_2_with_one_line(tmp_path, edit, message):
    (tmp_path / "s.yaml").write_text(GOOD.replace(*edit))
    r = subprocess.run([sys.executable, "-m", "orchestration.cli", "sweep", str(tmp_path / "s.yaml"), "--plan"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert list(tmp_path.iterdir()) == [tmp_path / "s.yaml"]  # nothing written


# ------------------------------------------------------------------------ one recovery sweep, end to end

SWEEP = """\
name: recovery-ci
family: decoder
data: {source: stdlib}
scales:
  xs: {steps: 20, overrides: {batch_size: 8, seq_len: 64, warmup_steps: 2, val_every: 20, val_batches: 1,
       eval_batches: 2}}
seeds: [0, 1]
prune: {ratios: [0.5], methods: [gradient], finetune_steps: [0, 4], recovery: [lm, distill], finetune_lr: 1.0e-3,
        calibration_batches: 2, curve: false}
controls: [scratch_b, scratch_kd]
log_models: false   # the models are not what this sweep tests (CI time)
"""


@pytest.fixture(scope="module")
def swept(tmp_path_factory, cache_dir):
    cwd = tmp_path_factory.mktemp("recovery")
    (cwd / "recovery.yaml").write_text(SWEEP)
    r = run_sweep(cwd, "recovery.yaml")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return cwd


def test_a_recovery_sweep_runs_every_recovery_and_its_matched_controls(swept):
    from orchestration.design.plan import build_plan
    from orchestration.design.spec import parse_sweep

    c = client(swept)
    _, children = split(runs_of(c, "recovery-ci"))
    by_name = {r.info.run_name: r for r in children}
    plan = build_plan(parse_sweep(SWEEP), "-")
    assert set(by_name) == {u.name for u in plan.trained + plan.pruned + list(plan.taught)}
    assert all(r.info.status == "FINISHED" for r in children)
    pruned = [r for r in children if r.data.tags["headroom.arm"] == "pruned"]
    assert sorted((r.data.tags["headroom.finetune_steps"], r.data.tags["headroom.recovery"]) for r in pruned) == \
        sorted([("0", "lm"), ("4", "lm"), ("4", "distill")] * 2)
    for r in pruned:  # a distilled prune says so in its params; F steps trained (one fixed rate)
        assert r.data.params["finetune_steps"] == r.data.tags["headroom.finetune_steps"]
        assert (r.data.params.get("recovery") == "distill") == (r.data.tags["headroom.recovery"] == "distill")
        assert r.data.metrics["cost/recovery_steps"] == float(r.data.tags["headroom.finetune_steps"])
    kd = [r for r in children if r.data.tags["headroom.arm"] == "scratch_kd"]
    dense = {r.info.run_id: r for r in children if r.data.tags["headroom.arm"] == "dense"}
    assert len(kd) == 2 and all(r.data.params["recovery"] == "distill" for r in kd)
    for r in kd:  # its teacher: the dense run of its seed; trained its planned steps, evaluated on the LM loss
        assert dense[r.data.tags["headroom.dense_run_id"]].data.tags["headroom.seed"] == r.data.tags["headroom.seed"]
        assert len(steps_of(c, r)) == int(r.data.params["steps"]) and r.data.metrics["final/id/loss"] < 10


def test_the_report_of_a_recovery_sweep_has_its_section(swept):
    v = json.loads((swept / "reports" / "recovery-ci" / "verdict.json").read_text())
    assert v["primary_recovery"] == {"finetune_steps": 4, "recovery": "distill"}
    # the headline comparisons are at the primary recovery: Scratch-B of F=4 by distillation, scratch_kd
    prim = [c for c in v["comparisons"] if c["stage"] == "final" and c["eval_set"] == "id"]
    assert {(c["control"], c["finetune_steps"], c["recovery"]) for c in prim} == {
        ("scratch_b", 4, "distill"), ("scratch_kd", 4, "distill")}
    rows = {(c["control"], c["finetune_steps"], c["recovery"]) for c in v["recovery"]}
    assert rows == {("scratch_b", 0, "lm"), ("scratch_b", 4, "lm"), ("scratch_b", 4, "distill"),
                    ("scratch_kd", 4, "distill")}
    assert [(t["control"], t["recovery"], t["budgets"]) for t in v["recovery_trend"]] == [("scratch_b", "lm", [0, 4])]
    md = (swept / "reports" / "recovery-ci" / "report.md").read_text()
    assert "## 6c. Recovery budget and objective" in md and "recovery_xs_decoder.png" in md
    assert (swept / "reports" / "recovery-ci" / "plots" / "recovery_xs_decoder.png").stat().st_size > 5000
