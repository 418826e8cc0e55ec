"""The modeling file headroom ships beside a model that plain transformers cannot build: a pruned model whose layers
keep different head counts, or whose heads no longer divide the hidden size, and headroom's rotary encoder. Saved
as `modeling_headroom.py` with an `auto_map` in config.json (lightning_modules/models/export.py), it loads with
`AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)` (or AutoModelForMaskedLM) in an environment
with torch and transformers only — as Apple's OpenELM and NVIDIA's Nemotron-NAS directories do.

Each class subclasses the transformers class it names and, once built, gives each attention layer the head count,
key/value heads and head size that `config.headroom["layers"]` and `["head_dim"]` record (the weights loaded next
fill them). The rotary encoder's attention rotates queries and keys by position (RoFormer) through transformers'
AttentionInterface. This file imports nothing of headroom: headroom's own builders use its rotary attention too.
"""

from __future__ import annotations

import torch
from torch import nn

ROTARY = "headroom_rope"
_ROPE_CACHE: dict = {}


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x_BHTd: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotate query/key vectors by their position (positions 0..T-1; an encoder has no cache)."""
    t, d = x_BHTd.shape[-2], x_BHTd.shape[-1]
    key = (t, d, base, x_BHTd.device, x_BHTd.dtype)
    # a traced length (torch.export, ONNX) is symbolic: computed in the graph, not cached; nor are tensors made under
    # inference_mode, which a later backward pass could not save
    cached = isinstance(t, int) and not torch.compiler.is_compiling() and not torch.is_inference_mode_enabled()
    if not cached or key not in _ROPE_CACHE:
        inv = 1.0 / (base ** (torch.arange(0, d, 2, device=x_BHTd.device).float() / d))
        freqs = torch.outer(torch.arange(t, device=x_BHTd.device).float(), inv)
        emb = torch.cat([freqs, freqs], dim=-1)  # [T, d]
        cos_sin = (emb.cos().to(x_BHTd.dtype), emb.sin().to(x_BHTd.dtype))
        if not cached:
            return x_BHTd * cos_sin[0] + _rotate_half(x_BHTd) * cos_sin[1]
        _ROPE_CACHE[key] = cos_sin
    cos, sin = _ROPE_CACHE[key]
    return x_BHTd * cos + _rotate_half(x_BHTd) * sin


def register_rotary() -> None:
    """`headroom_rope_sdpa` and `headroom_rope_eager`: transformers' BERT attention on rotated queries and keys."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask
    from transformers.models.bert.modeling_bert import eager_attention_forward

    if f"{ROTARY}_sdpa" in AttentionInterface._global_mapping:
        return

    def rope_sdpa(module, query, key, value, attention_mask, **kwargs):
        return sdpa_attention_forward(module, apply_rotary(query), apply_rotary(key), value, attention_mask, **kwargs)

    def rope_eager(module, query, key, value, attention_mask, **kwargs):
        return eager_attention_forward(module, apply_rotary(query), apply_rotary(key), value, attention_mask, **kwargs)

    AttentionInterface.register(f"{ROTARY}_sdpa", rope_sdpa)
    AttentionInterface.register(f"{ROTARY}_eager", rope_eager)
    AttentionMaskInterface.register(f"{ROTARY}_sdpa", sdpa_mask)
    AttentionMaskInterface.register(f"{ROTARY}_eager", eager_mask)


def _empty(lin: nn.Module, out_features: int, in_features: int) -> None:
    """A Linear of a new shape, its weights left to the checkpoint (a bias kept where it had one)."""
    w = lin.weight
    lin.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=w.dtype, device=w.device))
    if lin.bias is not None:
        lin.bias = nn.Parameter(torch.empty(out_features, dtype=w.dtype, device=w.device))
    lin.in_features, lin.out_features = in_features, out_features


def _layers(config) -> tuple[list[dict], int]:
    meta = getattr(config, "headroom", None) or {}
    return list(meta.get("layers") or []), int(meta.get("head_dim") or 0)


