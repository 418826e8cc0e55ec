"""Trust diagnostics on runs built in memory: a sweep whose models carry a verdict passes every check; each kind of
junk (dense worse than Scratch-E, a larger scale worse than a smaller one, informed scoring no better than random,
a dense model that still gains fast from more training) fails its check and the headline says "untrustworthy"; a
check the sweep cannot run makes it "unverified", never a plain verdict. The statistical checks are tested by
simulation: their false-positive rate under a planted null and their power under a planted effect (the rates
docs/design.md states). The converged check is also run on real training."""

from __future__ import annotations

import random

import pytest

from orchestration.design.unit import Cell
from orchestration.report import Run, SweepRuns, build
from orchestration.report.diagnostics import (
    COULD_NOT_RUN,
    FAILED,
    NOT_APPLICABLE,
    PASSED,
    converged,
    dense_vs_scratch_e,
    doubling_gain,
    informative_beats_random,
)

SEEDS = (0, 1, 2)


def cells(*scales: str) -> list[Cell]:
    """The report's order of cells: these scales, each at its one budget."""
    return [Cell(s, None) for s in scales]
CHECKS = ("dense_vs_scratch_e", "larger_scale_not_worse", "informative_beats_random", "converged", "finite")
SEARCHLESS = {"lr_search_brackets": NOT_APPLICABLE, "recovery_rate_brackets": NOT_APPLICABLE,  # no search, no grid
              "scratch_b_charged": NOT_APPLICABLE}  # no Scratch-B in the synthetic sweep


def _run(arm, scale, seed, metrics, params=None, **tags):
    base = {"stage": "prune" if arm == "pruned" else "train", "arm": arm, "scale": scale, "family": "decoder",
            "heads": "8", "method": "none", "ratio": "none", "scope": "none", "schedule": "none", "seed": str(seed)}
    base.update({k: str(v) for k, v in tags.items()})
    rid = f"{scale}-{arm}-{tags.get('method', '')}-{tags.get('ratio', '')}-{seed}"
    return Run(rid, rid, "FINISHED", {f"headroom.{k}": v for k, v in base.items()}, metrics,
               {"finetune_steps": "10", **(params or {})} if arm == "pruned" else dict(params or {}))


def sweep(dense_off=0.0, s_off=-0.2, random_gain=0.15, half_gain=0.02, seeds=SEEDS, scratch_e=True,
          methods=("gradient", "random"), half=True, scratch_diffs=None):
    """Two scales of a trained sweep. Offsets plant the junk: dense_off raises scale s's dense loss (against
    Scratch-E), s_off is scale s against xs, random_gain how much worse random pruning is, half_gain how much worse
    the half-budget dense run is (relative: the gain of one doubling). scratch_diffs: dense − Scratch-E per seed."""
    runs = []
    for scale, off in (("xs", 0.0), ("s", s_off)):
        for i, seed in enumerate(seeds):
            jitter = (0.01, -0.012, 0.004, 0.0)[i]
            dense = 2.0 + off + jitter + (dense_off if scale == "s" else 0)
            runs.append(_run("dense", scale, seed, {"final/id/loss": dense}, {"steps": "100"}))
            if half:
                runs.append(_run("dense_half", scale, seed, {"final/id/loss": dense * (1 + half_gain)},
                                 {"steps": "50"}))
            if scratch_e:
                se = dense - (scratch_diffs[i] if scratch_diffs else dense_off - 0.05 if scale == "s" else -0.05)
                runs.append(_run("scratch_e", scale, seed, {"final/id/loss": se}, ratio=0.5, scope="per_layer",
                                 heads="4"))
            for method, pre in (("gradient", dense * 1.03), ("random", dense * 1.03 + random_gain + jitter / 2)):
                if method in methods:
                    runs.append(_run("pruned", scale, seed, {"final/id/loss": dense + 0.02, "pre_ft/id/loss": pre,
                                                             "dense/id/loss": dense}, method=method, ratio=0.5,
                                     scope="per_layer", schedule="one_shot", kept="4"))
    return SweepRuns("memory", "t", "hash", "parent", None, runs, [], {})


def states(rep, scale="s"):
    return {d.check: d.state for d in rep.diagnostics if d.scale == scale}


