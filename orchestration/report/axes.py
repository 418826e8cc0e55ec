"""The report's sections on when the extra heads matter: prune timing and the training budget (the tables of
orchestration/report/trends.py, with their plots)."""

from __future__ import annotations

from pathlib import Path

from lightning_modules.declarations.arms import ARMS
from lightning_modules.declarations.arms import label as arm_label

from . import plots
from .analysis import PRIMARY
from .render import Doc, fmt_ci, fmt_p, fmt_ratio
from .rows import group_label
from .verdict import Report

PRIMARY_WORDS = f"{PRIMARY['method']}, {PRIMARY['scope'].replace('_', ' ')}, {PRIMARY['schedule'].replace('_', ' ')}, " \
    f"eval set `{PRIMARY['eval_set']}`"
TIMING_WORDS = {"matches": "pruning early ends as good as pruning the trained model (within the margin)",
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
          f"`{rep.timing[0].eval_set}`; the difference to p = 1 is paired by seed. \"Worse\" or \"better\" when its "
          f"95% interval excludes 0 (decided first); \"matches\" when the interval lies within ± the equivalence "
          f"margin, half the cell's |Scratch-E gap| (column `margin`: the effect under study; no Scratch-E, no "
          f"margin and no \"matches\"); otherwise inconclusive. If pruning at a small p ends as good as pruning "
          f"late, the extra heads mattered only early in training — the optimisation-help mechanism, measured.")
    for scale, family in sorted({(t.scale, t.family) for t in rep.timing}):
        rows = [t for t in rep.timing if (t.scale, t.family) == (scale, family)]
        for method, group in sorted({(t.method, tuple(t.group.items())) for t in rows}):  # a plot per axis value
            mine = [t for t in rows if (t.method, tuple(t.group.items())) == (method, group)]
            what = method + (f" ({group_label(dict(group))})" if group else "")
            path = plots_dir / f"timing_{scale}_{family}_{method}{''.join(f'_{a}{v}' for a, v in group)}.png"
            plots.timing_plot(mine, path, f"{scale} {family}: {what} pruning at p of training")
            doc.img(path, f"{scale} {family}, {what}: final loss against when the heads were removed")
    doc.table(["scale", "family", "ratio", "method", "p", "n", "final loss", "95% CI", "p − (p=1)", "95% CI",
               "margin", "pruning early vs late", "Scratch-E − pruned", "95% CI (seeds, unadjusted)",
               "vs Scratch-E (unadjusted)"],
              [[t.scale, t.family, fmt_ratio(t.ratio), t.method + (f" ({group_label(t.group)})" if t.group else ""),
                f"{t.prune_at:g}", str(t.n_seeds),
                f"{t.loss_mean:.4f}", fmt_ci(t.loss_ci95), _num(t.vs_late_mean, "{:+.4f}"), fmt_ci(t.vs_late_ci95),
                _num(t.margin, "{:.4f}"), TIMING_WORDS[t.vs_late], _num(t.vs_scratch_e_mean, "{:+.4f}"),
                fmt_ci(t.vs_scratch_e_ci95), t.vs_scratch_e.replace("_", " ")] for t in rep.timing])
    doc.p("Scratch-E − pruned: the heads removed at p against the same structure trained from scratch for T steps "
          "(Behnke & Heafield 2020's lottery question), paired by seed; supported (pruning at p better) or refuted "
          "when the 95% interval excludes 0. These intervals are over seeds only (the eval windows' variance is "
          "not added) and unadjusted for the number of rows: a screen, weaker evidence than section 3's verdicts.")


def _crossovers(t) -> str:
    out = []
    for g in t.groups or []:
        label = g["group"] if t.fit == "within_scales" else f"T{t.budget}" if t.budget else "all scales"
        if g["crossover"] is None:
            lo, hi = g["x_range"]
            out.append(f"{label}: none within {_num(lo, '{:.3g}')}–{_num(hi, '{:.3g}')}")
            continue
        ci = g["crossover_ci95"]
        where = f"{g['crossover']:.3g}" + (f" [{_num(ci[0], '{:.3g}')}, {_num(ci[1], '{:.3g}')}]" if ci else
                                           " (no interval)")
        out.append(f"{label}: {where}" + ("" if g["established"] else ", not established"))
    return "; ".join(out)


def _trend_rows(trends) -> list[list]:
    return [[t.family, fmt_ratio(t.ratio), arm_label(t.control), t.fit.replace("_", " "), str(t.n_cells),
             ", ".join(t.excluded or []) or "—", "—" if t.slope is None else f"{t.slope:+.4f}",
             fmt_ci(t.slope_ci95) if t.slope_ci95 else "no interval", str(t.df), _crossovers(t),
             ", ".join(t.unverified_cells or []) or "—"] for t in trends]


