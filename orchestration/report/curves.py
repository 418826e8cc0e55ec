"""When a pruned start pays: the recovery curve — the pruned model after F recovery steps, at every F the sweep ran —
read in the two accountings a researcher deciding "prune the model I have, or train the small one?" needs.

Parent counted. The gap d(F) = control − pruned(F) (positive: pruning better) against Scratch-E (the pruned shape
trained from scratch for the dense run's T steps) and against Scratch-B(F) (trained to the compute of the whole
pruned arm recovered for F: the dense training counted). The rows are the report's primary comparisons at each F
(paired by seed, eval-window variance included: `trends.recovery_rows`). The **break-even** F* is where d crosses 0
going up: the first crossing of the mean gap, linear in log F between neighbouring budgets of the ladder. Its
interval inverts a band: the budgets where the gap's interval, at the Bonferroni level 1 − α/k over the k budgets
(simultaneous over the ladder), crosses 0 — from the F where its upper end first reaches 0 to the F where its lower
end does. An end the band does not reach inside the ladder is open ("beyond F = …" or "at or below the smallest
F"). The claim rests on the band, never on the point: `state` is `pays` when the band's lower end reaches 0 inside
the ladder (from that F on, pruning is not worse: shown at the simultaneous level), `parity` when only its upper end
does (pruning not shown worse from that F, nor shown as good), `worse` when the band lies below 0 at every F (not
reached by F = F_max), `mixed` when it reaches 0 and falls below again at a larger F (each claim "from F on" must
hold up to F_max). The mean's crossing F* is descriptive: with 3 seeds and 6 budgets a gap below 0 everywhere
still crosses by noise in more than half of simulated sweeps (docs/design.md).

Parent free. When the dense model exists already, its training is sunk: how many from-scratch steps of the pruned
shape does a pruned start's F steps stand for? For each seed, its own from-scratch learning curve of the pruned
shape — the `scratch_curve` runs, Scratch-E and every Scratch-B, all trained from scratch on the same data order —
made non-increasing (pool-adjacent-violators, over budgets in increasing order) and read linearly in log steps
gives S_s(F), the budget whose loss equals the seed's pruned(F). The **savings factor** is S/F (Minitron's "tokens
saved"): the geometric mean over seeds, with the Student-t interval of mean log(S_s/F). A seed whose pruned loss
lies below its longest from-scratch run (or above its shortest) has only a bound; then the row gives the bound and
no interval.

Planted-case rates (tests/test_curves.py, by simulation): docs/design.md."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field

from lightning_modules.declarations import names as M
from orchestration.design.axes import BY_NAME
from orchestration.design.unit import scale_rank

from .analysis import PRIMARY, _interval_at, group_of, is_primary, mean
from .read import Run
from .rows import Comparison, _without_empty_group, other_axes
from .stats import ALPHA, t_interval

FROM_SCRATCH = ("scratch_curve", "scratch_e", "scratch_b")  # the runs that train the pruned shape from scratch


@dataclass
class BreakEven:
    """One (cell, family, ratio, control, objective)'s recovery curve and where it reaches parity."""

    scale: str
    family: str
    ratio: float
    control: str
    recovery: str
    budgets: list[int]  # F, increasing
    diffs: list[float]  # control − pruned at each F
    ci: list[list[float] | None]  # each F's interval at `level`
    level: float  # 1 − α/k: simultaneous over the k budgets (Bonferroni)
    state: str  # pays | parity | worse | mixed (from the band; module docstring) | insufficient_seeds
    break_even: float | None  # F*, the mean gap's first upward crossing of 0 (descriptive; None when it has none)
    break_even_ci: list[float | None] | None  # [lower, upper] of F*; None at an open end
    note: str
    group: dict = field(default_factory=dict)  # as Comparison.group: the values of the axes registered since

    def to_json(self) -> dict:
        return _without_empty_group(asdict(self))


@dataclass
class Savings:
    """The parent-free accounting at one F: the from-scratch steps of the pruned shape whose loss the pruned start
    reaches, as a multiple of F."""

    scale: str
    family: str
    ratio: float
    finetune_steps: int
    n_seeds: int
    scratch_steps: list[float | None]  # S_s per seed (None: censored, see bound)
    factor: float | None  # geometric mean of S_s / F over seeds (None when a seed is censored)
    factor_ci95: list[float] | None
    bound: str | None  # "> x" / "< x" (a multiple of F) when some seed's S lies outside its curve
    curve_range: list[int]  # the from-scratch budgets the curves span
    group: dict = field(default_factory=dict)  # as Comparison.group

    def to_json(self) -> dict:
        return _without_empty_group(asdict(self))


