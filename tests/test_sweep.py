"""`headroom sweep` end to end with local Ray started in-process and MLflow in SQLite: the smoke sweep and its
re-run, and a pretrained sweep (faults, kills and resumes: test_resume.py)."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from scipy import stats

pytestmark = pytest.mark.slow

TAGS = ("stage", "arm", "scale", "family", "heads", "method", "ratio", "scope", "schedule", "seed", "key")


def sweep_cmd(*args):
    return [sys.executable, "-m", "orchestration.cli", "sweep", *map(str, args)]


def run_sweep(cwd: Path, *args, env=None, timeout=900):
    r = subprocess.run(sweep_cmd(*args), cwd=cwd, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, **(env or {})})
    return r


def client(cwd: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{cwd / 'mlflow.db'}")


def runs_of(c, name: str):
    exp = c.get_experiment_by_name(name)
    return list(c.search_runs([exp.experiment_id], max_results=5000)) if exp else []


def split(runs):
    parents = [r for r in runs if r.data.tags.get("headroom.role") == "parent"]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    return parents, children


def steps_of(c, run, metric="train/loss"):
    return sorted(m.step for m in c.get_metric_history(run.info.run_id, metric))


# ------------------------------------------------------------------------------------------- smoke sweep


def test_smoke_sweep_one_parent_and_every_unit_a_child_with_the_contract(smoke, tmp_path):
    c = client(smoke["cwd"])
    parents, children = split(runs_of(c, "smoke"))
    assert len(parents) == 1
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    ptags = parent.data.tags
    assert re.fullmatch(r"[0-9a-f]{40}|unknown", ptags["headroom.git_commit"])
    assert {"version/torch", "version/ray", "version/mlflow", "version/transformers"} <= set(parent.data.params)
    arts = {a.path for a in c.list_artifacts(parent.info.run_id, "sweep")}
    assert arts == {"sweep/smoke.yaml", "sweep/resolved.json", "sweep/plan.json"}
    # the plan the sweep ran, recorded: what its report expects (every trained and pruned unit's name), never
    # re-planned from the spec with the code of the day
    plan = json.loads(Path(c.download_artifacts(parent.info.run_id, "sweep/plan.json", str(tmp_path))).read_text())
    finished = {r.info.run_name for r in children if r.data.tags["headroom.stage"] != "lr_search"}
    assert sorted(plan["expected"]) == sorted(finished) and len(plan["expected"]) == 21
    # 2 architectures (8 and 4 heads) × 2 lr candidates; 2 budgets × 2 seeds × (dense, scratch_e, scratch_b) and
    # one half-budget dense run (T20, seed 0: the converged check); × 2 methods pruned
    by_stage = {}
    for r in children:
        assert r.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert all(r.data.tags.get(f"headroom.{t}") for t in TAGS), r.data.tags
        by_stage.setdefault(r.data.tags["headroom.stage"], []).append(r)
    assert {k: len(v) for k, v in by_stage.items()} == {"lr_search": 4, "train": 13, "prune": 8}
    keys = [r.data.tags["headroom.key"] for r in children]
    assert len(set(keys)) == len(keys)
    arms = sorted((r.data.tags["headroom.arm"], r.data.tags["headroom.family"]) for r in by_stage["train"])
    assert arms == sorted([(a, f) for a in ("dense", "scratch_e", "scratch_b") for f in ("decoder",)] * 4
                          + [("dense_half", "decoder")])
    for r in by_stage["train"] + by_stage["prune"]:
        m, t = r.data.metrics, r.data.tags
        assert r.info.status == "FINISHED"
        for s in ("val", "id", "shift"):
            assert 0 < m[f"final/{s}/loss"] < 6 and m[f"final/{s}/ppl"] > 1
        assert m["cost/cpu_s"] > 0 and m["cost/gpu_s"] == 0 and m["params"] > 0 and m["flops_per_token"] > 0
        assert t["headroom.scale"] == "xs" and t["headroom.seed"] in ("0", "1") and t["headroom.steps"] in ("20", "40")
        assert t["headroom.prune_at"] == ("none" if t["headroom.stage"] == "train" else t["headroom.prune_at"])
        # every run evaluated where it trained, at the one declared precision
        assert (r.data.params["eval_device"], r.data.params["eval_precision"]) == ("cpu", "32-true")
        assert r.data.params["train_precision"] == "32-true" and "gpu_ids" not in r.data.params  # "auto" on a CPU
        if t["headroom.arm"] in ("dense", "dense_half"):
            assert (t["headroom.heads"], t["headroom.method"], t["headroom.ratio"]) == ("8", "none", "none")
        else:
            assert t["headroom.ratio"] == "0.5"
    for r in by_stage["prune"]:
        m, t = r.data.metrics, r.data.tags
        assert t["headroom.method"] in ("gradient", "random") and t["headroom.heads"] == "8"
        assert (t["headroom.scope"], t["headroom.schedule"], t["headroom.kept"]) == ("per_layer", "one_shot", "4,4")
        assert all(f"pre_ft/{s}/loss" in m for s in ("val", "id", "shift"))
        assert m["params"] < m["params_dense"]
        files = {a.path for a in c.list_artifacts(r.info.run_id)}
        assert {"scores.json", "scores.png", "metrics.json"} <= files
        assert "prune_curve.png" in files  # the mask-only curve of the trained model
    assert sorted(r.data.tags["headroom.prune_at"] for r in by_stage["prune"]) == ["1"] * 8
    for r in by_stage["train"]:
        if r.data.tags["headroom.arm"] not in ("dense", "dense_half"):
            assert r.data.tags["headroom.heads"] == "4" and r.data.tags["headroom.method"] == "none"
    half = next(r for r in by_stage["train"] if r.data.tags["headroom.arm"] == "dense_half")
    assert (half.data.params["steps"], half.data.tags["headroom.steps"], half.data.tags["headroom.seed"]) == (
        "10", "20", "0")


def test_smoke_sweep_logs_every_training_step_once(smoke):
    c = client(smoke["cwd"])
    _, children = split(runs_of(c, "smoke"))
    for r in children:
        if r.data.tags["headroom.stage"] != "train":
            continue
        T = int(r.data.params["steps"])
        every = min(20, T)  # the half-budget run (10 steps) validates at its end
        assert steps_of(c, r) == list(range(1, T + 1)), r.info.run_name
        assert steps_of(c, r, "val/loss") == [s for s in range(every, T + 1, every)]
        assert r.data.params["val_every"] == str(every)  # what the fault campaign's audit checks the steps against


def test_smoke_scratch_b_gets_the_compute_of_the_pruned_arm(smoke):
    from lightning_modules.declarations.config import model_config_for
    from lightning_modules.declarations.costs import flops_per_token, scratch_b_steps

    c = client(smoke["cwd"])
    _, children = split(runs_of(c, "smoke"))
    # what the gradient prunes of each budget logged for scoring their heads, per token of a training step (8 × 64)
    scoring = {r.data.tags["headroom.steps"]: r.data.metrics["cost/scoring_flops"] / (8 * 64) for r in children
               if r.data.tags["headroom.arm"] == "pruned" and r.data.tags["headroom.method"] == "gradient"}
    assert scoring and all(v > 0 for v in scoring.values())
    for r in children:
        if r.data.tags["headroom.arm"] == "scratch_b":
            fam = r.data.tags["headroom.family"]
            T = int(r.data.tags["headroom.steps"])
            # the pruned arm's recovery: 10 fine-tune steps at each of the 3 candidate rates it chose among, and the
            # gradient scoring its prune runs logged
            dense = model_config_for("xs", fam, 8)
            passes = scoring[str(T)] / flops_per_token(dense, 64).total  # in dense forward passes per token
            want = scratch_b_steps(dense, model_config_for("xs", fam, 4), T, 3 * 10, 64, scoring_passes=passes)
            assert int(r.data.params["steps"]) == want > T


def test_smoke_lr_search_feeds_the_train_stage(smoke):
    """One search per architecture trained from scratch (dense 8 heads; Scratch-E/B 4 heads), and every arm trains
    at its own architecture's best rate, as the Optuna study records it."""
    import optuna

    c = client(smoke["cwd"])
    _, children = split(runs_of(c, "smoke"))
    db = next((smoke["cwd"] / "ray_results").glob("smoke-*/optuna.db"))
    studies = {s.study_name.rsplit("-", 2)[-2:][0] + "-" + s.study_name.rsplit("-", 1)[-1]: s.study_name
               for s in optuna.get_all_study_summaries(f"sqlite:///{db}")}
    for fam in ("decoder",):
        for heads, arms in (("8", ("dense",)), ("4", ("scratch_e", "scratch_b"))):
            cands = [r for r in children if r.data.tags["headroom.stage"] == "lr_search"
                     and r.data.tags["headroom.family"] == fam and r.data.tags["headroom.heads"] == heads]
            assert len(cands) == 2 and len({r.data.params["lr"] for r in cands}) == 2
            best = min(cands, key=lambda r: r.data.metrics["val/loss"])
            used = {r.data.params["lr"] for r in children if r.data.tags["headroom.stage"] == "train"
                    and r.data.tags["headroom.family"] == fam and r.data.tags["headroom.arm"] in arms}
            assert used == {best.data.params["lr"]}
            assert {r.data.params["lr_source"] for r in children if r.data.tags["headroom.stage"] == "train"
                    and r.data.tags["headroom.arm"] in arms} == {"searched"}
            # the Optuna study of that architecture lives under the storage path and agrees
            study = optuna.load_study(study_name=studies[f"{fam}-{heads}x8"], storage=f"sqlite:///{db}")
            assert float(used.pop()) == pytest.approx(study.best_trial.params["lr"], rel=1e-9)
    # the recovery fine-tune's rate was chosen on val from the grid around the dense rate
    for r in children:
        if r.data.tags["headroom.arm"] == "pruned":
            grid = [float(x) for x in r.data.params["finetune_lr_grid"].split(",")]
            vals = {float(k.rsplit("lr", 1)[1]): v for k, v in r.data.metrics.items()
                    if k.startswith("finetune/val_loss/")}
            assert len(vals) == 3 and r.data.metrics["finetune/lr"] == pytest.approx(min(vals, key=vals.get))
            assert sorted(vals) == pytest.approx(sorted(grid), rel=1e-2)


