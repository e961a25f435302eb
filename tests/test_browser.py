"""The report opened in a real headless Chromium, offline: the committed report must read cleanly, and the check
must catch each kind of problem it looks for (shown on a small broken site).

Skips only when Chromium is absent on a developer's machine; under CI (``CI=1``, set by ``.ci/run``, which installs
Debian's ``chromium``) a missing browser is a failure.
"""
from __future__ import annotations

import base64
import os
import struct
from pathlib import Path

import pytest

from dynheads_tl.report.browser import NARROW, browser_problems, find_chromium

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
    """Index and every notebook page: no JavaScript error, no broken link, anchor or image, no raw TeX, and
    nothing scrolls sideways at 420 px outside a table box; a 420 px screenshot of each page is taken."""
    # Chromium runs as a subprocess. driven over the DevTools pipe; the pages come from a localhost server.
    problems = browser_problems(COMMITTED, chromium, screenshots=tmp_path)
    assert not problems, f"{len(problems)} problem(s) in papers_figures/ in a browser:\n" + "\n".join(problems)
    shots = sorted(tmp_path.glob("*.png"))
    pages = 1 + len(list((COMMITTED / "executed").glob("*.html")))
    assert len(shots) == pages >= 8
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
        '<a href="../index.html#here">back</a> <img src="../fig.png" alt="fine"></body></html>')
    # Chromium runs as a subprocess. here too.
    problems = browser_problems(site, chromium)
    text = "\n".join(problems)
    assert all(p.startswith("index.html:") for p in problems), text  # the clean page has none
    assert "JavaScript error: Error: boom in the page" in text
    assert "broken a link gone.csv" in text
    assert "link executed/ok.html#no-such-section: no such anchor in ok.html" in text
    assert "image does not load: missing.png" in text
    assert "raw TeX in the text: $S_{20} \\setminus D_t$" in text
    assert f"at {NARROW} px the page scrolls sideways" in text and "div" in text
