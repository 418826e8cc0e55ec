"""Inference latency of the dense, masked and physically pruned model at ratios 0.25/0.5/0.75, next to the
speedup predicted from forward FLOPs, written to JSON. Goal: |measured ÷ predicted − 1| ≤ 0.10 at batch ≥ 16.

    python benchmarks/prune_speed.py [--scale s] [--batch-size 16] [--seq-len 128] [--repeats 20]

Latency is the median of repeated forward passes (warm-up excluded). A masked model does all the dense work (the
gate only zeroes outputs), so its latency should stay at the dense one; only physical removal saves time.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", default="s")
    ap.add_argument("--family", default="decoder")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--ratios", default="0.25,0.5,0.75")
    ap.add_argument("--device", default="auto", help="cpu | cuda | auto (cuda when there is one)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="weights and activations")
    ap.add_argument("--out", default="benchmarks/results/prune_speed.json")
    args = ap.parse_args(argv)

    import torch

    from lightning_modules.config import model_config_for
    from lightning_modules.heads import head_gate, prune_heads
    from lightning_modules.models import build_model
    from lightning_modules.pruning import forward_flops, heads_to_keep, measure_latency
    from lightning_modules.scoring import score_random

    cfg = model_config_for(args.scale, args.family)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    dense = build_model(cfg, seed=0).eval().to(device=device, dtype=getattr(torch, args.dtype))
    batch = {"input_ids": torch.randint(0, 256, (args.batch_size, args.seq_len),
                                        generator=torch.Generator().manual_seed(0)).to(device)}
    f_dense = forward_flops(dense, args.seq_len)["total"]
    t_dense = measure_latency(dense, batch, args.repeats, args.warmup)
    rows = []
    for r in (float(x) for x in args.ratios.split(",")):
        keep = heads_to_keep(score_random(dense, seed=0), cfg.layer_heads, r, "per_layer")
        gate = head_gate(dense)
        gate.mask(keep, device=device)
        t_masked = measure_latency(dense, batch, args.repeats, args.warmup)
        gate.clear()
        pruned = prune_heads(copy.deepcopy(dense), keep)
        t_pruned = measure_latency(pruned, batch, args.repeats, args.warmup)
        t_dense_again = measure_latency(dense, batch, args.repeats, args.warmup)  # side by side, drift-free
        td = min(t_dense, t_dense_again)
        predicted = f_dense / forward_flops(pruned, args.seq_len)["total"]
        measured = td / t_pruned
        rows.append({"ratio": r, "heads_kept": [len(k) for k in keep], "latency_ms": {
            "dense": td, "masked": t_masked, "pruned": t_pruned},
            "speedup_measured": measured, "speedup_predicted_from_flops": predicted,
            "measured_over_predicted": measured / predicted})
    res = {"benchmark": "prune_speed", "scale": args.scale, "family": args.family, "batch_size": args.batch_size,
           "seq_len": args.seq_len, "repeats": args.repeats, "device": device, "dtype": args.dtype,
           "threads": torch.get_num_threads(), "rows": rows, "goal_abs_error": 0.10}
    res["meets_goal"] = args.batch_size >= 16 and all(abs(x["measured_over_predicted"] - 1) <= 0.10 for x in rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    for x in rows:
        print(f"ratio {x['ratio']}: dense {x['latency_ms']['dense']:.1f} ms, masked {x['latency_ms']['masked']:.1f}, "
              f"pruned {x['latency_ms']['pruned']:.1f}; speedup {x['speedup_measured']:.2f} vs FLOPs "
              f"{x['speedup_predicted_from_flops']:.2f}")
    return res


if __name__ == "__main__":
    main()
