"""Inference latency of the dense, masked and physically pruned model at ratios 0.25/0.5/0.75, next to the
speedup predicted from forward FLOPs, written to JSON. Goal: |measured ÷ predicted − 1| ≤ 0.10 at batch ≥ 16.

    python benchmarks/prune_speed.py [--scale s] [--batch-size 16] [--seq-len 128] [--repeats 9] [--passes 5]

Per ratio the three models are timed interleaved on the same batch (benchmarks/measure.py): an untimed warm-up
round, then `--repeats` rounds of one measurement each (the mean of `--passes` forward passes), the order rotating,
so the three latencies of a round come from the same moments. The speedup is the median of the per-round
dense ÷ pruned ratios, with its spread; the goal is decided on that median's interval. A masked model does all the
dense work (the gate only zeroes outputs), so its latency should stay at the dense one; only physical removal
saves time.
"""

from __future__ import annotations

import argparse
import copy
import statistics

from measure import interleave, summarize, timed, write_speedups  # noqa: E402

GOAL = (0.9, 1.1)  # measured ÷ predicted speedup


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", default="s")
    ap.add_argument("--family", default="decoder")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=9, help="interleaved rounds per ratio")
    ap.add_argument("--passes", type=int, default=5, help="forward passes per measurement (their mean)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed warm-up rounds")
    ap.add_argument("--ratios", default="0.25,0.5,0.75")
    ap.add_argument("--device", default="auto", help="cpu | cuda | auto (cuda when there is one)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="weights and activations")
    ap.add_argument("--out", default="benchmarks/results/prune_speed.json")
    args = ap.parse_args(argv)

    import torch

    from lightning_modules.declarations.config import model_config_for
    from lightning_modules.models.build import build_model
    from lightning_modules.models.heads import head_gate, prune_heads
    from lightning_modules.pruning.choose import heads_to_keep
    from lightning_modules.pruning.measure import forward_flops
    from lightning_modules.pruning.scoring import score_random

    cfg = model_config_for(args.scale, args.family)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    dense = build_model(cfg, seed=0).eval().to(device=device, dtype=getattr(torch, args.dtype))
    ids = torch.randint(0, 256, (args.batch_size, args.seq_len), generator=torch.Generator().manual_seed(0)).to(device)
    sync = torch.cuda.synchronize if device == "cuda" else None
    f_dense = forward_flops(dense, args.seq_len)["total"]

    def latency_ms(model):
        def passes():
            with torch.inference_mode():
                for _ in range(args.passes):
                    model(input_ids=ids)
        side = timed(passes, sync=sync)
        return lambda: side() * 1000 / args.passes

    rows, samples = [], []
    for r in (float(x) for x in args.ratios.split(",")):
        keep = heads_to_keep(score_random(dense, seed=0), cfg.layer_heads, r, "per_layer")
        masked = copy.deepcopy(dense)  # the same weights, gated: the dense model itself carries no gate
        head_gate(masked).mask(keep, device=device)
        pruned = prune_heads(copy.deepcopy(dense), keep)
        got = interleave({"dense": latency_ms(dense), "masked": latency_ms(masked), "pruned": latency_ms(pruned)},
                         args.repeats, warmup_rounds=args.warmup)
        predicted = f_dense / forward_flops(pruned, args.seq_len)["total"]
        for g in got:
            g.update(ratio=r, speedup=g["dense"] / g["pruned"])
        speed = summarize([g["speedup"] for g in got])
        vs_flops = summarize([g["speedup"] / predicted for g in got], GOAL)
        rows.append({"ratio": r, "heads_kept": [len(k) for k in keep],
                     "latency_ms": {k: statistics.median(g[k] for g in got) for k in ("dense", "masked", "pruned")},
                     "median_speedup": speed["median"], "spread": speed["spread"],
                     "speedup_predicted_from_flops": predicted,
                     "measured_over_predicted": vs_flops["median"],
                     "measured_over_predicted_interval": vs_flops["spread"]["interval"],
                     "masked_over_dense": statistics.median(g["masked"] / g["dense"] for g in got),
                     "meets_goal": vs_flops["meets_goal"]})
        samples += got
        del masked, pruned
    res = {"benchmark": "prune_speed", "scale": args.scale, "family": args.family, "batch_size": args.batch_size,
           "seq_len": args.seq_len, "repeats": args.repeats, "passes": args.passes, "device": device,
           "dtype": args.dtype, "threads": torch.get_num_threads(), "goal_abs_error": 0.10,
           "goal": "|measured ÷ predicted speedup − 1| ≤ 0.10 at batch ≥ 16, at every ratio",
           # per ratio (write_speedups): the median speedup (dense ÷ pruned), its spread; samples: every round
           }
    write_speedups(res, rows, samples, args.batch_size, args.out)
    for x in rows:
        iqr = x["spread"]["iqr"]
        print(f"ratio {x['ratio']}: dense {x['latency_ms']['dense']:.1f} ms, masked {x['latency_ms']['masked']:.1f}, "
              f"pruned {x['latency_ms']['pruned']:.1f} (medians); speedup {x['median_speedup']:.2f} (IQR "
              f"{iqr[0]:.2f}–{iqr[1]:.2f}) vs FLOPs {x['speedup_predicted_from_flops']:.2f}; meets goal: {x['meets_goal']}")
    return res


if __name__ == "__main__":
    main()
