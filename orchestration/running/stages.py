"""`headroom sweep`: a validated Sweep run as Ray Tune stages, recorded in MLflow.

    lr_search (optional)  per (scale, family): OptunaSearch + ASHA; the best rate feeds every training run
    train                 dense runs and the controls known before pruning (per_layer Scratch-E, Scratch-B, wide)
    branches              under a wsd schedule, the shorter budgets of each architecture: cooldowns started from
                          the longest run's checkpoints (orchestration/design/trunks.py)
    prune                 one trial per (dense checkpoint × method × ratio × scope × schedule); never retrains
    controls              Scratch-E/B of `global` prunes, copying the pruned per-layer head counts
    summary               a table of mean losses (the verdict report is orchestration/report/)

Each stage is one Tuner over the units MLflow does not hold as finished. Within a run Ray retries a failed trial
(FailureConfig) from its newest Tune checkpoint. Across driver runs the MLflow child of each unit is the index: the
driver tags it with the unit's newest checkpoint, and `--resume` starts unfinished units from there (Tune's own
restore saves its state at most every 10 s and can rerun a finished trial; the MLflow record is exact).
"""

from __future__ import annotations

import math
import os
import sys
import time
import traceback
from functools import partial
from pathlib import Path

from lightning_modules.data.prepared import DataIdentity, data_identity, prepare
from lightning_modules.declarations import names as M
from lightning_modules.declarations.config import HeadroomInputError
from lightning_modules.models.checkpoints import checkpoint_info
from orchestration.design import plan as plan_module
from orchestration.design.plan import Plan, build_plan, lr_candidate, plan_record, pretrained_units
from orchestration.design.preflight import compute_note, plan_rows
from orchestration.design.resources import concurrency, ddp_trials, trial_bundle, trial_resources
from orchestration.design.schema import Sweep
from orchestration.design.unit import Unit, arch_key
from orchestration.report import headline_table, write_report

from .devices import SIMULATE
from .summary import loss_table, timing
from .where import Where, checkpoint_id, resolve_paths, resolve_where, stop_on_signals

FAULT_ENV = "HEADROOM_TEST_FAULT_STEP"  # test-only: the first dense train trial to reach this step kills itself


