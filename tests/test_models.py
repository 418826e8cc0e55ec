"""Loading checkpoints: headroom's own, plain transformers directories, and the ones headroom must refuse."""


import pytest
import torch

from lightning_modules.declarations.config import HeadroomInputError, model_config_for
from lightning_modules.models.build import build_model, load_model, model_config_of, save_model
from lightning_modules.models.families import layer_shapes


def test_same_seed_same_model_other_seed_other_model():
    cfg = model_config_for("xs", "encoder", n_heads=6)  # reshaped path (head_dim 8 ≠ 64/6)
    a, b, c = build_model(cfg, 0), build_model(cfg, 0), build_model(cfg, 1)
    for (k, pa), pb, pc in zip(a.state_dict().items(), b.state_dict().values(), c.state_dict().values()):
        assert torch.equal(pa, pb), k
    assert not torch.equal(a.state_dict()["bert.encoder.layer.0.attention.self.query.weight"],
                           c.state_dict()["bert.encoder.layer.0.attention.self.query.weight"])
    # BERT's own init (std = initializer_range) for the reshaped attention weights
    std = a.bert.encoder.layer[0].attention.self.query.weight.std().item()
    assert 0.015 < std < 0.025


@pytest.mark.parametrize("family", ["decoder", "encoder"])
def test_non_uniform_model_round_trip(tmp_path, family):
    cfg = model_config_for("xs", family, heads_per_layer=[3, 7])
    m = build_model(cfg, 0).eval()
    save_model(m, tmp_path / "m")
    back = load_model(tmp_path / "m")
    assert layer_shapes(back) == [(3, 3, 8), (7, 7, 8)]
    assert model_config_of(back) == cfg
    ids = torch.randint(0, 256, (2, 20))
    with torch.no_grad():
        assert torch.equal(back(input_ids=ids).logits, m(input_ids=ids).logits)


def test_headroom_encoder_is_rotary_and_keeps_it_after_loading(tmp_path):
    m = build_model(model_config_for("xs", "encoder"), 0)
    assert m.config._attn_implementation == "headroom_rope_sdpa"
    save_model(m, tmp_path / "enc")
    assert load_model(tmp_path / "enc").config._attn_implementation == "headroom_rope_sdpa"


def test_plain_bert_without_lm_head_loads(tmp_path):
    import transformers as tf

    cfg = tf.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=32)
    tf.BertModel(cfg).save_pretrained(tmp_path / "b")
    m = load_model(tmp_path / "b")
    assert type(m).__name__ == "BertModel" and layer_shapes(m) == [(4, 4, 8)] * 2


@pytest.mark.parametrize("make,match", [
    (lambda d: None, "no such directory"),
    (lambda d: d.mkdir(), "no config.json"),
    (lambda d: (d.mkdir(), (d / "config.json").write_text('{"model_type": "t5"}')), "not supported"),
    (lambda d: (d.mkdir(), (d / "config.json").write_text("{not json")), "not valid JSON"),
])
def test_unsupported_checkpoints_are_refused_in_one_line(tmp_path, make, match):
    d = tmp_path / "ckpt"
    make(d)
    with pytest.raises(HeadroomInputError, match=match) as e:
        load_model(d)
    assert "\n" not in str(e.value)


def test_truncated_weights_are_refused(tmp_path):
    m = build_model(model_config_for("xs", "decoder", heads_per_layer=[2, 5]), 0)
    save_model(m, tmp_path / "m")
    from safetensors.torch import load_file, save_file

    state = load_file(str(tmp_path / "m" / "model.safetensors"))
    state.pop("model.layers.1.self_attn.q_proj.weight")
    save_file(state, str(tmp_path / "m" / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(HeadroomInputError, match="do not match"):
        load_model(tmp_path / "m")