def test_a_trained_sweep_passes_every_check():
    rep = build(sweep())
    assert states(rep, "s") == {**dict.fromkeys(CHECKS, PASSED), **SEARCHLESS}
    assert states(rep, "xs")["larger_scale_not_worse"] == NOT_APPLICABLE  # no smaller scale to compare with
    assert all(v == PASSED for k, v in states(rep, "xs").items() if k != "larger_scale_not_worse" and k not in SEARCHLESS)
    for scale in ("xs", "s"):
        head = rep.headline(scale, "decoder")
        assert not head.startswith(("untrustworthy", "unverified")) and head.startswith("half (1)")
    v = rep.verdict_json()
    assert all({"scale", "family", "check", "passed", "state", "detail", "margin"} == set(d) for d in v["diagnostics"])
    assert {h["scale"]: (h["untrustworthy"], h["unverified"]) for h in v["headline"]} == {
        "xs": (False, []), "s": (False, [])}


@pytest.mark.parametrize("junk, check, reason", [
    ({"dense_off": 0.3, "s_off": -0.6}, "dense_vs_scratch_e", "within the margin of Scratch-E"),
    ({"s_off": 0.3}, "larger_scale_not_worse", "within the margin of a smaller scale"),
    ({"random_gain": 0.0}, "informative_beats_random", "not clearly better than random"),
    ({"half_gain": 0.08}, "converged", "stopped improving"),
])
def test_each_kind_of_junk_makes_the_scale_untrustworthy(junk, check, reason):
    rep = build(sweep(**junk))
    got = states(rep, "s")
    assert got[check] == FAILED
    assert all(v == PASSED for k, v in got.items() if k != check and k not in SEARCHLESS)  # only the planted one
    head = rep.headline("s", "decoder")
    assert head.startswith("untrustworthy:") and reason in head
    assert "supported" not in head and "refuted" not in head
    assert next(h for h in rep.verdict_json()["headline"] if h["scale"] == "s")["untrustworthy"] is True


@pytest.mark.parametrize("diffs", [(0.03, 0.07), (0.05 + 0.04 * 0.0, 0.05 + 0.04, 0.05 - 0.04)])
def test_a_dense_model_worse_than_scratch_e_in_every_seed_fails(diffs):
    """dense − Scratch-E of +0.03 and +0.07 (2 seeds), or 0.05 ± 0.04 (3 seeds): the old check passed both (its
    interval was not wholly above 0); non-inferiority asks the upper bound to be within the margin, and fails."""
    data = sweep(seeds=SEEDS[:len(diffs)], scratch_diffs=diffs)
    d = dense_vs_scratch_e(data.runs, "s", "decoder", 0.05)
    assert d.state == FAILED and d.margin == pytest.approx(0.05 * (2.0 - 0.2 - sum(diffs) / len(diffs)), rel=0.02)
    # a clearly better dense model passes with the same seeds
    good = sweep(seeds=SEEDS[:len(diffs)], scratch_diffs=[-0.1 - 0.01 * i for i in range(len(diffs))])
    assert dense_vs_scratch_e(good.runs, "s", "decoder", 0.05).state == PASSED


def test_checks_that_cannot_run_make_the_headline_unverified():
    """No random method, no Scratch-E and no half-budget run: three checks could not run. The headline says
    unverified, names them, and states no verdict word; verdict.json lists them."""
    rep = build(sweep(scratch_e=False, methods=("gradient",), half=False))
    for scale in ("xs", "s"):
        st = states(rep, scale)
        assert st["dense_vs_scratch_e"] == st["informative_beats_random"] == st["converged"] == COULD_NOT_RUN
        head = rep.headline(scale, "decoder")
        assert head.startswith("unverified: dense_vs_scratch_e, informative_beats_random, converged")
        assert "supported" not in head and "refuted" not in head
    h = {x["scale"]: x for x in rep.verdict_json()["headline"]}
    assert h["s"]["unverified"] == ["dense_vs_scratch_e", "informative_beats_random", "converged"]
    assert h["s"]["untrustworthy"] is False
    # one seed: an interval cannot be formed, so a check that needs one could not run (not passed)
    one = build(sweep(seeds=(0,)))
    assert states(one, "s")["dense_vs_scratch_e"] == COULD_NOT_RUN
    assert states(one, "s")["larger_scale_not_worse"] == COULD_NOT_RUN


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


