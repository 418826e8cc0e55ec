"""The recovery section's claim of a change of sign along the recovery budget F, by simulation (seeded): under a
planted null — the gap 0 at every F, or one sign at every F — it claims a change in at most α of the sweeps; with
a planted change it finds it. The rates measured here are stated in docs/design.md."""

from __future__ import annotations

import numpy as np
import pytest

from orchestration.design.spec import parse_sweep
from orchestration.report.analysis import primary_recovery
from orchestration.report.read import Run
from orchestration.report.rows import Comparison
from orchestration.report.stats import paired, verdict_of
from orchestration.report.trends import sign_changes

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
    """No true change of sign: a change is claimed in at most α/2 = 2.5% of simulated sweeps (Monte Carlo margin:
    2000 sweeps, the bound plus three standard errors). A change needs two opposite established signs, one of them
    a false one on its side only, so the procedure's rate is below α/2; without the Bonferroni step the (0, 0, 3)
    null claims one in about 4.9% of sweeps, above this bound."""
    bound = 0.025
    assert _claim_rate(gaps, seed=1) <= bound + 3 * (bound * (1 - bound) / SIMS) ** 0.5


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


def _fixed_row(f: int, diffs: list[float]) -> Comparison:
    res = paired(diffs)
    return Comparison(
        scale="xs", family="decoder", ratio=0.5, heads_dense=8, heads_kept=4, method="gradient",
        scope="per_layer", schedule="one_shot", finetune_steps=f, control="scratch_b", eval_set="id",
        primary=False, n_seeds=len(diffs), dense_loss=2.0, pruned_loss=2.0, control_loss=2.0 + res.mean,
        diff_mean=res.mean, ci95=list(res.ci95), verdict=verdict_of(res.ci95), p_value=res.p, p_holm=None,
        ci95_holm=None, verdict_raw=verdict_of(res.ci95), eval_tokens=None, window_share=None)


def test_a_gap_significant_only_at_95_percent_has_no_sign_among_three_budgets():
    """Deterministic: F=20 clearly negative (t = −10), F=200 zero, F=1000 positive with t = 3.3 on 4 degrees of
    freedom — its 95% interval excludes 0 (t crit 2.78), its 1 − 0.05/3 interval does not (t crit 3.96). The
    Bonferroni step leaves F=1000 without a sign, so no change is claimed; a 95% level would claim −→+."""
    z = [-2.0, -1.0, 0.0, 1.0, 2.0]
    se1 = (sum(x * x for x in z) / 4 / 5) ** 0.5  # the standard error of z's mean
    pos = [1.0 + x / (3.3 * se1) for x in z]  # mean 1, standard error 1/3.3: t = 3.3
    neg = [-1.0 + x / (10 * se1) for x in z]
    zero = [x / (3.3 * se1) for x in z]
    res = paired(pos)
    assert res.ci95[0] > 0 and 0.05 / 3 < res.p < 0.05  # the precondition: significant at 95% only
    (t,) = sign_changes([_fixed_row(20, neg), _fixed_row(200, zero), _fixed_row(1000, pos)])
    assert t.signs == [-1, 0, 0] and t.change is None
    # with a clearly positive gap at F=1000 (t = 10) the change is claimed, between 20 and 1000
    (t,) = sign_changes([_fixed_row(20, neg), _fixed_row(200, zero), _fixed_row(1000, [-v for v in neg])])
    assert t.signs == [-1, 0, 1] and t.change == [20, 1000]


def test_signs_use_the_bonferroni_level_of_the_family():
    rng = np.random.default_rng(3)
    (t,) = sign_changes(_rows(rng, (0.0, 0.0, 0.0)))
    assert t.level == pytest.approx(1 - 0.05 / 3) and t.budgets == list(BUDGETS)
    # a single budget is no trend
    assert sign_changes(_rows(rng, (0.0, 0.0, 0.0))[:1]) == []


def _pruned(f: int, recovery: str) -> Run:
    tags = {"stage": "prune", "arm": "pruned", "scale": "xs", "family": "decoder", "heads": "8",
            "method": "gradient", "ratio": "0.5", "scope": "per_layer", "schedule": "one_shot", "seed": "0",
            "finetune_steps": str(f), "recovery": recovery}
    return Run(f"r{f}{recovery}", f"r{f}{recovery}", "FINISHED", {f"headroom.{k}": v for k, v in tags.items()},
               {}, {})


def test_the_primary_recovery_is_the_sweep_files_not_the_finished_runs():
    """The sweep declares distill at F up to 180; only lm runs (and distill at F=20) finished. The primary recovery
    stays (180, distill) — its missing runs are reported missing — and is never the strongest that happened to
    finish. Without a stored sweep file (older runs) it is inferred from the runs."""
    spec = parse_sweep(
        "name: t\nfamily: decoder\ndata: {source: stdlib}\nscales:\n  xs: {steps: 20, overrides: {batch_size: 4, "
        "seq_len: 32}}\nseeds: [0]\nprune: {ratios: [0.5], methods: [gradient], finetune_steps: [20, 60, 180], "
        "recovery: [lm, distill]}\ncontrols: [scratch_b]\n")
    finished = [_pruned(20, "lm"), _pruned(60, "lm"), _pruned(180, "lm"), _pruned(20, "distill")]
    assert primary_recovery(finished, spec) == (180, "distill")
    assert primary_recovery(finished) == (20, "distill")  # the inference a stored spec replaces
    lm_only = spec.model_copy(update={"prune": spec.prune.model_copy(update={"recovery": ["lm"]})})
    assert primary_recovery([], lm_only) == (180, "lm")