def _classes() -> dict:
    """The classes, built on first use: transformers' GPT-2, Llama and BERT modules load only when one is wanted
    (headroom imports this file for its rotary attention in every process that builds a model)."""
    if _BUILT:
        return _BUILT
    from transformers import BertForMaskedLM, GPT2LMHeadModel, LlamaForCausalLM

    class HeadroomLlamaForCausalLM(LlamaForCausalLM):
        def __init__(self, config):
            super().__init__(config)
            layers, hd = _layers(config)
            for layer, spec in zip(self.model.layers, layers):
                a, n = layer.self_attn, int(spec["heads"])
                kv, d = int(spec.get("kv_heads", n)), a.q_proj.in_features
                _empty(a.q_proj, n * hd, d)
                _empty(a.k_proj, kv * hd, d)
                _empty(a.v_proj, kv * hd, d)
                _empty(a.o_proj, a.o_proj.out_features, n * hd)
                a.head_dim, a.num_key_value_groups, a.scaling = hd, n // kv, hd**-0.5


    class HeadroomGPT2LMHeadModel(GPT2LMHeadModel):
        def __init__(self, config):
            super().__init__(config)
            layers, hd = _layers(config)
            for block, spec in zip(self.transformer.h, layers):
                a, n = block.attn, int(spec["heads"])
                ref = a.c_attn.weight  # Conv1D: [in, out]
                d = ref.shape[0]
                a.c_attn.weight = nn.Parameter(torch.empty(d, 3 * n * hd, dtype=ref.dtype, device=ref.device))
                a.c_attn.bias = nn.Parameter(torch.empty(3 * n * hd, dtype=ref.dtype, device=ref.device))
                a.c_attn.nf = 3 * n * hd
                a.c_proj.weight = nn.Parameter(torch.empty(n * hd, d, dtype=ref.dtype, device=ref.device))
                a.num_heads, a.head_dim, a.split_size = n, hd, n * hd
                a.scaling = hd**-0.5 if a.scale_attn_weights else 1.0
                if a.scale_attn_by_inverse_layer_idx:
                    a.scaling /= float(a.layer_idx + 1)


    class HeadroomBertForMaskedLM(BertForMaskedLM):
        def __init__(self, config):
            if (getattr(config, "headroom", None) or {}).get("rotary"):
                register_rotary()
                config._attn_implementation = f"{ROTARY}_sdpa"
            super().__init__(config)
            layers, hd = _layers(config)
            for layer, spec in zip(self.bert.encoder.layer, layers):
                s, n = layer.attention.self, int(spec["heads"])
                d = s.query.in_features
                for lin in (s.query, s.key, s.value):
                    _empty(lin, n * hd, d)
                out = layer.attention.output.dense
                _empty(out, out.out_features, n * hd)
                s.num_attention_heads, s.attention_head_size, s.all_head_size = n, hd, n * hd
                s.scaling = hd**-0.5

    _BUILT.update(HeadroomLlamaForCausalLM=HeadroomLlamaForCausalLM, HeadroomGPT2LMHeadModel=HeadroomGPT2LMHeadModel,
                  HeadroomBertForMaskedLM=HeadroomBertForMaskedLM)
    return _BUILT


_BUILT: dict = {}


def __getattr__(name: str):
    """`modeling_headroom.HeadroomLlamaForCausalLM` and the others, as transformers' auto_map asks for them."""
    if name.startswith("Headroom"):
        return _classes()[name]
    raise AttributeError(name)


# the transformers architecture each class stands for, and the Auto class it loads through
CLASSES = {"LlamaForCausalLM": ("HeadroomLlamaForCausalLM", "AutoModelForCausalLM"),
           "GPT2LMHeadModel": ("HeadroomGPT2LMHeadModel", "AutoModelForCausalLM"),
           "BertForMaskedLM": ("HeadroomBertForMaskedLM", "AutoModelForMaskedLM")}
