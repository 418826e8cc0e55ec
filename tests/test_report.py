"""The verdict report on a synthetic MLflow store whose true answer is planted: a real difference, a null, a
refutation, a prunable and a not-prunable method, a scale with one seed, probe histories. Statistics are checked
against scipy; a newer parent (an edited sweep file) replaces the older one in the report."""

from __future__ import annotations

import json
import statistics
import time

import pytest
from conftest import headroom
from scipy import stats

from orchestration.design.spec import parse_sweep
from orchestration.report import load_sweep_runs, write_report

SPEC = """
name: planted
family: decoder
data: {source: stdlib}
scales:
  xs: {steps: 100}
  s: {steps: 100}
seeds: [0, 1, 2, 3, 4]
prune: {ratios: [0.5], methods: [gradient, random], finetune_steps: 10, tolerance: 0.05}
controls: [scratch_e, scratch_b, wide]
"""
SEEDS = [0, 1, 2, 3, 4]
DENSE = [2.00, 2.02, 1.98, 2.01, 1.99]
PRUNED_FT = [2.05, 2.08, 2.03, 2.06, 2.04]  # gradient, after fine-tune (id)
GAP = {  # control − pruned per seed (id): planted difference, planted null, planted refutation
    "scratch_e": [0.11, 0.09, 0.10, 0.12, 0.08],
    "scratch_b": [-0.03, 0.02, 0.01, -0.02, 0.025],
    "wide": [-0.08, -0.06, -0.09, -0.07, -0.10],
}
RATIOS = [round(0.1 * i, 1) for i in range(10)]


def _curve(dense: float, method: str) -> dict:
    if method == "gradient":  # within 5% up to 0.4, then not
        rel = [0, 0.005, 0.01, 0.02, 0.04, 0.08, 0.12, 0.2, 0.3, 0.5]
    else:  # random: out of tolerance from 0.2
        rel = [0, 0.03, 0.07, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6]
    out = {}
    for split in ("id", "shift", "val"):
        out.update({f"curve/{split}/r{r:.1f}": dense * (1 + x) for r, x in zip(RATIOS, rel)})
    return out


class Store:
    def __init__(self, uri: str, name: str):
        from mlflow.tracking import MlflowClient

        self.c = MlflowClient(tracking_uri=uri)
        exp = self.c.get_experiment_by_name(name)
        self.exp = exp.experiment_id if exp else self.c.create_experiment(name)
        self.t = int(time.time() * 1000)

    def parent(self, spec_text: str, spec_hash: str) -> str:
        self.t += 1000
        r = self.c.create_run(self.exp, start_time=self.t, run_name=f"planted-{spec_hash}",
                              tags={"headroom.role": "parent", "headroom.spec_hash": spec_hash})
        sweep = parse_sweep(spec_text)
        self.c.log_text(r.info.run_id, json.dumps(sweep.model_dump(mode="json")), "sweep/resolved.json")
        self.c.set_terminated(r.info.run_id, "FINISHED")
        return r.info.run_id

    def child(self, parent: str, name: str, metrics: dict, status: str = "FINISHED", params: dict | None = None,
              **tags) -> str:
        base = {"stage": "train", "arm": "dense", "scale": "xs", "family": "decoder", "heads": "8", "method": "none",
                "ratio": "none", "scope": "none", "schedule": "none", "seed": "0", "key": name}
        base.update({k: str(v) for k, v in tags.items()})
        if base["arm"] == "pruned":
            base["stage"] = "prune"
        r = self.c.create_run(self.exp, run_name=name, tags={**{f"headroom.{k}": v for k, v in base.items()},
                                                            "mlflow.parentRunId": parent})
        from mlflow.entities import Metric, Param

        ms = [Metric(k, float(v), 0, 0) for k, v in metrics.items()]
        ps = [Param("finetune_steps", "10")] if base["arm"] == "pruned" else []
        ps += [Param(k, str(v)) for k, v in (params or {}).items()]
        self.c.log_batch(r.info.run_id, metrics=ms, params=ps)
        self.c.set_terminated(r.info.run_id, status)
        return r.info.run_id


