"""The head gate and physical removal, for every supported family: headroom's decoder (trained) and encoder,
a grouped-query Llama, and GPT-2 and BERT checkpoints built and saved with transformers."""

import json
import subprocess
import sys

import pytest
import torch
from tolerance import assert_close_to_scale, assert_detectable

from lightning_modules.declarations.config import HeadroomInputError
from lightning_modules.models.build import load_model, save_model, set_attention, token_losses
from lightning_modules.models.families import kv_plan, layer_heads, layer_shapes
from lightning_modules.models.heads import head_gate, keep_mask, prune_heads

FAMILIES = ["decoder", "encoder", "llama_gqa", "gpt2", "bert"]


def _ids(vocab: int, b: int = 3, t: int = 24, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, min(vocab, 250), (b, t), generator=g)


@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory):
    """Tiny Llama (GQA), GPT-2 and BERT checkpoints saved by transformers, larger init so every head matters."""
    import transformers as tf

    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    made = {
        "llama_gqa": tf.LlamaForCausalLM(tf.LlamaConfig(
            vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=8,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=64, initializer_range=0.15)),
        "gpt2": tf.GPT2LMHeadModel(tf.GPT2Config(
            vocab_size=300, n_embd=32, n_layer=2, n_head=4, n_positions=64, initializer_range=0.15,
            attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0)),
        "bert": tf.BertForMaskedLM(tf.BertConfig(
            vocab_size=300, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64, initializer_range=0.15, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0)),
    }
    for name, m in made.items():
        m.save_pretrained(root / name)
    return root


@pytest.fixture
def model(request):
    """The model a test is parametrized with; only its own fixture is built (a GPT-2 test trains nothing)."""
    name = request.param
    if name == "decoder":
        m = load_model(request.getfixturevalue("xs_decoder_run") / "model")
    elif name == "encoder":
        import copy

        m = copy.deepcopy(request.getfixturevalue("xs_encoder").lm.model)
    else:
        m = load_model(request.getfixturevalue("hf_checkpoints") / name)
    return m.eval()


def _logits(m, ids):
    with torch.no_grad():
        return m(input_ids=ids).logits


