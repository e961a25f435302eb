"""Claim 2's figures: the masking grids (Fig 2 / Fig 6) with one panel per condition, the progressive masking
curves (Fig 3 / Fig 7) and the size-matched controls."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from dynheads_tl.analysis.plots import error_bars, heatmaps_drawn_once, text_width, wrap_to_width
from dynheads_tl.protocols.conditions import CONDITIONS, condition_titles
from dynheads_tl.analysis.statistics import bootstrap_interval, wilson_interval

__all__ = ["condition_heatmaps", "NIAH_RANKING", "HOTPOT_RANKING", "progressive_figure", "controls_figure"]


# The paper's conditions first, then our size-matched controls (see dynheads_tl.protocols.ablation).
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


# The grids' text, in points: every cell's mean and interval, the panel titles, ticks and the note below the panels.
# With the figure at most GRID_MAX_WIDTH inches wide, 9 points read at least 9 px on a notebook page at 1280 px
# (analysis.plots.shown_scale).
GRID_TEXT_PT = 9
GRID_MAX_WIDTH = 12.0


def _is_drop(metric: str) -> bool:
    """Whether ``metric`` is a teacher-forced drop (nats per step, larger = more damage), not a score in [0, 1]."""
    return "drop" in metric


def _drop_colours(means: np.ndarray):
    """The colour map and its range for drops: blue-white-red centred at 0 with the same scale on both sides (a drop
    of d nats is as red as a gain of d nats is blue), cut to the range the cells take, so that the colour bar shows
    only that range; 0 (no drop) is white."""
    from matplotlib.colors import ListedColormap

    finite = means[np.isfinite(means)]
    low = min(0.0, float(finite.min())) if finite.size else 0.0
    high = max(0.0, float(finite.max())) if finite.size else 0.0
    reach = max(abs(low), abs(high)) or 1.0
    full = plt.get_cmap("RdBu_r")
    cut = ListedColormap(full(np.linspace(0.5 + low / (2 * reach), 0.5 + high / (2 * reach), 256)), name="drop")
    return cut, low, (high if high > low else low + 1.0)


def _panel_title(title: str, heads: str, width: float, fontsize: float) -> str:
    """A panel's title wrapped to ``width`` inches, its "(n heads/step)" kept whole: after the title where it fits on
    the last line, else on a line of its own."""
    wrapped = wrap_to_width(title, width, fontsize)
    last = wrapped.rsplit("\n", 1)[-1]
    return wrapped + heads if text_width(last + heads, fontsize) <= width else wrapped + "\n" + heads.strip()


def condition_heatmaps(grid: pd.DataFrame, metric: str, title: str, k: int | None = None):
    """Fig 2 / Fig 6: one context x depth heatmap of ``metric`` per masking condition (up to 4 panels a row, as many
    as fit in :data:`GRID_MAX_WIDTH` inches with every cell's interval legible).

    Each panel's title gives the mean number of heads masked per step; the figure title gives n (runs per
    cell and per panel) and, with ``k``, which panels mask the fixed k and which a number set by D_t. A score
    (accuracy, F1) is coloured red (0) to green (1); a drop (``tf_drop``: the gold token's log-probability lost per
    step, nats) on its own scale, white at 0 and redder the more is lost (blue: a gain), with its own colour bar."""

    titles = condition_titles()
    conditions = _ordered_conditions(grid["condition"])
    text = GRID_TEXT_PT
    drop = _is_drop(metric)

    def cell(values: pd.Series) -> str:  # the cell's mean and 95% interval (Wilson for 0/1, bootstrap otherwise)
        data = pd.to_numeric(values, errors="coerce").dropna().to_numpy(float)
        binary = not drop and len(data) and set(np.unique(data)) <= {0.0, 1.0}  # a drop of 0 is no proportion
        ci = wilson_interval(int(data.sum()), len(data)) if binary else bootstrap_interval(data)
        return f"{ci.estimate:.2f}\n[{ci.low:.2f}, {ci.high:.2f}]"

    tables, labels = {}, {}
    for condition in conditions:
        part = grid[grid["condition"] == condition]
        tables[condition] = part.pivot_table(index="context", columns="depth", values=metric, aggfunc="mean")
        labels[condition] = part.groupby(["context", "depth"])[metric].apply(cell).unstack("depth").reindex(
            index=tables[condition].index, columns=tables[condition].columns)
    # Each panel is as wide as its cells' labels need (and no narrower than a two-line title needs); as many panels a
    # row as fit in the width, so no text has to shrink when the page scales the figure down.
    n_rows = max(len(t.index) for t in tables.values())
    n_columns = max(len(t.columns) for t in tables.values())
    widest = max((text_width(str(label), text) for frame in labels.values() for label in frame.to_numpy().ravel()
                  if isinstance(label, str)), default=0.5)
    panel_width = max(2.5, n_columns * (widest + 0.1))
    gap, left, right = 0.35, 0.75, 1.0
    columns = max([c for c in range(1, min(4, len(conditions)) + 1)
                   if left + c * panel_width + (c - 1) * gap + right <= GRID_MAX_WIDTH] or [1])
    rows = -(-len(conditions) // columns)
    heads = {c: (f" ({grid.loc[grid['condition'] == c, 'heads_masked_per_step'].mean():.1f} heads/step)"
                 if "heads_masked_per_step" in grid and c != "none" else "") for c in conditions}
    panel_titles = {c: _panel_title(titles[c], heads[c], panel_width, text) for c in conditions}
    title_lines = max(t.count("\n") + 1 for t in panel_titles.values())
    width = left + columns * panel_width + (columns - 1) * gap + right
    row_height = n_rows * 0.5 + title_lines * text * 1.3 / 72 + 0.55
    per_panel = grid.groupby("condition").size()
    note = (f"Each cell: mean {metric}{' (nats/step)' if drop else ''} with its 95% interval "
            f"({'Wilson' if metric in ('accuracy', 'em') else 'bootstrap'}); "
            f"{_runs_per_cell(grid)} runs per cell, {int(per_panel.min())} per panel.")
    if k is not None:
        fixed = [titles[c] for c in conditions if CONDITIONS[c].sizing == "fixed_k"]
        note += f"\nfixed k = {k} heads at every step: {', '.join(fixed) or 'none'}"
        for label, sizings in (("sized by D_t at each step", ("D_t", "part")),
                               ("sized by D_{t-1} at each step (nothing at step 0)", ("D_{t-1}",))):
            sized = [titles[c] for c in conditions if CONDITIONS[c].sizing in sizings]
            if sized:
                note += f"; {label}: {', '.join(sized)}"
    note_lines = wrap_to_width(note, width - 0.3, text).count("\n") + 1
    fig, axes = plt.subplots(rows, columns, figsize=(width, rows * row_height + 0.45 + note_lines * text * 1.35 / 72),
                             sharey=True, squeeze=False, layout="constrained")
    fig.get_layout_engine().set(w_pad=0.04, h_pad=0.06, wspace=gap / width, hspace=0.04)
    flat = axes.flatten()
    if drop:
        means = np.concatenate([t.to_numpy(float).ravel() for t in tables.values()])
        cmap, vmin, vmax = _drop_colours(means)
        bar_label = "mean drop (nats/step)" if metric == "tf_drop" else f"mean {metric}: drop (nats/step)"
    else:
        cmap, vmin, vmax, bar_label = "RdYlGn", 0, 1, f"mean {metric}"

    image = None
    with heatmaps_drawn_once(fig) as heatmap:
        for ax, condition in zip(flat, conditions):
            heatmap(tables[condition], ax=ax, vmin=vmin, vmax=vmax, cmap=cmap, annot=labels[condition].to_numpy(),
                    fmt="", cbar=False, annot_kws={"fontsize": text})
            image = ax.collections[0]
            ax.set_title(panel_titles[condition], fontsize=text)
            ax.tick_params(labelsize=text)
            ax.tick_params(axis="y", labelrotation=0)
            ax.set_xlabel("depth" if condition in conditions[-columns:] else "", fontsize=text)
            ax.set_ylabel("context tokens" if ax in axes[:, 0] else "", fontsize=text)
    for ax in flat[len(conditions):]:
        ax.set_visible(False)
    if image is not None:
        bar = fig.colorbar(image, ax=axes, shrink=min(1.0, max(0.6, 2.2 / (rows * row_height))), aspect=30)
        bar.set_label(bar_label, fontsize=text)
        bar.ax.tick_params(labelsize=text)
    fig.suptitle(title, fontsize=12)
    # The note is wrapped to the figure's width as it is drawn (its text stays one string per line given), so it never
    # widens the saved image beyond the panels.
    fig.supxlabel(note, fontsize=text, wrap=True)
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
