"""Figures: head-importance heatmaps and prune curves (matplotlib, Agg backend, PNG)."""

from __future__ import annotations

import math
from pathlib import Path


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


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
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


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
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