class Sweeper:
    def __init__(self, sweep: Sweep, sweep_file: str, sweep_text: str, where: Where, resume: bool,
                 progress: bool = True, write_report: bool = True, register: bool = False,
                 simulate_gpus: int | None = None):
        self.write_report = write_report  # False: the runs only (benchmarks that measure trials)
        self.register = register  # the primary method's pruned models into the Model Registry, after the report
        self.hash = sweep.spec_hash()  # of the sweep as written: the same file gives the same parent anywhere
        sweep = resolve_paths(sweep)
        self.sweep, self.sweep_file, self.sweep_text = sweep, sweep_file, sweep_text
        self.where, self.resume, self.progress = where, resume, progress
        self.base = f"{sweep.name}-{self.hash[:8]}"
        self.missing: list[str] = []
        self.vocab_size = 0  # set by preflight(): the tokenizer's
        self.plan: Plan | None = None  # built once, by preflight(), once the data is prepared; every stage reads it
        self.stage_seconds: dict[str, float] = {}  # wall time of each stage's Tuner runs
        self.started = time.time()
        self.simulate_gpus = simulate_gpus  # a local Ray declaring this many GPUs that do not exist (devices.py)

    # ------------------------------------------------------------------------------------------- plumbing
    def say(self, msg: str) -> None:
        if self.progress and msg:
            print(f"[headroom] {msg}", flush=True)

    def _tune(self, stage: str, trainable, param_space: dict, unit_of, n: int, scales: set[str], scale_of,
              tune_config=None, **params):
        """One Tuner over `n` trials of units at `scales` (`scale_of(trial config)` says a trial's); returns the
        TrackingCallback (what completed)."""
        from ray import tune
        from ray.tune.logger import JsonLoggerCallback

        from .tracking import TrackingCallback

        self._ray()
        cb = TrackingCallback(self.tracker, unit_of, partial(trial_resources, self.sweep), self.say, n,
                              self.sweep.log_models)
        skip = frozenset(self.tracker.finished_keys())
        trains = stage != "prune"
        if trains:
            params["ddp"] = ddp_trials(self.sweep, self.where.storage, self.base)
        bundles = {s: trial_bundle(self.sweep, s, trains) for s in scales}  # plain data: Tune pickles the trainable
        fn = tune.with_resources(tune.with_parameters(trainable, skip=skip, **params),
                                 lambda config: tune.PlacementGroupFactory([bundles[scale_of(config)]]))
        name = f"{self.base}-{stage}-{time.strftime('%Y%m%d-%H%M%S')}"
        tc = tune_config or tune.TuneConfig()
        limit = concurrency(self.sweep, scales, trains)
        if limit:  # data-parallel trials: Tune cannot see their workers' resources, so it is told how many fit
            tc.max_concurrent_trials = limit
        # torch + transformers import once per worker, not once per trial (a data-parallel trial's process only
        # drives its Ray Train run, and Tune cannot reuse it)
        tc.reuse_actors = limit is None
        tc.trial_name_creator = lambda t: f"{unit_of(t).name}_{t.trial_id[-5:]}"
        tc.trial_dirname_creator = lambda t: t.trial_id  # short paths; the name says the unit
        run_config = tune.RunConfig(
            name=name, storage_path=self.where.storage, callbacks=[cb, JsonLoggerCallback()],
            failure_config=tune.FailureConfig(max_failures=self.sweep.retries),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
            verbose=0,  # progress is one line per finished trial, from the tracking callback
        )
        self.say(f"{stage}: {n} trial(s) → {self.where.storage}/{name}")
        t0 = time.time()
        tune.Tuner(fn, param_space=param_space, tune_config=tc, run_config=run_config).fit()
        group = "lr_search" if stage.startswith("lr-") else stage
        self.stage_seconds[group] = self.stage_seconds.get(group, 0.0) + time.time() - t0
        return cb

    def _ray(self) -> None:
        """Ray starts (or is joined) only when a stage has trials to run: a finished sweep re-run needs none."""
        import ray

        if not ray.is_initialized():
            # no address: a new local Ray, even when a `ray start` cluster runs on this machine
            ray.init(address=self.where.address or "local", logging_level="ERROR", log_to_driver=False,
                     include_dashboard=False if self.where.address is None else None,
                     **({"num_gpus": self.simulate_gpus} if self.simulate_gpus else {}))
            stop_on_signals()

    def _grid(self, units: list[Unit], extra=None) -> dict:
        from ray import tune

        cfgs = []
        for u in units:
            c = {"unit": u.to_dict(), "resume_from": None}
            if self.resume:
                c["resume_from"] = self.tracker.tag(u.key, "headroom.checkpoint")
            if extra:
                c.update(extra(u))
            cfgs.append(c)
        return {"cfg": tune.grid_search(cfgs)}

    def _todo(self, units: list[Unit]) -> list[Unit]:
        done = self.tracker.finished_keys()
        seen, out = set(), []
        for u in units:
            if u.key not in done and u.key not in seen:
                seen.add(u.key)
                out.append(u)
        return out

    # ------------------------------------------------------------------------------------------- stages
    def lr_search(self, bases: list[Unit]) -> dict:
        """Per (scale, family, architecture trained from scratch): the best learning rate found by Optuna (TPE, or
        a log grid first) with ASHA stopping poor trials early, every architecture with the same trials and steps;
        then, while the best rate tried is at an edge of the rates tried, one more past that edge (`extend`). The
        studies live in an Optuna storage under the storage path, so a restarted sweep continues them."""
        import optuna

        s = self.sweep.lr.search
        storage = optuna.storages.RDBStorage(f"sqlite:///{self._optuna_db()}")
        best = {}
        for base in bases:
            scale, family, arch = base.scale, base.family, arch_key(base.model)
            study_name = f"{self.base}-{scale}-{family}-{arch}"
            study = optuna.create_study(study_name=study_name, storage=storage, direction="minimize",
                                        load_if_exists=True)
            if s.start == "grid":  # the grid's rates not tried or queued yet (a stale RUNNING one is lost: again)
                held = {round(t.params["lr"], 12) for t in study.trials if "lr" in t.params and t.state in (
                    optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.WAITING)}
                for lr in s.grid():
                    if round(lr, 12) not in held:
                        study.enqueue_trial({"lr": lr})
            remaining = s.trials - len(_complete(study))
            if remaining > 0:
                self._search_trials(base, study_name, storage, remaining, s.low, s.high, asha=True,
                                    seed=s.seed + len(_complete(study)))
                study = optuna.load_study(study_name=study_name, storage=storage)
            for _ in range(s.extend - max(0, len(_complete(study)) - s.trials)):
                tried = sorted(t.params["lr"] for t in _complete(study))
                edge = study.best_trial.params["lr"]
                if tried[0] < edge < tried[-1]:
                    break
                nxt = edge * s.step if edge == tried[-1] else edge / s.step
                self.say(f"lr_search {scale} {family} {arch}: best rate {edge:.3g} at the edge of those tried; "
                         f"trying {nxt:.3g}")
                study.enqueue_trial({"lr": nxt})
                self._search_trials(base, study_name, storage, 1, min(tried[0], nxt), max(tried[-1], nxt),
                                    asha=False, seed=s.seed + len(tried))
                study = optuna.load_study(study_name=study_name, storage=storage)
            best[(scale, family, arch)] = float(study.best_trial.params["lr"])
            self.say(f"lr_search {scale} {family} {arch}: best lr {best[(scale, family, arch)]:.3g} "
                     f"(val loss {study.best_value:.4f}, {len(study.trials)} trials)")
        self.tracker.log_parent_params({f"best_lr/{sc}/{fa}/{ar}": f"{v:.6g}" for (sc, fa, ar), v in best.items()})
        return best

    def _search_trials(self, base: Unit, study_name: str, storage, n: int, low: float, high: float, asha: bool,
                       seed: int) -> None:
        """`n` candidates of one architecture's study over loguniform(low, high): its queued rates first."""
        import optuna
        from ray import tune
        from ray.tune.schedulers import ASHAScheduler
        from ray.tune.search.optuna import OptunaSearch

        from .trainables import train_trial

        s, t = self.sweep.lr.search, base.train
        searcher = OptunaSearch(metric=M.VAL_LOSS, mode="min", study_name=study_name, storage=storage,
                                sampler=optuna.samplers.TPESampler(seed=seed))
        sched = None
        if asha:
            sched = ASHAScheduler(time_attr="training_iteration", metric=M.VAL_LOSS, mode="min",
                                  max_t=math.ceil(t.steps / t.val_every) + 1, grace_period=s.grace_period,
                                  reduction_factor=2)
        tc = tune.TuneConfig(search_alg=searcher, scheduler=sched, num_samples=n)
        arch = arch_key(base.model)
        self._tune(f"lr-{base.scale}-{base.family}-{arch}", train_trial, {"lr": tune.loguniform(low, high)},
                   lambda tr, b=base: lr_candidate(b, tr.config["lr"]), n, {base.scale},
                   lambda config, sc=base.scale: sc, tc, base=base.to_dict())

    def _optuna_db(self) -> Path:
        if self.where.local_storage is not None:
            d = self.where.local_storage / self.base
        else:  # remote storage: the study stays with the driver
            d = Path(os.environ.get("HEADROOM_CACHE", "~/.cache/headroom")).expanduser() / "optuna" / self.base
        d.mkdir(parents=True, exist_ok=True)
        return d / "optuna.db"

    def train(self, stage: str, units: list[Unit], extra=None) -> None:
        """Train `units` (those finished already skipped); `extra(unit)` adds to a trial's config (a distilled
        control's teacher: {"dense": its dense run's checkpoint})."""
        from .trainables import train_trial

        todo = self._todo(units)
        if len(units) and not todo:
            self.say(f"{stage}: all {len(units)} unit(s) finished already")
            return
        if todo:
            fault = None
            if os.environ.get(FAULT_ENV) and self.where.local_storage is not None:
                fault = {"step": int(os.environ[FAULT_ENV]),
                         "marker": str(self.where.local_storage / self.base / "fault-fired")}
                Path(fault["marker"]).parent.mkdir(parents=True, exist_ok=True)
            self._tune(stage, train_trial, self._grid(todo, extra), self._unit_of, len(todo),
                       {u.scale for u in todo}, _scale_of, fault=fault)

    def prune(self, units: list[Unit], dense_uri) -> list[Unit]:
        from .trainables import prune_trial

        runnable = []
        for u in units:
            if dense_uri(u) is None:
                self.missing.append(f"{u.name}: its dense model did not finish")
            else:
                runnable.append(u)
        todo = self._todo(runnable)
        if units and not todo:
            self.say(f"prune: all {len(runnable)} unit(s) finished already")
        if todo:
            self._tune("prune", prune_trial, self._grid(todo, lambda u: {"dense": dense_uri(u)}), self._unit_of,
                       len(todo), {u.scale for u in todo}, _scale_of)
        return runnable

    @staticmethod
    def _unit_of(trial) -> Unit:
        return Unit.from_dict(trial.config["cfg"]["unit"])

    # ------------------------------------------------------------------------------------------- the sweep
    def preflight(self) -> str:
        """Before anything is recorded or started: the data's identity (corpus hash, the vocabulary actually
        trained) and every unit's model built on the meta device (orchestration/design/preflight.py). Bad data or a unit
        that cannot be built raises HeadroomInputError: one line, exit 2, nothing written."""
        data = self.sweep.data
        if data.source == "mqar":
            ident, prepared = data_identity(data), None
        else:  # prepared once here; every trial maps what this writes (lightning_modules/data/prepared.py)
            prepared = prepare(data, self.say)
            ident = DataIdentity(prepared.data_hash, prepared.vocab_size)
            self.say(f"data: prepared {prepared.path} ({sum(prepared.manifest['tokens'].values())} tokens)")
        self.vocab_size = ident.vocab_size
        if self.sweep.pretrained is None:  # every unit buildable and every GPU's trials fitting it, before Ray starts
            self.plan = build_plan(self.sweep, ident.data_hash, ident.vocab_size)
            rows = plan_rows(self.plan)
            self.say(f"plan: {len(rows)} unit(s) checked on the meta device (vocabulary {ident.vocab_size})")
            self.say(compute_note(rows))  # a sweep too long for its resources: said (when so), not refused
        if prepared is not None and self.plan is not None:
            plan = self.plan
            lengths = {u.train.seq_len for u in (*plan.lr_search, *plan.trained, *plan.pruned, *plan.taught)}
            for seq_len in sorted(lengths):  # the trials read these instead of scanning the training stream
                for split in prepared.streams:
                    if split != "train":
                        prepared.clean_starts(split, seq_len)
        return ident.data_hash

    def run(self) -> int:
        from .tracking import Tracker, experiment_note, ui_link

        corpus_hash = self.preflight()
        self.tracker = Tracker(self.where.tracking_uri, self.sweep.name, self.hash)
        unfinished = self.tracker.unfinished_units()
        if unfinished and not self.resume:
            raise HeadroomInputError(
                f"sweep {self.sweep.name} has {len(unfinished)} unfinished unit(s) from an earlier run; "
                "pass --resume to continue them")
        if self.where.address:  # a cluster named by --address or RAY_ADDRESS: reachable before any run is opened
            try:
                self._ray()
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise HeadroomInputError(f"--address {self.where.address}: cannot connect to Ray "
                                         f"({str(e).splitlines()[0]})") from None
        self.tracker.open_parent(self.sweep_file, self.sweep_text, self.sweep.model_dump(mode="json"))
        self.tracker.describe_experiment(experiment_note(self.sweep, self.hash))
        self.tracker.close_stale_searches()
        ok, status = False, "FAILED"
        try:
            self.say(f"sweep {self.sweep.name} (spec {self.hash}), corpus {corpus_hash}; MLflow "
                     f"{self.where.tracking_uri}, experiment {self.sweep.name}")
            if self.sweep.pretrained is not None:
                self._run_pretrained(corpus_hash)
            else:
                self._run_scales(corpus_hash)
            ok = not self.missing and not self.tracker.unfinished_units()
            status = "FINISHED" if ok else "FAILED"
            if self.progress:
                runs = list(self.tracker.children.values())
                print(loss_table(self.sweep.name, runs))
                print(f"\nMLflow: experiment {self.sweep.name!r} at {self.where.tracking_uri} "
                      f"(parent run {self.tracker.parent_id})")
                print(ui_link(self.where.tracking_uri, self.tracker.experiment_id))
                print(timing(time.time() - self.started, self.stage_seconds, runs))
            reported = self.report() if self.write_report else True
            self.say(f"plan: built {plan_module.BUILDS} time(s) in this driver")
        except KeyboardInterrupt:
            status = "KILLED"  # `--resume` continues it
            self.tracker.kill_running_children()
            raise
        finally:
            self.tracker.close_parent(status)
        if not ok:
            print(f"[headroom] sweep {self.sweep.name} incomplete: "
                  + "; ".join(self.missing or ["some units failed"]) + ". Rerun with --resume.", file=sys.stderr)
            return 1
        return 0 if reported else 1

    def _kept_heads(self, p: Unit) -> list[int] | None:
        """A finished prune unit's kept heads per layer (its tag); None, and the miss recorded, otherwise."""
        self.tracker.refresh(p.key)
        kept = self.tracker.tag(p.key, "headroom.kept")
        if not self.tracker.is_finished(p.key) or not kept:
            self.missing.append(f"{p.name}: unfinished, so its global-scope controls did not run")
            return None
        return [int(x) for x in kept.split(",")]

    def _finished_uri(self, key: str) -> str | None:
        """The final checkpoint of the unit with `key`, when it finished (else None)."""
        self.tracker.refresh(key)
        return self.tracker.tag(key, "headroom.checkpoint") if self.tracker.is_finished(key) else None

    def _dense_uri(self, u: Unit) -> str | None:
        return self._finished_uri(u.dense_key)

    def _run_scales(self, corpus_hash: str) -> None:
        plan = self.plan
        if plan.lr_search:  # every architecture trained from scratch gets its own rate, then the plan takes them
            plan = self.plan = plan.with_rates(self.lr_search(plan.lr_search))
        self.tracker.log_plan(plan.to_json())
        self.train("train", [u for u in plan.trained if u.trunk_key is None])
        branches = []  # wsd cooldown branches (orchestration/design/trunks.py): once their trunks have finished
        for u in plan.trained:
            if u.trunk_key is not None:
                if self._finished_uri(u.trunk_key) is None:
                    self.missing.append(f"{u.name}: the run it branches from did not finish")
                else:
                    branches.append(u)
        self.train("branches", branches, lambda u: {"trunk": self._finished_uri(u.trunk_key)})
        self.tracker.link_dense(plan.dense_links())
        pruned = self.prune(plan.pruned, self._dense_uri)
        self.tracker.link_dense({u.key: u.dense_key for u in pruned})
        controls = []
        if plan.has_global_controls():
            controls = plan.global_controls(self._kept_heads, pruned)  # the late expansion: the kept heads known
        for u in plan.taught:  # distilled from its dense run: that run must have finished
            if self._dense_uri(u) is None:
                self.missing.append(f"{u.name}: its dense teacher did not finish")
            else:
                controls.append(u)
        if controls:
            self.train("controls", controls, lambda u: {"dense": self._dense_uri(u)} if u in plan.taught else {})
            self.tracker.link_dense({u.key: u.dense_key for u in controls})

    def _run_pretrained(self, corpus_hash: str) -> None:
        info = checkpoint_info(self.sweep.pretrained.checkpoint)
        model_dir = str(Path(info.model_dir).resolve())
        ident = checkpoint_id(model_dir)
        units = pretrained_units(self.sweep, self.sweep.families[0], ident, info.layer_heads, corpus_hash)
        self.tracker.log_plan(plan_record(units, [u.name for u in units], corpus_hash))
        self.prune(units, lambda u: model_dir)

    # ------------------------------------------------------------------------------------------- report
    def report(self) -> bool:
        """The verdict report (orchestration/report/) of this sweep, into reports/<name>/ and the parent run.
        False when it could not be written (the sweep's runs stay; `headroom report` can try again)."""
        try:
            out, rep = write_report(self.where.tracking_uri, self.sweep.name, self.where.reports)
        except HeadroomInputError as e:
            self.say(f"no report: {e}")
            return True
        except Exception:  # noqa: BLE001 - every unit is recorded already; say so and how to retry
            traceback.print_exc()
            print(f"[headroom] the report failed; retry with `headroom report --sweep {self.sweep.name} "
                  f"--tracking-uri {self.where.tracking_uri}`", file=sys.stderr)
            return False
        if self.progress:
            print("\n" + headline_table(rep))
        self.say(f"report: {out / 'report.html'} (and report.md, verdict.json)")
        if self.register:
            from .registry import register_primary

            register_primary(rep, self.where.tracking_uri, self.say)
        return True


