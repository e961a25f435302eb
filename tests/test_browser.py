"""The report opened in a real headless Chromium, offline: the committed report must read cleanly, and the check
must catch each kind of problem it looks for (shown on a small broken site). A page rendered now shows every figure
at least as wide as its text is sized for and opens it at full size with a click.

Skips only when Chromium is absent on a developer's machine; under CI (``CI=1``, set by ``.ci/run``, which installs
Debian's ``chromium``) a missing browser is a failure.
"""
from __future__ import annotations

import base64
import os
import struct
from pathlib import Path

import pytest

from dynheads_tl.analysis.plots import INLINE_WIDTH_PX
from dynheads_tl.report.browser import (NARROW, WIDE, Browser, Server, browser_problems, find_chromium,
                                        report_pages)

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "papers_figures"
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")


@pytest.fixture(scope="module")
def chromium() -> str:
    executable = find_chromium()
    if executable is None:
        if os.environ.get("CI"):
            pytest.fail("CI=1 but no Chromium is installed: .ci/run installs Debian's chromium before `make test`.")
        pytest.skip("Chromium is not installed (apt-get install chromium); CI installs it and never skips this test.")
    return executable


def _png_width(path: Path) -> int:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name} is not a PNG"
    return struct.unpack(">I", data[16:20])[0]


def test_the_committed_report_reads_cleanly_in_a_browser(chromium, tmp_path):
    """Index and every notebook page: no JavaScript error, no broken link, anchor or image, no raw TeX, every figure
    a link that shows it at full size and shown at least as wide as its text is sized for, and nothing scrolls
    sideways at 420 px outside a table box; a 420 px screenshot of each page is taken."""
    # Chromium runs as a subprocess. driven over the DevTools pipe; the pages come from a localhost server.
    problems = browser_problems(COMMITTED, chromium, screenshots=tmp_path)
    assert not problems, f"{len(problems)} problem(s) in papers_figures/ in a browser:\n" + "\n".join(problems)
    shots = sorted(tmp_path.glob("*.png"))
    presets = {p.relative_to(COMMITTED).as_posix() for p in COMMITTED.glob("*/index.html")}
    pages = report_pages(COMMITTED)
    assert {"index.html", "default/index.html", "long/index.html"} | presets <= set(pages), "the root's, each preset's"
    assert len([p for p in pages if "/executed/" in p]) >= 8, "one model's report: every notebook page"
    assert len(shots) == len(pages)
    assert {_png_width(shot) for shot in shots} == {NARROW}


def test_the_browser_check_finds_each_kind_of_problem(chromium, tmp_path):
    """A site with one of each problem: every one is reported, and a clean page next to it is not."""
    site = tmp_path / "site"
    (site / "executed").mkdir(parents=True)
    (site / "fig.png").write_bytes(PNG)
    (site / "index.html").write_text(
        '<!doctype html><html><head><meta name="viewport" content="width=device-width"></head><body>'
        '<p>The set $S_{20} \\setminus D_t$ is shown raw.</p>'
        '<a href="gone.csv">gone</a> <a href="executed/ok.html#no-such-section">anchor</a> <a href="#here">ok</a>'
        '<img src="missing.png" alt="missing"> <img src="fig.png" alt="fine">'
        '<div id="here" style="width:900px">too wide</div>'
        '<div style="overflow-x:auto"><table><tr><td style="min-width:900px">a wide table in its box</td></tr></table></div>'
        '<script>throw new Error("boom in the page")</script></body></html>')
    (site / "executed" / "ok.html").write_text(
        '<!doctype html><html><head><meta name="viewport" content="width=device-width"></head><body>'
        '<h2 id="a">A</h2><p>Math as MathML: <math><mi>x</mi></math>; a price of $5 is not TeX.</p>'
        '<a href="../index.html#here">back</a> <img src="../fig.png" alt="fine"><main class="page">'
        '<div class="jp-RenderedImage"><a class="enlarge" href="../fig.png"><img src="../fig.png" alt="a figure">'
        '</a></div></main></body></html>')
    (site / "wide.png").write_bytes(_wide_png(1500))
    (site / "executed" / "figures.html").write_text(
        '<!doctype html><html><head><meta name="viewport" content="width=device-width">'
        '<style>img{max-width:100%}</style></head><body><main class="page">'
        '<div class="jp-RenderedImage"><img src="../fig.png" alt="no link"></div><div class="jp-RenderedImage">'
        '<a class="enlarge" href="../fig.png"><img src="../wide.png" alt="the wrong file"></a></div>'
        '<div class="jp-RenderedImage" style="width:300px"><a class="enlarge" href="../wide.png">'
        '<img src="../wide.png" alt="squeezed"></a></div></main></body></html>')
    # Chromium runs as a subprocess. here too.
    problems = browser_problems(site, chromium)
    text = "\n".join(problems)
    assert not any(p.startswith("executed/ok.html") for p in problems), text  # the clean page has none
    figures = [p for p in problems if p.startswith("executed/figures.html:")]
    assert len(figures) == 3, text
    assert all(p.startswith(("index.html:", "executed/figures.html:")) for p in problems), text
    assert "figure 1 (no link) is not a link to itself at full size" in text
    assert "figure 2 (the wrong file): its link ../fig.png opens a 1 x 1 px image, not this 1500 x 150 one" in text
    assert f"figure 3 (squeezed) is shown 300 px wide at {WIDE} px, less than the {INLINE_WIDTH_PX} px" in text
    assert "JavaScript error: Error: boom in the page" in text
    assert "broken a link gone.csv" in text
    assert "link executed/ok.html#no-such-section: no such anchor in ok.html" in text
    assert "image does not load: missing.png" in text
    assert "raw TeX in the text: $S_{20} \\setminus D_t$" in text
    assert f"at {NARROW} px the page scrolls sideways" in text and "div" in text


