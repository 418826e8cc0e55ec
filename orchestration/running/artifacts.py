"""The files a prune leaves — in a prune trial's checkpoint (then its MLflow run's artifacts) and in `headroom prune
--out` alike — written by one function: the pruned model, metrics.json, the per-window losses, the head scores and
their heatmap, and the mask-only prune curve."""

from __future__ import annotations

import json
from pathlib import Path

from lightning_modules.models.checkpoints import METRICS_FILE
from orchestration.design.unit import SCORES_FILE, WINDOWS_FILE
from orchestration.report.plots import heatmap, prune_curve_plot

SCORES_PNG = "scores.png"
CURVE_PNG = "prune_curve.png"
RUN_ARTIFACTS = (SCORES_FILE, SCORES_PNG, CURVE_PNG, METRICS_FILE, WINDOWS_FILE)  # what a unit's MLflow run keeps


def write_prune(out: Path, pruned, m: dict, tokenizer, eval_sets: list[str], method: str, title: str) -> None:
    """`run_prune`'s result into `out`: its per-window losses (popped from `m`) to their own file, the rest to
    metrics.json. `title` starts the figures' titles."""
    from lightning_modules.models.build import save_model

    windows = m.pop("windows")
    save_model(pruned, out / "model", tokenizer)
    (out / METRICS_FILE).write_text(json.dumps(m, indent=2) + "\n")
    (out / WINDOWS_FILE).write_text(json.dumps(windows) + "\n")
    (out / SCORES_FILE).write_text(json.dumps({"method": method, "scores": m["scores"], "kept": m["kept"],
                                               "heads_dense": m["heads_dense"]}) + "\n")
    heatmap(m["scores"], out / SCORES_PNG, f"{title}{method} importance")
    if m["prune_curve"]:
        prune_curve_plot(m["prune_curve"], eval_sets or ["val"], out / CURVE_PNG,
                         f"{title}mask-only prune curve ({method})")