def test_smoke_sweep_prints_progress_and_summary(smoke):
    out = smoke["stdout"]
    assert "[headroom] train: 13 trial(s)" in out and "[headroom] prune: 8 trial(s)" in out
    assert "mean final loss" in out and "pruned:gradient" in out and "scratch_b" in out
    assert "verdict of sweep smoke" in out
    assert re.search(r"plan: 23 unit\(s\) checked on the meta device", out)  # 2 searches, 13 trained, 8 pruned
    # planned once (every stage, the checks and the report read that plan), then once more to take the searched rates
    assert "[headroom] plan: built 2 time(s) in this driver" in out
    assert re.search(r"wall time \d+ s: lr_search \d+ s, train \d+ s, prune \d+ s", out)
    # medians over trials, recomputed here from the runs' own timings in MLflow (lr candidates ASHA stopped early
    # report none)
    _, children = split(runs_of(client(smoke["cwd"]), "smoke"))
    timed = [r.data.metrics for r in children if r.info.status == "FINISHED" and "cost/train_s" in r.data.metrics]
    kinds = ("train_s", "eval_s", "score_s", "stability_s")  # the split-half re-scoring is a prune trial's work too
    shares = [sum(m.get(f"cost/{k}", 0.0) for k in kinds) / m["cost/wall_s"] for m in timed]
    m = re.search(r"compute share: median (\d+)% of a trial \(IQR (\d+)%–(\d+)%, (\d+) trials\)", out)
    assert m and int(m.group(4)) == len(shares) and 21 <= len(shares) <= 25
    assert f"{statistics.median(shares):.0%}" == f"{m.group(1)}%" and int(m.group(2)) <= int(m.group(1)) <= int(m.group(3))
    by_stage = re.search(r"trial seconds, median \(IQR\) over trials: .*train ([\d.]+) s \([\d.]+–[\d.]+; 13 trials\), "
                         r"prune ([\d.]+) s \([\d.]+–[\d.]+; 8 trials\)", out)
    assert by_stage
    train_s = [r.data.metrics["cost/wall_s"] for r in children if r.data.tags["headroom.stage"] == "train"]
    assert by_stage.group(1) == f"{statistics.median(train_s):.1f}"


