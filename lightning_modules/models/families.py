"""What a head is in each supported family: where its output enters the output projection (where heads.py gates
it), and how its rows and columns are cut out. One file for every supported family.

A *head* is a query head. Every family computes, per layer,

    x_BTD ──q/k/v proj──► q_BHTd, k_BKTd, v_BKTd ──attention──► o_BTHd ──reshape──► o_BT(H·d) ──out proj──► y_BTD
                                                                              ▲
                                                                   gate ξ_BH (this file)

(B batch, T tokens, D d_model, H query heads, K key/value heads, d head_dim). The gate ξ multiplies each head's
output just before the output projection — a forward pre-hook on that projection, so it works with any attention
implementation (eager, sdpa) of transformers v5, which dropped `head_mask` and `prune_heads`. ξ is broadcastable to
[batch, layers, heads]: one value per head for masking, one per example and head for per-example gradients
(|∂L_b/∂ξ_bh|) and for evaluating many masks stacked along the batch in one forward pass.

Physical pruning slices the q/k/v rows and the output-projection columns of the removed heads and gives a smaller
model whose outputs equal the gated model's with those gates at 0 (tested for every family).

Grouped-query attention (K < H, group size g = H/K; query head h reads key/value head h // g). The rule that keeps
key/value groups consistent after removing query heads:
  * A key/value head is kept iff at least one of its query heads is kept; groups that lose every query head are
    dropped with their k/v rows.
  * If every kept group keeps the same number c of query heads, the layer stays grouped: K' = kept groups, group
    size c, query heads in their original order (so the new head i reads kv head i // c).
  * Otherwise (uneven groups, which a single group size cannot express) the layer becomes one kv head per query
    head: each kept query head gets a copy of its group's k/v rows. Outputs stay exact; that layer saves no k/v
    parameters. `kv_plan` is the rule; tests cover all three cases.

Families: `llama` (Llama-family decoders, incl. headroom's decoder), `gpt2`, `bert` (incl. headroom's encoder).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from lightning_modules.declarations.config import HeadroomInputError
from lightning_modules.models.checkpoints import SUPPORTED_MODEL_TYPES


def _set_param(module: nn.Module, name: str, value: torch.Tensor | None) -> None:
    if value is None:
        return
    old = getattr(module, name)
    setattr(module, name, nn.Parameter(value.contiguous(), requires_grad=old.requires_grad))


def _resize_linear(lin: nn.Linear, out_features: int, in_features: int,
                   weight: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> None:
    """Give an nn.Linear new shapes in place (hooks and identity survive). Weight [out, in]."""
    w = lin.weight
    weight = weight if weight is not None else torch.empty(out_features, in_features, dtype=w.dtype, device=w.device)
    _set_param(lin, "weight", weight)
    if lin.bias is not None:
        if bias is None:
            bias = torch.zeros(out_features, dtype=w.dtype, device=w.device)
        _set_param(lin, "bias", bias)
    lin.in_features, lin.out_features = in_features, out_features


def _rows(w: torch.Tensor, heads: Sequence[int], hd: int) -> torch.Tensor:
    """Rows of the given heads from a [H·d, ...] tensor."""
    idx = torch.cat([torch.arange(h * hd, (h + 1) * hd) for h in heads]).to(w.device)
    return w.index_select(0, idx)


def kv_plan(keep: Sequence[int], n_heads: int, n_kv: int) -> tuple[list[int], int]:
    """Key/value heads for the kept query heads: (kv head of origin for each new kv head, new group size).

    See the module docstring. Returns the list of original kv heads the new kv heads copy, in order.
    """
    g = n_heads // n_kv
    groups: dict[int, list[int]] = {}
    for h in keep:
        groups.setdefault(h // g, []).append(h)
    sizes = {len(v) for v in groups.values()}
    if len(sizes) == 1:
        return sorted(groups), sizes.pop()
    return [h // g for h in keep], 1  # uneven: one kv head per query head


class _Llama:
    name = "llama"

    @staticmethod
    def attentions(model):
        return [layer.self_attn for layer in model.base_model.layers]

    @staticmethod
    def out_proj(attn):
        return attn.o_proj

    @staticmethod
    def shape(attn) -> tuple[int, int, int]:
        hd = attn.head_dim
        return attn.q_proj.out_features // hd, attn.k_proj.out_features // hd, hd

    @staticmethod
    def reshape(attn, n: int, kv: int, hd: int, w: dict | None = None) -> None:
        w = w or {}
        d = attn.q_proj.in_features
        _resize_linear(attn.q_proj, n * hd, d, w.get("q_w"), w.get("q_b"))
        _resize_linear(attn.k_proj, kv * hd, d, w.get("k_w"), w.get("k_b"))
        _resize_linear(attn.v_proj, kv * hd, d, w.get("v_w"), w.get("v_b"))
        _resize_linear(attn.o_proj, attn.o_proj.out_features, n * hd, w.get("o_w"), w.get("o_b"))
        attn.head_dim, attn.num_key_value_groups, attn.scaling = hd, n // kv, hd**-0.5

    @classmethod
    def prune(cls, attn, keep: list[int]) -> tuple[int, int]:
        n, kv, hd = cls.shape(attn)
        kv_src, group = kv_plan(keep, n, kv)
        w = {
            "q_w": _rows(attn.q_proj.weight, keep, hd),
            "k_w": _rows(attn.k_proj.weight, kv_src, hd),
            "v_w": _rows(attn.v_proj.weight, kv_src, hd),
            "o_w": _rows(attn.o_proj.weight.t(), keep, hd).t(),
            "o_b": None if attn.o_proj.bias is None else attn.o_proj.bias.detach().clone(),
        }
        if attn.q_proj.bias is not None:
            w.update(q_b=_rows(attn.q_proj.bias, keep, hd), k_b=_rows(attn.k_proj.bias, kv_src, hd),
                     v_b=_rows(attn.v_proj.bias, kv_src, hd))
        cls.reshape(attn, len(keep), len(kv_src), hd, w)
        return len(keep), len(kv_src)

    @classmethod
    def value_out_weights(cls, attn, h: int) -> tuple[torch.Tensor, torch.Tensor]:
        n, kv, hd = cls.shape(attn)
        g = n // kv
        return attn.v_proj.weight[(h // g) * hd:(h // g + 1) * hd], attn.o_proj.weight[:, h * hd:(h + 1) * hd]

    @classmethod
    def head_slices(cls, attn, h: int) -> list[tuple[nn.Parameter, tuple]]:
        """The parameters of head h, as (parameter, index): its query rows, its key/value group's rows (shared by
        the group's query heads) and its output-projection columns, biases included where the model has them."""
        n, kv, hd = cls.shape(attn)
        q, g = slice(h * hd, (h + 1) * hd), h // (n // kv)
        k = slice(g * hd, (g + 1) * hd)
        out = [(attn.q_proj.weight, (q,)), (attn.k_proj.weight, (k,)), (attn.v_proj.weight, (k,)),
               (attn.o_proj.weight, (slice(None), q))]
        if attn.q_proj.bias is not None:
            out += [(attn.q_proj.bias, (q,)), (attn.k_proj.bias, (k,)), (attn.v_proj.bias, (k,))]
        return out

    @staticmethod
    def out_weight(attn) -> torch.Tensor:
        """The output projection's weight as a Linear's: [D out, H·d in]."""
        return attn.o_proj.weight


