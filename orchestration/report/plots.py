"""Figures: head-importance heatmaps and prune curves (matplotlib, Agg backend, PNG)."""

from __future__ import annotations

import math
from pathlib import Path

from lightning_modules.declarations.arms import label as arm_label
from lightning_modules.declarations.names import PROBE_PRUNABLE, PROBE_SPREAD

from .rows import group_label


def _labelled(text: str, row) -> str:
    """A legend entry with the row's values of the axes registered beyond the built-in ones, when it has any."""
    g = group_label(getattr(row, "group", None) or {})
    return f"{text}, {g}" if g else text


def _group(row) -> tuple:
    return tuple((getattr(row, "group", None) or {}).items())


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str | Path) -> None:
    fig.tight_layout()
    fig.savefig(path)
    _plt().close(fig)


def _yerr(y, cis) -> list[list[float]]:
    """Error-bar lengths below and above each mean from its 95% interval (0 where there is none)."""
    return [[m - c[0] if c else 0 for m, c in zip(y, cis)], [c[1] - m if c else 0 for m, c in zip(y, cis)]]


def heatmap(scores: list[list[float | None]], path: str | Path, title: str) -> None:
    """Layers × heads, one cell per head; empty cells are heads a layer does not have."""
    plt = _plt()
    import numpy as np

    a = np.array([[np.nan if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in row]
                  for row in scores], dtype=float)
    fig, ax = plt.subplots(figsize=(max(4.5, 1.8 + 0.45 * a.shape[1]), max(2.6, 1.4 + 0.45 * a.shape[0])), dpi=120)
    im = ax.imshow(a, cmap="viridis", aspect="auto")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(a.shape[1]))
    ax.set_yticks(range(a.shape[0]))
    ax.set_title(f"{title}\n(higher = more important)", fontsize=9)
    fig.colorbar(im, ax=ax, label="importance")
    _save(fig, path)


def prune_curve_plot(rows: list[dict], sets: list[str], path: str | Path, title: str) -> None:
    """Loss vs fraction of heads removed (mask only, no fine-tune), one line per eval set."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 3.4), dpi=120)
    for s in sets:
        ax.plot([r["fraction_removed"] for r in rows], [r[s] for r in rows], marker="o", label=s)
    ax.set_xlabel("fraction of heads removed")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(title, fontsize=9)
    ax.legend(title="eval set")
    ax.grid(alpha=0.3)
    _save(fig, path)




def forest_plot(rows: list, path: str | Path) -> None:
    """Comparisons (control − pruned) as points with 95% CI bars, one row per comparison; 0 marked."""
    plt = _plt()
    rows = sorted(rows, key=lambda c: (c.scale, c.family, c.ratio, c.control, c.finetune_steps))
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(7, 0.9 + 0.32 * len(rows)), dpi=120)
    colors = {"supported": "tab:green", "refuted": "tab:red", "inconclusive": "tab:gray",
              "insufficient_seeds": "tab:orange"}
    labels = []
    for i, c in enumerate(rows):
        y = len(rows) - 1 - i
        ci = c.ci95
        if ci:
            ax.plot(ci, [y, y], color=colors[c.verdict], lw=2)
        ax.plot([c.diff_mean], [y], "o", color=colors[c.verdict],
                mfc="white" if c.finetune_steps == 0 else colors[c.verdict])
        ft = "pre-FT" if c.finetune_steps == 0 else f"FT {c.finetune_steps}"
        labels.append(f"{c.scale} {c.family} r{c.ratio:g} vs {arm_label(c.control)} ({ft})")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(list(reversed(labels)), fontsize=7)
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel("control loss − pruned loss (nats/token); > 0: pruning wins")
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=v, marker="o", lw=2, label=k) for k, v in colors.items()
               if any(c.verdict == k for c in rows)]
    handles.append(Line2D([], [], color="gray", marker="o", mfc="white", lw=0, label="before fine-tune"))
    ax.legend(handles=handles, fontsize=7, loc="best")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title("pruned vs controls, paired by seed (mean, 95% t-interval)", fontsize=9)
    _save(fig, path)


def curves_plot(rows: list, tolerance: float, path: str | Path, title: str) -> None:
    """Mean loss vs ratio per method with a 95% band (mask only), the swept ratios after fine-tune as crosses,
    and the tolerance above dense."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    methods = sorted({(r.method, _group(r)) for r in rows})  # a line per method and registered axes' values
    cmap = plt.get_cmap("tab10")
    dense = None
    for i, (m, g) in enumerate(methods):
        mine = [r for r in rows if (r.method, _group(r)) == (m, g)]
        pts = sorted((r for r in mine if r.finetune_steps == 0), key=lambda r: r.ratio)
        if pts:
            x = [r.ratio for r in pts]
            ax.plot(x, [r.loss_mean for r in pts], marker="o", ms=3, color=cmap(i % 10),
                    label=_labelled(f"{m} (mask only)", pts[0]))
            if all(r.loss_ci95 for r in pts):
                ax.fill_between(x, [r.loss_ci95[0] for r in pts], [r.loss_ci95[1] for r in pts],
                                color=cmap(i % 10), alpha=0.18)
            if pts[0].ratio == 0:
                dense = pts[0].loss_mean
        ft = [r for r in mine if r.finetune_steps > 0]
        for j, r in enumerate(ft):
            err = None
            if r.loss_ci95:
                err = [[r.loss_mean - r.loss_ci95[0]], [r.loss_ci95[1] - r.loss_mean]]
            ax.errorbar([r.ratio], [r.loss_mean], yerr=err, marker="x", ms=8, color=cmap(i % 10), capsize=3, lw=0,
                        elinewidth=1, label=_labelled(f"{m} after {r.finetune_steps} fine-tune steps", r)
                        if j == 0 else None)
    if dense is not None:
        ax.axhline(dense, color="black", lw=0.8, ls="--", label="dense")
        ax.axhline(dense * (1 + tolerance), color="gray", lw=0.8, ls=":", label=f"dense + {tolerance:.0%}")
    ax.set_xlabel("fraction of heads removed")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    _save(fig, path)


