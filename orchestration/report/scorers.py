"""Which scorer: every method's choice of heads against the primary method's, and how stable each ranking is.

Method gaps: in each (cell, family, ratio, scope, schedule) and eval set, each method's loss before fine-tune (the
masked model: what its ranking alone decides) minus the primary method's, paired by seed, with the interval of every
comparison (the spread over seeds and the eval windows' sampling variance, analysis._window_diffs). Positive: the
method's heads lose more. The methods of one group are one family for Holm's adjustment: a method is called "worse"
or "better" than the reference only when its adjusted p ≤ α, else "indistinguishable". Random is one of them: the
floor an informed method should clear.

Stability: per (cell, family, method, scope), the split-half agreement the prune runs measured
(lightning_modules/pruning/stability.py; metrics stability/*), mean over seeds, with the lowest seed's Spearman. A ranking is
called low below LOW_SPEARMAN (0.5): information for reading the gaps, not a trust check. The prune runs of one
seed at several ratios read the same split halves; their numbers are merged, one value per seed.
"""

from __future__ import annotations

import math
from collections import defaultdict

from lightning_modules.declarations import names as M

from .analysis import PRIMARY, _window_diffs, at_recovery, by_scale, mean, primary_recovery, pruned_groups
from .read import Run, Windows
from .rows import MethodGap, Stability, other_axes
from .stats import ALPHA, holm, paired

LOW_SPEARMAN = 0.5  # below this the report calls a ranking unstable


def method_gaps(runs: list[Run], windows: Windows | None = None, reference: str = PRIMARY["method"]) -> list[MethodGap]:
    """Every method's pre-fine-tune loss minus `reference`'s, per group and eval set (see the module docstring);
    empty when the sweep prunes with one method or without the reference."""
    windows = windows or Windows(None)
    # the masked model is the same whatever recovery follows: one recovery's runs (a sweep's primary one)
    groups = pruned_groups(at_recovery(runs, primary_recovery(runs)))
    if len({k.method for k in groups}) < 2:
        return []
    sets = sorted({k.split("/")[1] for r in runs for k in r.metrics if k.startswith(M.PRE_FT + "/")
                   and k.endswith("/loss")} - {"val"}, key=lambda s: (s != "id", s))  # the masked models' eval sets
    out = []
    for key, by_seed in by_scale(groups):
        if key.method == reference or key._replace(method=reference) not in groups:
            continue
        ref = groups[key._replace(method=reference)]
        for ev in sets:
            loss = M.loss(M.PRE_FT, ev)
            seeds = sorted(s for s in set(by_seed) & set(ref) if loss in by_seed[s].metrics
                           and loss in ref[s].metrics)
            if not seeds:
                continue
            mine = [by_seed[s].metrics[loss] for s in seeds]
            theirs = [ref[s].metrics[loss] for s in seeds]
            # per-window differences second − first: method − reference, as the seeds' differences
            wd = _window_diffs([windows.get(ref[s], M.PRE_FT, ev) for s in seeds],
                               [windows.get(by_seed[s], M.PRE_FT, ev) for s in seeds])
            res = paired([m - r for m, r in zip(mine, theirs)], *(wd or (None, None)))
            out.append(MethodGap(scale=key.scale, family=key.family, ratio=key.ratio, scope=key.scope,
                                 schedule=key.schedule, eval_set=ev, method=key.method, reference=reference,
                                 n_seeds=len(seeds), method_loss=mean(mine), reference_loss=mean(theirs),
                                 diff_mean=res.mean, ci95=list(res.ci95) if res.ci95 else None, p_value=res.p,
                                 p_holm=None, verdict="insufficient_seeds", window_share=res.window_share,
                                 group=other_axes(key)))
    _holm_over_methods(out)
    return out


def _holm_over_methods(rows: list[MethodGap]) -> None:
    fams = defaultdict(list)
    for r in rows:
        fams[(r.scale, r.family, r.ratio, r.scope, r.schedule, r.eval_set, tuple(sorted(r.group.items())))].append(r)
    for fam in fams.values():
        for r, h in zip(fam, holm([r.p_value for r in fam], ALPHA)):
            if h is None or not math.isfinite(r.diff_mean):
                continue
            r.p_holm = h.p_adjusted
            r.verdict = ("worse" if r.diff_mean > 0 else "better") if h.rejected else "indistinguishable"


def _ratios(metrics: dict, kind: str) -> dict[float, float]:
    pre = M.stability(kind) + "/r"
    return {float(k[len(pre):]): v for k, v in metrics.items() if k.startswith(pre)}


def stability(runs: list[Run]) -> list[Stability]:
    """The split-half agreement per (cell, family, method, scope), mean over seeds (see the module docstring)."""
    per_seed: dict[tuple, dict[int, dict]] = defaultdict(lambda: defaultdict(dict))
    for key, by_seed in pruned_groups(runs).items():
        for seed, r in by_seed.items():
            if any(k.startswith(M.stability("")) for k in r.metrics):
                per_seed[(key.scale, key.family, key.method, key.scope)][seed].update(r.metrics)
    out = []
    for (scale, family, method, scope), seeds in by_scale(per_seed):
        ms = list(seeds.values())
        rho = [m[M.stability("spearman")] for m in ms if M.stability("spearman") in m]
        layer = [m[M.stability("spearman_layer_min")] for m in ms if M.stability("spearman_layer_min") in m]
        overlap, chance = defaultdict(list), defaultdict(list)
        for m in ms:
            for r, v in _ratios(m, "overlap").items():
                overlap[r].append(v)
            for r, v in _ratios(m, "chance").items():
                chance[r].append(v)
        rho_mean = mean(rho) if rho else None
        out.append(Stability(scale=scale, family=family, method=method, scope=scope, n_seeds=len(ms),
                             spearman=rho_mean, spearman_lowest_seed=min(rho) if rho else None,
                             spearman_layer_min=min(layer) if layer else None,
                             overlap={r: mean(v) for r, v in sorted(overlap.items())},
                             chance={r: mean(v) for r, v in sorted(chance.items())},
                             low=rho_mean is not None and rho_mean < LOW_SPEARMAN))
    return out
