"""What a head is: where it is gated, and how it is cut out. One file for every supported family.

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

from .checkpoints import SUPPORTED_MODEL_TYPES
from .config import HeadroomInputError

# ------------------------------------------------------------------------------------------- families


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


# ------------------------------------------------------------------------------------------------ gate


class HeadGate:
    """ξ for one model, broadcastable to [batch, layers, heads]; `None` means ungated (no change at all).

    Layers with fewer heads than the widest one read the first heads of their row.
    """

    def __init__(self, heads: list[int]):
        self.heads = list(heads)
        self.values: torch.Tensor | None = None

    @property
    def n_layers(self) -> int:
        return len(self.heads)

    @property
    def max_heads(self) -> int:
        return max(self.heads)

    def set(self, values: torch.Tensor | None) -> None:
        """values: [L, H] (one mask for the batch) or [B, L, H] (one per example). Any tensor, also one with a
        graph behind it (hard-concrete gates)."""
        if values is not None:
            if values.dim() == 2:
                values = values.unsqueeze(0)
            if values.dim() != 3 or values.shape[1] != self.n_layers or values.shape[2] < self.max_heads:
                raise ValueError(f"gate of shape {tuple(values.shape)} does not fit [B, {self.n_layers}, {self.max_heads}]")
        self.values = values

    def ones(self, batch_size: int = 1, requires_grad: bool = False, device=None) -> torch.Tensor:
        """Set ξ = 1 (per example if batch_size > 1) as a leaf tensor and return it; with requires_grad its
        .grad after backward is ∂L/∂ξ, per example when the loss is a sum of per-example losses."""
        v = torch.ones(batch_size, self.n_layers, self.max_heads, device=device, requires_grad=requires_grad)
        self.set(v)
        return v

    def mask(self, keep, device=None) -> torch.Tensor:
        """Set a 0/1 mask from per-layer lists of kept head indices (or a [L, H] bool/float tensor)."""
        m = keep.float() if isinstance(keep, torch.Tensor) else keep_mask(keep, self.heads)
        m = m.to(device) if device is not None else m
        self.set(m)
        return m

    def clear(self) -> None:
        self.values = None

    @property
    def grad(self) -> torch.Tensor | None:
        return None if self.values is None else self.values.grad


def keep_mask(keep: Sequence[Sequence[int]], heads: list[int]) -> torch.Tensor:
    """[L, max heads] 0/1: 1 where a head is kept (per-layer lists of kept head indices)."""
    m = torch.zeros(len(heads), max(heads))
    for l, ks in enumerate(keep):
        m[l, list(ks)] = 1.0
    return m


def _gate_hook(module: nn.Module, args):
    gate, layer, hd = module._headroom_gate
    if gate.values is None:
        return None
    x = args[0]  # [B, T, H·d]
    n = x.shape[-1] // hd
    g = gate.values[:, layer, :n].to(x.dtype)  # [B|1, H]
    shape = x.shape
    g = g.reshape(g.shape[0], *([1] * (x.dim() - 2)), n, 1)  # [B|1, 1, H, 1]
    x = (x.reshape(*shape[:-1], n, hd) * g).reshape(shape)  # [B, T, H, d] · ξ
    return (x, *args[1:])


def head_gate(model) -> HeadGate:
    """The model's gate, attached on first use (a pre-hook on each layer's output projection). Idempotent."""
    fam = family_of(model)
    attns = fam.attentions(model)
    shapes = [fam.shape(a) for a in attns]
    gate = getattr(model, "_headroom_gate", None)
    if gate is None:
        gate = HeadGate([s[0] for s in shapes])
        object.__setattr__(model, "_headroom_gate", gate)  # plain attribute, not a submodule
    gate.heads = [s[0] for s in shapes]
    for l, (a, (_, _, hd)) in enumerate(zip(attns, shapes)):
        proj = fam.out_proj(a)
        if not hasattr(proj, "_headroom_gate"):
            proj.register_forward_pre_hook(_gate_hook)
        object.__setattr__(proj, "_headroom_gate", (gate, l, hd))
    return gate


# -------------------------------------------------------------------------------------- physical removal


def _check_keep(keep: Sequence[Sequence[int]], shapes: list[tuple[int, int, int]]) -> list[list[int]]:
    if len(keep) != len(shapes):
        raise HeadroomInputError(f"keep lists {len(keep)} layers, the model has {len(shapes)}")
    out = []
    for l, (ks, (n, _, _)) in enumerate(zip(keep, shapes)):
        ks = sorted({int(k) for k in ks})
        if not ks:
            raise HeadroomInputError(f"layer {l}: at least one head must be kept")
        if ks[0] < 0 or ks[-1] >= n:
            raise HeadroomInputError(f"layer {l}: head index out of range 0..{n - 1}")
        out.append(ks)
    return out


def prune_heads(model, keep: Sequence[Sequence[int]]):
    """Remove every head not in keep[l] from layer l, in place; returns the model.

    Different counts per layer are allowed, at least one head per layer. Updates the model's config: a uniformly
    pruned Llama-family model gets plain `num_attention_heads`/`num_key_value_heads`/`head_dim` (any
    transformers install loads it); every pruned model records `config.headroom["layers"]` (heads and kv heads per
    layer) and `config.headroom["kept"]` (kept indices of the original dense heads), which `models.load_model` reads.
    """
    fam = family_of(model)
    attns = fam.attentions(model)
    shapes = [fam.shape(a) for a in attns]
    keep = _check_keep(keep, shapes)
    meta = dict(getattr(model.config, "headroom", None) or {})
    prior = meta.get("kept") or [list(range(n)) for n, _, _ in shapes]
    with torch.no_grad():
        new = [fam.prune(a, ks) for a, ks in zip(attns, keep)]
    meta["kept"] = [[prior[l][k] for k in ks] for l, ks in enumerate(keep)]
    meta["dense_heads"] = meta.get("dense_heads", [n for n, _, _ in shapes])
    _record_layers(model, meta, new, shapes[0][2])
    gate = getattr(model, "_headroom_gate", None)
    if gate is not None:
        gate.clear()
        head_gate(model)
    return model


def _record_layers(model, meta: dict, new: list[tuple[int, int]], hd: int) -> None:
    meta["layers"] = [{"heads": n, "kv_heads": kv} for n, kv in new]
    meta["head_dim"] = hd
    cfg = model.config
    n, kv = new[0]
    if cfg.model_type == "llama" and len(set(new)) == 1 and cfg.hidden_size % n == 0:
        # plain transformers can load it; set together, then validate (each assignment alone validates)
        for k, v in (("num_attention_heads", n), ("num_key_value_heads", kv), ("head_dim", hd)):
            object.__setattr__(cfg, k, v)
        cfg.validate()
    cfg.headroom = meta


def reshape_layers(model, layers: list[dict], head_dim: int) -> None:
    """Give each layer the recorded shape with uninitialised weights (to be loaded or initialised next)."""
    fam = family_of(model)
    attns = fam.attentions(model)
    if len(layers) != len(attns):
        raise HeadroomInputError(f"recorded {len(layers)} layers, the model has {len(attns)}")
    with torch.no_grad():
        for a, spec in zip(attns, layers):
            fam.reshape(a, int(spec["heads"]), int(spec.get("kv_heads", spec["heads"])), head_dim)
    gate = getattr(model, "_headroom_gate", None)
    if gate is not None:
        gate.clear()
        head_gate(model)


def attention_modules(model) -> list[nn.Module]:
    """Per layer, the module whose parameters `reshape_layers`/`prune_heads` replace."""
    fam = family_of(model)
    return fam.attentions(model)
