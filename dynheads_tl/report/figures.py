"""Figures and tables, each written with the numbers behind it and the config that made it.

Every figure: ``NAME.png`` + ``NAME.pdf`` + ``NAME.csv`` + ``NAME.config.json``.
Every table: ``NAME.csv`` + ``NAME.md`` + ``NAME.config.json``.

This module draws the figures of claims 1 to 3 and is the one the notebooks import: it re-exports how files are
written (:mod:`~dynheads_tl.report.figure_files`) and the figures of notebooks 04 to 06
(:mod:`~dynheads_tl.report.figures_applications`).
"""
from __future__ import annotations

from typing import Sequence

# No matplotlib.use(...) here: importing the package must not change a user's backend (inline plots in
# their notebooks). Without a display matplotlib already picks a non-interactive backend.
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from dynheads_tl.protocols.conditions import CONDITIONS, condition_titles
from dynheads_tl.report.figure_files import (PDF_METADATA, error_bars, markdown_table, save_figure,  # noqa: F401
                                             save_table, write_config)
from dynheads_tl.report.figures_applications import (error_signal_figure, rag_strategies_figure,  # noqa: F401
                                                     retention_figure, rind_calibration_figure)


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
    from matplotlib.patches import Patch

    left.legend(handles=[Patch(color="tab:orange", label="static top-20"), Patch(color="tab:blue", label="other")])
    right.plot(np.arange(1, len(curve) + 1), curve)
    right.axhline(n_heads, color="grey", ls=":", label=f"all {n_heads} heads")
    right.set_xlabel("decoding steps seen")
    right.set_ylabel("distinct heads ever active")
    right.set_title(f"{title}: heads seen vs steps")
    right.legend()
    fig.tight_layout()
    return fig


# Claim 2's condition titles and sizings come from the condition specs (dynheads_tl.protocols.conditions): a
# condition declared there gets its panel and its row here, in the registry's order.


def _ordered_conditions(names: pd.Series) -> list[str]:
    """The conditions of a grid or summary in the registry's order; a name no spec declares is refused with a
    sentence (a condition never drops out of a figure silently)."""
    present = set(names)
    unknown = sorted(present - set(CONDITIONS))
    if unknown:
        raise ValueError(f"No condition spec declares {', '.join(map(repr, unknown))}: declare each condition once in "
                         "dynheads_tl.protocols.conditions (register_condition) so that it has a title and a panel.")
    return [c for c in CONDITIONS if c in present]


def _runs_per_cell(grid: pd.DataFrame) -> str:
    counts = grid.groupby(["condition", "context", "depth"]).size()
    low, high = int(counts.min()), int(counts.max())
    return f"n = {low}" if low == high else f"n = {low}–{high}"


def condition_heatmaps(grid: pd.DataFrame, metric: str, title: str, k: int | None = None):
    """Fig 2 / Fig 6: one context x depth heatmap of ``metric`` per masking condition (4 panels a row).

    Each panel's title gives the mean number of heads masked per step; the figure title gives n (runs per
    cell and per panel) and, with ``k``, which panels mask the fixed k and which a number set by D_t."""
    from dynheads_tl.analysis.statistics import bootstrap_interval, wilson_interval

    titles = condition_titles()
    conditions = _ordered_conditions(grid["condition"])
    columns = min(4, len(conditions))
    rows = -(-len(conditions) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.6 * columns + 1.2, 2.5 * rows + 1.3), sharey=True,
                             squeeze=False, layout="constrained")
    flat = axes.flatten()

    def cell(values: pd.Series) -> str:  # the cell's mean and 95% interval (Wilson for 0/1, bootstrap otherwise)
        data = pd.to_numeric(values, errors="coerce").dropna().to_numpy(float)
        binary = len(data) and set(np.unique(data)) <= {0.0, 1.0}
        ci = wilson_interval(int(data.sum()), len(data)) if binary else bootstrap_interval(data)
        return f"{ci.estimate:.2f}\n[{ci.low:.2f}, {ci.high:.2f}]"

    image = None
    for ax, condition in zip(flat, conditions):
        part = grid[grid["condition"] == condition]
        table = part.pivot_table(index="context", columns="depth", values=metric, aggfunc="mean")
        labels = part.groupby(["context", "depth"])[metric].apply(cell).unstack("depth").reindex(
            index=table.index, columns=table.columns)
        sns.heatmap(table, ax=ax, vmin=0, vmax=1, cmap="RdYlGn", annot=labels.to_numpy(), fmt="", cbar=False,
                    annot_kws={"fontsize": 9})
        image = ax.collections[0]
        heads = (f" ({part['heads_masked_per_step'].mean():.1f} heads/step)"
                 if "heads_masked_per_step" in part and condition != "none" else "")
        ax.set_title(titles[condition] + heads, fontsize=9)
        ax.set_xlabel("depth" if condition in conditions[-columns:] else "")
        ax.set_ylabel("context tokens" if ax in axes[:, 0] else "")
    for ax in flat[len(conditions):]:
        ax.set_visible(False)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.6, aspect=30, label=f"mean {metric}")
    per_panel = grid.groupby("condition").size()
    fig.suptitle(title, fontsize=12)
    note = (f"Each cell: mean {metric} with its 95% interval ({'Wilson' if metric in ('accuracy', 'em') else 'bootstrap'}); "
            f"{_runs_per_cell(grid)} runs per cell, {int(per_panel.min())} per panel.")
    if k is not None:
        fixed = [titles[c] for c in conditions if CONDITIONS[c].sizing == "fixed_k"]
        note += f"\nfixed k = {k} heads at every step: {', '.join(fixed) or 'none'}"
        for label, sizings in (("sized by D_t at each step", ("D_t", "part")),
                               ("sized by D_{t-1} at each step (nothing at step 0)", ("D_{t-1}",))):
            sized = [titles[c] for c in conditions if CONDITIONS[c].sizing in sizings]
            if sized:
                note += f"; {label}: {', '.join(sized)}"
    fig.supxlabel(note, fontsize=8)
    return fig


