"""Trust diagnostics: is a scale's verdict about attention heads, or about models not trained enough to ask?

Each check looks at the sweep's own runs, per (cell, family), and ends in one of four states:

- `passed`: the check ran and the models meet it;
- `failed`: the check ran and they do not: the headline is "untrustworthy: <reasons>", never a verdict;
- `not_applicable`: the question does not arise (the smallest scale has no smaller one to be compared with);
- `could_not_run`: the sweep lacks what the check needs (an arm, a method, a budget, or a second seed): the headline
  is "unverified: <checks>", never a plain supported/refuted. Not tested is not passed.

The two comparisons with another model are non-inferiority tests with a declared margin (`trust.margin`, a fraction
of the reference model's loss, default 5%, the default prune tolerance: how much loss the sweep calls little): they
pass only when the 95% interval's upper bound of the difference is at most the margin. A model worse in every seed
fails, and so does one whose interval is too wide to show it is not materially worse: the burden of proof is on the
models being trained enough.

- `dense_vs_scratch_e`: dense − Scratch-E on `id` (paired by seed, 95% t-interval), at every ratio with a
  Scratch-E: upper bound ≤ margin × Scratch-E's mean loss. More heads trained for the same steps must not be
  materially worse, or the budget or learning rate is wrong for the dense model. That is a gate only while a
  mis-trained dense model could explain the gap: when every dense and Scratch-E run trained at its own searched
  rate and the scale's `converged` check passed, a dense model outside the margin is an answer (state `finding`):
  the extra heads hurt, and the headline reports it as a refutation of over-provisioning when the interval lies
  above 0.
- `larger_scale_not_worse`: a larger scale's dense model against every smaller scale of the same family trained for
  the same steps (the steps the runs record, not the budget's label; Welch's 95% interval of larger − smaller,
  unpaired): upper bound ≤ margin × the smaller's mean loss. No smaller scale at equal steps: not applicable.
- `informative_beats_random`: before fine-tune, heads chosen by the primary method must beat heads chosen at random
  (on `id`, one-shot, per_layer). One-shot scores and the seeded random draws are shared across a seed's ratios,
  so the (seed, ratio) pairs are not independent: each seed contributes one ratio, the ratios rotating over the
  seeds in order (seed i takes ratio i mod k). Random is a distribution: under the null the informed choice is one
  more random draw, its rank among the m draws uniform, independently per seed; the exact one-sided rank test
  passes at p < 0.05. (Runs with one draw each: a paired 95% t-interval over seeds, lower bound above 0.)
- `converged`: schedule-independent. The dense model at its budget T against the same model trained on its own full
  schedule to a smaller budget T' (the next smaller budget of a budget sweep, else the planned half-budget run of
  one seed, arm `dense_half`): the loss gained per doubling of the budget, (L(T') − L(T)) / L(T') / log2(T/T'), on
  `id`, paired by seed: the 95% t-interval of the per-seed gains must lie within ± `trust.doubling_gain` (default
  5%). One seed's half-budget run (the default `trust.half_budget: first`) gives a point estimate, never a pass:
  the check could not run (`trust.half_budget: every` plans one per seed). Rates: docs/design.md. A fit to the end of one run's loss
  curve cannot do this: a cosine schedule flattens every curve's end, however undertrained. The check is two-sided:
  a loss that gets worse by more than the threshold per doubling (overfitting, a diverged run) fails too.
- `finite`: every loss the report reads at the cell (final, before fine-tune, the dense reference) is a finite
  number. MLflow stores an infinity as ±1.8e308; `read.py` turns it back. Every other check that reads a non-finite
  loss fails with that reason, and the comparisons it enters get no interval.

Planted-null false-positive rates and powers of each: docs/design.md.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass

from lightning_modules.declarations import names as M
from orchestration.design.unit import HALF_ARM, Cell

from .stats import t_interval

EVAL_SET = "id"
PASSED, FAILED, NOT_APPLICABLE, COULD_NOT_RUN = "passed", "failed", "not_applicable", "could_not_run"
FINDING = "finding"  # a comparison that is not a gate at this cell but a result (dense_vs_scratch_e, see above)
STATES = (PASSED, FAILED, NOT_APPLICABLE, COULD_NOT_RUN, FINDING)
NONFINITE = "a loss is not a finite number"  # the reason a check gives when it read one


@dataclass(frozen=True)
class Diagnostic:
    scale: Cell
    family: str
    check: str
    state: str  # passed | failed | not_applicable | could_not_run
    detail: str
    margin: float | None = None  # the absolute margin (nats) or threshold the check used
    reason: str | None = None  # a failed check's reason when it is not the check's usual one (SHORT)
    headline: str | None = None  # a finding: what the headline says of it

    @property
    def passed(self) -> bool | None:
        """True/False when the check ran; None when it did not apply or could not run (or is a finding)."""
        return {PASSED: True, FAILED: False}.get(self.state)

    def to_json(self) -> dict:
        d = {**asdict(self), "passed": self.passed}
        return {k: v for k, v in d.items() if v is not None or k not in ("reason", "headline")}


def finite(x: float) -> bool:
    return math.isfinite(x)


def _nonfinite(label: str, by_seed: dict, key: str | None = None) -> list[str]:
    """'label seed s: value' for every run of `by_seed` whose loss `key` is not finite."""
    key = key or _key()
    return [f"{label} seed {s}: {r.metrics[key]}" for s, r in sorted(by_seed.items()) if not finite(r.metrics[key])]


def _broken(scale, family, name, bad: list[str]) -> Diagnostic:
    return Diagnostic(scale, family, name, FAILED, "non-finite loss: " + ", ".join(bad), reason=NONFINITE)


def _key() -> str:
    return M.loss(M.FINAL, EVAL_SET)


def _dense(runs, scale: Cell, family: str, arm: str = "dense") -> dict:
    return {r.seed: r for r in runs if (r.arm, r.scale, r.family) == (arm, scale, family) and _key() in r.metrics}


def _combine(scale, family, name, failed: bool, short: list, parts: list, used: list) -> Diagnostic:
    """A check over several comparisons: failed when any that ran failed (a comparison that could not run never
    hides one that failed); else could not run when any could not; else passed."""
    state = FAILED if failed else COULD_NOT_RUN if short else PASSED
    return Diagnostic(scale, family, name, state, "; ".join(parts + short), max(used) if used else None)


# a dense model worse than Scratch-E by more than this many margins (the interval's lower bound) stays a failed gate
# where it could be a finding: likelier a broken run (stuck on a plateau, which `converged` passes) than an answer
FINDING_CAP = 3
RANGE_EDGE = 0.05  # a searched rate this close (a fraction of the log-range) to an end of its search: not bracketed


def searched_rates(runs, scale: Cell, family: str, search: tuple[float, float] | None = None) -> bool:
    """Every dense and per-layer Scratch-E run at the cell (what dense_vs_scratch_e reads) trained at the rate the
    sweep's search found for its architecture, and, given the search's (low, high), none at the edge of that
    range (a search that did not bracket its optimum did not give the architecture its rate)."""
    mine = [r for r in runs if (r.scale, r.family) == (scale, family)
            and (r.arm == "dense" or (r.arm == "scratch_e" and r.scope == "per_layer"))]
    if not mine or not all(str(r.params.get("lr_source", "")).startswith("searched") for r in mine):
        return False
    if search is None:
        return True
    lo, hi = (math.log(x) for x in search)
    edge = RANGE_EDGE * (hi - lo)
    try:
        return all(lo + edge < math.log(float(r.params["lr"])) < hi - edge for r in mine)
    except (KeyError, ValueError):
        return False


def _bracketed(rates: dict[float, float]) -> tuple[bool, float]:
    """(whether the rate of the lowest loss lies strictly inside the rates tried, that rate); rates: {rate: loss}."""
    best = min(rates, key=lambda lr: (rates[lr], lr))
    return min(rates) < best < max(rates), best


def search_brackets(searches, scale: Cell, family: str) -> Diagnostic:
    """`lr_search_brackets`: every architecture's searched rate lies strictly inside the rates its search tried
    (not the range it declared: a search of five draws inside 2.6e-3 … 5.2e-3 of a declared 1e-3 … 1e-2 tried
    neither end). A best rate at the lowest or highest tried is not an optimum found."""
    name = "lr_search_brackets"
    if searches is None:
        return Diagnostic(scale, family, name, COULD_NOT_RUN, "the learning-rate candidates were not read")
    by = defaultdict(dict)
    for r in searches:
        if (r.scale.scale, r.family) == (scale.scale, family) and M.VAL_LOSS in r.metrics and "lr" in r.params:
            by[f"{r.tag('heads')}x{r.params.get('head_dim', '?')}"][float(r.params["lr"])] = r.metrics[M.VAL_LOSS]
    if not by:
        return Diagnostic(scale, family, name, NOT_APPLICABLE, "no learning-rate search at this scale")
    parts, edge = [], []
    for arch, rates in sorted(by.items()):
        if len(rates) < 3:
            edge.append(arch)
            parts.append(f"{arch}: {len(rates)} rate(s) tried, a bracket needs 3")
            continue
        ok, best = _bracketed(rates)
        parts.append(f"{arch}: best {best:.3g} of {len(rates)} tried ({min(rates):.3g} … {max(rates):.3g})"
                     + ("" if ok else " — at the edge"))
        if not ok:
            edge.append(arch)
    detail = "; ".join(parts) + (f" — not bracketed: {', '.join(edge)}" if edge else "")
    return Diagnostic(scale, family, name, FAILED if edge else PASSED, detail)


def recovery_brackets(runs, scale: Cell, family: str) -> Diagnostic:
    """`recovery_rate_brackets`: every recovered prune whose rate was chosen on val chose one strictly inside the
    rates it tried (the grid and any tried past its edge)."""
    name = "recovery_rate_brackets"
    prefix = M.finetune_val_loss("")
    chosen = []
    for r in runs:
        if (r.arm, r.scale, r.family) == ("pruned", scale, family) and (r.finetune_steps or 0) > 0:
            rates = {float(k[len(prefix):]): v for k, v in r.metrics.items() if k.startswith(prefix)}
            if len(rates) >= 2:
                chosen.append((r, rates))
    if not chosen:
        return Diagnostic(scale, family, name, NOT_APPLICABLE, "no recovery rate chosen from a grid at this scale")
    edge = [(r, rates) for r, rates in chosen if len(rates) < 3 or not _bracketed(rates)[0]]
    detail = f"{len(chosen) - len(edge)} of {len(chosen)} recovered prunes chose a rate strictly inside those tried"
    if edge:
        names = ", ".join(sorted(r.name for r, _ in edge)[:4]) + (" …" if len(edge) > 4 else "")
        detail += f" — at the edge: {names}"
    return Diagnostic(scale, family, name, FAILED if edge else PASSED, detail)


def scratch_b_charged(runs, scale: Cell, family: str, charged_rates: int | None) -> Diagnostic:
    """`scratch_b_charged`: no recovered prune trained more recovery steps (`cost/recovery_steps`: F for every rate
    it tried, past the grid's edge included) than its Scratch-B was charged (F for each of the `charged_rates`
    the plan counted: the grid, or the one fixed rate). A prune that tried more rates spent compute its Scratch-B
    never got, which favours the pruned arm in that comparison."""
    name = "scratch_b_charged"
    if not any((r.arm, r.scale, r.family) == ("scratch_b", scale, family) for r in runs):
        return Diagnostic(scale, family, name, NOT_APPLICABLE, "no Scratch-B at this scale")
    if charged_rates is None:
        return Diagnostic(scale, family, name, COULD_NOT_RUN, "the sweep's spec was not read: the rates Scratch-B "
                                                             "was charged for are unknown")
    key = M.cost("recovery_steps")
    pruned = [r for r in runs if (r.arm, r.scale, r.family) == ("pruned", scale, family)
              and (r.finetune_steps or 0) > 0 and key in r.metrics]
    if not pruned:
        return Diagnostic(scale, family, name, NOT_APPLICABLE, "no recovered prune at this scale")
    over = [(r, r.metrics[key] / (r.finetune_steps * charged_rates)) for r in pruned
            if r.metrics[key] > r.finetune_steps * charged_rates]
    detail = (f"{len(pruned) - len(over)} of {len(pruned)} recovered prunes trained no more recovery steps than "
              f"Scratch-B was charged ({charged_rates} rate(s) × F)")
    if over:
        worst = max(over, key=lambda x: x[1])
        detail += (f" — {len(over)} trained more (up to {worst[1]:.2f}× the charge, {worst[0].name}): their "
                   "Scratch-B comparison gives the pruned arm extra compute")
    return Diagnostic(scale, family, name, FAILED if over else PASSED, detail)


def dense_vs_scratch_e(runs, scale: Cell, family: str, margin: float, gate: bool = True) -> Diagnostic:
    """`gate` False (every architecture at its own searched rate, the dense model converged): a dense model outside
    the margin is a finding, not a failed check."""
    name = "dense_vs_scratch_e"
    dense = _dense(runs, scale, family)
    ctrl = defaultdict(dict)
    for r in runs:
        if (r.arm, r.scale, r.family, r.scope) == ("scratch_e", scale, family, "per_layer") and _key() in r.metrics:
            ctrl[r.ratio][r.seed] = r
    if not ctrl:
        return Diagnostic(scale, family, name, COULD_NOT_RUN, "no Scratch-E control in the sweep")
    bad_runs = _nonfinite("dense", dense) + [x for ratio, by in sorted(ctrl.items())
                                             for x in _nonfinite(f"Scratch-E r{ratio:g}", by)]
    if bad_runs:
        return _broken(scale, family, name, bad_runs)
    parts, failed, short, used, found = [], False, [], [], []
    for ratio, by_seed in sorted(ctrl.items()):
        seeds = sorted(set(dense) & set(by_seed))
        d = [dense[s].metrics[_key()] - by_seed[s].metrics[_key()] for s in seeds]
        ci = t_interval(d)
        if ci is None:
            short.append(f"r{ratio:g}: {len(seeds)} paired seed(s), an interval needs 2")
            continue
        m = margin * statistics.fmean(by_seed[s].metrics[_key()] for s in seeds)
        used.append(m)
        bad = ci[1] > m
        capped = not gate and ci[0] > FINDING_CAP * m
        text = f"dense − Scratch-E r{ratio:g} {statistics.fmean(d):+.4f} [{ci[0]:+.4f}, {ci[1]:+.4f}]"
        if bad and not gate and not capped:
            found.append(text + (": the extra heads hurt the dense model (against over-provisioning)" if ci[0] > 0
                                 else ": the extra heads are not shown to help, nor to hurt"))
        failed |= bad and (gate or capped)
        parts.append(f"{text}, margin {m:.4f}" + (
            "" if not bad else
            f" — dense worse by more than {FINDING_CAP}× the margin: a broken dense run is likelier than an answer"
            if capped else " — dense is not shown to be within the margin of Scratch-E" if gate else
            " — a finding, not a gate: every architecture trained at its own searched rate and dense converged"))
    if found and not failed and not short:
        return Diagnostic(scale, family, name, FINDING, "; ".join(parts), max(used),
                          headline="dense vs Scratch-E is a finding here (each architecture at its own searched "
                                   "rate, dense converged): " + "; ".join(found))
    return _combine(scale, family, name, failed, short, parts, used)


def larger_scale_not_worse(runs, scale: Cell, family: str, order: list[Cell], margin: float) -> Diagnostic:
    from scipy import stats

    name = "larger_scale_not_worse"

    def losses(cell):
        return [r.metrics[_key()] for r in _dense(runs, cell, family).values()]

    def steps(cell):  # what the dense runs trained, not the budget's label (a cell with one budget has none)
        return {_steps(r) for r in _dense(runs, cell, family).values()} - {None}

    mine_steps = steps(scale)
    below = [s for s in order[:order.index(scale)] if s.scale != scale.scale] if scale in order else []
    # runs that record no steps (older stores): matched on the budget's label, as before
    smaller = [s for s in below if steps(s) == mine_steps and (mine_steps or s.budget == scale.budget)]
    if not smaller:
        other = sorted({n for s in below for n in steps(s)})
        return Diagnostic(scale, family, name, NOT_APPLICABLE,
                          "no smaller scale trained for the same steps in the sweep"
                          + (f" (this scale {', '.join(map(str, sorted(mine_steps)))}; smaller ones "
                             f"{', '.join(map(str, other))})" if other else ""))
    bad_runs = [x for c in [scale, *smaller] for x in _nonfinite(f"{c} dense", _dense(runs, c, family))]
    if bad_runs:
        return _broken(scale, family, name, bad_runs)
    mine = losses(scale)
    parts, failed, short, used = [], False, [], []
    for s in smaller:
        other = losses(s)
        if len(mine) < 2 or len(other) < 2:
            short.append(f"vs {s}: {len(mine)} and {len(other)} seed(s), an interval needs 2 of each")
            continue
        lo, hi = stats.ttest_ind(mine, other, equal_var=False).confidence_interval(0.95)
        m = margin * statistics.fmean(other)
        used.append(m)
        bad = hi > m
        failed |= bad
        parts.append(f"vs {s} (both {', '.join(map(str, sorted(mine_steps)))} steps): dense {statistics.fmean(mine):.4f} against {statistics.fmean(other):.4f} "
                     f"({statistics.fmean(mine) - statistics.fmean(other):+.4f} [{lo:+.4f}, {hi:+.4f}], margin "
                     f"{m:.4f})" + (f" — not shown to be within the margin of {s}" if bad else ""))
    return _combine(scale, family, name, failed, short, parts, used)


def rank_test(counts: list[tuple[float, int]]) -> float:
    """One-sided exact p-value that an informed choice is no better than random ones. `counts` holds, per
    independent pair, how many of m random draws scored a lower loss than the informed choice (ties count ½) and m.
    Under the null the informed choice is one more random draw, so its count is uniform on 0..m, independently per
    pair; p = P(Σ counts ≤ observed), by convolving those uniforms (half counts on a doubled grid)."""
    dist = {0: 1.0}
    for _, m in counts:
        step = {2 * k: 1.0 / (m + 1) for k in range(m + 1)}
        new: dict[int, float] = {}
        for a, pa in dist.items():
            for b, pb in step.items():
                new[a + b] = new.get(a + b, 0.0) + pa * pb
        dist = new
    observed = round(2 * sum(c for c, _ in counts))
    return sum(p for v, p in dist.items() if v <= observed)


def one_ratio_per_seed(seeds: list[int], ratios_of: dict) -> list[tuple[int, float]]:
    """(seed, ratio): seed i of the sorted seeds takes its i-th ratio mod k, of the ratios it has in sorted order."""
    out = []
    for i, seed in enumerate(sorted(seeds)):
        rs = sorted(ratios_of[seed])
        if rs:
            out.append((seed, rs[i % len(rs)]))
    return out


def informative_beats_random(runs, scale: Cell, family: str, method: str) -> Diagnostic:
    name = "informative_beats_random"
    key = M.loss(M.PRE_FT, EVAL_SET)
    by = defaultdict(lambda: defaultdict(dict))  # method -> seed -> ratio -> loss, or the random draws' losses
    for r in runs:
        if (r.arm, r.scale, r.family, r.scope, r.schedule) == ("pruned", scale, family, "per_layer", "one_shot") \
                and r.prune_at == 1.0 and r.method in (method, "random") and key in r.metrics:
            draws = sorted((int(k.rsplit("draw", 1)[1]), v) for k, v in r.metrics.items()
                           if k.startswith(M.random_draw(EVAL_SET)))
            by[r.method][r.seed][r.ratio] = [v for _, v in draws] if r.method == "random" and draws \
                else r.metrics[key]
    bad_runs = [f"{m} seed {seed} r{ratio:g}: {v}" for m, seeds in sorted(by.items())
                for seed, ratios in sorted(seeds.items()) for ratio, v in sorted(ratios.items())
                if not all(finite(x) for x in (v if isinstance(v, list) else [v]))]
    if bad_runs:
        return _broken(scale, family, name, bad_runs)
    if method not in by or "random" not in by:
        missing = "random" if "random" not in by else method
        return Diagnostic(scale, family, name, COULD_NOT_RUN, f"no per_layer one_shot {missing} prune in the sweep")
    seeds = sorted(set(by[method]) & set(by["random"]))
    common = {s: set(by[method][s]) & set(by["random"][s]) for s in seeds}
    pairs = [(seed, r, by[method][seed][r], by["random"][seed][r]) for seed, r in one_ratio_per_seed(seeds, common)]
    if not pairs:
        return Diagnostic(scale, family, name, COULD_NOT_RUN, "no seed has both")
    which = ", ".join(f"seed {s} r{r:g}" for s, r, _, _ in pairs)
    if all(isinstance(rand, list) and len(rand) > 1 for *_, rand in pairs):
        counts = [(sum(1.0 if x < inf else 0.5 if x == inf else 0.0 for x in rand), len(rand)) for *_, inf, rand in pairs]
        best = rank_test([(0, m) for _, m in counts])  # the smallest p-value these seeds and draws can give
        if best >= 0.05:
            return Diagnostic(scale, family, name, COULD_NOT_RUN,
                              f"{len(pairs)} seed(s) × {counts[0][1]} random draws: even an informed choice below "
                              f"every draw gives p = {best:.3g}, so the test cannot pass (it needs more seeds)")
        p = rank_test(counts)
        diff = statistics.fmean(statistics.fmean(rand) - inf for *_, inf, rand in pairs)
        ok = p < 0.05 and diff > 0
        below = sum(c for c, _ in counts)
        detail = (f"{below:g} of {sum(m for _, m in counts)} random draws beat {method} before fine-tune "
                  f"(one ratio per seed: {which}); exact rank test p = {p:.3g}; random − {method} {diff:+.4f} on "
                  f"average" + ("" if ok else f" — {method} is not clearly better than random"))
        return Diagnostic(scale, family, name, PASSED if ok else FAILED, detail)
    diffs = [(statistics.fmean(rand) if isinstance(rand, list) else rand) - inf for *_, inf, rand in pairs]
    ci = t_interval(diffs)
    if ci is None:
        return Diagnostic(scale, family, name, COULD_NOT_RUN, "one seed: an interval needs 2")
    ok = ci[0] > 0
    detail = (f"random − {method} before fine-tune {statistics.fmean(diffs):+.4f} [{ci[0]:+.4f}, {ci[1]:+.4f}] over "
              f"{len(diffs)} seeds ({which})" + ("" if ok else f" — {method} is not clearly better than random"))
    return Diagnostic(scale, family, name, PASSED if ok else FAILED, detail)


def doubling_gain(short: float, long: float, t_short: int, t_long: int) -> float:
    """Relative loss gained per doubling of the budget from t_short to t_long steps (each on its own schedule)."""
    return (short - long) / short / math.log2(t_long / t_short)


def _steps(r) -> int | None:
    try:
        return int(r.params["steps"])
    except (KeyError, ValueError):
        return None


def converged(runs, scale: Cell, family: str, order: list[Cell], threshold: float) -> Diagnostic:
    name = "converged"
    dense = _dense(runs, scale, family)
    t_long = {_steps(r) for r in dense.values()} - {None}
    if not dense or len(t_long) != 1:
        return Diagnostic(scale, family, name, COULD_NOT_RUN, "no dense run with its budget recorded")
    T = t_long.pop()
    # the next smaller budget of the same scale (a budget sweep), else the planned half-budget run
    smaller = [c for c in order if c.scale == scale.scale and c != scale
               and {_steps(r) for r in _dense(runs, c, family).values()} and
               max(_steps(r) or 0 for r in _dense(runs, c, family).values()) < T]
    if smaller:
        ref_cell = max(smaller, key=lambda c: max(_steps(r) or 0 for r in _dense(runs, c, family).values()))
        ref, what = _dense(runs, ref_cell, family), f"the {ref_cell} dense runs"
    else:
        ref, what = _dense(runs, scale, family, HALF_ARM), "the half-budget dense run"
    seeds = sorted(set(ref) & set(dense))
    if not seeds:
        return Diagnostic(scale, family, name, COULD_NOT_RUN, "no smaller budget and no half-budget dense run "
                                                              "finished")
    t_short = {_steps(ref[s]) for s in seeds}
    if len(t_short) != 1 or None in t_short or next(iter(t_short)) >= T:
        return Diagnostic(scale, family, name, COULD_NOT_RUN, f"{what} record no smaller budget")
    T0 = t_short.pop()
    bad_runs = _nonfinite("dense", {s: dense[s] for s in seeds}) + _nonfinite(what, {s: ref[s] for s in seeds})
    if bad_runs:
        return _broken(scale, family, name, bad_runs)
    gains = [doubling_gain(ref[s].metrics[_key()], dense[s].metrics[_key()], T0, T) for s in seeds]
    short = statistics.fmean(ref[s].metrics[_key()] for s in seeds)
    long = statistics.fmean(dense[s].metrics[_key()] for s in seeds)
    gain = statistics.fmean(gains)
    head = (f"{T0} → {T} steps (each on its own schedule; {what}, {len(seeds)} seed(s)): {EVAL_SET} loss "
            f"{short:.4f} → {long:.4f}, {gain:.1%} per doubling of the budget")
    ci = t_interval(gains)
    if ci is None:  # one seed: a point estimate, which the rule of this module never passes on
        return Diagnostic(scale, family, name, COULD_NOT_RUN,
                          head + f" from one seed — a point estimate, no interval (band ±{threshold:.0%}); plan "
                          "every seed's half-budget run (trust.half_budget: every)", threshold)
    lo, hi = ci
    worse = gain < -threshold  # two-sided: more training made it worse (overfitting, divergence)
    ok = -threshold <= lo and hi <= threshold  # the interval, not the mean, inside the band
    detail = (head + f" [{lo:+.1%}, {hi:+.1%}] (95% t-interval over seeds, paired; band ±{threshold:.0%})"
              + ("" if ok else " — worse with more training" if worse else
                 " — not shown to gain less than the band per doubling" if hi > threshold else
                 " — not shown not to get worse with more training"))
    return Diagnostic(scale, family, name, PASSED if ok else FAILED, detail, threshold,
                      reason=WORSE if worse else None)


WORSE = "the dense loss gets worse with more training"


def finite_losses(runs, scale: Cell, family: str) -> Diagnostic:
    """Every loss the report reads at the cell (final, before fine-tune, the dense reference; every eval set) is a
    finite number."""
    name = "finite"
    keys = [k for k in {k for r in runs if (r.scale, r.family) == (scale, family) for k in r.metrics}
            if k.endswith("/loss") and k.split("/", 1)[0] in (M.FINAL, M.PRE_FT, M.DENSE)]
    bad = [f"{r.arm}{'' if r.method == 'none' else ' ' + r.method} seed {r.seed}: {k} {r.metrics[k]}"
           for r in runs if (r.scale, r.family) == (scale, family) for k in sorted(keys)
           if k in r.metrics and not finite(r.metrics[k])]
    if bad:
        return _broken(scale, family, name, bad)
    return Diagnostic(scale, family, name, PASSED, f"{len(keys)} loss metric(s) of every run finite")


def diagnose(runs, scale_families: list[tuple[Cell, str]], order: list[Cell], method: str, margin: float,
             threshold: float, search: tuple[float, float] | None = None, searches=None,
             every=None, charged_rates: int | None = None) -> list[Diagnostic]:
    """Every check at every (cell, family). `search`: the sweep's learning-rate search range (low, high), if any;
    `searches`: its finished candidates (None: not read; the bracket check then could not run, unless the sweep
    searched nothing); `every`: every run, of every recovery (the checks before fine-tune and of the recovery's
    rate read them all; default `runs`); `charged_rates`: the recovery rates the plan charged Scratch-B for per F
    (None: unknown)."""
    out = []
    every = runs if every is None else every
    for scale, family in scale_families:
        conv = converged(runs, scale, family, order, threshold)
        brackets = search_brackets(searches if search is not None else [], scale, family)
        gate = not (conv.state == PASSED and searched_rates(runs, scale, family, search)
                    and brackets.state != FAILED)
        out += [dense_vs_scratch_e(runs, scale, family, margin, gate),
                larger_scale_not_worse(runs, scale, family, order, margin),
                informative_beats_random(every, scale, family, method),
                conv, brackets, recovery_brackets(every, scale, family), scratch_b_charged(every, scale, family, charged_rates),
                finite_losses(runs, scale, family)]
    return out


SHORT = {
    "lr_search_brackets": "a learning-rate search's best rate is at the edge of the rates it tried",
    "recovery_rate_brackets": "a recovery's val-chosen rate is at the edge of the rates it tried",
    "scratch_b_charged": "a recovery tried more rates than its Scratch-B was charged for",
    "dense_vs_scratch_e": "the dense model is not shown to be within the margin of Scratch-E trained for the same "
                          "steps",
    "larger_scale_not_worse": "this scale's dense model is not shown to be within the margin of a smaller scale's",
    "informative_beats_random": "informed scoring is not clearly better than random before fine-tune",
    "converged": "the dense loss is not shown to have stopped improving with more training",
    "finite": NONFINITE,
}


def untrustworthy(diags: list[Diagnostic], scale: Cell, family: str) -> list[str]:
    """The reasons (failed checks) that make (scale, family) untrustworthy; empty when none failed."""
    return list(dict.fromkeys(d.reason or SHORT[d.check] for d in diags
                              if (d.scale, d.family) == (scale, family) and d.state == FAILED))


def findings(diags: list[Diagnostic], scale: Cell, family: str) -> list[str]:
    """What the checks that are results here (state `finding`) say for the headline."""
    return [d.headline for d in diags if (d.scale, d.family) == (scale, family) and d.state == FINDING]


def unverified(diags: list[Diagnostic], scale: Cell, family: str) -> list[str]:
    """The checks that could not run at (scale, family): its verdict is unverified."""
    return [d.check for d in diags if (d.scale, d.family) == (scale, family) and d.state == COULD_NOT_RUN]
