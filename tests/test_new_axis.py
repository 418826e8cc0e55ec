"""A new grouped axis, declared in this file alone: the recipe of docs/design.md ("Where a new arm, method or axis
goes"). `declare()` is the whole declaration — its sweep field, its values, its effect on a unit, how controls
treat it, its tag and label — and a tiny real sweep (Ray, MLflow, training on the embedded text) run by a driver
that declares it shows it in `--plan`, the console's verdict and summary, runs.csv, verdict.json and report.md,
each group labelled and paired with its controls; the pairing the plan stamped is checked against the plan's rule
applied afresh, and each group's gap against a hand computation from runs.csv."""

from __future__ import annotations

import csv
import json
import statistics
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def declare(controls: str = "every"):
    """The axis: the recovery fine-tune's rate scaled by `prune.lr_scale` (a list: each value its own prune units).
    Its effect is on the unit's prune settings, so the trials run it without knowing the axis."""
    from orchestration.design.axes import Axis, register_axis

    def scaled(unit, v):
        if unit.prune is None:  # a control: nothing to scale (with controls="each" it only carries the value)
            return unit
        return replace(unit, prune=unit.prune.model_copy(update={"finetune_lr": unit.prune.finetune_lr * v}))

    return register_axis(Axis("lr_scale", "prune.lr_scale", None, groups=True, field=(list[float], [1.0]),
                              to_tag=lambda v: "none" if v is None else f"{v:g}", from_tag=float,
                              apply=scaled, controls=controls, label=lambda v: f"lr×{v:g}"))


@pytest.fixture
def axis():
    from orchestration.design.axes import unregister_axis

    declare()
    try:
        yield
    finally:
        unregister_axis("lr_scale")


SWEEP = """
name: axis
family: [decoder]
data: {source: stdlib}
scales:
  xs:
    steps: 20
    overrides: {batch_size: 8, seq_len: 64, warmup_steps: 4, val_every: 20, val_batches: 2, eval_batches: 2}
seeds: [0, 1]
prune:
  ratios: [0.5]
  methods: [gradient]
  finetune_steps: 10
  finetune_lr: 1.0e-3
  lr_scale: [0.5, 2.0]
  calibration_batches: 2
controls: [scratch_e, scratch_b]
resources: {cpu: 1, gpu: 0}
"""

DRIVER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import test_new_axis
    test_new_axis.declare()
    from orchestration.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def _drive(cwd: Path, *args: str, cache: str) -> subprocess.CompletedProcess:
    driver = cwd / "study.py"
    driver.write_text(DRIVER.format(tests=str(TESTS)))
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT), "HEADROOM_CACHE": cache, "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.run([sys.executable, str(driver), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=900, env=env)


def test_the_sweep_field_is_the_axis_own_and_old_sweeps_keep_their_hash(axis):
    import yaml

    from orchestration.design.axes import unregister_axis
    from orchestration.design.spec import parse_sweep

    doc = yaml.safe_load(SWEEP)
    assert parse_sweep(SWEEP).prune.lr_scale == [0.5, 2.0]
    del doc["prune"]["lr_scale"]
    with_axis = parse_sweep(yaml.safe_dump(doc))
    assert with_axis.prune.lr_scale == [1.0]
    with pytest.raises(Exception, match="lr_scale"):  # its own validation: a list of numbers
        parse_sweep(SWEEP.replace("lr_scale: [0.5, 2.0]", "lr_scale: [fast]"))
    unregister_axis("lr_scale")
    try:
        assert parse_sweep(yaml.safe_dump(doc)).spec_hash() == with_axis.spec_hash()  # not set: the same hash
        with pytest.raises(Exception, match="lr_scale"):  # undeclared, the field is unknown again
            parse_sweep(SWEEP)
    finally:
        declare()


