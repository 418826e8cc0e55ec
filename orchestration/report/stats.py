"""The statistics of a verdict: paired differences over seeds and eval windows, and Holm's step-down adjustment of a
scale's primary comparisons. Pure Python and scipy; no MLflow, no torch.

A comparison pairs a pruned model and a control trained with the same seed and evaluates both on the same eval
windows. Two things are random: which seeds were run, and which windows the eval set holds. The mean difference
over n seeds, D = mean_s d_s (d_s = control − pruned loss of seed s), has variance

    var(D) ≈ s²_seeds / n  +  V_windows,

s²_seeds the variance of d_s over seeds and V_windows the sampling variance of D over windows for these seeds: with
u_w the seed-averaged difference of summed losses in window w and t_w its tokens, D = Σu_w / Σt_w, a ratio
estimator with V_windows = W/(W−1) · Σ_w (u_w − D·t_w)² / (Σ_w t_w)². The interval is D ± t(0.975, n−1)·√var(D),
the p-value two-sided on n − 1 degrees of freedom. Without per-window losses V_windows is left out (the interval
is then the plain Student-t interval over seeds) and the row says so. `window_share` = V_windows / var(D) tells
how much of the uncertainty the choice of windows makes.

Holm (1979): the m p-values of a family, sorted, p_(1) ≤ … ≤ p_(m); step j rejects while p_(j) ≤ α/(m − j + 1).
Adjusted p_(j) = max_{k≤j} min(1, (m − k + 1)·p_(k)); a comparison is decided ("supported"/"refuted") when its
adjusted p ≤ α. Its adjusted interval is the t-interval at the level step j tested it at, 1 − α/(m − j + 1) (for
the comparisons after the first one Holm could not reject: that step's level), so it excludes 0 exactly when the
comparison is decided.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

ALPHA = 0.05


def t_interval(values: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """Student-t interval of the mean of `values`; None with fewer than two, or when one is not finite (a broken
    run has no interval; the trust check `finite` names it)."""
    from scipy import stats

    n = len(values)
    if n < 2 or not all(math.isfinite(v) for v in values):
        return None
    m, sd = statistics.fmean(values), statistics.stdev(values)
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    return (m - half, m + half)


def window_variance(diff_sums: list[list[float]], tokens: list[float]) -> float:
    """V_windows of the module docstring: diff_sums[s][w] is control − pruned summed loss of seed s in window w,
    tokens[w] the window's predicted tokens (the same for both arms)."""
    n, w = len(diff_sums), len(tokens)
    if w < 2:
        return 0.0
    u = [sum(d[i] for d in diff_sums) / n for i in range(w)]
    total = sum(tokens)
    mean = sum(u) / total
    return w / (w - 1) * sum((ui - mean * ti) ** 2 for ui, ti in zip(u, tokens)) / total ** 2


@dataclass(frozen=True)
class Paired:
    """A paired comparison: mean difference (control − pruned), its standard error and interval, p-value."""

    n: int
    mean: float
    se: float | None  # None with fewer than two seeds
    ci95: tuple[float, float] | None
    p: float | None
    window_share: float | None  # V_windows / var(D); None when per-window losses were not recorded

    def interval(self, level: float) -> tuple[float, float] | None:
        from scipy import stats

        if self.se is None:
            return None
        half = float(stats.t.ppf(0.5 + level / 2, self.n - 1)) * self.se
        return (self.mean - half, self.mean + half)


def paired(diffs: list[float], window_diffs: list[list[float]] | None = None,
           window_tokens: list[float] | None = None) -> Paired:
    """The comparison of per-seed differences `diffs`, with the window component when the per-window summed-loss
    differences of every seed (`window_diffs`, seeds × windows) and the windows' tokens are given."""
    from scipy import stats

    if not diffs:
        raise ValueError("no paired seeds")
    n = len(diffs)
    if not all(math.isfinite(d) for d in diffs):  # a broken run: no statistic (the trust check `finite` says why)
        return Paired(n, math.nan, None, None, None, None)
    mean = statistics.fmean(diffs)
    if n < 2:
        return Paired(n, mean, None, None, None, None)
    var_seeds = statistics.variance(diffs) / n
    var_windows, share = 0.0, None
    if window_diffs is not None and window_tokens is not None:
        var_windows = window_variance(window_diffs, window_tokens)
    var = var_seeds + var_windows
    if window_diffs is not None:
        share = var_windows / var if var > 0 else 0.0
    se = math.sqrt(var)
    if se == 0:
        return Paired(n, mean, 0.0, (mean, mean), 0.0 if mean else 1.0, share)
    q = float(stats.t.ppf(0.975, n - 1))
    p = float(2 * stats.t.sf(abs(mean) / se, n - 1))
    return Paired(n, mean, se, (mean - q * se, mean + q * se), p, share)


def verdict_of(ci: tuple[float, float] | None) -> str:
    """supported (pruning better: the interval above 0), refuted (below), inconclusive, or insufficient_seeds."""
    if ci is None:
        return "insufficient_seeds"
    if ci[0] > 0:
        return "supported"
    if ci[1] < 0:
        return "refuted"
    return "inconclusive"


@dataclass(frozen=True)
class Holm:
    p_adjusted: float
    level: float  # the confidence level of the step that tested this comparison
    rejected: bool


def holm(p_values: list[float | None], alpha: float = ALPHA) -> list[Holm | None]:
    """Holm's step-down procedure over the p-values that exist (None: no test, left out of the family)."""
    idx = sorted((i for i, p in enumerate(p_values) if p is not None), key=lambda i: (p_values[i], i))
    m = len(idx)
    out: list[Holm | None] = [None] * len(p_values)
    running, stopped_at = 0.0, None
    for j, i in enumerate(idx, start=1):
        p = p_values[i]
        running = max(running, min(1.0, (m - j + 1) * p))
        if stopped_at is None and p > alpha / (m - j + 1):
            stopped_at = j
        step = j if stopped_at is None else stopped_at
        out[i] = Holm(running, 1 - alpha / (m - step + 1), stopped_at is None)
    return out
