"""The verdict of a sweep: every table of the report computed once (`build`), the headline per scale, the
verdict.json object, the terminal summary and the parent run's headline metrics."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from lightning_modules.declarations.arms import control_names
from lightning_modules.declarations.arms import label as arm_label
from lightning_modules.declarations.config import HeadroomInputError
from lightning_modules.declarations.prune_plan import DEFAULT_TOLERANCE, candidate_rates
from orchestration.design.schema import TrustSpec
from orchestration.design.unit import scale_rank

from .analysis import (
    PRIMARY,
    at_recovery,
    best_methods,
    comparisons,
    is_primary,
    primary_recovery,
    primary_values,
    prunable,
    prunable_fractions,
    prune_curves,
    replication,
)
from .curves import BreakEven, Savings, break_even, savings
from .diagnostics import Diagnostic, diagnose, findings, untrustworthy, unverified
from .read import SweepRuns, Windows
from .render import fmt_ci, fmt_p
from .rows import (
    Comparison,
    Cost,
    CurvePoint,
    EvalInfo,
    LearningRate,
    MethodGap,
    ProbeSlack,
    Prunable,
    RecoveryTrend,
    Redundancy,
    Replication,
    Stability,
    Timing,
    Trend,
    group_label,
)
from .scorers import method_gaps, stability
from .summaries import costs, evaluation_info, learning_rates, probe_slack, probes, redundancy
from .trends import recovery_rows, sign_changes, timing, trends

STATE_WORDS = {"passed": "passed", "failed": "**failed**", "not_applicable": "not applicable",
               "could_not_run": "**could not run**", "finding": "**a finding**"}
VERDICTS = ("supported", "refuted", "inconclusive", "insufficient_seeds")


@dataclass
class Report:
    data: SweepRuns
    tolerance: float
    comparisons: list[Comparison]
    prunable: list[Prunable]
    curves: list[CurvePoint]
    fractions: dict  # (scale, family, method, scope, schedule, eval set) -> prunable fraction
    best: dict  # (scale, family, ratio, scope, schedule) -> (method, val loss)
    costs: list[Cost]
    probes: dict
    diagnostics: list[Diagnostic] = field(default_factory=list)
    learning_rates: list[LearningRate] = field(default_factory=list)
    evaluation: list[EvalInfo] = field(default_factory=list)
    timing: list[Timing] = field(default_factory=list)
    trends: list[Trend] = field(default_factory=list)
    slack: list[ProbeSlack] = field(default_factory=list)
    redundancy: list[Redundancy] = field(default_factory=list)
    # a sweep with several recoveries (F values, objectives): the primary gap at each, and its sign along F; the
    # other tables are at the primary recovery (analysis.primary_recovery)
    recovery: list[Comparison] = field(default_factory=list)
    recovery_trends: list[RecoveryTrend] = field(default_factory=list)
    primary_recovery: tuple[int, str] = (0, "lm")
    replication: list[Replication] = field(default_factory=list)  # section 4 (not in verdict.json)
    method_gaps: list[MethodGap] = field(default_factory=list)  # which scorer (report/scorers.py)
    stability: list[Stability] = field(default_factory=list)
    # when a pruned start pays (report/curves.py): the recovery curve's break-even against each control, and the
    # from-scratch steps a pruned start saves (the parent-free accounting)
    break_even: list[BreakEven] = field(default_factory=list)
    savings: list[Savings] = field(default_factory=list)

    def verdict_json(self) -> dict:
        return {"sweep": self.data.sweep, "spec_hash": self.data.spec_hash,
                "comparisons": [c.to_json() for c in self.comparisons],
                "prunable": [p.to_json() for p in self.prunable],
                "prune_curves": [c.to_json() for c in self.curves],
                "diagnostics": [d.to_json() for d in self.diagnostics],
                "headline": [{"scale": s, "family": f, "headline": self.headline(s, f),
                              "untrustworthy": bool(untrustworthy(self.diagnostics, s, f)),
                              "unverified": unverified(self.diagnostics, s, f)}
                             for s, f in self.scale_families()],
                "learning_rates": [x.to_json() for x in self.learning_rates],
                "evaluation": [e.to_json() for e in self.evaluation],
                "timing": [t.to_json() for t in self.timing],
                "trend": [t.to_json() for t in self.trends],
                "primary_recovery": {"finetune_steps": self.primary_recovery[0],
                                     "recovery": self.primary_recovery[1]},
                "recovery": [c.to_json() for c in self.recovery],
                "recovery_trend": [t.to_json() for t in self.recovery_trends],
                "methods": [g.to_json() for g in self.method_gaps],
                "stability": [x.to_json() for x in self.stability],
                "break_even": [b.to_json() for b in self.break_even],
                "savings": [x.to_json() for x in self.savings]}

    def primary(self) -> list[Comparison]:
        return [c for c in self.comparisons if c.primary]

    def scale_families(self) -> list[tuple[str, str]]:
        return sorted({(p.scale, p.family) for p in self.prunable}, key=lambda p: (scale_rank(p[0]), p))

    def headline(self, scale: str, family: str) -> str:
        """The claim at one (scale, family): untrustworthy when a trust diagnostic failed; unverified when one could
        not run; else half (1) at each ratio and half (2) per control, naming the controls behind each word
        (Holm-adjusted over the scale's primary comparisons)."""
        reasons = untrustworthy(self.diagnostics, scale, family)
        if reasons:
            return "untrustworthy: " + "; ".join(reasons)
        missing = unverified(self.diagnostics, scale, family)
        if missing:
            return "unverified: " + ", ".join(missing) + " could not run (the comparisons are in the tables; no " \
                   "verdict is stated on models whose training was not checked)"
        h1 = [p for p in self.prunable if (p.scale, p.family) == (scale, family)
              and is_primary(p, "method", "scope", "schedule", "eval_set")]
        rows = [c for c in self.primary() if (c.scale, c.family) == (scale, family)]
        if not h1:
            return "not tested (the primary comparison is not in this sweep)"
        half1 = "; ".join(f"r{p.ratio:g}{_labelled(p.group)} {p.verdict.replace('_', ' ')}"
                          for p in sorted(h1, key=lambda p: p.ratio))
        if not rows:
            return f"half (1): {half1}; half (2) not tested (no controls)"
        words = defaultdict(list)
        for c in sorted(rows, key=lambda c: (c.ratio, control_names().index(c.control))):
            words[c.verdict].append(f"{arm_label(c.control)} r{c.ratio:g}" + _labelled(c.group))
        half2 = "; ".join(f"{w.replace('_', ' ')} vs {', '.join(words[w])}" for w in VERDICTS if words[w])
        found = "".join(f"; {f}" for f in findings(self.diagnostics, scale, family))
        return f"half (1): {half1}; half (2): {half2} (Holm-adjusted over {len(rows)} comparison(s)){found}"


def build(data: SweepRuns, windows: Windows | None = None) -> Report:
    """Every table of the report from the sweep's runs. Raises HeadroomInputError when no pruned run finished, or
    none at the primary recovery (a store whose runs do not match their sweep file)."""
    tol = data.spec.prune.tolerance if data.spec is not None else DEFAULT_TOLERANCE
    trust = data.spec.trust if data.spec is not None else TrustSpec()
    every = data.runs
    if not any(r.arm == "pruned" for r in every):
        raise HeadroomInputError(f"sweep {data.sweep!r} (spec {data.spec_hash}) has no finished pruned run: "
                                 "nothing to compare yet")
    main = primary_recovery(every, data.spec)
    runs = at_recovery(every, main, data.spec)  # every table but the recovery section's: the primary recovery's runs
    if not any(r.arm == "pruned" for r in runs):
        found = sorted({(r.finetune_steps or 0, r.recovery) for r in every if r.arm == "pruned"})
        raise HeadroomInputError(
            f"sweep {data.sweep!r} (spec {data.spec_hash}): no finished pruned run at the primary recovery its sweep "
            f"file declares (F = {main[0]}, {main[1]}); pruned runs finished at " +
            ", ".join(f"F = {f} ({k})" for f, k in found))
    rec_rows = recovery_rows(every, windows)
    comps = comparisons(runs, windows, main, data.spec)
    curves = prune_curves(runs)
    h1 = prunable(runs, tol)
    scale_fams = sorted({(p.scale, p.family) for p in h1}, key=lambda p: (scale_rank(p[0]), p))
    order = sorted({r.scale for r in runs}, key=scale_rank)  # scale labels, smallest first (budgets within)
    search = data.spec.lr.search if data.spec is not None and data.spec.lr is not None else None
    diags = diagnose(runs, scale_fams, order, PRIMARY["method"], trust.margin, trust.doubling_gain,
                     (search.low, search.high) if search is not None else None, data.searches, every,
                     charged_rates(data.spec))
    failed = frozenset(k for k in scale_fams if untrustworthy(diags, *k))
    shaky = frozenset(k for k in scale_fams if unverified(diags, *k))
    probe_series = probes(data)
    return Report(data=data, tolerance=tol, comparisons=comps, prunable=h1, curves=curves,
                  fractions=prunable_fractions(curves, tol), best=best_methods(runs), costs=costs(every),
                  probes=probe_series, slack=probe_slack(probe_series), redundancy=redundancy(probe_series),
                  diagnostics=diags, learning_rates=learning_rates(every),
                  evaluation=evaluation_info(runs), timing=timing(runs), trends=trends(runs, failed, shaky),
                  recovery=rec_rows, recovery_trends=sign_changes(rec_rows), primary_recovery=main,
                  replication=replication(comps), method_gaps=method_gaps(runs, windows), stability=stability(runs),
                  break_even=break_even(rec_rows), savings=savings(every))


def charged_rates(spec) -> int | None:
    """How many recovery rates per F the plan charged each Scratch-B for (`PrunePlan.recovery_steps`): the one
    fixed rate, or the grid; None without the spec."""
    if spec is None:
        return None
    return len(candidate_rates(spec.prune.finetune_lr, spec.prune.finetune_lr_grid))


def headline_metrics(rep: Report) -> dict[str, float]:
    """Parent-run metrics: the primary gap per (scale, family, ratio, control), the prunable fractions and each
    method's split-half ranking stability."""
    out = {}
    for c in rep.primary():
        k = f"verdict/{c.scale}/{c.family}/r{c.ratio:g}/{c.control}"
        out[f"{k}/diff_mean"] = c.diff_mean
        if c.ci95:
            out[f"{k}/ci_lo"], out[f"{k}/ci_hi"] = c.ci95
    for (scale, family, method, scope, schedule, ev, group), frac in rep.fractions.items():
        if primary_values(scope=scope, schedule=schedule):  # a registered axis's values: a metric each
            out[f"prunable_fraction/{scale}/{family}/{method}/{ev}" + "".join(f"/{a}{v}" for a, v in group)] = frac
    for x in rep.stability:  # how stable each method's ranking is (split-half Spearman, mean over seeds)
        if x.spearman is not None:
            out[f"stability/{x.scale}/{x.family}/{x.method}/{x.scope}/spearman"] = x.spearman
    return out


def headline_markdown(rep: Report, report_path: str) -> str:
    """The headline as Markdown: the parent run's description in the MLflow UI. Per scale: the verdict words,
    the primary comparisons with their intervals, every trust diagnostic; then where the full report is."""
    out = [f"## Verdict of sweep `{rep.data.sweep}` (spec {rep.data.spec_hash})", ""]
    for scale, family in rep.scale_families():
        out += [f"### {scale} {family}", "", f"**{rep.headline(scale, family)}**", ""]
        rows = [c for c in rep.primary() if (c.scale, c.family) == (scale, family)]
        if rows:
            out += ["| ratio | control | verdict | control − pruned (nats/token; > 0: pruning wins) | simultaneous "
                    "CI (Bonferroni over the family) | unadjusted 95% CI | p (Holm) | seeds |",
                    "|---|---|---|---|---|---|---|---|"]
            out += [f"| {c.ratio:g} | {arm_label(c.control)} | {c.verdict.replace('_', ' ')} | "
                    f"{c.diff_mean:+.4f} | {fmt_ci(c.ci95_simultaneous)} | {fmt_ci(c.ci95)} | {fmt_p(c.p_holm)} "
                    f"| {c.n_seeds} |" for c in rows]
            out.append("")
        pays = pays_lines(rep, scale, family)
        if pays:
            out += ["When a pruned start pays:"] + [f"- {x}" for x in pays] + [""]
        checks = [g for g in rep.diagnostics if (g.scale, g.family) == (scale, family)]
        if checks:
            out.append("Trust diagnostics:")
            out += [f"- {g.check}: {STATE_WORDS[g.state]} — {g.detail}" for g in checks]
            out.append("")
    if rep.data.missing:
        out += [f"Partial: {len(rep.data.missing)} planned unit(s) missing.", ""]
    out.append(f"Full report: artifacts `{report_path}/report.html` (and `report.md`, `verdict.json`) of this run.")
    return "\n".join(out)


def pays_lines(rep: Report, scale, family: str) -> list[str]:
    """When a pruned start pays at (scale, family), in words (report/curves.py): per control, the recovery curve's
    state and break-even; then the parent-free savings at each F. Empty for a sweep without a recovery ladder."""
    out = []
    for b in rep.break_even:
        if (b.scale, b.family) != (str(scale), family):
            continue
        lo, hi = b.break_even_ci or (None, None)
        what = {"pays": f"pays (pruning shown not worse from F ≈ {hi:,.0f})" if hi is not None else
                        f"pays (shown not worse from F = {b.budgets[0]} on)",
                "parity": "parity (not shown worse" + (f" from F ≈ {lo:,.0f}" if lo is not None else "")
                          + f", not shown as good up to F = {b.budgets[-1]})",
                "worse": f"worse at every F up to {b.budgets[-1]}"}.get(b.state, b.state)
        star = f"; mean crosses 0 at F* ≈ {b.break_even:,.0f}" if b.break_even is not None else ""
        how = {"scratch_b": "parent counted: its compute matched at each F",
               "scratch_e": "the small model trained the dense run's T steps"}.get(b.control, "")
        out.append(f"recovery curve r{b.ratio:g}{_labelled(b.group)} vs {arm_label(b.control)}"
                   f"{f' ({how})' if how else ''}: "
                   f"{what}{star}")
    for x in rep.savings:
        if (x.scale, x.family) == (str(scale), family):
            told = (f"{x.factor:.3g}× [{x.factor_ci95[0]:.3g}, {x.factor_ci95[1]:.3g}]" if x.factor_ci95 else
                    f"{x.factor:.3g}×" if x.factor is not None else f"{x.bound}× (a bound)")
            out.append(f"parent free r{x.ratio:g}{_labelled(x.group)}, F = {x.finetune_steps}: the pruned start "
                       f"reaches the loss of "
                       f"{told} F from-scratch steps (n={x.n_seeds})")
    return out


def _labelled(group: dict) -> str:
    """" (lr×0.5)": a row's values of the axes registered beyond the built-in ones; "" without any."""
    label = group_label(group)
    return f" ({label})" if label else ""


def headline_table(rep: Report) -> str:
    """The headline as plain text for the terminal."""
    lines = [f"verdict of sweep {rep.data.sweep} (spec {rep.data.spec_hash}):"]
    if rep.comparisons:
        for scale, family in rep.scale_families():
            lines.append(f"  {scale} {family}: {rep.headline(scale, family)}")
            for d in rep.primary():
                if (d.scale, d.family) == (scale, family):
                    lines.append(f"      r{d.ratio:g}{_labelled(d.group)} vs {arm_label(d.control):<9} {d.verdict:<18} "
                                 f"diff {d.diff_mean:+.4f} simultaneous CI {fmt_ci(d.ci95_simultaneous)} "
                                 f"(unadjusted {fmt_ci(d.ci95)}) p_Holm {fmt_p(d.p_holm)} (n={d.n_seeds})")
            lines += [f"      {x}" for x in pays_lines(rep, scale, family)]
            for g in rep.diagnostics:
                if (g.scale, g.family) == (scale, family) and g.state in ("failed", "could_not_run", "finding"):
                    lines.append(f"      {STATE_WORDS[g.state].strip('*')} check {g.check}: {g.detail}")
    else:  # no controls (a pretrained sweep): half (1) only
        for p in rep.prunable:
            if is_primary(p, "scope", "schedule", "eval_set"):
                lines.append(f"  {p.scale} {p.family} r{p.ratio:g} {p.method}: {p.verdict} "
                             f"(before fine-tune {p.pruned_loss:.4f} vs dense {p.dense_loss:.4f}, "
                             f"tolerance {p.tolerance:.0%})")
        if len(lines) == 1:
            lines.append("  no primary comparison in this sweep; see the report")
        else:
            lines.append("  half (2) not tested: the sweep trains no controls")
    if rep.data.missing:
        lines.append(f"  partial: {len(rep.data.missing)} planned unit(s) missing")
    return "\n".join(lines)
