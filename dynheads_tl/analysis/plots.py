"""Figure helpers more than one claim draws with: the heads x generated tokens heatmap (notebooks 00 and 01), error
bars from an interval's bounds, and what a figure needs to be read on a notebook page: the scale at which the page
shows it, the text widths it is laid out with, and long titles and notes wrapped to the width they have."""
from __future__ import annotations

from contextlib import contextmanager
from functools import lru_cache
from typing import Callable, Iterator, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
import seaborn.matrix

__all__ = ["FIGURE_DPI", "INLINE_WIDTH_PX", "MIN_TEXT_PX", "error_bars", "heatmaps_drawn_once", "shown_scale",
           "step_heatmap", "text_width", "wrap_to_width"]

# A figure is saved at FIGURE_DPI (report.figures.save_figure) and a notebook page shows it at its natural size, or,
# when it is wider, at the page's column width: INLINE_WIDTH_PX at a 1280 px wide window (the contents sidebar and
# the cell's prompt take the rest; measured in Chromium, and checked by tests/test_browser.py). Text drawn at s points
# reads s * FIGURE_DPI / 72 * shown_scale(width) px there; MIN_TEXT_PX is the least a figure's text may read.
FIGURE_DPI = 130
INLINE_WIDTH_PX = 921
MIN_TEXT_PX = 9.0


def shown_scale(width_px: float) -> float:
    """The scale at which a notebook page at 1280 px shows a PNG ``width_px`` wide (1 when it fits)."""
    return min(1.0, INLINE_WIDTH_PX / float(width_px))


@lru_cache(maxsize=4096)
def text_width(text: str, fontsize: float) -> float:
    """How wide ``text`` is drawn at ``fontsize`` points, in inches (the Agg renderer's measure, default font)."""
    from matplotlib.font_manager import FontProperties

    renderer = _renderer()
    width = max((renderer.get_text_width_height_descent(line, FontProperties(size=fontsize), ismath=False)[0]
                 for line in text.split("\n")), default=0.0)
    return width / renderer.dpi


@lru_cache(maxsize=1)
def _renderer():
    from matplotlib.backends.backend_agg import RendererAgg

    return RendererAgg(100, 100, 72)


@contextmanager
def heatmaps_drawn_once(fig) -> Iterator[Callable]:
    """Yields ``heatmap(data, ax=..., **kwargs)``: ``sns.heatmap`` without the draw of the whole figure it makes at every
    call to see whether the heatmap's tick labels overlap. On leaving, ``fig`` is drawn once and the labels seaborn
    would have turned are turned: x labels still level that overlap turn vertical, y labels still vertical that overlap
    turn level (seaborn's rule, read in the figure's final layout). On a figure of many panels under constrained
    layout those draws were most of its time: each laid out and drew every panel so far."""
    drawn = []

    def heatmap(data, ax, **kwargs):
        real = seaborn.matrix._draw_figure
        seaborn.matrix._draw_figure = lambda figure: None
        try:
            sns.heatmap(data, ax=ax, **kwargs)
        finally:
            seaborn.matrix._draw_figure = real
        drawn.append(ax)
        return ax

    yield heatmap
    if not drawn:
        return
    fig.canvas.draw()
    for ax in drawn:
        x, y = ax.get_xticklabels(), ax.get_yticklabels()
        if any(label.get_rotation() == 0 for label in x) and seaborn.matrix.axis_ticklabels_overlap(x):
            plt.setp([label for label in x if label.get_rotation() == 0], rotation="vertical")
        if any(label.get_rotation() == 90 for label in y) and seaborn.matrix.axis_ticklabels_overlap(y):
            plt.setp([label for label in y if label.get_rotation() == 90], rotation="horizontal")


def wrap_to_width(text: str, width: float, fontsize: float) -> str:
    """``text`` with its lines broken between words so that none is wider than ``width`` inches at ``fontsize``
    points (a word longer than the width keeps a line of its own); the line breaks it has are kept."""
    lines = []
    for paragraph in text.split("\n"):
        line = ""
        for word in paragraph.split(" "):
            candidate = f"{line} {word}" if line else word
            if line and text_width(candidate, fontsize) > width:
                lines.append(line)
                line = word
            else:
                line = candidate
        lines.append(line)
    return "\n".join(lines)


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
