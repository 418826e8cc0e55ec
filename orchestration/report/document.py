"""The report's document: twelve sections built from a Report, with their plots (orchestration/report/plots.py) drawn
into the output folder. The text says how every number was made; the numbers come from the Report unchanged."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from lightning_modules.declarations.arms import control_names
from lightning_modules.declarations.arms import label as arm_label

from . import axes, plots
from .analysis import PRIMARY, eval_sets, is_primary
from .render import Doc, fmt_ci, fmt_p, fmt_ratio
from .rows import group_label
from .summaries import heatmap_runs, series
from .verdict import STATE_WORDS, Report


@dataclass(frozen=True)
class _Page:
    plots: Path  # where the PNGs go
    sets: list[str]  # eval sets, id first
    scale_families: list[tuple[str, str]]
    ft: int  # the recovery fine-tune's steps (the primary comparison's)
    scores: dict  # run id -> head scores [layers][heads] of the runs summaries.heatmap_runs picks (fetched already)


def render(rep: Report, out: Path, scores: dict | None = None) -> Doc:
    """Plots into out/plots/, and the document: it renders what `rep` holds and the head scores it is given
    (run id -> scores; publish.py fetches them), and computes and fetches nothing."""
    d = rep.data
    pg = _Page(out / "plots", eval_sets(d.runs), rep.scale_families(),
               max((c.finetune_steps for c in rep.comparisons), default=0), scores or {})
    pg.plots.mkdir(parents=True, exist_ok=True)
    doc = Doc(f"headroom verdict: sweep {d.sweep}")
    doc.p(f"The claim: many attention heads of a trained transformer can be removed with little loss (half 1), yet "
          f"the smaller head count trained from scratch does worse (half 2: over-provisioning). Spec "
          f"`{d.spec_hash}`, MLflow parent run `{d.parent_id}`; {len(d.runs)} finished unit(s). Losses are "
          f"mean per-token cross-entropy (nats; lower is better). Differences are control − pruned, paired by seed: "
          f"positive means pruning wins. Intervals are 95% Student-t intervals whose standard error adds the "
          f"sampling variance of the eval windows to the spread over seeds (section 9); a scale's primary "
          f"comparisons are Holm-adjusted as one family.")
    if d.missing:
        doc.p(f"**Partial report**: {len(d.missing)} planned unit(s) have no finished run; rows that need them "
              f"are absent. Missing: " + ", ".join(f"`{m}`" for m in d.missing[:40])
              + (" …" if len(d.missing) > 40 else ""))
    for section in (_headline, _pays, _diagnostics, _comparisons, _replication, _curves, _across_scales, _timing, _budget,
                    _recovery, _probes, _learning_rates, _evaluation, _cost):
        section(doc, rep, pg)
    return doc


def _headline(doc: Doc, rep: Report, pg: _Page) -> None:
    """Section 1. headline."""
    doc.h(2, "1. Headline")
    doc.p(f"Primary comparison: method `{PRIMARY['method']}`, scope `{PRIMARY['scope']}`, schedule "
          f"`{PRIMARY['schedule']}`, after {pg.ft} recovery fine-tune steps, eval set `{PRIMARY['eval_set']}`. "
          f"Half (1) uses the loss before fine-tune, within the sweep's declared tolerance of "
          f"{rep.tolerance:.0%} of dense. Half (2) is stated per control (Holm-adjusted over the scale's ratios × "
          f"controls). A scale whose trust diagnostics fail (section 2) is **untrustworthy**, one whose checks could "
          f"not all run is **unverified**: no verdict is given on either.")
    lines, table = [], []
    swept = [a for a in control_names() if any(c.control == a for c in rep.primary())]  # the controls trained
    # a row per ratio and value of every axis registered beyond the built-in ones (none: one row per ratio)
    labelled = any(c.group for c in rep.primary())
    for scale, family in pg.scale_families:
        lines.append(f"**{scale} {family}**: {rep.headline(scale, family)}.")
        for ratio in sorted({c.ratio for c in rep.prunable if (c.scale, c.family) == (scale, family)}):
            h1 = [p for p in rep.prunable if (p.scale, p.family, p.ratio) == (scale, family, ratio)
                  and is_primary(p, "eval_set", "scope", "schedule")]
            mine = [c for c in rep.primary() if (c.scale, c.family, c.ratio) == (scale, family, ratio)]
            for label in dict.fromkeys(group_label(c.group) for c in mine) or [""]:
                prim = {c.control: c for c in mine if group_label(c.group) == label}
                table.append([scale, family, fmt_ratio(ratio), *([label or "—"] if labelled else []),
                              ", ".join(f"{p.method} {p.verdict}" for p in h1
                                        if not labelled or group_label(p.group) == label) or "—",
                              *[(f"{prim[a].verdict} ({prim[a].diff_mean:+.4f}, simultaneous "
                                 f"{fmt_ci(prim[a].ci95_simultaneous)}, p_Holm {fmt_p(prim[a].p_holm)})"
                                 if a in prim else "—") for a in swept]])
    doc.items(lines)
    doc.table(["scale", "family", "ratio", *(["group"] if labelled else []),
               "half (1): prunable before fine-tune (id)",
               *[f"half (2) vs {arm_label(a)}: verdict (diff, simultaneous CI, Holm p)" for a in swept]],
              table)
    if not rep.comparisons:
        doc.p("Half (2) was not tested: the sweep has no controls trained from scratch.")


def _diagnostics(doc: Doc, rep: Report, pg: _Page) -> None:
    """Section 2. trust diagnostics."""
    doc.h(2, "2. Trust diagnostics")
    trust = rep.data.spec.trust if rep.data.spec is not None else None
    doc.p("Checks that the models are trained enough for the question (orchestration/report/diagnostics.py). A failed "
          "check makes the scale's headline untrustworthy; a check that could not run (the sweep lacks the arm, "
          "method, budget or seeds it needs) makes it unverified; not applicable: the question does not arise (the "
          "smallest scale has no smaller one). Dense vs Scratch-E and larger vs smaller scale are non-inferiority "
          "tests: they pass only when the upper 95% bound of the loss difference is at most the declared margin"
          + (f" ({trust.margin:.0%} of the reference loss; `trust.margin`)" if trust else "") + ". `converged` "
          "compares the dense model with the same model trained to a smaller budget on its own schedule"
          + (f" (at most {trust.doubling_gain:.0%} gained per doubling; `trust.doubling_gain`)" if trust else "")
          + ".")
    doc.table(["scale", "family", "check", "result", "detail"],
              [[g.scale, g.family, g.check, STATE_WORDS[g.state], g.detail] for g in rep.diagnostics])


def _comparisons(doc: Doc, rep: Report, pg: _Page) -> None:
    """Section 3. prune vs control."""
    doc.h(2, "3. Pruned vs controls at matched head counts")
    doc.p("Each row pairs the pruned models with the controls of the same seeds. `pre-FT` is the masked model before "
          "recovery fine-tuning; `best on val` is the method with the lowest validation loss after fine-tuning "
          "(chosen on the validation set, never an eval set). Verdicts: supported (pruned better, CI above 0), "
          "refuted (control better, CI below 0), inconclusive, insufficient_seeds (n < 2, no interval). The primary "
          "rows' verdicts are Holm-adjusted (`p Holm`: the scale's ratios × controls are one family); `step-down "
          "CI` is the interval at the level of the Holm step that tested the row (the last steps' is the unadjusted "
          "95% one: not simultaneous), `simultaneous CI` the family's Bonferroni intervals (1 − 0.05/m each: all m "
          "cover together with probability ≥ 95%; the headline quotes these); secondary rows are unadjusted.")
    forest = pg.plots / "comparisons.png"
    plots.forest_plot([c for c in rep.comparisons if is_primary(c)], forest)
    doc.img(forest, "Primary method: control − pruned loss on id, mean and 95% CI per ratio and control "
                    "(right of 0: pruning wins)")
    main_rows, second = [], []
    labelled = any(c.group for c in rep.comparisons)  # a column for the axes registered beyond the built-in ones
    for c in rep.comparisons:
        best = rep.best.get((c.scale, c.family, c.ratio, c.scope, c.schedule, tuple(c.group.items())))
        is_best = best is not None and best[0] == c.method
        label = c.method + (" (best on val)" if is_best else "")
        row = [c.scale, c.family, fmt_ratio(c.ratio), c.heads_dense, c.heads_kept, label,
               c.scope, c.schedule, *([group_label(c.group) or "—"] if labelled else []),
               "pre-FT" if c.finetune_steps == 0 and pg.ft else c.finetune_steps,
               arm_label(c.control), c.eval_set, c.n_seeds, c.pruned_loss, c.control_loss,
               f"{c.diff_mean:+.4f}", fmt_ci(c.ci95), fmt_p(c.p_value), fmt_ci(c.ci95_holm), fmt_ci(c.ci95_simultaneous), fmt_p(c.p_holm),
               c.verdict]
        main_method = c.method == PRIMARY["method"] or is_best
        if main_method and is_primary(c, "scope", "schedule", "eval_set"):
            main_rows.append(row)
        else:
            second.append(row)
    head = ["scale", "family", "ratio", "H", "kept", "method", "scope", "schedule", *(["group"] if labelled else []),
            "fine-tune", "control", "set",
            "n", "pruned", "control", "diff", "95% CI", "p", "step-down CI", "simultaneous CI", "p Holm", "verdict"]
    doc.table(head, main_rows)
    if second:
        doc.h(3, "Secondary combinations")
        doc.p("Other methods, scopes, schedules and eval sets. Secondary: reported, not the headline.")
        doc.table(head, second)


def _replication(doc: Doc, rep: Report, pg: _Page) -> None:
    """Section 4. replication across eval sets."""
    doc.h(2, "4. Eval-set replication")
    if len(pg.sets) < 2:
        doc.p("Replication was not tested: the data source offers no shifted eval set.")
    else:
        rows = [[r.scale, r.family, fmt_ratio(r.ratio), arm_label(r.control) + (f" ({group_label(r.group)})"
                                                                                if r.group else ""),
                 *[f"{r.per_set[s][0]} ({r.per_set[s][1]:+.4f})" if s in r.per_set else "—" for s in pg.sets],
                 "yes" if r.agree else "**no**"] for r in rep.replication]
        doc.p(f"The primary comparison on every eval set ({', '.join(pg.sets)}): the verdicts agree in "
              f"{sum(r.agree for r in rep.replication)} of {len(rows)} case(s). Disagreement would make a verdict a "
              "benchmark artifact.")
        doc.table(["scale", "family", "ratio", "control", *pg.sets, "agree"], rows)


def _curves(doc: Doc, rep: Report, pg: _Page) -> None:
    """Section 5. prune curves."""
    doc.h(2, "5. Prune curves")
    doc.p(f"Loss vs fraction of heads removed, mask only (no fine-tune; the heads ranked once by each method), mean "
          f"over seeds with a 95% band; crosses: the swept ratios after {pg.ft} fine-tune steps. The prunable fraction "
          f"is the largest ratio up to which the mean curve stays within {rep.tolerance:.0%} of dense (Michel et "
          f"al. 2019 report about 20% for WMT and 40% for BERT with no noticeable loss).")
    frac_rows = []
    for scale, family in pg.scale_families:
        for ev in pg.sets[:2]:
            rows = [c for c in rep.curves if (c.scale, c.family, c.eval_set) == (scale, family, ev)
                    and is_primary(c, "scope", "schedule")]
            if not rows:
                rows = [c for c in rep.curves if (c.scale, c.family, c.eval_set) == (scale, family, ev)]
            if not rows:
                continue
            path = pg.plots / f"prune_curve_{scale}_{family}_{ev}.png"
            plots.curves_plot(rows, rep.tolerance, path, f"{scale} {family}, eval set {ev}")
            doc.img(path, f"Prune curves, {scale} {family}, eval set {ev}")
        for (s, f, method, scope, schedule, ev, group), frac in sorted(rep.fractions.items()):
            if (s, f) == (scale, family):
                frac_rows.append([s, f, method + (f" ({group_label(dict(group))})" if group else ""), scope, schedule,
                                  ev, fmt_ratio(frac)])
    doc.table(["scale", "family", "method", "scope", "schedule", "set", "prunable fraction"], frac_rows)
    h1_rows = [[p.scale, p.family, p.method, p.scope, p.schedule, p.eval_set, fmt_ratio(p.ratio),
                p.n_seeds, p.dense_loss, p.pruned_loss, p.verdict] for p in rep.prunable]
    doc.h(3, "Half (1) at the swept ratios")
    doc.table(["scale", "family", "method", "scope", "schedule", "set", "ratio", "n", "dense", "pruned (pre-FT)",
               "verdict"], h1_rows)


def _fmt_f(x) -> str:
    return "open" if x is None else f"{x:,.0f}"


def _pays(doc: Doc, rep: Report, pg: _Page) -> None:
    """Section 1a. when a pruned start pays (report/curves.py); only for a sweep with a recovery ladder."""
    if not rep.break_even and not rep.savings:
        return
    from orchestration.design.unit import scale_rank

    doc.h(2, "1a. When a pruned start pays: the recovery curve, counted both ways")
    doc.p("Parent counted: the gap control − pruned after F recovery steps, against Scratch-E (T steps from scratch) "
          "and against Scratch-B(F) (from scratch to the whole pruned arm's compute, the dense training included). "
          "Bands are simultaneous over each curve's budgets (Bonferroni). `pays`: from the band's upper break-even "
          "end on, pruning is shown not worse; `parity`: not shown worse, not shown as good; `worse`: the control "
          "is better at every F. F* is where the mean crosses 0 (descriptive: with few seeds a curve crosses by "
          "noise). Parent free: the from-scratch steps of the pruned shape whose loss the pruned start reaches "
          "(each seed's own from-scratch curve), as a multiple of F, geometric mean over seeds with its 95% "
          "interval.")
    order = sorted({r.scale for r in rep.break_even}, key=lambda s: scale_rank(next(
        c.scale for c in rep.comparisons if str(c.scale) == s)))
    if rep.break_even:
        path = pg.plots / "break_even.png"
        plots.break_even_plot(rep.break_even, order, path)
        doc.img(path, "control − pruned against the recovery budget F, per scale, with simultaneous bands")
        path = pg.plots / "gap_by_size.png"
        plots.gap_by_size_plot(rep.break_even, order, path)
        doc.img(path, "control − pruned against the scale at matched F (the same step of each scale's ladder)")
        doc.table(["scale", "family", "ratio", "control", "F", "control − pruned at each F", "state", "F* (mean)",
                   "F* interval", "note"],
                  [[b.scale, b.family, fmt_ratio(b.ratio), arm_label(b.control), " ".join(map(str, b.budgets)),
                    " ".join(f"{d:+.3f}" for d in b.diffs), b.state, _fmt_f(b.break_even),
                    f"[{_fmt_f(b.break_even_ci[0])}, {_fmt_f(b.break_even_ci[1])}]" if b.break_even_ci else "—",
                    b.note] for b in rep.break_even])
    if rep.savings:
        doc.table(["scale", "family", "ratio", "F", "seeds", "from-scratch steps matched (per seed)",
                   "savings factor S/F", "95% CI", "curve spans"],
                  [[x.scale, x.family, fmt_ratio(x.ratio), x.finetune_steps, x.n_seeds,
                    ", ".join("—" if v is None else f"{v:,.0f}" for v in x.scratch_steps),
                    x.bound if x.factor is None else f"{x.factor:.3g}×",
                    f"[{x.factor_ci95[0]:.3g}, {x.factor_ci95[1]:.3g}]" if x.factor_ci95 else "—",
                    f"{x.curve_range[0]}–{x.curve_range[1]} steps"] for x in rep.savings])


def _across_scales(doc: Doc, rep: Report, pg: _Page) -> None:
    """Section 6. across scales."""
    axes.across_scales_section(doc, rep, pg.plots)


def _timing(doc: Doc, rep: Report, pg: _Page) -> None:
    """Section 6a. prune timing."""
    axes.timing_section(doc, rep, pg.plots)


def _budget(doc: Doc, rep: Report, pg: _Page) -> None:
    """Section 6b. the training budget."""
    axes.budget_section(doc, rep, pg.plots)


def _recovery(doc: Doc, rep: Report, pg: _Page) -> None:
    """Sections 6c. the recovery budget and objective, 6d. which scorer."""
    axes.recovery_section(doc, rep, pg.plots)
    axes.scorer_section(doc, rep)


def _probes(doc: Doc, rep: Report, pg: _Page) -> None:
    """Section 7. probes."""
    d = rep.data
    doc.h(2, "7. Mechanism probes")
    if not rep.probes:
        doc.p("Not measured: the sweep has no `probes` section.")
    else:
        doc.p("Measured by the dense runs while training. Importance over training: at each probed step the heads are "
              "scored and a mask-only curve on validation batches gives the prunable fraction at that step; the "
              "spread is the coefficient of variation of head importance. Redundancy: mean pairwise linear CKA of the "
              "outputs of the heads of a layer (1 = linearly equivalent), at initialisation and after training.")
        path = pg.plots / "probes_importance.png"
        plots.probes_plot({k: {m: series(v) for m, v in by_metric.items()} for k, by_metric in rep.probes.items()},
                          path)
        doc.img(path, "Prunable fraction and spread of head importance vs training step (mean over seeds, 95% band)")
        doc.table(["scale", "family", "prunable fraction at init", "lowest after init", "at the end",
                   "slack appears late"],
                  [[p.scale, p.family, fmt_ratio(p.init), f"{p.low:.2f} (step {p.low_step})",
                    f"{p.end:.2f} (step {p.end_step})",
                    "yes: the fraction grows again after its low" if p.late else "no"] for p in rep.slack])
        if rep.redundancy:
            path = pg.plots / "probes_redundancy.png"
            plots.redundancy_plot({(r.scale, r.family): ((r.init, r.init_ci95), (r.trained, r.trained_ci95))
                                   for r in rep.redundancy}, path)
            doc.img(path, "Mean pairwise CKA of head outputs at initialisation and after training (mean over seeds, "
                          "95% CI)")
            words = {"supported": "more similar at init", "refuted": "more similar after training"}
            doc.table(["scale", "family", "n", "CKA at init", "CKA trained", "init − trained", "95% CI", "heads are"],
                      [[r.scale, r.family, r.n_seeds, r.init, r.trained, f"{r.diff_mean:+.4f}", fmt_ci(r.ci95),
                        words.get(r.verdict, r.verdict)] for r in rep.redundancy])
    heat = [r for r in heatmap_runs(d.runs) if pg.scores.get(r.run_id) is not None]
    if heat:
        doc.h(3, "Head importance (layers × heads)")
        doc.p("From the prune runs' calibration scores, lowest seed, one per scale and method (heads of different "
              "seeds are not aligned, so scores are not averaged).")
        for run in heat:
            path = pg.plots / f"heatmap_{run.scale}_{run.family}_{run.method}.png"
            plots.heatmap(pg.scores[run.run_id], path,
                          f"{run.scale} {run.family} seed {run.seed}: {run.method} importance")
            doc.img(path, f"{run.method} importance, {run.scale} {run.family}, seed {run.seed}")


def _learning_rates(doc: Doc, rep: Report, pg: _Page) -> None:
    """Section 8. learning rates."""
    doc.h(2, "8. Learning rates")
    doc.p("Every arm's peak learning rate and where it came from: `preset` (the scale's), `sweep` (one number for "
          "all), `searched` (Optuna over this architecture, the same trials and steps for every architecture; "
          "`searched:<arch>` for a global prune's controls, which take the rate of the uniform shape with the same "
          "ratio). A pruned arm trains at its dense model's rate; its recovery fine-tune's rate is the sweep's or "
          "chosen on the validation split from a grid of multiples of the dense rate. Without a search every arm "
          "trains at the same rate, tuned for none of them.")
    doc.table(["scale", "family", "arm", "ratio", "scope", "heads × head_dim", "runs", "lr", "source",
               "fine-tune lr", "fine-tune source"],
              [[x.scale, x.family, x.arm, "—" if x.ratio is None else fmt_ratio(x.ratio), x.scope,
                x.arch, x.runs, ", ".join(f"{v:.3g}" for v in x.lr) or "—", ", ".join(x.lr_source),
                ", ".join(f"{v:.3g}" for v in x.finetune_lr) or "—", ", ".join(x.finetune_lr_source) or "—"]
               for x in rep.learning_rates])


def _evaluation(doc: Doc, rep: Report, pg: _Page) -> None:
    """Section 9. evaluation and statistics."""
    doc.h(2, "9. Evaluation data and statistics")
    doc.p("Every run is scored on the same windows of each eval set: every window of the split (up to a stated cap "
          "of 2^20 tokens, or the sweep's `eval_batches`), leaving out windows whose tokens also occur verbatim "
          "in the training stream (documents repeated across splits are removed before splitting; shared "
          "boilerplate can remain). Tokens scored per run and windows left out:")
    doc.table(["scale", "family", "eval set", "tokens per run", "windows left out (in train)"],
              [[e.scale, e.family, e.eval_set, e.tokens, e.windows_excluded] for e in rep.evaluation])
    shares = [c.window_share for c in rep.primary() if c.window_share is not None]
    if shares:
        doc.p(f"Which windows an eval set happens to hold is a second source of chance besides the seeds. Each "
              f"interval's standard error adds the windows' sampling variance (per-window losses, paired across "
              f"arms) to the spread over seeds. In the primary comparisons the windows make "
              f"{min(shares):.0%}–{max(shares):.0%} of that variance (median {statistics.median(shares):.0%}): "
              + ("the seeds dominate." if statistics.median(shares) < 0.5 else "the windows dominate: a larger "
                 "eval set would tighten the intervals more than more seeds."))
    else:
        doc.p("The runs recorded no per-window losses: the intervals are over seeds alone, and the sampling "
              "variance of the eval windows is not included.")


def _cost(doc: Doc, rep: Report, pg: _Page) -> None:
    """Section 10. cost."""
    doc.h(2, "10. Cost")
    total_cpu = sum(c.cpu_h for c in rep.costs)
    total_gpu = sum(c.gpu_h for c in rep.costs)
    work = sum(c.work_s for c in rep.costs)
    wall = sum(c.wall_s for c in rep.costs)
    doc.p(f"Trial time × resources per trial (MLflow `cost/cpu_s`, `cost/gpu_s`), in hours: {total_cpu:.3f} "
          f"CPU-hours and {total_gpu:.3f} GPU-hours in all. The price of over-provisioning is the dense arm against "
          "the Scratch-E arm of the same steps. Compute share: the fraction of trial seconds spent in training, "
          "evaluation and scoring steps" + (f" ({work / wall:.0%} in all)." if wall else "."))
    doc.table(["scale", "arm", "runs", "CPU-hours", "GPU-hours", "compute share"],
              [[c.scale, c.arm, c.runs, f"{c.cpu_h:.3f}", f"{c.gpu_h:.3f}",
                "—" if c.compute_share is None else f"{c.compute_share:.0%}"] for c in rep.costs])
