"""The claim's two halves from typed runs: half (2) comparisons (paired by seed, windows included, Holm-adjusted
per scale), half (1) at the swept ratios, prune curves and the prunable fractions read off them, the best method
on val. Statistics are orchestration/report/stats.py's; this module only groups runs and asks it."""

from __future__ import annotations

import functools
import math
import statistics
from collections import defaultdict, namedtuple

from lightning_modules.declarations import names as M
from lightning_modules.declarations.arms import ARMS, control_names
from lightning_modules.declarations.config import prunable_fraction, within_tolerance
from lightning_modules.declarations.methods import PRIMARY_METHOD
from orchestration.design.unit import ANY, scale_rank

from .read import Run, Windows
from .rows import Comparison, CurvePoint, Prunable, Replication, other_axes
from .stats import ALPHA, holm, paired, t_interval, verdict_of

PRIMARY = {"method": PRIMARY_METHOD, "scope": "per_layer", "schedule": "one_shot", "eval_set": "id"}


def is_primary(row, *fields: str) -> bool:
    """Whether a row (a comparison, a prunable row, a curve point, a run) has the primary comparison's value of
    each of `fields` (default: every field of PRIMARY the row has). The primary comparison is declared once, above."""
    return primary_values(**{k: getattr(row, k) for k in (fields or [k for k in PRIMARY if hasattr(row, k)])})


def primary_values(**values) -> bool:
    """Whether these values (method=..., scope=..., schedule=..., eval_set=...) are the primary comparison's."""
    return all(v == PRIMARY[k] for k, v in values.items())


# ------------------------------------------------------------------------------------------------ grouping


def mean(xs) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def eval_sets(runs: list[Run]) -> list[str]:
    """The eval sets the runs were scored on (not val), `id` first."""
    sets = set().union(*(M.eval_splits(r.metrics) for r in runs)) - {"val"}
    return sorted(sets, key=lambda s: (s != "id", s))


def by_scale(groups: dict) -> list:
    """Items of a dict keyed by groups (their `scale`, by name) or (scale, ...) tuples, scales in preset order."""
    scale = lambda k: getattr(k, "scale", None) or k[0]  # noqa: E731
    return sorted(groups.items(), key=lambda kv: (scale_rank(scale(kv[0])), kv[0]))


def by_seed(runs: list[Run], key_of) -> dict:
    """Runs grouped by `key_of(run)`, then by seed: {key: {seed: run}}. Two runs that share the key and the seed
    would overwrite each other — the grouping left out an axis they differ on — so that raises, naming both,
    instead of dropping one."""
    groups = defaultdict(dict)
    for r in runs:
        g = groups[key_of(r)]
        if r.seed in g:
            raise ValueError(f"runs {g[r.seed].name} and {r.name} share their group and seed {r.seed}: the "
                             "report's grouping leaves out an axis they differ on")
        g[r.seed] = r
    return groups


@functools.cache
def _key_type(axes: tuple[str, ...]):
    """A group's key: a named tuple of the axes' values (read by name, so a new grouped axis shifts nothing)."""
    return namedtuple("Group", axes)


def group_of(r: Run):
    """The run's comparison group, as the plan stamped it: a named tuple over the grouped axes (the scale is the
    cell), ANY where the run stands for every value."""
    names, wild = r.group
    return _key_type(names)(*(ANY if a in wild else getattr(r, a) for a in names))


def _which(key) -> tuple:
    """A group's cell, family, ratio, method, scope and schedule, read by name."""
    return key.scale, key.family, key.ratio, key.method, key.scope, key.schedule


def pruned_groups(runs: list[Run]) -> dict:
    """group -> {seed: pruned run}, of the trained models' prunes (prune_at 1; the timing axis has its own rows)."""
    return by_seed([r for r in runs if r.arm == "pruned" and r.prune_at == 1.0], group_of)


class Controls(dict):
    """(arm, group) -> {seed: control run}, the group with ANY where the control stands for every value; and the
    same runs by (arm, the group's tag text), which a pruned run's stamp names (`by_text`)."""

    def __init__(self, groups: dict):
        super().__init__(groups)
        self.by_text = {(arm, next(iter(g.values())).tag("group")): g for (arm, _), g in groups.items()}


def control_runs(runs: list[Run]) -> Controls:
    """(arm, group) -> {seed: control run}; the group has ANY where the control stands for every value."""
    controls = control_names()
    return Controls(by_seed([r for r in runs if r.arm in controls and r.group is not None],
                            lambda r: (r.arm, group_of(r))))


def _heads(text: str | None):
    if not text or text == "none":
        return None
    v = [int(x) for x in text.split(",")]
    return v[0] if len(set(v)) == 1 else v


