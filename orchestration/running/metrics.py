"""The names of a child run's metrics, declared once: what a trial reports (trainables), what MLflow stores, what
the report reads (report/*). A prune trial's nested result (`pruning.run_prune`) is flattened here, and every
reader names a metric through these functions, so a writer and its readers cannot spell it differently.

    <stage>/<split>/loss|tokens|ppl   stage: final (after recovery; a train run's own), pre_ft (masked, before
                                      recovery), dense (the dense model, measured by its train trial), no_ft
                                      (the physically pruned model before recovery); split: id, shift, val, ...
    curve/<split>/r<ratio>            the mask-only prune curve
    pre_ft_random/<split>/loss|draw<k>  the random method as a distribution: several draws
    stability/spearman|spearman_layer_min, stability/overlap|chance/r<ratio>
                                      the split-half agreement of a prune's head ranking (lightning_modules/
                                      stability.py)
    cost/<kind>                       seconds and steps of a unit (cost/recovery_steps: what Scratch-B counts;
                                      cost/cpu_s, gpu_s, wall_s, work_s: what the sweep's tracker adds)
    finetune/lr, eval/<split>/windows_excluded, latency_ms/<kind>
    train/loss, val/loss, probe/...   logged by training itself (lightning_modules/declarations/names.py)
"""

from __future__ import annotations

from lightning_modules.declarations.names import (  # noqa: F401 - what training logs, named here with the rest
    PROBE,
    PROBE_PRUNABLE,
    PROBE_REDUNDANCY,
    PROBE_SPREAD,
    TRAIN_LOSS,
    TRAIN_LR,
    TRAIN_PPL,
    VAL_LOSS,
    VAL_PPL,
    probe_layer,
)

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


def flatten_train(m: dict, passthrough: tuple[str, ...]) -> dict:
    """A train trial's result (`train_lm`'s metrics) → its run's final metrics: loss, perplexity and tokens per
    eval split, the windows each split's cleaning excluded, and the `passthrough` numbers as they are."""
    out = {}
    for split, v in m.get("final", {}).items():
        out[loss(FINAL, split)] = v["loss"]
        out[ppl(FINAL, split)] = v["ppl"]
        out[tokens(FINAL, split)] = v["tokens"]
    for split, v in m.get("eval_windows", {}).items():
        out[windows_excluded(split)] = v["excluded"]
    out.update({k: m[k] for k in passthrough if k in m})
    return out


# the stages of a prune result (`run_prune`'s "loss") and the metric stage each is reported under
_PRUNE_STAGES = (("final", FINAL), ("pre_ft", PRE_FT), ("dense", DENSE), ("pruned_no_ft", NO_FT))


def flatten_prune(m: dict, eval_sets: list[str], recovery_steps: int, scoring_flops: float | None = None) -> dict:
    """A prune trial's nested result → the flat metrics its MLflow run records (params and FLOPs of both models,
    losses per stage and split, the random baseline's draws, the recovery fine-tune, latency, the prune curve)."""
    flat = {"params": m["params"]["pruned"], "params_dense": m["params"]["dense"],
            "params_dense_nonembedding": m["params_nonembedding"]["dense"],
            "flops_per_token": m["flops_per_token"]["pruned"]["total"],
            "flops_per_token_dense": m["flops_per_token"]["dense"]["total"]}
    for stage, key in _PRUNE_STAGES:
        for split, v in m["loss"][stage].items():
            flat[loss(key, split)] = v["loss"]
            if key in (FINAL, PRE_FT):
                flat[tokens(key, split)] = v["tokens"]
            if key == FINAL:
                flat[ppl(key, split)] = v["ppl"]
    if "prune_step" in m:  # pruned during training: the dense step it started from
        flat["prune_step"] = m["prune_step"]
    for split, v in m["random_baseline"].items():
        flat[loss(RANDOM, split)] = v["loss"]
        for k, x in enumerate(v["draws"]):
            flat[random_draw(split, k)] = x
    # the recovery steps the pruned arm trained, every candidate rate's (what Scratch-B's budget counts; more
    # when the rate was extended past the grid's edge)
    flat[cost("recovery_steps")] = recovery_steps
    if scoring_flops is not None:  # the FLOPs its method spent scoring the heads (Scratch-B's budget counts them)
        flat[cost("scoring_flops")] = scoring_flops
    ft = m["finetune"]
    if ft["lr"] is not None:  # the recovery fine-tune's rate (chosen on val from the grid, or the sweep's)
        flat[FINETUNE_LR] = ft["lr"]
        for lr, v in ft["grid"].items():
            flat[finetune_val_loss(lr)] = v
    for kind, v in (m.get("stability") or {}).items():  # the ranking's split-half agreement (informed methods)
        if kind in ("spearman", "spearman_layer_min") and v is not None:
            flat[stability(kind)] = v
        elif kind in ("overlap", "chance"):
            flat.update({stability(kind, float(r)): x for r, x in v.items()})
    for kind, ms in m["latency_ms"].items():
        flat[f"latency_ms/{kind}"] = ms
    for row in m["prune_curve"]:  # one metric per (eval set, ratio): MLflow's chart view
        for split in eval_sets or ["val"]:
            flat[curve(split, row["ratio"])] = row[split]
    return flat


