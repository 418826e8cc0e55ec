"""Ray Tune function trainables: one unit of work per trial.

A trial runs in a Ray worker process, in its own working directory, possibly on another node. It reads its inputs
from the trial config (paths resolved by the driver) and the Tune storage path, and reports to Tune only: metrics,
per-step history and checkpoints travel in its reports, and the driver's tracking callback writes them to MLflow
(one writer per store; see orchestration/running/tracking.py).

Exactly-once step history: `train/loss` of steps since the previous report rides along with the next report, and
a report at a validation point carries the checkpoint of that step. A trial killed between two reports loses the
unreported steps together with their checkpoint; Ray restores it from the last checkpoint and those steps run —
and are reported — once more, for the first time.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from ray import tune

from lightning_modules.declarations import names as M
from lightning_modules.declarations.config import HeadroomInputError, jsonable
from lightning_modules.models.checkpoints import METRICS_FILE
from orchestration.design.plan import lr_candidate, snapshot_step, unit_scoring_flops
from orchestration.design.trunks import trunk_steps
from orchestration.design.unit import (
    DONE,
    EVAL_PARAMS,
    HISTORY,
    KEPT,
    LIGHTNING_FILE,
    RESTARTED,
    RESUMED,
    SNAPSHOTS_DIR,
    TRAIN_PRECISION,
    WINDOWS_FILE,
    WORK,
    Unit,
)

from .artifacts import write_prune
from .devices import claim_gpu
from .frameworks import quiet_frameworks

LATENCY_REPEATS = 5


_DEVICE: dict = {}  # this process's GPUs as Ray gave them (devices.claim_gpu): recorded with every result


def _run_params(unit: Unit) -> dict:
    """What every final result records as MLflow params besides the evaluation's: the GPUs this process was given
    (none: absent) and the precision the unit trains (or fine-tunes) at, "auto" resolved on this device."""
    from lightning_modules.training.lm import resolve_precision

    return {**_DEVICE, TRAIN_PRECISION: resolve_precision(unit.train.precision)}


def _setup() -> None:
    from lightning_modules.training.loop import set_threads

    _DEVICE.clear()
    _DEVICE.update(claim_gpu())  # before torch touches CUDA: a GPU it cannot use stops the trial here
    quiet_frameworks()
    set_threads()


def _train_metrics(m: dict) -> dict:
    from lightning_modules.training.loop import TrainResult

    return TrainResult.flatten(m, ("params", "params_nonembedding", "flops_per_token", "steps", "tokens_per_s",
                               *EVAL_PARAMS))


def train_trial(config: dict, base: dict | None = None, fault: dict | None = None, skip: frozenset = frozenset(),
                ddp: dict | None = None):
    """Train one model (dense, a control, or an lr_search candidate when `base` is given and config has `lr`):
    in this process, or — when `ddp` names the unit's scale — data-parallel on Ray Train workers."""
    cfg = {} if base else config["cfg"]
    unit = lr_candidate(Unit.from_dict(base), config["lr"]) if base else Unit.from_dict(cfg["unit"])
    if unit.key in skip:  # finished already: never run twice
        return
    d = (ddp or {}).get(unit.scale)
    if d:
        from .ddp import fit

        quiet_frameworks()
        fit(_ddp_worker, {"unit": unit.to_dict(), "fault": fault, "dense": cfg.get("dense"),
                          "trunk": cfg.get("trunk")},
            workers=d["workers"], cpu=d["cpu"],
            gpu=d["gpu"], storage=d["storage"], name=f"{d['prefix']}-ddp-{unit.key}", retries=d["retries"],
            resume_from=cfg.get("resume_from"))
        return
    from .ddp import Session

    _setup()
    _train_unit(unit, cfg.get("resume_from"), fault, Session(train=False), cfg.get("dense"), cfg.get("trunk"))


def _ddp_worker(config: dict) -> None:
    """One Ray Train worker of a data-parallel train unit (Ray Train restores its newest checkpoint)."""
    from .ddp import Session

    _setup()
    _train_unit(Unit.from_dict(config["unit"]), None, config["fault"], Session(train=True), config.get("dense"),
                config.get("trunk"))


