"""The split-half stability of a head ranking (lightning_modules/pruning/stability.py) against hand computations and
planted rankings, on a trained model against the halves scored one by one, and the report's aggregation of it and
its comparison of methods (report/scorers.py) — with the method gaps' false-positive rate and power by simulation
(docs/design.md states the rates)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lightning_modules.pruning.stability import agreement, spearman, split_half
from orchestration.report.read import Run
from orchestration.report.scorers import method_gaps, stability


def test_spearman_by_hand():
    # one swapped pair of four: 1 − 6·Σd²/(n(n² − 1)) = 1 − 6·2/60
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    # a tie gets the average rank: ranks (1.5, 1.5, 3, 4) against (1, 2, 3, 4), Pearson of the ranks = 4.5/√(4.5·5)
    assert spearman([1, 1, 2, 3], [1, 2, 3, 4]) == pytest.approx(4.5 / math.sqrt(4.5 * 5))
    assert spearman([1, 2], [2, 1]) is None and spearman([1, 1, 1], [1, 2, 3]) is None


def test_spearman_equals_scipys_with_ties():
    """The rank correlation without scipy (prune trials do not import it) against scipy.stats.spearmanr."""
    import random

    from scipy.stats import spearmanr

    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(3, 12)
        a, b = [rng.randint(0, 4) for _ in range(n)], [rng.random() for _ in range(n)]
        if len(set(a)) > 1:
            assert spearman(a, b) == pytest.approx(spearmanr(a, b).statistic, abs=1e-12)


def test_agreement_of_planted_rankings():
    """Two layers of four heads. Equal rankings agree perfectly; reversed ones within each layer correlate −1, and
    their pruned sets share nothing up to half the heads, 2 of 3 per layer at 0.75. Chance per layer, by hand:
    Σ k_l²/n_l over Σ k_l; globally k/N."""
    a = torch.tensor([[1.0, 2.0, 3.0, 4.0], [8.0, 7.0, 6.0, 5.0]])
    same = agreement(a, a.clone(), [4, 4], "per_layer", (0.25, 0.5, 0.75))
    assert same["spearman"] == pytest.approx(1) and same["spearman_layer_min"] == pytest.approx(1)
    assert same["overlap"] == {0.25: 1.0, 0.5: 1.0, 0.75: 1.0}
    assert same["chance"] == pytest.approx({0.25: (1 / 4 + 1 / 4) / 2, 0.5: (4 / 4 + 4 / 4) / 4,
                                            0.75: (9 / 4 + 9 / 4) / 6})
    rev = agreement(a, a.flip(1), [4, 4], "per_layer", (0.25, 0.5, 0.75))
    assert rev["spearman"] == pytest.approx(-1) and rev["spearman_layer_min"] == pytest.approx(-1)
    assert rev["overlap"] == pytest.approx({0.25: 0.0, 0.5: 0.0, 0.75: 4 / 6})
    # global: one ranking over all 8 heads; b moves layer 1 above layer 0 wholesale
    b = torch.tensor([[1.0, 2.0, 3.0, 4.0], [18.0, 17.0, 16.0, 15.0]])
    g = agreement(a, b, [4, 4], "global", (0.5,))
    assert g["spearman"] == pytest.approx(1.0) and g["overlap"] == {0.5: 1.0} and g["chance"] == {0.5: 0.5}
    c = torch.tensor([[5.0, 6.0, 7.0, 8.0], [4.0, 3.0, 2.0, 1.0]])  # layer 0 now above layer 1
    g = agreement(a, c, [4, 4], "global", (0.5,))
    # the 4 lowest of a are layer 0's, but a layer keeps its last head: a removes (0,0), (0,1), (0,2) and (1,3);
    # c removes (1,3), (1,2), (1,1) and (0,0): they share (0,0) and (1,3)
    assert g["overlap"] == {0.5: 2 / 4}
    d = [1, 2, 3, 4, 8, 7, 6, 5]
    e = [5, 6, 7, 8, 4, 3, 2, 1]
    assert g["spearman"] == pytest.approx(spearman(d, e))


def test_a_layer_of_fewer_heads_and_nan_scores():
    """Three heads in layer 1 (NaN beyond them): the layer enters its own correlation over three heads; a NaN the
    method leaves in layer 0 (a dead head) enters no correlation: layer 0 correlates heads 1–3 alone."""
    nan = float("nan")
    a = torch.tensor([[nan, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, nan]])
    b = torch.tensor([[1.0, 2.0, 4.0, 3.0], [3.0, 2.0, 1.0, nan]])
    r = agreement(a, b, [4, 3], "per_layer", (0.5,))
    # layer 0: (2, 3, 4) against (2, 4, 3): 1 − 6·2/(3·8) = 0.5; layer 1: reversed, −1
    assert r["spearman_layer_min"] == pytest.approx(-1.0)
    assert r["spearman"] == pytest.approx((0.5 + -1.0) / 2)


@pytest.fixture(scope="module")
def trained_and_calibration(xs_decoder_run):
    from lightning_modules.data.datamodule import HeadroomData
    from lightning_modules.declarations.config import DataConfig, train_config_for
    from lightning_modules.models.build import load_model

    data = HeadroomData(DataConfig(), train_config_for("xs", batch_size=8)).prepare()
    return load_model(xs_decoder_run / "model"), list(data.loader("calibration", 4, batch_size=8))


@pytest.mark.parametrize("method", ["gradient", "activation"])
def test_split_half_on_a_trained_model(trained_and_calibration, method):
    """The trained xs decoder: the halves scored one by one here, compared by hand with `spearman` per layer, give
    split_half's numbers; with two copies of one half the agreement is perfect; a method that reads no data, or
    one batch, has none."""
    from lightning_modules.pruning.scoring import score_heads

    model, calib = trained_and_calibration
    got = split_half(model, calib, method, "per_layer", 0.5, None)
    a, b = (score_heads(model, part, method) for part in (calib[:2], calib[2:]))
    by_layer = [spearman(a[l].tolist(), b[l].tolist()) for l in range(a.shape[0])]
    assert got["batches"] == [2, 2]
    assert got["spearman"] == pytest.approx(sum(by_layer) / len(by_layer))
    assert got["spearman_layer_min"] == pytest.approx(min(by_layer))
    assert set(got["overlap"]) == {0.25, 0.5, 0.75}
    twice = split_half(model, calib[:2] * 2, method, "per_layer", 0.5, None)
    assert twice["spearman"] == pytest.approx(1) and set(twice["overlap"].values()) == {1.0}
    assert split_half(model, calib, "magnitude", "per_layer", 0.5, None) is None
    assert split_half(model, calib[:1], method, "per_layer", 0.5, None) is None


# ------------------------------------------------------------------------------------------- the report


def _run(method, seed, metrics, ratio="0.5", scope="per_layer"):
    tags = {"stage": "prune", "arm": "pruned", "scale": "xs", "family": "decoder", "heads": "8", "method": method,
            "ratio": ratio, "scope": scope, "schedule": "one_shot", "seed": str(seed), "prune_at": "1"}
    rid = f"{method}-{ratio}-{scope}-{seed}"
    return Run(rid, rid, "FINISHED", {f"headroom.{k}": v for k, v in tags.items()}, metrics,
               {"finetune_steps": "10"})


def test_the_report_pools_stability_over_seeds_once_per_seed():
    """Per (cell, method, scope): the mean Spearman over seeds, its lowest seed, the lowest layer, the overlaps'
    means; two ratios of one seed read the same halves and count once; `low` below 0.5."""
    m = lambda rho, lay, ov: {"stability/spearman": rho, "stability/spearman_layer_min": lay,  # noqa: E731
                              "stability/overlap/r0.5": ov, "stability/chance/r0.5": 0.5}
    runs = [_run("gradient", 0, m(0.9, 0.7, 1.0)), _run("gradient", 0, m(0.9, 0.7, 1.0), ratio="0.25"),
            _run("gradient", 1, m(0.5, 0.1, 0.75)), _run("entropy", 0, m(0.2, -0.3, 0.5)),
            _run("random", 0, {})]
    rows = {x.method: x for x in stability(runs)}
    assert set(rows) == {"gradient", "entropy"}
    g = rows["gradient"]
    assert g.n_seeds == 2 and g.spearman == pytest.approx(0.7) and g.spearman_lowest_seed == 0.5
    assert g.spearman_layer_min == 0.1 and g.overlap == {0.5: pytest.approx(0.875)} and not g.low
    assert rows["entropy"].low and rows["entropy"].to_json()["overlap"] == {"0.5": 0.5}


def _gap_runs(rng, shift: dict[str, float], seeds: int = 5) -> list[Run]:
    """Per seed a dense model's loss (shared by its prunes) and each method's pre-fine-tune loss around it."""
    runs = []
    for s in range(seeds):
        base = 2.0 + rng.normal(0, 0.1)
        for method in ("gradient", "activation", "random"):
            runs.append(_run(method, s, {"pre_ft/id/loss": base + shift.get(method, 0.0) + rng.normal(0, 0.05),
                                         "dense/id/loss": 1.9}))
    return runs


def test_method_gaps_by_hand():
    """Each method minus gradient, paired by seed: the mean and Student-t interval of the differences."""
    from scipy import stats as st

    runs = _gap_runs(np.random.default_rng(0), {"random": 0.3})
    rows = {g.method: g for g in method_gaps(runs)}
    assert set(rows) == {"activation", "random"}
    loss = {(r.tag("method"), r.seed): r.metrics["pre_ft/id/loss"] for r in runs}
    d = [loss[("random", s)] - loss[("gradient", s)] for s in range(5)]
    want = st.t.interval(0.95, 4, loc=np.mean(d), scale=st.sem(d))
    assert rows["random"].diff_mean == pytest.approx(np.mean(d)) and rows["random"].ci95 == pytest.approx(want)
    assert rows["random"].reference == "gradient" and rows["random"].verdict == "worse"


SIMS = 400


def test_method_gaps_false_positives_and_power():
    """Planted null (every method draws from one distribution): some method called worse or better than gradient
    in at most α of the simulated sweeps (Holm over the 2 methods; bound + 3 Monte Carlo SE). Planted effect
    (random 0.2 nats worse, noise SD 0.05 per run — 2.8 SDs of a paired difference — 5 seeds): random called worse
    in at least 90%. (At 0.1 nats, 1.4 SDs, it is found in about half: docs/design.md.)"""
    rng = np.random.default_rng(3)
    false = sum(any(g.verdict != "indistinguishable" for g in method_gaps(_gap_runs(rng, {})))
                for _ in range(SIMS))
    assert false / SIMS <= 0.05 + 3 * (0.05 * 0.95 / SIMS) ** 0.5, false / SIMS
    found = sum(next(g for g in method_gaps(_gap_runs(rng, {"random": 0.2})) if g.method == "random").verdict
                == "worse" for _ in range(SIMS))
    assert found / SIMS >= 0.9, found / SIMS
    print(f"\nmethod gaps: null {false / SIMS:.3f} any call, effect found {found / SIMS:.3f}")
