"""What each training kernel choice buys, measured side by side: training tokens/s of one choice ÷ its
alternative, the two measured interleaved (benchmarks/measure.py: an untimed warm-up round, then A B, B A, ...)
on the same model, data and batch; the median of the per-round ratios, with its spread and all samples, written
to JSON. Goal: every choice headroom makes by default (SDPA; on a GPU bf16-mixed and fused AdamW) is at least as
fast as its alternative (ratio ≥ 1); torch.compile, off by default, is measured without a goal.

    python benchmarks/train_kernels.py [--scale xs] [--steps 30] [--warmup 5] [--repeats 5] [--out FILE]

Choices (each where it means something on this device):
  sdpa      transformers' SDPA attention ÷ eager attention (both families' default is SDPA; scoring switches to
            eager where it needs attention weights)
  compile   torch.compile (nn.Module.compile, what HEADROOM_COMPILE=1 / `headroom train --compile` turn on)
            ÷ not compiled; warm-up steps (the compilation) are not timed
  bf16      bf16-mixed autocast ÷ fp32 (GPU only: a CPU has no fast bf16 path worth timing)
  fused     fused AdamW ÷ the default (foreach) AdamW (GPU only: the fused kernel is CUDA's)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from measure import at_least, combine, interleave, ratio_result  # noqa: E402


def steps_per_s(model_cfg, train_cfg, batches, *, attention="sdpa", compile_backend=None, bf16=False,
                fused=None, warmup=5) -> float:
    """Training tokens/s of `len(batches) - warmup` timed steps (forward, backward, AdamW) of a fresh model."""
    import torch

    from lightning_modules.models.build import build_model, mean_loss, set_attention
    from lightning_modules.training.lm import make_optimizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = build_model(model_cfg, seed=0).to(device).train()
    set_attention(model, attention)
    if compile_backend:
        model.compile(backend=compile_backend)
    opt, _ = make_optimizer(model, train_cfg)
    if fused is not None:  # the same groups and settings, only the kernel differs
        groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in opt.param_groups]
        opt = torch.optim.AdamW(groups, lr=train_cfg.lr, betas=train_cfg.betas, fused=fused)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=bf16)
    tokens, t0 = 0, None
    for i, batch in enumerate(batches):
        if i == warmup:
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        batch = {k: v.to(device) for k, v in batch.items()}
        with autocast:
            loss = mean_loss(model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if t0 is not None:
            tokens += batch["input_ids"].numel()
    if device == "cuda":
        torch.cuda.synchronize()
    return tokens / (time.perf_counter() - t0)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", default="xs")
    ap.add_argument("--family", default="decoder")
    ap.add_argument("--steps", type=int, default=30, help="steps per measurement, warm-up included")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=5, help="interleaved rounds per choice")
    ap.add_argument("--batch-size", type=int)
    ap.add_argument("--seq-len", type=int)
    ap.add_argument("--compile-backend", default="inductor",
                    help="torch.compile backend (CI's tiny run uses aot_eager: tracing without code generation)")
    ap.add_argument("--out", default="benchmarks/results/train_kernels.json")
    args = ap.parse_args(argv)

    import logging
    import warnings

    import torch

    from lightning_modules.data.datamodule import HeadroomData
    from lightning_modules.declarations.config import DataConfig, model_config_for, train_config_for

    warnings.filterwarnings("ignore")
    logging.getLogger("torch").setLevel(logging.ERROR)
    gpu = torch.cuda.is_available()
    model_cfg = model_config_for(args.scale, args.family)
    train_cfg = train_config_for(args.scale, steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len)
    dm = HeadroomData(DataConfig(), train_cfg, args.family).prepare()
    model_cfg = model_cfg.model_copy(update={"vocab_size": dm.vocab_size})
    batches = [b for _, b in zip(range(args.steps), dm.train_dataloader())]
    warmup = min(args.warmup, args.steps - 1)
    choices = {  # name -> (the choice's settings, its alternative's, the goal: defaults at least as fast)
        "sdpa": ({"attention": "sdpa"}, {"attention": "eager"}, at_least(1.0)),
        "compile": ({"compile_backend": args.compile_backend}, {}, None),
    }
    if gpu:
        choices["bf16"] = ({"bf16": True}, {}, at_least(1.0))
        choices["fused"] = ({"fused": True}, {"fused": False}, at_least(1.0))
    result = {"benchmark": "train_kernels", "scale": args.scale, "family": args.family, "device": "cuda" if gpu else "cpu",
              "threads": torch.get_num_threads(), "batch_size": train_cfg.batch_size, "seq_len": train_cfg.seq_len,
              "steps": args.steps, "warmup_steps": warmup, "repeats": args.repeats,
              "compile_backend": args.compile_backend, "choices": {}}
    if not gpu:
        result["not_measured"] = {"bf16": "no GPU: CPU bf16 is not a training path here",
                                  "fused": "no GPU: fused AdamW is a CUDA kernel"}
    for name, (with_it, without, goal) in choices.items():
        def side(kw):
            return lambda: steps_per_s(model_cfg, train_cfg, batches, warmup=warmup, **kw)
        samples = interleave({"with": side(with_it), "without": side(without)}, args.repeats)
        result["choices"][name] = {"default": goal is not None, "goal": None if goal is None else goal[0],
                                   **ratio_result(samples, "with", "without", goal)}
    # per choice: the median ratio (with ÷ without), its spread and every round
    for key in ("median_ratio", "spread", "samples"):
        result[key] = {k: v.pop(key) for k, v in result["choices"].items()}
    result["goal"] = "every default choice (SDPA; bf16-mixed and fused AdamW on a GPU) at least as fast as its alternative"
    result["meets_goal_by"] = {k: v["meets_goal"] for k, v in result["choices"].items()}
    result["meets_goal"] = combine(list(result["meets_goal_by"].values()))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: round(v, 3) for k, v in result["median_ratio"].items()} | {"meets_goal": result["meets_goal"]}))
    return result


if __name__ == "__main__":
    main()
