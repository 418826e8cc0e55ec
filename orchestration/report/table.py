"""The sweep's child runs as one tidy table (pandas): a row per finished child run, a column per axis of
orchestration/axes.py (typed, read back from the run's tags), then every metric (its latest value) and every param
(`param/<name>`). Written beside the report as `runs.csv`, the export a researcher loads into a notebook."""

from __future__ import annotations

from pathlib import Path

from ..axes import AXES, BY_NAME, read_tags
from ..unit import ANY, NONE
from .read import Run

ID_COLUMNS = ("run_id", "name", "cell")  # cell: the scale as the report groups it ("s-T1500" with several budgets)


def runs_table(runs: list[Run]):
    import pandas as pd

    axes = [a.name for a in AXES]
    metrics = sorted({k for r in runs for k in r.metrics})
    params = sorted({k for r in runs for k in r.params})
    rows = []
    for r in runs:
        row = {"run_id": r.run_id, "name": r.name, "cell": r.scale, **read_tags(r.tags), "group": group_text(r)}
        row.update({m: r.metrics.get(m) for m in metrics})
        row.update({f"param/{p}": r.params.get(p) for p in params})
        rows.append(row)
    columns = [*ID_COLUMNS, *axes, *metrics, *(f"param/{p}" for p in params)]
    return pd.DataFrame(rows, columns=columns)


def write_runs_csv(runs: list[Run], path: Path) -> Path:
    runs_table(runs).sort_values(["cell", "arm", "method", "ratio", "seed", "name"], na_position="first",
                                 kind="stable").to_csv(path, index=False)
    return path


def group_text(r: Run) -> str:
    """The run's comparison group as the report pools it (its headroom.group tag, or the plan's rule for runs
    logged before the tag): `axis=value;…`, `*` where it stands for every value; "none" outside every group."""
    if r.group is None:
        return NONE
    names, wild = r.group
    return ";".join(f"{a}={ANY if a in wild else r.scale if a == 'scale' else BY_NAME[a].to_tag(getattr(r, a))}"
                    for a in names)
