"""MLflow, exactly the contract of docs/design.md.

- experiment = sweep name; one parent run per (sweep name, spec hash), found again by its tags;
- one child run per unit of work, found by its deterministic `headroom.key`: a trial retried by Ray, a resumed
  sweep or a re-run continues that run (Ray's MLflowLoggerCallback creates a new run on restore; this does not);
- stepped metrics are logged at most once per (run, metric, step): a restored trial that replays steps already
  logged adds nothing.

Only the driver writes: trials report to Tune and `TrackingCallback` (a Tune callback in the driver) logs. SQLite
takes concurrent writers badly and Ray runs trials in their own working directories on any node; a single
writer with absolute paths avoids both problems.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from mlflow.entities import LoggedModelStatus, Metric, Param, RunStatus, RunTag
from ray.tune import Callback

from lightning_modules.declarations import names as M
from orchestration.design.unit import (
    DONE,
    EVAL_PARAMS,
    HISTORY,
    KEPT,
    PLAN_FILE,
    RESTARTED,
    RESUMED,
    TRAIN_PRECISION,
    WORK,
    Unit,
)

from .artifacts import RUN_ARTIFACTS
from .ddp import CHECKPOINT_KEY, checkpoint_uri
from .devices import GPU_PARAM
from .runstore import mlflow_client, search_runs

PACKAGES = ("headroom", "torch", "transformers", "pytorch-lightning", "ray", "mlflow", "optuna", "datasets")
FINISHED = RunStatus.to_string(RunStatus.FINISHED)
RUNNING = RunStatus.to_string(RunStatus.RUNNING)
STEPPED = (M.TRAIN_LOSS, M.TRAIN_LR, M.VAL_LOSS, M.VAL_PPL)
NOTE = "mlflow.note.content"  # the description the MLflow UI shows on an experiment's or a run's page
# MLflow 3's experiment kind "model training" (MLflow 3.17's UI does not read it to choose its pages: see ui_link)
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
DENSE_RUN = "headroom.dense_run_id"  # on pruned runs and controls: the run of the dense model they answer to


def _local_artifact_root(uri: str) -> str | None:
    """Artifacts of a local store go beside it (mlruns/ next to mlflow.db), not into some trial's directory."""
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///"):]).parent / "mlruns").as_uri()
    return None


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parents[2])
        return out.stdout.strip() if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def package_versions() -> dict[str, str]:
    out = {}
    for p in PACKAGES:
        try:
            out[p] = version(p)
        except PackageNotFoundError:
            out[p] = "not installed"
    return out


def ui_link(uri: str, experiment_id: str) -> str:
    """Where the MLflow UI shows the experiment's runs table. MLflow 3.17's UI picks GenAI or model-training pages
    by its own switch (saved in the browser, default GenAI) or the `workflowType` URL parameter, not by the
    experiment's kind tag: the link carries the parameter."""
    page = f"#/experiments/{experiment_id}/runs?workflowType=machine_learning"
    if uri.startswith(("http://", "https://")):
        return f"MLflow UI: {uri.rstrip('/')}/{page}"
    return f"MLflow UI: `mlflow ui --backend-store-uri {uri}`, then http://127.0.0.1:5000/{page}"


def experiment_note(sweep, spec_hash: str) -> str:
    """The experiment's description (Markdown): what the sweep tests and where its verdict is."""
    scales = ", ".join(sweep.scales or {}) or f"a pretrained checkpoint ({sweep.pretrained.checkpoint})"
    controls = ", ".join(sweep.controls) or "none (half 2 not tested)"
    return (f"**headroom sweep `{sweep.name}`** (spec {spec_hash}). Tests whether attention heads that pruning "
            "removes with little loss still help training: (1) does pruning a trained model lose little, and (2) "
            "does the small head count trained from scratch (the controls) reach worse quality than the pruned "
            f"model?\n\nScales: {scales}; families: {', '.join(sweep.families)}; seeds: {len(sweep.seeds)}; prune "
            f"ratios {', '.join(f'{r:g}' for r in sweep.prune.ratios)} by {', '.join(sweep.prune.methods)}; "
            f"controls: {controls}.\n\nThe parent run `{sweep.name}-{spec_hash[:8]}` holds the verdict (its "
            "description and the `report/` artifacts); each child run is one unit of work, grouped by its "
            "`headroom.*` tags (stage, arm, scale, method, ratio, seed).")