class _GPT2:
    """GPT-2: c_attn is a Conv1D with weight [D, 3·H·d] (columns q | k | v), c_proj weight [H·d, D]."""

    name = "gpt2"

    @staticmethod
    def attentions(model):
        return [block.attn for block in model.base_model.h]

    @staticmethod
    def out_proj(attn):
        return attn.c_proj

    @staticmethod
    def shape(attn) -> tuple[int, int, int]:
        return attn.num_heads, attn.num_heads, attn.head_dim

    @staticmethod
    def reshape(attn, n: int, kv: int, hd: int, w: dict | None = None) -> None:
        assert kv == n, "GPT-2 has no grouped-query attention"
        w = w or {}
        ref = attn.c_attn.weight
        d = ref.shape[0]
        _set_param(attn.c_attn, "weight", w.get("attn_w", torch.empty(d, 3 * n * hd, dtype=ref.dtype, device=ref.device)))
        _set_param(attn.c_attn, "bias", w.get("attn_b", torch.zeros(3 * n * hd, dtype=ref.dtype, device=ref.device)))
        attn.c_attn.nf = 3 * n * hd
        _set_param(attn.c_proj, "weight", w.get("proj_w", torch.empty(n * hd, d, dtype=ref.dtype, device=ref.device)))
        attn.num_heads, attn.head_dim, attn.split_size = n, hd, n * hd
        attn.scaling = hd**-0.5 if attn.scale_attn_weights else 1.0
        if attn.scale_attn_by_inverse_layer_idx:
            attn.scaling /= float(attn.layer_idx + 1)

    @classmethod
    def prune(cls, attn, keep: list[int]) -> tuple[int, int]:
        n, _, hd = cls.shape(attn)
        cols = torch.cat([torch.arange(h * hd, (h + 1) * hd) for h in keep])
        cols = torch.cat([cols + part * n * hd for part in range(3)]).to(attn.c_attn.weight.device)
        w = {
            "attn_w": attn.c_attn.weight.index_select(1, cols),
            "attn_b": attn.c_attn.bias.index_select(0, cols),
            "proj_w": _rows(attn.c_proj.weight, keep, hd),
        }
        cls.reshape(attn, len(keep), len(keep), hd, w)
        return len(keep), len(keep)

    @classmethod
    def value_out_weights(cls, attn, h: int):
        n, _, hd = cls.shape(attn)
        v_cols = slice(2 * n * hd + h * hd, 2 * n * hd + (h + 1) * hd)
        return attn.c_attn.weight[:, v_cols].t(), attn.c_proj.weight[h * hd:(h + 1) * hd].t()

    @classmethod
    def head_slices(cls, attn, h: int) -> list[tuple[nn.Parameter, tuple]]:
        n, _, hd = cls.shape(attn)
        cols = [slice(part * n * hd + h * hd, part * n * hd + (h + 1) * hd) for part in range(3)]
        return ([(attn.c_attn.weight, (slice(None), c)) for c in cols] + [(attn.c_attn.bias, (c,)) for c in cols]
                + [(attn.c_proj.weight, (slice(h * hd, (h + 1) * hd),))])

    @staticmethod
    def out_weight(attn) -> torch.Tensor:
        return attn.c_proj.weight.t()  # a Conv1D holds [in, out]