def _teacher_loss(unit: Unit, dense_uri: str | None, work: Path):
    """A distilled control's training objective: the KL divergence to its dense run's model (the checkpoint at
    `dense_uri`), as its unit's `distill` says; None for every other unit (the LM loss)."""
    if unit.distill is None:
        return None
    if not dense_uri:
        raise RuntimeError(f"{unit.name}: trains by distillation, but its dense teacher's checkpoint was not given")
    from lightning_modules.models.build import load_model
    from lightning_modules.training.distill import LogitDistillation

    model_dir, _, _ = _dense_checkpoint(dense_uri, work)
    return LogitDistillation(load_model(model_dir), unit.distill)


def _train_unit(unit: Unit, resume_from: str | None, fault: dict | None, session, dense_uri: str | None = None,
                trunk_uri: str | None = None) -> None:
    """A train unit's work in one process (a trial, or one rank of a data-parallel run): resume, train with a
    report and checkpoint at every validation, evaluate (rank 0) and report the final checkpoint. A distilled
    control (scratch_kd) learns from its dense run's model at `dense_uri`; a cooldown branch
    (orchestration/design/trunks.py) starts from its trunk's checkpoint at `trunk_uri` (its step `branch_step`)."""
    from lightning_modules.models.build import save_model
    from lightning_modules.training.loop import Snapshots, train_lm

    from .callbacks import ReportAtValidation, StepHistory

    t0 = time.time()  # the unit's work, after this worker's one-time framework imports
    lead = session.rank == 0
    work = Path(tempfile.mkdtemp(prefix="headroom-trial-"))
    ckpt_path, damaged = None, None
    # Ray's retry of this trial, or else (`--resume`) the unit's newest checkpoint from an earlier driver
    resumed = session.get_checkpoint()
    if resumed is None and resume_from:
        resumed = tune.Checkpoint(resume_from)
    if resumed is not None:
        resumed.to_directory(str(work / "resume"))
        damaged = _damaged(work / "resume")
        if damaged is not None:  # truncated or corrupt: the run is continued from step 0, never lost; the
            shutil.rmtree(work / "resume")  # first report says why (the driver prints it and tags the run)
            resumed = None
    if resumed is not None:
        if (work / "resume" / METRICS_FILE).exists():  # died after its final report: say it again
            metrics = json.loads((work / "resume" / METRICS_FILE).read_text())
            session.report({**_train_metrics(metrics), **_run_params(unit), "step": metrics["steps"],
                            HISTORY: "[]", DONE: 1}, str(work / "resume"))
            return
        ckpt_path = str(work / "resume" / LIGHTNING_FILE)
    elif unit.trunk_key is not None:  # a cooldown branch's first attempt: from its trunk's stable phase
        ckpt_path = str(_branch_start(unit, trunk_uri, work))
    is_search = unit.stage == "lr_search"
    history = StepHistory(fault if unit.stage == "train" and unit.arm == "dense" else None)
    snaps, kept = work / SNAPSHOTS_DIR, trunk_steps(unit)
    if kept and (work / "resume" / SNAPSHOTS_DIR).is_dir():  # the ones written before a restart
        shutil.copytree(work / "resume" / SNAPSHOTS_DIR, snaps)
    say = _first_says(session.report, {RESTARTED: damaged} if damaged else {})  # whichever report comes first
    report = ReportAtValidation(history, say,
                                save_checkpoints=not is_search,
                                keep=snaps if kept else None)
    callbacks = [history, report]
    if kept:
        callbacks.append(Snapshots(kept, snaps))
    if unit.probes:  # probe rows ride in the step history: logged once per step, like train/loss
        from lightning_modules.pruning.probes import ProbeCallback

        p = unit.probes
        callbacks.insert(0, ProbeCallback(lambda rows: history.rows.extend(rows), every=p.every, method=p.method,
                                          batches=p.batches, tolerance=p.tolerance, redundancy=p.redundancy,
                                          seed=unit.seed))
    distributed = None
    if session.world > 1:
        from .ddp import lightning_ddp

        distributed = lightning_ddp()
    result = train_lm(unit.model, unit.train, unit.data, ckpt_path=ckpt_path, callbacks=callbacks, progress=False,
                      final_eval=lead and not is_search, distributed=distributed,
                      train_loss_fn=_teacher_loss(unit, dense_uri, work), data_hash=unit.corpus_hash)
    m = result.metrics
    if not lead:  # rank 0 reports the result; every rank reports as often (Ray Train's reports are a barrier)
        session.report({"step": m["steps"]})
        return
    timing = {**m["timing"], "score_s": callbacks[0].seconds if unit.probes else 0.0}
    final = {**_train_metrics(m), **_run_params(unit), **M.timing(timing), "step": m["steps"],
             HISTORY: history.take(), DONE: 1, WORK: time.time() - t0,
             RESUMED: history.start_step if history.start_step is not None else m["steps"]}
    if is_search:  # the objective is the val loss at the last step
        if report.last_step != m["steps"]:
            from lightning_modules.training.lm import evaluate

            t = unit.train
            v = evaluate(result.lm.model, result.data.loader("val", t.val_batches))
            report.last_val = (v["loss"], v["ppl"])
        final.update({M.VAL_LOSS: report.last_val[0], M.VAL_PPL: report.last_val[1]})
        say(final)
        return
    out = work / "final"
    save_model(result.lm.model, out / "model", result.data.tokenizer)
    (out / METRICS_FILE).write_text(json.dumps(jsonable(m), indent=2) + "\n")
    (out / WINDOWS_FILE).write_text(json.dumps({"final": result.windows}) + "\n")
    if kept:
        missing = [s for s in kept if not Snapshots.path(snaps, s).is_file()]
        if missing:
            raise RuntimeError(f"{unit.name}: no checkpoint kept at step(s) {missing}")
        shutil.copytree(snaps, out / SNAPSHOTS_DIR)
    final[WORK] = time.time() - t0
    say(final, str(out))