class Tracker:
    """The sweep's parent run and its children, by key."""

    def __init__(self, uri: str, sweep_name: str, spec_hash: str):
        self.uri = uri
        self.client = mlflow_client(uri)
        exp = self.client.get_experiment_by_name(sweep_name)
        if exp is None:
            root = _local_artifact_root(uri)
            self.experiment_id = self.client.create_experiment(sweep_name, artifact_location=root)
        else:
            self.experiment_id = exp.experiment_id
        self.sweep_name, self.spec_hash = sweep_name, spec_hash
        self.parent_id: str | None = None
        self.children: dict[str, object] = {}  # key -> Run
        self._last_step: dict[tuple[str, str], int] = {}  # (run, metric) -> newest step logged; -1: none
        self._fresh: set[str] = set()  # runs created (or restarted) by this driver: no step of this attempt logged
        self._linked: set[str] = set()  # children tagged with their dense run by this driver

    # ---- parent
    def find_parent(self):
        found = self._search(f"tags.`headroom.role` = 'parent' and tags.`headroom.spec_hash` = '{self.spec_hash}'")
        return found[0] if found else None

    def unfinished_units(self) -> list:
        """Children of this spec's parent that an earlier driver left unfinished (lr_search candidates aside:
        the Optuna study, not the run, is what a restart continues). Read-only."""
        parent = self.parent_id
        if parent is None:
            found = self.find_parent()
            if found is None:
                return []
            parent = found.info.run_id
        return [r for r in self._search(f"tags.`mlflow.parentRunId` = '{parent}'")
                if r.info.status != FINISHED and r.data.tags.get("headroom.stage") != "lr_search"]

    def kill_running_children(self) -> None:
        """An interrupted driver's open units: KILLED, not left RUNNING in the UI (`--resume` reopens them)."""
        for key, run in list(self.children.items()):
            current = self.client.get_run(run.info.run_id)
            if current.info.status == RUNNING:
                self.finish(key, run.info.run_id, RunStatus.to_string(RunStatus.KILLED))

    def close_stale_searches(self) -> None:
        """lr_search candidates an interrupted driver left RUNNING are over: their rates are never sampled again."""
        for key, run in list(self.children.items()):
            if run.data.tags.get("headroom.stage") == "lr_search" and run.info.status != FINISHED:
                self.finish(key, run.info.run_id, RunStatus.to_string(RunStatus.KILLED))

    def open_parent(self, sweep_file: str, sweep_text: str, resolved: dict, tags: dict | None = None) -> str:
        found = self.find_parent()
        if found:
            self.parent_id = found.info.run_id
            self.client.update_run(self.parent_id, status=RUNNING)
        else:
            commit = git_commit()
            run = self.client.create_run(self.experiment_id, run_name=f"{self.sweep_name}-{self.spec_hash[:8]}", tags={
                "headroom.role": "parent", "headroom.sweep": self.sweep_name, "headroom.spec_hash": self.spec_hash,
                "headroom.git_commit": commit, "mlflow.source.git.commit": commit,
                "headroom.sweep_file": os.path.basename(sweep_file)})
            self.parent_id = run.info.run_id
            params = [Param(f"version/{k}", v) for k, v in package_versions().items()]
            params.append(Param("spec_hash", self.spec_hash))
            self.client.log_batch(self.parent_id, params=params)
            self.client.log_text(self.parent_id, sweep_text, f"sweep/{os.path.basename(sweep_file)}")
            self.client.log_text(self.parent_id, json.dumps(resolved, indent=2, sort_keys=True), "sweep/resolved.json")
        for k, v in (tags or {}).items():
            self.client.set_tag(self.parent_id, k, v)
        self.children = {r.data.tags["headroom.key"]: r for r in self._search(
            f"tags.`mlflow.parentRunId` = '{self.parent_id}'") if "headroom.key" in r.data.tags}
        return self.parent_id

    def log_plan(self, plan: dict) -> None:
        """The plan the sweep ran (`sweep/plan.json` on the parent run; a resume with the same plan rewrites it)."""
        self.client.log_text(self.parent_id, json.dumps(plan, indent=1), PLAN_FILE)

    def describe_experiment(self, note: str) -> None:
        """The experiment's kind tag and description (what the sweep tests), for a new or an existing one."""
        for k, v in {**EXPERIMENT_KIND, NOTE: note}.items():
            self.client.set_experiment_tag(self.experiment_id, k, v)

    def link_dense(self, dense_key_of: dict[str, str]) -> None:
        """Tag each child in `dense_key_of` (child key -> its dense unit's key) with its dense run's id, once."""
        for key, dense_key in dense_key_of.items():
            run, dense = self.children.get(key), self.children.get(dense_key)
            if run is None or dense is None or key in self._linked or DENSE_RUN in run.data.tags:
                continue
            self.set_tags(run.info.run_id, {DENSE_RUN: dense.info.run_id})
            self._linked.add(key)

    def close_parent(self, status: str) -> None:
        """FINISHED, FAILED (some unit did not finish) or KILLED (interrupted)."""
        self.client.set_terminated(self.parent_id, status)

    def log_parent_params(self, params: dict) -> None:
        self.client.log_batch(self.parent_id, params=[Param(k, str(v)) for k, v in params.items()])

    # ---- children
    def _search(self, filter_string: str) -> list:
        return search_runs(self.client, self.experiment_id, filter_string)

    def finished_keys(self) -> set[str]:
        return {k for k, r in self.children.items() if r.info.status == FINISHED}

    def child(self, unit: Unit) -> str:
        """The run of `unit`: its existing one (set RUNNING unless finished), or a new one with the contract's tags."""
        run = self.children.get(unit.key)
        if run is not None:
            if run.info.status != FINISHED:
                self.client.update_run(run.info.run_id, status=RUNNING)
            return run.info.run_id
        run = self.client.create_run(self.experiment_id, run_name=unit.name,
                                     tags={**unit.tags(), "mlflow.parentRunId": self.parent_id, NOTE: unit.note()})
        self.client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in unit.params().items()])
        self.children[unit.key] = run
        self._fresh.add(run.info.run_id)
        return run.info.run_id

    def is_finished(self, key: str) -> bool:
        run = self.children.get(key)
        return run is not None and run.info.status == FINISHED

    def last_step(self, run_id: str, metric: str) -> int:
        k = (run_id, metric)
        if k not in self._last_step:
            hist = [] if run_id in self._fresh else self.client.get_metric_history(run_id, metric)
            self._last_step[k] = max((m.step for m in hist), default=-1)
        return self._last_step[k]

    def restart_steps(self, run_id: str) -> None:
        """A run whose trial started again from step 0: its new attempt's rows are logged from step 0 on, beside
        the old attempt's (MLflow keeps both; a reader takes the newest value of each step, `newest_per_step`)."""
        for k in [k for k in self._last_step if k[0] == run_id]:
            del self._last_step[k]
        self._fresh.add(run_id)

    def log_stepped(self, run_id: str, rows: list[tuple[str, int, float]]) -> int:
        """Log (metric, step, value) rows whose step is beyond what the run already holds. Returns how many."""
        now = int(time.time() * 1000)
        fresh = []
        for metric, step, value in rows:
            if step > self.last_step(run_id, metric):
                fresh.append(Metric(metric, float(value), now, int(step)))
        for i in range(0, len(fresh), 1000):
            self.client.log_batch(run_id, metrics=fresh[i:i + 1000])
        for m in fresh:
            self._last_step[(run_id, m.key)] = max(self._last_step[(run_id, m.key)], m.step)
        return len(fresh)

    def log_values(self, run_id: str, values: dict[str, float], step: int = 0) -> None:
        now = int(time.time() * 1000)
        ms = [Metric(k, float(v), now, step) for k, v in values.items()]
        for i in range(0, len(ms), 1000):
            self.client.log_batch(run_id, metrics=ms[i:i + 1000])

    def log_params(self, run_id: str, params: dict[str, str]) -> None:
        """Params learnt when a unit finishes (where it evaluated). MLflow's params never change: a value already
        there stays, and a retry that evaluated elsewhere is recorded as a tag `headroom.<param>.retry`."""
        have = self.client.get_run(run_id).data.params
        fresh = [Param(k, v) for k, v in params.items() if k not in have]
        if fresh:
            self.client.log_batch(run_id, params=fresh)
        changed = {f"headroom.{k}.retry": v for k, v in params.items() if k in have and have[k] != v}
        if changed:
            self.set_tags(run_id, changed)

    def finish(self, key: str, run_id: str, status: str = FINISHED) -> None:
        self.client.set_terminated(run_id, status)
        self.children[key] = self.client.get_run(run_id)

    def set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def tag(self, key: str, name: str) -> str | None:
        run = self.children.get(key)
        return run.data.tags.get(name) if run is not None else None

    def refresh(self, key: str) -> None:
        run = self.children.get(key)
        if run is not None:
            self.children[key] = self.client.get_run(run.info.run_id)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


