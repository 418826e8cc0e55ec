"""`headroom bench`: run the scripts of benchmarks/ (each measures a ratio side by side in one run and writes
JSON) at their tiny CI sizes, full sizes or GPU sizes, and print their medians and spreads against their goals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from lightning_modules.declarations.config import HeadroomInputError

BENCHMARKS = {  # name -> extra arguments of its tiny size (what CI runs)
    "train_overhead": ["--steps", "6", "--warmup", "2", "--batch-size", "4", "--seq-len", "32", "--repeats", "2"],
    "ablation_batched": ["--scale", "xs", "--batches", "1", "--batch-size", "2", "--seq-len", "32",
                         "--max-rows", "16", "--repeats", "2"],
    "prune_speed": ["--scale", "xs", "--batch-size", "2", "--seq-len", "32", "--repeats", "2", "--passes", "1",
                    "--warmup", "1"],
    "sweep_reuse": ["--tiny"],
    "compute_share": ["--tiny"],
    "plan_memory": ["--tiny"],
    "faults": ["--tiny"],  # needs PostgreSQL 15's server binaries and kubectl (benchmarks/stack.py)
    "cpu_speed": ["--tiny"],  # each CPU scale's training step against the matmul peak, fp32 and bf16-mixed
    "ladder": ["--tiny"],  # dense runs at doubling budgets (full size: hours; docs/measured/ladder.json)
    "data_scale": ["--tiny"],  # the driver's preparation and a trial's data setup on two corpora 4× apart
    "onnx_latency": ["--tiny"],  # dense ÷ pruned in onnxruntime (needs `pip install -e ".[onnx]"`)
    "train_kernels": ["--steps", "6", "--warmup", "2", "--repeats", "1", "--batch-size", "4", "--seq-len", "32",
                "--compile-backend", "aot_eager"],
}
# `headroom bench --gpu`: the GPU questions, sized to fit a few minutes of one GPU, declared once in
# benchmarks/gpu_sizes.json (benchmarks/gpu_check.sh reads the same file): MFU at l and xl, batched ablation,
# pruned latency in bf16, kernel choices, and peak memory with every evaluation on cuda
GPU_SIZES = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_sizes.json"


def gpu_benchmarks() -> dict[str, list[str]]:
    """name -> arguments of each GPU benchmark (none where benchmarks/ is not beside the package)."""
    if not GPU_SIZES.is_file():
        return {}
    return {k: v["args"] for k, v in json.loads(GPU_SIZES.read_text()).items() if k != "_doc"}


def add_bench(sub) -> None:
    p = sub.add_parser("bench", help="run the scripts of benchmarks/ and print their ratios",
                       description="Run benchmarks/*.py (each measures a ratio side by side in one run and writes "
                                   "JSON) and print the ratios against their goals.")
    p.add_argument("names", nargs="*", help=f"which (default all): {', '.join(BENCHMARKS)}")
    p.add_argument("--tiny", action="store_true", help="the tiny sizes CI uses (checks that they run, not speed)")
    p.add_argument("--gpu", action="store_true",
                   help=f"the GPU measurements ({', '.join(gpu_benchmarks())} at GPU sizes: MFU at l and xl, batched "
                        "ablation, pruned latency in bf16); needs a CUDA GPU")
    p.add_argument("--out-dir", default="benchmarks/results", help="where the JSON goes")
    p.set_defaults(func=cmd_bench)


def _spread_text(v: float, sp: dict | None) -> str:
    if not sp:
        return f"{v:.3g}"
    iqr, iv = sp["iqr"], sp["interval"]
    return (f"{v:.3g} (IQR {iqr[0]:.3g}–{iqr[1]:.3g}; {sp['coverage']:.0%} interval {iv[0]:.3g}–{iv[1]:.3g}; "
            f"n={sp['n']})")


def _bench_lines(name: str, res: dict) -> list[str]:
    """A benchmark's median(s) with their spread, from its JSON: one line, or one per comparison (a ratio of
    prune_speed, a choice of train_kernels)."""
    key = next((k for k in ("median_ratio", "median_speedup", "median_recovery_s") if k in res), None)
    if key is None:
        pairs = [(k.removeprefix("median_"), k) for k in res if k.startswith("median_") and k.endswith("_ratio")]
        return [f"{name}: median {what} {_spread_text(res[k], res.get(what.removesuffix('_ratio') + '_spread'))}"
                for what, k in pairs] or [f"{name}: see JSON"]
    what = key.removeprefix("median_")
    value, spread = res[key], res.get("spread")
    if isinstance(value, dict):
        by = res.get("meets_goal_by", {})
        return [f"{name} {k}: median {what} {_spread_text(v, (spread or {}).get(k))}"
                + (f"; meets goal: {by[k]}" if k in by else "") for k, v in value.items()]
    return [f"{name}: median {what} {_spread_text(value, spread)}"]


def cmd_bench(args) -> int:
    root = Path(__file__).resolve().parents[2] / "benchmarks"
    gpu = gpu_benchmarks()
    table = gpu if args.gpu else BENCHMARKS
    if args.gpu and args.tiny:
        raise HeadroomInputError("bench: --gpu and --tiny exclude each other")
    names = args.names or list(table)
    for n in names:
        if n not in table:
            raise HeadroomInputError(f"bench: unknown benchmark {n!r}; choose from {', '.join(table)}")
    if "onnx_latency" in names:
        from lightning_modules.models.export import missing_onnx_packages

        if missing_onnx_packages():
            raise HeadroomInputError(f"bench onnx_latency: needs {', '.join(missing_onnx_packages())}: pip install "
                                     "-e \".[onnx]\" (or name the other benchmarks)")
    if args.gpu:
        import torch

        if not torch.cuda.is_available():
            raise HeadroomInputError("bench --gpu: no CUDA GPU is visible on this machine")
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    failed = 0
    for n in names:
        out = out_dir / f"{n}.json"
        sized = gpu[n] if args.gpu else BENCHMARKS[n] if args.tiny else []
        cmd = [sys.executable, str(root / f"{n}.py"), *sized, "--out", str(out)]
        print(f"== {n}: {' '.join(cmd[1:])}", flush=True)
        r = subprocess.run(cmd, check=False)
        if r.returncode != 0 or not out.exists():
            print(f"{n}: failed (exit {r.returncode})")
            failed += 1
            continue
        res = json.loads(out.read_text())
        for line in _bench_lines(n, res):
            print(line)
        print(f"{n}: meets goal: {res.get('meets_goal')} (goal {res.get('goal')}; {out})")
        if res.get("mfu"):
            m = res["mfu"]
            print(f"{n}: MFU " + ", ".join(f"{k} {v['mfu']:.1%}" for k, v in m.items() if isinstance(v, dict))
                  + f" of a measured peak of {m['peak_flops'] / 1e12:.0f} TFLOP/s; goal {res['goal_mfu']:.0%} "
                  f"at xl; meets goal: {res.get('meets_goal_mfu')}")
    return 1 if failed else 0