@pytest.mark.parametrize("below, passed", [(0, PASSED), (2, FAILED)])
def test_informed_vs_random_uses_every_random_draw(below, passed):
    """Random prunes that record 5 draws each: informed below all of them at every seed passes (p = 1/216 with
    m = 5); informed in the middle of the draws (2 of 5 below it at every seed) fails, though it beats their mean."""
    data = sweep()
    for r in data.runs:
        if r.arm == "pruned" and r.method == "gradient" and r.scale == "s":
            g = r.metrics["pre_ft/id/loss"]
            rand = next(x for x in data.runs if (x.arm, x.method, x.scale, x.seed) == ("pruned", "random", "s", r.seed))
            draws = [g - 0.05, g - 0.01][:below] + [g + 0.3 + 0.1 * k for k in range(5 - below)]
            for k, v in enumerate(draws):
                rand.metrics[f"pre_ft_random/id/draw{k}"] = v
    d = informative_beats_random(data.runs, "s", "decoder", "gradient")
    assert d.state == passed and f"{3 * below:g} of 15 random draws" in d.detail


# ------------------------------------------------------------------------------------ simulations

SIMS = 400
RATIOS = (0.25, 0.5, 0.75)
LAYERS, HEADS, DRAWS = 2, 8, 5


def _removed(scores: list[list[float]], ratio: float) -> list[tuple[int, int]]:
    """The lowest-scored round(ratio·H) heads of each layer (per_layer, one shot, as heads_to_keep removes)."""
    k = round(ratio * HEADS)
    return [(l, h) for l in range(LAYERS) for h in sorted(range(HEADS), key=lambda h: scores[l][h])[:k]]


def _nested_sweep(rng: random.Random, informed_is_random: bool, seeds=(0, 1, 2)) -> list[Run]:
    """One sweep of real-shaped prune runs at three ratios. Each seed's dense model has head importances; a score
    vector (informed or random) is drawn once per seed and used at every ratio, as one-shot scoring and seeded
    random draws are: the rank counts at a seed's ratios are dependent. The loss of a pruned model is the summed
    importance it removed plus evaluation noise."""
    runs = []
    for seed in seeds:
        imp = [[rng.expovariate(1.0) for _ in range(HEADS)] for _ in range(LAYERS)]
        draws = [[[rng.random() for _ in range(HEADS)] for _ in range(LAYERS)] for _ in range(DRAWS)]
        informed = ([[rng.random() for _ in range(HEADS)] for _ in range(LAYERS)] if informed_is_random
                    else [[v + rng.gauss(0, 0.7) for v in row] for row in imp])  # noisy importance: power
        for ratio in RATIOS:
            def loss(scores):
                return 2.0 + 0.05 * sum(imp[l][h] for l, h in _removed(scores, ratio)) + rng.gauss(0, 0.002)

            rand = [loss(s) for s in draws]
            m = {"pre_ft/id/loss": rand[0], **{f"pre_ft_random/id/draw{k}": v for k, v in enumerate(rand)}}
            common = {"ratio": ratio, "scope": "per_layer", "schedule": "one_shot"}
            runs.append(_run("pruned", "s", seed, m, method="random", **common))
            runs.append(_run("pruned", "s", seed, {"pre_ft/id/loss": loss(informed)}, method="gradient", **common))
    return runs


def _pass_rate(informed_is_random: bool, seed: int) -> tuple[float, float]:
    """(the check's pass rate, the pass rate of the old procedure: every (seed, ratio) pair pooled as independent)."""
    from orchestration.report.diagnostics import rank_test

    rng = random.Random(seed)
    hits = pooled = 0
    for _ in range(SIMS):
        runs = _nested_sweep(rng, informed_is_random)
        hits += informative_beats_random(runs, "s", "decoder", "gradient").state == PASSED
        inf = {(r.seed, r.ratio): r.metrics["pre_ft/id/loss"] for r in runs if r.method == "gradient"}
        counts = [(sum(1.0 if v < inf[(r.seed, r.ratio)] else 0.0 for k, v in r.metrics.items() if "draw" in k), DRAWS)
                  for r in runs if r.method == "random"]
        pooled += rank_test(counts) < 0.05
    return hits / SIMS, pooled / SIMS


