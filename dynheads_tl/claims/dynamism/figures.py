"""Claim 1's figures: the long tail of activations, the size-aware overlap, soft dynamism and Eq. 2's cutoff
calibration (Fig 1 is the shared :func:`~dynheads_tl.analysis.plots.step_heatmap`)."""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
from matplotlib.patches import Patch
import numpy as np
import pandas as pd

__all__ = ["long_tail_figure", "size_aware_figure", "soft_dynamism_figure", "eq2_calibration_figure"]


def long_tail_figure(frequency: pd.DataFrame, curve: Sequence[int], n_heads: int, title: str):
    """Left: ranked activation frequency, static heads marked. Right: distinct heads vs steps."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6))
    ranked = frequency.sort_values("frequency", ascending=False).reset_index(drop=True)
    ranked = ranked[ranked["frequency"] > 0]
    colors = np.where(ranked["static_top20"], "tab:orange", "tab:blue")
    left.bar(np.arange(len(ranked)), ranked["frequency"], color=colors, width=1.0)
    left.set_xlabel("head rank (active heads only)")
    left.set_ylabel("fraction of steps active")
    left.set_title(f"{title}: activation frequency")
    left.legend(handles=[Patch(color="tab:orange", label="static top-20"), Patch(color="tab:blue", label="other")])
    right.plot(np.arange(1, len(curve) + 1), curve)
    right.axhline(n_heads, color="grey", ls=":", label=f"all {n_heads} heads")
    right.set_xlabel("decoding steps seen")
    right.set_ylabel("distinct heads ever active")
    right.set_title(f"{title}: heads seen vs steps")
    right.legend()
    fig.tight_layout()
    return fig


def size_aware_figure(table: pd.DataFrame, title: str):
    """The static-size sweep against what set sizes allow: the paper's Jaccard(D_t, S_k) and its size bound
    min(|D_t|, k) / max(|D_t|, k) against k (left); static coverage and the share of activations outside S_k
    (right). Error bars: 95% bootstrap intervals over analysis samples."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.6, 3.6))
    def draw(ax, metric, color, label, ls="-"):
        part = table[table["metric"] == metric].sort_values("static_k")
        ax.errorbar(part["static_k"], part["value"], yerr=[part["value"] - part["low"], part["high"] - part["value"]],
                    color=color, ls=ls, marker="o", capsize=3, label=label)
    draw(left, "jaccard_static", "tab:blue", "Jaccard(D_t, S_k) (paper's metric)")
    draw(left, "jaccard_bound", "tab:grey", "largest Jaccard the sizes allow", ls="--")
    draw(left, "jaccard_over_bound", "tab:green", "Jaccard / that bound")
    draw(right, "static_coverage", "tab:purple", "|D_t ∩ S_k| / |D_t|")
    draw(right, "share_outside_static", "tab:red", "share of activations outside S_k")
    left.set_ylabel("Jaccard (and its size bound)")
    right.set_ylabel("share of D_t's activations")
    for ax in (left, right):
        ax.set_xlabel("static set size k")
        ax.set_ylim(-0.02, 1.05)
        ax.legend(fontsize=7)
    n = int(table["n_samples"].min()) if len(table) else 0
    fig.suptitle(f"{title} (95% bootstrap CI over {n} samples)", fontsize=10)
    fig.tight_layout()
    return fig


def soft_dynamism_figure(table: pd.DataFrame, title: str, metrics: Sequence[str] = ("jaccard_adjacent", "heads_per_step")):
    """Claim 1, soft dynamism: per setting (and pooled), each set definition's value of ``metrics`` with its 95%
    interval: Eq. 1's argmax criterion beside copy and evidence mass above each threshold."""
    settings = list(dict.fromkeys(table["setting"]))
    definitions = list(dict.fromkeys(table["definition"]))
    fig, axes = plt.subplots(1, len(metrics), figsize=(6.2 * len(metrics), 3.8))
    axes = np.atleast_1d(axes)
    width = 0.8 / max(len(definitions), 1)
    colors = plt.get_cmap("tab10")
    for ax, metric in zip(axes, metrics):
        part = table[table["metric"] == metric]
        for d, definition in enumerate(definitions):
            rows = part[part["definition"] == definition].set_index("setting").reindex(settings)
            x = np.arange(len(settings)) + (d - (len(definitions) - 1) / 2) * width
            errors = np.array([rows["value"] - rows["low"], rows["high"] - rows["value"]]).clip(min=0)
            ax.bar(x, rows["value"], width, yerr=errors, capsize=2, color=colors(d), label=definition)
        ax.set_xticks(np.arange(len(settings)))
        ax.set_xticklabels([f"{s}\n(n = {int(part[part['setting'] == s]['n_samples'].iloc[0])})" for s in settings],
                           fontsize=8)
        ax.set_ylabel({"jaccard_adjacent": "adjacent-step Jaccard", "heads_per_step": "heads per step",
                       "persistence": "share of heads kept at next step"}.get(metric, metric))
        if metric in ("jaccard_adjacent", "persistence"):
            ax.set_ylim(0, 1.05)
    axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def eq2_calibration_figure(curve: pd.DataFrame, title: str):
    """Why Eq. 2's factor: the share of head-steps marked on the real supporting facts and on placebo spans, and
    the mean |D_t| on the real facts, as the factor over chance grows; the chosen factor dashed."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    ax = axes[0]
    ax.plot(curve["factor"], curve["real_rate"], marker="o", markersize=3, label="real supporting facts")
    ax.plot(curve["factor"], curve["placebo_rate"], marker="o", markersize=3, label="placebo spans")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("factor c (share > c x chance)")
    ax.set_ylabel("share of head-steps marked")
    ax = axes[1]
    ax.plot(curve["factor"], curve["heads_per_step"], marker="o", markersize=3, color="tab:green")
    ax.set_xscale("log")
    ax.set_xlabel("factor c (share > c x chance)")
    ax.set_ylabel("mean |D_t| on the real facts")
    for ax in axes:
        chosen = curve[curve["chosen"]]
        if len(chosen):
            ax.axvline(float(chosen["factor"].iloc[0]), color="black", linestyle="--", linewidth=1,
                       label=f"chosen c = {float(chosen['factor'].iloc[0]):.2f}")
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig
