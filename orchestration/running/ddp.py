"""Data-parallel training through Ray Train: what a trial with `resources.workers > 1` and `headroom train
--workers W` run.

The Ray Train V2 way (ray 2.58+): a TorchTrainer whose workers each run Lightning with RayDDPStrategy and
RayLightningEnvironment (prepare_trainer checks them); inside a Tune trial, the trial function calls
`TorchTrainer.fit()` and a Train callback forwards the rank-0 reports to the trial (ray.tune.integration.ray_train).
Ray Train persists the checkpoints itself, under the Train run's name in the sweep's storage; the name is the
unit's key, so a retried trial, or a `--resume` from a new driver, restores the newest one.

`Session` is what a trial's body needs of its runtime — the checkpoint to resume from, report with an optional
checkpoint directory, this process's rank — so a train unit runs the same code in a Tune trial (one process) and
in each Ray Train worker.
"""

from __future__ import annotations

from ray.tune.integration.ray_train import TuneReportCallback

CHECKPOINT_KEY = "headroom_checkpoint"  # a forwarded report's persisted checkpoint (path or URI)


class Session:
    """One process's runtime: Tune's (a single-process trial) or Ray Train's (one data-parallel worker)."""

    def __init__(self, train: bool):
        self.train = train
        if train:
            import ray.train

            ctx = ray.train.get_context()
            self.rank, self.world = ctx.get_world_rank(), ctx.get_world_size()
        else:
            self.rank, self.world = 0, 1

    def get_checkpoint(self):
        if self.train:
            import ray.train

            return ray.train.get_checkpoint()
        from ray import tune

        return tune.get_checkpoint()

    def report(self, metrics: dict, checkpoint_dir: str | None = None) -> None:
        """Report metrics (rank 0's reach the trial) with the checkpoint in `checkpoint_dir`: every rank calls
        this the same number of times; only rank 0's directory is persisted."""
        if self.train:
            import ray.train

            ckpt = ray.train.Checkpoint.from_directory(checkpoint_dir) if checkpoint_dir and self.rank == 0 else None
            ray.train.report(metrics, checkpoint=ckpt)
            return
        from ray import tune

        tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(checkpoint_dir) if checkpoint_dir else None)


def lightning_ddp():
    """Lightning's data-parallel setup under Ray Train (lightning_modules.training.loop.Distributed)."""
    from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment, prepare_trainer

    from lightning_modules.training.loop import Distributed

    return Distributed(RayDDPStrategy(find_unused_parameters=False), (RayLightningEnvironment(),), prepare_trainer)


def checkpoint_uri(checkpoint) -> str:
    """A persisted Tune or Train checkpoint as a path or URI any node can open with `ray.tune.Checkpoint(uri)`."""
    import pyarrow.fs

    fs = checkpoint.filesystem
    if fs is None or isinstance(fs, pyarrow.fs.LocalFileSystem):
        return checkpoint.path
    return f"{fs.type_name}://{checkpoint.path}"


class ForwardToTune(TuneReportCallback):
    """Ray's TuneReportCallback, with the checkpoint as a URI any node opens (`tune.Checkpoint(uri)`): its own
    puts the bare path, which on S3 storage lacks the scheme."""

    def after_report(self, run_context, metrics, checkpoint):
        out = dict(metrics[0])
        if checkpoint is not None:
            out[CHECKPOINT_KEY] = checkpoint_uri(checkpoint)
        self._training_actor_item_queue.put(out)


def fit(worker, config: dict, *, workers: int, cpu: float, gpu: float, storage: str, name: str,
        retries: int, resume_from: str | None = None, in_tune: bool = True):
    """Run `worker(config)` on `workers` Ray Train workers (cpu and gpu each) as the Train run `name` under
    `storage`, retrying a failed worker group `retries` times from the newest checkpoint. Returns Ray's Result."""
    import ray.train
    from ray.train.torch import TorchTrainer

    trainer = TorchTrainer(
        worker, train_loop_config=config,
        scaling_config=ray.train.ScalingConfig(num_workers=workers, use_gpu=gpu > 0,
                                               resources_per_worker={"CPU": cpu, "GPU": gpu}),
        run_config=ray.train.RunConfig(
            name=name, storage_path=storage, callbacks=[ForwardToTune()] if in_tune else None,
            failure_config=ray.train.FailureConfig(max_failures=retries),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2)),
        resume_from_checkpoint=ray.train.Checkpoint(resume_from) if resume_from else None,
    )
    return trainer.fit()


def worker_setup() -> None:
    """A Ray Train worker's threads: the CPUs it was given."""
    from lightning_modules.training.loop import set_threads

    set_threads()
