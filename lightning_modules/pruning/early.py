"""Pruning during training (prune timing): remove heads from a dense run's checkpoint at step s = p·T, then train
the pruned model on to T exactly as the dense run went on: its schedule position, its data order, its AdamW moments
for the kept parameters (sliced like the weights). Then the usual recovery fine-tune.

p = 0 prunes at initialisation, by the scores of the initial model. With every head kept the continued run is the
dense run itself (tests/test_early.py checks it to the last weight): what differs at p < 1 is only the heads.
"""

from __future__ import annotations

import copy
import os
import tempfile
import time
from pathlib import Path

import torch

from lightning_modules.declarations.config import HeadroomInputError
from lightning_modules.declarations.prune_plan import PruneJob
from lightning_modules.models.build import count_parameters
from lightning_modules.models.families import layer_heads
from lightning_modules.models.heads import prune_heads
from lightning_modules.pruning.choose import select_heads
from lightning_modules.pruning.measure import WorkTimer, evaluate_loss, forward_flops, split_windows
from lightning_modules.pruning.recover import recover
from lightning_modules.pruning.result import PruneResult
from lightning_modules.pruning.scoring import LossFn, default_loss
from lightning_modules.training.distill import recovery_loss, recovery_record
from lightning_modules.training.lm import HeadroomLM, eval_record, load_lm, optimizer_params
from lightning_modules.training.loop import TrainClock, build_trainer, fit


def _order(model) -> list[str]:
    decay, no_decay = optimizer_params(model)
    return [n for n, _ in decay] + [n for n, _ in no_decay]


def sliced_optimizer_state(model, keep: list[list[int]], state: dict) -> dict:
    """AdamW's state of `model` (torch's `state_dict()` of the optimizer make_optimizer built for it) for the model
    pruned to `keep`: every per-parameter moment cut exactly as prune_heads cuts that parameter, by pruning a copy
    of the model whose parameters hold the moments. Step counts and hyper-parameters are unchanged."""
    names = _order(model)
    per = state["state"]
    moments = sorted({k for s in per.values() for k, v in s.items() if torch.is_tensor(v) and v.dim() > 0})
    out = {i: {k: v for k, v in s.items() if k not in moments} for i, s in per.items()}
    for key in moments:
        shadow = copy.deepcopy(model)
        params = dict(shadow.named_parameters())
        with torch.no_grad():
            for i, name in enumerate(names):
                if key in per.get(i, {}):
                    params[name].copy_(per[i][key])
        prune_heads(shadow, keep)
        if _order(shadow) != names:
            raise RuntimeError("pruning changed the model's parameters, not only their shapes")
        new = dict(shadow.named_parameters())
        for i, name in enumerate(names):
            if key in per.get(i, {}):
                out[i][key] = new[name].detach().clone()
    return {"state": out, "param_groups": copy.deepcopy(state["param_groups"])}


def pruned_checkpoint(raw: dict, model, keep: list[list[int]]):
    """(the pruned model, the Lightning checkpoint that continues the run from it): `raw` (a checkpoint of
    HeadroomLM over `model`) with the pruned weights and optimizer state; schedule, step, data position kept."""
    pruned = prune_heads(copy.deepcopy(model), keep)
    ck = {k: v for k, v in raw.items() if k != "callbacks"}  # this process's callbacks start afresh
    ck["state_dict"] = {f"model.{k}": v for k, v in pruned.state_dict().items()}
    ck["optimizer_states"] = [sliced_optimizer_state(model, keep, s) for s in raw["optimizer_states"]]
    return pruned, ck