TREND_HEAD = ["family", "ratio", "control", "fit", "cells used", "left out (check failed)", "gap change / decade",
              "95% CI", "df", "crossover per group (95% CI)", "cells unverified"]
FIT_TEXT = ("Each cell (a scale at one budget; `s-T1500` is scale s trained 1500 steps) contributes its mean primary "
            "gap over seeds (control − pruned, after the recovery fine-tune): the cell, not the seed, is the unit "
            "of inference, since a cell deviates from any line by more than seed noise and a seed shares its "
            "initialisation and data order across a scale's budgets. Least squares on the cell means with one "
            "intercept per group and a common slope per decade; the slope's 95% t-interval has n_cells − "
            "n_groups − 1 degrees of freedom, and none is given without a residual degree of freedom. A crossover "
            "is where a group's line is 0 inside its swept range, with Fieller's 95% interval; it is "
            "*established* only when the slope's interval excludes 0. Cells whose trust checks failed (section 2) "
            "are left out and listed; cells whose checks could not run are used and listed.")


def across_scales_section(doc: Doc, rep: Report, plots_dir: Path) -> None:
    doc.h(2, "6. Across scales")
    rows = [t for t in rep.trends if t.axis == "params"]
    scales = sorted({p.cell.scale for t in rep.trends for p in t.points})
    if not rows:
        doc.p(f"Not tested: a slope across model sizes needs at least three scales at one budget (this sweep fits "
              f"{len(scales)}: {', '.join(scales) or 'none'}); with two, any difference between two architectures "
              f"would be read as an effect of size. The per-cell gaps are in sections 3 and 6b.")
        return
    doc.p("The primary gap against log10 non-embedding parameters, one fit per training budget (step count) with "
          "three or more scales, one cell per scale: the scales are the independent units, n_scales − 2 degrees "
          "of freedom. At one step count the tokens per parameter fall as the size grows, so this slope mixes size "
          "with budget; the within-scale slope (6b) says how much the budget alone moves the gap. " + FIT_TEXT)
    path = plots_dir / "trend_params.png"
    plots.trend_plot(rep.trends, "params", path)
    doc.img(path, "Primary gap against model size with the fitted lines")
    doc.table(TREND_HEAD, _trend_rows(rows))


def budget_section(doc: Doc, rep: Report, plots_dir: Path) -> None:
    doc.h(2, "6b. Training budget and the crossover")
    tpp = [t for t in rep.trends if t.axis == "tokens_per_param"]
    if not tpp:
        doc.p("Not tested: no scale is swept at two or more budgets (a trend within a scale needs two or more "
              "cells of it).")
        return
    doc.p("The primary gap against log10 training tokens per non-embedding parameter of the dense model (Kaplan "
          "et al. 2020's N: embeddings are half of a small model's parameters with a large vocabulary), one "
          "intercept per scale: the slope is how the gap moves with the budget inside a scale. " + FIT_TEXT)
    path = plots_dir / "trend_tokens_per_param.png"
    plots.trend_plot(rep.trends, "tokens_per_param", path)
    doc.img(path, "Primary gap against training tokens per parameter with the fitted lines (hollow: left out)")
    path = plots_dir / "budget_map.png"
    plots.budget_map(rep.trends, path)
    doc.img(path, "Parameters × training tokens: colour = primary gap, filled where its interval excludes 0")
    doc.table(TREND_HEAD, _trend_rows(tpp))
    for t in tpp:
        if t.note:
            doc.p(f"{t.family} r{t.ratio:g} vs {arm_label(t.control)}: {t.note}.")


