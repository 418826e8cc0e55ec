"""The recovery section: the primary gap (control − pruned, after the recovery fine-tune) at every recovery budget F
and objective (lm, distill) the sweep ran, and where, if anywhere, it changes sign along F.

Each (cell, family, ratio, control, objective) is a family of k budgets. A budget's gap has a *sign* when its
paired interval (seeds and eval windows, as every comparison) at level 1 − α/k excludes 0 (Bonferroni over the
family). A change of sign is stated only between two budgets whose signs are both established and opposite; a gap
that is 0 at every F then claims one with probability at most α (tests/test_recovery_report.py measures it by
simulation; docs/design.md states the rates). The primary comparison itself (section 3, the headline) is at the
primary recovery, `analysis.primary_recovery`: the strongest one the sweep file declares.
"""

from __future__ import annotations

from collections import defaultdict

from lightning_modules.arms import control_names

from .analysis import _interval_at, comparisons, is_primary
from .read import Run, Windows
from .rows import Comparison, RecoveryTrend
from .stats import ALPHA


def recovery_rows(runs: list[Run], windows: Windows | None = None) -> list[Comparison]:
    """The primary comparison (method, scope, schedule, eval set) after recovery, at every F and objective; empty
    unless the sweep ran more than one recovery."""
    if len({(r.finetune_steps or 0, r.recovery) for r in runs if r.arm == "pruned"}) < 2:
        return []
    return [c for c in comparisons(runs, windows) if c.stage == "final" and is_primary(c, "method", "scope",
                                                                                          "schedule", "eval_set")]


def _sign(row: Comparison, level: float) -> int:
    ci = _interval_at(row, level)
    if ci is None:
        return 0
    return 1 if ci[0] > 0 else -1 if ci[1] < 0 else 0


def sign_changes(rows: list[Comparison], alpha: float = ALPHA) -> list[RecoveryTrend]:
    """Per (scale, family, ratio, control, objective) with two or more budgets: each budget's sign at the
    Bonferroni level 1 − α/k, and the first pair of budgets (in increasing F, budgets without a sign skipped) whose
    signs are opposite."""
    groups = defaultdict(list)
    for c in rows:
        groups[(c.scale, c.family, c.ratio, c.control, c.recovery)].append(c)
    out = []
    order = {a: i for i, a in enumerate(control_names())}
    for (scale, family, ratio, control, recovery), rs in sorted(
            groups.items(), key=lambda kv: (kv[0][:3], order.get(kv[0][3], 99), kv[0][4])):
        rs.sort(key=lambda c: c.finetune_steps)
        if len(rs) < 2:
            continue
        level = 1 - alpha / len(rs)
        signs = [_sign(c, level) for c in rs]
        known = [(c.finetune_steps, s) for c, s in zip(rs, signs) if s]
        change = next(([a[0], b[0]] for a, b in zip(known, known[1:]) if a[1] != b[1]), None)
        out.append(RecoveryTrend(scale=scale, family=family, ratio=ratio, control=control, recovery=recovery,
                                 budgets=[c.finetune_steps for c in rs], diffs=[c.diff_mean for c in rs],
                                 signs=signs, level=level, change=change))
    return out
