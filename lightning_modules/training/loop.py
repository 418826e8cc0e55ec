"""Train one model with Lightning and evaluate it on every split: what `headroom train` and a sweep's train trial
run. Knows nothing of Ray or MLflow; those come in through `callbacks` and `logger`."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback, ModelCheckpoint

from lightning_modules.data.datamodule import HeadroomData
from lightning_modules.declarations import names as M
from lightning_modules.declarations.config import DataConfig, ModelConfig, TrainConfig, check_compatible, jsonable
from lightning_modules.declarations.costs import flops_per_token, param_counts
from lightning_modules.models.build import save_model
from lightning_modules.models.checkpoints import METRICS_FILE
from lightning_modules.training.lm import HeadroomLM, eval_record, evaluate, resolve_precision

COMPILE_ENV = "HEADROOM_COMPILE"


class TrainClock(Callback):
    """Wall time inside training steps only (no validation, no checkpointing): the honest tokens/s. Also the time
    inside validation loops (`val_seconds`): the two kinds of work a training run is for."""

    def __init__(self):
        self.seconds, self.steps, self._t = 0.0, 0, 0.0
        self.val_seconds, self._v = 0.0, 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._t = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.seconds += time.perf_counter() - self._t
        self.steps += 1

    def on_validation_epoch_start(self, trainer, pl_module):
        self._v = time.perf_counter()

    def on_validation_epoch_end(self, trainer, pl_module):
        self.val_seconds += time.perf_counter() - self._v


class Snapshots(Callback):
    """Keeps the full Lightning checkpoint (weights, optimizer moments, schedule position, data position) of each
    of `steps` as `directory/step<k>.ckpt`: where a prune at a fraction of training starts (step 0: at init).
    A resumed run keeps the ones written before it (they travel with its checkpoints)."""

    def __init__(self, steps, directory: str | os.PathLike):
        self.steps, self.dir = set(steps), Path(directory)
        self.saved: set[int] = set()  # this process's (data-parallel: only rank 0 writes the files)

    @staticmethod
    def path(directory: str | os.PathLike, step: int) -> Path:
        return Path(directory) / f"step{step}.ckpt"

    def _save(self, trainer) -> None:
        step = int(trainer.global_step)
        if step in self.steps and step not in self.saved and not self.path(self.dir, step).exists():
            self.saved.add(step)
            self.dir.mkdir(parents=True, exist_ok=True)
            tmp = self.dir / f".step{step}.partial"
            trainer.save_checkpoint(str(tmp))  # every rank calls it; rank 0 writes
            if trainer.is_global_zero:
                os.replace(tmp, self.path(self.dir, step))  # never a partial file under the final name

    def on_train_start(self, trainer, pl_module):
        self._save(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._save(trainer)


@dataclass
class TrainResult:
    lm: HeadroomLM
    data: HeadroomData
    metrics: dict = field(default_factory=dict)
    windows: dict = field(default_factory=dict)  # split -> {"loss": [per window], "tokens": [per window]}

    @staticmethod
    def flatten(m: dict, passthrough: tuple[str, ...]) -> dict:
        """A train run's `metrics` (or its metrics.json, read back on a resume) → its run's final metrics: loss,
        perplexity and tokens per eval split, the windows each split's cleaning excluded, and the `passthrough`
        numbers as they are."""
        out = {}
        for split, v in m.get("final", {}).items():
            out[M.loss(M.FINAL, split)] = v["loss"]
            out[M.ppl(M.FINAL, split)] = v["ppl"]
            out[M.tokens(M.FINAL, split)] = v["tokens"]
        for split, v in m.get("eval_windows", {}).items():
            out[M.windows_excluded(split)] = v["excluded"]
        out.update({k: m[k] for k in passthrough if k in m})
        return out


class LossCurve(Callback):
    """The training loss of every step this process trained, as [step, loss] (the global batch's loss,
    data-parallel or not): metrics.json keeps it as `train_loss`, so two runs' curves can be compared."""

    def __init__(self):
        self.rows: list[list] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.rows.append([int(trainer.global_step), float(pl_module.last_train_loss)])


