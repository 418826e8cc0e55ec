"""When the extra heads matter, on a synthetic MLflow store with the answer planted: a known linear trend of the
primary gap in log10(tokens per parameter) with a crossover inside the swept budgets (and one without), and prune
timings that match, and do not match, pruning the trained model. Checked against scipy and the planted truth."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats
from test_report import Store

from orchestration.report import write_report

SPEC = """
name: budgets
family: decoder
data: {source: stdlib}
scales:
  xs: {steps: [100, 300, 900, 2700]}
seeds: [0, 1, 2, 3]
prune: {ratios: [0.5], methods: [gradient], finetune_steps: 10, tolerance: 0.05, at: [0, 0.5, 1]}
controls: [scratch_e, scratch_b]
"""
BUDGETS, SEEDS, PARAMS, BATCH, SEQ = [100, 300, 900, 2700], [0, 1, 2, 3], 1e5, 8, 64
A, B = -0.2, 0.25  # Scratch-E gap = A + B·log10(tokens per parameter): crosses 0 at 10**0.8 ≈ 6.31 tokens/param
NO_CROSS = (0.3, 0.05)  # Scratch-B: always positive over the range
TIMING = {0.0: 0.30, 0.5: 0.001, 1.0: 0.0}  # final loss above pruning the trained model, by prune_at


def _tpp(T: int) -> float:
    return T * BATCH * SEQ / PARAMS


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    d = tmp_path_factory.mktemp("budgets")
    uri = f"sqlite:///{d / 'mlflow.db'}"
    store = Store(uri, "budgets")
    parent = store.parent(SPEC, "budgets0001")
    rng = np.random.default_rng(7)
    gaps = {"scratch_e": {}, "scratch_b": {}}
    timing = {}
    for T in BUDGETS:
        for s in SEEDS:
            common = {"scale": "xs", "seed": s, "steps": T}
            store.child(parent, f"xs-T{T}-decoder-dense-s{s}", {"final/id/loss": 2.0, "params": PARAMS}, **common)
            base = 2.1 + 0.01 * s
            for at, extra in TIMING.items():
                loss = base + extra + (rng.normal(0, 0.002) if at != 1.0 else 0.0)
                timing[(T, s, at)] = loss
                name = f"xs-T{T}-decoder-pruned-gradient-r0.5" + (f"-at{at:g}" if at != 1 else "") + f"-s{s}"
                run = store.child(parent, name, {"final/id/loss": loss, "dense/id/loss": 2.0, "pre_ft/id/loss": loss,
                                                 "params_dense": PARAMS},
                                  arm="pruned", method="gradient", ratio="0.5", scope="per_layer",
                                  schedule="one_shot", prune_at=f"{at:g}", kept="4,4", **common)
                for k, v in (("steps", T), ("batch_size", BATCH), ("seq_len", SEQ)):
                    store.c.log_param(run, k, str(v))
            for arm, (a, b) in (("scratch_e", (A, B)), ("scratch_b", NO_CROSS)):
                g = a + b * math.log10(_tpp(T)) + rng.normal(0, 0.01)
                gaps[arm][(T, s)] = g
                store.child(parent, f"xs-T{T}-decoder-{arm}-r0.5-s{s}", {"final/id/loss": base + g}, arm=arm,
                            ratio="0.5", scope="per_layer", heads="4", **common)
    out, rep = write_report(uri, "budgets", d / "report")
    return out, rep, gaps, timing


def test_a_planted_trend_is_recovered_with_its_slope_and_crossover(planted):
    out, rep, gaps, _ = planted
    v = json.loads((out / "verdict.json").read_text())
    rows = {(t["control"], t["axis"]): t for t in v["trend"]}
    assert set(rows) == {("scratch_e", "tokens_per_param"), ("scratch_b", "tokens_per_param")}  # one size: no params
    assert set(rows["scratch_e", "tokens_per_param"]) >= {"family", "ratio", "control", "axis", "slope", "slope_ci95",
                                                         "crossover", "crossover_ci95"}
    for arm, truth in (("scratch_e", B), ("scratch_b", NO_CROSS[1])):
        t = rows[arm, "tokens_per_param"]
        x = [math.log10(_tpp(T)) for T in BUDGETS for _ in SEEDS]
        y = [gaps[arm][(T, s)] for T in BUDGETS for s in SEEDS]
        ref = stats.linregress(x, y)  # the same least squares, computed independently
        half = stats.t.ppf(0.975, len(x) - 2) * ref.stderr
        assert t["slope"] == pytest.approx(ref.slope, abs=1e-9)
        assert t["slope_ci95"] == pytest.approx([ref.slope - half, ref.slope + half], abs=1e-9)
        assert t["slope_ci95"][0] < truth < t["slope_ci95"][1]
    e = rows["scratch_e", "tokens_per_param"]
    true_cross = 10 ** (-A / B)
    assert e["crossover"] == pytest.approx(true_cross, rel=0.15)
    assert e["crossover_ci95"][0] < true_cross < e["crossover_ci95"][1]
    assert e["crossover_ci95"][0] < e["crossover"] < e["crossover_ci95"][1] and e["established"] is True
    b = rows["scratch_b", "tokens_per_param"]  # planted positive everywhere: no crossover in the swept range
    assert b["crossover"] is None and b["crossover_ci95"] is None and b["established"] is False
    assert b["x_range"] == pytest.approx([_tpp(100), _tpp(2700)])
    md = (out / "report.md").read_text()
    assert "6b. Training budget and the crossover" in md and f"none within {_tpp(100):.3g}–{_tpp(2700):.3g}" in md
    for png in ("trend_tokens_per_param.png", "budget_map.png"):
        assert (out / "plots" / png).stat().st_size > 1000


def test_each_budget_is_a_cell_of_its_own(planted):
    _, rep, _, _ = planted
    cells = {c.scale for c in rep.comparisons}
    assert cells == {f"xs-T{T}" for T in BUDGETS}
    # the timing prunes stay out of the ordinary comparisons: 4 seeds each, pruned at p = 1 only
    assert all(c.n_seeds == 4 for c in rep.comparisons)
    e = [c for c in rep.primary() if c.control == "scratch_e" and c.scale == "xs-T2700"][0]
    assert e.pruned_loss == pytest.approx(np.mean([2.1 + 0.01 * s for s in SEEDS]))


def test_prune_timing_rows_say_whether_early_matches_late(planted):
    out, rep, _, timing = planted
    v = json.loads((out / "verdict.json").read_text())
    rows = {(t["scale"], t["prune_at"]): t for t in v["timing"]}
    assert set(rows) == {(f"xs-T{T}", p) for T in BUDGETS for p in TIMING}
    for T in BUDGETS:
        for p in TIMING:
            t = rows[f"xs-T{T}", p]
            vals = [timing[(T, s, p)] for s in SEEDS]
            lo, hi = stats.t.interval(0.95, len(vals) - 1, loc=np.mean(vals), scale=stats.sem(vals))
            assert (t["n_seeds"], t["method"], t["ratio"]) == (4, "gradient", 0.5)
            assert t["loss_mean"] == pytest.approx(np.mean(vals)) and t["loss_ci95"] == pytest.approx([lo, hi])
            assert t["dense_loss"] == pytest.approx(2.0)
        assert rows[f"xs-T{T}", 1.0]["vs_late"] == "reference"
        assert rows[f"xs-T{T}", 0.5]["vs_late"] == "matches"  # within ±5% of the late loss
        assert rows[f"xs-T{T}", 0.0]["vs_late"] == "worse"
        assert rows[f"xs-T{T}", 0.0]["vs_late_mean"] == pytest.approx(
            np.mean([timing[(T, s, 0.0)] - timing[(T, s, 1.0)] for s in SEEDS]))
    assert "6a. Prune timing" in (out / "report.md").read_text()
    assert (out / "plots" / "timing_xs-T100_decoder_gradient.png").stat().st_size > 1000


def test_the_sweep_summary_lists_cells_in_scale_and_budget_order():
    """The end-of-sweep loss table: scales in preset order, each scale's budgets increasing (not as text)."""
    from types import SimpleNamespace

    from orchestration.summary import loss_table

    def run(scale, steps, arm, loss):
        tags = {"headroom.stage": "train", "headroom.arm": arm, "headroom.scale": scale, "headroom.family": "decoder",
                "headroom.ratio": "none" if arm == "dense" else "0.5", "headroom.scope": "none", "headroom.method":
                "none", "headroom.steps": str(steps)}
        return SimpleNamespace(data=SimpleNamespace(tags=tags, metrics={"final/id/loss": loss}),
                               info=SimpleNamespace(status="FINISHED"))

    runs = [run(sc, T, arm, 2.0) for sc in ("s", "xs") for T in (900, 100, 300) for arm in ("dense", "scratch_e")]
    runs += [SimpleNamespace(data=SimpleNamespace(tags={**runs[0].data.tags, "headroom.stage": "prune",
                                                         "headroom.arm": "pruned", "headroom.method": "gradient",
                                                         "headroom.scope": "per_layer", "headroom.ratio": "0.5"},
                                                   metrics={"final/id/loss": 2.1}),
                             info=SimpleNamespace(status="FINISHED"))]
    lines = loss_table("t", runs).splitlines()
    cells = [line.split()[0] for line in lines[4:]]
    assert cells == ["xs-T100", "xs-T300", "xs-T900", "s-T100", "s-T300", "s-T900"], lines
