"""Bias compensation (An et al. 2024, FLAP): the mean output of the removed heads folded into the output
projection's bias, so that the pruned attention's mean output over the calibration tokens stays the dense one's.

For layer l with output projection W (as a Linear's weight, [D, H·d]) and the mean over the calibration tokens of
its input, m (the concatenated head outputs, [H·d]), the removed heads' channels C add on average W[:, C] m[C] to
the output; the bias gains exactly that before those channels go. The means are read on the dense model in one
forward pass over the calibration batches (FLAP reads each layer's on the model pruned up to it; here every layer's
mean is the dense model's, so the identity holds for each layer given its dense input: tests/test_compensate.py).

A Llama-family attention has no bias by default: compensation gives it one (`attention_bias`, the query, key and
value biases zero), so that the pruned directory loads as a standard checkpoint with its bias.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from lightning_modules.models.families import family_of
from lightning_modules.models.heads import check_keep, prune_heads


@torch.no_grad()
def output_means(model, batches: Sequence[dict]) -> list[torch.Tensor]:
    """Per layer, the mean over every calibration token of the output projection's input ([H·d], float64)."""
    fam = family_of(model)
    sums: list[torch.Tensor | None] = [None] * len(fam.attentions(model))
    count = [0]

    def hook(l):
        def record(_module, args):
            x = args[0].detach().double().reshape(-1, args[0].shape[-1])
            sums[l] = x.sum(0) if sums[l] is None else sums[l] + x.sum(0)
            if l == 0:
                count[0] += x.shape[0]
        return record

    handles = [fam.out_proj(a).register_forward_pre_hook(hook(l)) for l, a in enumerate(fam.attentions(model))]
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    try:
        for b in batches:
            model(input_ids=b["input_ids"].to(device))
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return [s / count[0] for s in sums]


def _with_bias(model, attn, fam) -> torch.Tensor:
    """The output projection's bias, created (zero) where the family has none by default."""
    out = fam.out_proj(attn)
    if out.bias is not None:
        return out.bias
    if fam.name != "llama":
        raise ValueError(f"{fam.name}: the output projection has no bias to compensate into")
    for lin in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj):  # attention_bias: all four, as transformers
        lin.bias = nn.Parameter(torch.zeros(lin.out_features, dtype=lin.weight.dtype, device=lin.weight.device))
    model.config.attention_bias = True
    return out.bias


@torch.no_grad()
def compensate(model, keep: Sequence[Sequence[int]], means: list[torch.Tensor]) -> None:
    """Fold the mean output of every head not in keep[l] into layer l's output-projection bias (before the heads
    are removed: `heads.prune_heads`)."""
    fam = family_of(model)
    if fam.name == "llama" and fam.out_proj(fam.attentions(model)[0]).bias is None:
        for attn in fam.attentions(model):  # attention_bias is the whole model's: every layer gets zero biases
            _with_bias(model, attn, fam)
    for l, attn in enumerate(fam.attentions(model)):
        n, _, hd = fam.shape(attn)
        gone = [h for h in range(n) if h not in set(keep[l])]
        if not gone:
            continue
        cols = torch.cat([torch.arange(h * hd, (h + 1) * hd) for h in gone])
        w = fam.out_weight(attn).detach().double()
        delta = w[:, cols] @ means[l].to(w.device)[cols]
        bias = _with_bias(model, attn, fam)
        bias.add_(delta.to(bias.dtype))


def prune_compensated(model, keep: Sequence[Sequence[int]], means: list[torch.Tensor] | None):
    """`heads.prune_heads`, with the removed heads' mean output (`means`: the dense model's, `output_means`) folded
    into each layer's output-projection bias first; without `means` the plain removal. Returns the model."""
    if means is not None:
        fam = family_of(model)
        compensate(model, check_keep(keep, [fam.shape(a) for a in fam.attentions(model)]), means)
    return prune_heads(model, keep)
