"""Arms and scoring methods are declared once (lightning_modules.declarations.arms, lightning_modules.declarations.methods): a method and a
control registered here, in the test alone, are accepted by a sweep file, planned by `--plan` with the cost and the
training steps their declarations give, scored by `score_heads` with their own scorer, and carried through the
report over a synthetic MLflow store (its tables, verdicts and headline), compared with hand-computed values."""

from __future__ import annotations

import json
import statistics

import pytest
from test_report import Store

from lightning_modules.declarations.arms import ARMS, Arm, control_names, pruned_shape, register_arm, unregister_arm
from lightning_modules.declarations.methods import METHODS, Method, register_method, unregister_method
from orchestration.cli import main
from orchestration.report import write_report

HALF = 0.5  # the test method's forward-pass equivalents per calibration token


def score_last_first(model, batches, loss_fn, mask=None, **_):
    """Heads scored by their index: the first head of every layer is the least important."""
    import torch

    from lightning_modules.pruning.scoring import _finish, _shape

    L, H, valid = _shape(model)
    return _finish(torch.arange(H, dtype=torch.float64).repeat(L, 1), valid)


def gigabytes_per_gpu(cfg, batch_size, seq_len, gpu):
    """A memory behaviour of its own, declared here alone: 7 GB on a GPU, one batch's tokens in kilobytes on a CPU."""
    return 7 * 2**30 if gpu else 1024 * batch_size * seq_len