def test_informed_vs_random_false_positive_rate_and_power_at_three_ratios():
    """Planted null: the informed scores are one more random draw, shared across three ratios. Pooling every
    (seed, ratio) pair as independent passed 11% of such sweeps; one ratio per seed keeps the rate at the nominal
    5% (here at most 7% over 400 sweeps). Planted effect (scores = importance + noise): the power docs/design.md
    states, at least 0.7 here."""
    fpr, pooled_fpr = _pass_rate(True, 1)
    power, _ = _pass_rate(False, 2)
    print(f"\ninformative_beats_random: false-positive rate {fpr:.3f} (pooled pairs: {pooled_fpr:.3f}), power "
          f"{power:.3f} ({SIMS} sweeps, 3 seeds)")
    assert fpr <= 0.07
    assert pooled_fpr > 0.08  # the dependence is real: pooling the ratios inflates the rate
    assert power >= 0.7


def _noninferiority_pass_rate(true_diff: float, sd: float, n_seeds: int, seed: int) -> float:
    rng = random.Random(seed)
    hits = 0
    for _ in range(SIMS):
        diffs = [true_diff + rng.gauss(0, sd) for _ in range(n_seeds)]
        data = sweep(seeds=tuple(range(n_seeds)), scratch_diffs=diffs) if n_seeds <= 4 else None
        hits += dense_vs_scratch_e(data.runs, "s", "decoder", 0.05).state == PASSED
    return hits / SIMS


def test_noninferiority_false_pass_rate_and_power():
    """dense − Scratch-E with seed SD 0.03 (the quickstart's spread), 3 seeds, margin 5% of Scratch-E's ≈1.71 nats:
    a dense model worse by exactly the margin passes 2.5% of the time in theory (the upper bound of a 95% interval
    is a one-sided 97.5% bound; here at most 7% over 400 sweeps) — the test's false pass rate; one equal to
    Scratch-E passes with the power docs/design.md states (at least 0.6 here)."""
    margin = 0.05 * (2.0 - 0.2) / 1.05  # d = 0.05 × Scratch-E's loss, Scratch-E = dense − d
    false_pass = _noninferiority_pass_rate(margin, 0.03, 3, 3)
    power = _noninferiority_pass_rate(0.0, 0.03, 3, 4)
    print(f"\ndense_vs_scratch_e: false pass at the margin {false_pass:.3f}, power at 0 {power:.3f}")
    assert false_pass <= 0.07
    assert power >= 0.6


def test_converged_by_hand():
    assert doubling_gain(2.0, 1.8, 100, 200) == pytest.approx(0.1)
    assert doubling_gain(2.0, 1.8, 100, 400) == pytest.approx(0.05)
    data = sweep(half_gain=0.1)  # L(50) = 1.1 × L(100): 1 − 1/1.1 = 9.1% per doubling
    d = converged(data.runs, Cell("s", None), "decoder", cells("xs", "s"), 0.05)
    assert d.state == FAILED and "9.1% per doubling" in d.detail and "half-budget" in d.detail


def test_converged_judges_real_undertrained_models_by_more_training(xs_decoder_metrics):
    """Real training. At budget.yaml's xs settings the old end-of-curve check passed 100 steps (a cosine schedule
    flattens every curve's end: loss fell 1.1%) and failed 300 (6.6%), though 300 steps reach a 28% lower loss:
    it certified the less trained model. The new check asks what doubling the budget buys, each model on its own
    schedule: the shared 300-step xs model (tests' fixture) against 150 steps, and 100 steps against 50, same
    settings. Measured: both still gain over 5% per doubling (about 11% and 13%), so neither is called converged,
    and the 100-step model is never passed while the 300-step one fails."""
    from lightning_modules.declarations.config import DataConfig, ModelConfig, TrainConfig
    from lightning_modules.training.loop import train_lm

    m = xs_decoder_metrics
    model, train = ModelConfig(**m["model_config"]), TrainConfig(**m["train_config"])
    loss = {300: m["final"]["id"]["loss"]}
    for steps in (50, 100, 150):
        res = train_lm(model, train.model_copy(update={"steps": steps}), DataConfig(), progress=False)
        loss[steps] = res.metrics["final"]["id"]["loss"]
    g100, g300 = doubling_gain(loss[50], loss[100], 50, 100), doubling_gain(loss[150], loss[300], 150, 300)
    print(f"\nxs id loss {loss}; gain per doubling at 100 steps {g100:.1%}, at 300 {g300:.1%}")
    assert loss[50] > loss[100] > loss[150] > loss[300]

    def state(t, half):  # the same loss for two seeds: the interval is the point (what the real runs measure)
        runs = [_run(arm, "xs", seed, {"final/id/loss": loss[n]}, {"steps": str(n)})
                for seed in (0, 1) for arm, n in (("dense", t), ("dense_half", half))]
        return converged(runs, Cell("xs", None), "decoder", cells("xs"), 0.05).state

    assert state(100, 50) == FAILED and state(300, 150) == FAILED
    assert g100 > 0.05 and g300 > 0.05


