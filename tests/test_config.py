"""Configs and derived numbers: presets, head arithmetic, parameter counts (against the real models), FLOPs
(against hand-computed values) and the Scratch-B step count."""

import pytest

from lightning_modules.declarations.config import (
    SCALES,
    HeadroomInputError,
    ModelConfig,
    TrainConfig,
    check_compatible,
    heads_kept,
    model_config_for,
    train_config_for,
    wide_head_dim,
)
from lightning_modules.declarations.costs import flops_per_token, param_counts, scratch_b_steps, train_flops_per_token


def test_presets_follow_the_design():
    assert list(SCALES) == ["xxxs", "xxs", "xs", "s", "m", "l", "xl"]
    for s in SCALES.values():
        assert s.n_heads % 4 == 0, s.name  # ratios 0.25/0.5/0.75 keep whole heads
        assert s.n_heads * s.head_dim == s.d_model, s.name
        assert s.seq_len <= s.max_seq_len
    xl = SCALES["xl"]  # about GPT-2 small
    assert (xl.d_model, xl.n_layers, xl.n_heads, xl.head_dim) == (768, 12, 16, 48)
    # sizes grow with the scale
    params = [param_counts(model_config_for(n)).total for n in SCALES]
    assert params == sorted(params) and params[-1] > 80e6


@pytest.mark.parametrize("h,ratio,kept", [(8, 0.25, 6), (8, 0.5, 4), (8, 0.75, 2), (16, 0.25, 12),
                                          (16, 0.75, 4), (8, 0.0, 8), (8, 0.1, 7)])
def test_heads_kept(h, ratio, kept):
    assert heads_kept(h, ratio) == kept


@pytest.mark.parametrize("ratio", [1.0, -0.1, 0.99])
def test_heads_kept_rejects(ratio):
    with pytest.raises(HeadroomInputError):
        heads_kept(8, ratio)


def test_wide_and_scratch_e_architectures():
    scratch_e = model_config_for("s", n_heads=4)  # keeps the preset head_dim
    assert (scratch_e.n_heads, scratch_e.head_dim) == (4, 16)
    wide = model_config_for("s", n_heads=4, head_dim="auto")
    assert (wide.n_heads, wide.head_dim) == (4, 32) == (4, wide_head_dim(128, 4))
    # an uneven division: the largest even head size that fits (RoPE rotates pairs), never wider than d_model
    assert wide_head_dim(128, 6) == 20 and wide_head_dim(64, 6) == 10 and wide_head_dim(768, 12) == 64
    assert wide_head_dim(128, 3) == 42 and 3 * 42 <= 128
    with pytest.raises(HeadroomInputError, match="less than 2"):
        wide_head_dim(64, 40)


def test_head_dim_auto_is_the_wide_rule():
    # `auto` is the wide control's head size: an even number, whether or not the heads divide d_model
    assert model_config_for("xs", n_heads=6, head_dim="auto").head_dim == 10
    assert model_config_for("s", n_heads=4, head_dim="auto").head_dim == 32
    with pytest.raises(ValueError, match="does not divide"):
        ModelConfig(d_model=64, n_layers=1, n_heads=6, d_ff=8, max_seq_len=8)


@pytest.mark.parametrize("bad", [dict(scale="xxl"), dict(scale="xs", family="seq2seq")])
def test_unknown_scale_or_family(bad):
    with pytest.raises(HeadroomInputError, match="unknown"):
        model_config_for(**bad)


def test_seq_len_beyond_max():
    with pytest.raises(HeadroomInputError, match="max_seq_len"):
        check_compatible(model_config_for("xs"), train_config_for("xs", seq_len=512))


def test_heads_per_layer_validation():
    cfg = model_config_for("xs").with_heads([5, 2])
    assert cfg.layer_heads == [5, 2] and cfg.n_heads == 5 and not cfg.uniform
    with pytest.raises(ValueError):
        model_config_for("xs").with_heads([3, 0])
    with pytest.raises(ValueError):
        model_config_for("xs").with_heads([3, 3, 3])


def test_train_config_rejects_unknown_and_bad_values():
    with pytest.raises(ValueError):
        TrainConfig(steps=10, bogus=1)
    with pytest.raises(HeadroomInputError, match="steps"):
        train_config_for("xs", steps=0)


