"""Figures a reader can read on a notebook page (#65 item 4), measured without a browser: each figure is drawn from a
small hand-made table, saved as the report saves it (``FIGURE_DPI``, tight bounding box), and its text is measured at
the scale at which a page 1280 px wide shows it (``INLINE_WIDTH_PX``, checked in a browser by test_browser.py).

- every text of the figure reads at least ``MIN_TEXT_PX`` px there;
- the saved image is about as wide as its panels (no one-line footnote widening the bounding box);
- no two titles overlap, nor a title another panel, nor the note below the panels any panel's labels;
- the cells' labels (mean and interval) stay within their cells;
- a legend lies where no plotted point is;
- Fig 2 by length's teacher-forced drop has a colour map of its own (white at no drop, red for a drop), with a
  labelled colour bar;
- and on the rendered page each figure is a link that shows it at full size.
"""
from __future__ import annotations

import base64
import io
import itertools
import re
import struct

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.text  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402

from dynheads_tl.analysis.plots import (FIGURE_DPI, INLINE_WIDTH_PX, MIN_TEXT_PX, heatmaps_drawn_once,  # noqa: E402
                                        shown_scale, text_width, wrap_to_width)
from dynheads_tl.claims.correlation.figures import cca_splits_figure  # noqa: E402
from dynheads_tl.claims.irreplaceability.figures import GRID_MAX_WIDTH, condition_heatmaps  # noqa: E402
from dynheads_tl.protocols.conditions import grid_conditions  # noqa: E402


# --- measures --------------------------------------------------------------------------------------

def _saved_width(fig) -> int:
    """The width in px of the PNG the report would write (report.figures.save_figure's dpi and bounding box)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=FIGURE_DPI, bbox_inches="tight")
    data = buffer.getvalue()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">I", data[16:20])[0]


def _shown(artist) -> bool:
    """Whether ``artist`` is drawn: it and its axes are visible, and it has text (for a Text)."""
    if not artist.get_visible():
        return False
    axes = getattr(artist, "axes", None)
    if axes is not None and not axes.get_visible():
        return False
    return not isinstance(artist, matplotlib.text.Text) or bool(artist.get_text().strip())


def _texts(fig) -> list[matplotlib.text.Text]:
    return [t for t in fig.findobj(matplotlib.text.Text) if _shown(t)]


def _smallest_text_px(fig, png_width: int) -> tuple[float, str]:
    """The smallest text of ``fig`` in px as a page at 1280 px shows its PNG ``png_width`` px wide, and its text."""
    scale = shown_scale(png_width)
    sizes = [(t.get_fontsize() * FIGURE_DPI / 72 * scale, t.get_text()) for t in _texts(fig)]
    return min(sizes)


def _inches(bbox: Bbox, fig) -> float:
    return bbox.width / fig.dpi


def _panels(fig) -> list:
    return [ax for ax in fig.axes if ax.get_visible()]


def _overlap(a: Bbox, b: Bbox, slack: float = 0.5) -> bool:
    """Whether two display boxes overlap by more than ``slack`` px each way."""
    return a.x0 + slack < b.x1 and b.x0 + slack < a.x1 and a.y0 + slack < b.y1 and b.y0 + slack < a.y1


def _check_readable(fig, name: str) -> int:
    """The checks every figure gets; returns the saved PNG's width."""
    width = _saved_width(fig)  # draws the figure, so the extents below are the ones it is saved with
    renderer = fig.canvas.get_renderer()
    smallest, text = _smallest_text_px(fig, width)
    assert smallest >= MIN_TEXT_PX, (f"{name}: {text!r} reads {smallest:.1f} px on a page at 1280 px "
                                     f"(saved {width} px wide, shown at {shown_scale(width):.2f})")
    # The saved image is the panels' width (titles, ticks, colour bar and legend included), not a footnote's.
    panels = Bbox.union([ax.get_tightbbox(renderer) for ax in _panels(fig)])
    assert width / FIGURE_DPI <= _inches(panels, fig) + 0.35, (
        f"{name}: saved {width / FIGURE_DPI:.2f} in wide for {_inches(panels, fig):.2f} in of panels")
    # No title overlaps another, nor another panel; the note below the panels overlaps none of them.
    titles = [(ax, ax.title.get_window_extent(renderer)) for ax in _panels(fig) if ax.get_title().strip()]
    suptitle = getattr(fig, "_suptitle", None)
    if suptitle is not None and _shown(suptitle):
        titles.append((None, suptitle.get_window_extent(renderer)))
    for (ax1, box1), (ax2, box2) in itertools.combinations(titles, 2):
        assert not _overlap(box1, box2), f"{name}: the titles of two panels overlap ({box1}, {box2})"
    for owner, box in titles:
        for ax in _panels(fig):
            if ax is not owner:
                assert not _overlap(box, ax.get_window_extent(renderer)), f"{name}: a title covers another panel"
    note = getattr(fig, "_supxlabel", None)
    if note is not None and _shown(note):
        box = note.get_window_extent(renderer)
        assert box.width <= fig.bbox.width + 1, f"{name}: the note below the panels is wider than the figure"
        for ax in _panels(fig):
            assert not _overlap(box, ax.get_tightbbox(renderer)), f"{name}: the note covers a panel's labels"
    return width