def test_converged_false_pass_rate_and_power():
    """Every seed's half-budget run, 3 seeds, each seed's gain per doubling off its true value by N(0, 1%) (the
    seed spread measured at xxs, issue 47): a dense model truly gaining 6% per doubling passes the 5% band at most
    5% of the time, one gaining 1% passes at least 60% (rates in docs/design.md). One seed never passes: its check
    could not run."""
    rng = random.Random(5)

    def pass_rate(gain):
        hits = 0
        for _ in range(SIMS):
            runs = []
            for seed in range(3):
                full = 2.0 * (1 + rng.gauss(0, 0.015))
                g = gain + rng.gauss(0, 0.01)
                runs += [_run("dense", "xs", seed, {"final/id/loss": full}, {"steps": "300"}),
                         _run("dense_half", "xs", seed, {"final/id/loss": full / (1 - g)}, {"steps": "150"})]
            hits += converged(runs, Cell("xs", None), "decoder", cells("xs"), 0.05).state == PASSED
        return hits / SIMS

    false_pass, power = pass_rate(0.06), pass_rate(0.01)
    print(f"\nconverged: passes a true 6% gain {false_pass:.3f}, a true 1% gain {power:.3f}")
    assert false_pass <= 0.05 and power >= 0.6
    one = [_run("dense", "xs", 0, {"final/id/loss": 2.0}, {"steps": "300"}),
           _run("dense_half", "xs", 0, {"final/id/loss": 2.01}, {"steps": "150"})]
    d = converged(one, Cell("xs", None), "decoder", cells("xs"), 0.05)
    assert d.state == COULD_NOT_RUN and "point estimate" in d.detail


def test_a_comparison_that_could_not_run_never_hides_one_that_failed():
    """Dense far worse than Scratch-E at r0.25 (three seeds) and r0.5 with one seed: failed, not could_not_run;
    likewise a larger scale far worse than one smaller scale while another smaller scale has one seed."""
    runs = []
    for seed in (0, 1, 2):
        runs.append(_run("dense", "s", seed, {"final/id/loss": 2.5 + 0.01 * seed}, {"steps": "100"}))
        runs.append(_run("scratch_e", "s", seed, {"final/id/loss": 2.0 + 0.01 * seed}, ratio=0.25,
                         scope="per_layer"))
    runs.append(_run("scratch_e", "s", 0, {"final/id/loss": 2.0}, ratio=0.5, scope="per_layer"))
    assert dense_vs_scratch_e(runs, "s", "decoder", 0.05).state == FAILED
    from orchestration.report.diagnostics import larger_scale_not_worse

    runs = [_run("dense", "m", s, {"final/id/loss": 3.0 + 0.01 * s}) for s in (0, 1, 2)]
    runs += [_run("dense", "s", s, {"final/id/loss": 2.0 + 0.01 * s}) for s in (0, 1, 2)]
    runs += [_run("dense", "xs", 0, {"final/id/loss": 2.2})]
    assert larger_scale_not_worse(runs, Cell("m", None), "decoder", cells("xs", "s", "m"), 0.05).state == FAILED


def test_the_rank_test_says_it_could_not_run_when_no_outcome_can_pass():
    """One seed with five random draws: even an informed choice below every draw gives p = 1/6, so the exact test
    cannot pass — could not run (unverified), not failed (untrustworthy)."""
    data = sweep(seeds=(0,))
    for r in data.runs:
        if r.arm == "pruned" and r.method == "random" and r.scale == "s":
            g = r.metrics["pre_ft/id/loss"]
            for k in range(5):
                r.metrics[f"pre_ft_random/id/draw{k}"] = g + 3.0 + k
    d = informative_beats_random(data.runs, "s", "decoder", "gradient")
    assert d.state == COULD_NOT_RUN and "p = 0.167" in d.detail


