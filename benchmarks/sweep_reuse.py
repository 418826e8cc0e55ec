"""Train once, prune many: what a prune-stage trial costs next to the dense training it reuses.

Runs the smoke sweep's dense and prune stages through the real `headroom sweep` machinery (local Ray, MLflow in a
temporary SQLite store), then, in the same Ray session, the naive grid: one trial per (dense model × method ×
ratio) that trains its dense model and prunes it — the same training and pruning code, only without reuse.

Each prune-stage trial is paired with the train trial of the dense model it prunes, and so is each naive trial:
median_ratio = the median over prune trials of (prune trial seconds ÷ its dense trial's seconds), with its spread
(benchmarks/measure.py; goal ≤ 0.2); naive_median_ratio = the same for the naive grid's trials (each retrains).
Trial seconds are the work of each trial after its worker's one-time framework imports (the sweep's
`cost/work_s` in MLflow; reused actors import once, so counting imports would charge them to whichever trial
came first). The stages cannot be interleaved — a prune trial needs its trained dense model — so the spread over
pairs is what shows this machine's noise; every pair is in the JSON.

    python benchmarks/sweep_reuse.py            # smoke's units, 3 seeds, at the xs preset budget (300 dense steps)
    python benchmarks/sweep_reuse.py --tiny     # one seed, family, method; smoke's 40 steps (CI: checks the JSON)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from measure import at_most, summarize
from sweep_runs import run_and_read

from orchestration.design.plan import prune_units, train_units
from orchestration.design.spec import load_sweep
from orchestration.design.unit import Unit


def naive_trial(config):
    """The baseline: train this unit's dense model, then prune it — in one trial, every time."""
    from ray import tune

    from lightning_modules.pruning.run import run_prune
    from lightning_modules.training.loop import set_threads, train_lm
    from orchestration.running.callbacks import ReportAtValidation, StepHistory
    from orchestration.running.ddp import Session
    from orchestration.running.frameworks import quiet_frameworks

    quiet_frameworks()
    set_threads()
    t0 = time.time()  # as the sweep's trials: the work, after the worker's one-time imports
    cfg = config["cfg"]
    dense, unit = Unit.from_dict(cfg["dense"]), Unit.from_dict(cfg["unit"])
    # trained as a sweep's train trial trains: reporting and checkpointing at every validation
    history = StepHistory()
    result = train_lm(dense.model, dense.train, dense.data, progress=False,
                      callbacks=[history, ReportAtValidation(history, Session(train=False).report)])
    run_prune(result.lm.model.eval(), result.data, unit.prune_job())
    # the work it did, beside its seconds: the dense steps it trained (then it pruned, as a prune trial does)
    tune.report({"work_s": time.time() - t0, "dense_steps_trained": result.metrics["steps"]})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--steps", type=int, help="dense steps (default: 300, the xs preset; --tiny: smoke's 40)")
    ap.add_argument("--out", default="benchmarks/results/sweep_reuse.json")
    args = ap.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

    sweep, _ = load_sweep(ROOT / "sweeps" / "smoke.yaml")
    steps = args.steps or (40 if args.tiny else 300)
    scales = {k: v.model_copy(update={"steps": steps}) for k, v in sweep.scales.items()}
    # no controls, lr search or probes, one budget, prunes of the trained models only: the ratio compares the
    # prune stage with plain dense training
    prune = sweep.prune.model_copy(update={"at": [1.0]})
    update = {"name": "bench-sweep-reuse", "scales": scales, "controls": [], "lr": None, "probes": None,
              "prune": prune, "log_models": False}  # it measures trials; logging pruned models is the driver's
    if args.tiny:
        update.update(family=["decoder"], seeds=[0], prune=prune.model_copy(update={"methods": ["random"]}))
    else:  # 3 seeds × 2 methods: 6 pairs, enough for the median's interval to decide the goal
        update.update(seeds=[0, 1, 2])
    sweep = sweep.model_copy(update=update)

    work = Path(tempfile.mkdtemp(prefix="headroom-bench-"))
    cwd = os.getcwd()
    os.chdir(work)  # mlflow.db, ray_results/ go here
    try:
        got = run_and_read(sweep, "smoke.yaml", "(benchmark)", report=False)  # it measures trials only
        if got is None:
            return 1
        sweep_wall, runs = got
        # each prune trial with the train trial of the dense model it prunes
        dense_s = {r.info.run_id: r.data.metrics["cost/work_s"] for r in runs if r.data.tags["headroom.arm"] == "dense"}
        dense_key = {r.data.tags["headroom.key"]: r.info.run_id for r in runs if r.data.tags["headroom.arm"] == "dense"}
        # the work each trial did, from its MLflow run: the training steps it logged (train/loss history); a prune
        # trial trains no dense model
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=f"sqlite:///{Path('mlflow.db').resolve()}")
        steps_of = {r.info.run_id: len(client.get_metric_history(r.info.run_id, "train/loss")) for r in runs}
        prune_pairs = [{"prune": r.data.metrics["cost/work_s"], "dense": dense_s[r.data.tags["headroom.dense_run_id"]],
                        "unit": r.data.tags["headroom.key"], "dense_steps_trained": steps_of[r.info.run_id],
                        "dense_run_steps": steps_of[r.data.tags["headroom.dense_run_id"]]}
                       for r in runs if r.data.tags["headroom.stage"] == "prune"]

        # the naive grid, in the same Ray session, with the same units
        from ray import tune

        from lightning_modules.data.prepared import data_identity

        ident = data_identity(sweep.data)
        dense_units = [u for u in train_units(sweep, ident.data_hash, None, ident.vocab_size) if u.arm == "dense"]
        by_key = {u.key: u for u in dense_units}
        grid = [{"dense": by_key[p.dense_key].to_dict(), "unit": p.to_dict()} for p in prune_units(sweep, dense_units)]
        tuner = tune.Tuner(
            tune.with_resources(naive_trial, {"cpu": sweep.resources.cpu}),
            param_space={"cfg": tune.grid_search(grid)},
            tune_config=tune.TuneConfig(reuse_actors=True),
            run_config=tune.RunConfig(name="naive", storage_path=str(work / "ray_results"), verbose=0),
        )
        # each naive trial with the sweep's train trial of the same dense unit
        naive_pairs = [{"naive": r.metrics["work_s"], "dense": dense_s[dense_key[r.config["cfg"]["unit"]["dense_key"]]],
                        "unit": r.config["cfg"]["unit"]["key"], "dense_steps_trained": r.metrics["dense_steps_trained"]}
                       for r in tuner.fit()]
    finally:
        os.chdir(cwd)

    for p in prune_pairs:
        p["ratio"] = p["prune"] / p["dense"]
    for p in naive_pairs:
        p["ratio"] = p["naive"] / p["dense"]
    reuse = summarize([p["ratio"] for p in prune_pairs], at_most(0.2))
    naive = summarize([p["ratio"] for p in naive_pairs])
    result = {
        "benchmark": "sweep_reuse",
        "sweep": "smoke (dense and prune stages)",
        "size": "tiny" if args.tiny else "default",
        "dense_steps": steps,
        "families": sweep.families,
        "seeds": sweep.seeds,
        "dense_trials": len(dense_s),
        "prune_trials": len(prune_pairs),
        "naive_trials": len(naive_pairs),
        # prune trial ÷ its dense trial, per prune trial: the median, its spread, every pair
        "samples": prune_pairs,
        "median_ratio": reuse["median"],
        "spread": reuse["spread"],
        "naive_samples": naive_pairs,
        "naive_median_ratio": naive["median"],
        "naive_spread": naive["spread"],
        "prune_stage_total_s": sum(p["prune"] for p in prune_pairs),
        "naive_grid_total_s": sum(p["naive"] for p in naive_pairs),
        "sweep_wall_s": sweep_wall,
        "goal": 0.2,
        "meets_goal": reuse["meets_goal"],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("median_ratio", "spread", "naive_median_ratio", "dense_trials",
                                             "prune_trials", "meets_goal")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
