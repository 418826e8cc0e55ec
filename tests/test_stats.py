"""The verdict's statistics against references that do not share its code: Holm's adjustment by hand, the
window-sampling variance against a bootstrap over windows, the seed-only interval and p-value against scipy; and
the report's primary verdicts, adjusted as one family per scale, on runs built in memory."""

from __future__ import annotations

import random
import statistics

import numpy as np
import pytest
from scipy import stats as sps

from orchestration.report import Run, comparisons
from orchestration.report.stats import holm, paired, verdict_of, window_variance


def test_holm_by_hand():
    p = [0.01, 0.04, 0.03, 0.005]
    # sorted: 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 = 0.04 → running max 0.06
    got = holm(p, 0.05)
    assert [h.p_adjusted for h in got] == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # steps 1 and 2 reject (0.005 ≤ 0.05/4, 0.01 ≤ 0.05/3); step 3 does not (0.03 > 0.05/2), nor anything after
    assert [h.rejected for h in got] == [True, False, False, True]
    assert all(h.rejected == (h.p_adjusted <= 0.05) for h in got)
    # levels: step 1 at 1 − 0.05/4, step 2 at 1 − 0.05/3, the rest at the level of the first step that failed
    assert [h.level for h in got] == pytest.approx([1 - 0.05 / 3, 1 - 0.05 / 2, 1 - 0.05 / 2, 1 - 0.05 / 4])
    # untested comparisons stay out of the family
    assert holm([None, 0.02], 0.05)[0] is None and holm([None, 0.02], 0.05)[1].p_adjusted == pytest.approx(0.02)


def test_seed_only_interval_and_p_value_match_scipy():
    d = [0.11, 0.09, 0.10, 0.12, 0.08]
    res = paired(d)
    lo, hi = sps.t.interval(0.95, len(d) - 1, loc=statistics.fmean(d), scale=sps.sem(d))
    assert res.ci95 == pytest.approx((lo, hi)) and res.window_share is None
    assert res.p == pytest.approx(sps.ttest_1samp(d, 0.0).pvalue)
    assert verdict_of(res.ci95) == "supported" and verdict_of(None) == "insufficient_seeds"
    assert paired([0.3]).ci95 is None


def test_window_variance_matches_a_bootstrap_over_windows():
    """V_windows is the sampling variance of the seed-averaged difference when the eval windows are redrawn:
    resampling windows with replacement (seeds fixed) must give the same variance."""
    rng = np.random.default_rng(0)
    n_seeds, n_windows = 3, 400
    tokens = rng.integers(10, 30, n_windows).astype(float)  # masked-LM windows predict different token counts
    per_token = rng.normal(0.05, 0.3, (n_seeds, n_windows)) + rng.normal(0, 0.2, n_windows)  # windows shared
    diff_sums = per_token * tokens
    v = window_variance(diff_sums.tolist(), tokens.tolist())
    boots = []
    for _ in range(4000):
        idx = rng.integers(0, n_windows, n_windows)
        boots.append(diff_sums[:, idx].mean(0).sum() / tokens[idx].sum())
    assert v == pytest.approx(np.var(boots), rel=0.1)
    # and it enters the interval: wider than the seed-only one, with the share it reports
    d = (diff_sums.sum(1) / tokens.sum()).tolist()
    with_w = paired(d, diff_sums.tolist(), tokens.tolist())
    alone = paired(d)
    assert with_w.ci95[1] - with_w.ci95[0] > alone.ci95[1] - alone.ci95[0]
    assert with_w.se ** 2 == pytest.approx(statistics.variance(d) / n_seeds + v)
    assert with_w.window_share == pytest.approx(v / with_w.se ** 2)


def _run(arm, seed, metrics, **tags):
    base = {"stage": "prune" if arm == "pruned" else "train", "arm": arm, "scale": "xs", "family": "decoder",
            "heads": "8", "method": "none", "ratio": "none", "scope": "none", "schedule": "none", "seed": str(seed)}
    base.update({k: str(v) for k, v in tags.items()})
    return Run(f"{arm}-{tags.get('method', '')}-{seed}", f"{arm}-{seed}", "FINISHED",
               {f"headroom.{k}": v for k, v in base.items()}, metrics,
               {"finetune_steps": "10"} if arm == "pruned" else {})


def test_primary_verdicts_are_holm_adjusted_per_scale():
    """Three primary comparisons at one scale: one decisive, two with raw p-values between 0.05/2 and 0.05. Raw,
    all three are "supported"; Holm over the family keeps the first and makes the other two inconclusive."""
    pruned = [2.0, 2.1, 1.9, 2.05, 1.95, 2.02]
    gaps = {"scratch_e": [0.30, 0.31, 0.29, 0.30, 0.32, 0.30],  # decisive
            "scratch_b": [0.05, 0.0, 0.06, 0.03, 0.07, 0.0],  # raw p 0.036
            "wide": [0.05, 0.01, 0.06, 0.03, 0.07, -0.005]}  # raw p 0.031
    raw = {a: sps.ttest_1samp(g, 0.0).pvalue for a, g in gaps.items()}
    assert raw["scratch_e"] < 1e-6 and 0.025 < raw["wide"] < raw["scratch_b"] < 0.05
    runs = []
    for s, p in enumerate(pruned):
        runs.append(_run("pruned", s, {"final/id/loss": p, "pre_ft/id/loss": p + 0.1, "dense/id/loss": p - 0.05},
                         method="gradient", ratio=0.5, scope="per_layer", schedule="one_shot", kept="4"))
        for arm, g in gaps.items():
            runs.append(_run(arm, s, {"final/id/loss": p + g[s]}, ratio=0.5, scope="per_layer", heads="4"))
    rows = {(c.control, c.finetune_steps): c for c in comparisons(runs)}
    e, w, b = rows[("scratch_e", 10)], rows[("wide", 10)], rows[("scratch_b", 10)]
    assert e.primary and w.primary and b.primary
    for arm, row in (("scratch_e", e), ("wide", w), ("scratch_b", b)):
        assert row.p_value == pytest.approx(raw[arm]) and row.verdict_raw == "supported"
    # Holm by hand: 3·p_e; then max(3·p_e, 2·p_w); then max(that, p_b)
    assert e.p_holm == pytest.approx(3 * raw["scratch_e"]) and e.verdict == "supported"
    assert w.p_holm == pytest.approx(2 * raw["wide"]) and w.verdict == "inconclusive"
    assert b.p_holm == pytest.approx(2 * raw["wide"]) and b.verdict == "inconclusive"
    # the adjusted intervals of the undecided ones include 0, the decided one's excludes it
    assert w.ci95_holm[0] <= 0 <= w.ci95_holm[1] and b.ci95_holm[0] <= 0 <= b.ci95_holm[1]
    assert e.ci95_holm[0] > 0
    # before fine-tune rows are secondary: not adjusted
    assert rows[("scratch_b", 0)].p_holm is None and not rows[("scratch_b", 0)].primary


def test_report_interval_adds_the_windows_when_runs_recorded_them():
    """The comparison reads per-window losses through the Windows reader; the interval must equal paired() on the
    same numbers, computed here from the planted arrays."""
    from orchestration.report import Windows

    rng = random.Random(1)
    W, seeds = 50, 3
    arrays = {}
    runs = []
    for s in range(seeds):
        p = [rng.uniform(100, 140) for _ in range(W)]
        c = [x + rng.gauss(3, 4) for x in p]
        tok = [63.0] * W
        pr = _run("pruned", s, {"final/id/loss": sum(p) / sum(tok), "dense/id/loss": 1.0}, method="gradient",
                  ratio=0.5, scope="per_layer", schedule="one_shot", kept="4")
        pr.params["finetune_steps"] = "0"
        ct = _run("scratch_e", s, {"final/id/loss": sum(c) / sum(tok)}, ratio=0.5, scope="per_layer", heads="4")
        arrays[pr.run_id] = {"final": {"id": {"loss": p, "tokens": tok}}}
        arrays[ct.run_id] = {"final": {"id": {"loss": c, "tokens": tok}}}
        runs += [pr, ct]

    class Planted(Windows):
        def _download(self, run_id):
            return arrays.get(run_id)

    row = next(c for c in comparisons(runs, Planted("planted")) if c.control == "scratch_e")
    pr = {r.seed: r for r in runs if r.arm == "pruned"}
    ct = {r.seed: r for r in runs if r.arm == "scratch_e"}
    d = [ct[s].metrics["final/id/loss"] - pr[s].metrics["final/id/loss"] for s in range(seeds)]
    diffs = [[c - p for c, p in zip(arrays[ct[s].run_id]["final"]["id"]["loss"],
                                    arrays[pr[s].run_id]["final"]["id"]["loss"])] for s in range(seeds)]
    want = paired(d, diffs, [63.0] * W)
    assert row.ci95 == pytest.approx(list(want.ci95)) and row.window_share == pytest.approx(want.window_share)
    assert 0 < row.window_share < 1
