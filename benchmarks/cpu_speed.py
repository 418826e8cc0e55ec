"""How close each CPU scale's training step comes to this CPU's matmul peak, in fp32 and bf16-mixed, measured side by
side in one run and written to JSON. Goal: every scale at ≥ 50% of the peak of the precision it trains in.

    python benchmarks/cpu_speed.py [--scales xxxs,xxs,xs,s] [--steps 60] [--warmup 10] [--repeats 5] [--out FILE]

- The peak: the best of several large square matmuls (n = 1024 and 2048) per precision on the threads a trial gets
  (one, as a sweep's `cpu: 1` trial), measured before the first and after the last round; the higher reading is
  the peak.
- Per scale, four sides measured interleaved (benchmarks/measure.py): the sweep's Lightning training step and a
  plain PyTorch loop (same model, data, optimizer, clipping, schedule: benchmarks/train_overhead.py), each in fp32
  and bf16-mixed (autocast, fp32 weights). Achieved FLOP/s = tokens/s × training FLOPs per token
  (lightning_modules/declarations/costs.py: 3 × the forward matmuls, attention scores included); the fraction of the peak is
  per round (a round's tokens/s over the peak), so its interval is that of the median.
- `bf16_speedup`: bf16-mixed ÷ fp32 tokens/s of the Lightning step per round. `final_train_loss` of each side (the
  same data and initialisation) is there to see that each side trained, not to judge precision: that is the bf16
  smoke comparison's job (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import warnings
from pathlib import Path

from measure import at_least, interleave, summarize  # noqa: E402
from train_overhead import lightning_run, plain_loop  # noqa: E402

GOAL = 0.5
PRECISIONS = {"32-true": "fp32", "bf16-mixed": "bf16"}


def matmul_peak(threads: int, sizes=(1024, 2048), seconds: float = 1.0) -> dict:
    """{"fp32": FLOP/s, "bf16": FLOP/s}: the best timing of n×n×n matmuls at each size, over about `seconds` each."""
    import torch

    torch.set_num_threads(threads)
    out = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        best = 0.0
        for n in sizes:
            a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
            a @ b
            t_end = time.perf_counter() + seconds
            while time.perf_counter() < t_end:
                t = time.perf_counter()
                a @ b
                best = max(best, 2 * n**3 / (time.perf_counter() - t))
        out[name] = best
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scales", default="xxxs,xxs,xs,s")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps at the start of every run")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=None, help="default: each scale's preset")
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--tiny", action="store_true", help="CI size: xxxs, 6 steps of 4 × 32, 2 rounds")
    ap.add_argument("--out", default="benchmarks/results/cpu_speed.json")
    args = ap.parse_args(argv)
    if args.tiny:
        args.scales, args.steps, args.warmup, args.repeats, args.batch_size, args.seq_len = "xxxs", 6, 2, 2, 4, 32

    import torch

    from lightning_modules.data.datamodule import HeadroomData
    from lightning_modules.declarations.config import DataConfig, model_config_for, train_config_for
    from lightning_modules.declarations.costs import train_flops_per_token

    warnings.filterwarnings("ignore")
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    torch.set_num_threads(args.threads)
    t0 = time.time()
    peak_before = matmul_peak(args.threads, seconds=0.2 if args.tiny else 1.0)
    scales: dict = {}
    for scale in [s for s in args.scales.split(",") if s]:
        model_cfg = model_config_for(scale)
        base = train_config_for(scale, steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len,
                                val_every=args.steps)
        dm = HeadroomData(DataConfig(), base, model_cfg.family).prepare()
        model_cfg = model_cfg.model_copy(update={"vocab_size": dm.vocab_size})
        flops = train_flops_per_token(model_cfg, base.seq_len)
        last: dict = {}

        def side(name, run, precision):
            cfg = base.model_copy(update={"precision": precision})

            def once() -> float:
                dm.samples_consumed = 0  # every run reads the same batches
                dm.train_cfg = cfg
                tps, loss, _ = run(model_cfg, cfg, dm, args.warmup)
                last[name] = loss
                return tps
            return once

        sides = {f"{kind}_{short}": side(f"{kind}_{short}", run, prec)
                 for prec, short in PRECISIONS.items() for kind, run in (("lightning", lightning_run),
                                                                         ("plain", plain_loop))}
        samples = interleave(sides, args.repeats)
        scales[scale] = {"batch_size": base.batch_size, "seq_len": base.seq_len, "train_flops_per_token": flops,
                         "samples": samples, "final_train_loss": last}
    peak_after = matmul_peak(args.threads, seconds=0.2 if args.tiny else 1.0)
    peak = {k: max(peak_before[k], peak_after[k]) for k in peak_before}
    verdicts = []
    for scale, r in scales.items():
        for short in PRECISIONS.values():
            for kind in ("lightning", "plain"):
                tps = [s[f"{kind}_{short}"] for s in r["samples"]]
                r[f"{kind}_{short}_tokens_per_s"] = summarize(tps)["median"]
                frac = summarize([t * r["train_flops_per_token"] / peak[short] for t in tps],
                                 at_least(GOAL) if kind == "lightning" else None)
                r[f"{kind}_{short}_fraction_of_peak"] = frac
                if kind == "lightning":
                    r[f"{short}_flops_per_s"] = r[f"lightning_{short}_tokens_per_s"] * r["train_flops_per_token"]
        r["bf16_speedup"] = summarize([s["lightning_bf16"] / s["lightning_fp32"] for s in r["samples"]])
        r["lightning_over_plain_fp32"] = summarize([s["lightning_fp32"] / s["plain_fp32"] for s in r["samples"]])
        # a scale trains in fp32 unless bf16 is faster (the goal is judged in the precision it trains in)
        r["trains_in"] = "bf16" if r["bf16_speedup"]["median"] > 1 else "fp32"
        r["meets_goal"] = r[f"lightning_{r['trains_in']}_fraction_of_peak"]["meets_goal"]
        verdicts.append(r["meets_goal"])
    result = {"benchmark": "cpu_speed", "goal": GOAL, "threads": args.threads, "steps": args.steps,
              "warmup_steps": args.warmup, "repeats": args.repeats, "peak_flops": peak,
              "peak_readings": {"before": peak_before, "after": peak_after},
              "peak_method": "best single n×n×n matmul, n in (1024, 2048), about a second per size and precision",
              "scales": scales, "wall_s": time.time() - t0,
              "meets_goal": (False if False in verdicts else True if all(v is True for v in verdicts)
                             else "inconclusive")}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for scale, r in scales.items():
        print(f"{scale}: fp32 {r['lightning_fp32_tokens_per_s']:,.0f} tok/s "
              f"({r['lightning_fp32_fraction_of_peak']['median']:.0%} of {peak['fp32'] / 1e9:.0f} GFLOP/s), bf16 "
              f"{r['lightning_bf16_tokens_per_s']:,.0f} tok/s ({r['lightning_bf16_fraction_of_peak']['median']:.0%} "
              f"of {peak['bf16'] / 1e9:.0f}); bf16 ÷ fp32 {r['bf16_speedup']['median']:.2f}; meets goal: "
              f"{r['meets_goal']}")
    return result


if __name__ == "__main__":
    main()