@dataclass(frozen=True)
class Distributed:
    """How Lightning trains data-parallel: the strategy and cluster-environment plugin (for Ray Train:
    RayDDPStrategy and RayLightningEnvironment) and `prepare`, applied to the built Trainer (Ray's
    prepare_trainer). The data module shards batches by the Trainer's rank and world size."""

    strategy: object
    plugins: tuple = ()
    prepare: object = None


def build_trainer(train_cfg: TrainConfig, checkpoint_dir: str | os.PathLike | None, *, callbacks=(),
                  logger=None, progress: bool = True, checkpoint_every: int | None = None,
                  distributed: Distributed | None = None) -> pl.Trainer:
    cbs = list(callbacks)
    if checkpoint_dir is not None:
        # one rolling checkpoint: a resumed run continues from the newest step, not from a chosen best
        cbs.append(ModelCheckpoint(dirpath=str(checkpoint_dir), filename="last", save_top_k=1,
                                   every_n_train_steps=checkpoint_every or train_cfg.val_every,
                                   enable_version_counter=False, save_on_exception=False))
    dist = {"devices": 1}
    if distributed is not None:
        # our own sharding (data.RankShard), not Lightning's DistributedSampler: the global batch stays the same
        dist = {"devices": "auto", "strategy": distributed.strategy, "plugins": list(distributed.plugins),
                "use_distributed_sampler": False}
    trainer = pl.Trainer(
        max_steps=train_cfg.steps,
        accelerator="auto",
        **dist,
        precision=resolve_precision(train_cfg.precision),
        gradient_clip_val=train_cfg.grad_clip or None,
        val_check_interval=min(train_cfg.val_every, train_cfg.steps),
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        logger=logger if logger is not None else False,
        log_every_n_steps=1,
        enable_checkpointing=checkpoint_dir is not None,
        enable_progress_bar=progress,
        enable_model_summary=False,
        callbacks=cbs,
    )
    if distributed is not None and distributed.prepare is not None:
        trainer = distributed.prepare(trainer)
    return trainer


def fit(trainer: pl.Trainer, module: pl.LightningModule, **kwargs) -> None:
    """`trainer.fit`, leaving the module on the device it trained on: Lightning's strategy teardown moves it to the
    CPU at the end of fit, and every evaluation that follows (a final one, a fine-tune's, a continued prune's) must
    run where the model trained."""
    trainer.fit(module, **kwargs)
    module.to(trainer.strategy.root_device)