def _complete(study) -> list:
    import optuna

    return [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]


def _scale_of(config: dict) -> str:
    """The scale of a grid trial's unit, from its config."""
    return config["cfg"]["unit"]["scale"]


def run_sweep(sweep: Sweep, sweep_file: str, sweep_text: str, *, resume: bool = False, address: str | None = None,
              tracking_uri: str | None = None, storage: str | None = None, progress: bool = True,
              write_report: bool = True, register: bool = False, simulate_gpus: int | None = None) -> int:
    # Tune's newer console output ignores verbose=0 and prints every trial's config; progress is ours
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    # MLflow is the record: of Tune's default loggers keep the JSON one (the TensorBoard one would import torch
    # into the driver, which needs none)
    os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"
    # Ctrl-C stops the driver (and with it a local Ray); Tune's own handler would end only the current stage and
    # let the next one start. `--resume` continues from the checkpoints MLflow points to.
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # one "View run" line per trial
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    where = resolve_where(sweep, tracking_uri, storage, address)
    if os.environ.get("HEADROOM_CACHE"):  # trials run in their own directories: make it absolute for them
        os.environ["HEADROOM_CACHE"] = str(Path(os.environ["HEADROOM_CACHE"]).expanduser().resolve())
    if simulate_gpus:  # the local Ray's workers inherit it: trials train on the CPU, recording the declared GPU
        os.environ[SIMULATE] = "1"
    return Sweeper(sweep, sweep_file, sweep_text, where, resume, progress, write_report, register,
                   simulate_gpus).run()

