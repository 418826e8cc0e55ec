"""Prune heads: a plan (ratio, scope, schedule) → the heads to keep → a mask or physical removal, then optional
recovery fine-tuning, evaluation before and after on every eval set, the mask-only prune curve, parameter and
FLOP counts, and measured latency of the dense, masked and physically pruned models."""

from __future__ import annotations

import copy
import math
import statistics
import time

from lightning_modules.declarations.config import HeadroomInputError
from lightning_modules.declarations.prune_plan import DEFAULT_CALIBRATION_BATCHES, PrunePlan
from lightning_modules.models.build import count_parameters
from lightning_modules.models.families import layer_heads
from lightning_modules.models.heads import head_gate
from lightning_modules.pruning.choose import heads_to_keep, select_heads
from lightning_modules.pruning.compensate import output_means, prune_compensated
from lightning_modules.pruning.measure import (
    WorkTimer,
    evaluate_loss,
    forward_flops,
    measure_latency,
    prune_curve,
    split_windows,
)
from lightning_modules.pruning.recover import recover
from lightning_modules.pruning.result import PruneResult
from lightning_modules.pruning.scoring import LossFn, default_loss, score_heads
from lightning_modules.pruning.stability import split_half
from lightning_modules.training.distill import DistillSpec, recovery_loss, recovery_record
from lightning_modules.training.lm import eval_record

RANDOM_DRAWS = 4  # extra random choices a `random` prune evaluates besides its own


