"""`headroom train`, `headroom score` and `headroom prune`: one model at a time, outside any sweep. Input is
validated before torch is imported; an output directory appears only when its run is complete."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

from lightning_modules.data.corpus import check_source
from lightning_modules.declarations.config import (
    DataConfig,
    HeadroomInputError,
    TrainConfig,
    check_compatible,
    first_error,
    model_config_for,
    train_config_for,
)
from lightning_modules.declarations.methods import METHODS
from lightning_modules.declarations.prune_plan import PruneData, PruneJob, PrunePlan, check_ratio_fits
from lightning_modules.models.checkpoints import METRICS_FILE, checkpoint_info
from orchestration.report.plots import heatmap
from orchestration.running.artifacts import RUN_ARTIFACTS, write_prune
from orchestration.running.frameworks import quiet_frameworks

from .paths import check_writable, made_parents


def _check_out(out: str) -> Path:
    p = check_writable(out)
    if p.exists() and any(p.iterdir()):
        raise HeadroomInputError(f"--out {out}: exists and is not empty; choose a new directory")
    return p


# the TrainConfig fields `headroom train` sets from flags (--batch-size for batch_size), with their help; the type,
# the choices and whether a number must be positive come from the field itself
TRAIN_FLAGS = {"steps": None, "batch_size": None, "seq_len": None, "lr": None, "warmup_steps": None,
               "schedule": None, "weight_decay": None, "precision": None, "val_every": None,
               "eval_batches": "batches of each eval set at the end (default: every window of it, up to 2^20 tokens)"}


def cmd_train(args) -> int:
    # ---- validate everything first (no torch yet)
    model_cfg = model_config_for(args.scale, args.family, n_heads=args.heads, head_dim=args.head_dim)
    train_cfg = train_config_for(args.scale, seed=args.seed, **{f: getattr(args, f) for f in TRAIN_FLAGS})
    check_compatible(model_cfg, train_cfg)
    if train_cfg.batch_size % args.workers:
        raise HeadroomInputError(f"--workers: batch size {train_cfg.batch_size} is not divisible by {args.workers} "
                                 "workers (each takes an equal share of every batch)")
    try:
        data_cfg = DataConfig(source=args.data, shift=args.shift, tokenizer=args.tokenizer)
    except ValueError as e:
        raise HeadroomInputError(f"--data: {first_error(e)}") from None
    check_source(data_cfg)
    out = _check_out(args.out)

    # ---- now the frameworks
    quiet_frameworks()
    from lightning_modules.training.loop import set_threads, train_lm, write_run

    set_threads()
    staging = out.parent / f".{out.name}.partial-{os.getpid()}"
    try:
        if args.workers > 1:
            m = _train_data_parallel(args.workers, model_cfg, train_cfg, data_cfg, staging, not args.quiet,
                                     args.compile)
        else:
            result = train_lm(model_cfg, train_cfg, data_cfg, checkpoint_dir=staging / "checkpoints",
                              progress=not args.quiet, compile=args.compile)
            write_run(result, staging, staging / "checkpoints" / "last.ckpt")
            m = result.metrics
        for scratch in ("checkpoints", "ray"):
            shutil.rmtree(staging / scratch, ignore_errors=True)
        if out.exists():
            out.rmdir()
        os.replace(staging, out)  # complete or absent: never a half-written run under the name asked for
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    finals = ", ".join(f"{k} {v['loss']:.4f}" for k, v in m["final"].items())
    par = f" on {args.workers} data-parallel workers" if args.workers > 1 else ""
    print(f"trained {model_cfg.family} scale {args.scale}, {model_cfg.layer_heads[0]} heads x {model_cfg.head_dim}:"
          f" {m['params']:,} params, {m['steps']} steps{par}, {m['tokens_per_s']:,.0f} tokens/s; loss {finals}")
    print(f"wrote {out}/ (model/, last.ckpt, metrics.json)")
    return 0


def _train_data_parallel(workers: int, model_cfg, train_cfg, data_cfg, staging: Path, progress: bool,
                         compile: bool = False) -> dict:
    """`headroom train --workers W`: the run trained by W Ray Train workers on a local Ray (one CPU each, or
    one GPU each where there are GPUs); rank 0 writes it into `staging`. Returns its metrics."""
    import ray
    import torch

    from orchestration.running.ddp import fit

    gpu = 1 if torch.cuda.device_count() >= workers else 0
    ray.init(address="local", num_cpus=max(workers, os.cpu_count() or 1), logging_level="ERROR",
             include_dashboard=False, log_to_driver=progress)
    try:
        fit(_train_worker, {"model": model_cfg.model_dump(mode="json"), "train": train_cfg.model_dump(mode="json"),
                            "data": data_cfg.model_dump(mode="json"), "out": str(staging.resolve()), "progress": progress,
                            "compile": compile},
            workers=workers, cpu=1, gpu=gpu, storage=str((staging / "ray").resolve()), name="train", retries=0,
            in_tune=False)
    finally:
        ray.shutdown()
    return json.loads((staging / METRICS_FILE).read_text())


def _train_worker(config: dict) -> None:
    """One rank of `headroom train --workers W`."""
    from lightning_modules.declarations.config import ModelConfig
    from lightning_modules.training.loop import train_lm, write_run
    from orchestration.running.ddp import Session, lightning_ddp, worker_setup

    quiet_frameworks()
    worker_setup()
    rank = Session(train=True).rank
    out = Path(config["out"])
    result = train_lm(ModelConfig(**config["model"]), TrainConfig(**config["train"]), DataConfig(**config["data"]),
                      checkpoint_dir=out / "checkpoints", progress=config["progress"] and rank == 0,
                      final_eval=rank == 0, distributed=lightning_ddp(), compile=config["compile"])
    if rank == 0:
        write_run(result, out, out / "checkpoints" / "last.ckpt")


def _checkpoint_setup(args):
    """Everything `score` and `prune` need, validated without torch: (checkpoint info, data config, train config,
    data family)."""
    if args.method not in METHODS:
        raise HeadroomInputError(f"--method: unknown method {args.method!r}; choose one of {', '.join(METHODS)}")
    info = checkpoint_info(args.checkpoint)
    run = info.run or {}
    data_kw = dict(run.get("data_config") or {})
    if args.data:
        data_kw = {"source": args.data}
    if args.shift:
        data_kw["shift"] = args.shift
    if args.tokenizer:
        data_kw["tokenizer"] = args.tokenizer
    elif not run or (data_kw.get("tokenizer") == "bpe" and info.has_tokenizer):
        # a checkpoint's own tokenizer; a run's BPE tokenizer was saved beside its model, so it is not retrained
        data_kw["tokenizer"] = f"pretrained:{info.model_dir}" if info.has_tokenizer else "byte"
    try:
        data_cfg = DataConfig(**data_kw)
    except ValueError as e:
        raise HeadroomInputError(f"--data: {first_error(e)}") from None
    check_source(data_cfg)
    if run.get("train_config"):
        try:  # the run's own record, before any flag overrides it (prune's fine-tune continues its data order)
            TrainConfig(**run["train_config"])
        except ValueError as e:
            raise HeadroomInputError(f"checkpoint {args.checkpoint}: {METRICS_FILE}'s train_config: "
                                     f"{first_error(e)}") from None
    base = dict(run.get("train_config") or {"steps": 1})
    seq_default = min(128, info.max_positions or 128)
    # the run's own seed (its data order, which the recovery fine-tune continues) unless --seed says otherwise
    base.update(seq_len=args.seq_len or base.get("seq_len", seq_default),
                seed=args.seed if args.seed is not None else base.get("seed", 0),
                batch_size=args.batch_size or base.get("batch_size", 16))
    try:
        train_cfg = TrainConfig(**base)
    except ValueError as e:
        raise HeadroomInputError(first_error(e)) from None
    if info.max_positions and train_cfg.seq_len > info.max_positions:
        raise HeadroomInputError(f"seq_len {train_cfg.seq_len} exceeds the model's maximum {info.max_positions}")
    return info, data_cfg, train_cfg, info.family


def _load_for_scoring(info, data_cfg, train_cfg, family, calibration_batches):
    from lightning_modules.data.datamodule import HeadroomData
    from lightning_modules.models.build import load_model

    model = load_model(info.model_dir)
    data = HeadroomData(data_cfg, train_cfg, family).prepare()
    if data.vocab_size > model.config.vocab_size:
        raise HeadroomInputError(
            f"tokenizer has {data.vocab_size} tokens, the model's vocabulary {model.config.vocab_size}")
    calib = list(data.loader("calibration", calibration_batches))
    if not calib or calib[0]["input_ids"].shape[0] < train_cfg.batch_size:
        raise HeadroomInputError(
            f"calibration data is shorter than one batch ({train_cfg.batch_size} windows of {train_cfg.seq_len})")
    return model, data, calib


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def cmd_score(args) -> int:
    info, data_cfg, train_cfg, family = _checkpoint_setup(args)
    out = check_writable(args.out, kind="file")
    if not out.parent.is_dir():
        raise HeadroomInputError(f"--out {args.out}: directory {out.parent} does not exist")
    png = out.with_suffix(".png")  # the heatmap, beside the scores
    if png == out:
        raise HeadroomInputError(f"--out {args.out}: the scores' heatmap is written to {png.name}; name the scores "
                                 "file with another suffix (scores.json)")
    check_writable(str(png), "--out (its heatmap)", kind="file")
    quiet_frameworks()
    from lightning_modules.pruning.scoring import score_heads
    from lightning_modules.training.loop import set_threads

    set_threads()
    model, data, calib = _load_for_scoring(info, data_cfg, train_cfg, family, args.calibration_batches)
    scores = score_heads(model, calib, args.method, seed=train_cfg.seed)
    rows = [[None if math.isnan(x) else x for x in r] for r in scores.tolist()]
    heatmap(rows, png, f"{args.method} importance — {Path(args.checkpoint).name}")
    _atomic_write(out, json.dumps({"method": args.method, "checkpoint": str(args.checkpoint),
                                   "layer_heads": info.layer_heads, "corpus_hash": data.corpus_hash,
                                   "tokenizer": data.tokenizer.name,
                                   "calibration": {"batches": len(calib), "batch_size": train_cfg.batch_size,
                                                   "seq_len": train_cfg.seq_len},
                                   "scores": rows}, indent=2) + "\n")
    print(f"wrote {out} and {png}")
    return 0


def cmd_prune(args) -> int:
    info, data_cfg, train_cfg, family = _checkpoint_setup(args)
    try:
        plan = PrunePlan(method=args.method, ratio=args.ratio, scope=args.scope,
                         schedule="iterative" if args.iterative else "one_shot", step=args.iterative or 0.1,
                         finetune_steps=args.finetune_steps, finetune_lr=args.finetune_lr, seed=train_cfg.seed,
                         bias_compensation=args.bias_compensation)
    except ValueError as e:
        raise HeadroomInputError(first_error(e)) from None
    check_ratio_fits(info.layer_heads, plan.ratio, plan.scope)
    out = _check_out(args.out)
    quiet_frameworks()
    from lightning_modules.pruning.run import run_prune
    from lightning_modules.training.loop import set_threads

    set_threads()
    model, data, _ = _load_for_scoring(info, data_cfg, train_cfg, family, args.calibration_batches)
    staging = out.parent / f".{out.name}.partial-{os.getpid()}"
    with made_parents(out.parent):  # parents this creates go again if the prune fails
        try:
            staging.mkdir()
            run_train = (info.run or {}).get("train_config") or {}
            # the fine-tune continues the run's order where it stopped: T × the run's own batch size, whatever
            # --batch-size says (the run's train_config was validated by _checkpoint_setup)
            start = run_train["steps"] * run_train["batch_size"] if "batch_size" in run_train else None
            job = PruneJob(plan=plan, data=PruneData(calibration_batches=args.calibration_batches,
                                                     curve_batches=args.curve_batches), eval_batches=args.eval_batches)
            pruned, scores, result = run_prune(model, data, job, data_start=start, progress=not args.quiet)
            metrics = {**result.to_json(), "checkpoint": str(args.checkpoint), "corpus_hash": data.corpus_hash,
                       "eval_sets": data.eval_sets, "tokenizer": data.tokenizer.name}
            write_prune(staging, pruned, metrics, data.tokenizer, data.eval_sets, plan.method, f"{plan.scope}: ")
            if out.exists():
                out.rmdir()
            os.replace(staging, out)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    loss = result.loss
    first = data.eval_sets[0] if data.eval_sets else "val"
    print(f"pruned {plan.method} ratio {plan.ratio} ({plan.scope}, {plan.schedule}): heads {result.heads_kept}"
          f" of {result.heads_dense}; {first} loss dense {loss['dense'][first]['loss']:.4f}, masked "
          f"{loss['pre_ft'][first]['loss']:.4f}, final {loss['final'][first]['loss']:.4f}; latency ms "
          + ", ".join(f"{k} {v:.2f}" for k, v in result.latency_ms.items()))
    print(f"wrote {out}/ (model/, {', '.join(RUN_ARTIFACTS)})")
    return 0


def cmd_export(args) -> int:
    from lightning_modules.models.checkpoints import checkpoint_info
    from lightning_modules.models.export import missing_onnx_packages

    checkpoint_info(args.checkpoint)  # one line for a missing or unsupported checkpoint, before any framework
    out = _check_out(args.out)
    if args.onnx and missing_onnx_packages():
        raise HeadroomInputError(f"--onnx needs {', '.join(missing_onnx_packages())}: pip install 'headroom[onnx]'")
    quiet_frameworks()
    from lightning_modules.models.export import export

    try:
        with made_parents(out.parent):  # parents this creates go again if the export fails
            done = export(args.checkpoint, out, onnx=args.onnx)
    except HeadroomInputError:
        raise  # names the checkpoint already
    except ValueError as e:
        raise HeadroomInputError(f"checkpoint {args.checkpoint}: {e}") from None
    how = (f"{done['auto_class']}.from_pretrained(..., trust_remote_code=True) (modeling_headroom.py)"
           if done["remote_code"] else f"{done['auto_class']}.from_pretrained (plain transformers)")
    print(f"exported {args.checkpoint} to {out}: loads with {how}; tokenizer: {done['tokenizer'] or 'none'}")
    if args.onnx:
        o = done["onnx"]
        shapes = " and ".join(f"{b}x{t}" for b, t in o["shapes_checked"])
        print(f"ONNX: {out}/onnx/{o['file']} (dynamic batch and length); onnxruntime against PyTorch on {shapes} "
              f"batches: max |logit difference| {o['max_abs_diff']:.2e} (largest |logit| {o['max_abs_logit']:.3g})")
    return 0
