"""What the sweep benchmarks share: run a sweep through the real `headroom sweep` machinery in the current
directory (local Ray, MLflow in ./mlflow.db) and read its child runs back."""

from __future__ import annotations

import sys
import time
from pathlib import Path


def run_and_read(sweep, sweep_file: str, sweep_text: str, report: bool = True) -> tuple[float, list] | None:
    """(wall seconds, the sweep's child runs), or None (said on stderr) when the sweep failed. `report`: write
    the verdict report too (part of the wall time)."""
    from mlflow.tracking import MlflowClient

    from orchestration.running.stages import run_sweep

    t0 = time.time()
    rc = run_sweep(sweep, sweep_file, sweep_text, progress=False, write_report=report)
    wall = time.time() - t0
    if rc != 0:
        print("the sweep failed", file=sys.stderr)
        return None
    c = MlflowClient(tracking_uri=f"sqlite:///{Path('mlflow.db').resolve()}")
    exp = c.get_experiment_by_name(sweep.name)
    runs = [r for r in c.search_runs([exp.experiment_id], max_results=5000) if "mlflow.parentRunId" in r.data.tags]
    return wall, runs
