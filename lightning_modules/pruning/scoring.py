"""Head importance: `score_heads(model, calibration, method) -> [layers, heads]`, higher = more important.

Every method reads the *calibration* split (never an eval set) through the one head gate of heads.py. Layers with
fewer heads than the widest layer have NaN in the unused places. `mask` ([L, H] of 0/1) scores a model whose
masked heads are already off (the iterative schedule); their scores are meaningless and the pruner ignores them.

Losses are per example: a `loss_fn(model, batch) -> (summed loss [B], counted tokens [B])`. Language models use
their LM loss (`models.token_losses`); an encoder without an LM head uses `Distillation` to the unpruned model's
last hidden states.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from lightning_modules.declarations.config import HeadroomInputError
from lightning_modules.declarations.methods import GPU_ABLATION_ROWS, METHODS, get_method
from lightning_modules.models.build import has_lm_head, set_attention, token_losses
from lightning_modules.models.families import head_weights, layer_heads
from lightning_modules.models.heads import head_gate

LossFn = Callable[[torch.nn.Module, dict], tuple[torch.Tensor, torch.Tensor]]


class Distillation:
    """Per-token distance of the model's last hidden states to a teacher's on the same input: cosine distance
    (1 − cos) or mean squared error. The teacher runs ungated (if it is the gated model itself, its gate is lifted
    for the teacher pass)."""

    def __init__(self, teacher: torch.nn.Module, kind: str = "cosine"):
        if kind not in ("cosine", "mse"):
            raise HeadroomInputError(f"distillation loss {kind!r}: choose cosine or mse")
        self.teacher, self.kind = teacher.eval(), kind

    def _hidden(self, model, batch):
        out = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"))
        return out.last_hidden_state if hasattr(out, "last_hidden_state") and out.last_hidden_state is not None \
            else out.hidden_states[-1]

    def __call__(self, model, batch) -> tuple[torch.Tensor, torch.Tensor]:
        dev = batch["input_ids"].device
        if next(self.teacher.parameters()).device != dev:
            self.teacher.to(dev)
        gate = getattr(self.teacher, "_headroom_gate", None)
        saved = gate.values if gate is not None else None
        if gate is not None:
            gate.values = None
        try:
            with torch.no_grad():
                target = self._hidden(self.teacher, batch)
        finally:
            if gate is not None:
                gate.values = saved
        h = self._hidden(model, batch)
        if self.kind == "cosine":
            d = 1 - F.cosine_similarity(h.float(), target.float(), dim=-1)  # [B, T]
        else:
            d = ((h.float() - target.float()) ** 2).mean(-1)
        m = batch.get("attention_mask")
        m = torch.ones_like(d) if m is None else m.to(d.dtype)
        return (d * m).sum(1), m.sum(1)


def default_loss(model, teacher: torch.nn.Module | None = None) -> LossFn:
    """The model's own LM loss, or distillation to `teacher` (default: a frozen copy) for a headless encoder."""
    if has_lm_head(model):
        return token_losses
    if teacher is None:
        teacher = copy.deepcopy(model)
    return Distillation(teacher)


def _example_loss(loss_fn: LossFn, model, batch) -> torch.Tensor:
    s, n = loss_fn(model, batch)
    return s / n.clamp_min(1)


def _shape(model) -> tuple[int, int, torch.Tensor]:
    heads = layer_heads(model)
    valid = torch.zeros(len(heads), max(heads), dtype=torch.bool)
    for l, n in enumerate(heads):
        valid[l, :n] = True
    return len(heads), max(heads), valid


def _device(model):
    return next(model.parameters()).device


def _to(batch: dict, device) -> dict:
    return {k: v.to(device) for k, v in batch.items()}