def _first_says(report, extra: dict):
    """`report` with `extra` added to its first call."""
    pending = dict(extra)

    def first(metrics, *args):
        out = report({**metrics, **pending}, *args)
        pending.clear()
        return out

    return first


def _damaged_model(model_dir: Path) -> str | None:
    """Why a final checkpoint's saved model cannot be read back — config or weights missing, a weights file
    truncated or corrupt (safetensors checks its header against the file's size) — or None."""
    from safetensors import safe_open

    if not (model_dir / "config.json").is_file():
        return "model/config.json: missing"
    weights = sorted(model_dir.glob("*.safetensors"))
    if not weights:
        return "model/: no safetensors weights"
    for f in weights:
        try:
            with safe_open(str(f), framework="pt") as st:
                st.keys()
        except Exception as e:  # safetensors' own error for a short or garbled file
            return f"model/{f.name}: {(str(e).strip().splitlines() or [e.__class__.__name__])[0][:160]}"
    return None


def _damaged(resume: Path) -> str | None:
    """Why a train unit's restored checkpoint directory cannot be continued from — its final metrics.json not
    JSON, its Lightning checkpoint missing, truncated or corrupt — or None when it can. Read memory-mapped: the
    check does not hold a second copy of the model."""
    import torch

    if (resume / METRICS_FILE).exists():  # a finished unit's final checkpoint: its numbers and its model
        try:
            m = json.loads((resume / METRICS_FILE).read_text())
        except (ValueError, OSError, RecursionError) as e:
            return f"{METRICS_FILE}: {e.__class__.__name__}"
        if not isinstance(m, dict) or not isinstance(m.get("steps"), int) or not isinstance(m.get("final"), dict):
            return f"{METRICS_FILE}: not a finished run's record (no steps or final losses)"
        try:
            _train_metrics(m)
        except (KeyError, TypeError, AttributeError) as e:
            return f"{METRICS_FILE}: its final losses are of another shape ({e.__class__.__name__})"
        return _damaged_model(resume / "model")
    ckpt = resume / LIGHTNING_FILE
    if not ckpt.is_file():
        return f"no {LIGHTNING_FILE} in it"
    try:
        torch.load(ckpt, map_location="cpu", weights_only=False, mmap=True)
    except Exception as e:  # torch's zip reader, pickle: whatever a damaged file raises
        return f"{LIGHTNING_FILE}: {(str(e).strip().splitlines() or [e.__class__.__name__])[0][:160]}"
    return None


