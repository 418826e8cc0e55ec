"""The LightningModule: causal-LM or masked-LM loss, AdamW with warmup + cosine decay, the metrics of docs/design.md.

A Lightning checkpoint of `HeadroomLM` carries the ModelConfig and TrainConfig as hyper-parameters, so
`load_lm(path)` rebuilds the model from the checkpoint alone.
"""

from __future__ import annotations

import math
import time

import pytorch_lightning as pl
import torch

from lightning_modules.declarations.config import EOS_ID, PAD_ID, ModelConfig, TrainConfig, cooldown_start
from lightning_modules.declarations.names import (
    TRAIN_GRAD_NORM,
    TRAIN_LOSS,
    TRAIN_LR,
    TRAIN_PPL,
    TRAIN_TOKENS_PER_S,
    VAL_LOSS,
    VAL_PPL,
)
from lightning_modules.models.build import build_model, count_parameters, model_config_of, token_losses


def lr_lambda(cfg: TrainConfig, total_steps: int | None = None):
    """Multiplier of the peak lr at a step: linear warmup, then cosine (or linear) decay to min_lr_ratio; or (wsd)
    the peak until `cooldown_start`, then a (1 - sqrt) decay to min_lr_ratio (Hägele et al. 2024)."""
    total = total_steps or cfg.steps
    warm = min(cfg.warmup_steps, max(total - 1, 0))
    decay_from = cooldown_start(cfg, total) if cfg.schedule == "wsd" else warm

    def f(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        if cfg.schedule == "constant" or step < decay_from:
            return 1.0
        progress = min(1.0, (step - decay_from) / max(1, total - decay_from))
        if cfg.schedule == "wsd":
            decay = 1 - math.sqrt(progress)
        else:
            decay = 0.5 * (1 + math.cos(math.pi * progress)) if cfg.schedule == "cosine" else 1 - progress
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * decay

    return f


def optimizer_params(model: torch.nn.Module) -> tuple[list[tuple[str, torch.nn.Parameter]], list]:
    """(matrices, the rest) as (name, parameter), each trainable parameter once (tied ones under their first
    name): AdamW's two groups, in the order its state is indexed (the first group's, then the second's)."""
    seen, decay, no_decay = set(), [], []
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 else no_decay).append((name, p))
    return decay, no_decay


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, fused: bool | None = None):
    """AdamW; weight decay on matrices only (not on biases and norm gains). The same for the Lightning module and
    for the plain loop of benchmarks/train_overhead.py. `fused` (default: on a GPU, unless the precision is
    fp16-mixed, whose loss scaler a fused step would unscale itself, after clipping saw scaled gradients) picks
    the fused kernel; clipping then happens in HeadroomLM.configure_gradient_clipping."""
    decay, no_decay = optimizer_params(model)
    groups = [{"params": [p for _, p in decay], "weight_decay": cfg.weight_decay},
              {"params": [p for _, p in no_decay], "weight_decay": 0.0}]
    if fused is None:
        fused = torch.cuda.is_available() and cfg.precision != "16-mixed"
    kw = {"fused": True} if fused else {}
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, **kw)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg))
    return opt, sched


def resolve_precision(precision: str) -> str:
    if precision != "auto":
        return precision
    return "bf16-mixed" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "32-true"


# Every evaluation of every arm runs at this precision, on the device its model is on (where it trained): a
# comparison never mixes devices' or precisions' rounding. Each run records both (eval_device, eval_precision).
EVAL_PRECISION = "32-true"


def eval_record(model) -> dict:
    """What a run records about its evaluations: {"eval_device": "cpu" | "cuda" | ..., "eval_precision"}."""
    return {"eval_device": next(model.parameters()).device.type, "eval_precision": EVAL_PRECISION}


@torch.no_grad()
def evaluate(model, loader, max_batches: int | None = None, loss_fn=None, per_window: bool = False) -> dict:
    """Mean loss (nats/token over the predicted tokens), perplexity and token count of `model` on the batches of
    `loader`, in fp32 (EVAL_PRECISION, no autocast) on the model's device. `loss_fn(model, batch) -> (summed loss
    [B], tokens [B])` defaults to the LM loss. With `per_window` also the summed loss and token count of every
    window in loader order (`window_loss`, `window_tokens`): what the report needs to say how much the choice of
    windows moves a difference."""
    loss_fn = loss_fn or token_losses
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    sums, counts = [], []
    with torch.autocast(device.type, enabled=False):
        for i, batch in enumerate(loader):
            if max_batches is not None and i >= max_batches:
                break
            batch = {k: v.to(device) for k, v in batch.items()}
            s, n = loss_fn(model, batch)
            sums.append(s.detach().double().cpu())
            counts.append(n.detach().cpu())
    model.train(was_training)
    s = torch.cat(sums) if sums else torch.zeros(0, dtype=torch.float64)
    n = torch.cat(counts) if counts else torch.zeros(0, dtype=torch.long)
    total, count = float(s.sum()), int(n.sum())
    loss = total / max(count, 1)
    out = {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "tokens": count}
    if per_window:
        out["window_loss"] = s.tolist()
        out["window_tokens"] = n.tolist()
    return out


