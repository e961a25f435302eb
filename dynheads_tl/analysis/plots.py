"""Figure helpers more than one claim draws with: the heads x generated tokens heatmap (notebooks 00 and 01) and
error bars from an interval's bounds."""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

__all__ = ["error_bars", "step_heatmap"]


def error_bars(table: pd.DataFrame, column: str) -> list[np.ndarray]:
    """Error bar lengths below and above ``column`` from ``column_low`` / ``column_high``; a bound that equals
    the estimate up to float rounding (a bootstrap of identical values) gives 0, not a tiny negative length."""
    value = table[column].to_numpy(dtype=float)
    return [np.clip(value - table[f"{column}_low"].to_numpy(dtype=float), 0, None),
            np.clip(table[f"{column}_high"].to_numpy(dtype=float) - value, 0, None)]


def step_heatmap(scores: np.ndarray, hits: np.ndarray | None, token_labels: Sequence[str],
                 head_labels: Sequence[str], title: str, colorbar: str):
    """Heads (rows) x generated tokens (columns); dots mark Eq. 1 hits when given."""
    width = max(6.0, 0.32 * len(token_labels) + 2)
    fig, ax = plt.subplots(figsize=(width, 0.35 * len(head_labels) + 1.8))
    sns.heatmap(scores, ax=ax, cmap="viridis", vmin=0, vmax=max(float(np.nanmax(scores)), 1e-6),
                xticklabels=list(token_labels), yticklabels=list(head_labels), cbar_kws={"label": colorbar})
    if hits is not None:
        rows, cols = np.nonzero(hits)
        ax.scatter(cols + 0.5, rows + 0.5, s=14, c="white", edgecolors="black", linewidths=0.5,
                   label="Eq. 1 retrieval head")
        if len(rows):
            ax.legend(loc="upper right", bbox_to_anchor=(1.0, 1.18), fontsize=8, frameon=False)
    ax.set_xlabel("generated token")
    ax.set_ylabel("head")
    ax.set_title(title)
    plt.setp(ax.get_xticklabels(), rotation=90, fontsize=7)
    fig.tight_layout()
    return fig
