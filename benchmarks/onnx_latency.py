"""Is Michel's speedup still there once the model leaves PyTorch? Dense ÷ pruned latency of the ONNX graphs
`headroom export --onnx` writes, run in onnxruntime on this CPU, next to the same ratio in PyTorch and the speedup
predicted from forward FLOPs, written to JSON. Goal: |onnxruntime's measured ÷ predicted − 1| ≤ 0.10 at batch ≥ 16.

    python benchmarks/onnx_latency.py [--scale s] [--batch-size 16] [--seq-len 128] [--repeats 9] [--passes 5]

The dense model and, per ratio, the model with that fraction of each layer's heads removed (random scores: which
heads go does not change the cost) are exported once through lightning_modules/models/export.py (transformers' ONNX
exporter; each graph checked against PyTorch on export). Per ratio four sides are timed interleaved on the same
batch (benchmarks/measure.py): onnxruntime dense and pruned, PyTorch dense and pruned, an untimed warm-up round,
then `--repeats` rounds of one measurement each (the mean of `--passes` forward passes), the order rotating. Both
runtimes use the same number of threads (PyTorch's). The speedup is the median of the per-round dense ÷ pruned
ratios, with its spread; the goal is decided on that median's interval.
"""

from __future__ import annotations

import argparse
import copy
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from measure import interleave, summarize, timed, write_speedups

GOAL = (0.9, 1.1)  # measured ÷ predicted speedup


def measure(args, dense, cfg, session, ms, torch_side, feed, f_dense) -> tuple[list, list]:
    """Per ratio: the pruned graph exported and checked, the four sides timed interleaved."""
    from lightning_modules.models.heads import prune_heads
    from lightning_modules.pruning.choose import heads_to_keep
    from lightning_modules.pruning.measure import forward_flops
    from lightning_modules.pruning.scoring import score_random

    dense_ort, dense_check = session(dense, "dense")
    rows, samples = [], []
    for r in (float(x) for x in args.ratios.split(",")):
        keep = heads_to_keep(score_random(dense, seed=0), cfg.layer_heads, r, "per_layer")
        pruned = prune_heads(copy.deepcopy(dense), keep)  # the same weights, heads removed
        pruned_ort, check = session(pruned, f"r{r:g}")
        got = interleave({"ort_dense": ms(lambda: dense_ort.run(["logits"], feed)),
                          "ort_pruned": ms(lambda s=pruned_ort: s.run(["logits"], feed)),
                          "torch_dense": torch_side(dense), "torch_pruned": torch_side(pruned)},
                         args.repeats, warmup_rounds=args.warmup)
        predicted = f_dense / forward_flops(pruned, args.seq_len)["total"]
        for g in got:
            g.update(ratio=r, speedup_ort=g["ort_dense"] / g["ort_pruned"],
                     speedup_torch=g["torch_dense"] / g["torch_pruned"],
                     torch_over_ort_dense=g["torch_dense"] / g["ort_dense"])
        ort_speed = summarize([g["speedup_ort"] for g in got])
        vs_flops = summarize([g["speedup_ort"] / predicted for g in got], GOAL)
        rows.append({"ratio": r, "heads_kept": [len(k) for k in keep],
                     "latency_ms": {k: statistics.median(g[k] for g in got)
                                    for k in ("ort_dense", "ort_pruned", "torch_dense", "torch_pruned")},
                     "median_speedup": ort_speed["median"], "spread": ort_speed["spread"],
                     "median_speedup_torch": statistics.median(g["speedup_torch"] for g in got),
                     "torch_over_ort_dense": statistics.median(g["torch_over_ort_dense"] for g in got),
                     "speedup_predicted_from_flops": predicted,
                     "measured_over_predicted": vs_flops["median"],
                     "measured_over_predicted_interval": vs_flops["spread"]["interval"],
                     "onnx_check": {"dense": dense_check, "pruned": check},
                     "meets_goal": vs_flops["meets_goal"]})
        samples += got
    return rows, samples


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
    ap.add_argument("--tiny", action="store_true", help="CI's size: xs, batch 2 x 32, ratio 0.5, 2 rounds of 1 pass")
    ap.add_argument("--out", default="benchmarks/results/onnx_latency.json")
    args = ap.parse_args(argv)
    from lightning_modules.models.export import missing_onnx_packages

    if missing_onnx_packages():
        print(f"onnx_latency: needs {', '.join(missing_onnx_packages())}: pip install -e \".[onnx]\"", file=sys.stderr)
        raise SystemExit(2)
    if args.tiny:
        args.scale, args.batch_size, args.seq_len, args.repeats, args.passes = "xs", 2, 32, 2, 1
        args.ratios = "0.5"

    import onnxruntime as ort
    import torch

    from lightning_modules.declarations.config import model_config_for
    from lightning_modules.models.build import build_model
    from lightning_modules.models.export import write_onnx
    from lightning_modules.pruning.measure import forward_flops

    cfg = model_config_for(args.scale, args.family)
    dense = build_model(cfg, seed=0).eval()
    ids = torch.randint(0, 256, (args.batch_size, args.seq_len), generator=torch.Generator().manual_seed(0))
    feed = {"input_ids": ids.numpy()}
    f_dense = forward_flops(dense, args.seq_len)["total"]
    tmp = Path(tempfile.mkdtemp(prefix="onnx-latency-"))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = torch.get_num_threads()
    # onnxruntime's threads spin after a run by default, taking the CPU from whichever side runs next
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")

    def session(model, name: str):
        check = write_onnx(model, tmp / name / "model.onnx")
        return ort.InferenceSession(str(tmp / name / "model.onnx"), opts, providers=["CPUExecutionProvider"]), check

    def ms(run):
        def passes():
            for _ in range(args.passes):
                run()
        side = timed(passes)
        return lambda: side() * 1000 / args.passes

    def torch_side(model):
        def run():
            with torch.inference_mode():
                model(input_ids=ids, use_cache=False)  # as the graph: logits only, no key/value cache
        return ms(run)

    try:
        rows, samples = measure(args, dense, cfg, session, ms, torch_side, feed, f_dense)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    res = {"benchmark": "onnx_latency", "scale": args.scale, "family": args.family, "batch_size": args.batch_size,
           "seq_len": args.seq_len, "repeats": args.repeats, "passes": args.passes, "device": "cpu",
           "threads": torch.get_num_threads(), "onnxruntime": ort.__version__, "goal_abs_error": 0.10,
           "goal": "|onnxruntime's measured ÷ predicted speedup − 1| ≤ 0.10 at batch ≥ 16, at every ratio",
           # per ratio (write_speedups): the median speedup (dense ÷ pruned), its spread; samples: every round
           }
    write_speedups(res, rows, samples, args.batch_size, args.out)
    for x in rows:
        lat, iqr = x["latency_ms"], x["spread"]["iqr"]
        print(f"ratio {x['ratio']}: onnxruntime dense {lat['ort_dense']:.2f} ms, pruned {lat['ort_pruned']:.2f} "
              f"(medians); speedup {x['median_speedup']:.2f} (IQR {iqr[0]:.2f}–{iqr[1]:.2f}) vs FLOPs "
              f"{x['speedup_predicted_from_flops']:.2f}, PyTorch {x['median_speedup_torch']:.2f}; "
              f"meets goal: {x['meets_goal']}")
    return res


if __name__ == "__main__":
    main()
