"""Mechanism probes: linear CKA against the HSIC definition, head redundancy against a pairwise loop and a model
with identical heads, the prunable fraction by hand, and a probed training run against an unprobed one."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_modules.declarations.config import DataConfig, model_config_for, prunable_fraction, train_config_for
from lightning_modules.models.build import build_model
from lightning_modules.models.families import family_of
from lightning_modules.pruning.probes import ProbeCallback, _cka_matrix, head_redundancy, linear_cka, mean_off_diagonal


def _hsic_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """Kornblith et al. 2019, eq. (1)-(3) with linear kernels: HSIC(K, L) = tr(K H L H) / (n-1)^2."""
    x, y = x.double(), y.double()
    n = x.shape[0]
    h = torch.eye(n, dtype=torch.float64) - torch.full((n, n), 1.0 / n, dtype=torch.float64)
    k, l = x @ x.T, y @ y.T

    def hsic(a, b):
        return torch.trace(a @ h @ b @ h) / (n - 1) ** 2

    return float(hsic(k, l) / torch.sqrt(hsic(k, k) * hsic(l, l)))


def test_linear_cka_matches_hsic_definition_and_invariances():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(60, 5, generator=g)
    y = x @ torch.randn(5, 7, generator=g) + 0.5 * torch.randn(60, 7, generator=g)
    assert linear_cka(x, y) == pytest.approx(_hsic_cka(x, y), rel=1e-9)
    q, _ = torch.linalg.qr(torch.randn(5, 5, generator=g))
    assert linear_cka(x, 2.5 * x @ q + 3.0) == pytest.approx(1.0, abs=1e-9)  # orthogonal map, scale, shift
    unrelated = linear_cka(torch.randn(4000, 4, generator=g), torch.randn(4000, 4, generator=g))
    assert unrelated < 0.01


def test_cka_matrix_equals_pairwise_loop():
    g = torch.Generator().manual_seed(1)
    n_heads, d = 4, 3
    z = torch.randn(80, n_heads * d, generator=g)
    z[:, d:2 * d] = z[:, :d] @ torch.randn(d, d, generator=g)  # head 1 a linear map of head 0
    m = _cka_matrix(z, n_heads)
    for i in range(n_heads):
        for j in range(n_heads):
            ref = linear_cka(z[:, i * d:(i + 1) * d], z[:, j * d:(j + 1) * d])
            assert m[i, j].item() == pytest.approx(ref, rel=1e-5)
    off = [m[i, j].item() for i in range(n_heads) for j in range(n_heads) if i != j]
    assert mean_off_diagonal(m) == pytest.approx(sum(off) / len(off), rel=1e-6)


def test_identical_heads_are_fully_redundant():
    model = build_model(model_config_for("xs", "decoder"), seed=0)
    fam = family_of(model)
    attn = fam.attentions(model)[0]
    n, kv, hd = fam.shape(attn)
    assert n == kv, "xs has one key/value head per query head"
    with torch.no_grad():
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
            w = proj.weight
            for h in range(1, n):
                w[h * hd:(h + 1) * hd] = w[:hd]
    ids = torch.randint(3, 200, (2, 32), generator=torch.Generator().manual_seed(0))
    mats = head_redundancy(model, [{"input_ids": ids}])
    assert len(mats) == len(fam.attentions(model)) and mats[0].shape == (n, n)
    assert torch.allclose(mats[0], torch.ones(n, n), atol=1e-5)
    assert mean_off_diagonal(mats[1]) < 0.99  # untouched layer: random heads are not identical


def test_prunable_fraction_by_hand():
    ratios = [0.0, 0.1, 0.2, 0.3]
    # limit 2.0 * 1.05 = 2.1: 0.1 passes, 0.2 fails, and 0.3 passing again does not count ("stays within")
    assert prunable_fraction(ratios, [2.0, 2.05, 2.2, 2.06], 2.0, 0.05) == 0.1
    assert prunable_fraction(ratios, [2.0, 2.0, 2.0, 2.0], 2.0, 0.05) == 0.3
    assert prunable_fraction(ratios, [2.2, 2.0, 2.0, 2.0], 2.0, 0.05) == 0.0


def test_probed_training_equals_unprobed(cache_dir):
    from lightning_modules.training.loop import train_lm

    def run(callbacks):
        return train_lm(model_config_for("xs", "decoder"), train_config_for("xs", steps=8, seed=3, val_every=8,
                                                                          eval_batches=2),
                        DataConfig(), progress=False, callbacks=callbacks, final_eval=True)

    rows = []
    probe = ProbeCallback(rows.extend, every=4, batches=2, tolerance=0.05)
    probed = run([probe])
    plain = run([])
    for (k, a), b in zip(probed.lm.model.state_dict().items(), plain.lm.model.state_dict().values()):
        assert torch.equal(a, b), f"{k} differs: probing changed training"
    steps = sorted({r[1] for r in rows})
    assert steps == [0, 4, 8]
    by = {(r[0], r[1]): r[2] for r in rows}
    for s in steps:
        assert by[("probe/prunable_fraction", s)] in [k / 8 for k in range(8)]  # fractions 8 heads allow
        assert by[("probe/importance_spread", s)] >= 0
        assert 0 <= by[("probe/redundancy", s)] <= 1 + 1e-6
        layers = [by[(f"probe/redundancy/layer{l}", s)] for l in range(model_config_for("xs", "decoder").n_layers)]
        assert by[("probe/redundancy", s)] == pytest.approx(sum(layers) / len(layers))
    assert not math.isnan(by[("probe/redundancy", 8)])