@pytest.mark.parametrize("controls", ["every", "each"])
def test_the_plan_expands_the_axis_and_stamps_the_controls_it_planned(controls):
    """Every prune unit once per value, with the value's effect; controls once for every value ("every": stamped
    `*`) or once per value ("each"); and every prune unit's `headroom.controls` stamp names the group of a control
    unit the plan made, for each control the sweep trains."""
    from orchestration.design.axes import unregister_axis
    from orchestration.design.plan import build_plan
    from orchestration.design.preflight import plan_rows
    from orchestration.design.spec import parse_sweep

    declare(controls)
    try:
        plan = build_plan(parse_sweep(SWEEP), "h")
        pruned = plan.pruned
        assert sorted((u.seed, dict(u.axes)["lr_scale"], u.prune.finetune_lr) for u in pruned) == [
            (s, v, pytest.approx(1e-3 * v)) for s in (0, 1) for v in (0.5, 2.0)]
        assert len({u.key for u in pruned}) == len({u.name for u in pruned}) == 4
        scratch_e = [u for u in plan.trained if u.arm == "scratch_e"]
        assert len(scratch_e) == (2 if controls == "every" else 4)
        groups = {(u.arm, u.comparison_group()) for u in plan.trained if u.arm in ("scratch_e", "scratch_b")}
        for p in pruned:
            stamp = p.control_groups()
            for arm in ("scratch_e", "scratch_b"):
                assert (arm, stamp[arm]) in groups
                assert ("lr_scale=*" in stamp[arm]) == (controls == "every")
        rows = {(r.arm, r.seed, json.dumps(r.axes)) for r in plan_rows(plan)}
        want = "*" if controls == "every" else 0.5
        assert ("scratch_b", 0, json.dumps({"lr_scale": want})) in rows
        assert ("pruned", 1, json.dumps({"lr_scale": 2.0})) in rows
    finally:
        unregister_axis("lr_scale")


def test_every_shipped_sweep_stamps_on_each_prune_the_controls_its_plan_made():
    """Without a registered axis: the stamp of every prune unit of every shipped sweep names, for each control the
    sweep trains, a control group the plan made (a global prune's from its own controls)."""
    from orchestration.design.plan import build_plan
    from orchestration.design.spec import load_sweep

    checked = 0
    for name in sorted(json.loads((TESTS / "golden" / "shipped_sweeps.json").read_text())):  # the scales sweeps
        sweep, _ = load_sweep(ROOT / "sweeps" / name)
        if sweep.pretrained is not None or not sweep.controls:
            continue
        plan = build_plan(sweep, "h")
        dense = {u.key: u for u in plan.dense}
        made = {(u.arm, u.comparison_group()) for u in plan.trained + list(plan.taught)}
        made |= {(u.arm, u.comparison_group())
                 for u in plan.global_controls(lambda p: list(dense[p.dense_key].model.layer_heads))}
        for p in plan.pruned:
            stamp = p.control_groups()
            for arm in sweep.controls:
                from lightning_modules.declarations.arms import ARMS

                if ARMS[arm].per_recovery and (p.finetune_steps, p.recovery) not in {
                        (f, k) for f in sweep.finetune_steps(p.scale) for k in ARMS[arm].recoveries} \
                        and p.f_label is not None:
                    continue  # a recovery this control is not planned for (F = 0 of a ladder without it)
                if p.prune_at != 1.0 and p.scope == "global" and ARMS[arm].for_global:
                    continue  # a global prune during training has no controls of its own
                assert (arm, stamp[arm]) in made, (name, p.name, arm, stamp[arm])
                checked += 1
    assert checked > 100


