"""Tokens/s of the Lightning module vs a plain PyTorch loop: same model, data, batch, optimizer, clipping and
schedule, measured side by side in one process, written to JSON. Goal: ratio (Lightning ÷ plain) ≥ 0.9.

On a GPU it also measures MFU at `--mfu-scales` (default l and xl): the model FLOP/s a sweep's training step
achieves (tokens/s × 3 × forward FLOPs per token, as lightning_modules/declarations/costs.py counts them) ÷ the device's
peak, measured on the spot with a large bf16 matmul (no table of device names). Training as a sweep trains there: Lightning,
bf16-mixed, SDPA attention, fused AdamW. Goal: MFU ≥ 0.4 at xl. Without a GPU the JSON says MFU was not measured.

    python benchmarks/train_overhead.py [--scale xs] [--steps 200] [--warmup 20] [--repeats 9] [--out FILE]

Both runs time the same steady-state window (steps warmup..steps), excluding start-up, validation and
checkpointing. They are measured interleaved (benchmarks/measure.py): an untimed warm-up round, then `--repeats`
rounds of one plain and one Lightning run, the order alternating; the answer is the median of the per-round
ratios with its spread, and every run's tokens/s is in the JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
import warnings
from pathlib import Path

from measure import at_least, interleave, ratio_result  # noqa: E402


def plain_loop(model_cfg, train_cfg, dm, warmup: int) -> tuple[float, float, int]:
    """(tokens/s in the timed window, the last step's training loss, tokens in the window)."""
    import torch

    from lightning_modules.models.build import build_model, mean_loss
    from lightning_modules.training.lm import make_optimizer

    # on the device the Lightning side trains on (Lightning's accelerator="auto": the GPU when there is one)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model(model_cfg, seed=train_cfg.seed).to(device)
    model.train()
    opt, sched = make_optimizer(model, train_cfg)
    t_start, tokens = None, 0
    for step, batch in enumerate(dm.train_dataloader()):
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        if step == warmup:
            t_start = time.perf_counter()
        # bf16-mixed as Lightning's precision plugin runs it: the forward under autocast, fp32 weights and optimizer
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=train_cfg.precision == "bf16-mixed"):
            loss = mean_loss(model, batch)
        loss.backward()
        if train_cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), train_cfg.grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if t_start is not None:
            tokens += batch["input_ids"].numel()
        if step + 1 >= train_cfg.steps:
            break
    if device.type == "cuda":
        torch.cuda.synchronize()
    return tokens / (time.perf_counter() - t_start), float(loss), tokens


def lightning_run(model_cfg, train_cfg, dm, warmup: int) -> tuple[float, float, int]:
    """As plain_loop, through the LightningModule and Trainer a sweep uses."""
    from pytorch_lightning.callbacks import Callback

    from lightning_modules.training.lm import HeadroomLM
    from lightning_modules.training.loop import build_trainer

    class Window(Callback):
        t_start, tokens, loss = None, 0, None

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step == warmup:
                self.t_start = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if self.t_start is not None:
                self.tokens += batch["input_ids"].numel()
                self.t_end = time.perf_counter()
            self.loss = float(outputs["loss"] if isinstance(outputs, dict) else outputs)

    w = Window()
    lm = HeadroomLM(model_cfg.model_dump(mode="json"), train_cfg.model_dump(mode="json"))
    trainer = build_trainer(train_cfg, None, callbacks=[w], progress=False)
    trainer.fit(lm, datamodule=dm)
    return w.tokens / (w.t_end - w.t_start), w.loss, w.tokens


