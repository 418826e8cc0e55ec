"""Prune heads: a plan (ratio, scope, schedule) → the heads to keep → a mask or physical removal, then optional
recovery fine-tuning, evaluation before and after on every eval set, the mask-only prune curve, parameter and
FLOP counts, and measured latency of the dense, masked and physically pruned models."""

from __future__ import annotations

import copy
import math
import statistics
import time
from collections.abc import Callable, Iterable

import torch
from torch import nn

from .compensate import output_means
from .config import HeadroomInputError, TrainConfig, kept_counts
from .distill import DistillSpec, recovery_loss, recovery_record
from .families import layer_heads, layer_shapes
from .heads import attention_modules, head_gate, keep_mask, prune_heads
from .lm import HeadroomLM, eval_record, evaluate
from .models import count_parameters
from .prune_plan import DEFAULT_CALIBRATION_BATCHES, PrunePlan, check_ratio_fits
from .scoring import LossFn, default_loss, ranked, score_heads
from .stability import split_half
from .train import TrainClock, build_trainer, fit

CURVE_RATIOS = tuple(round(0.1 * i, 1) for i in range(10))  # 0, 0.1, ..., 0.9


# --------------------------------------------------------------------------------------- choosing heads


def heads_to_keep(scores: torch.Tensor, heads: list[int], ratio: float, scope: str = "per_layer",
                  removed: torch.Tensor | None = None, clamp: bool = False) -> list[list[int]]:
    """The heads that stay when a fraction `ratio` of all heads goes, lowest scores first.

    per_layer: layer l loses round(ratio·n_l) heads (config.heads_kept). global: round(ratio·N) heads go
    wherever they score lowest, but never the last head of a layer. `removed` ([L, H] bool) marks heads already
    gone (iterative schedule): they go first. `clamp` keeps one head in a layer instead of raising (prune curve).
    Ties break by position, so the choice is deterministic."""
    L = len(heads)
    s = scores.clone().float()
    s[torch.isnan(s)] = float("inf")
    if removed is not None:
        s[removed.bool()] = float("-inf")
    if not clamp:
        check_ratio_fits(heads, ratio, scope)
    keep: list[list[int]] = []
    per_layer, total_kept = kept_counts(heads, ratio, scope)
    if scope == "per_layer":
        for l, (n, k) in enumerate(zip(heads, per_layer)):
            order = sorted(range(n), key=lambda h: (s[l, h].item(), h))
            keep.append(sorted(order[n - k:]))
        return keep
    n_remove = sum(heads) - total_kept
    order = sorted((s[l, h].item(), l, h) for l in range(L) for h in range(heads[l]))
    left = list(heads)
    gone = set()
    for _, l, h in order:
        if len(gone) == n_remove:
            break
        if left[l] > 1:
            gone.add((l, h))
            left[l] -= 1
    return [[h for h in range(heads[l]) if (l, h) not in gone] for l in range(L)]


def select_heads(model, calibration: Iterable[dict], plan: PrunePlan, loss_fn: LossFn | None = None,
                 on_score: Callable[[int, torch.Tensor], None] | None = None, **method_options):
    """Score and choose. one_shot: score once, keep the top heads. iterative: remove `plan.step` of the heads at a
    time (per layer or globally), re-scoring the masked model before each step (Michel et al. 2019, §4).

    Returns (keep lists, the scores of the first scoring pass)."""
    heads = layer_heads(model)
    batches = list(calibration)
    loss_fn = loss_fn or default_loss(model)
    opts = {"seed": plan.seed, **method_options}
    if plan.schedule == "one_shot" or plan.ratio == 0:
        scores = score_heads(model, batches, plan.method, loss_fn=loss_fn, **opts)
        if on_score:
            on_score(0, scores)
        return heads_to_keep(ranked(scores, plan.method, plan.scope), heads, plan.ratio, plan.scope), scores
    check_ratio_fits(heads, plan.ratio, plan.scope)
    removed = torch.zeros(len(heads), max(heads), dtype=torch.bool)
    first, r, i = None, 0.0, 0
    while r < plan.ratio - 1e-9:
        r = min(plan.ratio, r + plan.step)
        mask = (~removed).float()
        scores = score_heads(model, batches, plan.method, loss_fn=loss_fn, mask=mask, **opts)
        first = scores if first is None else first
        if on_score:
            on_score(i, scores)
        keep = heads_to_keep(ranked(scores, plan.method, plan.scope), heads, r, plan.scope, removed=removed)
        removed = keep_mask(keep, heads) == 0
        removed &= ~torch.isnan(scores)
        i += 1
    return keep, first


