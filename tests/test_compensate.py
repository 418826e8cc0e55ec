"""FLAP's bias compensation (lightning_modules/pruning/compensate.py): given the dense model's input to each attention layer,
the pruned and compensated layer's mean output over the calibration tokens is the dense layer's — on headroom's
decoder (a Llama without attention biases, which compensation gives one), a GPT-2 and a BERT; without compensation
it is not. The compensated model saves and loads (headroom's loader, and plain transformers for a uniform Llama),
the plan turns it on for flap's recipe and charges its forward pass, and `--bias-compensation` sets it."""

from __future__ import annotations

import copy

import pytest
import torch

from lightning_modules.models.families import family_of
from lightning_modules.pruning.compensate import output_means, prune_compensated

KEEP = [[0, 2], [1, 3]]  # two of four heads in each of two layers


def _llama():
    from lightning_modules.declarations.config import model_config_for
    from lightning_modules.models.build import build_model

    return build_model(model_config_for("xs", n_heads=4), seed=0).eval()


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=260, n_positions=64)).eval()


def _bert():
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    return BertForMaskedLM(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=64, vocab_size=260, max_position_embeddings=64)).eval()


def _batches(n=3, b=2, t=16):
    g = torch.Generator().manual_seed(1)
    return [{"input_ids": torch.randint(0, 250, (b, t), generator=g)} for _ in range(n)]


def _layer_io(model, batches):
    """Per layer and batch: the attention module's (args, kwargs) and its output projection's output."""
    fam = family_of(model)
    attns = fam.attentions(model)
    ins, outs = [[] for _ in attns], [[] for _ in attns]
    hs = [a.register_forward_pre_hook(lambda m, a, k, l=l: ins[l].append((a, k)), with_kwargs=True)
          for l, a in enumerate(attns)]
    hs += [fam.out_proj(a).register_forward_hook(lambda m, a, o, l=l: outs[l].append(o.detach()))
           for l, a in enumerate(attns)]
    with torch.no_grad():
        for b in batches:
            model(input_ids=b["input_ids"], use_cache=False) if fam.name != "bert" else model(input_ids=b["input_ids"])
    for h in hs:
        h.remove()
    return ins, outs


def _mean(xs):
    x = torch.cat([o.reshape(-1, o.shape[-1]) for o in xs]).double()
    return x.mean(0)


@pytest.mark.parametrize("make", [_llama, _gpt2, _bert], ids=["llama", "gpt2", "bert"])
def test_the_compensated_layer_keeps_its_mean_output(make):
    dense = make()
    batches = _batches()
    ins, outs = _layer_io(dense, batches)
    results = {}
    for compensated in (True, False):
        pruned = prune_compensated(copy.deepcopy(dense), KEEP, output_means(dense, batches) if compensated else None)
        fam = family_of(pruned)
        gaps = []
        for l, attn in enumerate(fam.attentions(pruned)):
            got = []
            h = fam.out_proj(attn).register_forward_hook(lambda m, a, o: got.append(o.detach()))
            with torch.no_grad():
                for args, kwargs in ins[l]:
                    attn(*args, **kwargs)
            h.remove()
            want = _mean(outs[l])
            gaps.append(float((_mean(got) - want).abs().max() / want.abs().max()))
        results[compensated] = max(gaps)
    assert results[True] < 1e-5, results  # float32 layers: equal to rounding
    assert results[False] > 1e-2, results  # the identity is the compensation's, not the pruning's


def test_a_compensated_llama_saves_and_loads_with_its_bias(tmp_path):
    """The bias goes with the model: headroom's loader and plain transformers (a uniform Llama) give the same
    logits as the model in memory, and its config says attention_bias."""
    from transformers import AutoModelForCausalLM

    from lightning_modules.models.build import load_model, save_model

    dense = _llama()
    batches = _batches()
    pruned = prune_compensated(copy.deepcopy(dense), KEEP, output_means(dense, batches))
    assert pruned.config.attention_bias and pruned.model.layers[0].self_attn.o_proj.bias.abs().sum() > 0
    save_model(pruned, tmp_path / "m")
    x = batches[0]["input_ids"]
    with torch.no_grad():
        want = pruned(input_ids=x).logits
        for loaded in (load_model(tmp_path / "m"), AutoModelForCausalLM.from_pretrained(tmp_path / "m")):
            torch.testing.assert_close(loaded.eval()(input_ids=x).logits, want)


def test_a_llama_layer_that_keeps_every_head_gets_zero_biases_too(tmp_path):
    """attention_bias is the whole model's: a layer losing no head still gets (zero) biases, or the saved model
    would not load (grouped-query attention here: 4 query heads on 2 key/value heads)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from lightning_modules.models.build import load_model, save_model

    torch.manual_seed(0)
    dense = LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=64)).eval()
    batches = _batches()
    pruned = prune_compensated(copy.deepcopy(dense), [[0, 1], [0, 1, 2, 3]], output_means(dense, batches))
    kept = pruned.model.layers[1].self_attn
    assert kept.o_proj.bias is not None and kept.o_proj.bias.abs().sum() == 0
    save_model(pruned, tmp_path / "m")
    x = batches[0]["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(load_model(tmp_path / "m")(input_ids=x).logits, pruned(input_ids=x).logits)


def test_the_plan_compensates_for_flap_and_charges_one_forward_pass():
    """flap's recipe compensates, the others' does not, a sweep's `bias_compensation` overrides either; a unit's key
    changes exactly when what its prune does changes (gradient set to false keeps its key, flap's does not); the
    charge is one more forward pass per calibration token."""
    from test_spec import GOOD

    from lightning_modules.declarations.methods import scoring_flops
    from orchestration.design.plan import build_plan
    from orchestration.design.spec import parse_sweep

    text = GOOD.replace("methods: [gradient, random]", "methods: [flap, gradient]")
    units = {s: build_plan(parse_sweep(text.replace("methods: [flap, gradient]", f"methods: [flap, gradient]{s}")),
                           "c").pruned for s in ("", ", bias_compensation: false")}
    on = {u.method: u for u in units[""] if u.seed == 0}
    off = {u.method: u for u in units[", bias_compensation: false"] if u.seed == 0}
    assert on["flap"].plan.compensates and not on["gradient"].plan.compensates
    assert not off["flap"].plan.compensates
    assert on["flap"].key != off["flap"].key and on["gradient"].key == off["gradient"].key
    # a prune during training does not compensate: keyed and charged so
    at = {u.prune_at: u for u in build_plan(parse_sweep(text.replace("methods: [flap, gradient]",
                                                                      "methods: [flap], at: [0.5, 1]")), "c").pruned
          if u.seed == 0}
    assert at[1.0].plan.compensates and not at[0.5].plan.compensates and at[0.5].prune.bias_compensation is False
    assert scoring_flops("flap", 8, 10, 40, 7.0, compensate=True) == (1 + 1) * 40 * 7.0
    assert scoring_flops("flap", 8, 10, 40, 7.0) == 1 * 40 * 7.0
