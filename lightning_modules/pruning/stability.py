"""How stable a head ranking is: the split-half agreement of a method's scores.

A ranking read from a few calibration batches can be noise. For a method that reads data, the calibration batches
are split into their first and second halves, the heads scored on each half alone, and the two rankings compared:

- `spearman`: the Spearman correlation of the two halves' scores over the heads the scope ranks together — every
  head of the model for a `global` prune (on the scores it ranks, FLAP's z-scored ones), the heads of each layer
  for a `per_layer` prune (then the mean over layers);
- `spearman_layer_min`: the lowest within-layer correlation (a layer whose choice is a coin toss);
- `overlap[r]`: at prune ratio r, the fraction of the heads one half removes that the other half removes too, and
  `chance[r]`, what two random choices of the same sizes share on average.

Information, not a trust check: the prune itself uses every calibration batch. The first scoring pass is what is
compared (an iterative schedule re-scores a masked model; its later passes are not). Layers with fewer than 3 heads
enter no correlation (two heads' correlation is ±1 by construction); the heads a method leaves NaN enter none.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from lightning_modules.declarations.methods import get_method
from lightning_modules.models.families import layer_heads
from lightning_modules.pruning.scoring import ranked, score_heads

RATIOS = (0.25, 0.5, 0.75)  # the ratios every method's overlap is read at (with the unit's own)


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman's rank correlation of paired scores (ties get average ranks); None for fewer than 3 pairs or a
    constant side."""
    if len(a) < 3 or len(set(a)) < 2 or len(set(b)) < 2:
        return None
    ra, rb = _ranks(a), _ranks(b)
    return float(np.corrcoef(ra, rb)[0, 1])  # Pearson's correlation of the ranks


def _ranks(x: list[float]) -> np.ndarray:
    """Ranks 1..n, ties given the mean of the ranks they span (scipy.stats.rankdata's "average", without
    importing scipy in every prune trial)."""
    v = np.asarray(x, dtype=float)
    ranks = np.empty(len(v))
    ranks[np.argsort(v, kind="stable")] = np.arange(1, len(v) + 1)
    _, tie = np.unique(v, return_inverse=True)  # the values' groups: each gets its ranks' mean
    return (np.bincount(tie, weights=ranks) / np.bincount(tie))[tie]


def _pairs(a: torch.Tensor, b: torch.Tensor, heads: list[int], layer: int | None = None):
    rows = range(len(heads)) if layer is None else [layer]
    xs, ys = [], []
    for l in rows:
        for h in range(heads[l]):
            x, y = float(a[l, h]), float(b[l, h])
            if not (math.isnan(x) or math.isnan(y)):
                xs.append(x)
                ys.append(y)
    return xs, ys


def _removed(scores: torch.Tensor, heads: list[int], ratio: float, scope: str) -> set[tuple[int, int]]:
    from lightning_modules.pruning.choose import (
        heads_to_keep,  # pruning imports this module: imported here, the import one-way
    )

    keep = heads_to_keep(scores, heads, ratio, scope, clamp=True)
    return {(l, h) for l, n in enumerate(heads) for h in range(n) if h not in keep[l]}


def _chance(removed: set[tuple[int, int]], heads: list[int], scope: str) -> float:
    """The expected overlap of two random choices of the same sizes: k/N over the model (global; a slight
    underestimate where keeping a layer's last head constrains the choice), or per layer Σ k_l²/n_l over Σ k_l
    (per_layer)."""
    if scope == "global":
        return len(removed) / sum(heads)
    k = [sum(1 for l2, _ in removed if l2 == l) for l in range(len(heads))]
    return sum(kl * kl / n for kl, n in zip(k, heads)) / sum(k)


def agreement(a: torch.Tensor, b: torch.Tensor, heads: list[int], scope: str, ratios) -> dict:
    """The split-half numbers of two score tensors [layers, heads] (see the module's docstring), as a dict:
    spearman, spearman_layer_min (None where no layer has 3 heads), overlap and chance ({ratio: fraction}, the
    ratios at which anything is removed)."""
    per_layer = [spearman(*_pairs(a, b, heads, l)) for l in range(len(heads))]
    per_layer = [r for r in per_layer if r is not None]
    overall = spearman(*_pairs(a, b, heads)) if scope == "global" else (
        sum(per_layer) / len(per_layer) if per_layer else None)
    overlap, chance = {}, {}
    for r in sorted(set(ratios)):
        ra, rb = _removed(a, heads, r, scope), _removed(b, heads, r, scope)
        if ra:
            overlap[r] = len(ra & rb) / len(ra)
            chance[r] = _chance(ra, heads, scope)
    return {"spearman": overall, "spearman_layer_min": min(per_layer) if per_layer else None,
            "overlap": overlap, "chance": chance}


def split_half(model, batches: list[dict], method: str, scope: str, ratio: float, loss_fn, **options) -> dict | None:
    """Score `model`'s heads with `method` on each half of `batches` and compare (`agreement`, at RATIOS and
    `ratio`, on the scores the scope ranks). None for a method that reads no data or fewer than 2 batches."""
    if not get_method(method).needs_calibration or len(batches) < 2:
        return None
    half = len(batches) // 2
    a, b = (ranked(score_heads(model, part, method, loss_fn=loss_fn, **options), method, scope)
            for part in (batches[:half], batches[half:]))
    return {"batches": [half, len(batches) - half],
            **agreement(a, b, layer_heads(model), scope, (*RATIOS, ratio))}