# ------------------------------------------------------------------------------------------- evaluation


@torch.no_grad()
def evaluate_loss(model, loader, loss_fn: LossFn | None = None, max_batches: int | None = None,
                  per_window: bool = False) -> dict:
    """Mean per-token loss (nats/token, or the distillation distance), its exponential and the token count."""
    return evaluate(model, loader, max_batches=max_batches, loss_fn=loss_fn, per_window=per_window)


def curve_points(heads: list[int], scope: str = "per_layer", nominal=CURVE_RATIOS) -> list[tuple[float, float]]:
    """The points of a mask-only prune curve as (ratio to ask `heads_to_keep` for, fraction of heads it removes).

    Heads are whole, so a nominal ratio removes what rounding lets it: with 8 heads per layer 0.2 and 0.3 both
    remove 2 (25%). Every nominal ratio is mapped to the fraction it achieves and duplicates are dropped, so a
    curve (and the prunable fraction read off it) is indexed by the fraction actually removed."""
    total = sum(heads)
    seen, out = set(), []
    for r in nominal:
        removed = total - kept_counts(heads, r, scope)[1]
        if removed in seen:
            continue
        seen.add(removed)
        out.append((r, removed / total))
    return out


def prune_curve(model, scores: torch.Tensor, loaders: dict, scope: str = "per_layer", loss_fn: LossFn | None = None,
                ratios=CURVE_RATIOS) -> list[dict]:
    """Mask-only curve: loss on every eval set at each achievable fraction of heads removed (`curve_points` of the
    nominal `ratios`), with the same ranking and no fine-tune (cheap: no re-scoring, no training). Each row's
    `ratio` is the fraction removed; `nominal` the ratio that produced it."""
    heads = layer_heads(model)
    gate = head_gate(model)
    out = []
    for r, fraction in curve_points(heads, scope, ratios):
        keep = heads_to_keep(scores, heads, r, scope, clamp=True)
        gate.mask(keep, device=next(model.parameters()).device)
        removed = 1 - sum(map(len, keep)) / sum(heads)
        assert abs(removed - fraction) < 1e-9, (removed, fraction)
        row = {"ratio": fraction, "nominal": r, "fraction_removed": fraction}
        for name, loader in loaders.items():
            row[name] = evaluate_loss(model, loader, loss_fn)["loss"]
        out.append(row)
    gate.clear()
    return out


# ----------------------------------------------------------------------------------------------- costs


def forward_flops(model, seq_len: int) -> dict:
    """Forward matmul FLOPs per token of a loaded model, from its actual modules: 2·(in·out) of every linear
    layer (LM head included, embedding lookups not) + attention scores 2·2·T·H·d per layer."""
    from transformers.pytorch_utils import Conv1D  # GPT-2's linear layer

    attn_mods = {id(m) for a in attention_modules(model) for m in a.modules()}
    attn = mlp_other = 0
    for m in model.modules():
        if isinstance(m, nn.Linear):
            f = 2 * m.in_features * m.out_features
        elif isinstance(m, Conv1D):
            f = 2 * m.weight.shape[0] * m.weight.shape[1]
        else:
            continue
        if id(m) in attn_mods:
            attn += f
        else:
            mlp_other += f
    scores = sum(2 * 2 * seq_len * n * hd for n, _, hd in layer_shapes(model))
    return {"attention": attn + scores, "other": mlp_other, "total": attn + scores + mlp_other}