def recovery_section(doc: Doc, rep: Report, plots_dir: Path) -> None:
    doc.h(2, "6c. Recovery budget and objective")
    f, kind = rep.primary_recovery
    how = "by distillation from the dense model" if kind == "distill" else "on the LM loss"
    if not rep.recovery:
        doc.p(f"One recovery: {f} fine-tune steps {how} (the primary comparison's). A sweep with `prune."
              "finetune_steps: [...]` or `prune.recovery: [lm, distill]` gives the pruned arm each recovery and "
              "each its own budget-matched Scratch-B.")
        return
    doc.p(f"The primary gap (control − pruned, {PRIMARY_WORDS}) after each recovery the sweep ran: F fine-tune "
          "steps on the LM loss (lm) or on the KL divergence to the dense teacher's logits (distill). Scratch-B "
          "and Scratch-KD are matched to each F and objective (the teacher's forward passes counted); Scratch-E and "
          f"wide stand for all. Sections 1–6b are at the primary recovery, the strongest the sweep file declares: {f} "
          f"steps {how}. A budget's gap has a sign (+: pruning better, −: the control better) when its interval "
          "at the Bonferroni level 1 − 0.05/k over the k budgets excludes 0; a change of sign is stated only "
          "between two budgets whose signs are both established and opposite.")
    for taught in dict.fromkeys(arm_label(c.control) for c in rep.recovery if ARMS[c.control].teacher):
        doc.p(f"{taught}'s budget includes the dense training the pruned arm spent, and that training also made "
              f"the teacher {taught} learns from, unpaid a second time: the match favours {taught}. A gap in its "
              "favour may be that margin; one in the pruned arm's favour holds against more than equal compute.")
    for scale, family in sorted({(c.scale, c.family) for c in rep.recovery}):
        rows = [c for c in rep.recovery if (c.scale, c.family) == (scale, family)]
        path = plots_dir / f"recovery_{scale}_{family}.png"
        plots.recovery_plot(rows, path, f"{scale} {family}: primary gap against the recovery budget")
        doc.img(path, f"{scale} {family}: control − pruned after F recovery steps (95% interval over seeds)")
    doc.table(["scale", "family", "ratio", "control", "objective", "F", "n", "pruned", "control", "diff", "95% CI",
               "verdict (raw)"],
              [[c.scale, c.family, fmt_ratio(c.ratio), _control(c), c.recovery, str(c.finetune_steps),
                str(c.n_seeds), f"{c.pruned_loss:.4f}", f"{c.control_loss:.4f}", f"{c.diff_mean:+.4f}",
                fmt_ci(c.ci95), c.verdict_raw] for c in rep.recovery])
    if rep.recovery_trends:
        doc.table(["scale", "family", "ratio", "control", "objective", "F", "sign per F", "change of sign"],
                  [[t.scale, t.family, fmt_ratio(t.ratio), _control(t), t.recovery,
                    ", ".join(map(str, t.budgets)), " ".join("+" if x > 0 else "−" if x < 0 else "0" for x in t.signs),
                    f"between F={t.change[0]} and F={t.change[1]}" if t.change else "none established"]
                   for t in rep.recovery_trends])


def _control(row) -> str:
    """A row's control, with the row's values of the axes registered beyond the built-in ones."""
    label = group_label(row.group)
    return arm_label(row.control) + (f" ({label})" if label else "")


def scorer_section(doc: Doc, rep: Report) -> None:
    doc.h(2, "6d. Which scorer")
    ref = PRIMARY["method"]
    if rep.stability:
        doc.p("How stable each method's head ranking is: the calibration batches split into halves, the heads scored "
              "on each alone. Spearman over the heads the scope ranks together (per layer: the mean of the layers'), "
              "its lowest seed and lowest layer; the overlap of the two halves' pruned sets at each ratio, against "
              "what two random choices share (chance). Information, not a trust check: the prune used every batch.")
        ratios = sorted({r for x in rep.stability for r in x.overlap})
        doc.table(["scale", "family", "method", "scope", "n", "Spearman", "lowest seed", "lowest layer",
                   *(f"overlap r{r:g} (chance)" for r in ratios)],
                  [[x.scale, x.family, x.method, x.scope, str(x.n_seeds), _num(x.spearman, "{:.2f}")
                    + (" **low**" if x.low else ""), _num(x.spearman_lowest_seed, "{:.2f}"),
                    _num(x.spearman_layer_min, "{:.2f}"),
                    *(f"{x.overlap[r]:.2f} ({x.chance[r]:.2f})" if r in x.overlap else "—" for r in ratios)]
                   for x in rep.stability])
        low = [f"{x.scale} {x.method} ({x.scope})" for x in rep.stability if x.low]
        if low:
            doc.p("Low (Spearman below 0.5): " + ", ".join(low) + ". Half the calibration data ranks these heads "
                  "differently from the other half; a comparison that rests on their order rests on noise.")
    else:
        doc.p("Not measured: no prune run of a method that reads data recorded its split-half agreement.")
    if not rep.method_gaps:
        doc.p(f"One method (or none besides `{ref}`): no comparison of scorers. `sweeps/methods.yaml` prunes the "
              "same dense models with every method.")
        return
    doc.p(f"Each method's loss before fine-tune (the masked model: its choice of heads alone) minus `{ref}`'s, "
          "paired by seed (positive: its heads lose more), eval set `id`. Worse/better when the Holm-adjusted p over "
          "the methods of the row's group ≤ 0.05; else indistinguishable.")
    doc.table(["scale", "family", "ratio", "scope", "schedule", "method", "n", "loss", f"{ref}", "diff", "95% CI",
               "p (Holm)", "verdict"],
              [[g.scale, g.family, fmt_ratio(g.ratio), g.scope, g.schedule, g.method, str(g.n_seeds),
                f"{g.method_loss:.4f}", f"{g.reference_loss:.4f}", f"{g.diff_mean:+.4f}", fmt_ci(g.ci95),
                fmt_p(g.p_holm), g.verdict] for g in rep.method_gaps if g.eval_set == PRIMARY["eval_set"]])
