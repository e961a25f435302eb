"""The case study's figures: RIND's calibration, Table 4's strategies and their teacher-forced gold-answer
log-probability."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from dynheads_tl.analysis.plots import error_bars

__all__ = ["rind_calibration_figure", "rag_strategies_figure", "rag_teacher_forced_figure"]


def rind_calibration_figure(table: pd.DataFrame, threshold: float):
    """Each calibration answer's largest RIND value (answered without retrieval), wrong and right apart, with the
    chosen threshold."""
    fig, ax = plt.subplots(figsize=(6.4, 2.4))
    for wrong, colour, label in ((True, "tab:red", "wrong (F1 < 0.5)"), (False, "tab:green", "right")):
        values = table.loc[table["wrong"] == wrong, "rind_max"].to_numpy(float)
        if len(values):
            ax.scatter(values, np.full(len(values), 0.0 if wrong else 1.0) + np.linspace(-0.15, 0.15, len(values)),
                       color=colour, label=f"{label} (n = {len(values)})", s=18)
    ax.axvline(threshold, color="black", linestyle="--", label=f"threshold {threshold:.2f}")
    ax.set_yticks([0, 1], ["wrong", "right"])
    ax.set_ylim(-0.4, 1.4)
    values = np.append(table["rind_max"].to_numpy(float), threshold)
    values = values[np.isfinite(values)]
    if len(values):
        pad = 0.08 * (values.max() - values.min() or abs(values.max()) or 1.0)
        ax.set_xlim(values.min() - pad, values.max() + pad)
    ax.set_xlabel("largest RIND value of the answer (no retrieval)")
    ax.set_ylabel("answer")
    ax.set_title(f"RIND threshold calibration (n = {len(table)} answers)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    fig.tight_layout()
    return fig


def rag_strategies_figure(table: pd.DataFrame, title: str):
    """Table 4 as a picture: F1 per strategy with its 95% interval, and the evidence recall per share of context
    opened (1 = chance) for the strategies that retrieve."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    ax = axes[0]
    ax.bar(table["method"], table["f1"], yerr=error_bars(table, "f1"), color="tab:blue", capsize=3)
    ax.set_ylabel("F1 (bootstrap 95%)")
    ax.set_ylim(0, 1)
    ax.tick_params(axis="x", rotation=35, labelsize=7)
    opened = table[~table["strategy"].isin(["none", "full"])]
    ax = axes[1]
    if len(opened):
        ax.bar(opened["method"], opened["recall_per_visible"], yerr=error_bars(opened, "recall_per_visible"),
               color="tab:orange", capsize=3)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="chance")
    ax.set_ylabel("evidence recall / share opened")
    ax.tick_params(axis="x", rotation=35, labelsize=7)
    ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def rag_teacher_forced_figure(table: pd.DataFrame, comparisons: pd.DataFrame, title: str):
    """The teacher-forced secondary as a picture: the gold answer's mean log-probability per strategy (nats/token,
    bootstrap 95% over questions, n per bar), and Dynamic (probe) minus each other strategy with its paired 95%
    interval (filled: separated after Holm; hollow: not separated or untestable)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    ax = axes[0]
    labels = [f"{method} (n = {int(n)})" for method, n in zip(table["method"], table["tf_n"])]
    ax.bar(labels, table["tf_logprob"], yerr=error_bars(table, "tf_logprob"), color="tab:purple", capsize=3)
    ax.set_ylabel("gold log-prob, nats/token (bootstrap 95%)")
    ax.tick_params(axis="x", rotation=35, labelsize=7)
    ax = axes[1]
    family = comparisons[comparisons["family"] == "secondary"] if len(comparisons) else comparisons
    if len(family):
        names = [table.set_index("strategy")["method"].get(b, b) for b in family["b"]]
        estimate = family["tf_logprob_difference"].to_numpy(float)
        below = np.clip(estimate - family["low"].to_numpy(float), 0, None)
        above = np.clip(family["high"].to_numpy(float) - estimate, 0, None)
        separated = family["separated"].map(lambda v: str(v).strip().lower() == "true").to_numpy(bool)
        for x in range(len(family)):
            ax.errorbar([x], [estimate[x]], yerr=[[below[x]], [above[x]]], fmt="o", color="tab:purple", capsize=3,
                        markerfacecolor="tab:purple" if separated[x] else "white")
        ax.set_xticks(range(len(family)), [f"− {name}" for name in names])
    ax.axhline(0.0, color="black", linestyle="--", linewidth=1)
    ax.set_ylabel("Dynamic (probe) minus, nats/token")
    ax.set_title("paired 95%; filled: separated (sign test, Holm)", fontsize=8)
    ax.tick_params(axis="x", rotation=35, labelsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig
