"""Trust diagnostics on runs built in memory: a sweep whose models carry a verdict passes every check; each kind of
junk (dense worse than Scratch-E, a larger scale worse than a smaller one, informed scoring no better than random,
a loss still falling fast) fails its check, and the scale's headline says "untrustworthy" instead of a verdict."""

from __future__ import annotations

import pytest

from orchestration.report import Run, SweepRuns, build
from orchestration.report.diagnostics import final_drop

SEEDS = (0, 1, 2)


def _run(arm, scale, seed, metrics, **tags):
    base = {"stage": "prune" if arm == "pruned" else "train", "arm": arm, "scale": scale, "family": "decoder",
            "heads": "8", "method": "none", "ratio": "none", "scope": "none", "schedule": "none", "seed": str(seed)}
    base.update({k: str(v) for k, v in tags.items()})
    rid = f"{scale}-{arm}-{tags.get('method', '')}-{seed}"
    return Run(rid, rid, "FINISHED", {f"headroom.{k}": v for k, v in base.items()}, metrics,
               {"finetune_steps": "10"} if arm == "pruned" else {})


def sweep(dense_off=0.0, s_off=-0.2, random_gain=0.15, falling=0.0):
    """Two scales of a trained sweep. Offsets plant the junk: dense_off raises the dense loss (against Scratch-E),
    s_off is scale s against xs, random_gain how much worse random pruning is, falling the slope of the end."""
    runs, hist = [], {}
    for scale, off in (("xs", 0.0), ("s", s_off)):
        for i, seed in enumerate(SEEDS):
            jitter = (0.01, -0.012, 0.004)[i]
            dense = 2.0 + off + jitter + (dense_off if scale == "s" else 0)
            d = _run("dense", scale, seed, {"final/id/loss": dense})
            runs.append(d)
            # a loss curve over 100 steps: flat at the end unless `falling`
            hist[d.run_id] = {"train/loss": [(t, dense + 0.5 * max(0, 60 - t) / 60 + falling * (100 - t))
                                             for t in range(1, 101)]}
            se = 2.0 + off + jitter + 0.05
            runs.append(_run("scratch_e", scale, seed, {"final/id/loss": se}, ratio=0.5, scope="per_layer",
                             heads="4"))
            for method, pre in (("gradient", dense * 1.03), ("random", dense * 1.03 + random_gain + jitter / 2)):
                runs.append(_run("pruned", scale, seed, {"final/id/loss": dense + 0.02, "pre_ft/id/loss": pre,
                                                         "dense/id/loss": dense}, method=method, ratio=0.5,
                                 scope="per_layer", schedule="one_shot", kept="4"))
    return SweepRuns("memory", "t", "hash", "parent", None, runs, [], hist)


def checks(rep, scale="s"):
    return {d.check: d.passed for d in rep.diagnostics if d.scale == scale}


def test_a_trained_sweep_passes_every_check():
    rep = build(sweep())
    assert checks(rep, "s") == {"dense_vs_scratch_e": True, "larger_scale_not_worse": True,
                                "informative_beats_random": True, "converged": True}
    assert checks(rep, "xs")["larger_scale_not_worse"] is None  # no smaller scale to compare with
    assert not rep.headline("s", "decoder").startswith("untrustworthy")
    v = rep.verdict_json()
    assert all(set(d) == {"scale", "family", "check", "passed", "detail"} for d in v["diagnostics"])
    assert {h["scale"]: h["untrustworthy"] for h in v["headline"]} == {"xs": False, "s": False}


@pytest.mark.parametrize("junk, check, reason", [
    ({"dense_off": 0.3, "s_off": -0.6}, "dense_vs_scratch_e", "worse than Scratch-E"),
    ({"s_off": 0.3}, "larger_scale_not_worse", "worse than a smaller scale"),
    ({"random_gain": 0.0}, "informative_beats_random", "not clearly better than random"),
    ({"falling": 0.01}, "converged", "still falling fast"),
])
def test_each_kind_of_junk_makes_the_scale_untrustworthy(junk, check, reason):
    rep = build(sweep(**junk))
    got = checks(rep, "s")
    assert got[check] is False
    assert all(v is not False for k, v in got.items() if k != check)  # only the planted one fails
    head = rep.headline("s", "decoder")
    assert head.startswith("untrustworthy:") and reason in head
    assert "supported" not in head and "refuted" not in head
    assert next(h for h in rep.verdict_json()["headline"] if h["scale"] == "s")["untrustworthy"] is True


def test_final_drop_by_hand():
    # a straight line 2.0 − 0.001·t over t = 1..100: the last 20% are t = 81..100, fitted exactly
    hist = [(t, 2.0 - 0.001 * t) for t in range(1, 101)]
    assert final_drop(hist) == pytest.approx(0.001 * 19 / (2.0 - 0.081))
    assert final_drop([(t, 1.5) for t in range(1, 101)]) == pytest.approx(0.0)
    assert final_drop([(1, 2.0), (2, 1.9)]) is None  # too short to fit


def test_rank_test_against_enumeration():
    """The exact p-value of the informed-vs-random rank test equals brute-force enumeration of the null, where the
    informed choice's rank among m random draws is uniform and independent per seed."""
    import itertools

    from orchestration.report.diagnostics import rank_test

    for counts in ([(0, 4), (1, 4), (0, 4)], [(2, 4), (0, 4), (1, 4)], [(0, 9), (5, 9), (0, 9)], [(1.5, 3), (0, 4)]):
        observed = sum(c for c, _ in counts)
        grid = [[k for k in range(m + 1)] for _, m in counts]
        hits = sum(1 for combo in itertools.product(*grid) if sum(combo) <= observed + 1e-9)
        total = 1
        for _, m in counts:
            total *= m + 1
        assert rank_test(counts) == pytest.approx(hits / total)
    assert rank_test([(0, 4)] * 3) == pytest.approx(1 / 125)


@pytest.mark.parametrize("below, passed", [(0, True), (2, False)])
def test_informed_vs_random_uses_every_random_draw(below, passed):
    """Random prunes that record 5 draws each: informed below all of them at every seed passes (p = 1/125);
    informed in the middle of the draws (2 of 5 below it at every seed) fails, though it beats the draws' mean."""
    data = sweep()
    for r in data.runs:
        if r.arm == "pruned" and r.method == "gradient" and r.scale == "s":
            g = r.metrics["pre_ft/id/loss"]
            rand = next(x for x in data.runs if (x.arm, x.method, x.scale, x.seed) == ("pruned", "random", "s", r.seed))
            draws = [g - 0.05, g - 0.01][:below] + [g + 0.3 + 0.1 * k for k in range(5 - below)]
            for k, v in enumerate(draws):
                rand.metrics[f"pre_ft_random/id/draw{k}"] = v
    rep = build(data)
    d = next(x for x in rep.diagnostics if (x.scale, x.check) == ("s", "informative_beats_random"))
    assert d.passed is passed and f"{3 * below:g} of 15 random draws" in d.detail
