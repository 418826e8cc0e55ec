"""The two axes of when the extra heads matter: prune timing (heads removed at a fraction p of training, then
trained on to T) and the trend of the primary gap across cells (a cell: one scale at one training budget).

Timing: per (cell, family, ratio, method), the final loss at each p on the primary eval set, with the paired
difference to pruning the trained model (p = 1). "worse"/"better" when that difference's 95% interval excludes 0
(decided first); else "matches" when the interval lies within ± the equivalence margin, half the cell's |Scratch-E
gap| (the effect under study: pruning early "matches" when it moves the loss by less than half of what separates
pruning from training small); else "inconclusive". Without a Scratch-E control there is no margin and no "matches".

Trend: the unit of inference is the cell, not the (cell, seed) point: a cell's gap has a cell-level deviation from
any line (its budget, its learning rate, its data order) that more seeds do not average away, and one seed shares
its initialisation and data order across a scale's budgets. So each cell contributes its mean gap over seeds (y),
and the fit is least squares on cell means with one intercept per group and a common slope:

- budget within scale (axis `tokens_per_param`, fit `within_scales`): x = log10(training tokens per non-embedding
  parameter of the dense model; Kaplan et al. 2020's N), one intercept per scale. The slope is how the gap
  changes per decade of budget inside a scale, with scale differences absorbed by the intercepts (and with them
  each seed's shared effect across its scale's budgets).
- size across scales (axis `params`, fit `across_scales`): per step count actually trained (the runs' `steps`, not
  the budget's label) with at least three scales, x =
  log10 non-embedding parameters, one cell per scale (the scales are the independent units: a scale's offset is
  shared by all its budgets, so pooling budgets would count it several times), n_scales − 2 degrees of freedom.
  With two scales any difference between two architectures would be read as a size effect. At one step count the
  tokens per parameter fall as the size grows, so this slope mixes size with budget, and the row says so.

The slope's 95% interval is Student-t on n_cells − n_groups − 1 degrees of freedom (the residual scatter of the
cell means, which holds the seed noise and the cell-level deviation alike); with no residual degree of freedom
(two cells of one scale) the row has a slope and no interval, and says so. A crossover is where a group's fitted
line is 0, reported only inside that group's swept range; its interval is Fieller's (the set of x where 0 lies in
the fitted line's 95% band), and it is *established* only when the slope's interval excludes 0 (then Fieller's set
is a bounded interval). Cells whose trust diagnostics failed are left out of every fit and listed; cells with
checks that could not run are used and listed (the claim is then unverified). Planted-null false-positive rates
and powers: docs/design.md.

Recovery: the primary gap (control − pruned, after the recovery fine-tune) at every recovery budget F and
objective (lm, distill) the sweep ran, and where, if anywhere, it changes sign along F. Each (cell, family, ratio,
control, objective) is a family of k budgets. A budget's gap has a *sign* when its paired interval (seeds and eval
windows, as every comparison) at level 1 − α/k excludes 0 (Bonferroni over the family). A change of sign is stated
only between two budgets whose signs are both established and opposite; a gap that is 0 at every F then claims one
with probability at most α (tests/test_recovery_report.py measures it by simulation; docs/design.md states the
rates). The primary comparison itself (section 3, the headline) is at the primary recovery,
`analysis.primary_recovery`: the strongest one the sweep file declares."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace

from lightning_modules.declarations import names as M
from lightning_modules.declarations.arms import control_names
from orchestration.design.unit import ANY, scale_rank

from .analysis import (
    PRIMARY,
    _interval_at,
    by_scale,
    comparisons,
    control_runs,
    controls_of,
    group_of,
    is_primary,
    mean,
    primary_values,
    pruned_groups,
)
from .read import Run, Windows
from .rows import Comparison, RecoveryTrend, Timing, Trend, TrendPoint, other_axes
from .stats import ALPHA, t_interval, verdict_of

AXES = ("tokens_per_param", "params")
MIN_SCALES_ACROSS = 3  # an across-scale slope needs three scales: two differ in more than size
ACROSS_NOTE = ("at one step count the tokens per parameter fall as the size grows: this slope mixes size with "
               "budget (the within-scale slope says how much the budget alone moves the gap)")
TIMING_MARGIN = 0.5  # of the cell's |Scratch-E gap|: the equivalence margin of "matches"


# ------------------------------------------------------------------------------------------------ timing


def _timing_word(ci: tuple[float, float] | None, margin: float | None) -> str:
    """worse/better when the interval excludes 0 (decided first: a difference shown is never called a match);
    then matches when it lies within ± margin; else inconclusive."""
    if ci is None:
        return "insufficient_seeds"
    if ci[0] > 0:
        return "worse"
    if ci[1] < 0:
        return "better"
    if margin is not None and -margin <= ci[0] and ci[1] <= margin:
        return "matches"
    return "inconclusive"


def timing(runs: list[Run]) -> list[Timing]:
    """Rows for every (cell, family, ratio, method, registered axes' values) pruned at some p < 1 (primary scope
    and schedule); Scratch-E: the one of the values, or the one that stands for every value (`*`)."""
    ev = PRIMARY["eval_set"]
    key = M.loss(M.FINAL, ev)
    other = lambda r: tuple(other_axes(group_of(r)).items()) if r.group is not None else ()  # noqa: E731
    groups = defaultdict(lambda: defaultdict(dict))  # (scale, family, ratio, method, other) -> p -> seed -> loss
    for r in runs:
        if r.arm == "pruned" and is_primary(r, "scope", "schedule") and key in r.metrics:
            groups[(r.scale, r.family, r.ratio, r.method, other(r))][r.prune_at][r.seed] = r.metrics[key]
    dense = defaultdict(list)
    scratch_seed = defaultdict(dict)  # (scale, family, ratio, other: ANY where it stands for every value) -> seed
    for r in runs:
        if r.arm == "dense" and key in r.metrics:
            dense[(r.scale, r.family)].append(r.metrics[key])
        if r.arm == "scratch_e" and r.scope == "per_layer" and key in r.metrics:
            scratch_seed[(r.scale, r.family, r.ratio, other(r))][r.seed] = r.metrics[key]
    out = []
    for (scale, family, ratio, method, values), by_at in by_scale(groups):
        if all(p == 1.0 for p in by_at):
            continue
        late = by_at.get(1.0, {})
        se = scratch_seed.get((scale, family, ratio, values)) or scratch_seed.get(
            (scale, family, ratio, tuple((a, ANY) for a, _ in values)), {})
        both = sorted(set(se) & set(late))
        # the effect under study in this cell: Scratch-E − pruned (trained model), paired by seed
        margin = TIMING_MARGIN * abs(mean([se[s] - late[s] for s in both])) if both else None
        for p in sorted(by_at):
            losses = by_at[p]
            vals = [losses[s] for s in sorted(losses)]
            ci = t_interval(vals)
            common = sorted(set(losses) & set(late))
            diffs = [losses[s] - late[s] for s in common]
            d_ci = t_interval(diffs) if p != 1.0 else None
            word = "reference" if p == 1.0 else ("insufficient_seeds" if not common else _timing_word(d_ci, margin)
                                                 if all(map(math.isfinite, diffs)) else "inconclusive")
            with_se = sorted(set(losses) & set(se))
            se_diffs = [se[s] - losses[s] for s in with_se]
            se_ci = t_interval(se_diffs) if se_diffs else None
            se_word = verdict_of(se_ci) if all(map(math.isfinite, se_diffs)) else "inconclusive"
            out.append(Timing(scale, family, ratio, method, p, ev, len(vals), mean(vals), list(ci) if ci else None,
                              mean(diffs) if diffs and p != 1.0 else None, list(d_ci) if d_ci else None, word,
                              mean(dense[(scale, family)]) if dense[(scale, family)] else None,
                              mean(list(se.values())) if se else None,
                              margin, mean(se_diffs) if se_diffs else None, list(se_ci) if se_ci else None,
                              se_word, dict(values)))
    return out


# ------------------------------------------------------------------------------------------------ trend


def _x(r: Run) -> tuple[float, float, int] | None:
    """(training tokens per non-embedding parameter, non-embedding parameters, steps trained) of the dense model a
    pruned run came from."""
    try:
        params = float(r.metrics["params_dense_nonembedding"])
        steps = int(round(float(r.params["steps"])))
        tokens = steps * float(r.params["batch_size"]) * float(r.params["seq_len"])
    except (KeyError, ValueError):
        return None
    return tokens / params, params, steps


def gap_points(runs: list[Run], exclude: frozenset = frozenset()) -> dict:
    """(family, ratio, control, the group's other axes) -> [(cell, tokens per parameter, parameters, [control −
    pruned per seed], dense steps trained)] on the primary comparison after the recovery fine-tune; cells in `exclude` ((cell, family)
    pairs) left out."""
    key = M.loss(M.FINAL, PRIMARY["eval_set"])
    controls = control_runs(runs)
    out = defaultdict(list)
    for gkey, by_seed in by_scale(pruned_groups(runs)):
        scale, family, ratio, method, scope, schedule = gkey.scale, gkey.family, gkey.ratio, gkey.method, gkey.scope, \
            gkey.schedule
        if not primary_values(method=method, scope=scope, schedule=schedule):
            continue
        if (scale, family) in exclude:
            continue
        x = _x(by_seed[min(by_seed)])
        if x is None:
            continue
        for arm in control_names():
            ctrl = controls_of(controls, arm, gkey, by_seed)
            seeds = [s for s in sorted(set(by_seed) & set(ctrl)) if key in by_seed[s].metrics and key in ctrl[s].metrics]
            if seeds:
                out[(family, ratio, arm, tuple(other_axes(gkey).items()))].append(
                    (scale, x[0], x[1], [ctrl[s].metrics[key] - by_seed[s].metrics[key] for s in seeds], x[2]))
    return out


def fieller(y0: float, b: float, n_g: int, sxx: float, s2: float, q: float) -> tuple[float, float] | None:
    """The 95% set of u (x − the group's mean x) where the group's line ȳ_g + b·u is 0: {u : (ȳ_g + b u)² ≤
    q² s² (1/n_g + u²/Sxx)}, with ȳ_g and b independent (least squares). A bounded interval when the slope is
    significant (b² > q² s²/Sxx); None otherwise (the set is unbounded: no crossover can be placed)."""
    a2 = b * b - q * q * s2 / sxx
    if a2 <= 0:
        return None
    a1 = 2 * y0 * b
    a0 = y0 * y0 - q * q * s2 / n_g
    disc = a1 * a1 - 4 * a2 * a0
    if disc < 0:
        return None
    r = math.sqrt(disc)
    return ((-a1 - r) / (2 * a2), (-a1 + r) / (2 * a2))


def fit_cells(cells: list[tuple[str, float, float]]) -> dict | None:
    """Least squares on cell means with one intercept per group and a common slope. cells: (group, x, ȳ). Returns
    {"slope", "slope_ci95" (None without a residual degree of freedom), "df", "n_cells", "groups": {group:
    {"intercept", "range", "n_cells", "crossover", "crossover_ci95", "established"}}}, or None when no group has
    two distinct x (no slope)."""
    from scipy import stats

    groups: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for g, x, y in cells:
        groups[g].append((x, y))
    means = {g: (sum(x for x, _ in v) / len(v), sum(y for _, y in v) / len(v)) for g, v in groups.items()}
    sxx = sum((x - means[g][0]) ** 2 for g, v in groups.items() for x, _ in v)
    if sxx <= 1e-12:
        return None
    sxy = sum((x - means[g][0]) * (y - means[g][1]) for g, v in groups.items() for x, y in v)
    b = sxy / sxx
    n, k = len(cells), len(groups)
    df = n - k - 1
    s2 = q = None
    ci = None
    if df >= 1:
        rss = sum((y - means[g][1] - b * (x - means[g][0])) ** 2 for g, v in groups.items() for x, y in v)
        s2 = rss / df
        q = float(stats.t.ppf(0.975, df))
        half = q * math.sqrt(s2 / sxx)
        ci = [b - half, b + half]
    significant = ci is not None and (ci[0] > 0 or ci[1] < 0)
    out = {}
    for g, v in groups.items():
        mx, my = means[g]
        lo, hi = min(x for x, _ in v), max(x for x, _ in v)
        cross = mx - my / b if b != 0 else None
        if cross is not None and not (lo <= cross <= hi and len(v) >= 2):
            cross = None  # outside the swept range (a group of one cell has no range)
        cci = None
        if cross is not None and s2 is not None:
            f = fieller(my, b, len(v), sxx, s2, q)
            cci = [mx + f[0], mx + f[1]] if f else None
        out[g] = {"intercept": my - b * mx, "range": [lo, hi], "n_cells": len(v), "crossover": cross,
                  "crossover_ci95": cci, "established": bool(cross is not None and significant and cci is not None)}
    return {"slope": b, "slope_ci95": ci, "df": df, "n_cells": n, "groups": out}


def _power(v: float | None) -> float | None:
    """10**v, None when it would not be a finite number."""
    if v is None or not math.isfinite(v) or abs(v) > 300:
        return None
    return 10.0 ** v


def _group_rows(f: dict) -> list[dict]:
    return [{"group": g, "n_cells": v["n_cells"], "x_range": [_power(v["range"][0]), _power(v["range"][1])],
             "intercept": v["intercept"], "crossover": _power(v["crossover"]),
             "crossover_ci95": [_power(v["crossover_ci95"][0]), _power(v["crossover_ci95"][1])]
             if v["crossover_ci95"] else None, "established": v["established"]} for g, v in f["groups"].items()]


def _all_cells(pts: list, axis: str) -> list[tuple[str, float, float]]:
    if axis == "tokens_per_param":
        return [(c.scale, math.log10(tpp), mean(g)) for c, tpp, _, g, _ in pts]
    return [(str(steps), math.log10(p), mean(g)) for c, _, p, g, steps in pts]


def _fit_row(family, ratio, control, axis, fit, pts, used, points, left_out, shaky, budget=None,
             extra_note: str | None = None) -> Trend | None:
    """One Trend row from the (group, x, ȳ) cells of `used` (all of `pts` when nothing is left out); a row with no
    slope when the left-out cells took what a fit needs; None when even all cells give no fit."""
    cells, every = _all_cells(used, axis), _all_cells(pts, axis)
    if fit == "across_scales":  # one group: the scales at this budget are the independent units
        cells, every = [("all", x, y) for _, x, y in cells], [("all", x, y) for _, x, y in every]
    enough = fit != "across_scales" or len(cells) >= MIN_SCALES_ACROSS
    f = fit_cells(cells) if enough else None
    if f is None:
        if left_out and fit_cells(every) is not None:  # the left-out cells took the fit
            return Trend(family, ratio, control, axis, None, None, None, None, False,
                         [_power(min(x for _, x, _ in every)), _power(max(x for _, x, _ in every))], points, fit, 0,
                         len(used), left_out, shaky, [],
                         f"cells left out (trust checks failed): {', '.join(left_out)}; the rest cannot give a slope",
                         budget)
        return None
    groups = _group_rows(f)
    one = groups[0] if len(groups) == 1 else None
    notes = [extra_note] if extra_note else []
    if f["slope_ci95"] is None:
        notes.append(f"{f['n_cells']} cells in {len(groups)} group(s) leave no residual degree of freedom: a slope, "
                     "no interval")
    xs = [x for _, x, _ in cells]
    return Trend(family, ratio, control, axis, f["slope"], f["slope_ci95"], one["crossover"] if one else None,
                 one["crossover_ci95"] if one else None, any(g["established"] for g in groups),
                 [_power(min(xs)), _power(max(xs))], points, fit, f["df"], f["n_cells"], left_out, shaky, groups,
                 "; ".join(notes) or None, budget)


def trends(runs: list[Run], exclude: frozenset = frozenset(), unverified: frozenset = frozenset()) -> list[Trend]:
    """Per (family, ratio, control): the budget trend within scales, and per budget with three or more scales the
    size trend across them (module docstring). `exclude`: (cell, family) pairs whose trust checks failed (left
    out, listed); `unverified`: pairs with checks that could not run (used, listed)."""
    out = []
    all_pts = gap_points(runs)
    kept_pts = gap_points(runs, exclude)
    for (family, ratio, control, other), pts in sorted(all_pts.items()):
        left_out = sorted({c for c, *_ in pts if (c, family) in exclude}, key=scale_rank)
        used = kept_pts.get((family, ratio, control, other), [])
        points = []
        for cell, tpp, params, gaps, _ in pts:
            ci = t_interval(gaps)
            points.append(TrendPoint(cell, tpp, params, len(gaps), mean(gaps), list(ci) if ci else None,
                                     (cell, family) not in exclude))
        shaky = sorted({c for c, *_ in used if (c, family) in unverified}, key=scale_rank)
        row = _fit_row(family, ratio, control, "tokens_per_param", "within_scales", pts, used, points, left_out,
                       shaky)
        if row is not None:
            out.append(replace(row, group=dict(other)))
        # across scales: one fit per step count trained (not the budget's label: scales of one budget each may
        # have trained different steps), one cell per scale
        steps_of = {p[0]: p[4] for p in pts}
        for steps in sorted(set(steps_of.values())):
            at = [p for p in pts if p[4] == steps]
            if len({p[0].scale for p in at}) < MIN_SCALES_ACROSS:
                continue
            mine = [p for p in used if p[4] == steps]
            gone = [c for c in left_out if steps_of.get(c) == steps]
            row = _fit_row(family, ratio, control, "params", "across_scales", at, mine,
                           [p for p in points if steps_of.get(p.cell) == steps], gone, shaky, steps,
                           ACROSS_NOTE + f" (the cells fitted trained {steps} steps each)")
            if row is not None:
                out.append(replace(row, group=dict(other)))
    return out


# ------------------------------------------------------------------------------------------------ recovery


def recovery_rows(runs: list[Run], windows: Windows | None = None) -> list[Comparison]:
    """The primary comparison (method, scope, schedule, eval set) after recovery, at every F and objective; empty
    unless the sweep ran more than one recovery."""
    if len({(r.finetune_steps or 0, r.recovery) for r in runs if r.arm == "pruned"}) < 2:
        return []
    return [c for c in comparisons(runs, windows) if c.stage == "final" and is_primary(c, "method", "scope",
                                                                                          "schedule", "eval_set")]


def _sign(row: Comparison, level: float) -> int:
    ci = _interval_at(row, level)
    if ci is None:
        return 0
    return 1 if ci[0] > 0 else -1 if ci[1] < 0 else 0


def sign_changes(rows: list[Comparison], alpha: float = ALPHA) -> list[RecoveryTrend]:
    """Per (scale, family, ratio, control, objective) with two or more budgets: each budget's sign at the
    Bonferroni level 1 − α/k, and the first pair of budgets (in increasing F, budgets without a sign skipped) whose
    signs are opposite."""
    groups = defaultdict(list)
    for c in rows:
        groups[(c.scale, c.family, c.ratio, c.control, c.recovery, tuple((k, str(v)) for k, v in c.group.items()))
               ].append(c)
    out = []
    order = {a: i for i, a in enumerate(control_names())}
    for (scale, family, ratio, control, recovery, _), rs in sorted(
            groups.items(), key=lambda kv: (kv[0][:3], order.get(kv[0][3], 99), kv[0][4:])):
        rs.sort(key=lambda c: c.finetune_steps)
        if len(rs) < 2:
            continue
        level = 1 - alpha / len(rs)
        signs = [_sign(c, level) for c in rs]
        known = [(c.finetune_steps, s) for c, s in zip(rs, signs) if s]
        change = next(([a[0], b[0]] for a, b in zip(known, known[1:]) if a[1] != b[1]), None)
        out.append(RecoveryTrend(scale=scale, family=family, ratio=ratio, control=control, recovery=recovery,
                                 budgets=[c.finetune_steps for c in rs], diffs=[c.diff_mean for c in rs],
                                 signs=signs, level=level, change=change, group=dict(rs[0].group)))
    return out