def _candidate(scale, arch_heads, lr, loss):
    return Run(f"lr-{scale}-{arch_heads}-{lr}", "c", "FINISHED",
               {"headroom.stage": "lr_search", "headroom.arm": "dense", "headroom.scale": scale,
                "headroom.family": "decoder", "headroom.heads": str(arch_heads)},
               {"val/loss": loss}, {"lr": str(lr), "head_dim": "8"})


@pytest.mark.parametrize("losses, state", [((2.3, 2.1, 2.0, 2.2, 2.5), PASSED),  # best inside
                                           ((2.5, 2.4, 2.3, 2.2, 2.1), FAILED),  # best the largest tried
                                           ((2.0, 2.1, 2.2, 2.3, 2.4), FAILED)])  # best the smallest tried
def test_a_search_whose_best_rate_is_at_the_edge_of_those_tried_fails(losses, state):
    """Planted: five candidates of one architecture, the best at the middle, at the top, at the bottom of the rates
    tried — the range the sweep declared does not enter (the rates tried sit well inside it)."""
    from orchestration.report.diagnostics import search_brackets

    rates = (2.6e-3, 3.2e-3, 3.9e-3, 4.5e-3, 5.2e-3)
    searches = [_candidate("s", 8, lr, v) for lr, v in zip(rates, losses)]
    d = search_brackets(searches, Cell("s", None), "decoder")
    assert d.state == state, d.detail
    assert search_brackets([], Cell("s", None), "decoder").state == NOT_APPLICABLE
    assert search_brackets(None, Cell("s", None), "decoder").state == COULD_NOT_RUN


@pytest.mark.parametrize("grid, state", [({"0.0001": 2.3, "0.0003": 2.1, "0.001": 2.2}, PASSED),
                                         ({"0.0001": 2.3, "0.0003": 2.2, "0.001": 2.1}, FAILED)])
def test_a_recovery_whose_chosen_rate_is_at_the_edge_of_its_grid_fails(grid, state):
    from orchestration.report.diagnostics import recovery_brackets

    data = sweep()
    runs = [Run(r.run_id, r.name, r.status, r.tags,
                {**r.metrics, **{f"finetune/val_loss/lr{k}": v for k, v in grid.items()}}, r.params)
            if r.arm == "pruned" else r for r in data.runs]
    d = recovery_brackets(runs, Cell("s", None), "decoder")
    assert d.state == state, d.detail
    rep = build(SweepRuns("memory", "t", "hash", "parent", None, runs, [], {}))
    assert states(rep, "s")["recovery_rate_brackets"] == state
    if state == FAILED:
        assert rep.headline("s", "decoder").startswith("untrustworthy")


@pytest.mark.parametrize("tried, charged, state", [(3, 3, PASSED),   # the grid, as charged
                                                   (4, 3, FAILED),   # one rate past the grid's edge
                                                   (1, 1, PASSED),   # a fixed rate
                                                   (2, 1, FAILED)])
def test_a_recovery_that_trained_more_than_its_scratch_b_was_charged_fails(tried, charged, state):
    """Planted: each recovered prune trained F for each of `tried` rates; its Scratch-B was charged F for each of
    `charged`. More tried than charged hands the pruned arm compute its Scratch-B never had."""
    from orchestration.report.diagnostics import scratch_b_charged

    data = sweep()
    F = 10  # the synthetic prunes' finetune_steps
    runs = [Run(r.run_id, r.name, r.status, r.tags, {**r.metrics, "cost/recovery_steps": F * tried}, r.params)
            if r.arm == "pruned" else r for r in data.runs]
    d = scratch_b_charged(runs, Cell("s", None), "decoder", charged)
    assert d.state == NOT_APPLICABLE  # the synthetic sweep trains no Scratch-B
    pruned = [r for r in runs if r.arm == "pruned" and r.scale == Cell("s", None)]
    control = _run("scratch_b", "s", 0, {"final/id/loss": 2.0}, ratio=0.5, method="gradient")
    d = scratch_b_charged(runs + [control], Cell("s", None), "decoder", charged)
    assert d.state == state, d.detail
    assert d.detail.startswith(f"{len(pruned) if state == PASSED else 0} of {len(pruned)} recovered prunes")
    if state == FAILED:
        assert f"up to {tried / charged:.2f}×" in d.detail
    assert scratch_b_charged(runs + [control], Cell("s", None), "decoder", None).state == COULD_NOT_RUN
