"""Lightning callbacks of a sweep's train trials: the per-step history, and the report-and-checkpoint at every
validation (see orchestration/running/trainables.py for why they travel together)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

from pytorch_lightning.callbacks import Callback

from lightning_modules.declarations import names as M
from orchestration.design.unit import HISTORY, LIGHTNING_FILE

FAULT_PAUSE_S = 3.0


class StepHistory(Callback):
    """Buffers train/loss and train/lr of every optimizer step until the next report takes them."""

    def __init__(self, fault: dict | None = None):
        self.rows: list[list] = []
        self.fault = fault
        self.start_step: int | None = None  # the step this process started from (a restored checkpoint's)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = int(trainer.global_step)
        if self.start_step is None:
            self.start_step = step - 1
        # the global batch's loss (data-parallel: all ranks', not this rank's share)
        self.rows.append([M.TRAIN_LOSS, step, float(pl_module.last_train_loss)])
        self.rows.append([M.TRAIN_LR, step, float(trainer.optimizers[0].param_groups[0]["lr"])])
        if self.fault and step == self.fault["step"]:
            _fault(self.fault)

    def take(self) -> str:
        rows, self.rows = self.rows, []
        return json.dumps(rows)


def _fault(fault: dict) -> None:
    """Test-only fault switch (HEADROOM_TEST_FAULT_STEP): the first trial to reach the step kills its own process,
    once per sweep (a marker file under the storage path records that it fired)."""
    try:
        fd = os.open(fault["marker"], os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.close(fd)
    # a pause first, so the runtime has taken the report before it (Ray Train polls its workers every 2 s): the
    # test then shows a restart from the newest checkpoint rather than from an unreported one
    time.sleep(FAULT_PAUSE_S)
    os.kill(os.getpid(), signal.SIGKILL)


class ReportAtValidation(Callback):
    """At every validation: report val metrics, the step and the buffered step history to Tune, with the Lightning
    checkpoint of that step. Ray's own TuneReportCheckpointCallback reports only `trainer.callback_metrics`
    (numbers), and the history is text, so this does the same with Ray's public API: `trainer.save_checkpoint`
    into a directory, reported with it (`tune.report`, or `ray.train.report` on a data-parallel worker)."""

    def __init__(self, history: StepHistory, report, save_checkpoints: bool = True, keep: Path | None = None):
        # report(metrics, checkpoint_dir=None): the trial's (orchestration.running.ddp.Session.report)
        # keep: a directory every checkpoint carries too (the dense run's snapshots for pruning at p·T), so a
        # resumed trial still has the ones written before it
        self.history, self.report, self.save_checkpoints, self.keep = history, report, save_checkpoints, keep
        self.last_step, self.last_val = -1, (float("nan"), float("nan"))

    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking or M.VAL_LOSS not in trainer.callback_metrics:
            return
        self.last_step = int(trainer.global_step)
        self.last_val = (float(trainer.callback_metrics[M.VAL_LOSS]), float(trainer.callback_metrics[M.VAL_PPL]))
        report = {"step": self.last_step, M.VAL_LOSS: self.last_val[0], M.VAL_PPL: self.last_val[1],
                  HISTORY: self.history.take()}
        if not self.save_checkpoints:
            self.report(report)
            return
        with tempfile.TemporaryDirectory() as d:
            trainer.save_checkpoint(os.path.join(d, LIGHTNING_FILE))  # every rank calls it; rank 0 writes
            if self.keep is not None and self.keep.is_dir():
                shutil.copytree(self.keep, Path(d) / self.keep.name)
            self.report(report, d)
