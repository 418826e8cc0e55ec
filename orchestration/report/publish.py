"""`headroom report`: the sweep's newest parent run → reports/<sweep>/ (verdict.json, report.md with plots/,
report.html, runs.csv: a row per child run), the same files as artifacts of the parent run (`report/`), the
headline numbers as its metrics and the headline as its description (the note the MLflow UI shows)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from lightning_modules.declarations.config import jsonable
from orchestration.design.spec import report_dir

from .document import render
from .read import Windows, client, load_sweep_runs, scores_of, write_runs_csv
from .summaries import heatmap_runs
from .verdict import Report, build, headline_markdown, headline_metrics

ARTIFACTS = "report"  # the parent run's artifact folder of the report


def write_report(uri: str, sweep_name: str, out: Path | None = None, log: bool = True) -> tuple[Path, Report]:
    """Build the report of the sweep's newest parent, write it to `out` (default reports/<sweep>/) and log it to
    the parent run. Raises HeadroomInputError when there is nothing to report (before writing anything)."""
    data = load_sweep_runs(uri, sweep_name)
    rep = build(data, Windows(uri))
    out = Path(out or report_dir(sweep_name)).resolve()
    out.mkdir(parents=True, exist_ok=True)
    scores = {r.run_id: scores_of(uri, r) for r in heatmap_runs(data.runs)}  # the heatmaps' data, fetched here
    doc = render(rep, out, scores)
    (out / "verdict.json").write_text(json.dumps(jsonable(rep.verdict_json()), indent=2) + "\n")
    (out / "report.md").write_text(doc.markdown(out) + "\n")
    (out / "report.html").write_text(doc.html())
    write_runs_csv(data.runs, out / "runs.csv")
    if log:
        from mlflow.entities import Metric

        c = client(uri)
        c.log_artifacts(data.parent_id, str(out), ARTIFACTS)
        c.set_tag(data.parent_id, "mlflow.note.content", headline_markdown(rep, ARTIFACTS))  # the run's description
        now = int(time.time() * 1000)
        ms = [Metric(k, float(v), now, 0) for k, v in headline_metrics(rep).items()]
        for i in range(0, len(ms), 1000):
            c.log_batch(data.parent_id, metrics=ms[i:i + 1000])
    return out, rep