def prune_and_continue(snapshot: str | os.PathLike, data, job: PruneJob, *, loss_fn: LossFn | None = None,
                       dense_eval: dict | None = None, progress: bool = False, teacher=None):
    """The prune stage started at a dense run's snapshot (`Snapshots` of training/loop.py): score its model on calibration,
    remove heads, train on to the run's T steps (same schedule, data, moments), evaluate (`pre_ft`: the pruned
    model at T before the recovery fine-tune), recover, evaluate again. `data` is the dense run's data module.
    Returns (pruned model, scores, its PruneResult) as run_prune does; `dense_eval` is the dense model's evaluation at
    T on the same windows (the sweep's train trial measured it). A job's recovery "distill" fine-tunes towards
    `teacher`, the dense run's model at T (the one a prune at p = 1 distils from). The job's curve and latency
    settings do not apply: a prune during training draws no curve and times nothing."""
    plan, recovery, distill = job.plan, job.recovery, job.distill
    t_start = time.perf_counter()
    timer = WorkTimer()
    if not Path(snapshot).is_file():
        raise HeadroomInputError(f"no checkpoint at {snapshot}: the dense run did not keep this step")
    raw = torch.load(str(snapshot), map_location="cpu", weights_only=False)
    lm = load_lm(str(snapshot))
    model, train_cfg = lm.model.eval(), lm.train_cfg
    step = int(raw.get("global_step", 0))
    loss_fn = loss_fn or default_loss(model)
    heads = layer_heads(model)
    sets = ["val", *data.eval_sets]
    loaders = {s: data.loader(s, job.eval_batches) for s in sets}
    calib = list(data.loader("calibration", job.data.calibration_batches))
    seq_len = calib[0]["input_ids"].shape[1]
    with timer("score_s"):
        keep, scores = select_heads(model, calib, plan, loss_fn=loss_fn)
    dense_cost = {"params": count_parameters(model), "flops": forward_flops(model, seq_len),
                  "params_nonembedding": count_parameters(model, embeddings=False)}
    pruned, ck = pruned_checkpoint(raw, model, keep)
    clock = TrainClock()
    continued = HeadroomLM.from_model(pruned.train(), train_cfg, loss_fn=loss_fn)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "continue.ckpt"
        torch.save(ck, path)
        trainer = build_trainer(train_cfg, None, callbacks=[clock], progress=progress)
        fit(trainer, continued, datamodule=data, ckpt_path=str(path))
    if trainer.interrupted:
        raise KeyboardInterrupt
    timer.s["train_s"] += clock.seconds
    timer.s["eval_s"] += clock.val_seconds
    pruned = continued.model.eval()
    with timer("eval_s"):
        pre_ft = {s: evaluate_loss(pruned, l, loss_fn, per_window=True) for s, l in loaders.items()}
        dense = ({s: {k: dense_eval[s][k] for k in ("loss", "ppl", "tokens")} for s in sets}
                 if dense_eval is not None and all(s in dense_eval for s in sets) else {})
    windows = {"pre_ft": {s: split_windows(v) for s, v in pre_ft.items()}}
    train_loss = recovery_loss(recovery, teacher, distill) if plan.finetune_steps else None
    pruned, final, finetune_info = recover(pruned, data, plan, loaders, loss_fn, timer, progress, train_loss)
    windows["final"] = {s: split_windows(v) for s, v in final.items()} if final else windows["pre_ft"]
    final = final or pre_ft
    timer.s["total_s"] = time.perf_counter() - t_start
    result = PruneResult(
        plan=plan.model_dump(mode="json"), heads_dense=heads, kept=keep,
        loss={"dense": dense, "pre_ft": pre_ft, "pruned_no_ft": {}, "final": final},
        finetune=finetune_info, recovery=recovery_record(recovery, distill),
        params={"dense": dense_cost["params"], "pruned": count_parameters(pruned)},
        params_nonembedding={"dense": dense_cost["params_nonembedding"],
                             "pruned": count_parameters(pruned, embeddings=False)},
        flops_per_token={"dense": dense_cost["flops"], "pruned": forward_flops(pruned, seq_len)},
        **eval_record(pruned), scores=[[None if x != x else x for x in row] for row in scores.tolist()],
        loss_kind="lm", timing=timer.s, windows=windows, prune_step=step,
        continued_steps=int(trainer.global_step) - step)
    return pruned, scores, result
