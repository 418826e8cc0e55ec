"""What a prune measures: the loss on a split, the mask-only prune curve, forward FLOPs and latency of a model,
and the seconds each kind of work took."""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from lightning_modules.declarations.config import kept_counts
from lightning_modules.models.families import layer_heads, layer_shapes
from lightning_modules.models.heads import attention_modules, head_gate
from lightning_modules.pruning.choose import heads_to_keep
from lightning_modules.pruning.scoring import LossFn
from lightning_modules.training.lm import evaluate

CURVE_RATIOS = tuple(round(0.1 * i, 1) for i in range(10))  # 0, 0.1, ..., 0.9


@torch.no_grad()
def evaluate_loss(model, loader, loss_fn: LossFn | None = None, max_batches: int | None = None,
                  per_window: bool = False) -> dict:
    """Mean per-token loss (nats/token, or the distillation distance), its exponential and the token count."""
    return evaluate(model, loader, max_batches=max_batches, loss_fn=loss_fn, per_window=per_window)


def curve_points(heads: list[int], scope: str = "per_layer", nominal=CURVE_RATIOS) -> list[tuple[float, float]]:
    """The points of a mask-only prune curve as (ratio to ask `heads_to_keep` for, fraction of heads it removes).

    Heads are whole, so a nominal ratio removes what rounding lets it: with 8 heads per layer 0.2 and 0.3 both
    remove 2 (25%). Every nominal ratio is mapped to the fraction it achieves and duplicates are dropped, so a
    curve (and the prunable fraction read off it) is indexed by the fraction actually removed."""
    total = sum(heads)
    seen, out = set(), []
    for r in nominal:
        removed = total - kept_counts(heads, r, scope)[1]
        if removed in seen:
            continue
        seen.add(removed)
        out.append((r, removed / total))
    return out


def prune_curve(model, scores: torch.Tensor, loaders: dict, scope: str = "per_layer", loss_fn: LossFn | None = None,
                ratios=CURVE_RATIOS) -> list[dict]:
    """Mask-only curve: loss on every eval set at each achievable fraction of heads removed (`curve_points` of the
    nominal `ratios`), with the same ranking and no fine-tune (cheap: no re-scoring, no training). Each row's
    `ratio` is the fraction removed; `nominal` the ratio that produced it."""
    heads = layer_heads(model)
    gate = head_gate(model)
    out = []
    for r, fraction in curve_points(heads, scope, ratios):
        keep = heads_to_keep(scores, heads, r, scope, clamp=True)
        gate.mask(keep, device=next(model.parameters()).device)
        removed = 1 - sum(map(len, keep)) / sum(heads)
        assert abs(removed - fraction) < 1e-9, (removed, fraction)
        row = {"ratio": fraction, "nominal": r, "fraction_removed": fraction}
        for name, loader in loaders.items():
            row[name] = evaluate_loss(model, loader, loss_fn)["loss"]
        out.append(row)
    gate.clear()
    return out


def forward_flops(model, seq_len: int) -> dict:
    """Forward matmul FLOPs per token of a loaded model, from its actual modules: 2·(in·out) of every linear
    layer (LM head included, embedding lookups not) + attention scores 2·2·T·H·d per layer."""
    from transformers.pytorch_utils import Conv1D  # GPT-2's linear layer

    attn_mods = {id(m) for a in attention_modules(model) for m in a.modules()}
    attn = mlp_other = 0
    for m in model.modules():
        if isinstance(m, nn.Linear):
            f = 2 * m.in_features * m.out_features
        elif isinstance(m, Conv1D):
            f = 2 * m.weight.shape[0] * m.weight.shape[1]
        else:
            continue
        if id(m) in attn_mods:
            attn += f
        else:
            mlp_other += f
    scores = sum(2 * 2 * seq_len * n * hd for n, _, hd in layer_shapes(model))
    return {"attention": attn + scores, "other": mlp_other, "total": attn + scores + mlp_other}


@torch.no_grad()
def measure_latency(model, batch: dict, repeats: int = 20, warmup: int = 3) -> float:
    """Median wall time (ms) of a forward pass on `batch`, warm-up passes excluded."""
    dev = next(model.parameters()).device
    ids = batch["input_ids"].to(dev)
    was = model.training
    model.eval()

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    times = []
    for i in range(warmup + repeats):
        sync()
        t = time.perf_counter()
        model(input_ids=ids)
        sync()
        if i >= warmup:
            times.append((time.perf_counter() - t) * 1000)
    model.train(was)
    return statistics.median(times)


class WorkTimer:
    """Seconds per kind of work: what a trial spends in scoring (and re-scoring halves), evaluation and training."""

    def __init__(self):
        self.s: dict[str, float] = dict.fromkeys(("score_s", "stability_s", "eval_s", "train_s", "latency_s"), 0.0)

    def __call__(self, kind: str):
        timer = self

        class _Span:
            def __enter__(self):
                self.t = time.perf_counter()

            def __exit__(self, *exc):
                timer.s[kind] += time.perf_counter() - self.t

        return _Span()


def split_windows(result: dict) -> dict:
    """Pop the per-window arrays of an evaluate(per_window=True) result (they travel apart from the metrics)."""
    return {"loss": result.pop("window_loss"), "tokens": result.pop("window_tokens")}
