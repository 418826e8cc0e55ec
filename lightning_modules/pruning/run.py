"""Prune heads: a PruneJob (which heads go, how the model recovers, what it reads) → score → mask and evaluate →
remove → recover → measure: evaluation before and after on every eval set, the mask-only prune curve, parameter
and FLOP counts, and measured latency of the dense, masked and physically pruned models."""

from __future__ import annotations

import copy
import math
import statistics
import time
from dataclasses import dataclass

from lightning_modules.declarations.config import HeadroomInputError
from lightning_modules.declarations.prune_plan import PruneJob, PrunePlan
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
from lightning_modules.training.distill import recovery_loss, recovery_record
from lightning_modules.training.lm import eval_record


@dataclass
class _Prune:
    """What every step of one prune reads: the dense model, its data and job, the loss, the loaders of every
    split (val chooses, the eval sets report), the calibration batches and the work timer."""

    model: object
    data: object
    job: PruneJob
    loss_fn: LossFn
    loaders: dict
    curve_loaders: dict
    calib: list
    timer: WorkTimer
    heads: list[int]

    @property
    def plan(self) -> PrunePlan:
        return self.job.plan

    @property
    def seq_len(self) -> int:
        return self.calib[0]["input_ids"].shape[1]


def run_prune(model, data, job: PruneJob, *, loss_fn: LossFn | None = None, dense_eval: dict | None = None,
              progress: bool = False, method_options: dict | None = None, data_start: int | None = None):
    """The whole prune stage on one model, as its steps: score the heads on calibration, mask them and evaluate
    (before fine-tune), remove them, recover (choosing the rate on val when the plan gives a grid), measure
    (parameters, FLOPs, latency). Returns (pruned model, scores, its PruneResult).

    `dense_eval` ({split: evaluate() result}) is the dense model's evaluation on exactly these windows when the
    caller has it already (a sweep's train trial measured it); otherwise it is measured here. The result's
    windows hold per-window losses before and after fine-tune. A job's recovery "distill" fine-tunes on the KL
    divergence to this (unpruned, frozen) model's logits, as its `distill` says (lightning_modules/training/
    distill.py); the losses reported stay LM losses. `data_start`: where in the training stream the fine-tune
    continues (a trained run's own order)."""
    t_start = time.perf_counter()
    p = _setup(model, data, job, loss_fn)
    dense = _dense_losses(p, dense_eval)
    keep, scores, stable = _score(p, method_options)
    pre_ft, latency, random_baseline, curve_rows = _mask_and_evaluate(p, keep, scores)
    dense_cost = {"params": count_parameters(model), "flops": forward_flops(model, p.seq_len),
                  "params_nonembedding": count_parameters(model, embeddings=False)}
    pruned, after_prune = _remove(p, keep, latency)
    pruned, final, finetune_info = _recover(p, pruned, after_prune, progress, data_start)
    p.timer.s["total_s"] = time.perf_counter() - t_start
    result = _measure(p, pruned, keep, scores, dense_cost, latency,
                      {"dense": dense, "pre_ft": pre_ft, "pruned_no_ft": after_prune, "final": final},
                      finetune_info, curve_rows, random_baseline, stable)
    return pruned, scores, result


def _setup(model, data, job: PruneJob, loss_fn: LossFn | None) -> _Prune:
    model.eval()
    sets = ["val", *data.eval_sets]
    loaders = {s: data.loader(s, job.eval_batches) for s in sets}
    # the mask-only curve is read on the eval sets (the validation split chooses, it does not report)
    curve_sets = [s for s in sets if s != "val"] or sets
    curve_batches = job.data.curve_batches
    curve_loaders = {s: loaders[s] if curve_batches is None else data.loader(s, curve_batches) for s in curve_sets}
    calib = list(data.loader("calibration", job.data.calibration_batches))
    if len(calib) == 0 or calib[0]["input_ids"].shape[0] < data.train_cfg.batch_size:
        raise HeadroomInputError("calibration split is shorter than one batch")
    return _Prune(model, data, job, loss_fn or default_loss(model), loaders, curve_loaders, calib, WorkTimer(),
                  layer_heads(model))


def _dense_losses(p: _Prune, dense_eval: dict | None) -> dict:
    """The dense model on every split: the caller's measurement when it has every split, else measured."""
    with p.timer("eval_s"):
        if dense_eval is not None and all(s in dense_eval for s in p.loaders):
            return {s: {k: dense_eval[s][k] for k in ("loss", "ppl", "tokens")} for s in p.loaders}
        return {s: evaluate_loss(p.model, ld, p.loss_fn) for s, ld in p.loaders.items()}


def _score(p: _Prune, method_options: dict | None):
    """The heads to keep and every head's score; and, as information (not the choice), how far each half of the
    calibration data agrees."""
    with p.timer("score_s"):
        keep, scores = select_heads(p.model, p.calib, p.plan, loss_fn=p.loss_fn, **(method_options or {}))
    with p.timer("stability_s"):
        stable = split_half(p.model, p.calib, p.plan.method, p.plan.scope, p.plan.ratio, p.loss_fn,
                            **{"seed": p.plan.seed, **(method_options or {})})
    return keep, scores, stable


def _mask_and_evaluate(p: _Prune, keep, scores):
    """The masked model (the heads' choice alone) on every split, per window; the latency of the masked and the
    dense model; a `random` prune's extra draws; the mask-only prune curve."""
    model, timer = p.model, p.timer
    gate = head_gate(model)
    gate.mask(keep, device=next(model.parameters()).device)
    with timer("eval_s"):
        pre_ft = {s: evaluate_loss(model, ld, p.loss_fn, per_window=True) for s, ld in p.loaders.items()}
    lat_batch = next(iter(p.data.loader("val", 1, batch_size=p.job.latency_batch_size)))
    with timer("latency_s"):
        latency = {"masked": measure_latency(model, lat_batch, p.job.latency_repeats)}
        gate.clear()
        latency["dense"] = measure_latency(model, lat_batch, p.job.latency_repeats)
    latency["batch"] = lat_batch
    random_baseline = {}
    if p.plan.method == "random" and p.plan.schedule == "one_shot" and p.job.random_draws > 0:
        with timer("eval_s"):
            random_baseline = _random_baseline(model, p.plan, p.heads, p.loaders, pre_ft, p.loss_fn,
                                               p.job.random_draws)
    with timer("eval_s"):
        curve_rows = prune_curve(model, scores, p.curve_loaders, p.plan.scope, p.loss_fn) if p.job.data.curve else []
    return pre_ft, latency, random_baseline, curve_rows


def _remove(p: _Prune, keep, latency: dict):
    """A copy of the dense model with the heads removed (FLAP's bias compensation when the plan compensates: the
    dense model's mean head outputs into the bias), its latency, and its losses before fine-tune — on val when
    fine-tuning follows, on every split when it does not (equal to the masked model's unless compensated)."""
    plan, timer = p.plan, p.timer
    with timer("score_s"):
        means = output_means(p.model, p.calib) if plan.compensates else None
    pruned = copy.deepcopy(p.model)
    if getattr(p.loss_fn, "teacher", None) is p.model:  # distillation keeps the unpruned model as its teacher
        p.loss_fn.teacher = copy.deepcopy(p.model).eval()
    prune_compensated(pruned, keep, means)
    with timer("latency_s"):
        latency["pruned"] = measure_latency(pruned, latency["batch"], p.job.latency_repeats)
    with timer("eval_s"):
        after_prune = {s: evaluate_loss(pruned, ld, p.loss_fn, per_window=not plan.finetune_steps)
                       for s, ld in p.loaders.items() if plan.finetune_steps == 0 or s == "val"}
    return pruned, after_prune


def _recover(p: _Prune, pruned, after_prune: dict, progress: bool, data_start: int | None):
    """The recovery fine-tune (none when F = 0: the removed model's losses are final)."""
    plan = p.plan
    train_loss = recovery_loss(p.job.recovery, p.model, p.job.distill) if plan.finetune_steps else None
    pruned, final, finetune_info = recover(pruned, p.data, plan, p.loaders, p.loss_fn, p.timer, progress,
                                           train_loss, data_start)
    return pruned, (final if plan.finetune_steps else after_prune), finetune_info


def _measure(p: _Prune, pruned, keep, scores, dense_cost: dict, latency: dict, loss: dict, finetune_info,
             curve_rows, random_baseline, stable) -> PruneResult:
    """The result: losses, per-window losses, parameters and FLOPs of both models, latency, scores and timings."""
    lat_batch = latency.pop("batch")
    windows = {"pre_ft": {s: split_windows(v) for s, v in loss["pre_ft"].items()},
               "final": {s: split_windows(v) for s, v in loss["final"].items()}}
    pruned_cost = {"params": count_parameters(pruned), "flops": forward_flops(pruned, p.seq_len)}
    return PruneResult(
        plan=p.plan.model_dump(mode="json"), heads_dense=p.heads, kept=keep, loss=loss,
        finetune=finetune_info, recovery=recovery_record(p.job.recovery, p.job.distill),
        params={"dense": dense_cost["params"], "pruned": pruned_cost["params"]},
        params_nonembedding={"dense": dense_cost["params_nonembedding"],
                             "pruned": count_parameters(pruned, embeddings=False)},
        flops_per_token={"dense": dense_cost["flops"], "pruned": pruned_cost["flops"]}, **eval_record(pruned),
        latency_ms=latency, latency_batch=list(lat_batch["input_ids"].shape),
        scores=[[None if math.isnan(x) else x for x in row] for row in scores.tolist()], prune_curve=curve_rows,
        loss_kind="lm" if p.loss_fn.__class__.__name__ != "Distillation" else f"distill-{p.loss_fn.kind}",
        timing=p.timer.s, windows=windows, random_baseline=random_baseline, stability=stable)


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