class TrackingCallback(Callback):
    """Driver-side Tune callback: trial events → the unit's MLflow run."""

    ARTIFACTS = RUN_ARTIFACTS

    def __init__(self, tracker: Tracker, unit_of, resources_of, say=None, total: int = 0, log_models: bool = True):
        # resources_of(unit) -> {"cpu", "gpu", "workers"}: what the unit's trial holds (cost/* metrics)
        self.tracker, self.unit_of, self.resources_of = tracker, unit_of, resources_of
        self.say, self.total, self.log_models = say or (lambda msg: None), total, log_models
        self.started = time.time()
        self.runs: dict[str, tuple[Unit, str]] = {}  # trial id -> (unit, run id)
        self.completed: list[Unit] = []

    def _run(self, trial) -> tuple[Unit, str] | None:
        if trial.trial_id not in self.runs:
            unit = self.unit_of(trial)
            if self.tracker.is_finished(unit.key):
                return None  # a finished unit restored by Tune does nothing (the trainable skips it too)
            self.runs[trial.trial_id] = (unit, self.tracker.child(unit))
        return self.runs[trial.trial_id]

    def on_trial_start(self, iteration, trials, trial, **info):
        self._run(trial)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        got = self._run(trial)
        if got is None:
            return
        unit, run_id = got
        rows = [tuple(r) for r in json.loads(result.get(HISTORY) or "[]")]
        step = int(result.get("step", 0))
        if M.VAL_LOSS in result:
            rows += [(M.VAL_LOSS, step, result[M.VAL_LOSS]), (M.VAL_PPL, step, result[M.VAL_PPL])]
        if result.get(RESTARTED):  # its checkpoint was damaged: it started again from step 0, in this same run
            self.tracker.set_tags(run_id, {"headroom.restarted": result[RESTARTED][:500]})
            self.tracker.restart_steps(run_id)
            self.say(f"  {unit.name}: its checkpoint is damaged ({result[RESTARTED]}); restarted from step 0 in "
                     "its own MLflow run")
        self.tracker.log_stepped(run_id, rows)
        if result.get(CHECKPOINT_KEY):  # a data-parallel trial's checkpoint, persisted by Ray Train
            self.tracker.set_tags(run_id, {"headroom.checkpoint": result[CHECKPOINT_KEY]})
        if result.get(DONE):
            values = {k: v for k, v in result.items() if "/" in k and k not in STEPPED and isinstance(v, (int, float))}
            values.update({k: result[k] for k in ("params", "flops_per_token", "params_dense",
                                                  "flops_per_token_dense", "tokens_per_s", "prune_step", RESUMED,
                                                  "params_nonembedding", "params_dense_nonembedding")
                           if k in result})
            seconds = float(result.get("time_total_s", 0.0))
            r = self.resources_of(unit)
            values[M.cost("cpu_s")] = seconds * r["cpu"] * r["workers"]
            values[M.cost("gpu_s")] = seconds * r["gpu"] * r["workers"]
            values[M.cost("wall_s")] = seconds
            if WORK in result:
                values[M.cost("work_s")] = float(result[WORK])
            self.tracker.log_values(run_id, values, step=step)
            self.tracker.log_params(run_id, {k: str(result[k]) for k in (*EVAL_PARAMS, TRAIN_PRECISION, GPU_PARAM)
                                                 if k in result})
            if result.get(KEPT):
                self.tracker.set_tags(run_id, {"headroom.kept": ",".join(map(str, json.loads(result[KEPT])))})

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):
        """The unit's newest persisted checkpoint: where `--resume` starts it again."""
        got = self._run(trial)
        if got is not None:
            self.tracker.set_tags(got[1], {"headroom.checkpoint": checkpoint_uri(checkpoint)})

    def on_trial_complete(self, iteration, trials, trial, **info):
        got = self._run(trial)
        if got is None:
            return
        unit, run_id = got
        ckpt = trial.checkpoint
        forwarded = (trial.last_result or {}).get(CHECKPOINT_KEY)
        if ckpt is None and forwarded:  # data-parallel: the checkpoint Ray Train persisted
            from ray import tune

            ckpt = tune.Checkpoint(forwarded)
        if ckpt is not None and (trial.last_result or {}).get(DONE):
            self.tracker.set_tags(run_id, {"headroom.checkpoint": checkpoint_uri(ckpt)})
            with ckpt.as_directory() as d, tempfile.TemporaryDirectory() as tmp:
                files = [f for f in self.ARTIFACTS if os.path.exists(os.path.join(d, f))]
                for f in files:
                    shutil.copy(os.path.join(d, f), tmp)
                if files:
                    self.tracker.client.log_artifacts(run_id, tmp)
                if unit.stage == "prune" and self.log_models:
                    self._log_model(unit, run_id, Path(d) / "model")
        # an lr_search trial stopped early by ASHA ends here too: a finished candidate with fewer val reports
        self.tracker.finish(unit.key, run_id)
        self.completed.append(unit)
        r = trial.last_result or {}
        loss = next((f"{k} {r[k]:.4f}" for k in (M.loss(M.FINAL, "id"), M.loss(M.FINAL, "val"), M.VAL_LOSS)
                     if k in r), "")
        early = "" if r.get(DONE) else " (stopped early by ASHA)"
        done, took = len(self.completed), time.time() - self.started
        left = f"; about {_duration(took / done * (self.total - done))} left" if done < self.total else ""
        self.say(f"  {done}/{self.total} {unit.name}: {loss}{early}, {r.get('time_total_s', 0):.0f} s{left}")

    def _log_model(self, unit: Unit, run_id: str, model_dir: Path) -> None:
        """The pruned model as an MLflow transformers model, once (a unit finished again after a driver crash
        finds it logged already), or the reason it is not."""
        from .registry import LOGGED, MODEL_NAME, log_pruned_model

        found = [m for m in self.tracker.client.search_logged_models(
            [self.tracker.experiment_id], filter_string=f"source_run_id = '{run_id}' AND name = '{MODEL_NAME}'")
            if m.status == LoggedModelStatus.READY]
        try:  # a model logged before a crash is kept; its exported directory is written again
            uri = log_pruned_model(self.tracker.uri, run_id, model_dir, unit.data.tokenizer,
                                   f"models:/{found[0].model_id}" if found else None)
        except Exception as e:  # noqa: BLE001 - the unit's results stand; its model is missing, and says why
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            self.say(f"  {unit.name}: pruned model not logged ({type(e).__name__}: {first})")
            uri = f"not logged: {type(e).__name__}: {first}"[:500]
        self.tracker.set_tags(run_id, {LOGGED: uri})

    def on_trial_error(self, iteration, trials, trial, **info):
        got = self._run(trial)
        if got is not None:
            self.tracker.finish(got[0].key, got[1], RunStatus.to_string(RunStatus.FAILED))
            err = (getattr(trial, "error_file", None) or "")
            self.say(f"  FAILED {got[0].name} after {trial.num_failures} attempt(s); error in {err}")
