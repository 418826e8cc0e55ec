"""The recovery section's claim of a change of sign along the recovery budget F, by simulation (seeded): under a
planted null — the gap 0 at every F, or one sign at every F — it claims a change in at most α of the sweeps; with
a planted change it finds it. The rates measured here are stated in docs/design.md."""

from __future__ import annotations

import numpy as np
import pytest

from orchestration.report.recovery import sign_changes
from orchestration.report.rows import Comparison
from orchestration.report.stats import paired, verdict_of

BUDGETS = (20, 200, 1000)
SEEDS = 5
SIMS = 2000


def _rows(rng, gaps: tuple[float, ...], sd: float = 1.0, shared: float = 0.5) -> list[Comparison]:
    """One simulated cell: per seed, the gap control − pruned at each F, with a seed effect shared across the
    budgets (the same dense model and control) plus independent noise."""
    seed_effect = rng.normal(0, shared, SEEDS)
    rows = []
    for f, mu in zip(BUDGETS, gaps):
        diffs = list(mu + seed_effect + rng.normal(0, sd, SEEDS))
        res = paired(diffs)
        rows.append(Comparison(
            scale="xs", family="decoder", ratio=0.5, heads_dense=8, heads_kept=4, method="gradient",
            scope="per_layer", schedule="one_shot", finetune_steps=f, control="scratch_b", eval_set="id",
            primary=False, n_seeds=SEEDS, dense_loss=2.0, pruned_loss=2.0, control_loss=2.0 + res.mean,
            diff_mean=res.mean, ci95=list(res.ci95), verdict=verdict_of(res.ci95), p_value=res.p, p_holm=None,
            ci95_holm=None, verdict_raw=verdict_of(res.ci95), eval_tokens=None, window_share=None))
    return rows


def _claim_rate(gaps, seed: int) -> float:
    rng = np.random.default_rng(seed)
    claims = 0
    for _ in range(SIMS):
        (t,) = sign_changes(_rows(rng, gaps))
        claims += t.change is not None
    return claims / SIMS


@pytest.mark.parametrize("gaps", [(0.0, 0.0, 0.0), (-1.0, -1.0, -1.0), (-2.0, 0.0, 0.0), (0.0, 0.0, 3.0)])
def test_no_change_of_sign_is_claimed_under_a_planted_null(gaps):
    """No true change of sign: a change is claimed in at most α = 5% of simulated sweeps (Monte Carlo margin:
    2000 sweeps, the bound plus three standard errors)."""
    assert _claim_rate(gaps, seed=1) <= 0.05 + 3 * (0.05 * 0.95 / SIMS) ** 0.5


def test_a_planted_change_of_sign_is_found():
    """The gap goes from −3 to +3 noise units between the smallest and the largest F (5 seeds): found in at least
    80% of sweeps, and always between budgets whose gaps have those signs."""
    rng = np.random.default_rng(2)
    found = 0
    for _ in range(SIMS):
        (t,) = sign_changes(_rows(rng, (-3.0, 0.0, 3.0)))
        if t.change is not None:
            found += 1
            a, b = (BUDGETS.index(x) for x in t.change)
            assert t.signs[a] == -1 and t.signs[b] == 1 and a < b
    assert found / SIMS >= 0.8


def test_signs_use_the_bonferroni_level_of_the_family():
    rng = np.random.default_rng(3)
    (t,) = sign_changes(_rows(rng, (0.0, 0.0, 0.0)))
    assert t.level == pytest.approx(1 - 0.05 / 3) and t.budgets == list(BUDGETS)
    # a single budget is no trend
    assert sign_changes(_rows(rng, (0.0, 0.0, 0.0))[:1]) == []
