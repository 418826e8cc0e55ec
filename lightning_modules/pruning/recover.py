"""The recovery fine-tune of a pruned model: training continues the dense run's data order, and the rate is chosen
on validation from the plan's grid, extended past an edge while the best sits there."""

from __future__ import annotations

import copy

from lightning_modules.declarations.config import TrainConfig
from lightning_modules.declarations.prune_plan import PrunePlan
from lightning_modules.pruning.measure import WorkTimer, evaluate_loss
from lightning_modules.pruning.scoring import LossFn
from lightning_modules.training.lm import HeadroomLM
from lightning_modules.training.loop import TrainClock, build_trainer, fit


def finetune(model, data, steps: int, lr: float, base: TrainConfig, loss_fn: LossFn | None = None,
             progress: bool = False, clock=None, train_loss: LossFn | None = None, start: int | None = None):
    """Recovery fine-tune of a (physically pruned) model for `steps` steps with the LightningModule, minimising
    `train_loss` (default: `loss_fn`, the LM loss; distillation: lightning_modules/training/distill.py). Its data continues
    the dense run's seeded order where that run's training stopped (`base`: the dense run's training config, T
    steps of its batch size): the first fine-tune batch is the one the dense run would have taken at step T + 1,
    the samples Scratch-B's steps past T read. `start` overrides that position (`headroom prune` with another batch
    size than the run's: T × the run's own batch size). `clock` (a train.TrainClock) adds up the seconds inside
    training steps."""
    if steps <= 0:
        return model
    cfg = base.model_copy(update={"steps": steps, "lr": lr, "warmup_steps": min(base.warmup_steps, steps // 10),
                                  "val_every": steps})
    model.train()
    lm = HeadroomLM.from_model(model, cfg, loss_fn=loss_fn, train_loss_fn=train_loss)
    fit(build_trainer(cfg, None, progress=progress, callbacks=[clock] if clock is not None else ()), lm,
        datamodule=data.with_train(cfg, start=base.steps * base.batch_size if start is None else start))
    return lm.model.eval()


def recover(pruned, data, plan: PrunePlan, loaders: dict, loss_fn, timer: WorkTimer, progress: bool = False,
            train_loss: LossFn | None = None, start: int | None = None):
    """The recovery fine-tune of `plan` (none when finetune_steps is 0): each rate of the plan fine-tunes a copy,
    minimising `train_loss` (default: `loss_fn`), and the lowest validation loss — `loss_fn`, the LM loss, also
    after distillation — wins (chosen on val, never on an eval set). Returns (model, {split: evaluation after it,
    per window} or {} without a fine-tune, {"lr", "source", "grid"})."""
    if not plan.finetune_steps:
        return pruned, {}, {"lr": None, "source": "none", "grid": {}}
    clock = TrainClock()
    grid, val_of, finetuned = {}, {}, {}

    def tune(lr):
        candidate = finetune(copy.deepcopy(pruned), data, plan.finetune_steps, lr, data.train_cfg, loss_fn, progress,
                             clock, train_loss, start)
        timer.s["train_s"] += clock.seconds
        clock.seconds = 0.0
        with timer("eval_s"):
            val_of[lr] = evaluate_loss(candidate, loaders["val"], loss_fn, per_window=True)
        grid[lr] = val_of[lr]["loss"]
        finetuned[lr] = candidate

    for lr in plan.finetune_lrs:
        tune(lr)
    best = min(grid, key=lambda lr: (grid[lr], lr))
    rates = sorted(plan.finetune_lrs)
    step = (rates[-1] / rates[0]) ** (1 / (len(rates) - 1)) if len(rates) > 1 else 1.0
    for _ in range(plan.finetune_lr_extend if step > 1 else 0):  # bracket the chosen rate (one step past an edge)
        tried = sorted(grid)
        if tried[0] < best < tried[-1]:
            break
        tune(best * step if best == tried[-1] else best / step)
        best = min(grid, key=lambda lr: (grid[lr], lr))
        for lr in [lr for lr in finetuned if lr != best]:
            del finetuned[lr]  # only the best candidate model is kept
    best = min(grid, key=lambda lr: (grid[lr], lr))
    with timer("eval_s"):  # val: measured already, when the rate was chosen
        final = {s: val_of[best] if s == "val" else evaluate_loss(finetuned[best], l, loss_fn, per_window=True)
                 for s, l in loaders.items()}
    info = {"lr": best, "source": "fixed" if plan.finetune_lr is not None else "val-grid",
            "grid": {f"{lr:.6g}": v for lr, v in grid.items()}}
    return finetuned[best], final, info
