"""The head gate and physical head removal, for every family of families.py.

The gate ξ multiplies each query head's output just before the output projection — a forward pre-hook on that
projection (families.py says where it is per family), so it works with any attention implementation (eager, sdpa)
of transformers v5, which dropped `head_mask` and `prune_heads`. ξ is broadcastable to [batch, layers, heads]: one
value per head for masking, one per example and head for per-example gradients (|∂L_b/∂ξ_bh|) and for evaluating
many masks stacked along the batch in one forward pass.

Physical pruning slices the q/k/v rows and the output-projection columns of the removed heads (grouped-query
layers by families.kv_plan's rule) and gives a smaller model whose outputs equal the gated model's with those gates
at 0 (tested for every family).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from lightning_modules.declarations.config import HeadroomInputError
from lightning_modules.models.families import family_of

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


def check_keep(keep: Sequence[Sequence[int]], shapes: list[tuple[int, int, int]]) -> list[list[int]]:
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
    """Remove every head not in keep[l] from layer l, in place; returns the model. (FLAP's bias compensation, which
    first folds the removed heads' mean output into the output projection's bias, is
    `lightning_modules/pruning/compensate.py`'s `prune_compensated`.)

    Different counts per layer are allowed, at least one head per layer. Updates the model's config: a uniformly
    pruned Llama-family model gets plain `num_attention_heads`/`num_key_value_heads`/`head_dim` (any
    transformers install loads it); every pruned model records `config.headroom["layers"]` (heads and kv heads per
    layer) and `config.headroom["kept"]` (kept indices of the original dense heads), which `build.load_model` reads.
    """
    fam = family_of(model)
    attns = fam.attentions(model)
    shapes = [fam.shape(a) for a in attns]
    keep = check_keep(keep, shapes)
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