def _finish(scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    scores = scores.detach().float().cpu().clone()
    scores[~valid] = float("nan")
    return scores


@contextmanager
def _frozen(model):
    """Parameters need no gradient while scoring: only ξ (or the L0 gates) do."""
    flags = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, f in zip(model.parameters(), flags):
            p.requires_grad_(f)


# ----------------------------------------------------------------------------------------------- methods


def score_gradient(model, batches, loss_fn, mask=None, normalize: bool = True, **_) -> torch.Tensor:
    """Michel, Levy & Neubig 2019, "Are Sixteen Heads Really Better than One?": I_h = E_x |∂L(x)/∂ξ_h|.

    The absolute value is taken per example before averaging (a per-example gate makes that one backward pass
    per batch), not per batch as the bertology script does. Normalised per layer by its L2 norm (as Michel et al.;
    `normalize=False` turns it off)."""
    L, H, valid = _shape(model)
    dev = _device(model)
    gate = head_gate(model)
    acc, n = torch.zeros(L, H, device=dev), 0
    base = (mask if mask is not None else torch.ones(L, H)).to(dev)
    with _frozen(model):
        for batch in batches:
            batch = _to(batch, dev)
            b = batch["input_ids"].shape[0]
            xi = torch.ones(b, L, H, device=dev, requires_grad=True)
            gate.set(xi * base)
            loss = _example_loss(loss_fn, model, batch).sum()
            (g,) = torch.autograd.grad(loss, xi)
            acc += g.abs().sum(0)
            n += b
    gate.clear()
    imp = acc / max(n, 1)
    if normalize:
        imp = imp / imp.norm(dim=1, keepdim=True).clamp_min(1e-20)
    return _finish(imp, valid)


@torch.no_grad()
def score_ablation(model, batches, loss_fn, mask=None, masks_per_pass: int | None = None,
                   max_rows: int | None = None, signed: bool = False, **_) -> torch.Tensor:
    """Leave-one-out: how much the loss changes when head h alone is masked (on top of `mask`),
    I_h = E_x |L_x(ξ_h = 0) − L_x(ξ = 1)|.

    This is the exact quantity that Michel et al.'s gradient importance approximates to first order (Molchanov et
    al. 2017's Taylor criterion |ΔL|), with the absolute value per example as there. A head that hurts (its removal
    lowers the loss) therefore counts as influential; `signed=True` gives the plain mean loss increase instead,
    which ranks such heads first for removal.

    Many single-head masks run in one forward pass: the batch is repeated once per mask and each copy gets its own
    row of the per-example gate. `masks_per_pass=1` is the sequential loop (one mask per forward pass), kept as
    the reference the batched version is tested against. `max_rows` caps the rows of one pass (default 256 on a
    GPU; on a CPU, where a bigger batch buys no throughput — measured in benchmarks/ablation_batched.py — one
    mask per pass)."""
    L, H, valid = _shape(model)
    dev = _device(model)
    if max_rows is None:
        max_rows = GPU_ABLATION_ROWS if dev.type == "cuda" else 1
    gate = head_gate(model)
    base = (mask if mask is not None else torch.ones(L, H)).to(dev)
    heads = [(l, h) for l in range(L) for h in range(H) if valid[l, h] and base[l, h] > 0]
    masks = base.repeat(len(heads), 1, 1)
    for i, (l, h) in enumerate(heads):
        masks[i, l, h] = 0.0
    total = torch.zeros(len(heads), device=dev, dtype=torch.float64)
    n = 0
    for batch in batches:
        batch = _to(batch, dev)
        b = batch["input_ids"].shape[0]
        gate.set(base)
        ref = _example_loss(loss_fn, model, batch).double()  # [B]
        per_pass = masks_per_pass or max(1, max_rows // b)
        for start in range(0, len(heads), per_pass):
            m = masks[start:start + per_pass]  # [k, L, H]
            k = m.shape[0]
            big = {key: v.repeat(k, *([1] * (v.dim() - 1))) for key, v in batch.items()}  # mask-major rows
            gate.set(m.repeat_interleave(b, dim=0))
            diff = _example_loss(loss_fn, model, big).double().view(k, b) - ref  # [k, B]
            total[start:start + k] += (diff if signed else diff.abs()).sum(1)
        n += b
    gate.clear()
    scores = torch.zeros(L, H, dtype=torch.float64)
    for i, (l, h) in enumerate(heads):
        scores[l, h] = total[i].item() / max(n, 1)
    return _finish(scores, valid)


@torch.no_grad()
def score_magnitude(model, batches=None, loss_fn=None, mask=None, **_) -> torch.Tensor:
    """Weight-based: the Frobenius norm of the head's OV circuit W_O^h W_V^h (its value and output-projection
    slices; Elhage et al. 2021). Needs no data. A head whose output slice is zero scores exactly 0."""
    L, H, valid = _shape(model)
    scores = torch.zeros(L, H)
    for l in range(L):
        for h in range(H):
            if valid[l, h]:
                v, o = head_weights(model, l, h)  # [d, D], [D, d]
                scores[l, h] = (o.float() @ v.float()).norm()
    return _finish(scores, valid)


@torch.no_grad()
def _attention_stats(model, batches, mask=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean attention entropy and mean maximum attention weight of every head, over query positions."""
    L, H, valid = _shape(model)
    dev = _device(model)
    gate = head_gate(model)
    ent, conf, rows = torch.zeros(L, H, device=dev), torch.zeros(L, H, device=dev), 0.0
    set_attention(model, "eager")
    try:
        for batch in batches:
            batch = _to(batch, dev)
            gate.set(mask.to(dev) if mask is not None else None)
            out = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"),
                        output_attentions=True)
            am = batch.get("attention_mask")
            qmask = torch.ones(batch["input_ids"].shape, device=dev) if am is None else am.float()  # [B, T]
            for l, a in enumerate(out.attentions):  # a: [B, H_l, T, T]
                a = a.float()
                e = -(a * torch.log(a.clamp_min(1e-12))).sum(-1)  # [B, H, T]
                c = a.max(-1).values
                w = qmask[:, None, :]
                ent[l, :a.shape[1]] += (e * w).sum((0, 2))
                conf[l, :a.shape[1]] += (c * w).sum((0, 2))
            rows += float(qmask.sum())
    finally:
        set_attention(model, "sdpa")
        gate.clear()
    return ent / max(rows, 1), conf / max(rows, 1)


def score_entropy(model, batches, loss_fn=None, mask=None, **_) -> torch.Tensor:
    """Mean attention entropy of the head over query positions, negated: a focused (low-entropy) head counts as
    important, a diffuse one — close to averaging the context — as unimportant. The direction follows Voita et al.
    2019, whose important heads are the confident, sharply attending ones. Higher score = more important."""
    _, _, valid = _shape(model)
    ent, _ = _attention_stats(model, batches, mask)
    return _finish(-ent, valid)


def score_confidence(model, batches, loss_fn=None, mask=None, **_) -> torch.Tensor:
    """Voita, Talbot, Moiseev, Sennrich & Titov 2019, "Analyzing Multi-Head Self-Attention": a head's confidence
    is its mean maximum attention weight over query positions."""
    _, _, valid = _shape(model)
    _, conf = _attention_stats(model, batches, mask)
    return _finish(conf, valid)


def score_random(model, batches=None, loss_fn=None, mask=None, seed: int = 0, **_) -> torch.Tensor:
    """Seeded uniform scores: the baseline every method must beat."""
    L, H, valid = _shape(model)
    return _finish(torch.rand(L, H, generator=torch.Generator().manual_seed(seed)), valid)


# hard-concrete distribution (Louizos, Welling & Kingma 2018) with the settings of Voita et al. 2019
L0_BETA, L0_GAMMA, L0_ZETA = 0.33, -0.1, 1.1


def l0_open_probability(log_alpha: torch.Tensor) -> torch.Tensor:
    """P(gate ≠ 0) of a stretched hard-concrete gate: sigmoid(log α − β log(−γ/ζ))."""
    return torch.sigmoid(log_alpha - L0_BETA * math.log(-L0_GAMMA / L0_ZETA))


def sample_hard_concrete(log_alpha: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    u = torch.rand(log_alpha.shape, generator=generator).to(log_alpha.device).clamp(1e-6, 1 - 1e-6)
    s = torch.sigmoid((torch.log(u) - torch.log(1 - u) + log_alpha) / L0_BETA)
    return (s * (L0_ZETA - L0_GAMMA) + L0_GAMMA).clamp(0.0, 1.0)


def score_l0(model, batches, loss_fn, mask=None, steps: int = 150, lam: float = 0.01, lr: float = 0.05,
             init: float = 2.0, seed: int = 0, **_) -> torch.Tensor:
    """Voita et al. 2019: stochastic hard-concrete gates (temperature 0.33, stretch (−0.1, 1.1)) on every head,
    trained for `steps` steps on the calibration data to minimise loss + λ·Σ P(gate open) (the expected L0 norm),
    the model's weights frozen. Scores are the learned open-probabilities. (Voita et al. train the gates while
    fine-tuning the model; here the weights stay fixed so the score describes the trained model.)"""
    L, H, valid = _shape(model)
    dev = _device(model)
    gate = head_gate(model)
    base = (mask if mask is not None else torch.ones(L, H)).to(dev)
    log_alpha = torch.full((L, H), init, device=dev, requires_grad=True)
    opt = torch.optim.Adam([log_alpha], lr=lr)
    gen = torch.Generator().manual_seed(seed)
    data = list(batches)
    if not data:
        raise HeadroomInputError("l0 scoring needs at least one calibration batch")
    with _frozen(model):
        for step in range(steps):
            batch = _to(data[step % len(data)], dev)
            z = sample_hard_concrete(log_alpha, gen)
            gate.set(z * base)
            loss = _example_loss(loss_fn, model, batch).mean()
            penalty = (l0_open_probability(log_alpha) * valid.to(dev) * base).sum()
            opt.zero_grad()
            (loss + lam * penalty).backward()
            opt.step()
    gate.clear()
    return _finish(l0_open_probability(log_alpha), valid)


def ranked(scores: torch.Tensor, method: str, scope: str) -> torch.Tensor:
    """The scores a selection ranks: as scored, or — a method declared `standardize` (FLAP), pruned globally —
    z-scored within each layer (mean 0, population SD 1 over its heads; a layer of equal scores: all 0), so that
    layers whose scores live on different scales share one threshold."""
    if scope != "global" or not get_method(method).standardize:
        return scores
    out = scores.clone()
    for l in range(scores.shape[0]):
        ok = ~torch.isnan(scores[l])
        v = scores[l, ok].double()
        sd = v.std(unbiased=False)
        out[l, ok] = ((v - v.mean()) / sd if sd > 0 else torch.zeros_like(v)).to(scores.dtype)
    return out


def score_heads(model, calibration: Iterable[dict], method: str, *, loss_fn: LossFn | None = None,
                mask: torch.Tensor | None = None, **options) -> torch.Tensor:
    """Importance of every head, [layers, heads], higher = more important (NaN where a layer has fewer heads).

    `calibration` is an iterable of batches of the calibration split; it is materialised once so every method
    sees the same batches."""
    if method not in METHODS:
        raise HeadroomInputError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    m = get_method(method)
    batches = list(calibration) if calibration is not None else []
    if not batches and m.needs_calibration:
        raise HeadroomInputError(f"method {method}: no calibration batches")
    was_training = model.training
    model.eval()
    try:
        return m.score_fn()(model, batches, loss_fn or default_loss(model), mask=mask, **options)
    finally:
        model.train(was_training)