@torch.no_grad()
def measure_latency(model, batch: dict, repeats: int = 20, warmup: int = 3) -> float:
    """Median wall time (ms) of a forward pass on `batch`, warm-up passes excluded."""
    dev = next(model.parameters()).device
    ids = batch["input_ids"].to(dev)
    was = model.training
    model.eval()

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    times = []
    for i in range(warmup + repeats):
        sync()
        t = time.perf_counter()
        model(input_ids=ids)
        sync()
        if i >= warmup:
            times.append((time.perf_counter() - t) * 1000)
    model.train(was)
    return statistics.median(times)


# ------------------------------------------------------------------------------------------ fine-tuning


def finetune(model, data, steps: int, lr: float, base: TrainConfig, loss_fn: LossFn | None = None,
             progress: bool = False, clock=None, train_loss: LossFn | None = None, start: int | None = None):
    """Recovery fine-tune of a (physically pruned) model for `steps` steps with the LightningModule, minimising
    `train_loss` (default: `loss_fn`, the LM loss; distillation: lightning_modules/distill.py). Its data continues
    the dense run's seeded order where that run's training stopped (`base`: the dense run's training config, T
    steps of its batch size): the first fine-tune batch is the one the dense run would have taken at step T + 1,
    the samples Scratch-B's steps past T read. `start` overrides that position (`headroom prune` with another batch
    size than the run's: T × the run's own batch size). `clock` (a train.TrainClock) adds up the seconds inside
    training steps."""
    if steps <= 0:
        return model
    cfg = base.model_copy(update={"steps": steps, "lr": lr, "warmup_steps": min(base.warmup_steps, steps // 10),
                                  "val_every": steps})
    model.train()
    lm = HeadroomLM.from_model(model, cfg, loss_fn=loss_fn, train_loss_fn=train_loss)
    fit(build_trainer(cfg, None, progress=progress, callbacks=[clock] if clock is not None else ()), lm,
        datamodule=data.with_train(cfg, start=base.steps * base.batch_size if start is None else start))
    return lm.model.eval()


def recover(pruned, data, plan: PrunePlan, loaders: dict, loss_fn, timer: WorkTimer, progress: bool = False,
            train_loss: LossFn | None = None, start: int | None = None):
    """The recovery fine-tune of `plan` (none when finetune_steps is 0): each rate of the plan fine-tunes a copy,
    minimising `train_loss` (default: `loss_fn`), and the lowest validation loss — `loss_fn`, the LM loss, also
    after distillation — wins (chosen on val, never on an eval set). Returns (model, {split: evaluation after it,
    per window} or {} without a fine-tune, {"lr", "source", "grid"})."""
    if not plan.finetune_steps:
        return pruned, {}, {"lr": None, "source": "none", "grid": {}}
    clock = TrainClock()
    grid, val_of, finetuned = {}, {}, {}

    def tune(lr):
        candidate = finetune(copy.deepcopy(pruned), data, plan.finetune_steps, lr, data.train_cfg, loss_fn, progress,
                             clock, train_loss, start)
        timer.s["train_s"] += clock.seconds
        clock.seconds = 0.0
        with timer("eval_s"):
            val_of[lr] = evaluate_loss(candidate, loaders["val"], loss_fn, per_window=True)
        grid[lr] = val_of[lr]["loss"]
        finetuned[lr] = candidate

    for lr in plan.finetune_lrs:
        tune(lr)
    best = min(grid, key=lambda lr: (grid[lr], lr))
    rates = sorted(plan.finetune_lrs)
    step = (rates[-1] / rates[0]) ** (1 / (len(rates) - 1)) if len(rates) > 1 else 1.0
    for _ in range(plan.finetune_lr_extend if step > 1 else 0):  # bracket the chosen rate (one step past an edge)
        tried = sorted(grid)
        if tried[0] < best < tried[-1]:
            break
        tune(best * step if best == tried[-1] else best / step)
        best = min(grid, key=lambda lr: (grid[lr], lr))
        for lr in [lr for lr in finetuned if lr != best]:
            del finetuned[lr]  # one candidate model kept besides the best
    best = min(grid, key=lambda lr: (grid[lr], lr))
    with timer("eval_s"):  # val: measured already, when the rate was chosen
        final = {s: val_of[best] if s == "val" else evaluate_loss(finetuned[best], l, loss_fn, per_window=True)
                 for s, l in loaders.items()}
    info = {"lr": best, "source": "fixed" if plan.finetune_lr is not None else "val-grid",
            "grid": {f"{lr:.6g}": v for lr, v in grid.items()}}
    return finetuned[best], final, info


class WorkTimer:
    """Seconds per kind of work: what a trial spends in scoring (and re-scoring halves), evaluation and training."""

    def __init__(self):
        self.s: dict[str, float] = dict.fromkeys(("score_s", "stability_s", "eval_s", "train_s", "latency_s"), 0.0)

    def __call__(self, kind: str):
        timer = self

        class _Span:
            def __enter__(self):
                self.t = time.perf_counter()

            def __exit__(self, *exc):
                timer.s[kind] += time.perf_counter() - self.t

        return _Span()


def split_windows(result: dict) -> dict:
    """Pop the per-window arrays of an evaluate(per_window=True) result (they travel apart from the metrics)."""
    return {"loss": result.pop("window_loss"), "tokens": result.pop("window_tokens")}


# --------------------------------------------------------------------------------------------- the run

RANDOM_DRAWS = 4  # extra random choices a `random` prune evaluates besides its own


def run_prune(model, data, plan: PrunePlan, *, eval_batches: int | None = None, calibration_batches: int = DEFAULT_CALIBRATION_BATCHES,
              curve_batches: int | None = None, loss_fn: LossFn | None = None, latency_batch_size: int = 16,
              latency_repeats: int = 20, curve: bool = True, progress: bool = False,
              method_options: dict | None = None, dense_eval: dict | None = None, random_draws: int = RANDOM_DRAWS,
              recovery: str = "lm", distill: DistillSpec | None = None, data_start: int | None = None):
    """The whole prune stage on one model: score on calibration, choose, evaluate masked (before fine-tune),
    remove physically, fine-tune (choosing its rate on val when the plan gives a grid), evaluate again, count and
    time. Returns (pruned model, scores, metrics).

    eval_batches None evaluates every clean window of each split (up to the stated cap); `curve_batches` bounds
    the mask-only curve's evaluation (default: the same). `dense_eval` ({split: evaluate() result}) is the dense
    model's evaluation on exactly these windows when the caller has it already (a sweep's train trial measured
    it); otherwise it is measured here. metrics["windows"] holds per-window losses before and after fine-tune.
    `recovery` "distill" fine-tunes on the KL divergence to this (unpruned, frozen) model's logits, as `distill`
    says (lightning_modules/distill.py); the losses reported stay LM losses."""
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
    prune_heads(pruned, keep, means)  # the masked model's loss is the ranking's; a compensated one differs
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
    metrics = {
        "plan": plan.model_dump(mode="json"),
        "heads_dense": heads,
        "heads_kept": [len(k) for k in keep],
        "kept": keep,
        "loss": {"dense": dense, "pre_ft": pre_ft, "pruned_no_ft": after_prune, "final": final},
        "finetune": finetune_info,
        "recovery": recovery_record(recovery, distill),
        "params": {"dense": dense_cost["params"], "pruned": pruned_cost["params"]},
        "params_nonembedding": {"dense": dense_cost["params_nonembedding"],
                                "pruned": count_parameters(pruned, embeddings=False)},
        "flops_per_token": {"dense": dense_cost["flops"], "pruned": pruned_cost["flops"]},
        **eval_record(pruned),
        "latency_ms": latency,
        "latency_batch": list(lat_batch["input_ids"].shape),
        "scores": [[None if math.isnan(x) else x for x in row] for row in scores.tolist()],
        "prune_curve": curve_rows,
        "loss_kind": "lm" if loss_fn.__class__.__name__ != "Distillation" else f"distill-{loss_fn.kind}",
        "timing": timer.s,
        "windows": windows,
        "random_baseline": random_baseline,
        "stability": stable,
    }
    return pruned, scores, metrics


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