def _wide_png(width: int, height: int = 150) -> bytes:
    """A PNG ``width`` x ``height`` px (a figure wider than the page's column)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(width / 100, height / 100), dpi=100)
    fig.text(0.5, 0.5, "a wide figure", ha="center", va="center", fontsize=20)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return buffer.getvalue()


def test_every_figure_of_a_rendered_page_opens_at_full_size(chromium, tmp_path):
    """A page rendered now (the committed pages are checked above once re-rendered): a figure wider than the column is
    shown at least INLINE_WIDTH_PX wide at 1280 px (the width its text is sized for, tests/test_readable_figures.py),
    its click opens its PNG file at full size; an image with no file opens over the page at its natural width (CSS
    :target) and "Close" brings the page back. The browser check finds no problem on it."""
    pytest.importorskip("nbconvert")
    import nbformat
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

    from dynheads_tl import verdicts
    from dynheads_tl.report import site

    # A notebook no claim declares: the page has no results footer (whose file paths would only be this test's).
    wide, other = _wide_png(1500), _wide_png(1400)
    folder = tmp_path / "08_figures"
    folder.mkdir()
    (folder / "fig2.png").write_bytes(wide)
    verdicts.record_output(folder, "fig2", "figure", "Fig 2", cell_source=verdicts.source_digest("a()"))
    shown = lambda data: new_output("display_data", data={"image/png": base64.b64encode(data).decode(),  # noqa: E731
                                                          "text/plain": "<Image>"})
    (tmp_path / "executed").mkdir()
    nbformat.write(new_notebook(cells=[
        new_markdown_cell("# Claim 2\n## Fig 2"),
        new_code_cell("a()", execution_count=1, outputs=[shown(wide)]),
        new_code_cell("b()", execution_count=2, outputs=[shown(other)]),
    ]), tmp_path / "executed" / "08_figures.ipynb")
    site.render_page(tmp_path / "executed" / "08_figures.ipynb", tmp_path)
    (tmp_path / "index.html").write_text('<!doctype html><html><head><meta name="viewport" '
                                         'content="width=device-width"></head><body>'
                                         '<a href="executed/08_figures.html">page</a></body></html>')
    # Chromium runs as a subprocess. here too.
    problems = browser_problems(tmp_path, chromium)
    assert not problems, "\n".join(problems)
    with Server(tmp_path) as server, Browser(chromium) as browser:
        browser.open(server.url + "executed/08_figures.html", WIDE)
        sizes = browser.evaluate("[...document.querySelectorAll('.jp-RenderedImage img')].map(i => "
                                 "[Math.round(i.getBoundingClientRect().width), i.naturalWidth, "
                                 "i.closest('a').getAttribute('href')])")
        assert [size[1:] for size in sizes] == [[1500, "../08_figures/fig2.png"], [1400, "#figure-1"]]
        assert all(INLINE_WIDTH_PX <= size[0] < size[1] for size in sizes), sizes
        browser.evaluate("document.querySelector('a[href=\"#figure-1\"]').click()")
        opened = browser.evaluate(
            "(() => { const i = document.querySelector('#figure-1 img'); const r = i.getBoundingClientRect();"
            " return [location.hash, Math.round(r.width), getComputedStyle(i.closest('.zoom')).position,"
            " getComputedStyle(document.querySelector('#figure-1 .zoom-close')).display]; })()")
        assert opened == ["#figure-1", 1400, "fixed", "block"], opened
        browser.evaluate("document.querySelector('#figure-1 .zoom-close').click()")
        closed = browser.evaluate(
            "[location.hash, Math.round(document.querySelector('#figure-1 img').getBoundingClientRect().width),"
            " getComputedStyle(document.querySelector('#figure-1')).position]")
        assert closed[0] == "#figure-1-inline" and closed[1] < 1400 and closed[2] != "fixed", closed
