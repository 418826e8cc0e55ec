"""The report's sections on when the extra heads matter: prune timing and the training budget (the tables of
orchestration/report/trends.py, with their plots)."""

from __future__ import annotations

from pathlib import Path

from . import plots
from .render import Doc, fmt_ci, fmt_ratio
from .verdict import CONTROL_NAMES, Report

TIMING_WORDS = {"matches": "pruning early ends as good as pruning the trained model",
                "worse": "pruning early ends worse", "better": "pruning early ends better",
                "inconclusive": "inconclusive", "insufficient_seeds": "one seed: not tested", "reference": "—"}


def _num(v: float | None, fmt: str = "{:.4g}") -> str:
    return "—" if v is None else fmt.format(v)


def timing_section(doc: Doc, rep: Report, plots_dir: Path) -> None:
    doc.h(2, "6a. Prune timing")
    if not rep.timing:
        doc.p("Not tested: the sweep prunes only the trained models (`prune.at` is [1.0]).")
        return
    doc.p(f"Heads removed from the dense run's checkpoint at a fraction p of its T steps (p = 0: at initialisation, "
          f"by the scores of the initial model), the pruned model trained on to T on the dense run's own schedule, "
          f"data order and optimizer moments, then the same recovery fine-tune as at p = 1. Final loss on "
          f"`{rep.timing[0].eval_set}`; the difference to p = 1 is paired by seed. \"Matches\" means the 95% "
          f"interval of that difference lies within ± {rep.tolerance:.0%} of the p = 1 loss. If pruning at a "
          f"small p ends as good as pruning late, the extra heads mattered only early in training — the "
          f"optimisation-help mechanism, measured.")
    for scale, family in sorted({(t.scale, t.family) for t in rep.timing}):
        rows = [t for t in rep.timing if (t.scale, t.family) == (scale, family)]
        for method in sorted({t.method for t in rows}):
            mine = [t for t in rows if t.method == method]
            path = plots_dir / f"timing_{scale}_{family}_{method}.png"
            plots.timing_plot(mine, path, f"{scale} {family}: {method} pruning at p of training")
            doc.img(path, f"{scale} {family}, {method}: final loss against when the heads were removed")
    doc.table(["scale", "family", "ratio", "method", "p", "n", "final loss", "95% CI", "p − (p=1)", "95% CI",
               "pruning early vs late"],
              [[t.scale, t.family, fmt_ratio(t.ratio), t.method, f"{t.prune_at:g}", str(t.n_seeds),
                f"{t.loss_mean:.4f}", fmt_ci(t.loss_ci95), _num(t.vs_late_mean, "{:+.4f}"), fmt_ci(t.vs_late_ci95),
                TIMING_WORDS[t.vs_late]] for t in rep.timing])


def budget_section(doc: Doc, rep: Report, plots_dir: Path) -> None:
    doc.h(2, "6b. Training budget and the crossover")
    tpp = [t for t in rep.trends if t.axis == "tokens_per_param"]
    if not rep.trends:
        doc.p("Not tested: the sweep has one budget at one scale (a trend needs two or more cells).")
        return
    doc.p("The primary gap (control − pruned, after the recovery fine-tune) of every cell (a scale at one budget; "
          "`s-T1500` is scale s trained 1500 steps) and seed, fitted by least squares against log10 of the training "
          "tokens per dense parameter and of the dense parameters. The slope is the change of the gap per decade "
          "(95% t-interval). The crossover is where the fitted gap is 0, reported only inside the swept range, "
          "with the 2.5–97.5 percentiles over bootstrap resamples of the seeds within each cell; it is "
          "*established* only when the slope's interval excludes 0 (a flat trend crosses zero somewhere by chance).")
    for axis in ("tokens_per_param", "params"):
        if any(t.axis == axis for t in rep.trends):
            path = plots_dir / f"trend_{axis}.png"
            plots.trend_plot(rep.trends, axis, path)
            doc.img(path, f"Primary gap against {axis.replace('_', ' ')} with the fitted trend")
    if tpp:
        path = plots_dir / "budget_map.png"
        plots.budget_map(rep.trends, path)
        doc.img(path, "Parameters × training tokens: colour = primary gap, filled where its interval excludes 0")
    rows = []
    for t in rep.trends:
        if t.crossover is not None:
            ci = (f" [{_num(t.crossover_ci95[0], '{:.3g}')}, {_num(t.crossover_ci95[1], '{:.3g}')}]"
                  if t.crossover_ci95 else " (no interval: under 3 seeds a cell)")
            where = f"{t.crossover:.3g}{ci}" + ("" if t.established else
                                                "; not established: the slope's interval includes 0")
        else:
            where = f"none within {t.x_range[0]:.3g}–{t.x_range[1]:.3g}"
        rows.append([t.family, fmt_ratio(t.ratio), CONTROL_NAMES[t.control], t.axis.replace("_", " "),
                     str(len(t.points)), f"{t.slope:+.4f}", fmt_ci(t.slope_ci95), where])
    doc.table(["family", "ratio", "control", "axis", "cells", "gap change / decade", "95% CI", "crossover (95% CI)"],
              rows)
