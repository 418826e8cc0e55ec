"""The names of the metrics training itself logs (Lightning's `self.log`, the probes callback), declared once at
the floor that writes them; orchestration/running/metrics.py re-exports them beside every other run metric, and the
stages, trials and report read them from there. Torch-free."""

from __future__ import annotations

TRAIN_LOSS, TRAIN_PPL, TRAIN_LR = "train/loss", "train/ppl", "train/lr"
TRAIN_GRAD_NORM, TRAIN_TOKENS_PER_S = "train/grad_norm", "train/tokens_per_s"
VAL_LOSS, VAL_PPL = "val/loss", "val/ppl"  # what the learning-rate search and ASHA minimise

PROBE = "probe/"  # every probe metric starts with this
PROBE_PRUNABLE = "probe/prunable_fraction"  # the fraction of heads removable within the tolerance, at a step
PROBE_SPREAD = "probe/importance_spread"
PROBE_REDUNDANCY = "probe/redundancy"  # mean pairwise CKA of head outputs over layers


def probe_layer(metric: str, layer: int) -> str:
    """A probe's value in one layer: probe/redundancy/layer3."""
    return f"{metric}/layer{layer}"
