"""Head importance on a trained xs model: planted dead heads are found, batched ablation equals the sequential
loop, gradient importance equals a one-example-at-a-time reference, entropy and confidence equal hand-computed
values, and informed methods beat random pruning."""

import math
import statistics

import pytest
import torch
from tolerance import assert_close_to_scale

from lightning_modules.data.datamodule import HeadroomData
from lightning_modules.declarations.config import DataConfig, HeadroomInputError, train_config_for
from lightning_modules.models.build import load_model, token_losses
from lightning_modules.models.heads import head_gate, prune_heads
from lightning_modules.pruning.choose import heads_to_keep
from lightning_modules.pruning.measure import evaluate_loss
from lightning_modules.pruning.scoring import (
    l0_open_probability,
    score_ablation,
    score_gradient,
    score_heads,
)

PLANTED = [(0, 1), (0, 6), (1, 3)]


@pytest.fixture(scope="module")
def data():
    return HeadroomData(DataConfig(), train_config_for("xs", batch_size=8)).prepare()


@pytest.fixture(scope="module")
def calib(data):
    # 64 windows: enough that no live head of the trained xs model has a negative leave-one-out effect
    return list(data.loader("calibration", 4, batch_size=16))


@pytest.fixture
def trained(xs_decoder_run):
    return load_model(xs_decoder_run / "model")


@pytest.fixture
def planted(trained):
    with torch.no_grad():
        for l, h in PLANTED:
            trained.model.layers[l].self_attn.o_proj.weight[:, h * 8:(h + 1) * 8] = 0
    return trained


def _lowest(scores, k):
    flat = sorted((scores[l, h].item(), (l, h)) for l in range(scores.shape[0]) for h in range(scores.shape[1]))
    return sorted(x[1] for x in flat[:k])


@pytest.mark.parametrize("method,opts", [("gradient", {}), ("ablation", {}), ("magnitude", {}),
                                         ("l0", {"steps": 40, "lr": 0.1})])
def test_planted_dead_heads_rank_last_and_prune_for_free(planted, calib, method, opts):
    scores = score_heads(planted, calib, method, **opts)
    assert _lowest(scores, len(PLANTED)) == sorted(PLANTED), scores
    ids = calib[0]["input_ids"]
    with torch.no_grad():
        before = planted(input_ids=ids).logits
    keep = heads_to_keep(scores, [8, 8], len(PLANTED) / 16, "global")  # the three lowest, wherever they are
    assert keep == [[h for h in range(8) if (l, h) not in PLANTED] for l in range(2)]
    prune_heads(planted, keep)
    with torch.no_grad():
        assert_close_to_scale(planted(input_ids=ids).logits, before)


@pytest.mark.parametrize("which", ["decoder", "encoder"])
def test_batched_ablation_equals_sequential_loop(trained, xs_encoder, data, which):
    if which == "decoder":
        model, batches = trained, list(data.loader("calibration", 1))
    else:
        model, batches = xs_encoder.lm.model.eval(), list(xs_encoder.data.loader("calibration", 1, batch_size=8))
    batched = score_ablation(model, batches, token_losses, max_rows=256)  # many masks per pass
    sequential = score_ablation(model, batches, token_losses, masks_per_pass=1)
    assert_close_to_scale(batched, sequential)
    assert batched.abs().max() > 1e-3


def test_gradient_importance_matches_per_example_reference(trained, calib):
    """E_x |∂L(x)/∂ξ|, |·| per example, then L2-normalised per layer — against a loop over single examples."""
    gate = head_gate(trained)
    ref, n = torch.zeros(2, 8), 0
    calib = calib[:1]
    for batch in calib:
        for b in range(batch["input_ids"].shape[0]):
            xi = gate.ones(1, requires_grad=True)
            s, c = token_losses(trained, {k: v[b:b + 1] for k, v in batch.items()})
            (s / c).sum().backward()
            ref += xi.grad[0].abs()
            n += 1
    gate.clear()
    ref = ref / n
    torch.testing.assert_close(score_gradient(trained, calib, token_losses, normalize=False), ref, atol=1e-6,
                               rtol=1e-4)
    normed = score_gradient(trained, calib, token_losses)
    torch.testing.assert_close(normed, ref / ref.norm(dim=1, keepdim=True), atol=1e-6, rtol=1e-4)
    # the per-batch shortcut (|Σ_x ∂L/∂ξ|) is a different, smaller number: we really take |·| per example
    xi = gate.ones(1, requires_grad=True)
    s, c = token_losses(trained, calib[0])
    (s / c).sum().backward()
    assert (xi.grad[0].abs() / calib[0]["input_ids"].shape[0]).sum() < ref.sum()
    gate.clear()


