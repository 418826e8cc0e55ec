"""benchmarks/measure.py against planted answers: a fake clock whose load drifts and spikes while two sides are
measured, one of them a known factor slower. The interleaved median must recover the factor where the naive ways
(sides one after the other, means) do not; the median's interval is checked against SciPy's quantile test."""

import math
import random
import statistics

import numpy as np
import pytest
from measure import at_least, at_most, combine, decide, interleave, median_interval, orders, summarize, timed
from scipy import stats

PLANTED = 1.5  # side B takes 1.5× as long as side A, at the same load


class DriftingMachine:
    """A clock that only moves when work is done; work costs its base seconds × the load at that moment × noise.
    The load doubles over `horizon` seconds (a neighbour ramping up); `spikes` maps the index of a piece of work
    (counted from 0) to an extra factor on it alone."""

    def __init__(self, horizon: float, noise: float = 0.05, spikes: dict[int, float] | None = None, seed: int = 0):
        self.t, self.horizon, self.noise, self.spikes, self.n = 0.0, horizon, noise, spikes or {}, 0
        self.rng = random.Random(seed)

    def __call__(self) -> float:
        return self.t

    def work(self, base: float) -> None:
        load = 1 + min(self.t / self.horizon, 1.0)
        self.t += base * load * math.exp(self.rng.gauss(0, self.noise)) * self.spikes.get(self.n, 1.0)
        self.n += 1


def _sides(m: DriftingMachine) -> dict:
    return {"a": timed(lambda: m.work(1.0), clock=m), "b": timed(lambda: m.work(PLANTED), clock=m)}


def test_interleaved_median_recovers_a_planted_ratio_under_drift_and_spikes():
    rounds = 9
    # two timed measurements spiked (works 0 and 1 are the warm-up round): 10× on round 1's a, 6× on round 3's b
    m = DriftingMachine(horizon=(rounds + 1) * (1 + PLANTED), spikes={4: 10.0, 9: 6.0})
    samples = interleave(_sides(m), repeats=rounds)
    assert len(samples) == rounds and m.n == 2 * (rounds + 1)  # one untimed warm-up round first
    assert [s["order"] for s in samples[:4]] == [["b", "a"], ["a", "b"], ["b", "a"], ["a", "b"]]
    ratios = [s["b"] / s["a"] for s in samples]
    s = summarize(ratios, goal=at_least(1.2))
    assert s["median"] == pytest.approx(PLANTED, rel=0.07)
    low, high = s["spread"]["interval"]
    assert low <= PLANTED <= high and s["spread"]["n"] == rounds
    assert s["spread"]["iqr"][0] <= s["median"] <= s["spread"]["iqr"][1]
    # the goal is decided by where the interval lies
    assert s["meets_goal"] is True
    assert summarize(ratios, goal=at_least(2.5))["meets_goal"] is False
    assert summarize(ratios, goal=at_least(PLANTED))["meets_goal"] == "inconclusive"
    # the naive readings of the same kind of run are fooled: the spikes move the mean of the ratios ...
    assert statistics.fmean(ratios) > PLANTED * 1.3


def test_sides_measured_one_after_the_other_are_fooled_by_the_drift():
    """The reference the interleaving is for: all of A, then all of B, on the same drifting machine."""
    rounds = 9
    m = DriftingMachine(horizon=2 * rounds * (1 + PLANTED) / 2)
    side = _sides(m)
    a = [side["a"]() for _ in range(rounds)]
    b = [side["b"]() for _ in range(rounds)]
    naive = statistics.median(b) / statistics.median(a)
    assert naive > PLANTED * 1.25  # B ran on a busier machine
    m2 = DriftingMachine(horizon=2 * rounds * (1 + PLANTED) / 2)
    inter = summarize([r["b"] / r["a"] for r in interleave(_sides(m2), repeats=rounds, warmup_rounds=0)])
    assert inter["median"] == pytest.approx(PLANTED, rel=0.07)


def test_orders_rotate_so_each_side_takes_each_place_equally_often():
    for names in (["a", "b"], ["dense", "masked", "pruned"]):
        got = orders(names, 4 * len(names))
        for position in range(len(names)):
            seen = [o[position] for o in got]
            assert sorted(seen) == sorted(names * 4)
        assert all(sorted(o) == sorted(names) for o in got)
        assert all(a[0] != b[0] for a, b in zip(got, got[1:]))  # no side leads two rounds in a row
    assert orders(["dense", "masked", "pruned"], 6)[:3] == [["dense", "masked", "pruned"], ["masked", "pruned", "dense"],
                                                            ["pruned", "dense", "masked"]]


def test_median_interval_matches_scipys_quantile_test_and_states_its_coverage():
    rng = np.random.default_rng(0)
    for n in range(6, 40):
        x = list(rng.lognormal(size=n))
        low, high, coverage = median_interval(x)
        ci = stats.quantile_test(x, q=float(np.median(x)), p=0.5).confidence_interval(0.95)
        assert (low, high) == (ci.low, ci.high) and coverage >= 0.95
    # too few values for 95%: [min, max] with the coverage it has, 1 - 2 * 0.5**n
    for n in (1, 3, 5):
        x = [float(v) for v in range(n, 0, -1)]
        assert median_interval(x) == (1.0, float(n), pytest.approx(1 - 2 * 0.5 ** n))


def test_decide_and_combine():
    band = (0.9, 1.1)  # |measured / predicted - 1| <= 0.1
    assert decide(0.95, 1.05, 1.0, band, 5) is True
    assert decide(1.15, 1.3, 1.2, band, 5) is False
    assert decide(1.05, 1.2, 1.08, band, 5) == "inconclusive"  # crosses 1.1
    assert decide(0.8, 1.2, 1.0, band, 5) == "inconclusive"  # wider than the band
    assert decide(0.95, 1.05, 1.0, band, 4) == "inconclusive"  # too few samples to decide
    assert decide(0.1, 0.2, 0.15, at_most(0.2), 7) is True  # an interval touching the edge does not cross it
    assert combine([True, None, True]) is True and combine([True, "inconclusive"]) == "inconclusive"
    assert combine(["inconclusive", False]) is False and combine([None]) is None
    assert summarize([1.0, 2.0, 3.0])["meets_goal"] is None  # no goal