# ------------------------------------------------------------------------------------------------ half (2)


def _window_diffs(pw: list[dict | None], cw: list[dict | None]) -> tuple[list[list[float]], list[float]] | None:
    """(seeds × windows summed-loss differences control − pruned, tokens per window), or None unless every seed
    of both arms recorded the same windows."""
    if any(x is None for x in pw + cw):
        return None
    tokens = pw[0]["tokens"]
    if any(x["tokens"] != tokens for x in pw + cw):
        return None
    return [[c - p for c, p in zip(c_["loss"], p_["loss"])] for p_, c_ in zip(pw, cw)], tokens


def controls_of(controls: Controls, arm: str, key: tuple, pruned: dict) -> dict:
    """The runs of control `arm` the pruned group `key` (its runs by seed: `pruned`) pairs with, by seed: the group
    the plan stamped on the pruned runs (`headroom.controls`). Runs logged before that stamp (or an arm declared
    since) get the plan's rule from the control groups' own stamps: of those that match the pruned group (every
    axis equal, or ANY), the most specific."""
    stamps = {r.controls[arm] for r in pruned.values() if r.controls is not None and arm in r.controls}
    if stamps:
        if len(stamps) > 1:
            raise ValueError(f"the pruned runs of one group name different {arm} controls: {sorted(stamps)}")
        return controls.by_text.get((arm, stamps.pop()), {})
    match = [(sum(v == ANY for v in g), g) for a, g in controls if a == arm and g._fields == key._fields
             and all(v in (ANY, k) for v, k in zip(g, key))]
    return controls[(arm, min(match, key=lambda m: m[0])[1])] if match else {}


def primary_recovery(runs: list[Run], spec=None) -> tuple[int, str]:
    """The primary comparison's recovery, declared with PRIMARY: the strongest the sweep declares — by
    distillation when its `prune.recovery` lists distill, else by the LM loss — at the largest recovery budget F of
    `prune.finetune_steps`. Taken from the sweep file, never from which runs finished (a run that did not finish is
    reported missing, not replaced by a weaker recovery). Without a stored sweep file (runs of an older version), it
    is inferred from the pruned runs; (0, "lm") when none finished. The rest of a recovery sweep is its own section
    (report/trends.py)."""
    if spec is not None:
        return spec.primary_recovery()
    pruned = [r for r in runs if r.arm == "pruned"]
    kind = "distill" if any(r.recovery == "distill" for r in pruned) else "lm"
    return max((r.finetune_steps or 0 for r in pruned if r.recovery == kind), default=0), kind


def at_recovery(runs: list[Run], recovery: tuple[int, str], spec=None) -> list[Run]:
    """The runs of one recovery (F, objective): its pruned runs, the controls matched to it, and every other run
    (dense, the controls that stand for every recovery). A sweep with one recovery keeps all of its runs. With the
    sweep file (`spec`), a scale with its own recovery ladder is read at the largest F of its own ladder."""
    out = []
    for r in runs:
        f, kind = recovery
        if spec is not None and spec.scales and r.scale.scale in spec.scales:
            f = spec.primary_recovery(r.scale.scale)[0]
        if r.arm == "pruned" and (r.finetune_steps or 0, r.recovery) != (f, kind):
            continue
        if r.arm in ARMS and ARMS[r.arm].per_recovery and (
                r.recovery != kind or (r.finetune_steps is not None and r.finetune_steps != f)):
            continue
        out.append(r)
    return out


