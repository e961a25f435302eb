"""Notebook 05's figure: ROC curves and transfer between settings."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from dynheads_tl.analysis.plots import error_bars

__all__ = ["error_signal_figure"]


def error_signal_figure(roc: pd.DataFrame, table: pd.DataFrame, transfer: pd.DataFrame, title: str):
    """Notebook 05: the out-of-fold ROC curve of every feature group (AUROC and its interval in the legend), and
    the transfer AUROC of every group per (train -> test) pair with 95% intervals; 0.5 is chance."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 6.6), gridspec_kw={"width_ratios": [1, 1.4]})
    ax = axes[0]
    names = dict(zip(table["group"], table["method"]))
    for row in table.itertuples():
        part = roc[roc["group"] == row.group]
        if part.empty:  # not scored (too few of one class to train on): no curve, no legend entry
            continue
        ax.plot(part["fpr"], part["tpr"], label=f"{names[row.group]}: {row.auroc:.2f} [{row.low:.2f}, {row.high:.2f}]")
    ax.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("false positive rate (right answers flagged)")
    ax.set_ylabel("true positive rate (wrong answers flagged)")
    ax.set_title(f"pooled, out-of-fold (n = {int(table['n'].iloc[0])}, {int(table['wrong'].iloc[0])} wrong)", fontsize=9)
    ax.set_xlim(-0.01, 1.01)
    ax.set_ylim(-0.01, 1.01)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False,
              title="feature group: AUROC [95% CI]", title_fontsize=7)  # below the axes, off the curves
    ax = axes[1]
    if len(transfer):
        pairs = list(dict.fromkeys(f"{a} -> {b}" for a, b in zip(transfer["train"], transfer["test"])))
        groups = list(dict.fromkeys(transfer["group"]))
        width = 0.8 / len(groups)
        pair_of = transfer["train"] + " -> " + transfer["test"]
        for i, group in enumerate(groups):
            part = transfer[transfer["group"] == group].set_index(pair_of[transfer["group"] == group]).reindex(pairs)
            bars = part.rename(columns={"auroc": "v", "low": "v_low", "high": "v_high"})
            x = np.arange(len(pairs)) + (i - (len(groups) - 1) / 2) * width
            ax.bar(x, bars["v"], width, yerr=error_bars(bars, "v"), capsize=2, label=names.get(group, group))
        ax.set_xticks(np.arange(len(pairs)), pairs, rotation=25, ha="right", fontsize=7)
        ax.axhline(0.5, color="grey", linestyle=":", linewidth=1)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("AUROC on the test setting")
        ax.set_title("transfer: train on one setting, test on another", fontsize=9)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.6), ncol=2, frameon=False)
    else:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    return fig
