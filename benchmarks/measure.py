"""How every benchmark measures, so that a noisy machine cannot fool it: its sides are measured interleaved (one
measurement of each per round, the order rotating from round to round) after an untimed warm-up round; the answer
is the median of the per-round ratios, with their interquartile range and a distribution-free confidence interval
of that median; the goal is met, missed or undecided ("inconclusive") by where that interval lies.

A load that drifts during the run (a neighbour starting a job) moves both sides of a round alike, so the per-round
ratio keeps the true value where a ratio of side totals, or of sides measured one after the other, would not;
the median ignores the round a spike hit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from scipy import stats

from orchestration.running.summary import quartiles

LEVEL = 0.95  # the confidence the interval aims at
MIN_SAMPLES = 5  # fewer and a goal is never decided: the interval could not be trusted to cover the median


def orders(names: Sequence[str], rounds: int) -> list[list[str]]:
    """The order of the sides in each round: rotated by one each round, the other direction every other cycle, so
    each side takes each position equally often and no side leads two rounds in a row (two sides: A B, B A, ...;
    three: A B C, B C A, C A B, B A C, A C B, C B A, ...)."""
    n = len(names)
    back = list(names)[::-1]
    out = []
    for k in range(rounds):
        cycle, shift = divmod(k, n)
        if cycle % 2 and n > 2:
            shift = (shift + 1) % n
            out.append(back[shift:] + back[:shift])
        else:
            out.append(list(names[shift:]) + list(names[:shift]))
    return out


def interleave(sides: dict[str, Callable[[], float]], repeats: int, warmup_rounds: int = 1) -> list[dict]:
    """Measure every side once per round, `repeats` rounds after `warmup_rounds` untimed ones (all sides, the
    same rotation). Each side is a callable returning its measurement (seconds, tokens/s, ...). Returns one dict
    per timed round: {side: value, ..., "order": [sides in the order measured]}."""
    if repeats < 1:
        raise ValueError("repeats: at least 1")
    names = list(sides)
    rounds = []
    for i, order in enumerate(orders(names, warmup_rounds + repeats)):
        got = {name: sides[name]() for name in order}
        if i >= warmup_rounds:
            rounds.append({**{n: got[n] for n in names}, "order": order})
    return rounds


def timed(fn: Callable[[], object], clock: Callable[[], float] = time.perf_counter,
          sync: Callable[[], None] | None = None) -> Callable[[], float]:
    """A side that measures the seconds `fn()` takes on `clock` (`sync`, e.g. torch.cuda.synchronize, before
    both readings so queued device work is counted where it was started)."""
    def side() -> float:
        if sync:
            sync()
        t = clock()
        fn()
        if sync:
            sync()
        return clock() - t
    return side


def median_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float, float]:
    """(low, high, coverage): the distribution-free confidence interval of the median from order statistics —
    the narrowest symmetric [x(k), x(n+1-k)] whose coverage under Binomial(n, 1/2) is at least `level`; with too
    few values for that (n <= 5 at 95%), [min, max] and the coverage it actually has."""
    x = sorted(values)
    n = len(x)
    if n == 0:
        raise ValueError("no values")
    k = 1  # 1-based order statistic
    while k + 1 <= n - k and 1 - 2 * stats.binom.cdf(k, n, 0.5) >= level:  # coverage of [x(k+1), x(n-k)]
        k += 1
    coverage = 1 - 2 * stats.binom.cdf(k - 1, n, 0.5)
    return x[k - 1], x[n - k], float(coverage)


def decide(low: float, high: float, median: float, goal: tuple[float, float], n: int) -> bool | str:
    """The goal is a band [lo, hi] (either end may be infinite). True or False by the median, "inconclusive" when
    the interval crosses an edge of the band (an interval that only touches an edge does not) or there are fewer
    than MIN_SAMPLES values."""
    g_lo, g_hi = goal
    if n < MIN_SAMPLES or any(low < edge < high for edge in (g_lo, g_hi) if math.isfinite(edge)):
        return "inconclusive"
    return bool(g_lo <= median <= g_hi)


def at_least(x: float) -> tuple[float, float]:
    return (x, math.inf)


def at_most(x: float) -> tuple[float, float]:
    return (-math.inf, x)


def summarize(values: Sequence[float], goal: tuple[float, float] | None = None) -> dict:
    """{"median", "spread": {"iqr", "interval", "coverage", "n"}, "meets_goal"} of per-round ratios (or any
    samples). meets_goal is None without a goal."""
    values = [float(v) for v in values]
    q1, med, q3 = quartiles(values)
    low, high, coverage = median_interval(values)
    out = {"median": med, "spread": {"iqr": [q1, q3], "interval": [low, high], "coverage": round(coverage, 4),
                                     "n": len(values)}}
    out["meets_goal"] = None if goal is None else decide(low, high, med, goal, len(values))
    return out


def combine(verdicts: Sequence[bool | str | None]) -> bool | str | None:
    """One verdict for several goals: False when any is missed, True when all are met, else "inconclusive";
    goals that do not apply (None) are left out."""
    v = [x for x in verdicts if x is not None]
    if not v:
        return None
    if any(x is False for x in v):
        return False
    return True if all(x is True for x in v) else "inconclusive"


def ratio_result(samples: list[dict], num: str, den: str, goal: tuple[float, float] | None,
                 key: str = "median_ratio") -> dict:
    """The JSON fields of a benchmark whose answer is side `num` ÷ side `den`: every round (with its ratio) under
    "samples", the median ratio under `key` ("median_ratio" or "median_speedup"), "spread" and "meets_goal"."""
    for s in samples:
        s["ratio"] = s[num] / s[den]
    s = summarize([x["ratio"] for x in samples], goal)
    return {"samples": samples, key: s["median"], "spread": s["spread"], "meets_goal": s["meets_goal"]}


def write_speedups(res: dict, rows: list[dict], samples: list[dict], batch_size: int, out: str) -> dict:
    """A latency benchmark's per-ratio result (prune_speed, onnx_latency): each ratio's median speedup, spread and
    goal verdict beside `res`, every round in `samples`; the goal is claimed only at batch >= 16. Written to `out`."""
    import json
    from pathlib import Path

    res.update(median_speedup={str(x["ratio"]): x["median_speedup"] for x in rows},
               spread={str(x["ratio"]): x["spread"] for x in rows},
               meets_goal_by={str(x["ratio"]): x["meets_goal"] for x in rows}, samples=samples, rows=rows)
    if batch_size >= 16:
        res["meets_goal"] = combine([x["meets_goal"] for x in rows])
    else:
        res["meets_goal"] = False
        res["goal_note"] = "the goal is stated at batch >= 16; this run's batch is smaller"
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=2) + "\n")
    return res