NIAH_RANKING = "Eq. 1 hits first, then attention share on the needle"
HOTPOT_RANKING = "Eq. 2 share on the supporting facts (not Eq. 1)"


def progressive_figure(summary: pd.DataFrame, metric: str, title: str, ranking: str = NIAH_RANKING):
    """Fig 3 / Fig 7: ``metric`` vs k masked heads (with its 95% interval when the summary has
    ``{metric}_low`` / ``_high``), and compensation m_s on a second axis. ``ranking`` names how the k heads
    of each step are chosen, for the x-axis label (NIAH: Eq. 1; HotpotQA: Eq. 2). Where the summary has the
    size-matched control (``random_`` columns: k random heads per step), both are drawn dashed beside the ranked
    curves, from the shared unmasked point at k = 0."""
    fig, ax = plt.subplots(figsize=(6.4, 4.4), layout="constrained")
    twin = ax.twinx()
    control = summary.dropna(subset=[f"random_{metric}"]) if f"random_{metric}" in summary else summary.iloc[:0]
    curves = [(summary, "", "ranked heads", "-", ("o", "s"))]
    if len(control):
        # The random curve starts at the shared unmasked point (k = 0 masks nothing under either rule).
        first = summary[summary["k"] == summary["k"].min()]
        columns = [metric, f"{metric}_low", f"{metric}_high", "m_s"]
        origin = first[["k"] + [c for c in columns if c in first]].rename(columns=lambda c: c if c == "k" else f"random_{c}")
        curves.append((pd.concat([origin, control], ignore_index=True), "random_", "random heads (size-matched)", "--",
                       ("^", "v")))
    # With the control drawn, the two series are dodged sideways by a fraction of the k spacing so that their
    # error bars do not sit on one another (the k values themselves are in the CSV and on the axis ticks).
    ks = np.unique(summary["k"].to_numpy(dtype=float))
    dodge = 0.12 * float(np.diff(ks).min()) if len(control) and len(ks) > 1 else 0.0
    for offset, (part, prefix, name, style, (marker, m_s_marker)) in zip((-dodge, dodge), curves):
        x, y = part["k"].to_numpy(dtype=float) + offset, part[f"{prefix}{metric}"].to_numpy(dtype=float)
        if f"{prefix}{metric}_low" in part:
            ax.errorbar(x, y, yerr=error_bars(part, f"{prefix}{metric}"), marker=marker, linestyle=style, color="tab:blue", capsize=3,
                        label=f"{metric}, {name}")
        else:
            ax.plot(x, y, marker=marker, linestyle=style, color="tab:blue", label=f"{metric}, {name}")
        twin.plot(x, part[f"{prefix}m_s"], marker=m_s_marker, linestyle=style, color="tab:red", label=f"m_s, {name}")
    ax.set_xlabel(f"k heads masked per step (ranked: {ranking})", fontsize=8)
    ax.set_ylabel(metric, color="tab:blue")
    ax.set_ylim(-0.05, 1.05)
    span = float(summary["k"].max() - summary["k"].min()) or 1.0
    ax.set_xlim(float(summary["k"].min()) - 0.05 * span - dodge, float(summary["k"].max()) + 0.05 * span + dodge)
    ax.set_xticks(ks)
    twin.set_ylabel("m_s: compensating static-top-20 heads", color="tab:red")
    highest = max([float(summary["m_s"].max())] + ([float(control["random_m_s"].max())] if len(control) else []))
    twin.set_ylim(-0.05 * max(highest, 1.0), None)
    handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2),
              ncol=2, frameon=False)
    n = f"\nn = {int(summary['n'].min())} samples per k, 95% CI" if "n" in summary else ""
    fig.suptitle(title + n, fontsize=10)
    return fig