def test_smoke_dense_runs_log_their_probes_once_per_step(smoke):
    c = client(smoke["cwd"])
    _, children = split(runs_of(c, "smoke"))
    dense = [r for r in children if r.data.tags["headroom.stage"] == "train" and r.data.tags["headroom.arm"] == "dense"]
    assert len(dense) == 4
    for r in dense:
        T = int(r.data.tags["headroom.steps"])
        for m in ("probe/prunable_fraction", "probe/importance_spread", "probe/redundancy", "probe/redundancy/layer0"):
            assert steps_of(c, r, m) == list(range(0, T + 1, 20)), (r.info.run_name, m)
    others = [r for r in children if r.data.tags["headroom.arm"] != "dense" and "probe/redundancy" in r.data.metrics]
    assert not others


def test_smoke_sweep_writes_the_verdict_report(smoke):
    """The report of the sweep's own runs: every primary difference recomputed from the MLflow runs by seed."""
    from orchestration.report import VERDICTS

    out = smoke["cwd"] / "reports" / "smoke"
    v = json.loads((out / "verdict.json").read_text())
    c = client(smoke["cwd"])
    parents, children = split(runs_of(c, "smoke"))
    assert v["sweep"] == "smoke" and v["spec_hash"] == parents[0].data.tags["headroom.spec_hash"]
    final = {}
    for r in children:
        t = r.data.tags
        if t["headroom.stage"] != "lr_search" and t["headroom.prune_at"] in ("none", "1"):
            final[(f"xs-T{t['headroom.steps']}", t["headroom.arm"], t["headroom.family"], t["headroom.method"],
                   int(t["headroom.seed"]))] = r.data.metrics["final/id/loss"]
    primary = [x for x in v["comparisons"] if x["primary"]]
    assert sorted((x["scale"], x["family"], x["control"]) for x in primary) == sorted(
        (c, f, a) for c in ("xs-T20", "xs-T40") for f in ("decoder",) for a in ("scratch_e", "scratch_b"))
    for x in primary:
        diffs = [final[(x["scale"], x["control"], x["family"], "none", s)]
                 - final[(x["scale"], "pruned", x["family"], "gradient", s)] for s in (0, 1)]
        assert x["n_seeds"] == 2 and x["diff_mean"] == pytest.approx(sum(diffs) / 2, abs=1e-9)
        assert x["verdict"] in VERDICTS and x["ci95"][0] <= x["diff_mean"] <= x["ci95"][1]
        # the interval includes the eval windows' variance: at least as wide as the seeds' alone
        seeds_only = stats.t.interval(0.95, 1, loc=x["diff_mean"], scale=stats.sem(diffs))
        assert x["ci95"][1] - x["ci95"][0] >= seeds_only[1] - seeds_only[0] - 1e-9 and 0 < x["window_share"] < 1
        want = "supported" if x["ci95"][0] > 0 else "refuted" if x["ci95"][1] < 0 else "inconclusive"
        assert x["verdict_raw"] == want
        held = x["ci95_holm"]
        assert x["verdict"] == ("supported" if held[0] > 0 else "refuted" if held[1] < 0 else "inconclusive")
    # 40-step models: the report does not pretend they carry a verdict
    diags = {(d["scale"], d["family"], d["check"]): d["passed"] for d in v["diagnostics"]}
    from orchestration.report.diagnostics import SHORT
    assert set(diags) == {(c, "decoder", k) for c in ("xs-T20", "xs-T40") for k in SHORT}  # every check, both cells
    assert diags[("xs-T40", "decoder", "larger_scale_not_worse")] is None
    assert diags[("xs-T20", "decoder", "finite")] is True and diags[("xs-T40", "decoder", "finite")] is True
    # the gap against the budget (pruning during training: test_resumed_sweeps_report_prune_timing)
    trend = {(t["family"], t["control"], t["axis"]) for t in v["trend"]}
    assert trend == {(f, a, "tokens_per_param") for f in ("decoder",) for a in ("scratch_e", "scratch_b")}
    for h in v["headline"]:
        assert h["untrustworthy"] == any(d["passed"] is False for d in v["diagnostics"]
                                         if (d["scale"], d["family"]) == (h["scale"], h["family"]))
    assert {(p["family"], p["method"]) for p in v["prunable"] if p["eval_set"] == "id"} == {
        (f, m) for f in ("decoder",) for m in ("gradient", "random")}
    # which scorer: random against gradient before fine-tune, and gradient's split-half stability, each from the
    # runs' own metrics by seed (random reads no data: no stability)
    pre, rho = {}, {}
    for r in children:
        t = r.data.tags
        if t["headroom.arm"] == "pruned" and t["headroom.prune_at"] == "1":
            cell = f"xs-T{t['headroom.steps']}"
            pre[(cell, t["headroom.method"], int(t["headroom.seed"]))] = r.data.metrics["pre_ft/id/loss"]
            if "stability/spearman" in r.data.metrics:
                rho.setdefault((cell, t["headroom.method"]), {})[t["headroom.seed"]] = r.data.metrics[
                    "stability/spearman"]
    gaps = [g for g in v["methods"] if g["eval_set"] == "id"]
    assert {(g["scale"], g["method"]) for g in gaps} == {("xs-T20", "random"), ("xs-T40", "random")}
    for g in gaps:
        d = [pre[(g["scale"], "random", s)] - pre[(g["scale"], "gradient", s)] for s in (0, 1)]
        assert g["diff_mean"] == pytest.approx(sum(d) / 2, abs=1e-9) and g["reference"] == "gradient"
    assert {(x["scale"], x["method"]) for x in v["stability"]} == set(rho) == {("xs-T20", "gradient"),
                                                                              ("xs-T40", "gradient")}
    for x in v["stability"]:
        seeds = rho[(x["scale"], x["method"])]
        assert x["n_seeds"] == len(seeds) == 2 and x["spearman"] == pytest.approx(sum(seeds.values()) / 2)
        assert set(x["overlap"]) == {"0.25", "0.5", "0.75"}
    md = (out / "report.md").read_text()
    assert "## 6d. Which scorer" in md
    assert "Partial report" not in md and "plots/probes_importance.png" in md and "plots/probes_redundancy.png" in md
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == md.count("](plots/")
    arts = {a.path for a in c.list_artifacts(parents[0].info.run_id, "report")}
    assert {"report/verdict.json", "report/report.html", "report/report.md"} <= arts


