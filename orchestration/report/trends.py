"""The two axes of when the extra heads matter: prune timing (heads removed at a fraction p of training, then
trained on to T) and the training budget (the primary gap against tokens per parameter and parameters, its
fitted trend and where it crosses zero).

Timing: per (cell, family, ratio, method), the final loss at each p on the primary eval set, with the paired
difference to pruning the trained model (p = 1). "matches" when that interval lies within ± the sweep's tolerance
× the late loss (pruning early ends as good as pruning late); "worse"/"better" when it excludes 0.

Trend: every (cell, seed) gives one point, x = log10 of the axis, y = control − pruned on the primary comparison
(after the recovery fine-tune). Ordinary least squares; the slope's interval is Student-t on n − 2 degrees of
freedom. The crossover is where the fitted line is 0, reported only inside the swept range, and `established` only
when the slope's interval excludes 0 (a flat trend crosses somewhere by chance); its interval is the 2.5-97.5
percentiles of the crossover over bootstrap resamples of the seeds within each cell (with three seeds a
cell the bootstrap understates the spread: read it as a lower bound on the uncertainty; with fewer than three
seeds in a cell no interval is given)."""

from __future__ import annotations

import math
from collections import defaultdict

from lightning_modules.config import CONTROLS

from .analysis import PRIMARY, by_scale, control_runs, controls_of, mean, pruned_groups
from .read import Run
from .rows import Timing, Trend, TrendPoint
from .stats import t_interval

AXES = ("tokens_per_param", "params")
BOOTSTRAP_DRAWS = 2000
MIN_BOOTSTRAP_SEEDS = 3  # per cell: with two, resampling has three outcomes and its interval means nothing


# ------------------------------------------------------------------------------------------------ timing


def _timing_word(ci: tuple[float, float] | None, margin: float) -> str:
    if ci is None:
        return "insufficient_seeds"
    if -margin <= ci[0] and ci[1] <= margin:
        return "matches"
    if ci[0] > 0:
        return "worse"
    if ci[1] < 0:
        return "better"
    return "inconclusive"


def timing(runs: list[Run], tolerance: float) -> list[Timing]:
    """Rows for every (cell, family, ratio, method) pruned at some p < 1 (primary scope and schedule)."""
    ev = PRIMARY["eval_set"]
    key = f"final/{ev}/loss"
    groups = defaultdict(lambda: defaultdict(dict))  # (scale, family, ratio, method) -> prune_at -> seed -> loss
    for r in runs:
        if r.arm == "pruned" and (r.scope, r.schedule) == (PRIMARY["scope"], PRIMARY["schedule"]) and key in r.metrics:
            groups[(r.scale, r.family, r.ratio, r.method)][r.prune_at][r.seed] = r.metrics[key]
    dense = defaultdict(list)
    scratch = defaultdict(list)
    for r in runs:
        if r.arm == "dense" and key in r.metrics:
            dense[(r.scale, r.family)].append(r.metrics[key])
        if r.arm == "scratch_e" and r.scope == "per_layer" and key in r.metrics:
            scratch[(r.scale, r.family, r.ratio)].append(r.metrics[key])
    out = []
    for (scale, family, ratio, method), by_at in by_scale(groups):
        if all(p == 1.0 for p in by_at):
            continue
        late = by_at.get(1.0, {})
        for p in sorted(by_at):
            losses = by_at[p]
            vals = [losses[s] for s in sorted(losses)]
            ci = t_interval(vals)
            common = sorted(set(losses) & set(late))
            diffs = [losses[s] - late[s] for s in common]
            d_ci = t_interval(diffs) if p != 1.0 else None
            word = "reference" if p == 1.0 else ("insufficient_seeds" if not common else
                                                  _timing_word(d_ci, tolerance * mean([late[s] for s in common])))
            out.append(Timing(scale, family, ratio, method, p, ev, len(vals), mean(vals), list(ci) if ci else None,
                              mean(diffs) if diffs and p != 1.0 else None, list(d_ci) if d_ci else None, word,
                              mean(dense[(scale, family)]) if dense[(scale, family)] else None,
                              mean(scratch[(scale, family, ratio)]) if scratch[(scale, family, ratio)] else None))
    return out


# ------------------------------------------------------------------------------------------------ trend


def _x(r: Run) -> tuple[float, float] | None:
    """(tokens per parameter, parameters) of the dense model a pruned run came from."""
    try:
        params = float(r.metrics["params_dense"])
        tokens = float(r.params["steps"]) * float(r.params["batch_size"]) * float(r.params["seq_len"])
    except (KeyError, ValueError):
        return None
    return tokens / params, params


