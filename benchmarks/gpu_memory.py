"""Peak accelerator memory of a sweep's training and evaluation, per configuration, and where evaluation ran.

For each `--configs` entry (scale:batch:seq_len:precision) it trains a decoder for `--steps` steps through
lightning_modules.training.loop.train_lm (what a trial does), on the embedded corpus, and records:
  - the peak memory allocated by torch during the fit (torch.cuda.max_memory_allocated, reset before it),
  - the peak during the final evaluation, and the device every final evaluation ran on,
  - the device the recovery fine-tune (lightning_modules.pruning.recover.finetune) hands its model back on,
  - tokens/s of the fit.
Written to JSON beside the plan's estimate for the same trial (lightning_modules.declarations.memory) and their ratio. On a
machine without CUDA it says so in one line and exits 2, unless `--device cpu` (then it records the devices only:
a CPU has no allocator peak; benchmarks/plan_memory.py checks the estimate on the CPU).

    python benchmarks/gpu_memory.py [--configs m:32:256:bf16-mixed,l:32:256:bf16-mixed] [--steps 30] [--out F]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import warnings
from pathlib import Path


def measure(spec: str, steps: int, device: str) -> dict:
    import torch

    import lightning_modules.training.loop as T
    from lightning_modules.declarations.config import DataConfig, model_config_for, train_config_for
    from lightning_modules.declarations.costs import param_counts
    from lightning_modules.declarations.memory import train_memory
    from lightning_modules.pruning.recover import finetune

    scale, batch, seq_len, precision = spec.split(":")
    cuda = device == "cuda"
    eval_devices: list[str] = []
    eval_peak: list[int] = []
    original = T.evaluate_all

    def spy(model, dm, n):  # where the final evaluation runs, and its own peak
        eval_devices.append(next(model.parameters()).device.type)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        out = original(model, dm, n)
        if cuda:
            eval_peak.append(torch.cuda.max_memory_allocated())
        return out

    T.evaluate_all = spy
    try:
        tc = train_config_for(scale, steps=steps, batch_size=int(batch), seq_len=int(seq_len), val_every=steps,
                              eval_batches=4, precision=precision, warmup_steps=min(10, steps // 3))
        mc = model_config_for(scale)
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        res = T.train_lm(mc, tc, DataConfig(), progress=False)
        wall = time.perf_counter() - t0
        fit_peak = max(int(torch.cuda.max_memory_allocated()), eval_peak[0] if eval_peak else 0) if cuda else None
        after_fit = next(res.lm.model.parameters()).device.type
        ft = finetune(res.lm.model, res.data, 5, tc.lr, tc)
        after_finetune = next(ft.parameters()).device.type
    finally:
        T.evaluate_all = original
    counts = param_counts(mc.model_copy(update={"vocab_size": res.data.vocab_size}))
    # the plan's estimate for this trial (what --plan packs GPUs by)
    plan = train_memory(mc.model_copy(update={"vocab_size": res.data.vocab_size}), int(batch), int(seq_len),
                        precision).peak
    return {
        "plan_estimate_bytes": plan, "measured_over_plan": fit_peak / plan if fit_peak else None,
        "config": spec, "scale": scale, "batch_size": int(batch), "seq_len": int(seq_len), "precision": precision,
        "params": counts.total, "vocab_size": res.data.vocab_size,
        "model": {k: getattr(mc, k) for k in ("d_model", "n_layers", "n_heads", "head_dim", "d_ff")},
        "peak_bytes_train_and_eval": fit_peak, "peak_bytes_eval": eval_peak[0] if eval_peak else None,
        "eval_devices": eval_devices, "model_device_after_train": after_fit,
        "model_device_after_finetune": after_finetune, "tokens_per_s": res.metrics["tokens_per_s"],
        "wall_s": wall, "val_loss": res.metrics["final"]["val"]["loss"],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="m:32:256:bf16-mixed,m:32:256:32-true,l:32:256:bf16-mixed,"
                                         "l:64:512:bf16-mixed,xl:16:1024:bf16-mixed")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--out", default="benchmarks/results/gpu_memory.json")
    args = ap.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_memory: no CUDA GPU is visible on this machine", file=sys.stderr)
        return 2
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    rows = []
    for spec in args.configs.split(","):
        row = measure(spec, args.steps, args.device)
        print(json.dumps(row), flush=True)
        rows.append(row)
    want = args.device
    ok = all(r["eval_devices"] and set(r["eval_devices"]) == {want} and r["model_device_after_train"] == want
             and r["model_device_after_finetune"] == want for r in rows)
    out = {"benchmark": "gpu_memory", "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
           "torch": torch.__version__, "steps": args.steps, "rows": rows, "evaluation_on_device": ok,
           "goal": f"every final evaluation and recovery fine-tune on {want}", "meets_goal": ok}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"gpu_memory: evaluation on {want}: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