def test_smoke_rerun_creates_no_runs(smoke):
    c = client(smoke["cwd"])
    before = {r.info.run_id: (r.info.status, r.info.end_time) for r in runs_of(c, "smoke")}
    r = run_sweep(smoke["cwd"], ROOT / "sweeps" / "smoke.yaml")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "all 13 unit(s) finished already" in r.stdout and "all 8 unit(s) finished already" in r.stdout
    after = {r.info.run_id: (r.info.status, r.info.end_time) for r in runs_of(c, "smoke")}
    children = {k: v for k, v in after.items() if k in before}
    assert set(after) == set(before)
    assert all(children[k] == before[k] for k in before if before[k][0] == "FINISHED" and
               k != split(runs_of(c, "smoke"))[0][0].info.run_id)


def test_pretrained_sweep_prunes_a_saved_checkpoint(tmp_path, cache_dir):
    from test_spec import save_tiny_gpt2

    save_tiny_gpt2(tmp_path / "checkpoints" / "gpt2")
    text = (ROOT / "sweeps" / "pretrained.yaml").read_text()
    # the shipped file, at test size and on the offline default data
    # one stdlib package as local text files: the tiny checkpoint's BPE encodes them in a second
    import sysconfig

    lib = sysconfig.get_paths()["stdlib"]
    src = f"'path:{lib}/asyncio/*.py'"
    for a, b in (('"hf:wikitext:wikitext-103-raw-v1"', src), ("batch_size: 8", "batch_size: 4"),
                 ("seq_len: 512", "seq_len: 64"), ("eval_batches: 32", "eval_batches: 2"),
                 ("calibration_batches: 32", "calibration_batches: 2"),
                 ("[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]", "[0.5]"), ("seeds: [0, 1, 2]", "seeds: [0]"),
                 ("methods: [gradient, ablation, random]", "methods: [gradient, random]"),
                 ("{cpu: 4, gpu: 1}", "{cpu: 1, gpu: 0}")):
        assert a in text, a
        text = text.replace(a, b)
    (tmp_path / "pretrained.yaml").write_text(text)
    r = run_sweep(tmp_path, "pretrained.yaml")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    c = client(tmp_path)
    parents, children = split(runs_of(c, "pretrained-gpt2"))
    assert len(parents) == 1 and len(children) == 2 * 2 * 2  # methods × scopes × schedules
    for x in children:
        t, m = x.data.tags, x.data.metrics
        assert (t["headroom.stage"], t["headroom.arm"], t["headroom.scale"]) == ("prune", "pruned", "pretrained")
        assert t["headroom.heads"] == "12" and x.info.status == "FINISHED"
        assert x.data.params["data"].startswith("path:")
        # no recovery fine-tune: the physically pruned model scores what the gated model scored
        sets = {k.split("/")[1] for k in m if k.startswith("final/") and k.endswith("/loss")}
        assert sets == {"val", "id"}  # a path: source has no shifted set unless one is named
        for s in sets:
            assert m[f"final/{s}/loss"] == pytest.approx(m[f"pre_ft/{s}/loss"], abs=1e-4)
        kept = [int(k) for k in t["headroom.kept"].split(",")]
        assert sum(kept) == 12  # half of 2 × 12 heads
        if t["headroom.scope"] == "per_layer":
            assert kept == [6, 6]
    # the report of a prune-only sweep: half (1), and no comparison invented
    v = json.loads((tmp_path / "reports" / "pretrained-gpt2" / "verdict.json").read_text())
    assert v["comparisons"] == [] and {p["method"] for p in v["prunable"]} == {"gradient", "random"}
    assert all(p["scale"] == "pretrained" and p["ratio"] == 0.5 for p in v["prunable"])
    md = (tmp_path / "reports" / "pretrained-gpt2" / "report.md").read_text()
    assert "Half (2) was not tested" in md and "half (2) not tested" in r.stdout
    # the checkpoint's own BPE tokenizer was used, not bytes
    path = c.download_artifacts(parents[0].info.run_id, "sweep/resolved.json", str(tmp_path / "download"))
    resolved = json.loads(Path(path).read_text())
    assert resolved["data"]["tokenizer"].startswith("pretrained:") and resolved["family"] == ["decoder"]