class _Bert:
    """BERT: attention.self.{query,key,value} Linear [H·d, D]; attention.output.dense Linear [D, H·d]."""

    name = "bert"

    @staticmethod
    def attentions(model):
        return [layer.attention for layer in model.base_model.encoder.layer]

    @staticmethod
    def out_proj(attn):
        return attn.output.dense

    @staticmethod
    def shape(attn) -> tuple[int, int, int]:
        s = attn.self
        return s.num_attention_heads, s.num_attention_heads, s.attention_head_size

    @staticmethod
    def reshape(attn, n: int, kv: int, hd: int, w: dict | None = None) -> None:
        assert kv == n, "BERT has no grouped-query attention"
        w = w or {}
        s = attn.self
        d = s.query.in_features
        for name in ("query", "key", "value"):
            _resize_linear(getattr(s, name), n * hd, d, w.get(f"{name}_w"), w.get(f"{name}_b"))
        dense = attn.output.dense
        _resize_linear(dense, dense.out_features, n * hd, w.get("o_w"), dense.bias.detach().clone())
        s.num_attention_heads, s.attention_head_size, s.all_head_size = n, hd, n * hd
        s.scaling = hd**-0.5

    @classmethod
    def prune(cls, attn, keep: list[int]) -> tuple[int, int]:
        n, _, hd = cls.shape(attn)
        s = attn.self
        w = {}
        for name in ("query", "key", "value"):
            lin = getattr(s, name)
            w[f"{name}_w"], w[f"{name}_b"] = _rows(lin.weight, keep, hd), _rows(lin.bias, keep, hd)
        w["o_w"] = _rows(attn.output.dense.weight.t(), keep, hd).t()
        cls.reshape(attn, len(keep), len(keep), hd, w)
        return len(keep), len(keep)

    @classmethod
    def value_out_weights(cls, attn, h: int):
        _, _, hd = cls.shape(attn)
        return attn.self.value.weight[h * hd:(h + 1) * hd], attn.output.dense.weight[:, h * hd:(h + 1) * hd]

    @classmethod
    def head_slices(cls, attn, h: int) -> list[tuple[nn.Parameter, tuple]]:
        _, _, hd = cls.shape(attn)
        r, s = slice(h * hd, (h + 1) * hd), attn.self
        return ([(getattr(s, n).weight, (r,)) for n in ("query", "key", "value")]
                + [(getattr(s, n).bias, (r,)) for n in ("query", "key", "value")]
                + [(attn.output.dense.weight, (slice(None), r))])

    @staticmethod
    def out_weight(attn) -> torch.Tensor:
        return attn.output.dense.weight


_FAMILIES = {f.name: f for f in (_Llama, _GPT2, _Bert)}


def family_of(model_or_config) -> type:
    config = getattr(model_or_config, "config", model_or_config)
    mt = getattr(config, "model_type", None)
    try:
        return _FAMILIES[mt]
    except KeyError:
        raise HeadroomInputError(
            f"model type {mt!r} is not supported (supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        ) from None


def layer_shapes(model) -> list[tuple[int, int, int]]:
    """(query heads, key/value heads, head_dim) of every layer."""
    fam = family_of(model)
    return [fam.shape(a) for a in fam.attentions(model)]


def layer_heads(model) -> list[int]:
    return [s[0] for s in layer_shapes(model)]


def head_weights(model, layer: int, head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(value rows [d, D], output-projection columns [D, d]) of one head: what `magnitude` scoring reads."""
    fam = family_of(model)
    return fam.value_out_weights(fam.attentions(model)[layer], head)
