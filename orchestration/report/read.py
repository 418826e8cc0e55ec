"""MLflow → typed runs: the newest parent run of a sweep, its finished children by the tag contract, the loss and
probe histories of its dense runs, (on demand) each run's per-window losses, and the runs as one table (runs.csv).

An edited sweep file makes a new parent; the report reads the newest one only, so older runs are never mixed in.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from lightning_modules.declarations import names as M
from lightning_modules.declarations.config import HeadroomInputError
from orchestration.design.axes import AXES, grouped, read_tags
from orchestration.design.plan import expected_names
from orchestration.design.schema import Sweep
from orchestration.design.unit import (
    NONE,
    PLAN_FILE,
    SCORES_FILE,
    WINDOWS_FILE,
    Cell,
    group_text,
    read_group,
    stands_for,
)
from orchestration.running.runstore import mlflow_client, search_runs

INF_STORED = 1.7976931348623157e308  # sys.float_info.max: how MLflow's stores write ±inf


@dataclass
class Run:
    """A finished child run: the headroom.* tags it is grouped by, its metrics (latest values) and params."""

    run_id: str
    name: str
    status: str
    tags: dict
    metrics: dict
    params: dict
    stage: str = field(init=False)
    arm: str = field(init=False)
    scale: Cell = field(init=False)  # the cell: with its budget when the scale lists several, "s-T1500"
    heads: str = field(init=False)
    family: str = field(init=False)
    method: str = field(init=False)
    scope: str = field(init=False)
    schedule: str = field(init=False)
    seed: int = field(init=False)
    ratio: float | None = field(init=False)
    budget: int | None = field(init=False)  # the dense budget T, when the scale lists several
    prune_at: float = field(init=False)  # prune runs: the fraction of T at which heads went (1: the trained model)
    # prune runs: the recovery budget F (from the params for runs that predate the tag); a control whose budget
    # follows the recovery: the F it is matched to when the sweep lists several (None: it stands for every F)
    finetune_steps: int | None = field(init=False)
    recovery: str = field(init=False)  # lm | distill: a prune run's recovery objective, or a matched control's
    # its comparison group, as the plan stamped it (headroom.group): (the grouped axes, those it stands for every
    # value of); None outside every group (dense runs)
    group: tuple[tuple[str, ...], frozenset] | None = field(init=False)
    # a pruned run's controls as the plan paired them (headroom.controls): {arm: its controls' group tag}; None on
    # other runs and on runs logged before the stamp
    controls: dict | None = field(init=False)

    def tag(self, name: str) -> str:
        return self.tags.get(f"headroom.{name}", "none")

    def __post_init__(self):
        # MLflow stores an infinite metric as ±1.7976931348623157e308 (the largest double): read it back as what it was
        self.metrics = {k: math.copysign(math.inf, v) if isinstance(v, float) and abs(v) >= INF_STORED else v
                        for k, v in self.metrics.items()}
        for name, value in read_tags(self.tags).items():  # every axis of orchestration/design/axes.py
            if name != "key":
                setattr(self, name, value)
        self.scale = Cell(self.scale, self.budget)  # each budget of a scale is a cell of its own: "s-T1500"
        if self.finetune_steps is None and self.arm == "pruned":
            self.finetune_steps = int(self.params.get("finetune_steps", 0))
        if "headroom.group" in self.tags:
            self.group = read_group(self.group)
        else:  # logged before the plan stamped the group: the plan's rule, applied to the run's own tags
            wild = stands_for(self.arm, self.scope, self.finetune_steps)
            self.group = None if wild is None else (grouped(), wild)


@dataclass
class SweepRuns:
    uri: str
    sweep: str
    spec_hash: str
    parent_id: str
    spec: Sweep | None
    runs: list[Run]  # finished children (lr_search aside)
    missing: list[str]  # planned units without a finished run
    histories: dict = field(default_factory=dict)  # dense run id -> {metric: [(step, value)]}
    searches: list[Run] | None = None  # the finished learning-rate candidates (None: not read)


def client(uri: str):
    """An MlflowClient for `uri`; a SQLite store that does not exist is bad input (not created)."""
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        raise HeadroomInputError(f"no MLflow store at {uri[len('sqlite:///'):]} (pass --tracking-uri)")
    if uri.startswith("file://") and not Path(uri[len("file://"):]).is_dir():
        raise HeadroomInputError(f"no MLflow store at {uri[len('file://'):]} (pass --tracking-uri)")
    return mlflow_client(uri)


def _download_json(uri: str, run_id: str, path: str):
    import mlflow.artifacts

    with tempfile.TemporaryDirectory() as tmp:
        p = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=path, dst_path=tmp, tracking_uri=uri)
        return json.loads(Path(p).read_text())


def load_sweep_runs(uri: str, sweep_name: str) -> SweepRuns:
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    c = client(uri)
    exp = c.get_experiment_by_name(sweep_name)
    if exp is None:
        raise HeadroomInputError(f"no sweep {sweep_name!r} in the MLflow store at {uri}")
    parents = search_runs(c, exp.experiment_id, "tags.`headroom.role` = 'parent'",
                          order_by=["attributes.start_time DESC"], limit=1)
    if not parents:
        raise HeadroomInputError(f"sweep {sweep_name!r}: its experiment holds no parent run")
    parent = parents[0]
    try:
        spec = Sweep.model_validate(_download_json(uri, parent.info.run_id, "sweep/resolved.json"))
    except Exception:  # noqa: BLE001 - a store without the spec artifact still reports what it has
        spec = None
    children = search_runs(c, exp.experiment_id, f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    runs = [Run(r.info.run_id, r.info.run_name, r.info.status, dict(r.data.tags), dict(r.data.metrics),
                dict(r.data.params)) for r in children]
    done = [r for r in runs if r.status == "FINISHED" and r.tags.get("headroom.stage") != "lr_search"]
    names = {r.name for r in done}
    try:  # the plan the sweep ran; a sweep recorded before plans were: planned again from its spec
        expected = _download_json(uri, parent.info.run_id, PLAN_FILE)["expected"]
    except Exception:  # noqa: BLE001 - no plan artifact
        expected = expected_names(spec) if spec is not None else None
    if expected is not None:
        missing = [n for n in expected if n not in names]
    else:
        missing = sorted(r.name for r in runs if r.status != "FINISHED" and r.tags.get("headroom.stage") != "lr_search")
    out = SweepRuns(uri, sweep_name, parent.data.tags.get("headroom.spec_hash", ""), parent.info.run_id, spec, done,
                    missing, searches=[r for r in runs if r.status == "FINISHED"
                                       and r.tags.get("headroom.stage") == "lr_search"])
    for r in done:
        if r.arm == "dense":  # probes and the training-loss curve (the `converged` diagnostic)
            keys = [k for k in r.metrics if k.startswith(M.PROBE)] + [M.TRAIN_LOSS]
            out.histories[r.run_id] = {k: newest_per_step(c.get_metric_history(r.run_id, k)) for k in keys}
    return out


def newest_per_step(history) -> list[tuple[int, float]]:
    """A stepped metric's (step, value) rows, one per step: the newest value where a trial restarted from step 0
    in the same run and logged a step twice (`headroom.restarted`)."""
    newest: dict[int, tuple[int, float]] = {}
    for m in history:
        if m.step not in newest or m.timestamp >= newest[m.step][0]:
            newest[m.step] = (m.timestamp, m.value)
    return sorted((step, value) for step, (_, value) in newest.items())


class Windows:
    """Per-window losses of runs (their `eval_windows.json` artifact), downloaded once per run when a comparison
    asks for them. Runs without the artifact (or a store that cannot serve it) give None: their comparisons fall
    back to the spread over seeds alone, and say so."""

    def __init__(self, uri: str | None):
        self.uri, self._cache = uri, {}

    def get(self, run: Run, stage: str, split: str) -> dict | None:
        if self.uri is None:
            return None
        if run.run_id not in self._cache:
            self._cache[run.run_id] = self._download(run.run_id)
        return (self._cache[run.run_id] or {}).get(stage, {}).get(split)

    def _download(self, run_id: str) -> dict | None:
        try:
            return _download_json(self.uri, run_id, WINDOWS_FILE)
        except Exception:  # noqa: BLE001 - no artifact: the seed-only interval, labelled as such
            return None


def scores_of(uri: str, run: Run) -> list | None:
    """A prune run's head scores ([layers][heads]) from its scores.json artifact, or None."""
    try:
        return _download_json(uri, run.run_id, SCORES_FILE)["scores"]
    except Exception:  # noqa: BLE001 - a run without the artifact gets no heatmap
        return None