# ------------------------------------------------------------------------------------------- bf16 on CPU

BF16_LOSS_TOL = 0.03  # |bf16 − fp32| ÷ fp32 of a unit's final id loss: at most this, the median at most a third
BF16_RANK_MIN = 0.9  # Spearman ρ of a gradient prune's head scores with fp32's, where the dense models still agree


def test_the_smoke_sweep_at_bf16_mixed_on_cpu_follows_its_fp32_run(smoke, tmp_path):
    """The smoke sweep again at `precision: bf16-mixed` (Lightning's CPU autocast; evaluation and scoring stay
    fp32): every stage runs — gated training, gradient scoring, pruning, the recovery fine-tune, the controls, the
    report — and every unit's final id loss is within BF16_LOSS_TOL of the fp32 sweep's (the shared smoke run).
    Head rankings: where the two dense models are still one model (the 20-step budget: losses within 0.1%), the
    gradient scores rank alike; at 40 steps bf16's rounding has moved the model about as far as another seed does
    (measured: ρ 0.29 and 0.60, against 0.41 and 0.56 between the fp32 seeds), so that is printed, not asserted."""
    from mlflow.artifacts import download_artifacts

    text = (ROOT / "sweeps" / "smoke.yaml").read_text()
    text = text.replace("name: smoke", "name: smoke-bf16").replace("eval_batches: 2}",
                                                                     "eval_batches: 2, precision: bf16-mixed}")
    text = text.replace("seeds: [0, 1]", "seeds: [0]")  # one seed's units, each against its fp32 twin (CI time)
    text += "log_models: false\n"  # the models are not what this test compares (CI time)
    assert "precision: bf16-mixed}" in text and "seeds: [0]" in text
    (tmp_path / "bf16.yaml").write_text(text)
    r = run_sweep(tmp_path, tmp_path / "bf16.yaml")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert json.loads((tmp_path / "reports" / "smoke-bf16" / "verdict.json").read_text())["comparisons"]
    ref = {x.info.run_name: x for x in split(runs_of(client(smoke["cwd"]), "smoke"))[1]}
    got = {x.info.run_name: x for x in split(runs_of(client(tmp_path), "smoke-bf16"))[1]}
    assert set(got) <= set(ref) and all(got[n].data.tags["headroom.seed"] in ("0", "none") for n in got)

    def scores(run, cwd):
        path = download_artifacts(run_id=run.info.run_id, artifact_path="scores.json",
                                  tracking_uri=f"sqlite:///{cwd / 'mlflow.db'}")
        return [v for row in json.loads(Path(path).read_text())["scores"] for v in row if v is not None]

    rel, rho = {}, {}
    for name, run in got.items():
        assert run.data.params.get("eval_precision", "32-true") == "32-true", name  # evaluation is fp32 for all
        if run.data.tags["headroom.stage"] in ("train", "prune"):  # trained (or fine-tuned) at the declared precision
            assert (run.data.params["train_precision"], ref[name].data.params["train_precision"]) == (
                "bf16-mixed", "32-true"), name
        if "final/id/loss" in ref[name].data.metrics:
            a, b = ref[name].data.metrics["final/id/loss"], run.data.metrics["final/id/loss"]
            rel[name] = abs(b - a) / a
        if run.data.tags.get("headroom.method") == "gradient":
            rho[name] = stats.spearmanr(scores(ref[name], smoke["cwd"]), scores(run, tmp_path)).statistic
    print("bf16 vs fp32, relative loss:", {k: round(v, 4) for k, v in sorted(rel.items())})
    print("bf16 vs fp32, gradient-score Spearman:", {k: round(float(v), 3) for k, v in sorted(rho.items())})
    assert len(rel) >= 10 and len(rho) == 2  # seed 0: every trained and pruned unit; its two gradient prunes
    assert sum(v > 1e-5 for v in rel.values()) >= len(rel) // 2  # the precision reached training: the numbers moved
    assert max(rel.values()) <= BF16_LOSS_TOL and statistics.median(rel.values()) <= BF16_LOSS_TOL / 3, rel
    for name, value in rho.items():
        if "-T20-" in name:
            assert value >= BF16_RANK_MIN, (name, value)
