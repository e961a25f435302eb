"""Notebook 07's own figures: Fig 1 with one panel per length, and each length primary's units against log2(length)
with the fitted slope. (Fig 2 is claim 2's context x depth heatmap per condition: the notebook draws it with claim 2's figures.)"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dynheads_tl.analysis.plots import heatmaps_drawn_once

__all__ = ["fig1_by_length", "trend_figure"]


def fig1_by_length(panels: list[tuple[int, np.ndarray, np.ndarray, list[str], list[str], str]], title: str):
    """One heatmap per length, stacked: (length, share of attention on the needle [head, step], Eq. 1 hits,
    token labels, head labels, what the answer was)."""
    import matplotlib.pyplot as plt

    width = max(6.0, 0.3 * max(len(p[3]) for p in panels) + 2.5)
    heights = [0.33 * len(p[4]) + 1.2 for p in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(width, sum(heights) + 0.8), squeeze=False,
                             gridspec_kw={"height_ratios": heights}, layout="constrained")
    with heatmaps_drawn_once(fig) as heatmap:
        for ax, (length, scores, hits, tokens, heads, answer) in zip(axes[:, 0], panels):
            heatmap(scores, ax=ax, cmap="viridis", vmin=0, vmax=max(float(np.nanmax(scores)), 1e-6),
                    xticklabels=tokens, yticklabels=heads, cbar_kws={"label": "attention on the needle"})
            rows, cols = np.nonzero(hits)
            ax.scatter(cols + 0.5, rows + 0.5, s=12, c="white", edgecolors="black", linewidths=0.5)
            ax.set_title(f"{length:,} tokens: {answer}", fontsize=9)
            ax.set_ylabel("head")
            ax.tick_params(axis="x", labelrotation=90, labelsize=6)
    axes[-1, 0].set_xlabel("generated token (white dots: Eq. 1 hits)")
    fig.suptitle(title, fontsize=11)
    return fig


def trend_figure(units: dict[str, pd.DataFrame], trends: pd.DataFrame, title: str):
    """Each primary's units (one dot per layout or sample) against log2(length), with the fitted slope through the
    mean of the units it was fitted on and its BCa 95% interval in the panel's title; units at a length without
    headroom (their ``headroom`` column False: left out of the slope) are drawn hollow and grey."""
    import matplotlib.pyplot as plt

    rows = list(trends.itertuples())
    fig, axes = plt.subplots(1, len(rows), figsize=(4.2 * len(rows), 3.4), squeeze=False, layout="constrained")
    for ax, r in zip(axes[0], rows):
        frame = units.get(r.primary)
        ax.set_title(f"{r.primary}\n" + ("not tested" if r.reading == "not tested" else
                     f"{r.slope_per_doubling:+.3f} [{r.low:+.3f}, {r.high:+.3f}] / doubling: {r.reading}"), fontsize=8)
        if frame is None or frame.empty:
            ax.text(0.5, 0.5, "no units", ha="center", va="center", transform=ax.transAxes)
            continue
        x = np.log2(frame["length"].to_numpy(float))
        y = frame["value"].to_numpy(float)
        kept = frame["headroom"].astype(bool).to_numpy() if "headroom" in frame else np.ones(len(x), dtype=bool)
        jitter = np.random.default_rng(0).uniform(-0.05, 0.05, len(x))
        ax.scatter(x[kept] + jitter[kept], y[kept], s=14, alpha=0.7)
        if (~kept).any():
            ax.scatter(x[~kept] + jitter[~kept], y[~kept], s=14, facecolors="none", edgecolors="grey",
                       label="no headroom (left out)")
            ax.legend(fontsize=7, frameon=False)
        if r.slope_per_doubling == r.slope_per_doubling and kept.any():
            grid = np.linspace(x[kept].min(), x[kept].max(), 2)
            ax.plot(grid, y[kept].mean() + r.slope_per_doubling * (grid - x[kept].mean()), color="black")
        ax.set_xticks(sorted(set(x)))
        ax.set_xticklabels([f"{int(2 ** v):,}" for v in sorted(set(x))])
        ax.set_xlabel("context tokens (log2 scale)")
    fig.suptitle(title, fontsize=11)
    return fig