def _niah_grid() -> pd.DataFrame:
    """Notebook 02's Fig 2: every grid condition, one context, two depths, 15 runs a cell."""
    rng = np.random.default_rng(0)
    rows = [{"context": 500, "depth": depth, "run": run, "condition": condition,
             "accuracy": float(rng.random() < 0.7), "heads_masked_per_step": 1.5 + i % 5,
             "tf_drop": 0.0 if condition == "none" else float(rng.uniform(-0.05, 3.2))}
            for i, condition in enumerate(grid_conditions()) for depth in (0.1, 0.9) for run in range(15)]
    return pd.DataFrame(rows)


LENGTH_CONDITIONS = ("none", "dynamic", "static_matched", "random_matched", "previous_step", "static_previous")


def _length_grid() -> pd.DataFrame:
    """Notebook 07's Fig 2 by length: four lengths x five depths, two runs a cell; the drops as the long run had
    them (1.5 to 3.2 nats under D_t and its static match, about 0 (down to -0.06) for random heads, 0 unmasked)."""
    rng = np.random.default_rng(1)
    drops = {"none": (0.0, 0.0), "dynamic": (1.5, 3.2), "static_matched": (-0.06, 2.8), "random_matched": (-0.06, 0.3),
             "previous_step": (0.1, 2.4), "static_previous": (-0.02, 2.6)}
    rows = [{"context": context, "depth": depth, "run": run, "condition": condition,
             "accuracy": float(condition == "none" and rng.random() < 0.6), "heads_masked_per_step": 0.5,
             "tf_drop": float(rng.uniform(*drops[condition]))}
            for condition in LENGTH_CONDITIONS for context in (1000, 2000, 4000, 8000)
            for depth in (0.0, 0.25, 0.5, 0.75, 1.0) for run in range(2)]
    return pd.DataFrame(rows)


def _check_cells(fig, name: str) -> None:
    """Each heatmap cell's label (mean, interval) lies within its cell: labels never run into each other."""
    renderer = fig.canvas.get_renderer()
    for ax in _panels(fig):
        if not ax.texts or not ax.collections:
            continue
        columns = len(ax.get_xticks())
        cell = ax.get_window_extent(renderer).width / columns
        boxes = [t.get_window_extent(renderer) for t in ax.texts]
        assert max(b.width for b in boxes) <= cell, f"{name}: a cell's label is wider than its cell"
        for a, b in itertools.combinations(boxes, 2):
            assert not _overlap(a, b), f"{name}: two cells' labels overlap"


# --- Fig 2 / Fig 6 and Fig 2 by length ------------------------------------------------------------

