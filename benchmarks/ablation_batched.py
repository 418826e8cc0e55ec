"""Batched ablation (many single-head masks stacked along the batch in one forward pass) vs the same function
with one mask per forward pass, on the same batches: identical scores, and the speedup, written to JSON.
Goal: speedup ≥ 3×. On a CPU a bigger batch buys no throughput, so expect about 1× there (or less, from cache
pressure); the stacking pays on a GPU, where one single-head mask per pass leaves the device idle.

    python benchmarks/ablation_batched.py [--scale s] [--batches 2] [--batch-size 8] [--seq-len 128] [--repeats 9]

Both are timed interleaved (benchmarks/measure.py): an untimed warm-up round, then `--repeats` rounds of one
batched and one sequential scoring of all batches, the order alternating; the answer is the median of the
per-round speedups with its spread.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from measure import at_least, interleave, ratio_result, timed  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", default="s")
    ap.add_argument("--family", default="decoder")
    ap.add_argument("--batches", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--max-rows", type=int, default=256, help="rows of one batched forward pass")
    ap.add_argument("--repeats", type=int, default=9, help="interleaved rounds (one scoring of each side per round)")
    ap.add_argument("--device", default="auto", help="cpu | cuda | auto (cuda when there is one)")
    ap.add_argument("--out", default="benchmarks/results/ablation_batched.json")
    args = ap.parse_args(argv)

    import torch

    from lightning_modules.data.datamodule import HeadroomData
    from lightning_modules.declarations.config import DataConfig, model_config_for, train_config_for
    from lightning_modules.models.build import build_model, token_losses
    from lightning_modules.pruning.scoring import score_ablation

    mcfg = model_config_for(args.scale, args.family)
    tcfg = train_config_for(args.scale, batch_size=args.batch_size, seq_len=args.seq_len)
    data = HeadroomData(DataConfig(), tcfg, args.family).prepare()
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    model = build_model(mcfg, seed=0).eval().to(device)
    batches = list(data.loader("calibration", args.batches))

    sync = torch.cuda.synchronize if device == "cuda" else None
    scores = {}

    def scoring(name, **kw):
        def run():
            scores[name] = score_ablation(model, batches, token_losses, **kw)
        return timed(run, sync=sync)

    samples = interleave({"batched": scoring("batched", max_rows=args.max_rows),
                          "sequential": scoring("sequential", masks_per_pass=1)}, args.repeats)
    batched, sequential = scores["batched"], scores["sequential"]
    diff = float((batched - sequential).abs().max())
    res = {
        "benchmark": "ablation_batched",
        "scale": args.scale, "family": args.family, "batches": len(batches), "batch_size": args.batch_size,
        "seq_len": args.seq_len, "max_rows": args.max_rows, "device": str(next(model.parameters()).device),
        "heads": int(torch.isfinite(batched).sum()),
        "threads": torch.get_num_threads(), "repeats": args.repeats, "goal": 3.0,
        # seconds of one scoring of all batches, per side; speedup = sequential ÷ batched
        **ratio_result(samples, "sequential", "batched", at_least(3.0), key="median_speedup"),
        "max_abs_diff": diff, "identical_to_1e-5": diff <= 1e-5,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps({k: res[k] for k in ("median_speedup", "spread", "max_abs_diff", "meets_goal")}))
    return res


if __name__ == "__main__":
    main()
