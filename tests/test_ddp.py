"""Data-parallel training through Ray Train, on this machine's CPUs: 2 workers × 1 CPU over gloo.

The reference is one process training the same configuration: with the global batch split between the ranks
(each takes batch_size / 2 of every batch) the two-worker run must follow it step by step, also across a worker
killed mid-run and restarted by Ray Train from its checkpoint."""

from __future__ import annotations

import json
import os

import pytest
from conftest import headroom
from test_sweep import client, run_sweep, runs_of, split, steps_of

# summation order differs between one process and two ranks (all-reduced gradients): float32 rounding only
CURVE_TOL = 1e-4
LOSS_TOL = 1e-5
TRAIN_ARGS = ("--scale", "xs", "--family", "encoder", "--steps", "12", "--batch-size", "8", "--seq-len", "64",
              "--val-every", "6", "--eval-batches", "2", "--seed", "3", "--quiet")

DDP_SWEEP = """
name: ddp
family: decoder
data: {source: stdlib}
scales:
  xs:
    steps: 40
    overrides: {batch_size: 8, seq_len: 64, warmup_steps: 4, val_every: 10, val_batches: 2, eval_batches: 2}
    resources: {workers: 2}
seeds: [0]
prune: {ratios: [0.5], methods: [random], finetune_steps: 2, calibration_batches: 2, curve: false}
lr: 3.0e-3
resources: {cpu: 1, gpu: 0}
retries: 2
log_models: false
"""
FAULT_STEP = 15  # after the checkpoint of step 10 (val_every 10): the restart continues from step 10


def test_train_two_workers_follows_one_worker(tmp_path, cache_dir):
    """The encoder: masked LM predicts a different number of tokens on each rank, so this also checks that the
    ranks' gradients add up to the global batch's mean-loss gradient (a per-rank mean would not)."""
    from lightning_modules.declarations.config import DataConfig, ModelConfig, TrainConfig
    from lightning_modules.training.loop import train_lm

    two = headroom("train", *TRAIN_ARGS, "--workers", 2, "--out", tmp_path / "two")
    assert two.returncode == 0, two.stderr[-3000:]
    assert "on 2 data-parallel workers" in two.stdout
    m2 = json.loads((tmp_path / "two" / "metrics.json").read_text())
    # the reference: what `headroom train` without --workers runs, in this process, from the configs recorded
    m1 = train_lm(ModelConfig(**m2["model_config"]), TrainConfig(**m2["train_config"]),
                  DataConfig(**m2["data_config"]), progress=False).metrics
    assert (m1["workers"], m2["workers"]) == (1, 2)
    assert [s for s, _ in m2["train_loss"]] == [s for s, _ in m1["train_loss"]] == list(range(1, 13))
    gaps = [abs(a - b) for (_, a), (_, b) in zip(m1["train_loss"], m2["train_loss"])]
    assert max(gaps) < CURVE_TOL, gaps
    assert m2["train_loss"][-1][1] < m2["train_loss"][0][1] - 0.5  # it trained: the loss fell
    for split_name, v in m1["final"].items():
        assert abs(m2["final"][split_name]["loss"] - v["loss"]) < LOSS_TOL, split_name
    # a complete run directory, nothing of the Ray Train run left in it
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == ["last.ckpt", "metrics.json", "model"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_train_workers_must_divide_the_batch(tmp_path):
    r = headroom("train", "--scale", "xs", "--batch-size", "8", "--workers", "3", "--out", tmp_path / "x")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "headroom: error: --workers: batch size 8 is not divisible by 3 workers (each takes an equal share of every batch)"]
    assert not (tmp_path / "x").exists()


@pytest.fixture(scope="module")
def ddp_sweep(tmp_path_factory, cache_dir):
    """A sweep whose train trials run on 2 Ray Train workers; the dense trial's worker kills itself at step 15."""
    cwd = tmp_path_factory.mktemp("ddp")
    (cwd / "ddp.yaml").write_text(DDP_SWEEP)
    r = run_sweep(cwd, "ddp.yaml", env={"HEADROOM_TEST_FAULT_STEP": str(FAULT_STEP)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return cwd


def test_sweep_trains_data_parallel_and_resumes_a_killed_worker_from_its_checkpoint(ddp_sweep):
    from lightning_modules.declarations.config import DataConfig, ModelConfig, TrainConfig
    from lightning_modules.training.loop import train_lm

    cwd = ddp_sweep
    assert len(list(cwd.glob("ray_results/ddp-????????/fault-fired"))) == 1
    c = client(cwd)
    _, children = split(runs_of(c, "ddp"))
    dense = next(x for x in children if x.data.tags["headroom.arm"] == "dense")
    # the killed worker group restarted from the checkpoint of step 10, and every step is in MLflow once
    assert dense.data.metrics["resumed_at_step"] == 10
    assert steps_of(c, dense) == list(range(1, 41))
    assert sorted(m.step for m in c.get_metric_history(dense.info.run_id, "val/loss")) == [10, 20, 30, 40]
    # the checkpoint is Ray Train's, under the sweep's storage, named by the unit's key
    ckpt = dense.data.tags["headroom.checkpoint"]
    assert f"-ddp-{dense.data.tags['headroom.key']}/checkpoint_" in ckpt and os.path.isdir(ckpt)
    # two workers' CPU time is counted
    assert dense.data.metrics["cost/cpu_s"] == pytest.approx(2 * dense.data.metrics["cost/wall_s"])

    # reference: the same unit trained in one process, uninterrupted, from the configs its run recorded
    local = c.download_artifacts(dense.info.run_id, "metrics.json", str(cwd))
    m = json.loads(open(local).read())
    ref = train_lm(ModelConfig(**m["model_config"]), TrainConfig(**m["train_config"]),
                   DataConfig(**m["data_config"]), progress=False)
    logged = {h.step: h.value for h in c.get_metric_history(dense.info.run_id, "train/loss")}
    gaps = [abs(logged[s] - v) for s, v in ref.metrics["train_loss"]]
    assert len(gaps) == 40 and max(gaps) < CURVE_TOL, max(gaps)
    for split_name, v in ref.metrics["final"].items():
        assert abs(dense.data.metrics[f"final/{split_name}/loss"] - v["loss"]) < LOSS_TOL, split_name

    # the prune unit scored and pruned the data-parallel checkpoint, on one worker
    pruned = next(x for x in children if x.data.tags["headroom.stage"] == "prune")
    assert pruned.info.status == "FINISHED" and "pre_ft/id/loss" in pruned.data.metrics
    assert pruned.data.metrics["cost/cpu_s"] == pytest.approx(pruned.data.metrics["cost/wall_s"])