# ------------------------------------------------------------------------------------------------ break-even


def _crossing(fs: list[int], ys: list[float]) -> float | None:
    """The first F (linear in log F between neighbours) at which ys goes from below 0 to 0 or above."""
    for (f0, y0), (f1, y1) in zip(zip(fs, ys), zip(fs[1:], ys[1:])):
        if y0 < 0 <= y1:
            t = -y0 / (y1 - y0)
            return math.exp(math.log(f0) + t * (math.log(f1) - math.log(f0)))
    return None


def _last_below(bands: list, end: int) -> int:
    """The index of the last budget whose band end (0: lower, 1: upper) lies below 0; -1 when none does."""
    return max((i for i, b in enumerate(bands) if b[end] < 0), default=-1)


def break_even(rows: list[Comparison], alpha: float = ALPHA) -> list[BreakEven]:
    """Per (cell, family, ratio, control, objective) with two or more budgets F > 0 on the primary comparison after
    recovery: the curve, its Bonferroni band and the break-even F* (module docstring)."""
    groups = defaultdict(list)
    for c in rows:
        if c.stage == "final" and c.finetune_steps > 0 and is_primary(c, "method", "scope", "schedule", "eval_set"):
            groups[(str(c.scale), c.family, c.ratio, c.control, c.recovery,
                    tuple(sorted((k, str(v)) for k, v in c.group.items())))].append(c)
    out = []
    for (scale, family, ratio, control, recovery, _), rs in sorted(groups.items(), key=lambda kv: (scale_rank(kv[0][0]), str(kv[0][1:]))):
        rs.sort(key=lambda c: c.finetune_steps)
        if len(rs) < 2:
            continue
        level = 1 - alpha / len(rs)
        fs, ds = [c.finetune_steps for c in rs], [c.diff_mean for c in rs]
        bands = [_interval_at(c, level) for c in rs]
        point = None if ds[0] >= 0 else _crossing(fs, ds)
        notes = [] if ds[0] < 0 else [f"the mean gap is at or above 0 at the smallest F = {fs[0]} already"]
        ci, state = None, "insufficient_seeds"
        if all(b is not None for b in bands):
            # a claim "from F on" must hold at every larger F of the ladder: each interval end is the crossing after
            # the last budget at which that band end lies below 0 (open when none does, or the last one does)
            lo_last, hi_last = _last_below(bands, 1), _last_below(bands, 0)
            lo_end = _crossing(fs[lo_last:lo_last + 2], [b[1] for b in bands[lo_last:lo_last + 2]]) \
                if 0 <= lo_last < len(bands) - 1 else None
            hi_end = _crossing(fs[hi_last:hi_last + 2], [b[0] for b in bands[hi_last:hi_last + 2]]) \
                if 0 <= hi_last < len(bands) - 1 else None
            ci = [lo_end, hi_end]
            reaches_lo = lo_last < len(bands) - 1
            reaches_hi = hi_last < len(bands) - 1
            state = "pays" if reaches_hi else "parity" if reaches_lo else "worse" if all(b[1] < 0 for b in bands) \
                else "mixed"
            if state == "mixed":
                notes.insert(0, "the band reaches 0 at some F and falls below it again at a larger F: no claim "
                                "from any F on")
            if state == "worse":
                notes.insert(0, f"not reached by F = {fs[-1]}: the gap's interval lies below 0 at every F")
            if lo_last == -1:
                notes.append(f"lower end at or below F = {fs[0]} (the smallest budget's interval reaches 0)")
            if hi_last == -1:
                notes.append(f"pruning shown not worse at the smallest F = {fs[0]} already")
            elif hi_end is None and state == "parity":
                notes.append(f"upper end beyond F = {fs[-1]} (no budget shows pruning not worse)")
        else:
            notes.append("fewer than two seeds at some F: no interval")
        if point is not None and any(d < 0 for f, d in zip(fs, ds) if f > point):
            notes.append("the mean gap falls below 0 again at a larger F")
        out.append(BreakEven(scale, family, ratio, control, recovery, fs, ds,
                             [list(b) if b else None for b in bands], level, state, point, ci, "; ".join(notes),
                             dict(rs[0].group)))
    return out


# ------------------------------------------------------------------------------------------------ savings