def _keeps(m):
    """A uniform and a non-uniform keep-set for this model's layers."""
    heads = layer_heads(m)
    uniform = [list(range(0, h, 2)) for h in heads]
    uneven = [[0, 1, h - 1] if l % 2 == 0 else [h // 2] for l, h in enumerate(heads)]
    return {"uniform": uniform, "uneven": uneven}


@pytest.mark.parametrize("model", FAMILIES, indirect=True)
def test_gate_all_ones_is_exactly_ungated(model):
    ids = _ids(model.config.vocab_size)
    ref = _logits(model, ids)
    gate = head_gate(model)
    gate.ones(batch_size=1)
    assert torch.equal(_logits(model, ids), ref)
    gate.ones(batch_size=ids.shape[0])  # per-example gate of ones
    assert torch.equal(_logits(model, ids), ref)
    gate.clear()
    assert torch.equal(_logits(model, ids), ref)


@pytest.mark.parametrize("model", FAMILIES, indirect=True)
def test_gated_sdpa_equals_gated_eager(model):
    """Training and evaluation run transformers' SDPA attention (flash kernels on a GPU); scoring switches to
    eager where it needs attention weights. The head gate must act the same in both, in fp32 to 1e-5 of the
    logits' scale: a mask for the batch, and a different gate per example."""
    ids = _ids(model.config.vocab_size)
    gate = head_gate(model)
    g = torch.Generator().manual_seed(1)
    masks = {"mask": keep_mask(_keeps(model)["uneven"], layer_heads(model)),
             "per_example": torch.rand(ids.shape[0], len(layer_heads(model)), max(layer_heads(model)), generator=g)}
    for name, values in masks.items():
        out = {}
        for kind in ("sdpa", "eager"):
            set_attention(model, kind)
            gate.set(values)
            out[kind] = _logits(model, ids)
        gate.clear()
        set_attention(model, "sdpa")
        assert_detectable(out["sdpa"], _logits(model, ids), msg=f"{name}: the gate should change the output")
        assert_close_to_scale(out["sdpa"], out["eager"], msg=name)


@pytest.mark.parametrize("which", ["uniform", "uneven"])
@pytest.mark.parametrize("model", FAMILIES, indirect=True)
def test_pruned_equals_gated(model, which, tmp_path):
    ids = _ids(model.config.vocab_size)
    keep = _keeps(model)[which]
    dense = _logits(model, ids)
    gate = head_gate(model)
    gate.mask(keep)
    gated = _logits(model, ids)
    gate.clear()
    assert_detectable(gated, dense, msg="masking these heads should change the output")
    n_before = sum(p.numel() for p in model.parameters())
    prune_heads(model, keep)
    assert layer_heads(model) == [len(k) for k in keep]
    assert sum(p.numel() for p in model.parameters()) < n_before
    pruned = _logits(model, ids)
    assert_close_to_scale(pruned, gated)
    # save -> load round trip is identical
    save_model(model, tmp_path / "pruned")
    reloaded = load_model(tmp_path / "pruned")
    assert layer_shapes(reloaded) == layer_shapes(model)
    assert torch.equal(_logits(reloaded, ids), pruned)
    meta = json.loads((tmp_path / "pruned" / "config.json").read_text())["headroom"]
    assert [l["heads"] for l in meta["layers"]] == [len(k) for k in keep]
    assert meta["kept"] == keep


@pytest.mark.parametrize("model", ["decoder"], indirect=True)
def test_pruning_twice_records_original_indices(model):
    prune_heads(model, [[1, 3, 5, 7], [0, 2, 4, 6]])
    prune_heads(model, [[0, 3], [1]])
    assert model.config.headroom["kept"] == [[1, 7], [2]]


@pytest.mark.parametrize("model", FAMILIES, indirect=True)
def test_gate_after_pruning_still_works(model):
    keep = _keeps(model)["uniform"]
    prune_heads(model, keep)
    ids = _ids(model.config.vocab_size)
    ref = _logits(model, ids)
    gate = head_gate(model)
    assert gate.heads == [len(k) for k in keep]
    gate.ones()
    assert torch.equal(_logits(model, ids), ref)


@pytest.mark.parametrize("model", FAMILIES, indirect=True)
def test_per_example_gate_gradient_matches_one_example_at_a_time(model):
    """|∂L_b/∂ξ| per example from one backward pass equals the gradient of each example's loss alone."""
    ids = _ids(model.config.vocab_size, b=4)
    batch = {"input_ids": ids, "labels": ids.clone()}
    if "bert" in model.config.model_type:
        batch["labels"] = torch.where(torch.rand(ids.shape, generator=torch.Generator().manual_seed(1)) < 0.3,
                                      ids, torch.full_like(ids, -100))
        batch["labels"][:, 0] = ids[:, 0]
    gate = head_gate(model)
    xi = gate.ones(batch_size=4, requires_grad=True)
    s, n = token_losses(model, batch)
    (s / n).sum().backward()
    batched = xi.grad.clone()
    for b in range(4):
        xi_b = gate.ones(batch_size=1, requires_grad=True)
        s, n = token_losses(model, {k: v[b:b + 1] for k, v in batch.items()})
        (s / n).sum().backward()
        torch.testing.assert_close(batched[b], xi_b.grad[0], atol=1e-6, rtol=1e-4)
    assert batched.abs().sum() > 0
    gate.clear()


@pytest.mark.parametrize("model", FAMILIES, indirect=True)
def test_many_masks_in_one_batch(model):
    """Masks stacked along the batch (each example its own mask) equal one forward pass per mask."""
    ids = _ids(model.config.vocab_size, b=1)
    heads = layer_heads(model)
    L, H = len(heads), max(heads)
    masks = torch.ones(L * H, L, H)
    for i in range(L * H):
        masks[i, i // H, i % H] = 0  # mask i removes head (i // H, i % H)
    gate = head_gate(model)
    gate.set(masks)
    stacked = _logits(model, ids.expand(L * H, -1))
    for i in range(L * H):
        gate.set(masks[i])
        assert_close_to_scale(stacked[i], _logits(model, ids)[0], msg=f"mask {i}")
    gate.clear()


def test_kv_plan_rule():
    # 8 query heads, 2 kv heads (group of 4: heads 0-3 read kv 0, heads 4-7 read kv 1)
    assert kv_plan([0, 1, 4, 5], 8, 2) == ([0, 1], 2)  # even: stays grouped, group size 2
    assert kv_plan([0, 2], 8, 2) == ([0], 2)  # group 1 lost every head: its kv is dropped
    assert kv_plan([0, 1, 2, 4], 8, 2) == ([0, 0, 0, 1], 1)  # uneven: one kv per query head
    assert kv_plan([1, 5, 6], 8, 8) == ([1, 5, 6], 1)  # plain multi-head attention


@pytest.mark.parametrize("keep,kv", [([[0, 1, 4, 5]] * 2, [2, 2]), ([[0, 2], [5, 7]], [1, 1]),
                                     ([[0, 1, 2, 4], [3]], [4, 1])])
@pytest.mark.parametrize("model", ["llama_gqa"], indirect=True)
def test_grouped_query_pruning(model, keep, kv):
    ids = _ids(300)
    gate = head_gate(model)
    gate.mask(keep)
    gated = _logits(model, ids)
    gate.clear()
    prune_heads(model, keep)
    assert [s[1] for s in layer_shapes(model)] == kv
    assert_close_to_scale(_logits(model, ids), gated)


@pytest.mark.parametrize("model", ["decoder"], indirect=True)
def test_uniform_llama_prune_loads_with_plain_transformers(model, tmp_path):
    """A uniformly pruned decoder is a plain transformers checkpoint: a process that never imports headroom
    loads it with AutoModelForCausalLM and gets the same logits."""
    prune_heads(model, [[0, 2, 5, 7], [1, 2, 3, 6]])
    save_model(model, tmp_path / "m")
    ids = _ids(model.config.vocab_size)
    torch.save(ids, tmp_path / "ids.pt")
    code = (
        "import sys, torch; from transformers import AutoModelForCausalLM\n"
        f"m = AutoModelForCausalLM.from_pretrained({str(tmp_path / 'm')!r}).eval()\n"
        f"ids = torch.load({str(tmp_path / 'ids.pt')!r})\n"
        "with torch.no_grad(): out = m(input_ids=ids).logits\n"
        f"torch.save(out, {str(tmp_path / 'out.pt')!r})\n"
        "assert not [k for k in sys.modules if k.split('.')[0] in ('lightning_modules', 'orchestration')]\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert_close_to_scale(torch.load(tmp_path / "out.pt"), _logits(model, ids))


@pytest.mark.parametrize("model", ["decoder"], indirect=True)
def test_keep_sets_are_validated(model):
    with pytest.raises(HeadroomInputError, match="at least one head"):
        prune_heads(model, [[0], []])
    with pytest.raises(HeadroomInputError, match="out of range"):
        prune_heads(model, [[0], [8]])
    with pytest.raises(HeadroomInputError, match="layers"):
        prune_heads(model, [[0]])
