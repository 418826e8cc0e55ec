"""The head scores of structured LLM pruning: three forward-only scores of the output projection's input and
weights, and LLM-Pruner's first-order Taylor score. Each returns [layers, heads], higher = more important, NaN where
a layer has fewer heads (as every scorer of scoring.py).

Notation, per layer: x ∈ R^{H·d} is the input of the output projection at one token (the heads' outputs side by
side, after the head gate: a head masked off reads 0), W ∈ R^{D×H·d} the projection's weight as a Linear holds it,
channel c a column of W, head h the channels [h·d, (h+1)·d).

- `activation` (Minitron, Muralidharan et al. 2024; NVIDIA Model Optimizer): s_c = sqrt(Σ over calibration
  sequences of (mean over positions of |x_c|)²); a head's score is the L2 norm of s over its channels.
- `flap` (An et al. 2024): the fluctuation of channel c, the variance of x_c over every calibration token (unbiased,
  as torch.var) times ‖W[:, c]‖²; a head's score is the mean over its channels.
- `wanda_sp` (structured Wanda, An et al. 2024's baseline): per channel the row-mean of |W[:, c]| · ‖X_c‖₂, with
  ‖X_c‖₂ the norm of x_c over every calibration token divided by √tokens (Wanda's running mean of squares: a
  constant factor, the ranking unchanged); a head's score is the sum over its channels.
- `taylor` (LLM-Pruner, Ma et al. 2023, element-wise first order): Σ |w · ∂L/∂w| over the head's parameters — its
  query rows, its key/value group's rows, its output-projection columns (families.head_slices) — with ∂L/∂w the
  gradient of the calibration loss (the mean per-token loss of each batch, summed over the batches).

Grouped-query attention: every score here is a query head's (its key/value group's rows count in taylor's sum);
the pruner keeps key/value heads by families.kv_plan's rule, as for every method.
"""

from __future__ import annotations

import torch

from lightning_modules.models.families import family_of
from lightning_modules.models.heads import head_gate
from lightning_modules.pruning.scoring import _device, _finish, _shape, _to


def _inputs(model, batches, loss_fn, mask, on_batch) -> None:
    """Run the calibration batches without autograd, calling on_batch(layer, x [B, T, H·d]) with every layer's
    output-projection input (gated by `mask` when given)."""
    fam = family_of(model)
    gate, dev = head_gate(model), _device(model)  # the gate's pre-hook first: the input is read after it
    if mask is not None:
        gate.set(mask.to(dev))
    hooks = [fam.out_proj(a).register_forward_pre_hook(lambda m, args, l=l: on_batch(l, args[0].detach().float()))
             for l, a in enumerate(fam.attentions(model))]
    try:
        with torch.no_grad():
            for batch in batches:
                loss_fn(model, _to(batch, dev))
    finally:
        for h in hooks:
            h.remove()
        gate.clear()


def _per_head(channel: list[torch.Tensor], model, reduce) -> torch.Tensor:
    """[L, H] from per-layer channel statistics [H_l·d]: reduce([H_l, d]) → [H_l]."""
    L, H, valid = _shape(model)
    fam = family_of(model)
    out = torch.zeros(L, H, dtype=torch.float64)
    for l, a in enumerate(fam.attentions(model)):
        n, _, hd = fam.shape(a)
        out[l, :n] = reduce(channel[l].reshape(n, hd))
    return _finish(out, valid)


def score_activation(model, batches, loss_fn, mask=None, **_) -> torch.Tensor:
    fam = family_of(model)
    acc = [None] * len(fam.attentions(model))

    def add(l, x):  # Σ over sequences of (mean over positions of |x_c|)²
        v = x.abs().mean(dim=1).double().pow(2).sum(dim=0)
        acc[l] = v if acc[l] is None else acc[l] + v

    _inputs(model, batches, loss_fn, mask, add)
    return _per_head([a.sqrt() for a in acc], model, lambda s: s.norm(dim=1))


def _moments(model, batches, loss_fn, mask) -> tuple[list[torch.Tensor], list[torch.Tensor], list[int]]:
    """Per layer and channel: Σ x, Σ x² over every calibration token, and the token count."""
    L = len(family_of(model).attentions(model))
    s1, s2, n = [0.0] * L, [0.0] * L, [0] * L

    def add(l, x):
        x = x.reshape(-1, x.shape[-1]).double()
        s1[l], s2[l], n[l] = s1[l] + x.sum(0), s2[l] + x.pow(2).sum(0), n[l] + x.shape[0]

    _inputs(model, batches, loss_fn, mask, add)
    return s1, s2, n


def _out_weights(model) -> list[torch.Tensor]:
    fam = family_of(model)
    return [fam.out_weight(a).detach().double().cpu() for a in fam.attentions(model)]


def score_flap(model, batches, loss_fn, mask=None, **_) -> torch.Tensor:
    s1, s2, n = _moments(model, batches, loss_fn, mask)
    metric = []
    for a, b, k, w in zip(s1, s2, n, _out_weights(model)):
        var = (b.cpu() - a.cpu().pow(2) / k) / max(k - 1, 1)
        metric.append(var * w.pow(2).sum(dim=0))
    return _per_head(metric, model, lambda m: m.mean(dim=1))


def score_wanda_sp(model, batches, loss_fn, mask=None, **_) -> torch.Tensor:
    _, s2, n = _moments(model, batches, loss_fn, mask)
    metric = [w.abs().mean(dim=0) * (b.cpu() / k).sqrt() for b, k, w in zip(s2, n, _out_weights(model))]
    return _per_head(metric, model, lambda m: m.sum(dim=1))


def score_taylor(model, batches, loss_fn, mask=None, **_) -> torch.Tensor:
    L, H, valid = _shape(model)
    fam = family_of(model)
    dev = _device(model)
    attns = fam.attentions(model)
    mine = {id(p): p for a in attns for n in range(fam.shape(a)[0]) for p, _ in fam.head_slices(a, n)}
    flags = [(p, p.requires_grad, p.grad) for p in model.parameters()]
    gate = head_gate(model)
    try:
        for p in model.parameters():  # gradients of the heads' own parameters only
            p.requires_grad_(id(p) in mine)
            p.grad = None
        if mask is not None:
            gate.set(mask.to(dev))
        with torch.enable_grad():
            for batch in batches:
                s, k = loss_fn(model, _to(batch, dev))
                (s.sum() / k.sum().clamp_min(1)).backward()
        out = torch.zeros(L, H, dtype=torch.float64)
        for l, a in enumerate(attns):
            for h in range(fam.shape(a)[0]):
                out[l, h] = sum((p.detach()[i].double() * p.grad[i].double()).abs().sum().item()
                                for p, i in fam.head_slices(a, h) if p.grad is not None)
    finally:
        gate.clear()
        for p, f, g in flags:
            p.grad = g
            p.requires_grad_(f)
    return _finish(out, valid)
