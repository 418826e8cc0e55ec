"""The names of a run's metrics, declared once: what training logs (Lightning's `self.log`, the probes callback),
what a trial reports (a result type flattens itself through these: `pruning/result.py`, `training/loop.py`), what
MLflow stores, what the report reads (orchestration/report/*). Every writer and reader names a metric through this
module, so none can spell it differently. Torch-free.

    <stage>/<split>/loss|tokens|ppl   stage: final (after recovery; a train run's own), pre_ft (masked, before
                                      recovery), dense (the dense model, measured by its train trial), no_ft
                                      (the physically pruned model before recovery); split: id, shift, val, ...
    curve/<split>/r<ratio>            the mask-only prune curve
    pre_ft_random/<split>/loss|draw<k>  the random method as a distribution: several draws
    stability/spearman|spearman_layer_min, stability/overlap|chance/r<ratio>
                                      the split-half agreement of a prune's head ranking (lightning_modules/
                                      pruning/stability.py)
    cost/<kind>                       seconds and steps of a unit (cost/recovery_steps: what Scratch-B counts;
                                      cost/cpu_s, gpu_s, wall_s, work_s: what the sweep's tracker adds)
    finetune/lr, eval/<split>/windows_excluded, latency_ms/<kind>
    train/loss, val/loss, probe/...   logged by training itself
"""

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


FINAL, PRE_FT, DENSE, NO_FT = "final", "pre_ft", "dense", "no_ft"
RANDOM = "pre_ft_random"


def loss(stage: str, split: str) -> str:
    return f"{stage}/{split}/loss"


def tokens(stage: str, split: str) -> str:
    return f"{stage}/{split}/tokens"


def ppl(stage: str, split: str) -> str:
    return f"{stage}/{split}/ppl"


def curve(split: str, ratio: float) -> str:
    return f"{curve_prefix(split)}{ratio:.4g}"


def curve_prefix(split: str) -> str:
    """The metrics of a split's prune curve start with this; the ratio follows."""
    return f"curve/{split}/r"


def random_draw(split: str, k: int | None = None) -> str:
    """The k-th random draw's loss before fine-tune (k None: the prefix every draw starts with)."""
    return f"{RANDOM}/{split}/draw" + ("" if k is None else str(k))


def stability(kind: str, ratio: float | None = None) -> str:
    """A split-half agreement number of a prune run's ranking: spearman, spearman_layer_min, or at `ratio` the
    overlap of the two halves' pruned sets and its chance level."""
    return f"stability/{kind}" + ("" if ratio is None else f"/r{ratio:.4g}")


def cost(kind: str) -> str:
    return f"cost/{kind}"


def eval_splits(metrics: dict) -> set[str]:
    """The splits a run was evaluated on after training (final/<split>/loss)."""
    return {k.split("/")[1] for k in metrics if k.startswith(f"{FINAL}/") and k.endswith("/loss")}


FINETUNE_LR = "finetune/lr"  # a prune run's recovery rate (chosen on val from the grid, or the sweep's)


def finetune_val_loss(lr) -> str:
    """The validation loss of the recovery fine-tune at one candidate rate of the grid."""
    return f"finetune/val_loss/lr{lr}"


def windows_excluded(split: str) -> str:
    """Eval windows of a split its cleaning left out (they overlap training text)."""
    return f"eval/{split}/windows_excluded"


# cost/<kind>: seconds of a unit in training, evaluation, scoring, and re-scoring the halves of its calibration
WORK_KINDS = ("train_s", "eval_s", "score_s", "stability_s")


def timing(t: dict) -> dict:
    """Seconds of a unit's work by kind, as the cost/* metrics of its run (the sweep's compute share)."""
    return {cost(k): float(v) for k, v in t.items() if k in WORK_KINDS}