def run_prune(model, data, plan: PrunePlan, *, eval_batches: int | None = None, calibration_batches: int = DEFAULT_CALIBRATION_BATCHES,
              curve_batches: int | None = None, loss_fn: LossFn | None = None, latency_batch_size: int = 16,
              latency_repeats: int = 20, curve: bool = True, progress: bool = False,
              method_options: dict | None = None, dense_eval: dict | None = None, random_draws: int = RANDOM_DRAWS,
              recovery: str = "lm", distill: DistillSpec | None = None, data_start: int | None = None):
    """The whole prune stage on one model: score on calibration, choose, evaluate masked (before fine-tune),
    remove physically, fine-tune (choosing its rate on val when the plan gives a grid), evaluate again, count and
    time. Returns (pruned model, scores, its PruneResult).

    eval_batches None evaluates every clean window of each split (up to the stated cap); `curve_batches` bounds
    the mask-only curve's evaluation (default: the same). `dense_eval` ({split: evaluate() result}) is the dense
    model's evaluation on exactly these windows when the caller has it already (a sweep's train trial measured
    it); otherwise it is measured here. metrics["windows"] holds per-window losses before and after fine-tune.
    `recovery` "distill" fine-tunes on the KL divergence to this (unpruned, frozen) model's logits, as `distill`
    says (lightning_modules/training/distill.py); the losses reported stay LM losses."""
    t_start = time.perf_counter()
    timer = WorkTimer()
    model.eval()
    loss_fn = loss_fn or default_loss(model)
    dense_teacher = getattr(loss_fn, "teacher", None)
    heads = layer_heads(model)
    sets = ["val", *data.eval_sets]
    loaders = {s: data.loader(s, eval_batches) for s in sets}
    # the mask-only curve is read on the eval sets (the validation split chooses, it does not report)
    curve_sets = [s for s in sets if s != "val"] or sets
    curve_loaders = {s: loaders[s] if curve_batches is None else data.loader(s, curve_batches) for s in curve_sets}
    calib = list(data.loader("calibration", calibration_batches))
    if len(calib) == 0 or calib[0]["input_ids"].shape[0] < data.train_cfg.batch_size:
        raise HeadroomInputError("calibration split is shorter than one batch")
    seq_len = calib[0]["input_ids"].shape[1]

    with timer("eval_s"):
        if dense_eval is not None and all(s in dense_eval for s in sets):
            dense = {s: {k: dense_eval[s][k] for k in ("loss", "ppl", "tokens")} for s in sets}
        else:
            dense = {s: evaluate_loss(model, l, loss_fn) for s, l in loaders.items()}
    with timer("score_s"):
        keep, scores = select_heads(model, calib, plan, loss_fn=loss_fn, **(method_options or {}))
    with timer("stability_s"):  # information, not the choice: how far each half of the calibration agrees
        stable = split_half(model, calib, plan.method, plan.scope, plan.ratio, loss_fn,
                            **{"seed": plan.seed, **(method_options or {})})
    gate = head_gate(model)
    dev = next(model.parameters()).device
    gate.mask(keep, device=dev)
    with timer("eval_s"):
        pre_ft = {s: evaluate_loss(model, l, loss_fn, per_window=True) for s, l in loaders.items()}
    windows = {"pre_ft": {s: split_windows(v) for s, v in pre_ft.items()}}
    lat_batch = next(iter(data.loader("val", 1, batch_size=latency_batch_size)))
    with timer("latency_s"):
        latency = {"masked": measure_latency(model, lat_batch, latency_repeats)}
        gate.clear()
        latency["dense"] = measure_latency(model, lat_batch, latency_repeats)
    random_baseline = {}
    if plan.method == "random" and plan.schedule == "one_shot" and random_draws > 0:
        with timer("eval_s"):
            random_baseline = _random_baseline(model, plan, heads, loaders, pre_ft, loss_fn, random_draws)
    with timer("eval_s"):
        curve_rows = prune_curve(model, scores, curve_loaders, plan.scope, loss_fn) if curve else []
    dense_cost = {"params": count_parameters(model), "flops": forward_flops(model, seq_len),
                  "params_nonembedding": count_parameters(model, embeddings=False)}
    with timer("score_s"):  # FLAP's bias compensation reads the dense model's mean head outputs
        means = output_means(model, calib) if plan.compensates else None
    pruned = copy.deepcopy(model)
    if dense_teacher is model:  # distillation keeps the unpruned model as its teacher
        loss_fn.teacher = copy.deepcopy(model).eval()
    prune_compensated(pruned, keep, means)  # the masked model's loss is the ranking's; a compensated one differs
    with timer("latency_s"):
        latency["pruned"] = measure_latency(pruned, lat_batch, latency_repeats)
    with timer("eval_s"):
        # the physically pruned model before fine-tune (equal to the masked one unless compensated): on val when
        # fine-tuning follows, on every set when it does not
        after_prune = {s: evaluate_loss(pruned, l, loss_fn, per_window=not plan.finetune_steps)
                       for s, l in loaders.items() if plan.finetune_steps == 0 or s == "val"}
    train_loss = recovery_loss(recovery, model, distill) if plan.finetune_steps else None
    pruned, final, finetune_info = recover(pruned, data, plan, loaders, loss_fn, timer, progress, train_loss,
                                           data_start)
    if not plan.finetune_steps:
        final = after_prune
    windows["final"] = {s: split_windows(v) for s, v in final.items()}
    pruned_cost = {"params": count_parameters(pruned), "flops": forward_flops(pruned, seq_len)}
    timer.s["total_s"] = time.perf_counter() - t_start
    result = PruneResult(
        plan=plan.model_dump(mode="json"), heads_dense=heads, kept=keep,
        loss={"dense": dense, "pre_ft": pre_ft, "pruned_no_ft": after_prune, "final": final},
        finetune=finetune_info, recovery=recovery_record(recovery, distill),
        params={"dense": dense_cost["params"], "pruned": pruned_cost["params"]},
        params_nonembedding={"dense": dense_cost["params_nonembedding"],
                             "pruned": count_parameters(pruned, embeddings=False)},
        flops_per_token={"dense": dense_cost["flops"], "pruned": pruned_cost["flops"]}, **eval_record(pruned),
        latency_ms=latency, latency_batch=list(lat_batch["input_ids"].shape),
        scores=[[None if math.isnan(x) else x for x in row] for row in scores.tolist()], prune_curve=curve_rows,
        loss_kind="lm" if loss_fn.__class__.__name__ != "Distillation" else f"distill-{loss_fn.kind}",
        timing=timer.s, windows=windows, random_baseline=random_baseline, stability=stable)
    return pruned, scores, result


def _random_baseline(model, plan: PrunePlan, heads: list[int], loaders: dict, own: dict, loss_fn,
                     draws: int) -> dict:
    """{eval set: {"loss": mean masked loss over 1 + `draws` random choices, "draws": [each choice's loss, its own
    first]}} on the eval sets (not val).
    The extra choices are seeded apart from the trial's own (seed·1000 + k), the same for every run of a seed."""
    gate = head_gate(model)
    dev = next(model.parameters()).device
    sets = [s for s in loaders if s != "val"]
    losses = {s: [own[s]["loss"]] for s in sets}
    for k in range(1, draws + 1):
        scores = score_heads(model, [], "random", loss_fn=loss_fn, seed=plan.seed * 1000 + k)
        gate.mask(heads_to_keep(scores, heads, plan.ratio, plan.scope), device=dev)
        for s in sets:
            losses[s].append(evaluate_loss(model, loaders[s], loss_fn)["loss"])
    gate.clear()
    return {s: {"loss": statistics.fmean(v), "draws": v} for s, v in losses.items()}