def comparisons(runs: list[Run], windows: Windows | None = None,
                main: tuple[int, str] | None = None, spec=None) -> list[Comparison]:
    """Every pruned group against every control of its head count, paired by seed, on every eval set, before
    (finetune_steps 0) and after recovery fine-tune; then Holm's adjustment over each (scale, family)'s primary
    comparisons, whose verdicts become the adjusted ones. Primary: the PRIMARY method, scope, schedule and eval
    set, after the primary recovery (`primary_recovery`); the masked model before fine-tune is compared in that
    recovery's groups only (it is the same model in every other). `main`: the primary recovery (F, objective),
    from the sweep file; inferred from the runs when not given. With the sweep file (`spec`), a scale with its own
    recovery ladder has its primary recovery at the largest F of that ladder."""
    windows = windows or Windows(None)
    controls = control_runs(runs)
    sets = eval_sets(runs)
    main = main or primary_recovery(runs)
    out = []
    for key, by_seed in by_scale(pruned_groups(runs)):
        scale, family, ratio, method, scope, schedule, rec = (key.scale, key.family, key.ratio, key.method, key.scope,
                                                              key.schedule, key.recovery)  # by name
        first = by_seed[min(by_seed)]
        ft = first.finetune_steps or 0
        own = spec is not None and spec.scales and key.scale.scale in spec.scales
        is_main = (ft, rec) == ((spec.primary_recovery(key.scale.scale)[0], main[1]) if own else main)
        for arm in control_names():
            ctrl = controls_of(controls, arm, key, by_seed)
            seeds = sorted(set(by_seed) & set(ctrl))
            for ev in sets if seeds else []:
                for stage, steps in [("final", ft)] if ft == 0 or not is_main else [("pre_ft", 0), ("final", ft)]:
                    loss = M.loss(stage, ev)
                    paired_seeds = [s for s in seeds if loss in by_seed[s].metrics and M.loss(M.FINAL, ev) in
                                    ctrl[s].metrics and M.loss(M.DENSE, ev) in by_seed[s].metrics]
                    if not paired_seeds:
                        continue
                    pruned = [by_seed[s].metrics[loss] for s in paired_seeds]
                    control = [ctrl[s].metrics[M.loss(M.FINAL, ev)] for s in paired_seeds]
                    wd = _window_diffs([windows.get(by_seed[s], stage, ev) for s in paired_seeds],
                                       [windows.get(ctrl[s], "final", ev) for s in paired_seeds])
                    res = paired([c - p for c, p in zip(control, pruned)], *(wd or (None, None)))
                    tokens = by_seed[paired_seeds[0]].metrics.get(M.tokens(stage, ev))
                    verdict = verdict_of(res.ci95) if math.isfinite(res.mean) else "inconclusive"
                    out.append(Comparison(
                        scale=scale, family=family, ratio=ratio, heads_dense=_heads(first.tag("heads")),
                        heads_kept=_heads(first.tag("kept")), method=method, scope=scope, schedule=schedule,
                        finetune_steps=steps, control=arm, eval_set=ev,
                        primary=primary_values(method=method, scope=scope, schedule=schedule, eval_set=ev)
                        and steps == ft and is_main,
                        n_seeds=len(paired_seeds),
                        dense_loss=mean([by_seed[s].metrics[M.loss(M.DENSE, ev)] for s in paired_seeds]),
                        pruned_loss=mean(pruned), control_loss=mean(control), diff_mean=res.mean,
                        ci95=list(res.ci95) if res.ci95 else None, verdict=verdict, p_value=res.p, p_holm=None,
                        ci95_holm=None, verdict_raw=verdict, eval_tokens=int(tokens) if tokens is not None else None,
                        window_share=res.window_share, recovery=rec, stage=stage, group=other_axes(key)))
    _holm_adjust(out)
    return out


def _holm_adjust(rows: list[Comparison]) -> None:
    """Per (scale, family), the primary comparisons (ratios × controls) are one family of tests."""
    fams = defaultdict(list)
    for r in rows:
        if r.primary:
            fams[(r.scale, r.family)].append(r)
    for fam in fams.values():
        m = sum(r.p_value is not None for r in fam)
        for r, h in zip(fam, holm([r.p_value for r in fam], ALPHA)):
            if h is None:
                continue
            sim = _interval_at(r, 1 - ALPHA / m)
            r.ci95_simultaneous = list(sim) if sim else None
            r.p_holm = h.p_adjusted
            ci = _interval_at(r, h.level)
            r.ci95_holm = list(ci) if ci else None
            r.verdict = verdict_of(ci) if h.rejected else "inconclusive"


def _interval_at(row: Comparison, level: float) -> tuple[float, float] | None:
    """The row's interval at another confidence level (same standard error and degrees of freedom)."""
    from scipy import stats

    if row.ci95 is None:
        return None
    q95 = float(stats.t.ppf(0.975, row.n_seeds - 1))
    se = (row.ci95[1] - row.ci95[0]) / (2 * q95)
    half = float(stats.t.ppf(0.5 + level / 2, row.n_seeds - 1)) * se
    return (row.diff_mean - half, row.diff_mean + half)


# ------------------------------------------------------------------------------------------------ half (1)


def prunable(runs: list[Run], tolerance: float) -> list[Prunable]:
    """Half (1): per (scale, family, method, ratio, scope, schedule, eval set), mean pruned loss before fine-tune
    within tolerance of the same dense models' mean loss."""
    out = []
    sets = eval_sets(runs)
    for key, by_seed in by_scale(pruned_groups(runs)):
        scale, family, ratio, method, scope, schedule = _which(key)
        for ev in sets:
            rs = [r for r in by_seed.values() if M.loss(M.PRE_FT, ev) in r.metrics and M.loss(M.DENSE, ev) in r.metrics]
            if not rs:
                continue
            dense = mean([r.metrics[M.loss(M.DENSE, ev)] for r in rs])
            pruned = mean([r.metrics[M.loss(M.PRE_FT, ev)] for r in rs])
            out.append(Prunable(scale, family, method, ev, tolerance, ratio, scope, schedule, len(rs), dense, pruned,
                                "prunable" if within_tolerance(pruned, dense, tolerance) else "not_prunable",
                                other_axes(key)))
    return out