def _plant(store: Store, parent: str, scales=("xs", "s"), seeds_xs=SEEDS, seeds_s=(0,)) -> None:
    for scale in scales:
        seeds = list(seeds_xs) if scale == "xs" else list(seeds_s)
        off = 0.0 if scale == "xs" else -0.3
        for i in seeds:
            d = DENSE[i] + off
            dense_id = store.child(parent, f"{scale}-decoder-dense-s{i}",
                                   {"final/id/loss": d, "final/shift/loss": d + 0.5, "final/val/loss": d,
                                    "params": 1e5 if scale == "xs" else 4e5, "cost/cpu_s": 36.0, "cost/gpu_s": 0.0},
                                   scale=scale, seed=i, params={"steps": 100})
            if i in seeds:  # the converged check's half-budget run of every seed: 1% worse at half the steps
                store.child(parent, f"{scale}-decoder-dense_half-s{i}", {"final/id/loss": d * 1.01}, arm="dense_half",
                            scale=scale, seed=i, params={"steps": 50})
            if scale == "xs":  # probe histories: heads more similar at init than after training
                from mlflow.entities import Metric

                hist = []
                for step, pf, red in ((0, 0.9, 0.92 + 0.01 * i), (50, 0.2, 0.40), (100, 0.4, 0.31 + 0.01 * i)):
                    hist += [Metric("probe/prunable_fraction", pf, 0, step), Metric("probe/redundancy", red, 0, step),
                             Metric("probe/importance_spread", 0.3 + step / 1000, 0, step)]
                store.c.log_batch(dense_id, metrics=hist)
            p_ft = PRUNED_FT[i] + off
            for method in ("gradient", "random"):
                pre = d * (1.02 if method == "gradient" else 1.25)
                final = p_ft if method == "gradient" else p_ft + 0.2
                m = {"dense/id/loss": d, "dense/shift/loss": d + 0.5, "dense/val/loss": d,
                     "pre_ft/id/loss": pre, "pre_ft/shift/loss": pre + 0.5, "pre_ft/val/loss": pre,
                     "final/id/loss": final, "final/shift/loss": final + 0.5, "final/val/loss": final,
                     "params_dense": 1e5 if scale == "xs" else 4e5, "cost/cpu_s": 12.0, **_curve(d, method)}
                run = store.child(parent, f"{scale}-decoder-pruned-{method}-r0.5-s{i}", m, arm="pruned", scale=scale,
                                  seed=i, method=method, ratio="0.5", scope="per_layer", schedule="one_shot",
                                  kept="4,4,4,4")
                if i == 0:
                    store.c.log_dict(run, {"scores": [[0.1 * h + l for h in range(8)] for l in range(4)]},
                                     "scores.json")
            for arm, gap in GAP.items():
                c = p_ft + gap[i]
                store.child(parent, f"{scale}-decoder-{arm}-r0.5-s{i}",
                            {"final/id/loss": c, "final/shift/loss": c + 0.5 + (0.3 if arm == "wide" else 0),
                             "final/val/loss": c, "cost/cpu_s": 20.0},
                            arm=arm, scale=scale, seed=i, ratio="0.5", scope="per_layer", heads="4")


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    d = tmp_path_factory.mktemp("planted")
    uri = f"sqlite:///{d}/mlflow.db"
    store = Store(uri, "planted")
    parent = store.parent(SPEC, "aaaa")
    _plant(store, parent)
    return uri, d, store, parent


def _row(rows, **kv):
    got = [r for r in rows if all(r[k] == v for k, v in kv.items())]
    assert len(got) == 1, (kv, got)
    return got[0]