def controls_figure(summary: pd.DataFrame, metric: str, title: str):
    """Every masking condition with its 95% interval (from ``irreplaceability.condition_summary``): the
    free-generation ``metric`` (left) and the teacher-forced drop of the gold token's log-probability per
    step (right), each condition labelled with the heads it masks per step and its n."""
    titles = condition_titles()
    conditions = _ordered_conditions(summary["condition"])
    table = summary.set_index("condition").loc[conditions]
    panels = [(metric, f"{metric} (free generation)")]
    if "tf_drop" in table:
        panels.append(("tf_drop", "gold log-prob drop per step, nats (teacher-forced)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 0.42 * len(conditions) + 1.6),
                             sharey=True, squeeze=False)
    y = np.arange(len(conditions))[::-1]
    labels = [f"{titles[c]} ({table.loc[c, 'heads_masked_per_step']:.1f}/step)"
              if "heads_masked_per_step" in table else titles[c] for c in conditions]
    for ax, (column, label) in zip(axes[0], panels):
        xerr = error_bars(table, column)
        ax.errorbar(table[column], y, xerr=xerr, fmt="o", color="tab:blue", capsize=3)
        ax.set_xlabel(label)
        ax.axvline(0, color="grey", lw=0.6)
        ax.set_yticks(y)
        ax.set_yticklabels(labels, fontsize=8)
    fig.suptitle(f"{title}\nn = {int(table['n'].min())} runs per condition; 95% CI (Wilson for accuracy / EM, "
                 "bootstrap over samples otherwise)", fontsize=9)
    fig.tight_layout()
    return fig


def cca_figure(curve: pd.DataFrame, title: str, paper: Sequence[float] | None = None,
               residualised: pd.DataFrame | None = None):
    """Fig 4 / Fig 8: the first canonical correlation vs lag k, with controls and the in-sample top-10/50
    means; with ``residualised`` (from ``correlation.residualised_summary``), the held-out curve after
    step and current token are regressed out, and its chance pairing, as means over splits with intervals."""
    fig, ax = plt.subplots(figsize=(6.8, 4.0))
    value = "first" if "first" in curve else "leading"
    styles = {"in-sample": ("tab:blue", "-"), "held-out": ("tab:green", "-"), "shuffled": ("tab:grey", "--"),
              "shuffled, same step": ("tab:purple", "--")}
    for control, (color, ls) in styles.items():
        part = curve[curve["control"] == control]
        if part.empty:
            continue
        ax.plot(part["k"], part[value], color=color, ls=ls, marker="o", label=f"{control}: first pair")
        if control == "in-sample":
            ax.plot(part["k"], part["top10_mean"], color=color, ls=":", label="in-sample: top-10 mean")
            ax.plot(part["k"], part["top50_mean"], color=color, ls="-.", label="in-sample: top-50 mean")
    if residualised is not None:
        for control, color, label in (("held-out, residualised", "tab:red", "held-out, step, tokens read at n and n+k, token generated at n+k regressed out"),
                                      ("held-out, residualised, chance", "tab:orange", "the same, chance pairing")):
            part = residualised[residualised["control"] == control]
            if part.empty:
                continue
            ax.errorbar(part["k"], part["first"], yerr=[part["first"] - part["first_low"], part["first_high"] - part["first"]],
                        color=color, marker="s", capsize=3, label=f"{label} (mean of {int(part['splits'].min())} splits, 95% CI)")
    if paper is not None:
        ax.plot(range(len(paper)), paper, color="black", marker="x", ls="", label="paper (Llama-3.1-8B)")
    ax.set_xlabel("lag k (hidden state at n, scores at n + k)")
    ax.set_ylabel("canonical correlation")
    lowest = [0.0, *(line.get_ydata().min() for line in ax.get_lines() if len(line.get_ydata()))]
    if residualised is not None and "first_low" in residualised:
        lowest.append(float(residualised["first_low"].min()))
    ax.set_ylim(min(lowest) - 0.05, 1.03)
    ax.set_title(title)
    ax.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    fig.set_size_inches(10.5, 4.2)
    fig.tight_layout()
    return fig


def cca_splits_figure(summary: pd.DataFrame, title: str, paper: Sequence[float] | None = None,
                      residualised: pd.DataFrame | None = None):
    """Fig 4 / Fig 8 as means over splits by layout (``claims.correlation.cca_table``'s summary): the first canonical
    correlation vs lag k for the in-sample fit and the held-out fit and both shuffled controls (all fitted on the
    training layouts and scored on the held-out ones), each with its 95% interval; with ``residualised``, the
    held-out curve with step, tokens and depth regressed out and its chance pairing."""
    fig, ax = plt.subplots(figsize=(6.8, 4.0))
    styles = {"in-sample": ("tab:blue", "-"), "held-out": ("tab:green", "-"), "shuffled": ("tab:grey", "--"),
              "shuffled, same step": ("tab:purple", "--")}
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
    ax.legend(fontsize=6.5, loc="lower left")
    fig.tight_layout()
    return fig


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
