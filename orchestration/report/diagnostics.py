"""Trust diagnostics: is a scale's verdict about attention heads, or about models not trained enough to ask?

Each check looks at the sweep's own runs, per (scale, family), and passes, fails, or is not tested (None: the sweep
lacks what it needs). A failed check turns that scale's headline into "untrustworthy: <reason>": no verdict is
printed on models that cannot carry one.

- `dense_vs_scratch_e`: the dense model must not be worse than a smaller model (Scratch-E: fewer heads, same head
  size) trained from scratch for the same steps. Fails when dense − Scratch-E on `id`, paired by seed, has its 95%
  t-interval above 0 at some ratio: more heads hurt, the budget or the learning rate is wrong for the dense model.
- `larger_scale_not_worse`: a larger scale's dense model must not be worse than a smaller scale's of the same
  family on the same data. Fails when larger − smaller (Welch's 95% interval, unpaired) lies above 0.
- `informative_beats_random`: before fine-tune, heads chosen by the primary method must beat heads chosen at
  random, on `id`, at every swept ratio, per seed (the same dense model). Random is a distribution: each random
  prune evaluates several draws, and under the null hypothesis (informed is no better than random) the informed
  choice is one more draw, its rank among them uniform. An exact one-sided rank test over all (seed, ratio) pairs
  fails the check unless p < 0.05. (Runs with one draw each fall back to a paired 95% t-interval over seeds.) If
  it does not matter which heads go, heads do not matter yet, and a prune-vs-scratch comparison says nothing about
  them.
- `converged`: the dense runs' training loss, fitted by a line over the last 20% of steps, must not fall by more
  than the sweep's `trust.final_drop` across that stretch (mean over seeds): a model still improving fast would
  rank the arms differently with more training.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass

from ..plan import split_label
from .stats import t_interval

EVAL_SET = "id"
LAST_FRACTION = 0.2


@dataclass(frozen=True)
class Diagnostic:
    scale: str
    family: str
    check: str
    passed: bool | None  # None: not tested
    detail: str

    def to_json(self) -> dict:
        return asdict(self)


def _loss(r, key: str) -> float | None:
    return r.metrics.get(key)


def dense_vs_scratch_e(runs, scale: str, family: str) -> Diagnostic:
    dense = {r.seed: r for r in runs if (r.arm, r.scale, r.family) == ("dense", scale, family)}
    ctrl = defaultdict(dict)
    for r in runs:
        if (r.arm, r.scale, r.family, r.scope) == ("scratch_e", scale, family, "per_layer"):
            ctrl[r.ratio][r.seed] = r
    key = f"final/{EVAL_SET}/loss"
    parts, failed, tested = [], False, False
    for ratio, by_seed in sorted(ctrl.items()):
        seeds = [s for s in sorted(set(dense) & set(by_seed))
                 if _loss(dense[s], key) is not None and _loss(by_seed[s], key) is not None]
        if not seeds:
            continue
        d = [dense[s].metrics[key] - by_seed[s].metrics[key] for s in seeds]
        ci = t_interval(d)
        mean = statistics.fmean(d)
        if ci is None:
            parts.append(f"r{ratio:g}: dense − Scratch-E {mean:+.4f} (one seed, not tested)")
            continue
        tested = True
        worse = ci[0] > 0
        failed |= worse
        parts.append(f"r{ratio:g}: dense − Scratch-E {mean:+.4f} [{ci[0]:+.4f}, {ci[1]:+.4f}]"
                     + (" — dense is worse" if worse else ""))
    if not parts:
        return Diagnostic(scale, family, "dense_vs_scratch_e", None, "not tested: no Scratch-E control")
    return Diagnostic(scale, family, "dense_vs_scratch_e", (not failed) if tested else None, "; ".join(parts))


def larger_scale_not_worse(runs, scale: str, family: str, order: list[str]) -> Diagnostic:
    from scipy import stats

    key = f"final/{EVAL_SET}/loss"

    def losses(sc):
        return [r.metrics[key] for r in runs if (r.arm, r.scale, r.family) == ("dense", sc, family)
                and key in r.metrics]

    mine = losses(scale)
    budget = split_label(scale)[1]  # budgets of a scale are compared with the same budget of smaller scales
    smaller = [s for s in order[:order.index(scale)] if split_label(s)[1] == budget and split_label(s)[0] !=
               split_label(scale)[0] and losses(s)] if scale in order else []
    if not smaller or not mine:
        return Diagnostic(scale, family, "larger_scale_not_worse", None, "not tested: no smaller scale in the sweep")
    parts, failed, tested = [], False, False
    for s in smaller:
        other = losses(s)
        diff = statistics.fmean(mine) - statistics.fmean(other)
        if len(mine) < 2 or len(other) < 2:
            parts.append(f"vs {s}: {diff:+.4f} (one seed, not tested)")
            continue
        tested = True
        lo, hi = stats.ttest_ind(mine, other, equal_var=False).confidence_interval(0.95)
        worse = lo > 0
        failed |= worse
        parts.append(f"vs {s}: dense {statistics.fmean(mine):.4f} against {statistics.fmean(other):.4f} "
                     f"({diff:+.4f} [{lo:+.4f}, {hi:+.4f}])" + (f" — worse than {s}" if worse else ""))
    return Diagnostic(scale, family, "larger_scale_not_worse", (not failed) if tested else None, "; ".join(parts))


def rank_test(counts: list[tuple[float, int]]) -> float:
    """One-sided exact p-value that an informed choice is no better than random ones. `counts` holds, per (seed,
    ratio), how many of m random draws scored a lower loss than the informed choice (ties count ½) and m. Under the
    null the informed choice is one more random draw, so its count is uniform on 0..m, independently per pair;
    p = P(Σ counts ≤ observed), by convolving those uniforms (half counts on a doubled grid)."""
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


def informative_beats_random(runs, scale: str, family: str, method: str) -> Diagnostic:
    key = f"pre_ft/{EVAL_SET}/loss"
    by = defaultdict(lambda: defaultdict(dict))  # method -> seed -> ratio -> loss, or the random draws' losses
    for r in runs:
        if (r.arm, r.scale, r.family, r.scope, r.schedule) == ("pruned", scale, family, "per_layer", "one_shot") \
                and r.prune_at == 1.0 and r.method in (method, "random") and key in r.metrics:
            draws = sorted((int(k.rsplit("draw", 1)[1]), v) for k, v in r.metrics.items()
                           if k.startswith(f"pre_ft_random/{EVAL_SET}/draw"))
            by[r.method][r.seed][r.ratio] = [v for _, v in draws] if r.method == "random" and draws \
                else r.metrics[key]
    if method not in by or "random" not in by:
        missing = "random" if "random" not in by else method
        return Diagnostic(scale, family, "informative_beats_random", None,
                          f"not tested: no per_layer one_shot {missing} prune in the sweep")
    pairs = [(seed, by[method][seed][r], by["random"][seed][r])
             for seed in sorted(set(by[method]) & set(by["random"]))
             for r in sorted(set(by[method][seed]) & set(by["random"][seed]))]
    if not pairs:
        return Diagnostic(scale, family, "informative_beats_random", None, "not tested: no seed has both")
    if all(isinstance(rand, list) and len(rand) > 1 for _, _, rand in pairs):
        # every random prune measured several draws: the exact rank test (power from the draws, not the seeds)
        counts = [(sum(1.0 if x < inf else 0.5 if x == inf else 0.0 for x in rand), len(rand)) for _, inf, rand in pairs]
        p = rank_test(counts)
        diff = statistics.fmean(statistics.fmean(rand) - inf for _, inf, rand in pairs)
        ok = p < 0.05 and diff > 0
        below = sum(c for c, _ in counts)
        detail = (f"{below:g} of {sum(m for _, m in counts)} random draws ({len(pairs)} seed(s) × ratio(s)) beat "
                  f"{method} before fine-tune; exact rank test p = {p:.3g}; random − {method} {diff:+.4f} on "
                  f"average" + ("" if ok else f" — {method} is not clearly better than random"))
        return Diagnostic(scale, family, "informative_beats_random", ok, detail)
    # one draw per seed (runs without the extra draws): paired by seed, averaged over ratios, a t-interval
    per_seed = defaultdict(list)
    for seed, inf, rand in pairs:
        per_seed[seed].append((statistics.fmean(rand) if isinstance(rand, list) else rand) - inf)
    diffs = [statistics.fmean(v) for v in per_seed.values()]
    ci = t_interval(diffs)
    if ci is None:
        return Diagnostic(scale, family, "informative_beats_random", None, "not tested: fewer than two seeds")
    ok = ci[0] > 0
    detail = (f"random − {method} before fine-tune {statistics.fmean(diffs):+.4f} [{ci[0]:+.4f}, {ci[1]:+.4f}] "
              f"over {len(diffs)} seeds" + ("" if ok else f" — {method} is not clearly better than random"))
    return Diagnostic(scale, family, "informative_beats_random", ok, detail)


def final_drop(history: list[tuple[int, float]], fraction: float = LAST_FRACTION) -> float | None:
    """Relative fall of a loss curve across its last `fraction` of steps, from a least-squares line: how much the
    run was still improving when it stopped."""
    if not history:
        return None
    last = max(s for s, _ in history)
    pts = [(s, v) for s, v in history if s > (1 - fraction) * last]
    if len(pts) < 3:
        return None
    xs = [float(s) for s, _ in pts]
    ys = [float(v) for _, v in pts]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    start = my + slope * (min(xs) - mx)
    return -slope * (max(xs) - min(xs)) / start if start > 0 else None


def converged(runs, histories: dict, scale: str, family: str, threshold: float) -> Diagnostic:
    drops = []
    for r in runs:
        if (r.arm, r.scale, r.family) == ("dense", scale, family):
            d = final_drop(histories.get(r.run_id, {}).get("train/loss", []))
            if d is not None:
                drops.append(d)
    if not drops:
        return Diagnostic(scale, family, "converged", None, "not tested: no training-loss history")
    mean = statistics.fmean(drops)
    ok = mean <= threshold
    detail = (f"training loss fell {mean:.1%} over the last {LAST_FRACTION:.0%} of steps (mean of {len(drops)} "
              f"dense runs; threshold {threshold:.0%})" + ("" if ok else " — still falling fast"))
    return Diagnostic(scale, family, "converged", ok, detail)


def diagnose(runs, histories: dict, scale_families: list[tuple[str, str]], order: list[str], method: str,
             threshold: float) -> list[Diagnostic]:
    out = []
    for scale, family in scale_families:
        out += [dense_vs_scratch_e(runs, scale, family), larger_scale_not_worse(runs, scale, family, order),
                informative_beats_random(runs, scale, family, method),
                converged(runs, histories, scale, family, threshold)]
    return out


SHORT = {
    "dense_vs_scratch_e": "the dense model is worse than Scratch-E trained for the same steps",
    "larger_scale_not_worse": "this scale's dense model is worse than a smaller scale's",
    "informative_beats_random": "informed scoring is not clearly better than random before fine-tune",
    "converged": "the dense loss was still falling fast at the end of training",
}


def untrustworthy(diags: list[Diagnostic], scale: str, family: str) -> list[str]:
    """The reasons (failed checks) that make (scale, family) untrustworthy; empty when none failed."""
    return [SHORT[d.check] for d in diags if (d.scale, d.family) == (scale, family) and d.passed is False]
