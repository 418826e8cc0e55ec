"""Mechanism probes: why a dense model has heads to spare.

Two measurements that a dense training run takes of itself (the verdict report plots them):

- **importance over training**: at several steps, the heads are scored on calibration data and a mask-only prune
  curve on validation batches gives the *prunable fraction* at that step (`config.prunable_fraction`), along with
  the *spread* of importance (coefficient of variation over heads). "Slack appears late" predicts a prunable
  fraction that grows with training; over-provisioning for optimisation predicts slack that is there early.
- **head redundancy**: pairwise linear CKA (Kornblith et al. 2019) between the outputs of the heads of one layer,
  at initialisation and after training. One proposed explanation of prunability says heads start out linearly
  dependent; this measures how similar they are, before and after.

Probes only read the model (scoring sets no parameter gradients, the gate is cleared afterwards), so a run with
probes trains exactly as one without (tested).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from pytorch_lightning.callbacks import Callback

from lightning_modules.declarations.config import prunable_fraction
from lightning_modules.declarations.names import PROBE_PRUNABLE, PROBE_REDUNDANCY, PROBE_SPREAD, probe_layer
from lightning_modules.declarations.prune_plan import DEFAULT_TOLERANCE
from lightning_modules.models.families import family_of
from lightning_modules.pruning.measure import prune_curve
from lightning_modules.pruning.scoring import default_loss, score_heads

Row = list  # [metric, step, value]


def linear_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """Linear CKA of two representations of the same n examples, x [n, p] and y [n, q]:
    ‖Ycᵀ Xc‖²_F / (‖Xcᵀ Xc‖_F ‖Ycᵀ Yc‖_F) with column-centred Xc, Yc. 1 for representations equal up to an
    orthogonal map and a scale; near 0 for unrelated ones."""
    x = x.double() - x.double().mean(0)
    y = y.double() - y.double().mean(0)
    num = (y.T @ x).pow(2).sum()
    den = (x.T @ x).norm() * (y.T @ y).norm()
    return float(num / den) if den > 0 else float("nan")


def _cka_matrix(z: torch.Tensor, n_heads: int) -> torch.Tensor:
    """All pairwise linear CKAs of the heads of one layer from their outputs z [n, H·d], with one Gram matrix."""
    z = z.double()
    z = z - z.mean(0)
    d = z.shape[1] // n_heads
    c = z.T @ z  # block (i, j) = Zc_iᵀ Zc_j
    blocks = c.reshape(n_heads, d, n_heads, d).permute(0, 2, 1, 3)  # [H, H, d, d]
    sq = blocks.pow(2).sum((-1, -2))  # ‖Zc_jᵀ Zc_i‖²_F
    norms = sq.diagonal().sqrt()  # ‖Zc_iᵀ Zc_i‖_F
    return (sq / (norms[:, None] * norms[None, :]).clamp_min(1e-300)).float()


@torch.no_grad()
def head_redundancy(model, batches: list[dict]) -> list[torch.Tensor]:
    """Per layer, the [H, H] matrix of linear CKA between head outputs (the inputs of the output projection, per
    head) on `batches`, tokens as examples (padding excluded)."""
    fam = family_of(model)
    attns = fam.attentions(model)
    feats: list[list[torch.Tensor]] = [[] for _ in attns]
    current: dict = {}
    hooks = []
    for l, a in enumerate(attns):
        def hook(module, args, l=l):
            x = args[0]
            m = current.get("mask")
            x = x.reshape(-1, x.shape[-1]) if m is None else x[m.bool()]
            feats[l].append(x.detach().float().cpu())

        hooks.append(fam.out_proj(a).register_forward_pre_hook(hook))
    was = model.training
    model.eval()
    dev = next(model.parameters()).device
    try:
        for b in batches:
            current["mask"] = b.get("attention_mask")
            model(input_ids=b["input_ids"].to(dev),
                  attention_mask=None if b.get("attention_mask") is None else b["attention_mask"].to(dev))
    finally:
        for h in hooks:
            h.remove()
        model.train(was)
    return [_cka_matrix(torch.cat(f), fam.shape(a)[0]) for f, a in zip(feats, attns)]


def mean_off_diagonal(m: torch.Tensor) -> float:
    n = m.shape[0]
    if n < 2:
        return float("nan")
    return float((m.sum() - m.diagonal().sum()) / (n * n - n))


def importance_probe(model, calibration: list[dict], val: list[dict], method: str, tolerance: float,
                     seed: int = 0) -> dict:
    """Scores of the heads now, their spread, and the prunable fraction of a mask-only curve on `val`."""
    loss_fn = default_loss(model)
    with torch.enable_grad():
        scores = score_heads(model, calibration, method, loss_fn=loss_fn, seed=seed)
    valid = scores[~torch.isnan(scores)]
    spread = float(valid.std(unbiased=False) / valid.mean().abs().clamp_min(1e-12)) if valid.numel() else float("nan")
    rows = prune_curve(model, scores, {"val": val}, "per_layer", loss_fn)
    losses = [r["val"] for r in rows]
    fractions = [r["ratio"] for r in rows]  # the fractions of heads actually removed
    return {"scores": scores, "spread": spread, "curve": losses, "fractions": fractions,
            "prunable_fraction": prunable_fraction(fractions, losses, losses[0], tolerance)}


class ProbeCallback(Callback):
    """Runs the probes of a dense training run at step 0 (initialisation), every `every` steps and at the last
    step, and hands each result to `sink` as [metric, step, value] rows:

        probe/prunable_fraction, probe/importance_spread    (importance over training)
        probe/redundancy, probe/redundancy/layer<l>         (mean pairwise CKA of head outputs)
    """

    def __init__(self, sink: Callable[[list[Row]], None], every: int, method: str = "gradient", batches: int = 2,
                 tolerance: float = DEFAULT_TOLERANCE, redundancy: bool = True, seed: int = 0):
        self.sink, self.every, self.method, self.n = sink, every, method, batches
        self.tolerance, self.redundancy, self.seed = tolerance, redundancy, seed
        self._batches: tuple[list, list] | None = None
        self._done: set[int] = set()
        self.seconds = 0.0  # spent probing (scoring, mask-only curves, CKA)

    def _data(self, trainer):
        if self._batches is None:
            dm = trainer.datamodule
            self._batches = (list(dm.loader("calibration", self.n)), list(dm.loader("val", self.n)))
        return self._batches

    def probe(self, trainer, model, step: int) -> None:
        if step in self._done:
            return
        self._done.add(step)
        t0 = time.perf_counter()
        dev = next(model.parameters()).device
        # the random state training continues with is untouched (a DataLoader iterator draws a seed from it)
        with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
            calib, val = self._data(trainer)
            imp = importance_probe(model, calib, val, self.method, self.tolerance, self.seed)
            rows = [[PROBE_PRUNABLE, step, imp["prunable_fraction"]], [PROBE_SPREAD, step, imp["spread"]]]
            if self.redundancy:
                per_layer = [mean_off_diagonal(m) for m in head_redundancy(model, val)]
                rows.append([PROBE_REDUNDANCY, step, sum(per_layer) / len(per_layer)])
                rows += [[probe_layer(PROBE_REDUNDANCY, l), step, v] for l, v in enumerate(per_layer)]
        self.seconds += time.perf_counter() - t0
        self.sink(rows)

    def on_train_start(self, trainer, pl_module):
        if trainer.global_step == 0:
            self.probe(trainer, pl_module.model, 0)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = int(trainer.global_step)
        if step % self.every == 0 or step >= trainer.max_steps:
            self.probe(trainer, pl_module.model, step)
