"""Which heads stay: a ranking of head scores and a plan (ratio, scope, schedule) give the heads kept per layer;
an iterative schedule re-scores between rounds."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from lightning_modules.declarations.config import kept_counts
from lightning_modules.declarations.prune_plan import PrunePlan, check_ratio_fits
from lightning_modules.models.families import layer_heads
from lightning_modules.models.heads import keep_mask
from lightning_modules.pruning.scoring import LossFn, default_loss, ranked, score_heads


def heads_to_keep(scores: torch.Tensor, heads: list[int], ratio: float, scope: str = "per_layer",
                  removed: torch.Tensor | None = None, clamp: bool = False) -> list[list[int]]:
    """The heads that stay when a fraction `ratio` of all heads goes, lowest scores first.

    per_layer: layer l loses round(ratio·n_l) heads (config.heads_kept). global: round(ratio·N) heads go
    wherever they score lowest, but never the last head of a layer. `removed` ([L, H] bool) marks heads already
    gone (iterative schedule): they go first. `clamp` keeps one head in a layer instead of raising (prune curve).
    Ties break by position, so the choice is deterministic."""
    L = len(heads)
    s = scores.clone().float()
    s[torch.isnan(s)] = float("inf")
    if removed is not None:
        s[removed.bool()] = float("-inf")
    if not clamp:
        check_ratio_fits(heads, ratio, scope)
    keep: list[list[int]] = []
    per_layer, total_kept = kept_counts(heads, ratio, scope)
    if scope == "per_layer":
        for l, (n, k) in enumerate(zip(heads, per_layer)):
            order = sorted(range(n), key=lambda h: (s[l, h].item(), h))
            keep.append(sorted(order[n - k:]))
        return keep
    n_remove = sum(heads) - total_kept
    order = sorted((s[l, h].item(), l, h) for l in range(L) for h in range(heads[l]))
    left = list(heads)
    gone = set()
    for _, l, h in order:
        if len(gone) == n_remove:
            break
        if left[l] > 1:
            gone.add((l, h))
            left[l] -= 1
    return [[h for h in range(heads[l]) if (l, h) not in gone] for l in range(L)]


def select_heads(model, calibration: Iterable[dict], plan: PrunePlan, loss_fn: LossFn | None = None,
                 on_score: Callable[[int, torch.Tensor], None] | None = None, **method_options):
    """Score and choose. one_shot: score once, keep the top heads. iterative: remove `plan.step` of the heads at a
    time (per layer or globally), re-scoring the masked model before each step (Michel et al. 2019, §4).

    Returns (keep lists, the scores of the first scoring pass)."""
    heads = layer_heads(model)
    batches = list(calibration)
    loss_fn = loss_fn or default_loss(model)
    opts = {"seed": plan.seed, **method_options}
    if plan.schedule == "one_shot" or plan.ratio == 0:
        scores = score_heads(model, batches, plan.method, loss_fn=loss_fn, **opts)
        if on_score:
            on_score(0, scores)
        return heads_to_keep(ranked(scores, plan.method, plan.scope), heads, plan.ratio, plan.scope), scores
    check_ratio_fits(heads, plan.ratio, plan.scope)
    removed = torch.zeros(len(heads), max(heads), dtype=torch.bool)
    first, r, i = None, 0.0, 0
    while r < plan.ratio - 1e-9:
        r = min(plan.ratio, r + plan.step)
        mask = (~removed).float()
        scores = score_heads(model, batches, plan.method, loss_fn=loss_fn, mask=mask, **opts)
        first = scores if first is None else first
        if on_score:
            on_score(i, scores)
        keep = heads_to_keep(ranked(scores, plan.method, plan.scope), heads, r, plan.scope, removed=removed)
        removed = keep_mask(keep, heads) == 0
        removed &= ~torch.isnan(scores)
        i += 1
    return keep, first