# ------------------------------------------------------------------------------------------------ runs.csv
# The sweep's child runs as one tidy table (pandas): a row per finished child run, a column per axis of
# orchestration/design/axes.py (typed, read back from the run's tags), then every metric (its latest value) and every
# param (`param/<name>`). Written beside the report as `runs.csv`, the export a researcher loads into a notebook.

ID_COLUMNS = ("run_id", "name", "cell")  # cell: the scale as the report groups it ("s-T1500" with several budgets)


def runs_table(runs: list[Run]):
    import pandas as pd

    axes = [a.name for a in AXES]
    metrics = sorted({k for r in runs for k in r.metrics})
    params = sorted({k for r in runs for k in r.params})
    rows = []
    for r in runs:
        tags = {k: json.dumps(v, sort_keys=True) if isinstance(v, dict) else v for k, v in read_tags(r.tags).items()}
        row = {"run_id": r.run_id, "name": r.name, "cell": r.scale, **tags, "group": run_group(r)}
        row.update({m: r.metrics.get(m) for m in metrics})
        row.update({f"param/{p}": r.params.get(p) for p in params})
        rows.append(row)
    columns = [*ID_COLUMNS, *axes, *metrics, *(f"param/{p}" for p in params)]
    table = pd.DataFrame(rows, columns=columns)
    for name in axes:  # an integer axis stays integer where some runs have none (F 200, not 200.0)
        values = [v for v in (row[name] for row in rows) if v is not None]
        if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            table[name] = table[name].astype("Int64")
    return table


def write_runs_csv(runs: list[Run], path: Path) -> Path:
    runs_table(runs).sort_values(["cell", "arm", "method", "ratio", "seed", "name"], na_position="first",
                                 kind="stable").to_csv(path, index=False)
    return path


def run_group(r: Run) -> str:
    """The run's comparison group as the report pools it (its headroom.group tag, or the plan's rule for runs
    logged before the tag): `axis=value;…`, `*` where it stands for every value; "none" outside every group."""
    if r.group is None:
        return NONE
    names, wild = r.group
    return group_text({a: getattr(r, a) for a in names}, wild, names)