def non_increasing(ys: list[float]) -> list[float]:
    """The least-squares non-increasing fit of ys (pool-adjacent-violators, equal weights)."""
    blocks: list[list[float]] = []  # [sum, count]
    for y in ys:
        blocks.append([y, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] < blocks[-1][0] / blocks[-1][1]:
            s, n = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += n
    out = []
    for s, n in blocks:
        out += [s / n] * n
    return out


def steps_for_loss(budgets: list[int], losses: list[float], target: float) -> tuple[float | None, str | None]:
    """The from-scratch budget at which the non-increasing curve through (budgets, losses) reaches `target` (linear
    in log steps); (None, ">") when the target is below the curve's end, (None, "<") above its start."""
    fit = non_increasing(losses)
    if target < fit[-1]:
        return None, ">"
    if target > fit[0]:
        return None, "<"
    for (b0, y0), (b1, y1) in zip(zip(budgets, fit), zip(budgets[1:], fit[1:])):
        if y1 <= target <= y0:
            if y0 == y1:
                return float(b0), None
            t = (y0 - target) / (y0 - y1)
            return math.exp(math.log(b0) + t * (math.log(b1) - math.log(b0))), None
    return float(budgets[-1]), None


def savings(runs: list[Run]) -> list[Savings]:
    """Per (cell, family, ratio, F) of the primary method's per-layer one-shot prunes by the LM loss: the savings
    factor (module docstring), on the primary eval set."""
    key = M.loss(M.FINAL, PRIMARY["eval_set"])
    curves = defaultdict(dict)  # (cell, family, ratio, seed, own values) -> steps -> loss
    pruned = defaultdict(dict)  # (cell, family, ratio, F, the group's other axes) -> seed -> loss
    for r in runs:
        if key not in r.metrics or r.ratio is None:
            continue
        if r.arm in FROM_SCRATCH and r.scope == "per_layer":
            if "steps" in r.params:  # the steps it trained (a run that does not record them is no curve point)
                curves[(r.scale, r.family, r.ratio, r.seed, _own(r))][int(round(float(r.params["steps"])))] = \
                    r.metrics[key]
        elif (r.arm == "pruned" and r.prune_at == 1.0 and r.recovery == "lm" and (r.finetune_steps or 0) > 0
              and is_primary(r, "method", "scope", "schedule")):
            other = tuple(other_axes(group_of(r)).items()) if r.group is not None else ()
            if r.seed in pruned[(r.scale, r.family, r.ratio, r.finetune_steps, other)]:
                raise ValueError(f"two pruned runs of seed {r.seed} share the savings group of {r.name}")
            pruned[(r.scale, r.family, r.ratio, r.finetune_steps, other)][r.seed] = r.metrics[key]
    out = []
    order = lambda kv: (scale_rank(kv[0][0]), kv[0][1], kv[0][2], kv[0][3], str(kv[0][4]))  # noqa: E731 (F as a number)
    for (scale, family, ratio, f, other), by_seed in sorted(pruned.items(), key=order):
        steps, logs, marks, spans = [], [], [], []
        # the curve of a registered axis declared with one control per value is that value's
        own = _per_value(other)
        for seed, loss in sorted(by_seed.items()):
            curve = {b: v for b, v in curves.get((scale, family, ratio, seed, own), {}).items() if math.isfinite(v)}
            if len(curve) < 2 or not math.isfinite(loss):  # a broken run gives its seed no value (`finite` says so)
                continue
            budgets = sorted(curve)
            spans += [budgets[0], budgets[-1]]
            s, mark = steps_for_loss(budgets, [curve[b] for b in budgets], loss)
            steps.append(s)
            if s is None:
                marks.append((mark, (budgets[-1] if mark == ">" else budgets[0]) / f))
            else:
                logs.append(math.log(s / f))
        if not steps:
            continue
        factor = ci = bound = None
        if marks:  # the geometric mean with each censored seed at its bound bounds the factor (one way)
            kinds = {m for m, _ in marks}
            at_bounds = math.exp(mean(logs + [math.log(x) for _, x in marks]))
            bound = f"{kinds.pop()} {at_bounds:.3g}" if len(kinds) == 1 else "outside the curve both ways"
        else:
            factor = math.exp(mean(logs))
            band = t_interval(logs)
            ci = [math.exp(band[0]), math.exp(band[1])] if band else None
        out.append(Savings(str(scale), family, ratio, f, len(steps), steps, factor, ci, bound,
                           [min(spans), max(spans)], dict(other)))
    return out


def _per_value(pairs) -> tuple:
    """Of (axis, value) pairs, those of the registered axes declared with one control per value."""
    return tuple((a, v) for a, v in pairs if a in BY_NAME and BY_NAME[a].controls == "each")


def _own(r: Run) -> tuple:
    """A from-scratch run's values of the registered axes it carries (one control per value); () for the others."""
    return _per_value(other_axes(group_of(r)).items()) if r.group is not None else ()