def _branch_start(unit: Unit, trunk_uri: str | None, work: Path) -> Path:
    """The Lightning checkpoint a cooldown branch starts from: its trunk's, kept at the branch's step."""
    if not trunk_uri:
        raise RuntimeError(f"{unit.name}: a cooldown branch, but its trunk's checkpoint was not given")
    local = Path(trunk_uri) if os.path.isdir(trunk_uri) else Path(tune.Checkpoint(trunk_uri).to_directory(
        str(work / "trunk")))
    path = local / SNAPSHOTS_DIR / f"step{unit.branch_step}.ckpt"
    if not path.is_file():
        raise RuntimeError(f"{unit.name}: its trunk kept no checkpoint at step {unit.branch_step}")
    return path


def _dense_checkpoint(uri: str, work: Path):
    """(the dense model's directory, its train trial's final evaluation ({split: {loss, ppl, tokens}}, or None),
    the checkpoint's local directory) of a prune unit: a finished train trial's Tune checkpoint (local path or URI),
    or a pretrained checkpoint directory."""
    ckpt = tune.Checkpoint(uri)
    local = Path(uri) if os.path.isdir(uri) else Path(ckpt.to_directory(str(work / "dense")))
    if (local / "model" / "config.json").exists():
        metrics = json.loads((local / METRICS_FILE).read_text()) if (local / METRICS_FILE).exists() else {}
        return local / "model", metrics.get("final"), local
    return local, None, local


def prune_trial(config: dict, skip: frozenset = frozenset()):
    """Score the heads of one dense checkpoint on calibration data, prune, evaluate before and after recovery
    fine-tuning on every eval set, and record the mask-only prune curve. Never retrains the dense model."""
    cfg = config["cfg"]
    unit = Unit.from_dict(cfg["unit"])
    if unit.key in skip:
        return
    _setup()
    import torch

    from lightning_modules.data.datamodule import HeadroomData
    from lightning_modules.models.build import load_model
    from lightning_modules.pruning.run import run_prune

    t0 = time.time()
    work = Path(tempfile.mkdtemp(prefix="headroom-prune-"))
    model_dir, dense_eval, local = _dense_checkpoint(cfg["dense"], work)
    data = HeadroomData(unit.data, unit.train, unit.family, data_hash=unit.corpus_hash).prepare()
    # latency is a side measurement here (benchmarks/prune_speed.py measures it properly): a few passes suffice
    job = unit.prune_job(latency_repeats=LATENCY_REPEATS)
    plan = job.plan
    # the dense model's losses on these very windows were measured by its train trial: not measured again
    if unit.prune_at < 1:  # prune the dense run's own checkpoint at p·T, train on to T, then recover
        from lightning_modules.pruning.early import prune_and_continue

        step = snapshot_step(unit.prune_at, unit.train.steps)
        teacher = load_model(model_dir) if unit.recovery == "distill" else None  # the dense model at T
        pruned, _, result = prune_and_continue(local / SNAPSHOTS_DIR / f"step{step}.ckpt", data, job,
                                               dense_eval=dense_eval, teacher=teacher)
    else:
        model = load_model(model_dir)
        if torch.cuda.is_available():
            model = model.cuda()
        if data.vocab_size > model.config.vocab_size:
            raise HeadroomInputError(f"tokenizer has {data.vocab_size} tokens, the model {model.config.vocab_size}")
        pruned, _, result = run_prune(model, data, job, dense_eval=dense_eval)
    m = {**result.to_json(), "unit": unit.to_dict(), "corpus_hash": data.corpus_hash, "eval_sets": data.eval_sets,
         "seconds": time.time() - t0}
    out = work / "final"
    write_prune(out, pruned, m, data.tokenizer, data.eval_sets, plan.method,
                f"{unit.scale} {unit.family} seed {unit.seed}: ")
    flat = {"step": plan.finetune_steps, HISTORY: "[]", DONE: 1, KEPT: json.dumps(result.heads_kept),
            WORK: m["seconds"], **{k: m[k] for k in EVAL_PARAMS}, **_run_params(unit),
            **M.timing(result.timing),
            **result.metrics(data.eval_sets, unit_scoring_flops(unit, sum(result.heads_dense),
                                                                result.flops_per_token["dense"]["total"]))}
    tune.report(flat, checkpoint=tune.Checkpoint.from_directory(str(out)))