def test_entropy_and_confidence_hand_computed():
    """With zero query weights every causal attention row is uniform: row t has entropy ln(t+1) and maximum
    weight 1/(t+1)."""
    import transformers as tf

    torch.manual_seed(0)
    m = tf.LlamaForCausalLM(tf.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64,
                                           num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4,
                                           head_dim=8, max_position_embeddings=32)).eval()
    with torch.no_grad():
        m.model.layers[0].self_attn.q_proj.weight.zero_()
    T = 12
    batches = [{"input_ids": torch.randint(0, 50, (3, T)), "labels": torch.randint(0, 50, (3, T))}]
    ent = score_heads(m, batches, "entropy")
    conf = score_heads(m, batches, "confidence")
    expect_ent = -sum(math.log(t + 1) for t in range(T)) / T
    expect_conf = sum(1 / (t + 1) for t in range(T)) / T
    assert_close_to_scale(ent, torch.full((1, 4), expect_ent))
    assert_close_to_scale(conf, torch.full((1, 4), expect_conf))


def test_random_is_seeded(trained):
    a, b, c = (score_heads(trained, None, "random", seed=s) for s in (0, 0, 1))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_l0_open_probability_hand_value():
    # log α = 0: sigmoid(−0.33·ln(0.1/1.1)) = sigmoid(0.7913)
    assert l0_open_probability(torch.tensor(0.0)).item() == pytest.approx(1 / (1 + math.exp(-0.33 * math.log(11))))


def test_unknown_method(trained, calib):
    with pytest.raises(HeadroomInputError, match="unknown method"):
        score_heads(trained, calib, "nonesuch")


# the scores of structured LLM pruning (scoring_llm.py) held to the same bar as Michel's two: measured on this
# model, every one of them beats at least 14 of the 16 random draws (the test prints each)
INFORMED_AT_HALF = ("gradient", "ablation", "activation", "flap", "wanda_sp", "taylor")


def test_informed_methods_beat_random_at_half(trained, data, calib):
    """Removing 50% of heads (no fine-tune) by gradient or ablation hurts less than random removal: the loss is
    below at least 14 of 16 random seeds' and closes at least half the gap between the random median and dense.
    (The random losses are skewed, a few seeds removing the heads that matter, so mean − 2 sd is no stable bar:
    on Python 3.11.2's standard library it failed although gradient beat all 32 random seeds.)"""
    val = list(data.loader("val", 4))
    gate = head_gate(trained)

    def loss_after(scores):
        gate.mask(heads_to_keep(scores, [8, 8], 0.5, "per_layer"))
        loss = evaluate_loss(trained, val)["loss"]
        gate.clear()
        return loss

    dense = evaluate_loss(trained, val)["loss"]
    rand = [loss_after(score_heads(trained, None, "random", seed=s)) for s in range(16)]
    med = statistics.median(rand)
    results = {m: loss_after(score_heads(trained, calib, m)) for m in INFORMED_AT_HALF}
    print(f"\ndense {dense:.4f}; random 50%: median {med:.4f}, sorted {[round(r, 3) for r in sorted(rand)]}; "
          + ", ".join(f"{m} {v:.4f}" for m, v in results.items()))
    for m, v in results.items():
        assert sum(v < r for r in rand) >= 14, (m, v, sorted(rand))
        assert med - v >= 0.5 * (med - dense), (m, v, med, dense)
