"""Prune timing (`prune.at`): whether heads removed early in training end worse than, better than, or matching
those removed from the trained model — decided worse-first against a margin of half the Scratch-E gap, on runs
built in memory, with its false-positive rate and power under a planted null and effect (docs/design.md)."""

from __future__ import annotations

import random

import pytest
from test_trends import _run

from orchestration.report.trends import timing


def test_prune_timing_decides_worse_before_matches():
    """Early − late of +0.03, +0.04, +0.05 (interval [0.015, 0.065], excluding 0): the old rule read "matches"
    (within ±5% of the loss, about 0.1 nats); the difference is shown, so it is "worse"."""
    runs = []
    for s, d in zip((0, 1, 2), (0.03, 0.04, 0.05)):
        for at, loss in ((1.0, 2.0 + 0.01 * s), (0.25, 2.0 + 0.01 * s + d)):
            runs.append(_run("pruned", "xs", s, {"final/id/loss": loss}, method="gradient", schedule="one_shot",
                             prune_at=f"{at:g}"))
        runs.append(_run("scratch_e", "xs", s, {"final/id/loss": 1.7 + 0.01 * s}))
    rows = {t.prune_at: t for t in timing(runs)}
    # the interval lies inside the margin too, so only deciding worse first can say "worse"
    assert rows[0.25].margin == pytest.approx(0.15)  # half of |Scratch-E − pruned| = 0.3
    assert -0.15 < rows[0.25].vs_late_ci95[0] and rows[0.25].vs_late_ci95[1] < 0.15
    assert rows[0.25].vs_late_ci95[0] > 0 and rows[0.25].vs_late == "worse"
    # Behnke & Heafield's comparison, by hand: Scratch-E − pruned at p = 0.25 is −0.33, −0.34, −0.35 (scipy's
    # t-interval over the three seeds): the structure trained from scratch is better, "refuted"
    from scipy import stats

    diffs = [-0.33, -0.34, -0.35]
    lo, hi = stats.t.interval(0.95, 2, loc=-0.34, scale=stats.sem(diffs))
    assert rows[0.25].vs_scratch_e_mean == pytest.approx(-0.34)
    assert rows[0.25].vs_scratch_e_ci95 == pytest.approx([lo, hi]) and rows[0.25].vs_scratch_e == "refuted"


def test_prune_timing_false_positive_rate_and_power():
    """Planted null (pruning early changes nothing; seed SD 0.02, 3 seeds): "worse" or "better" in at most 7% of
    400 simulated cells; a planted +0.06 is called worse with the power docs/design.md states (at least 0.6)."""
    rng = random.Random(21)

    def word(effect):
        runs = []
        for s in (0, 1, 2):
            late = 2.0 + rng.gauss(0, 0.05)
            runs.append(_run("pruned", "xs", s, {"final/id/loss": late}, method="gradient", schedule="one_shot",
                             prune_at="1"))
            runs.append(_run("pruned", "xs", s, {"final/id/loss": late + effect + rng.gauss(0, 0.02)},
                             method="gradient", schedule="one_shot", prune_at="0.25"))
            runs.append(_run("scratch_e", "xs", s, {"final/id/loss": late - 0.1}))
        return next(t.vs_late for t in timing(runs) if t.prune_at == 0.25)

    null = [word(0.0) for _ in range(400)]
    effect = [word(0.06) for _ in range(400)]
    fp = sum(w in ("worse", "better") for w in null) / 400
    power = sum(w == "worse" for w in effect) / 400
    print(f"\ntiming: false-positive rate {fp:.3f}, power at +0.06 {power:.3f}, 'matches' under the null "
          f"{sum(w == 'matches' for w in null) / 400:.3f}")
    assert fp <= 0.07 and power >= 0.6
