"""How much of a sweep's trial time is the work itself: seconds inside training, evaluation and scoring steps ÷
trial seconds, per trial; the median over the sweep's trials with its spread (benchmarks/measure.py), every
trial's share in the JSON, and the pooled share (all work ÷ all trial seconds) beside it. Goal: median ≥ 0.6.
Numerator and denominator of a trial's share are measured in the same moments, inside that trial.

Runs the quickstart sweep through the real `headroom sweep` machinery (local Ray, MLflow in a temporary SQLite
store) and reads each unit's timings back from MLflow (`cost/train_s`, `cost/eval_s`, `cost/score_s` measured
inside the trial, `cost/wall_s` Tune's trial time). The rest of a trial is framework setup, data preparation,
checkpoints and reporting. Beside it, the same work over the sweep's wall time × the CPUs it had: what the
machine as a whole spent on the experiment (Ray's start, planning and the report included).

    python benchmarks/compute_share.py            # the quickstart as shipped (about 10 minutes on 2 cores)
    python benchmarks/compute_share.py --tiny     # the quickstart at smoke size
    python benchmarks/compute_share.py --store sqlite:///mlflow.db --experiment smoke   # a sweep already run

`--store` measures the trials of a sweep that has run (its newest parent; the sweep's wall time from the parent
run's start and end): CI checks the JSON on the smoke sweep its other tests run anyway, not on a second sweep.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from measure import at_least, summarize
from sweep_runs import run_and_read

from orchestration.design.schema import TrainOverrides
from orchestration.design.spec import load_sweep
from orchestration.running.summary import compute_share, has_timing

GOAL = 0.6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--sweep", default=str(ROOT / "sweeps" / "quickstart.yaml"), help="the sweep file to measure")
    ap.add_argument("--store", help="an MLflow tracking URI whose sweep has run: measure its trials, run nothing")
    ap.add_argument("--experiment", help="with --store: the sweep's name (its MLflow experiment)")
    ap.add_argument("--out", default="benchmarks/results/compute_share.json")
    args = ap.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if args.store:
        if not args.experiment:
            ap.error("--store needs --experiment")
        wall, runs = read_store(args.store, args.experiment)
        return write(args, args.experiment, "store", wall, runs)

    sweep, text = load_sweep(args.sweep)
    if args.tiny:  # one scale, one seed, a few steps: the same stages and arms
        first = next(iter(sweep.scales))
        tiny = sweep.scales[first].model_copy(update={"steps": 30, "overrides": TrainOverrides(
            batch_size=8, seq_len=64, warmup_steps=3, val_every=15, val_batches=2, eval_batches=2)})
        # (pruned models are not logged: the driver's MLflow work is no trial's, and the JSON is all CI checks)
        sweep = sweep.model_copy(update={"name": "bench-compute-share", "scales": {first: tiny}, "seeds": [0],
                                         "probes": None, "log_models": False})

    work = Path(tempfile.mkdtemp(prefix="headroom-bench-"))
    cwd = os.getcwd()
    os.chdir(work)  # mlflow.db, ray_results/, reports/ go here
    try:
        # the report is part of the machine's share at full size; the tiny size checks the JSON only
        got = run_and_read(sweep, Path(args.sweep).name, text, report=not args.tiny)
        if got is None:
            return 1
        wall, runs = got
    finally:
        os.chdir(cwd)
    return write(args, sweep.name, "tiny" if args.tiny else "default", wall, runs)


def read_store(uri: str, experiment: str) -> tuple[float, list]:
    """(wall seconds of the newest parent run, its child runs) of a sweep recorded at `uri`."""
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=uri)
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        raise SystemExit(f"compute_share: no experiment {experiment!r} at {uri}")
    runs = c.search_runs([exp.experiment_id], max_results=5000)
    parents = [r for r in runs if r.data.tags.get("headroom.role") == "parent"]
    parent = max(parents, key=lambda r: r.info.start_time)
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    return (parent.info.end_time - parent.info.start_time) / 1000, children


def write(args, name: str, size: str, wall: float, runs: list) -> int:
    timed = [r for r in runs if has_timing(r.data.metrics)]
    share = compute_share([r.data.metrics for r in timed])
    samples = [{"stage": r.data.tags.get("headroom.stage"), "unit": r.data.tags.get("headroom.key"),
                "trial_s": r.data.metrics["cost/wall_s"], "share": x} for r, x in zip(timed, share["shares"])]
    median = summarize([x["share"] for x in samples], at_least(GOAL))
    cpus = os.cpu_count() or 1
    work_s = share["pooled"] * share["trial_s"]
    by_stage = {}
    for stage in ("lr_search", "train", "prune"):
        s = compute_share([r.data.metrics for r in timed if r.data.tags.get("headroom.stage") == stage])
        if s is not None:
            by_stage[stage] = s
    result = {
        "benchmark": "compute_share",
        "sweep": name,
        "size": size,
        "trials": share["trials"],
        "trial_s": share["trial_s"],
        "work_s": work_s,
        # per trial: its work ÷ its seconds; the median over trials, its spread, every trial
        "samples": samples,
        "median_ratio": median["median"],
        "spread": median["spread"],
        "pooled_ratio": share["pooled"],
        "median_train_share": share["train_s"],
        "median_eval_share": share["eval_s"],
        "median_score_share": share["score_s"],
        "by_stage": {k: v["share"] for k, v in by_stage.items()},
        "sweep_wall_s": wall,
        "cpus": cpus,
        "machine_share": work_s / (wall * cpus),
        "goal": GOAL,
        "meets_goal": median["meets_goal"],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("median_ratio", "spread", "pooled_ratio", "machine_share", "trials",
                                             "sweep_wall_s", "meets_goal")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
