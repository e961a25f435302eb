"""The figures of notebooks 04 to 06: the dynamic-RAG case study (RIND calibration, strategies), the error signal
(ROC curves, AUROCs, transfer) and per-step KV retention. Re-exported by :mod:`dynheads_tl.report.figures`.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from dynheads_tl.report.figure_files import error_bars


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


def error_signal_figure(roc: pd.DataFrame, table: pd.DataFrame, transfer: pd.DataFrame, title: str):
    """Notebook 05: the out-of-fold ROC curve of every feature group (AUROC and its interval in the legend), and
    the transfer AUROC of every group per (train -> test) pair with 95% intervals; 0.5 is chance."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 6.6), gridspec_kw={"width_ratios": [1, 1.4]})
    ax = axes[0]
    names = dict(zip(table["group"], table["method"]))
    for row in table.itertuples():
        part = roc[roc["group"] == row.group]
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
