"""Notebook 06's figure: accuracy and gold log-probability against the KV budget, per strategy."""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from dynheads_tl.analysis.plots import error_bars

__all__ = ["retention_figure"]


def retention_figure(table: pd.DataFrame, title: str):
    """Notebook 06: NIAH accuracy (Wilson 95%) and the teacher-forced gold log-probability's gap to the full cache
    (bootstrap 95%) against the share of heads kept whole, per strategy; the full cache and streaming as lines."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    bounds = table[table["strategy"].isin(["full", "streaming"])].set_index("strategy")
    per_step = table[~table["strategy"].isin(["full", "streaming"])]
    for ax, column, label in ((axes[0], "accuracy", "NIAH accuracy (free generation)"),
                              (axes[1], "vs_full", "gold log-prob minus full cache (nats/token)")):
        for (strategy, granularity), part in per_step.groupby(["strategy", "granularity"], sort=False):
            part = part.sort_values("budget")
            name = strategy if granularity == "query" else f"{strategy} (KV heads)"
            ax.errorbar(part["budget"] * 100, part[column], yerr=error_bars(part, column), marker="o", markersize=3,
                        capsize=2, linestyle="-" if granularity == "query" else "--", label=name)
        for strategy, style in (("full", ":"), ("streaming", "-.")):
            if strategy in bounds.index:
                ax.axhline(float(bounds.loc[strategy, column]), color="grey", linestyle=style, linewidth=1,
                           label=f"{strategy} cache")
        budgets = sorted(set(per_step["budget"] * 100))
        ax.set_xscale("log")
        ax.set_xticks(budgets, [f"{b:g}%" for b in budgets])
        ax.minorticks_off()
        ax.set_xlabel("heads kept whole at each step\n(share of query heads; dashed: of KV heads)")
        ax.set_ylabel(label)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=min(len(labels), 5), frameon=False,
               bbox_to_anchor=(0.5, 0.0))
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.05 + 0.045 * -(-len(labels) // 5), 1, 0.95))
    return fig