@pytest.mark.parametrize("metric", ["accuracy", "tf_drop"])
def test_fig2_grid_reads_at_9px_with_its_note_wrapped_and_no_title_overlapping(metric):
    """Notebook 02's grid of 15 panels: every text >= 9 px at 1280 px, the footnote wrapped within the panels'
    width (it was one line about 3,500 px long and made the image twice as wide as its panels), no two panel
    titles overlapping."""
    fig = condition_heatmaps(_niah_grid(), metric, f"Fig 2 (NIAH): {metric}", k=5)
    width = _check_readable(fig, f"Fig 2 ({metric})")
    _check_cells(fig, "Fig 2")
    assert fig.get_size_inches()[0] <= GRID_MAX_WIDTH and width <= GRID_MAX_WIDTH * FIGURE_DPI
    note = fig._supxlabel
    assert note.get_wrap() and "\n" in note._get_wrapped_text().split("\n", 1)[1], "the long line is wrapped"
    titles = [ax.get_title() for ax in _panels(fig) if ax.get_title()]
    assert len(titles) == len(grid_conditions()), "every condition keeps its panel"
    plt.close(fig)


@pytest.mark.parametrize("metric", ["accuracy", "tf_drop"])
def test_fig2_by_length_reads_at_9px_and_its_interval_labels_stay_in_their_cells(metric):
    """Notebook 07's grid (4 lengths x 5 depths a panel): the cells are as wide as their labels need, so the
    intervals no longer run into each other, and the text still reads >= 9 px."""
    fig = condition_heatmaps(_length_grid(), metric, f"Fig 2 by length (prose): {metric}", k=2)
    _check_readable(fig, f"Fig 2 by length ({metric})")
    _check_cells(fig, "Fig 2 by length")
    plt.close(fig)


def test_fig2_by_length_colours_drops_on_their_own_map():
    """A drop is not a score: no drop is white, a drop of 1.5-3.2 nats red (it was the accuracy map's saturated
    green, "good"), a small gain (a negative drop) pale blue, on a colour bar labelled in nats per step; an unmasked
    cell's interval is a bootstrap one ([0.00, 0.00]), not a proportion's."""
    grid = _length_grid()
    fig = condition_heatmaps(grid, "tf_drop", "Fig 2 by length (prose): tf_drop", k=2)
    titles = [ax.get_title() for ax in fig.axes]
    mesh = {t.split(" (")[0]: ax.collections[0] for t, ax in zip(titles, fig.axes) if ax.collections and t}
    bar = fig.axes[-1]
    assert "drop (nats/step)" in bar.get_ylabel()
    unmasked, dynamic = mesh["unmasked"], mesh["D_t masked"]
    white = unmasked.to_rgba(0.0)
    assert min(white[:3]) > 0.95, f"no drop is white, got {white}"
    for value in dynamic.get_array().compressed():
        red, green, blue, _ = dynamic.to_rgba(value)
        assert red > green and red > blue, f"a drop of {value:.2f} nats is red, got {(red, green, blue)}"
    low = float(grid.groupby(["condition", "context", "depth"])["tf_drop"].mean().min())
    assert low < 0
    red, green, blue, _ = unmasked.to_rgba(low)
    assert blue >= red and min(red, green, blue) > 0.85, "a gain of a few hundredths of a nat is pale blue"
    assert unmasked.cmap.name != "RdYlGn" and unmasked.norm.vmin == pytest.approx(low, abs=0.01)
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert labels and all(label == "0.00\n[0.00, 0.00]" for label in labels)
    assert "Each cell: mean tf_drop (nats/step) with its 95% interval (bootstrap)" in fig._supxlabel.get_text()
    plt.close(fig)
    accuracy = condition_heatmaps(grid, "accuracy", "accuracy", k=2)
    assert accuracy.axes[0].collections[0].cmap.name == "RdYlGn" and accuracy.axes[-1].get_ylabel() == "mean accuracy"
    plt.close(accuracy)


# --- Fig 4 / Fig 8 ---------------------------------------------------------------------------------