TINY = dict(family="decoder", d_model=4, n_layers=1, n_heads=2, head_dim=2, d_ff=8, vocab_size=10, max_seq_len=8)


def test_flops_hand_computed():
    f = flops_per_token(ModelConfig(**TINY), seq_len=3)
    # q,k,v,o projections 2·(4·4 + 2·4·4 + 4·4) = 128; scores 2·2·3·4 = 48
    assert f.attention == 176
    assert f.mlp == 2 * 3 * 4 * 8  # SwiGLU: three matrices
    assert f.other == 2 * 4 * 10  # LM head
    assert f.total == 448
    assert train_flops_per_token(ModelConfig(**TINY), 3) == 3 * 448
    enc = flops_per_token(ModelConfig(**{**TINY, "family": "encoder"}), seq_len=3)
    assert enc.mlp == 2 * 2 * 4 * 8 and enc.other == 2 * 4 * 10 + 2 * 4 * 4


def test_the_pruned_arms_compute_by_hand():
    """costs.arm_flops_per_token, per training-step token, forward costs 10 (dense) and 4 (pruned): 5 dense steps
    (3 × 10 each), 2 forward passes of scoring (2 × 10), 3 distilled recovery steps (3 × 4 + a teacher pass of 10
    each) and 7 continued steps at pruned size without a teacher (3 × 4 each)."""
    from lightning_modules.declarations.costs import arm_flops_per_token

    assert arm_flops_per_token(10, 4, 5, 3, distill=True, scoring_passes=2, continued_steps=7) == \
        5 * 30 + 2 * 10 + 3 * (12 + 10) + 7 * 12
    assert arm_flops_per_token(10, 4, 5, 3) == 5 * 30 + 3 * 12


def test_scratch_b_steps_hand_computed():
    dense = ModelConfig(**TINY)
    pruned = dense.with_heads(1)
    # pruned forward: attention 2·(4·2 + 2·4·2 + 2·4) + 2·2·3·2 = 88, mlp 192, head 80 → 360; train 1080
    assert train_flops_per_token(pruned, 3) == 1080
    # dense 10 steps (10·1344) + 2 fine-tune steps (2·1080) = 15600 FLOPs/token → 15600/1080 = 14.4
    assert scratch_b_steps(dense, pruned, dense_steps=10, finetune_steps=2, seq_len=3) == 14
    # the same architecture gets the same steps back
    assert scratch_b_steps(dense, dense, 10, 0, 3) == 10


@pytest.mark.parametrize("family", ["decoder", "encoder"])
@pytest.mark.parametrize("scale,heads,head_dim,per_layer", [
    ("xs", None, None, None), ("xs", 6, None, None), ("xs", 4, "auto", None), ("xs", None, None, [8, 3]),
    ("s", 2, None, None), ("s", None, None, [1, 8, 4, 6]),
])
def test_param_counts_match_built_models(family, scale, heads, head_dim, per_layer):
    from lightning_modules.models.build import build_model, count_parameters
    from lightning_modules.models.families import layer_heads

    cfg = model_config_for(scale, family, n_heads=heads, head_dim=head_dim, heads_per_layer=per_layer)
    model = build_model(cfg, seed=0)
    assert count_parameters(model) == param_counts(cfg).total
    assert count_parameters(model, embeddings=False) == param_counts(cfg).non_embedding < param_counts(cfg).total
    assert layer_heads(model) == cfg.layer_heads


def test_kept_counts_by_hand():
    """How many heads a prune keeps, decided once for the pruner, the prune curve and --plan's rows: per layer
    n − round(ratio·n), never below one; globally round(ratio·N) go, never a layer's last."""
    from lightning_modules.declarations.config import kept_counts

    assert kept_counts([8, 8], 0.5, "per_layer") == ([4, 4], 8)
    assert kept_counts([8, 6], 0.25, "per_layer") == ([6, 4], 10)  # round(1.5) = 2 (halves up)
    assert kept_counts([1, 4], 0.5, "per_layer") == ([1, 2], 3)  # a one-head layer keeps its head
    assert kept_counts([3, 1], 0.5, "global") == (None, 2)  # 2 of 4 go
    assert kept_counts([1, 1], 0.5, "global") == (None, 2)  # each layer's last head stays
    assert kept_counts([8, 8], 0.75, "global") == (None, 4)