def train_lm(model_cfg: ModelConfig, train_cfg: TrainConfig, data_cfg: DataConfig, *,
             checkpoint_dir: str | os.PathLike | None = None, ckpt_path: str | None = None, callbacks=(),
             logger=None, progress: bool = True, checkpoint_every: int | None = None,
             data: HeadroomData | None = None, final_eval: bool = True,
             distributed: Distributed | None = None, compile: bool | None = None, train_loss_fn=None,
             data_hash: str | None = None) -> TrainResult:
    """Fit a model of `model_cfg` (its vocab size is set from the tokenizer), then evaluate it on the val split
    and every eval set (unless `final_eval` is False: a learning-rate search trial needs only its val reports,
    and data-parallel ranks other than 0 leave it to rank 0). `ckpt_path` resumes a run from a Lightning
    checkpoint (data order included). `distributed`: train data-parallel (see Distributed). `compile`:
    torch.compile the model in place (nn.Module.compile: checkpoints keep their parameter names); None reads
    HEADROOM_COMPILE=1 from the environment (how a sweep's trials are told). `train_loss_fn`: what training
    minimises instead of the LM loss (a distilled control's LogitDistillation); validation and the final
    evaluation stay the LM loss. `data_hash`: a sweep unit's data identity, whose prepared data is opened directly."""
    dm = data or HeadroomData(data_cfg, train_cfg, model_cfg.family, data_hash=data_hash)
    dm.prepare()
    if model_cfg.vocab_size != dm.vocab_size:
        model_cfg = model_cfg.model_copy(update={"vocab_size": dm.vocab_size})
    check_compatible(model_cfg, train_cfg)
    tok = dm.tokenizer
    lm = HeadroomLM(model_cfg.model_dump(mode="json"), train_cfg.model_dump(mode="json"), pad_id=tok.pad_id,
                    eos_id=tok.eos_id, meta={"corpus_hash": dm.corpus_hash, "data": data_cfg.model_dump(mode="json"),
                                             "tokenizer": tok.name}, train_loss_fn=train_loss_fn)
    if compile if compile is not None else os.environ.get(COMPILE_ENV) == "1":
        lm.model.compile()
    clock, curve = TrainClock(), LossCurve()
    trainer = build_trainer(train_cfg, checkpoint_dir, callbacks=[clock, curve, *callbacks], logger=logger,
                            progress=progress, checkpoint_every=checkpoint_every, distributed=distributed)
    t0 = time.time()
    fit(trainer, lm, datamodule=dm, ckpt_path=ckpt_path)
    wall = time.time() - t0
    if trainer.interrupted:
        raise KeyboardInterrupt
    if checkpoint_dir is not None:
        # the rolling checkpoint is written every k steps; the final state must be the one on disk
        trainer.save_checkpoint(str(Path(checkpoint_dir) / "last.ckpt"))
    t_eval = time.perf_counter()
    metrics = evaluate_all(lm.model, dm, train_cfg.eval_batches) if final_eval else {"final": {}}
    eval_s = time.perf_counter() - t_eval
    # per-window losses of the final evaluation travel apart from the metrics (trainables write them to a file)
    windows = {s: {"loss": v.pop("window_loss"), "tokens": v.pop("window_tokens")}
               for s, v in metrics["final"].items() if "window_loss" in v}
    tokens = clock.steps * train_cfg.batch_size * train_cfg.seq_len  # the global batch's (all ranks')
    counts = param_counts(model_cfg)
    metrics.update(
        steps=int(trainer.global_step),
        tokens_per_s=tokens / max(clock.seconds, 1e-9),
        train_seconds=wall,
        train_loss=curve.rows,
        workers=int(trainer.world_size),
        # seconds in training steps and in evaluation (validation during training, the final evaluation); what
        # else the run spent (framework setup, checkpoints) is the rest of train_seconds
        timing={"train_s": clock.seconds, "eval_s": clock.val_seconds + eval_s},
        eval_windows={s: dm.eval_windows(s, train_cfg.eval_batches) for s in metrics["final"]},
        params=counts.total,
        params_nonembedding=counts.non_embedding,
        params_attention=counts.attention,
        flops_per_token=flops_per_token(model_cfg, train_cfg.seq_len).total,
        corpus_hash=dm.corpus_hash,
        tokenizer=tok.name,
        eval_sets=dm.eval_sets,
        **eval_record(lm.model),
        shift_note=dm.shift_note,
        model_config=model_cfg.model_dump(mode="json"),
        train_config=train_cfg.model_dump(mode="json"),
        data_config=data_cfg.model_dump(mode="json"),
    )
    return TrainResult(lm, dm, metrics, windows)


def evaluate_all(model, dm: HeadroomData, n_batches: int | None) -> dict:
    """{"final": {split: {"loss", "ppl", "tokens", "window_loss", "window_tokens"}}} for val and every eval set
    (n_batches None: every clean window of each, up to the stated cap)."""
    return {"final": {s: evaluate(model, dm.loader(s, n_batches), per_window=True) for s in ["val", *dm.eval_sets]}}


def write_run(result: TrainResult, out_dir: str | os.PathLike, checkpoint: str | os.PathLike | None) -> None:
    """Write model/ (transformers format), last.ckpt (Lightning, rebuilds the model alone) and metrics.json."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_model(result.lm.model, out / "model", result.data.tokenizer)
    if checkpoint is not None and Path(checkpoint).exists():
        os.replace(checkpoint, out / "last.ckpt")
    (out / METRICS_FILE).write_text(json.dumps(jsonable(result.metrics), indent=2) + "\n")


def set_threads() -> None:
    """Use the cores we are given (Ray sets OMP_NUM_THREADS for a trial; a bare CLI run uses all)."""
    n = os.environ.get("OMP_NUM_THREADS")
    if n and n.isdigit():
        torch.set_num_threads(int(n))