def test_planted_verdicts_and_intervals_match_scipy(planted):
    uri, d, store, parent = planted
    out, rep = write_report(uri, "planted", d / "report")
    v = json.loads((out / "verdict.json").read_text())
    assert set(v) == {"sweep", "spec_hash", "comparisons", "prunable", "prune_curves", "diagnostics", "headline",
                      "learning_rates", "evaluation", "timing", "trend", "primary_recovery", "recovery",
                      "recovery_trend", "methods", "stability", "break_even", "savings"}
    assert v["timing"] == []  # every prune here is of the trained model
    # one recovery (F = 10 on the LM loss): the primary one, and no recovery section
    assert v["primary_recovery"] == {"finetune_steps": 10, "recovery": "lm"} and v["recovery"] == []
    assert v["sweep"] == "planted" and v["spec_hash"] == "aaaa"
    keys = {"scale", "family", "ratio", "heads_dense", "heads_kept", "method", "scope", "schedule", "finetune_steps",
            "control", "eval_set", "primary", "n_seeds", "dense_loss", "pruned_loss", "control_loss", "diff_mean",
            "ci95", "verdict", "p_value", "p_holm", "ci95_holm", "verdict_raw", "eval_tokens", "window_share",
            "recovery", "stage", "ci95_simultaneous"}
    assert all(set(c) == keys for c in v["comparisons"])
    expected = {"scratch_e": "supported", "scratch_b": "inconclusive", "wide": "refuted"}
    for arm, gap in GAP.items():
        c = _row(v["comparisons"], scale="xs", control=arm, method="gradient", eval_set="id", finetune_steps=10)
        assert c["primary"] is True and c["n_seeds"] == 5 and c["verdict"] == expected[arm]
        diffs = [(PRUNED_FT[i] + gap[i]) - PRUNED_FT[i] for i in SEEDS]
        lo, hi = stats.t.interval(0.95, len(diffs) - 1, loc=statistics.fmean(diffs), scale=stats.sem(diffs))
        assert c["diff_mean"] == pytest.approx(statistics.fmean(diffs), abs=1e-12)
        assert c["ci95"] == pytest.approx([lo, hi], abs=1e-9)
        # simultaneous over the scale's three primary comparisons: Bonferroni, 1 − 0.05/3, by scipy
        lo3, hi3 = stats.t.interval(1 - 0.05 / 3, len(diffs) - 1, loc=statistics.fmean(diffs), scale=stats.sem(diffs))
        assert c["ci95_simultaneous"] == pytest.approx([lo3, hi3], abs=1e-9)
        assert c["heads_dense"] == 8 and c["heads_kept"] == 4
        assert c["dense_loss"] == pytest.approx(statistics.fmean(DENSE))
        # before fine-tune: the same pairing with the masked model's loss, never primary
        pre = _row(v["comparisons"], scale="xs", control=arm, method="gradient", eval_set="id", finetune_steps=0)
        assert pre["primary"] is False
        assert pre["pruned_loss"] == pytest.approx(statistics.fmean([x * 1.02 for x in DENSE]))
    # a shifted set and other methods are secondary
    assert not any(c["primary"] for c in v["comparisons"] if c["eval_set"] == "shift" or c["method"] == "random")
    # one seed at scale s: no interval invented
    s = _row(v["comparisons"], scale="s", control="scratch_e", method="gradient", eval_set="id", finetune_steps=10)
    assert s["n_seeds"] == 1 and s["ci95"] is None and s["verdict"] == "insufficient_seeds"

    # half (1): before fine-tune, within 5% of dense
    assert _row(v["prunable"], scale="xs", method="gradient", eval_set="id")["verdict"] == "prunable"
    assert _row(v["prunable"], scale="xs", method="random", eval_set="id")["verdict"] == "not_prunable"
    assert all(p["tolerance"] == 0.05 for p in v["prunable"])

    # prune curves: mean and t-interval over seeds; prunable fractions 0.4 (gradient) and 0.1 (random)
    pt = _row(v["prune_curves"], scale="xs", method="gradient", eval_set="id", ratio=0.4, finetune_steps=0)
    vals = [x * 1.04 for x in DENSE]
    assert pt["loss_mean"] == pytest.approx(statistics.fmean(vals))
    lo, hi = stats.t.interval(0.95, 4, loc=statistics.fmean(vals), scale=stats.sem(vals))
    assert pt["loss_ci95"] == pytest.approx([lo, hi])
    after = _row(v["prune_curves"], scale="xs", method="gradient", eval_set="id", ratio=0.5, finetune_steps=10)
    assert after["loss_mean"] == pytest.approx(statistics.fmean(PRUNED_FT))
    assert rep.fractions[("xs", "decoder", "gradient", "per_layer", "one_shot", "id", ())] == 0.4
    assert rep.fractions[("xs", "decoder", "random", "per_layer", "one_shot", "id", ())] == 0.1

    # the claim at xs, per control (Holm over the three primary comparisons changes none of them here)
    assert rep.headline("xs", "decoder") == ("half (1): r0.5 prunable; half (2): supported vs Scratch-E r0.5; "
                                             "refuted vs wide r0.5; inconclusive vs Scratch-B r0.5 "
                                             "(Holm-adjusted over 3 comparison(s))")
    for arm in GAP:
        c = _row(v["comparisons"], scale="xs", control=arm, method="gradient", eval_set="id", finetune_steps=10)
        assert c["p_value"] == pytest.approx(stats.ttest_1samp(GAP[arm], 0.0).pvalue)
        assert c["verdict"] == c["verdict_raw"] and c["window_share"] is None  # no per-window losses planted
    # trust: the planted models pass every check xs can have (it is the smallest scale: no smaller one to compare);
    # s has one seed, so its checks that need an interval could not run and its headline is unverified
    diag = {(d["scale"], d["check"]): d["state"] for d in v["diagnostics"]}
    assert [diag[("xs", c)] for c in ("dense_vs_scratch_e", "larger_scale_not_worse", "informative_beats_random",
                                      "converged")] == ["passed", "not_applicable", "passed", "passed"]
    assert diag[("s", "dense_vs_scratch_e")] == "could_not_run" and rep.headline("s", "decoder").startswith(
        "unverified: dense_vs_scratch_e, larger_scale_not_worse")
    # across scales: two scales give no slope (a size trend needs three), one budget gives no budget trend
    assert v["trend"] == []

    # partial: scale s has seed 0 only; the report names what is missing
    assert "s-decoder-dense-s1" in rep.data.missing and "xs-decoder-dense-s0" not in rep.data.missing
    md = (out / "report.md").read_text()
    assert "Partial report" in md and "`s-decoder-dense-s1`" in md
    for section in ("1. Headline", "2. Trust diagnostics", "3. Pruned vs controls", "4. Eval-set replication",
                    "5. Prune curves", "6. Across scales", "7. Mechanism probes", "8. Learning rates",
                    "9. Evaluation data and statistics", "10. Cost"):
        assert section in md
    assert "Secondary combinations" in md
    # probes: prunable fraction 0.9 at init, lowest 0.2 at step 50, 0.4 at the end; CKA higher at init
    assert "| xs | decoder | 0.9 | 0.20 (step 50) | 0.40 (step 100) | yes" in md
    assert "more similar at init" in md
    assert "a slope across model sizes needs at least three scales" in md
    for png in ("comparisons.png", "prune_curve_xs_decoder_id.png", "probes_importance.png",
                "probes_redundancy.png", "heatmap_xs_decoder_gradient.png"):
        assert (out / "plots" / png).stat().st_size > 5000, png
        assert f"plots/{png}" in md
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == md.count("![")
    # logged to the parent: the files and the headline numbers
    arts = {a.path for a in store.c.list_artifacts(parent, "report")}
    assert {"report/verdict.json", "report/report.md", "report/report.html", "report/plots",
            "report/runs.csv"} <= arts
    # runs.csv: one row per finished child run, a column per axis, metric and param, read back from MLflow
    import csv

    from orchestration.design.axes import AXES

    table = list(csv.DictReader((out / "runs.csv").open()))
    finished = store.c.search_runs([store.exp], f"tags.`mlflow.parentRunId` = '{parent}' and "
                                                "attributes.status = 'FINISHED'", max_results=1000)
    assert sorted(r["run_id"] for r in table) == sorted(r.info.run_id for r in finished)
    assert [a.name for a in AXES] == list(table[0])[3:3 + len(AXES)]
    for i in SEEDS:
        dense = next(r for r in table if r["name"] == f"xs-decoder-dense-s{i}")
        assert (dense["arm"], dense["scale"], dense["seed"], dense["ratio"]) == ("dense", "xs", str(i), "")
        assert float(dense["final/id/loss"]) == DENSE[i] and dense["param/steps"] == "100"
        for arm, gap in GAP.items():
            c = next(r for r in table if r["name"] == f"xs-decoder-{arm}-r0.5-s{i}")
            assert (c["arm"], c["ratio"], c["scope"]) == (arm, "0.5", "per_layer")
            assert float(c["final/id/loss"]) == pytest.approx(PRUNED_FT[i] + gap[i], abs=1e-12)
    # the report pools what runs.csv shows: grouping the exported rows by the report's axes with pandas (the cell
    # for the scale) partitions the runs exactly as the report's statistics group them
    import pandas as pd

    from lightning_modules.declarations.arms import control_names
    from orchestration.design.axes import grouped
    from orchestration.report.analysis import control_runs, pruned_groups

    df = pd.read_csv(out / "runs.csv", dtype=str, keep_default_na=False)
    cols = ["cell" if a == "scale" else a for a in grouped()]
    exported = lambda rows, by: sorted(sorted(g.run_id) for _, g in rows.groupby(by))  # noqa: E731
    pooled = lambda groups: sorted(sorted(r.run_id for r in g.values()) for g in groups.values())  # noqa: E731
    pruned_rows = df[(df.arm == "pruned") & (df.prune_at.astype(float) == 1.0)]
    assert exported(pruned_rows, cols) == pooled(pruned_groups(rep.data.runs)) and len(pruned_rows) > 10
    control_rows = df[df.arm.isin(control_names())]
    assert exported(control_rows, ["arm", *cols]) == pooled(control_runs(rep.data.runs)) and len(control_rows) > 10
    # its group column is the group each run is pooled in: one per pruned group, one per control's group and arm
    assert exported(pruned_rows, ["group"]) == pooled(pruned_groups(rep.data.runs))
    assert exported(control_rows, ["arm", "group"]) == pooled(control_runs(rep.data.runs))
    assert set(control_rows.group.str.extract(r"method=([^;]*)")[0]) == {"*"}  # a per-layer control: every method
    m = store.c.get_run(parent).data.metrics
    c = _row(v["comparisons"], scale="xs", control="scratch_e", method="gradient", eval_set="id", finetune_steps=10)
    assert m["verdict/xs/decoder/r0.5/scratch_e/diff_mean"] == pytest.approx(c["diff_mean"])
    assert m["prunable_fraction/xs/decoder/gradient/id"] == 0.4