class HeadroomLM(pl.LightningModule):
    """Trains one transformers model built from `model_config` (a ModelConfig dict)."""

    def __init__(self, model_config: dict | None, train_config: dict, pad_id: int = PAD_ID, eos_id: int = EOS_ID,
                 meta: dict | None = None, model=None, loss_fn=None, train_loss_fn=None):
        super().__init__()
        self.save_hyperparameters(ignore=["model", "loss_fn", "train_loss_fn"])
        self.model_cfg = ModelConfig(**model_config) if model_config else None
        self.train_cfg = TrainConfig(**train_config)
        if model is None:
            model = build_model(self.model_cfg, seed=self.train_cfg.seed, pad_id=pad_id, eos_id=eos_id)
        self.model = model
        self.loss_fn = loss_fn or token_losses  # validation's (and, unless train_loss_fn is given, training's)
        # what the optimizer minimises when it is not the validation loss: distillation (lightning_modules/training/distill.py)
        self.train_loss_fn = train_loss_fn or self.loss_fn
        self.n_params = count_parameters(self.model)
        self._t0: float | None = None
        self._val = [0.0, 0]
        self.last_train_loss = float("nan")  # the global batch's mean loss at the latest step

    @classmethod
    def from_model(cls, model, train_cfg: TrainConfig, loss_fn=None, train_loss_fn=None) -> HeadroomLM:
        """Wrap an existing model (a pruned one, for recovery fine-tuning)."""
        mc = model_config_of(model)
        return cls(mc.model_dump(mode="json") if mc else None, train_cfg.model_dump(mode="json"), model=model,
                   loss_fn=loss_fn, train_loss_fn=train_loss_fn)

    def forward(self, batch: dict) -> torch.Tensor:
        s, n = self.loss_fn(self.model, batch)
        return s.sum() / n.sum().clamp_min(1)

    # ---- training
    def on_train_batch_start(self, batch, batch_idx):
        self._t0 = time.perf_counter()

    def _world(self) -> int:
        return int(self.trainer.world_size) if self._trainer is not None else 1

    def training_step(self, batch, batch_idx):
        world = self._world()
        if world == 1:
            s, n = self.train_loss_fn(self.model, batch)
            loss = s.sum() / n.sum().clamp_min(1)
            shown = loss.detach()
        else:
            # data-parallel: each rank holds a share of the global batch, and DDP averages the ranks' gradients.
            # Dividing each rank's summed loss by the global token count (times the ranks) makes that average the
            # gradient of the global batch's mean loss, as one process would take it, even when the ranks predict
            # different numbers of tokens (masked LM)
            s, n = self.train_loss_fn(self.model, batch)
            sums = torch.stack([s.sum().detach().float(), n.sum().float()])
            sums = self.trainer.strategy.reduce(sums, reduce_op="sum")
            loss = s.sum() * world / sums[1].clamp_min(1)
            shown = sums[0] / sums[1].clamp_min(1)
        self.last_train_loss = float(shown)
        self.log(TRAIN_LOSS, shown, on_step=True, prog_bar=True)
        self.log(TRAIN_PPL, torch.exp(shown.clamp(max=50.0)), on_step=True)
        return loss

    def on_before_optimizer_step(self, optimizer):
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if grads:
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
            self.log(TRAIN_GRAD_NORM, norm, on_step=True)
        self.log(TRAIN_LR, optimizer.param_groups[0]["lr"], on_step=True)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self._t0 is not None:
            dt = time.perf_counter() - self._t0
            self.log(TRAIN_TOKENS_PER_S, batch["input_ids"].numel() / max(dt, 1e-9), on_step=True)

    # ---- validation
    def on_validation_epoch_start(self):
        self._val = [0.0, 0]

    def validation_step(self, batch, batch_idx):
        s, n = self.loss_fn(self.model, batch)
        self._val[0] += float(s.sum())
        self._val[1] += int(n.sum())

    def on_validation_epoch_end(self):
        if self._world() > 1:  # each rank evaluated its share of the windows: add the sums up
            t = self.trainer.strategy.reduce(torch.tensor(self._val, dtype=torch.float64, device=self.device),
                                             reduce_op="sum")
            self._val = [float(t[0]), int(t[1])]
        loss = self._val[0] / max(self._val[1], 1)
        self.log(VAL_LOSS, loss, prog_bar=True)
        self.log(VAL_PPL, math.exp(min(loss, 50.0)))

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        """Clip by global norm, as Lightning does, also for a fused AdamW under bf16-mixed: Lightning refuses any
        optimizer that unscales gradients in its step when a mixed precision is set, though bf16-mixed has no loss
        scaler and its gradients are already true ones. With a scaler (fp16-mixed; make_optimizer then builds no
        fused optimizer) Lightning's own path unscales first."""
        if not gradient_clip_val:
            return
        if getattr(self.trainer.precision_plugin, "scaler", None) is None:
            torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]],
                                           gradient_clip_val)
        else:
            self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def configure_optimizers(self):
        opt, sched = make_optimizer(self.model, self.train_cfg)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def load_lm(checkpoint_path: str, map_location: str = "cpu") -> HeadroomLM:
    """Rebuild a HeadroomLM (model config included) from a Lightning checkpoint file."""
    return HeadroomLM.load_from_checkpoint(checkpoint_path, map_location=map_location, weights_only=False)