def test_a_sweep_with_the_axis_labels_and_pairs_each_group_everywhere(tmp_path, cache_dir):
    sweep = tmp_path / "axis.yaml"
    sweep.write_text(SWEEP)
    plan = _drive(tmp_path, "sweep", str(sweep), "--plan", cache=str(cache_dir))
    assert plan.returncode == 0, plan.stderr[-2000:]
    head = plan.stdout.splitlines()[0].split()
    assert head[head.index("F") + 1] == "lr_scale"  # its --plan column
    prune_rows = [line.split() for line in plan.stdout.splitlines() if line.startswith("prune ")]
    assert sorted(r[head.index("lr_scale")] for r in prune_rows) == ["0.5", "0.5", "2", "2"]

    r = _drive(tmp_path, "sweep", str(sweep), cache=str(cache_dir))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    # the console: the driver's summary has a column per value; the verdict a labelled line per group and control
    assert "pruned:gradient lr×0.5" in out and "pruned:gradient lr×2" in out
    for v in ("0.5", "2"):
        for c in ("Scratch-E", "Scratch-B"):
            assert sum(f"r0.5 (lr×{v}) vs {c}" in line for line in out.splitlines()) == 1, out[-3000:]

    report = tmp_path / "reports" / "axis"
    rows = list(csv.DictReader((report / "runs.csv").open()))
    pruned = [x for x in rows if x["arm"] == "pruned"]
    assert sorted(x["lr_scale"] for x in pruned) == ["0.5", "0.5", "2.0", "2.0"]
    assert {x["param/finetune_lr"] for x in pruned} == {"0.0005", "0.002"}  # the value's effect, as run
    assert {x["lr_scale"] for x in rows if x["arm"] == "scratch_e"} == {""}  # one control for every value
    assert all("lr_scale=*" in x["group"] for x in rows if x["arm"] in ("scratch_e", "scratch_b"))
    assert {x["group"].split("lr_scale=")[1].split(";")[0] for x in pruned} == {"0.5", "2"}

    verdict = json.loads((report / "verdict.json").read_text())
    loss = "final/id/loss"
    for v in (0.5, 2.0):
        mine = {x["seed"]: float(x[loss]) for x in pruned if float(x["lr_scale"]) == v}
        for arm in ("scratch_e", "scratch_b"):
            ctrl = {x["seed"]: float(x[loss]) for x in rows if x["arm"] == arm}
            want = statistics.fmean(ctrl[s] - mine[s] for s in mine)  # the hand pairing, by seed
            got = [c for c in verdict["comparisons"] if c["control"] == arm and c["eval_set"] == "id"
                   and c["stage"] == "final" and c.get("group") == {"lr_scale": v}]
            assert len(got) == 1 and got[0]["diff_mean"] == pytest.approx(want, abs=1e-9)
    assert sorted(s["group"]["lr_scale"] for s in verdict["savings"]) == [0.5, 2.0]
    # the prune curves' point after recovery and the replication across eval sets: a row per value, as by hand
    for v in (0.5, 2.0):
        mine = [float(x[loss]) for x in pruned if float(x["lr_scale"]) == v]
        got = [c for c in verdict["prune_curves"] if c["eval_set"] == "id" and c["finetune_steps"] == 10
               and c.get("group") == {"lr_scale": v}]
        assert len(got) == 1 and got[0]["loss_mean"] == pytest.approx(statistics.fmean(mine), abs=1e-9)
        assert got[0]["n_seeds"] == 2
        assert any(c["finetune_steps"] == 0 and c.get("group") == {"lr_scale": v} for c in verdict["prune_curves"])

    md = (report / "report.md").read_text()
    headline = md.split("## 1. Headline")[1].split("## ")[0]
    assert "| group |" in headline and "| lr×0.5 |" in headline and "| lr×2 |" in headline
    section3 = md.split("## 3.")[1].split("## 4.")[0]
    assert section3.count("| lr×0.5 |") == section3.count("| lr×2 |") >= 4
    section4 = md.split("## 4.")[1].split("## ")[0]  # the embedded text has a shifted eval set: a row per value
    for c in ("Scratch-E", "Scratch-B"):
        assert [f"| {c} (lr×{v}) |" in section4 for v in ("0.5", "2")] == [True, True], section4

    # the report paired by the plan's stamp; the plan's rule applied afresh to the same runs pairs the same runs
    from orchestration.design.axes import unregister_axis
    from orchestration.report.analysis import control_runs, controls_of, pruned_groups
    from orchestration.report.read import load_sweep_runs

    declare()
    try:
        runs = load_sweep_runs(f"sqlite:///{tmp_path / 'mlflow.db'}", "axis").runs
        controls = control_runs(runs)
        groups = pruned_groups(runs)
        assert len(groups) == 2
        for key, by_seed in groups.items():
            assert all(r.controls is not None for r in by_seed.values())
            unstamped = {s: replace(r, tags={k: v for k, v in r.tags.items() if k != "headroom.controls"})
                         for s, r in by_seed.items()}
            for arm in ("scratch_e", "scratch_b"):
                stamped = controls_of(controls, arm, key, by_seed)
                assert len(stamped) == 2
                assert {s: r.run_id for s, r in stamped.items()} == {
                    s: r.run_id for s, r in controls_of(controls, arm, key, unstamped).items()}
    finally:
        unregister_axis("lr_scale")