def _cca_summary(k_max: int = 10) -> tuple[pd.DataFrame, pd.DataFrame]:
    """CCA against lag as the long run had it: in-sample and held-out near 1, the shuffled controls near 0, the
    residualised curve between, each with an interval."""
    rows, resid = [], []
    for k in range(k_max + 1):
        for control, value in (("in-sample", 0.99 - 0.003 * k), ("held-out", 0.98 - 0.007 * k),
                               ("shuffled", 0.01), ("shuffled, same step", 0.95 - 0.004 * k)):
            rows.append({"k": k, "control": control, "first": value, "first_low": value - 0.05,
                         "first_high": min(1.0, value + 0.05), "splits": 5, "n_samples": 90, "n_clusters": 30})
        for control, value in (("held-out, residualised", 0.74 - 0.035 * k), ("held-out, residualised, chance", 0.02)):
            resid.append({"k": k, "control": control, "first": value, "first_low": value - 0.15,
                          "first_high": value + 0.15})
    return pd.DataFrame(rows), pd.DataFrame(resid)


def test_fig4_reads_at_9px_and_its_legend_covers_no_curve():
    """Fig 4 / Fig 8: the legend (it covered the curves at k = 0-6 in the lower left) lies outside the axes, over no
    plotted point or error bar, and every text reads >= 9 px."""
    summary, residualised = _cca_summary()
    fig = cca_splits_figure(summary, "Fig 4 (NIAH): CCA vs lag", paper=[0.95 - 0.02 * k for k in range(11)],
                            residualised=residualised)
    _check_readable(fig, "Fig 4")
    renderer = fig.canvas.get_renderer()
    (ax,) = fig.axes
    legends = [legend for legend in fig.legends + [ax.get_legend()] if legend is not None]
    assert len(legends) == 1
    box = legends[0].get_window_extent(renderer)
    assert not _overlap(box, ax.get_window_extent(renderer)), "the legend lies outside the axes"
    labels = [t.get_text() for t in legends[0].get_texts()]
    assert len(labels) == 7 and any("regressed out" in label for label in labels)
    points = np.vstack([ax.transData.transform(line.get_xydata()) for line in ax.get_lines() if len(line.get_xydata())])
    inside = [p for p in points if box.contains(*p)]
    assert not inside, f"{len(inside)} plotted points lie under the legend"
    plt.close(fig)


# --- the helpers -----------------------------------------------------------------------------------

def test_heatmaps_on_one_figure_draw_it_once_and_turn_overlapping_labels_as_seaborn_does():
    """Six heatmap panels under constrained layout: ``heatmaps_drawn_once`` draws the figure once (seaborn alone draws
    it at every panel), and the labels come out as seaborn turns them: x labels too long to sit side by side vertical,
    short ones level, y labels level where they would overlap (a panel of 30 rows) and vertical where they fit."""
    import seaborn as sns

    def counted_figure():
        fig, axes = plt.subplots(2, 3, figsize=(9, 6), layout="constrained")
        draws, real = [], fig.canvas.draw
        fig.canvas.draw = lambda *args, **kwargs: (draws.append(1), real(*args, **kwargs))[1]
        return fig, axes.flat, draws

    def add_panels(heatmap, axes):
        for i, ax in enumerate(axes):
            if i == 5:
                heatmap(np.arange(60.0).reshape(30, 2), ax=ax, xticklabels=["x", "y"],
                        yticklabels=[f"row {j}" for j in range(30)], cbar=False)
            else:
                heatmap(np.arange(12.0).reshape(3, 4), ax=ax, cbar=False, yticklabels=["p", "q", "r"],
                        xticklabels=[f"a long column label {j}" for j in range(4)] if i % 2 else list("abcd"))

    def rotations(fig):
        return [([t.get_rotation() for t in ax.get_xticklabels()], [t.get_rotation() for t in ax.get_yticklabels()])
                for ax in fig.axes]

    seaborn_fig, axes, seaborn_draws = counted_figure()
    add_panels(sns.heatmap, axes)
    fig, axes, draws = counted_figure()
    with heatmaps_drawn_once(fig) as heatmap:
        add_panels(heatmap, axes)
        assert draws == [], "no draw while the panels are added"
    assert len(seaborn_draws) == 6 and len(draws) == 1
    turned = rotations(fig)
    assert turned == rotations(seaborn_fig)
    assert turned[1][0] == [90.0] * 4 and turned[0][0] == [0.0] * 4, "long x labels turn, short ones stay level"
    assert set(turned[5][1]) == {0.0} and set(turned[0][1]) == {90.0}, "crowded y labels turn level, the rest not"
    plt.close("all")