def gap_points(runs: list[Run]) -> dict:
    """(family, ratio, control) -> [(cell, tokens per parameter, parameters, [control − pruned per seed])] on the
    primary comparison after the recovery fine-tune."""
    key = f"final/{PRIMARY['eval_set']}/loss"
    controls = control_runs(runs)
    out = defaultdict(list)
    for gkey, by_seed in by_scale(pruned_groups(runs)):
        scale, family, ratio, method, scope, schedule = gkey
        if (method, scope, schedule) != (PRIMARY["method"], PRIMARY["scope"], PRIMARY["schedule"]):
            continue
        x = _x(by_seed[min(by_seed)])
        if x is None:
            continue
        for arm in CONTROLS:
            ctrl = controls_of(controls, arm, gkey)
            seeds = [s for s in sorted(set(by_seed) & set(ctrl)) if key in by_seed[s].metrics and key in ctrl[s].metrics]
            if seeds:
                out[(family, ratio, arm)].append(
                    (scale, x[0], x[1], [ctrl[s].metrics[key] - by_seed[s].metrics[key] for s in seeds]))
    return out


def _ols(xs: list[float], ys: list[float]):
    """(intercept, slope, slope's standard error or None)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    if n < 3:
        return a, b, None
    resid = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys))
    return a, b, math.sqrt(resid / (n - 2) / sxx)


def fit_trend(cells: list[tuple[float, list[float]]], draws: int = BOOTSTRAP_DRAWS, seed: int = 0) -> dict | None:
    """cells: (log10 x, [gap per seed]). The fitted slope (per decade) with its t-interval, the crossover (log10 x
    where the line is 0, None outside the cells' range) with its bootstrap interval; None with fewer than two
    distinct x or three points."""
    import numpy as np
    from scipy import stats

    xs = [x for x, g in cells for _ in g]
    ys = [y for _, g in cells for y in g]
    if len({x for x, _ in cells}) < 2 or len(ys) < 3:
        return None
    a, b, se = _ols(xs, ys)
    slope_ci = None
    if se is not None:
        half = float(stats.t.ppf(0.975, len(ys) - 2)) * se
        slope_ci = [b - half, b + half]
    lo, hi = min(xs), max(xs)
    cross = -a / b if b != 0 and lo <= -a / b <= hi else None
    cross_ci = None
    if cross is not None and min(len(g) for _, g in cells) >= MIN_BOOTSTRAP_SEEDS:
        rng = np.random.default_rng(seed)
        found = []
        for _ in range(draws):
            bx, by = [], []
            for x, g in cells:
                pick = rng.integers(0, len(g), len(g))
                bx += [x] * len(g)
                by += [g[i] for i in pick]
            ba, bb, _ = _ols(bx, by)
            if bb != 0:
                found.append(-ba / bb)
        if found:
            q = np.percentile(found, [2.5, 97.5])
            cross_ci = [float(q[0]), float(q[1])]
    established = cross is not None and slope_ci is not None and (slope_ci[0] > 0 or slope_ci[1] < 0)
    return {"slope": b, "slope_ci95": slope_ci, "crossover": cross, "crossover_ci95": cross_ci, "range": [lo, hi],
            "established": established}


def _power(v: float | None) -> float | None:
    """10**v, None when it would not be a finite number."""
    if v is None or not math.isfinite(v) or abs(v) > 300:
        return None
    return 10.0 ** v


def trends(runs: list[Run]) -> list[Trend]:
    """Per (family, ratio, control) and axis, the fitted trend of the primary gap over the sweep's cells."""
    out = []
    for (family, ratio, control), pts in sorted(gap_points(runs).items()):
        points = []
        for cell, tpp, params, gaps in pts:
            ci = t_interval(gaps)
            points.append(TrendPoint(cell, tpp, params, len(gaps), mean(gaps), list(ci) if ci else None))
        for axis in AXES:
            cells = [(math.log10(tpp if axis == "tokens_per_param" else params), gaps) for _, tpp, params, gaps in pts]
            f = fit_trend(cells)
            if f is None:
                continue
            ci = f["crossover_ci95"]
            out.append(Trend(family, ratio, control, axis, f["slope"], f["slope_ci95"], _power(f["crossover"]),
                             [_power(ci[0]), _power(ci[1])] if ci else None, f["established"],
                             [10 ** f["range"][0], 10 ** f["range"][1]], points))
    return out