@pytest.fixture
def declared():
    register_method(Method("last_first", score_last_first, lambda n, bt, calib, o: HALF, needs_calibration=False,
                           memory=gigabytes_per_gpu))
    register_arm(Arm("scratch_h", "Scratch-H", "Scratch-H control: the pruned architecture ({heads}) trained for "
                     "half the dense run's steps, {steps} ({what}).", control=True, architecture=pruned_shape,
                     steps=lambda b: b.dense_steps // 2, for_global=True))
    try:
        yield
    finally:
        unregister_method("last_first")
        unregister_arm("scratch_h")
    assert "last_first" not in METHODS and "scratch_h" not in ARMS


SWEEP = """
name: declared
family: decoder
data: {source: stdlib}
scales:
  xs: {steps: 40}
seeds: [0]
prune: {ratios: [0.5], methods: [random, last_first], scope: [per_layer, global], finetune_steps: 4,
        calibration_batches: 2}
controls: [scratch_e, scratch_h]
"""


def test_a_declared_method_and_control_are_planned(declared, tmp_path, capsys):
    f = tmp_path / "declared.yaml"
    f.write_text(SWEEP)
    assert main(["sweep", str(f), "--plan", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    dense = next(r for r in rows if r["arm"] == "dense")
    se = [r for r in rows if r["arm"] == "scratch_e" and r["stage"] == "train"]
    sh = [r for r in rows if r["arm"] == "scratch_h" and r["stage"] == "train"]
    assert len(se) == len(sh) == 1 and sh[0]["heads"] == se[0]["heads"] == [4] * len(dense["heads"])
    assert se[0]["steps"] == 40 and sh[0]["steps"] == 20  # its declaration's rule, T // 2
    # a global prune gets its own copy of each control declared for global prunes, the new one included
    glob = [r for r in rows if r["stage"] == "controls"]
    assert sorted((r["arm"], r["method"], r["steps"]) for r in glob) == [
        ("scratch_e", "last_first", 40), ("scratch_e", "random", 40),
        ("scratch_h", "last_first", 20), ("scratch_h", "random", 20)]
    # the method's cost is its declaration's: HALF forward passes per calibration token more than random's 0
    for scope in ("per_layer", "global"):
        new, rnd = ([r for r in rows if r["stage"] == "prune" and r["method"] == m and r["scope"] == scope][0]
                    for m in ("last_first", "random"))
        calib_tokens = 2 * dense["tokens"] // dense["steps"]  # calibration_batches × batch × seq_len
        assert new["est_flops"] - rnd["est_flops"] == int(HALF * calib_tokens * dense["flops_per_token"])
    # its memory is its declaration's, on a CPU and on a GPU (where 7 GB is the trial's peak), with no edit elsewhere
    fine_tune = max(r["memory_bytes"] for r in rows if r["stage"] == "prune" and r["method"] == "random")
    on_cpu = [r["memory_bytes"] for r in rows if r["stage"] == "prune" and r["method"] == "last_first"]
    assert on_cpu and all(m == max(fine_tune, 1024 * dense["tokens"] // dense["steps"]) for m in on_cpu)
    f.write_text(SWEEP + "resources: {cpu: 1, gpu: 0.25, gpu_memory_gb: 80}\n")
    assert main(["sweep", str(f), "--plan", "--json"]) == 0
    on_gpu = [r["memory_bytes"] for r in json.loads(capsys.readouterr().out)
              if r["stage"] == "prune" and r["method"] == "last_first"]
    assert on_gpu and set(on_gpu) == {7 * 2**30}


def test_a_declared_method_scores_with_its_own_scorer(declared):
    import torch

    from lightning_modules.declarations.config import model_config_for
    from lightning_modules.declarations.prune_plan import PrunePlan
    from lightning_modules.models.build import build_model
    from lightning_modules.pruning.choose import select_heads
    from lightning_modules.pruning.scoring import score_heads

    model = build_model(model_config_for("xs", "decoder", n_heads=4), seed=0)
    scores = score_heads(model, [], "last_first")
    assert torch.equal(scores, torch.arange(4, dtype=torch.float64).repeat(scores.shape[0], 1))
    keep, _ = select_heads(model, [], PrunePlan(method="last_first", ratio=0.5))
    assert [sorted(k) for k in keep] == [[2, 3]] * scores.shape[0]  # the two lowest-index heads go


GAPS = {"scratch_e": [0.10, 0.12, 0.08], "scratch_h": [-0.05, -0.07, -0.06]}  # control − pruned, per seed


def test_the_report_carries_a_declared_method_and_control(declared, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    store = Store(uri, "declared")
    spec = SWEEP.replace("seeds: [0]", "seeds: [0, 1, 2]").replace("scope: [per_layer, global], ", "").replace(
        "[random, last_first]", "[gradient, last_first]").replace("finetune_steps: 4", "finetune_steps: 10")
    # the stored sweep file declares the F the runs logged: the primary recovery comes from it, not from the runs
    parent = store.parent(spec, "bbbb")
    for s in range(3):
        d = 2.0 + 0.01 * s
        store.child(parent, f"xs-decoder-dense-s{s}", {"final/id/loss": d}, seed=s, params={"steps": 40})
        for method, pre in (("gradient", d * 1.3), ("last_first", d * 1.01)):
            m = {f"{k}/id/loss": v for k, v in (("dense", d), ("pre_ft", pre), ("final", d + 0.05))}
            store.child(parent, f"xs-decoder-pruned-{method}-r0.5-s{s}", m, arm="pruned", seed=s, method=method,
                        ratio="0.5", scope="per_layer", schedule="one_shot", heads="8")
        for arm, gap in GAPS.items():
            store.child(parent, f"xs-decoder-{arm}-r0.5-s{s}", {"final/id/loss": d + 0.05 + gap[s]}, arm=arm,
                        seed=s, ratio="0.5", scope="per_layer", heads="4")
    out, rep = write_report(uri, "declared", tmp_path / "report")
    v = json.loads((out / "verdict.json").read_text())
    rows = [c for c in v["comparisons"] if c["eval_set"] == "id" and c["finetune_steps"] == 10]  # the Store logs F = 10
    for arm, gap in GAPS.items():
        for method in ("gradient", "last_first"):
            c = next(c for c in rows if c["control"] == arm and c["method"] == method)
            assert c["diff_mean"] == pytest.approx(statistics.fmean(gap)) and c["n_seeds"] == 3
    assert {c["control"] for c in rows} == {"scratch_e", "scratch_h"}
    # half (1): the new method's pre-fine-tune loss is within 5% of dense, gradient's is not
    prunable = {p["method"]: p["verdict"] for p in v["prunable"] if p["eval_set"] == "id"}
    assert prunable == {"last_first": "prunable", "gradient": "not_prunable"}
    md = (out / "report.md").read_text()
    assert "half (2) vs Scratch-H" in md and "| Scratch-H |" in md and "last_first" in md
    primary = {c["control"]: c["verdict"] for c in rows if c["primary"]}
    assert primary == {"scratch_e": "supported", "scratch_h": "refuted"}  # Holm over the two, both clear
    # the headline withholds the words until the trust checks can run (no random method, no half-budget run)
    assert rep.headline("xs", "decoder").startswith("unverified: informative_beats_random, converged")
    assert control_names()[-1] == "scratch_h"


def test_the_report_refuses_to_drop_a_run_that_its_grouping_cannot_tell_apart():
    """Runs are grouped by named axes; two runs that differ only on an axis the grouping leaves out (here the
    budget of a scale, were it not part of the cell) must not silently overwrite each other by seed."""
    from orchestration.report import Run
    from orchestration.report.analysis import by_seed, pruned_groups

    def run(name, **tags):
        base = {"stage": "prune", "arm": "pruned", "scale": "xs", "family": "decoder", "method": "gradient",
                "ratio": "0.5", "scope": "per_layer", "schedule": "one_shot", "seed": "0", **tags}
        return Run(name, name, "FINISHED", {f"headroom.{k}": v for k, v in base.items()}, {}, {})

    a, b = run("xs-T100-a", steps="100"), run("xs-T200-b", steps="200")
    assert {k: sorted(v) for k, v in pruned_groups([a, b]).items()} == {
        ("xs-T100", "decoder", 0.5, "gradient", "per_layer", "one_shot", 0, "lm"): [0],
        ("xs-T200", "decoder", 0.5, "gradient", "per_layer", "one_shot", 0, "lm"): [0]}  # the cell keeps them apart
    # so do the recovery budget and objective (a run from before their tags: F from its params, "lm")
    c, d = run("xs-F20", finetune_steps="20"), run("xs-F20-kd", finetune_steps="20", recovery="distill")
    assert sorted(pruned_groups([c, d])) == [("xs", "decoder", 0.5, "gradient", "per_layer", "one_shot", 20, "distill"),
                                             ("xs", "decoder", 0.5, "gradient", "per_layer", "one_shot", 20, "lm")]
    with pytest.raises(ValueError, match="xs-T100-a and xs-T200-b share their group and seed 0"):
        by_seed([a, b], lambda r: (r.family, r.method))


def test_a_store_whose_runs_miss_the_recovery_its_sweep_file_declares_is_refused(tmp_path):
    """The sweep file declares F = 4; its pruned runs logged F = 10 (the Store's): the report names both instead of
    printing a headline that says the primary comparison is not in the sweep."""
    from lightning_modules.declarations.config import HeadroomInputError

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    store = Store(uri, "mismatch")
    spec = SWEEP.replace("seeds: [0]", "seeds: [0, 1, 2]").replace("[random, last_first]", "[random]")
    parent = store.parent(spec.replace("controls: [scratch_e, scratch_h]", "controls: [scratch_e]"), "cccc")
    for s in range(3):
        store.child(parent, f"xs-decoder-dense-s{s}", {"final/id/loss": 2.0}, seed=s, params={"steps": 40})
        m = {f"{k}/id/loss": 2.1 for k in ("dense", "pre_ft", "final")}
        store.child(parent, f"xs-decoder-pruned-random-r0.5-s{s}", m, arm="pruned", seed=s, method="random",
                    ratio="0.5", scope="per_layer", schedule="one_shot", heads="8")
    with pytest.raises(HeadroomInputError, match=r"primary recovery .*\(F = 4, lm\); pruned runs finished at F = 10"):
        write_report(uri, "mismatch", tmp_path / "report")


def test_every_axis_a_sweep_file_sets_names_a_field_of_the_sweep_schema():
    """An axis declares where a sweep file sets it (orchestration/design/axes.py); the schema
    (orchestration/design/schema.py) validates that field. The two must name the same place: a renamed field would
    leave the axis pointing nowhere."""
    from orchestration.design.axes import AXES
    from orchestration.design.schema import ScaleSpec, Sweep

    set_by_file = [a for a in AXES if a.sweep_field]
    assert len(set_by_file) >= 10
    for a in set_by_file:
        model = Sweep
        for part in a.sweep_field.split("."):
            if part == "<scale>":
                model = ScaleSpec
                continue
            assert part in model.model_fields, f"axis {a.name}: {a.sweep_field} is not a sweep-file field"
            ann = model.model_fields[part].annotation
            model = next((t for t in (getattr(ann, "__args__", None) or (ann,)) if hasattr(t, "model_fields")),
                         model if part == "scales" else None)


def test_a_grouped_axis_declared_in_the_test_alone_is_grouped_paired_and_trended_by_name():
    """An axis registered here (`widget`, grouped) splits every pruned group and its controls: each widget's pruned
    runs pair with that widget's Scratch-E (the gaps planted per widget come back exactly), a Scratch-B the plan
    stamped as standing for every widget pairs with both, the other fields of a row keep their values (no positional
    shift), and each widget gets its own trend across three scales."""
    from orchestration.design.axes import Axis, register_axis, unregister_axis
    from orchestration.design.unit import group_text, stands_for
    from orchestration.report import Run, build
    from orchestration.report.read import SweepRuns

    gaps = {"a": (0.10, 0.12, 0.08), "b": (-0.05, -0.03, -0.07)}  # Scratch-E − pruned, per seed
    early = {"a": 0.02, "b": 0.2}  # pruned at p = 0.5 − pruned at p = 1
    slope = {"xs": 0.0, "s": 0.02, "m": 0.04}  # the gap grows with the scale, the same for both widgets
    register_axis(Axis("widget", "prune.widget", groups=True, controls="each"))
    try:
        runs = []

        def run(arm, scale, seed, widget, loss, every_widget=False, **tags):
            t = {"stage": "prune" if arm == "pruned" else "train", "arm": arm, "scale": scale, "family": "decoder",
                 "heads": "8", "method": "none", "ratio": "none", "scope": "none", "schedule": "none",
                 "seed": str(seed), "widget": widget, **tags}
            ratio = None if t["ratio"] == "none" else float(t["ratio"])
            values = {"scale": scale, "family": "decoder", "ratio": ratio, "method": t["method"], "scope": t["scope"],
                      "schedule": t["schedule"], "finetune_steps": 10, "recovery": "lm", "widget": widget}
            wild = stands_for(arm, t["scope"], None if every_widget else 10)
            if wild is not None:  # the plan's stamp; a control planned once for every widget says so here alone
                t["group"] = group_text(values, wild | ({"widget"} if every_widget else set()))
            params = {"steps": "100", "batch_size": "8", "seq_len": "32", "finetune_steps": "10"}
            n = {"xs": 1e4, "s": 4e4, "m": 1.6e5}[scale]
            runs.append(Run(f"{scale}-{arm}-{widget}-{seed}", f"{scale}-{arm}-{widget}-{seed}", "FINISHED",
                            {f"headroom.{k}": v for k, v in t.items()}, {"final/id/loss": loss, "dense/id/loss": 2.0,
                            "pre_ft/id/loss": 2.1, "params_dense_nonembedding": n}, params))

        for scale in ("xs", "s", "m"):
            for seed in range(3):
                run("dense", scale, seed, "none", 2.0)
                for w, g in gaps.items():
                    pruned = 2.05 + 0.01 * seed
                    run("pruned", scale, seed, w, pruned, method="gradient", ratio="0.5", scope="per_layer",
                        schedule="one_shot", kept="4", finetune_steps="10")
                    run("scratch_e", scale, seed, w, pruned + g[seed] + slope[scale], ratio="0.5", scope="per_layer",
                        heads="4")
                    if scale == "xs":  # pruned halfway through training: worse by a widget's own amount
                        run("pruned", scale, seed, w, pruned + early[w], method="gradient", ratio="0.5",
                            scope="per_layer", schedule="one_shot", kept="4", finetune_steps="10", prune_at="0.5")
                run("scratch_b", scale, seed, "none", 2.05 + 0.01 * seed - 0.2, every_widget=True, ratio="0.5",
                    scope="per_layer", heads="4")
        rep = build(SweepRuns("memory", "t", "hash", "parent", None, runs, [], {}))
        # the control the plan stamped as standing for every widget pairs with each widget's pruned runs: read
        # from its tag (without it, the arm's own rule would make its widget "none" and pair it with nothing)
        b = [c for c in rep.comparisons if c.control == "scratch_b" and c.eval_set == "id" and c.stage == "final"]
        assert sorted((c.scale, c.group["widget"]) for c in b) == sorted(
            (s, w) for s in ("xs", "s", "m") for w in "ab") and all(c.diff_mean == pytest.approx(-0.2) for c in b)
        rows = [c for c in rep.comparisons if c.control == "scratch_e" and c.eval_set == "id" and c.stage == "final"]
        assert len(rows) == 3 * 2
        for c in rows:
            w = c.group["widget"]
            assert c.diff_mean == pytest.approx(statistics.fmean(gaps[w]) + slope[c.scale], abs=1e-12)
            assert (c.method, c.scope, c.schedule, c.finetune_steps, c.recovery) == (
                "gradient", "per_layer", "one_shot", 10, "lm")
            assert c.to_json()["group"] == {"widget": w}
        across = [t for t in rep.trends if t.control == "scratch_e" and t.fit == "across_scales"]
        assert sorted(t.group["widget"] for t in across) == ["a", "b"]
        for t in across:
            assert [p.diff_mean for p in t.points] == pytest.approx(
                [statistics.fmean(gaps[t.group["widget"]]) + slope[s] for s in ("xs", "s", "m")], abs=1e-12)
            assert t.slope > 0
        # the timing rows: a row per widget, each against its own p = 1 prunes and its own Scratch-E, by hand
        half = [t for t in rep.timing if t.prune_at == 0.5]
        assert sorted(t.group["widget"] for t in half) == ["a", "b"]
        for t in half:
            w = t.group["widget"]
            assert t.vs_late_mean == pytest.approx(early[w], abs=1e-12)
            assert t.vs_scratch_e_mean == pytest.approx(statistics.fmean(gaps[w]) - early[w], abs=1e-12)
    finally:
        unregister_axis("widget")