def test_wrap_to_width_keeps_every_line_within_the_width_and_every_word():
    text = "fixed k = 5 heads at every step: static top-k masked, random k masked; sized by D_t at each step: " * 3
    wrapped = wrap_to_width(text.strip(), 4.0, 9)
    assert wrapped.split() == text.split()
    assert all(text_width(line, 9) <= 4.0 for line in wrapped.split("\n"))
    assert wrap_to_width("one\ntwo", 4.0, 9) == "one\ntwo" and wrap_to_width("", 1.0, 9) == ""
    assert shown_scale(INLINE_WIDTH_PX // 2) == 1.0 and shown_scale(2 * INLINE_WIDTH_PX) == 0.5


# --- the page: a click shows each figure at full size ----------------------------------------------

def test_each_figure_on_a_page_is_a_link_to_itself_at_full_size(tmp_path):
    """A figure saved by the notebook links to its PNG file beside the page; an image with no file of its own opens
    over the page (an id of its own, CSS :target) with a link back; the image itself is embedded as before."""
    pytest.importorskip("nbconvert")
    import nbformat
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

    from dynheads_tl import verdicts
    from dynheads_tl.report import site

    png = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMI"
                           "QAAAABJRU5ErkJggg==")  # 1 x 1 px
    folder = tmp_path / "02_irreplaceability"
    folder.mkdir()
    (folder / "fig2_niah_masking.png").write_bytes(png + b"fig2")
    verdicts.record_output(folder, "fig2_niah_masking", "figure", "Fig 2", cell_source=verdicts.source_digest("a()"))
    shown = lambda data: new_output("display_data", data={"image/png": base64.b64encode(data).decode(),  # noqa: E731
                                                          "text/plain": "<Image>"})
    (tmp_path / "executed").mkdir()
    nbformat.write(new_notebook(cells=[
        new_markdown_cell("# Claim 2\n## Fig 2"),
        new_code_cell("a()", execution_count=1, outputs=[shown(png + b"fig2")]),
        new_code_cell("b()", execution_count=2, outputs=[shown(png), shown(png + b"other")]),
    ]), tmp_path / "executed" / "02_irreplaceability.ipynb")
    page = site.render_page(tmp_path / "executed" / "02_irreplaceability.ipynb", tmp_path).read_text()
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(page, "html.parser")
    images = soup.select(".jp-RenderedImage img")
    assert len(images) == 3
    links = [img.find_parent("a") for img in images]
    assert all(link is not None and "enlarge" in link["class"] for link in links)
    assert links[0]["href"] == "../02_irreplaceability/fig2_niah_masking.png"
    assert [link["href"] for link in links[1:]] == ["#figure-1", "#figure-2"]
    for number, link in ((1, links[1]), (2, links[2])):
        zoom = link.find_parent(class_="zoom")
        assert zoom["id"] == f"figure-{number}" and soup.find(id=f"figure-{number}-inline") is not None
        assert zoom.select_one("a.zoom-close")["href"] == f"#figure-{number}-inline"
    # files, not base64: the figure's own file where it has one, else a copy beside the page named by its bytes
    assert images[0]["src"] == "../02_irreplaceability/fig2_niah_masking.png"
    extracted = tmp_path / "executed" / "02_irreplaceability_files"
    assert sorted(p.read_bytes() for p in extracted.iterdir()) == sorted([png, png + b"other"])
    assert all(img["src"].startswith("02_irreplaceability_files/") for img in images[1:])
    assert all(img.get("alt") for img in images)
    # a second rendering after an image changed keeps no stale copy
    nbformat.write(new_notebook(cells=[new_code_cell("b()", execution_count=2, outputs=[shown(png)])]),
                   tmp_path / "executed" / "02_irreplaceability.ipynb")
    site.render_page(tmp_path / "executed" / "02_irreplaceability.ipynb", tmp_path)
    assert [p.read_bytes() for p in extracted.iterdir()] == [png]
    assert re.search(r"\.zoom:target\{[^}]*position:fixed", page) and "a.enlarge{cursor:zoom-in}" in page