def _curve(r: Run, ev: str) -> dict[float, float]:
    pre = M.curve_prefix(ev)
    return {float(k[len(pre):]): v for k, v in r.metrics.items() if k.startswith(pre)}


def _point(key: tuple, ev: str, ratio: float, steps: int, vals: list[float]) -> CurvePoint:
    scale, family, method, scope, schedule, other = key
    ci = t_interval(vals)
    return CurvePoint(scale, family, method, ev, ratio, steps, mean(vals), list(ci) if ci else None, scope, schedule,
                      len(vals), dict(other))


def prune_curves(runs: list[Run]) -> list[CurvePoint]:
    """Loss vs fraction removed per (scale, family, method, scope, schedule, registered axes' values, eval set):
    the mask-only curve (finetune_steps 0; one per dense model, the ranking does not depend on the ratio swept)
    and the swept ratios after recovery fine-tune. Mean and t-interval over seeds."""
    out = []
    per = defaultdict(lambda: defaultdict(dict))  # (scale, ..., schedule, other axes) -> seed -> ratio -> run
    for key, by_seed in pruned_groups(runs).items():
        scale, family, ratio, method, scope, schedule = _which(key)
        for seed, r in by_seed.items():
            per[(scale, family, method, scope, schedule, tuple(other_axes(key).items()))][seed][ratio] = r
    for key, seeds in by_scale(per):
        for ev in eval_sets(runs):
            curves = [c for c in (_curve(by_ratio[min(by_ratio)], ev) for by_ratio in seeds.values()) if c]
            for ratio in sorted({x for c in curves for x in c}):
                out.append(_point(key, ev, ratio, 0, [c[ratio] for c in curves if ratio in c]))
            ft = defaultdict(list)
            for by_ratio in seeds.values():
                for ratio, r in by_ratio.items():
                    if M.loss(M.FINAL, ev) in r.metrics and r.finetune_steps > 0:
                        ft[(ratio, r.finetune_steps)].append(r.metrics[M.loss(M.FINAL, ev)])
            for (ratio, steps), vals in sorted(ft.items()):
                out.append(_point(key, ev, ratio, steps, vals))
    return out


def prunable_fractions(curves: list[CurvePoint], tolerance: float) -> dict:
    """(scale, family, method, scope, schedule, eval set, registered axes' values) -> the largest fraction
    removed up to which the mean mask-only curve stays within tolerance of dense (the curve's point 0)."""
    by = defaultdict(list)
    for c in curves:
        if c.finetune_steps == 0:
            by[(c.scale, c.family, c.method, c.scope, c.schedule, c.eval_set, tuple(c.group.items()))].append(c)
    out = {}
    for k, rows in by.items():
        rows.sort(key=lambda c: c.ratio)
        if rows[0].ratio == 0:
            out[k] = prunable_fraction([c.ratio for c in rows], [c.loss_mean for c in rows], rows[0].loss_mean,
                                       tolerance)
    return out


def best_methods(runs: list[Run]) -> dict:
    """(scale, family, ratio, scope, schedule, registered axes' values) -> (method, mean val loss after
    fine-tune): the best method is chosen on the validation set, never on an eval set."""
    by = defaultdict(dict)
    for key, by_seed in pruned_groups(runs).items():
        scale, family, ratio, method, scope, schedule = _which(key)
        vals = [r.metrics[M.loss(M.FINAL, "val")] for r in by_seed.values() if M.loss(M.FINAL, "val") in r.metrics]
        if vals:
            by[(scale, family, ratio, scope, schedule, tuple(other_axes(key).items()))][method] = mean(vals)
    return {k: min(v.items(), key=lambda kv: kv[1]) for k, v in by.items()}


def replication(comps: list[Comparison]) -> list[Replication]:
    """The primary comparison (method, scope, schedule) at the largest recovery budget compared, per (cell,
    family, ratio, control, registered axes' values), on every eval set: do the verdicts agree? (Disagreement
    would make a verdict a benchmark artifact.)"""
    ft = max((c.finetune_steps for c in comps), default=0)
    by = defaultdict(dict)
    for c in comps:
        if is_primary(c, "method", "scope", "schedule") and c.finetune_steps == ft:
            by[(c.scale, c.family, c.ratio, c.control, tuple(c.group.items()))][c.eval_set] = (c.verdict, c.diff_mean)
    return [Replication(*k[:4], per, len({v for v, _ in per.values()}) == 1, dict(k[4]))
            for k, per in sorted(by.items())]