def _band(ax, points: list, color, label: str) -> None:
    """points: (step, mean, 95% interval or None); the band is drawn when every point has an interval."""
    steps = [p[0] for p in points]
    ax.plot(steps, [p[1] for p in points], marker="o", ms=3, color=color, label=label)
    if all(p[2] for p in points):
        ax.fill_between(steps, [p[2][0] for p in points], [p[2][1] for p in points], color=color, alpha=0.18)


def probes_plot(probes: dict, path: str | Path) -> None:
    """Importance over training: prunable fraction and importance spread vs step, one line per scale.
    probes: (scale, family) -> metric -> [(step, mean, 95% interval or None)]."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), dpi=120)
    cmap = plt.get_cmap("tab10")
    for i, ((scale, family), series) in enumerate(probes.items()):  # in the caller's (scale) order
        for ax, metric in zip(axes, (PROBE_PRUNABLE, PROBE_SPREAD)):
            if series.get(metric):
                _band(ax, series[metric], cmap(i), f"{scale} {family}")
    axes[0].set_ylabel("prunable fraction (mask only, val)")
    axes[1].set_ylabel("importance spread (std / mean over heads)")
    for ax in axes:
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("importance over training (mean over seeds, 95% band)", fontsize=9)
    _save(fig, path)


def redundancy_plot(pairs: dict, path: str | Path) -> None:
    """Mean pairwise CKA of head outputs at init and after training, per scale, with 95% CI bars.
    pairs: (scale, family) -> ((init mean, interval or None), (trained mean, interval or None))."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(4.5, 1.5 + 1.2 * len(pairs)), 3.6), dpi=120)
    names = [f"{s} {f}" for s, f in pairs]
    for k, (label, offset) in enumerate((("at initialisation", -0.18), ("after training", 0.18))):
        means = [v[k][0] for v in pairs.values()]
        errs = [[m - v[k][1][0] if v[k][1] else 0 for m, v in zip(means, pairs.values())],
                [v[k][1][1] - m if v[k][1] else 0 for m, v in zip(means, pairs.values())]]
        ax.bar([i + offset for i in range(len(pairs))], means, width=0.36, yerr=errs, capsize=3, label=label)
    ax.set_xticks(range(len(pairs)))
    ax.set_xticklabels(names)
    ax.set_ylabel("mean pairwise CKA of head outputs")
    ax.set_ylim(0, 1)
    ax.set_title("head redundancy (1 = heads linearly equivalent)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    _save(fig, path)


def timing_plot(rows: list, path: str | Path, title: str) -> None:
    """Final loss against the fraction of training at which the heads went (one line per ratio, band = 95% CI over
    seeds), with the dense models, pruning the trained model (p = 1) and Scratch-E as horizontal lines."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    cmap = plt.get_cmap("tab10")
    for i, ratio in enumerate(sorted({r.ratio for r in rows})):
        pts = sorted((r for r in rows if r.ratio == ratio), key=lambda r: r.prune_at)
        x = [r.prune_at for r in pts]
        ax.plot(x, [r.loss_mean for r in pts], marker="o", color=cmap(i), label=f"pruned r{ratio:g}, heads removed at p")
        if all(r.loss_ci95 for r in pts):
            ax.fill_between(x, [r.loss_ci95[0] for r in pts], [r.loss_ci95[1] for r in pts], color=cmap(i), alpha=0.18)
        late = [r for r in pts if r.prune_at == 1.0]
        if late:
            ax.axhline(late[0].loss_mean, color=cmap(i), lw=0.8, ls=":", label=f"dense-then-prune r{ratio:g}")
        if pts[0].scratch_e_loss is not None:
            ax.axhline(pts[0].scratch_e_loss, color=cmap(i), lw=0.8, ls="-.", label=f"Scratch-E r{ratio:g}")
    dense = next((r.dense_loss for r in rows if r.dense_loss is not None), None)
    if dense is not None:
        ax.axhline(dense, color="black", lw=0.8, ls="--", label="dense")
    ax.set_xlabel("fraction of training at which the heads were removed (p; 0 = at init)")
    ax.set_ylabel("final loss (nats/token)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    _save(fig, path)


def trend_plot(trends: list, axis: str, path: str | Path) -> None:
    """The primary gap per cell against an axis (log), error bars = 95% CI over seeds (hollow: a cell left out,
    its trust checks failed), and each group's fitted line (its intercept, the common slope) over its range."""
    plt = _plt()
    import numpy as np

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for t in (t for t in trends if t.axis == axis):
        pts = sorted(t.points, key=lambda p: p.tokens_per_param if axis == "tokens_per_param" else p.params)
        slope = 0.0 if t.slope is None else t.slope
        x = np.array([p.tokens_per_param if axis == "tokens_per_param" else p.params for p in pts], dtype=float)
        y = np.array([p.diff_mean for p in pts], dtype=float)
        used = np.array([p.used for p in pts])
        label = (f"{t.family} r{t.ratio:g} vs {arm_label(t.control)} "
                 + ("(no fit: cells left out)" if t.slope is None else f"({t.slope:+.3f}/decade"
                    + (")" if t.slope_ci95 else ", no interval)")))
        line = ax.errorbar(x[used], y[used], yerr=_yerr(y[used], [p.ci95 for p in pts if p.used]), marker="o",
                           capsize=3, lw=0, elinewidth=1, label=label)
        color = line[0].get_color()
        if (~used).any():
            ax.scatter(x[~used], y[~used], facecolors="white", edgecolors=color, zorder=3)
        for g in t.groups or []:
            lo, hi = g["x_range"]
            if lo is None or hi is None or lo == hi:
                continue
            grid = np.linspace(np.log10(lo), np.log10(hi), 20)
            ax.plot(10 ** grid, g["intercept"] + slope * grid, color=color, lw=1)
            if g["crossover"] is not None:
                ax.axvline(g["crossover"], color=color, lw=0.8, ls=":" if g["established"] else (0, (1, 4)))
        for xi, yi, p in zip(x, y, pts):
            ax.annotate(p.cell, (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xscale("log")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xlabel("training tokens per non-embedding parameter" if axis == "tokens_per_param"
                  else "non-embedding parameters")
    ax.set_ylabel("control − pruned loss (nats/token)")
    ax.set_title("primary gap against the training budget (one line per scale; dotted: crossover)"
                 if axis == "tokens_per_param" else "primary gap against model size (one line per budget)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    _save(fig, path)


def budget_map(trends: list, path: str | Path) -> None:
    """Parameters × training tokens, one panel per control: colour = the primary gap at each cell, a filled marker
    where its 95% interval excludes 0 (hollow: it does not)."""
    plt = _plt()
    import numpy as np

    per = {}
    for t in trends:
        if t.axis == "tokens_per_param":
            per.setdefault(t.control, []).extend((t, p) for p in t.points)
    controls = sorted(per)
    fig, axes = plt.subplots(1, len(controls), figsize=(4.6 * len(controls), 3.8), dpi=120, squeeze=False)
    vmax = max((abs(p.diff_mean) for c in controls for _, p in per[c]), default=1.0) or 1.0
    for ax, control in zip(axes[0], controls):
        pts = per[control]
        x = np.array([p.params for _, p in pts])
        y = np.array([p.tokens_per_param * p.params for _, p in pts])
        c = np.array([p.diff_mean for _, p in pts])
        decided = np.array([bool(p.ci95 and (p.ci95[0] > 0 or p.ci95[1] < 0)) for _, p in pts])
        cmap, norm = plt.get_cmap("coolwarm_r"), plt.Normalize(-vmax, vmax)
        sc = ax.scatter(x[decided], y[decided], c=c[decided], cmap=cmap, norm=norm, s=90, edgecolors="black")
        ax.scatter(x[~decided], y[~decided], facecolors="white", edgecolors=cmap(norm(c[~decided])), s=90,
                   linewidths=2.5)  # hollow: the interval includes 0
        for (t, p), xi, yi in zip(pts, x, y):
            ax.annotate(f"{p.cell} r{t.ratio:g}", (xi, yi), textcoords="offset points", xytext=(6, 5), fontsize=6)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.margins(x=0.3, y=0.15)
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
        ax.yaxis.set_minor_formatter(plt.NullFormatter())
        ax.set_xlabel("non-embedding parameters")
        ax.set_ylabel("training tokens")
        ax.set_title(f"vs {arm_label(control)} (blue: pruning wins; hollow: CI includes 0)", fontsize=9)
        ax.grid(alpha=0.3)
        fig.colorbar(sc, ax=ax, label="control − pruned (nats/token)")
    _save(fig, path)


def recovery_plot(rows: list, path: str | Path, title: str) -> None:
    """The primary gap (control − pruned) against the recovery budget F, one line per (control, objective), error
    bars = 95% interval; 0 marked (above it pruning wins)."""
    plt = _plt()
    from lightning_modules.declarations.arms import label as arm_label

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    cmap = plt.get_cmap("tab10")
    keys = sorted({(c.ratio, c.control, c.recovery, _group(c)) for c in rows})  # registered axes: a line each
    for i, key in enumerate(keys):
        ratio, control, recovery, _ = key
        pts = sorted((c for c in rows if (c.ratio, c.control, c.recovery, _group(c)) == key),
                     key=lambda c: c.finetune_steps)
        x = [c.finetune_steps for c in pts]
        y = [c.diff_mean for c in pts]
        err = [[c.diff_mean - c.ci95[0] if c.ci95 else 0 for c in pts], [c.ci95[1] - c.diff_mean if c.ci95 else 0
                                                                           for c in pts]]
        ax.errorbar(x, y, yerr=err, marker="o" if recovery == "lm" else "s", ls="-" if recovery == "lm" else "--",
                    color=cmap(i % 10), capsize=3, label=_labelled(f"{arm_label(control)} r{ratio:g}, {recovery}",
                                                                   pts[0]))
    ax.axhline(0, color="black", lw=0.8)
    positive = sorted({c.finetune_steps for c in rows if c.finetune_steps > 0})
    if positive and max(positive) / positive[0] >= 10:
        ax.set_xscale("symlog", linthresh=positive[0])
    ax.set_xlabel("recovery fine-tune steps F")
    ax.set_ylabel("control − pruned (nats/token; > 0: pruning wins)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    _save(fig, path)


def break_even_plot(rows: list, order: list[str], path: str | Path) -> None:
    """The recovery curve of each scale (a panel each, `order` smallest first): control − pruned against F (log),
    one line per control with its band at the row's simultaneous level; the break-even F* marked where the mean
    crosses 0 (above 0: pruning wins)."""
    plt = _plt()
    scales = [s for s in order if any(r.scale == s for r in rows)]
    fig, axs = plt.subplots(1, len(scales), figsize=(4.2 * len(scales), 3.8), dpi=120, squeeze=False)
    cmap = plt.get_cmap("tab10")
    lines = sorted({(r.control, r.ratio, _group(r)) for r in rows})  # a colour per control, ratio and group
    for ax, scale in zip(axs[0], scales):
        for i, line in enumerate(lines):
            for r in (r for r in rows if r.scale == scale and (r.control, r.ratio, _group(r)) == line):
                lo = [c[0] if c else d for c, d in zip(r.ci, r.diffs)]
                hi = [c[1] if c else d for c, d in zip(r.ci, r.diffs)]
                ax.plot(r.budgets, r.diffs, marker="o", color=cmap(i % 10),
                        label=_labelled(f"vs {arm_label(r.control)} r{r.ratio:g}", r))
                ax.fill_between(r.budgets, lo, hi, color=cmap(i % 10), alpha=0.15)
                if r.break_even is not None:
                    ax.axvline(r.break_even, color=cmap(i % 10), ls=":", lw=1)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("recovery steps F")
        ax.set_title(str(scale), fontsize=9)
        ax.grid(alpha=0.3)
    axs[0][0].set_ylabel("control − pruned (nats/token; > 0: pruning wins)")
    axs[0][0].legend(fontsize=7)
    _save(fig, path)


def gap_by_size_plot(rows: list, order: list[str], path: str | Path) -> None:
    """The gap against the scale at matched F: the k-th budget of every scale's ladder (ladders in proportion to
    each scale's T match by position), one line per position, a panel per control; 95%-simultaneous bands as bars."""
    plt = _plt()
    panels = sorted({(r.control, r.ratio, _group(r)) for r in rows})  # a panel per control, ratio and group
    fig, axs = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.8), dpi=120, squeeze=False)
    cmap = plt.get_cmap("viridis")
    scales = [s for s in order if any(r.scale == s for r in rows)]
    for ax, panel in zip(axs[0], panels):
        control, ratio, _ = panel
        mine = {r.scale: r for r in rows if (r.control, r.ratio, _group(r)) == panel}
        k_max = max((len(r.budgets) for r in mine.values()), default=0)
        for k in range(k_max):
            xs, ys, err = [], [], [[], []]
            for j, s in enumerate(scales):
                r = mine.get(s)
                if r is None or k >= len(r.budgets):
                    continue
                xs.append(j)
                ys.append(r.diffs[k])
                c = r.ci[k]
                err[0].append(r.diffs[k] - c[0] if c else 0)
                err[1].append(c[1] - r.diffs[k] if c else 0)
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=2, color=cmap(k / max(1, k_max - 1)),
                        label=f"ladder step {k + 1}")
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xticks(range(len(scales)), [str(s) for s in scales])
        ax.set_xlabel("scale (smallest first)")
        ax.set_title(_labelled(f"vs {arm_label(control)} r{ratio:g}", next(iter(mine.values()))), fontsize=9)
        ax.grid(alpha=0.3)
    axs[0][0].set_ylabel("control − pruned at matched F (> 0: pruning wins)")
    axs[0][0].legend(fontsize=6)
    _save(fig, path)
