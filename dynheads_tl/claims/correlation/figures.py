"""Claim 3's figures: CCA against lag over splits by layout (Fig 4 / Fig 8) and the probes k steps ahead."""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import pandas as pd

from dynheads_tl.analysis.plots import wrap_to_width

__all__ = ["cca_splits_figure", "lead_figure"]


def cca_splits_figure(summary: pd.DataFrame, title: str, paper: Sequence[float] | None = None,
                      residualised: pd.DataFrame | None = None):
    """Fig 4 / Fig 8 as means over splits by layout (``claims.correlation.cca_table``'s summary): the first canonical
    correlation vs lag k for the in-sample fit and the held-out fit and both shuffled controls (all fitted on the
    training layouts and scored on the held-out ones), each with its 95% interval; with ``residualised``, the
    held-out curve with step, tokens and depth regressed out and its chance pairing."""
    fig, ax = plt.subplots(figsize=(6.8, 5.4), layout="constrained")
    styles = {"in-sample": ("tab:blue", "-"), "held-out": ("tab:green", "-"), "shuffled": ("tab:grey", "--"),
              "shuffled, same step": ("tab:purple", "--"), "permuted within sample": ("tab:brown", ":")}
    n = int(summary["splits"].min()) if len(summary) else 0
    for control, (color, ls) in styles.items():
        part = summary[summary["control"] == control].sort_values("k")
        if part.empty:
            continue
        ax.errorbar(part["k"], part["first"], yerr=[part["first"] - part["first_low"], part["first_high"] - part["first"]],
                    color=color, ls=ls, marker="o", capsize=3,
                    label=f"{control}{' (training layouts)' if control == 'in-sample' else ', held-out layouts'}")
    if residualised is not None:
        for control, color, label in (("held-out, residualised", "tab:red", "held-out, step + tokens read and generated + depth regressed out"),
                                      ("held-out, residualised, chance", "tab:orange", "the same, chance pairing")):
            part = residualised[residualised["control"] == control].sort_values("k")
            if part.empty:
                continue
            ax.errorbar(part["k"], part["first"], yerr=[part["first"] - part["first_low"], part["first_high"] - part["first"]],
                        color=color, marker="s", capsize=3, label=label)
    if paper is not None:
        ax.plot(range(len(paper)), paper, color="black", marker="x", ls="", label="paper (Llama-3.1-8B, in-sample)")
    sizes = (f"n = {int(summary['n_samples'].iloc[0])} samples, {int(summary['n_clusters'].iloc[0])} layouts"
             if len(summary) else "")
    ax.axhline(0, color="black", lw=0.6)
    ax.set_xlabel("lag k (hidden state at n, scores at n + k)")
    ax.set_ylabel("first canonical correlation")
    ax.set_ylim(min(-0.05, float(summary["first_low"].min()) - 0.02) if len(summary) else -0.05, 1.02)
    ax.set_title(f"{title}\nmeans of {n} splits by layout, 95% corrected resampled CI; {sizes}", fontsize=9)
    _legend_below(fig, ax)
    return fig


def _legend_below(fig, ax, columns: int = 2, fontsize: float = 8) -> None:
    """The axes' legend under the figure, outside every axes (it covers no curve), in ``columns`` columns whose labels
    are wrapped to the width each column has."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    column_width = (fig.get_size_inches()[0] - 0.6) / columns - 0.6  # the handle and the gaps take the rest
    fig.legend(handles, [wrap_to_width(label, column_width, fontsize) for label in labels], loc="outside lower center",
               ncol=columns, fontsize=fontsize, frameon=False)


def lead_figure(panels: Sequence[tuple[pd.DataFrame, str, str]], title: str, split_label: str = "by-sample"):
    """Probe minus step-aware prior (and minus base rate) against k, with 95% intervals over splits; one
    panel per (differences table, metric, panel title); ``split_label`` says how the splits were drawn."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for ax, (diffs, metric, panel_title) in zip(axes[0], panels):
        part = diffs[diffs["metric"] == metric].sort_values("k")
        for name, color, label in (("vs_step_prior", "tab:red", "probe − step-aware prior"),
                                   ("vs_base_rate", "tab:grey", "probe − base rate")):
            ax.errorbar(part["k"], part[name], yerr=[part[name] - part[f"{name}_low"], part[f"{name}_high"] - part[name]],
                        color=color, marker="o", capsize=3, label=label)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xlabel("k (hidden state at n, target at n + k)")
        ax.set_ylabel(f"difference in {metric.upper()}")
        n = int(part["splits"].min()) if len(part) else 0
        ax.set_title(f"{panel_title}\n95% CI over {n} {split_label} splits", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
