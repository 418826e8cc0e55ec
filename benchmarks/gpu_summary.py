"""The GPU check's one JSON: what benchmarks/gpu_check.sh measured, gathered from its benchmarks' own JSON files
and the check sweep's MLflow runs into `DIR/gpu_check.json`.

    python benchmarks/gpu_summary.py DIR

Fields (null, with the reason under "missing", where a benchmark did not run or failed):
  - evaluation_on_cuda: every final evaluation and recovery fine-tune of gpu_memory ran on cuda, and every run of
    the check sweep recorded eval_device cuda (the sweep is left out where Ray or MLflow is not installed);
  - mfu / tokens_per_s: the training step's model-FLOPs utilisation and throughput per scale (train_overhead);
  - peak_memory: per configuration, torch's peak allocation while training and evaluating, the plan's estimate
    (lightning_modules.declarations.memory) and their ratio (gpu_memory);
  - ablation_speedup: batched ÷ one-mask-per-pass ablation (ablation_batched);
  - pruned_latency: dense, masked and pruned latency per ratio in the benchmark's dtype, and the speedups
    (prune_speed).
Exit 0 when every required benchmark's JSON was there (train_kernels is optional: its torch.compile has not
finished within its limit on a GPU yet) and evaluation ran on cuda, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# the GPU benchmarks, as gpu_check.sh and `headroom bench --gpu` run them
BENCHES = tuple(n for n in json.loads((Path(__file__).with_name("gpu_sizes.json")).read_text()) if n != "_doc")
OPTIONAL = ("train_kernels",)


def _load(d: Path, name: str) -> dict | None:
    f = d / f"{name}.json"
    try:
        return json.loads(f.read_text())
    except (OSError, ValueError):
        return None


def sweep_devices(d: Path) -> dict:
    """The check sweep's runs: how many recorded each eval_device. gpu_check.sh writes DIR/sweep.json: the sweep's
    exit status, its tracking URI and experiment."""
    try:
        ran = json.loads((d / "sweep.json").read_text())
    except (OSError, ValueError):
        return {"ran": False, "reason": "not run (Ray or MLflow not installed where the check ran)"}
    out: dict = {"ran": True, **ran}
    try:
        import mlflow
    except ImportError:
        return {**out, "reason": "mlflow not importable here to read its runs"}
    client = mlflow.MlflowClient(tracking_uri=ran["tracking_uri"])
    exp = client.get_experiment_by_name(ran["experiment"])
    runs = client.search_runs([exp.experiment_id], max_results=10000) if exp else []
    devices: dict[str, int] = {}
    for r in runs:
        dev = r.data.params.get("eval_device")
        if dev is not None:
            devices[dev] = devices.get(dev, 0) + 1
    return {**out, "runs": len(runs), "eval_devices": devices}


def summarize(d: Path) -> dict:
    res = {n: _load(d, n) for n in BENCHES}
    missing = {n: "no JSON (not run, failed or timed out)" for n, v in res.items() if v is None}
    mem = res["gpu_memory"]
    peak = None if mem is None else [
        {k: row.get(k) for k in ("config", "peak_bytes_train_and_eval", "plan_estimate_bytes", "measured_over_plan",
                                 "tokens_per_s")} for row in mem["rows"]]
    over = res["train_overhead"]
    mfu = None if not over or not over.get("mfu") else {
        k: {"mfu": v["mfu"], "tokens_per_s": v["tokens_per_s"], "batch_size": v["batch_size"], "seq_len": v["seq_len"]}
        for k, v in over["mfu"].items() if isinstance(v, dict)}
    ps = res["prune_speed"]
    latency = None if ps is None else {
        "dtype": ps["dtype"], "scale": ps["scale"], "batch_size": ps["batch_size"], "seq_len": ps["seq_len"],
        "by_ratio": {str(r["ratio"]): {**r["latency_ms"], "speedup": r["median_speedup"]} for r in ps["rows"]}}
    ab = res["ablation_batched"]
    sweep = sweep_devices(d)
    devices = set(sweep.get("eval_devices", {}))
    on_cuda = bool(mem and mem.get("device") != "cpu" and mem.get("evaluation_on_device")) and (
        not sweep["ran"] or (sweep.get("exit") == 0 and devices == {"cuda"}))
    return {
        "benchmark": "gpu_check", "device": None if mem is None else mem.get("device"),
        "torch": None if mem is None else mem.get("torch"), "evaluation_on_cuda": on_cuda,
        "mfu": mfu, "peak_flops": None if not mfu else over["mfu"].get("peak_flops"),
        "tokens_per_s": None if not over else {"lightning_step": over.get("lightning_tokens_per_s"),
                                               **{k: v["tokens_per_s"] for k, v in (mfu or {}).items()}},
        "peak_memory": peak,
        "ablation_speedup": None if ab is None else {"median": ab["median_speedup"], "spread": ab.get("spread"),
                                                     "goal": ab.get("goal")},
        "pruned_latency": latency, "sweep": sweep, "missing": missing,
        "meets_goal": on_cuda and not set(missing) - set(OPTIONAL),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    args = ap.parse_args(argv)
    d = Path(args.dir)
    if not d.is_dir():
        print(f"gpu_summary: {d}: not a directory", file=sys.stderr)
        return 2
    out = summarize(d)
    (d / "gpu_check.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"gpu_check: evaluation on cuda: {out['evaluation_on_cuda']}; missing: {', '.join(out['missing']) or 'none'}"
          f"; {d / 'gpu_check.json'}")
    return 0 if out["meets_goal"] else 1


if __name__ == "__main__":
    sys.exit(main())
