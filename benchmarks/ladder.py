"""Where each scale stops gaining: dense runs of one seed at doubling budgets, each on its own schedule, until the
id loss gained per doubling is under `--target` (or `--max-steps` is reached). Writes one JSON (every run's losses,
tokens per non-embedding parameter, seconds, and the gain of each doubling) and a plot of loss against tokens per
parameter, one line per scale. What `sweeps/converged.yaml`'s budgets are chosen from, before any pruned or
control result exists.

    python benchmarks/ladder.py --scales xxxs xxs xs --start 600 --max-steps 19200 --target 0.025 \
        --work ladder_runs --out docs/measured/ladder.json --plot docs/img/ladder.png

Each run is `headroom train` in its own process on one thread (`--jobs` of them at once, scales spread over them),
so the ladder trains exactly as a sweep's dense trial does (Lightning, the preset's rate, fp32 on a CPU). A run
whose directory already holds metrics.json is read, not trained again: an interrupted ladder continues.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def gain(prev: float, cur: float) -> float:
    """The fraction of the loss one doubling buys: (L(T/2) - L(T)) / L(T/2), as the report's `converged` check."""
    return (prev - cur) / prev


def run_one(scale: str, steps: int, args, work: Path) -> dict:
    out = work / f"{scale}-T{steps}"
    if not (out / "metrics.json").exists():
        cmd = [sys.executable, "-m", "orchestration.cli", "train", "--scale", scale, "--steps", str(steps),
               "--seed", str(args.seed), "--warmup-steps", str(args.warmup), "--val-every", str(args.val_every),
               "--eval-batches", str(args.eval_batches), "--batch-size", str(args.batch_size),
               "--seq-len", str(args.seq_len), "--precision", args.precision, "--out", str(out), "--quiet"]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    m = json.loads((out / "metrics.json").read_text())
    tokens = m["steps"] * args.batch_size * args.seq_len
    return {"scale": scale, "steps": m["steps"], "tokens": tokens,
            "tokens_per_param": tokens / m["params_nonembedding"], "params_nonembedding": m["params_nonembedding"],
            "loss": {k: v["loss"] for k, v in m["final"].items()}, "tokens_per_s": m["tokens_per_s"],
            "train_seconds": m["train_seconds"], "lr": m["train_config"]["lr"]}


def ladder(scale: str, args, work: Path) -> list[dict]:
    rows, steps = [], args.start
    while steps <= args.max_steps:
        t = time.time()
        rows.append(run_one(scale, steps, args, work))
        if len(rows) > 1:
            rows[-1]["gain"] = gain(rows[-2]["loss"]["id"], rows[-1]["loss"]["id"])
        print(f"{scale} T={steps}: id {rows[-1]['loss']['id']:.4f} gain {rows[-1].get('gain', float('nan')):.3f} "
              f"({time.time() - t:.0f} s)", flush=True)
        if rows[-1].get("gain", 1.0) < args.target:
            break
        steps *= 2
    return rows


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for scale, rows in result["ladders"].items():
        ax.plot([r["tokens_per_param"] for r in rows], [r["loss"]["id"] for r in rows], "o-", label=scale)
    ax.set_xscale("log")
    ax.set_xlabel("training tokens per non-embedding parameter")
    ax.set_ylabel("id loss (nats/token), seed 0")
    ax.set_title("dense models at doubling budgets")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scales", nargs="+", default=["xxxs", "xxs", "xs"])
    p.add_argument("--start", type=int, default=600)
    p.add_argument("--max-steps", type=int, default=19200)
    p.add_argument("--target", type=float, default=0.025, help="stop once a doubling gains less than this")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--val-every", type=int, default=500)
    p.add_argument("--eval-batches", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--precision", default="32-true")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--work", default=None, help="where the runs go (default ./ladder_runs; --tiny: a temporary one)")
    p.add_argument("--tiny", action="store_true", help="CI size: two budgets of 8 and 16 steps at xxxs")
    p.add_argument("--out", default="benchmarks/results/ladder.json")
    p.add_argument("--plot", default=None)
    args = p.parse_args(argv)
    if args.tiny:
        args.scales, args.start, args.max_steps, args.warmup, args.val_every = ["xxxs"], 8, 16, 2, 8
        args.eval_batches, args.batch_size, args.seq_len, args.target = 2, 4, 32, -1.0
    if args.work is None:
        args.work = tempfile.mkdtemp(prefix="ladder-") if args.tiny else "ladder_runs"
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with ThreadPoolExecutor(args.jobs) as pool:  # each scale's ladder is sequential; scales run side by side
        ladders = dict(zip(args.scales, pool.map(lambda s: ladder(s, args, work), args.scales)))
    result = {"benchmark": "ladder", "command": " ".join(["python benchmarks/ladder.py", *(argv or sys.argv[1:])]),
              "settings": {k: getattr(args, k) for k in ("seed", "warmup", "val_every", "eval_batches",
                                                          "batch_size", "seq_len", "precision", "target")},
              "gain": "(L(T/2) - L(T)) / L(T/2) of the id loss, each budget on its own schedule",
              "wall_s": time.time() - t0, "ladders": ladders}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    if args.plot:
        plot(result, Path(args.plot))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
