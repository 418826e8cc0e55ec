"""The verdict report: a sweep's MLflow runs → the verdict, with statistics a reviewer can check.

    read.py         MLflow → typed runs (the newest parent, its finished children, histories, per-window losses),
                    and the runs as one table (a column per axis, metric, param): runs.csv
    stats.py        paired intervals over seeds and eval windows; Holm's adjustment
    analysis.py     half (2) comparisons, half (1), prune curves and prunable fractions, best method on val
    diagnostics.py  trust checks: is each scale's verdict about heads, or about models not trained enough?
    summaries.py    gap across scales, cost and compute share, probes, learning rates, eval data
    rows.py         the typed rows of every table (the objects of verdict.json)
    verdict.py      the Report (everything computed once), headlines, terminal summary, parent metrics
    render.py       Markdown and self-contained HTML
    document.py     the report's sections and plots
    plots.py        matplotlib figures (also used by `headroom score`/`prune` and the prune trials)
    publish.py      write reports/<sweep>/ and log it to the parent run
"""

from .analysis import PRIMARY, comparisons
from .publish import write_report
from .read import Run, SweepRuns, Windows, load_sweep_runs
from .verdict import VERDICTS, Report, build, headline_table

__all__ = ["PRIMARY", "VERDICTS", "Report", "Run", "SweepRuns", "Windows", "build", "comparisons", "headline_table",
           "load_sweep_runs", "write_report"]