def test_report_reads_only_the_newest_parent(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    store = Store(uri, "planted")
    old = store.parent(SPEC, "old0")
    _plant(store, old)
    new = store.parent(SPEC.replace("seeds: [0, 1, 2, 3, 4]", "seeds: [0, 1]"), "new0")
    _plant(store, new, scales=("xs",), seeds_xs=(0, 1))
    data = load_sweep_runs(uri, "planted")
    assert data.parent_id == new and data.spec_hash == "new0"
    assert {r.run_id for r in data.runs} <= {r.info.run_id for r in store.c.search_runs(
        [store.exp], f"tags.`mlflow.parentRunId` = '{new}'")}
    # the newer spec plans two seeds at xs and s: s is missing entirely, and xs seeds 2..4 are not "missing"
    assert "s-decoder-dense-s0" in data.missing and "xs-decoder-dense-s2" not in data.missing
    _, rep = write_report(uri, "planted", tmp_path / "out", log=False)
    assert {c.n_seeds for c in rep.comparisons} == {2}
    assert all(c.scale == "xs" for c in rep.comparisons)


def test_report_bad_input_exits_2_and_writes_nothing(planted, tmp_path, monkeypatch, capsys):
    from orchestration.cli import main

    monkeypatch.chdir(tmp_path)
    uri, d, store, parent = planted
    cases = [
        (["--sweep", "nosuch", "--tracking-uri", uri], "no sweep 'nosuch'"),
        (["--sweep", "planted", "--tracking-uri", "http://127.0.0.1:9"], "unreachable"),
        (["--sweep", "planted", "--tracking-uri", f"sqlite:///{tmp_path}/absent.db"], "no MLflow store"),
    ]
    # a sweep whose parent has no finished pruned run
    empty = Store(uri, "unpruned")
    p = empty.parent(SPEC.replace("name: planted", "name: unpruned"), "cccc")
    empty.child(p, "xs-decoder-dense-s0", {"final/id/loss": 2.0})
    cases.append((["--sweep", "unpruned", "--tracking-uri", uri], "no finished pruned run"))
    for i, (args, msg) in enumerate(cases):
        out = tmp_path / "r"
        if i == 0:  # one as a user runs it, the others in-process (the same main())
            r = headroom("report", *args, "--out", out, cwd=tmp_path)
            code, err = r.returncode, r.stderr
        else:
            code = main(["report", *args, "--out", str(out)])
            err = capsys.readouterr().err
        assert code == 2, (args, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and msg in lines[0], (args, err)
        assert not out.exists()
    assert not (tmp_path / "absent.db").exists() and not (tmp_path / "mlflow.db").exists()


def _memory_run(arm, seed, metrics, params=None, **tags):
    from orchestration.report import Run

    base = {"stage": "prune" if arm == "pruned" else "train", "arm": arm, "scale": "xs", "family": "decoder",
            "heads": "8", "method": "none", "ratio": "none", "scope": "none", "schedule": "none", "seed": str(seed)}
    base.update({k: str(v) for k, v in tags.items()})
    rid = f"{arm}-{tags.get('method', '')}-{seed}"
    return Run(rid, rid, "FINISHED", {f"headroom.{k}": v for k, v in base.items()}, metrics,
               {"finetune_steps": "10"} if arm == "pruned" else dict(params or {}))


def test_best_method_is_chosen_on_val_and_a_failed_half_1_is_said(tmp_path):
    """Random has the lower validation loss and the higher id loss: the best method is random (chosen on val, not
    on an eval set, and the lowest, not the highest). Gradient loses 20% before fine-tune: half (1) fails, and the
    headline says so at that ratio."""
    from orchestration.report import SweepRuns, build
    from orchestration.report.document import render

    runs = []
    for s in (0, 1, 2):
        dense = 2.0 + 0.01 * s
        runs.append(_memory_run("dense", s, {"final/id/loss": dense}, params={"steps": "100"}))
        if s in (0, 1, 2):  # every seed's half-budget run (the converged check's interval)
            runs.append(_memory_run("dense_half", s, {"final/id/loss": dense * 1.01}, params={"steps": "50"}))
        for method, val, idl, pre in (("gradient", 2.10, 2.00, dense * 1.2), ("random", 2.05, 2.30, dense * 1.3)):
            runs.append(_memory_run("pruned", s, {"final/val/loss": val + 0.001 * s, "final/id/loss": idl,
                                                  "pre_ft/id/loss": pre, "dense/id/loss": dense},
                                    method=method, ratio=0.5, scope="per_layer", schedule="one_shot", kept="4"))
        runs.append(_memory_run("scratch_e", s, {"final/id/loss": 2.1}, ratio=0.5, scope="per_layer", heads="4"))
    rep = build(SweepRuns("memory", "t", "h", "p", None, runs, []))
    method, val = rep.best[("xs", "decoder", 0.5, "per_layer", "one_shot", ())]
    assert method == "random" and val == pytest.approx(2.051)
    assert [p.verdict for p in rep.prunable if p.method == "gradient"] == ["not_prunable"]
    assert rep.headline("xs", "decoder").startswith("half (1): r0.5 not prunable; half (2):")
    md = render(rep, tmp_path).markdown(tmp_path)
    assert "| random (best on val) |" in md and "| gradient (best on val) |" not in md


def test_the_parent_description_labels_its_differences_as_they_are(planted):
    """The parent run's description (its MLflow note) holds control − pruned and says so: the planted Scratch-E
    gap is +0.10 (pruning wins), and the column it sits in is labelled control − pruned (it read pruned − control)."""
    from orchestration.report import build, load_sweep_runs
    from orchestration.report.verdict import headline_markdown

    uri, *_ = planted
    rep = build(load_sweep_runs(uri, "planted"))
    md = headline_markdown(rep, "report")
    header = next(line for line in md.splitlines() if line.startswith("| ratio | control |"))
    assert "control − pruned" in header and "pruned − control" not in md
    row = next(line for line in md.splitlines() if line.startswith("| 0.5 | Scratch-E |"))
    assert f"{statistics.fmean(GAP['scratch_e']):+.4f}" in row  # +0.1000: positive, pruning wins


def test_integer_axes_stay_integers_in_runs_csv_where_some_runs_have_none():
    """A recovery budget of 200 is written 200, not 200.0, though the dense row has no F (pandas would make the
    column float)."""
    from orchestration.report.read import Run, runs_table

    runs = [Run("a", "n", "FINISHED", {"headroom.arm": "pruned", "headroom.scale": "xs",
                                       "headroom.finetune_steps": "200", "headroom.seed": "1"}, {}, {}),
            Run("b", "m", "FINISHED", {"headroom.arm": "dense", "headroom.scale": "xs", "headroom.seed": "0"}, {}, {})]
    text = runs_table(runs)[["finetune_steps", "seed", "ratio"]].to_csv(index=False)
    assert text.splitlines() == ["finetune_steps,seed,ratio", "200,1,", ",0,"]