def measure_peak_bf16(n: int = 8192, repeats: int = 20) -> float:
    """FLOP/s of an n×n×n bf16 matmul on the current GPU (the best of `repeats`, after a warm-up)."""
    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def mfu(scales: list[str], family: str, steps: int, warmup: int) -> dict:
    """{"peak_flops", scale: {"tokens_per_s", "model_flops_per_s", "mfu", ...}} on the GPU."""
    from lightning_modules.data.datamodule import HeadroomData
    from lightning_modules.declarations.config import DataConfig, model_config_for, train_config_for
    from lightning_modules.declarations.costs import flops_per_token

    peak = measure_peak_bf16()
    out: dict = {"peak_flops": peak, "peak_method": "best of 20 bf16 8192x8192x8192 matmuls"}
    for scale in scales:
        model_cfg = model_config_for(scale, family)
        train_cfg = train_config_for(scale, steps=steps, val_every=steps, precision="bf16-mixed")
        dm = HeadroomData(DataConfig(), train_cfg, family).prepare()
        model_cfg = model_cfg.model_copy(update={"vocab_size": dm.vocab_size})
        tps, loss, _ = lightning_run(model_cfg, train_cfg, dm, warmup)
        fwd = flops_per_token(model_cfg, train_cfg.seq_len).total
        achieved = tps * 3 * fwd
        out[scale] = {"tokens_per_s": tps, "train_flops_per_token": 3 * fwd, "model_flops_per_s": achieved,
                      "mfu": achieved / peak, "batch_size": train_cfg.batch_size, "seq_len": train_cfg.seq_len,
                      "final_train_loss": loss}
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", default="xs")
    ap.add_argument("--family", default="decoder")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20, help="untimed steps at the start of every run")
    ap.add_argument("--repeats", type=int, default=9,
                    help="interleaved rounds (one run of each side per round); 9 lets the median's interval drop the "
                         "extreme round at each end")
    ap.add_argument("--batch-size", type=int)
    ap.add_argument("--seq-len", type=int)
    ap.add_argument("--mfu-scales", default="l,xl", help="scales whose MFU is measured on a GPU")
    ap.add_argument("--mfu-steps", type=int, default=60)
    ap.add_argument("--out", default="benchmarks/results/train_overhead.json")
    args = ap.parse_args(argv)

    import torch

    from lightning_modules.data.datamodule import HeadroomData
    from lightning_modules.declarations.config import DataConfig, model_config_for, train_config_for

    warnings.filterwarnings("ignore")
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    model_cfg = model_config_for(args.scale, args.family)
    # validation after the last step only, so neither side pays for it inside the window
    train_cfg = train_config_for(args.scale, steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len,
                                 val_every=args.steps, precision="32-true")
    dm = HeadroomData(DataConfig(), train_cfg, model_cfg.family).prepare()
    last = {}  # the work of each side's last run: tokens timed and final loss

    def side(name, run):
        def measure_once() -> float:
            dm.samples_consumed = 0  # every run reads the same batches
            tps, loss, tokens = run(model_cfg, train_cfg, dm, args.warmup)
            last[name] = (loss, tokens)
            return tps
        return measure_once

    samples = interleave({"plain": side("plain", plain_loop), "lightning": side("lightning", lightning_run)},
                         args.repeats)
    result = {
        "benchmark": "train_overhead",
        "scale": args.scale,
        "family": args.family,
        "steps": args.steps,
        "warmup_steps": args.warmup,
        "repeats": args.repeats,
        "batch_size": train_cfg.batch_size,
        "seq_len": train_cfg.seq_len,
        "threads": torch.get_num_threads(),
        "goal": 0.9,
        **ratio_result(samples, "lightning", "plain", at_least(0.9)),
        "plain_tokens_per_s": statistics.median(s["plain"] for s in samples),
        "lightning_tokens_per_s": statistics.median(s["lightning"] for s in samples),
        # the same work on both sides: the same tokens timed, the same model reaching the same loss
        "window_tokens": {k: v[1] for k, v in last.items()},
        "final_train_loss": {k: v[0] for k, v in last.items()},
    }
    result["goal_mfu"] = 0.4  # at xl
    if torch.cuda.is_available():
        scales = [x for x in args.mfu_scales.split(",") if x]
        result["mfu"] = mfu(scales, args.family, args.mfu_steps, min(args.warmup, args.mfu_steps // 2))
        xl = result["mfu"].get("xl")
        result["meets_goal_mfu"] = None if xl is None else xl["mfu"] >= result["goal_mfu"]
    else:
        result["mfu"] = None
        result["meets_goal_mfu"] = None
        result["mfu_note"] = "no GPU here: MFU is measured on a GPU only (headroom bench --gpu)"
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("plain_tokens_per_s", "lightning_tokens_per_s", "median_ratio", "spread",
                                             "meets_goal")}))
    return result


if __name__ == "__main__":
    main()
