"""Issue #65's edges of the index pages, on indexes built in tmp folders from hand-written CSVs (no notebook runs): a
nested index (a model's report, a preset's folder) links back up to the indexes that hold it; the legend defines every status
the index shows; a preset's index says "not run in this preset" (neutral) for the notebooks the preset leaves out by
design; a status rule's docstring and the index's notes show their inline code as code, not as raw markup."""
from __future__ import annotations

import json
from pathlib import Path

from bs4 import BeautifulSoup

from dynheads_tl.claim import BEYOND_STATUSES, PAPER_STATUSES
from dynheads_tl.report import templating
from dynheads_tl.report.checks import link_problems
from dynheads_tl.report.index import MISSING, NOT_IN_PRESET, build_index
from dynheads_tl.report.site import PageResults, ResultRow

TABLE1 = ("model,task,jaccard_static,jaccard_adjacent,entropy,heads_per_step_mean,heads_per_step_sd,ever_active,"
          "n_heads\nm,niah,0.25,0.5,3.1,4.5,2.0,40,270\n")


def _report(folder: Path, preset: str = "default", model: str = "m") -> Path:
    """A report of notebook 01's Table 1 only, run with ``preset``."""
    (folder / "01_dynamism").mkdir(parents=True)
    (folder / "01_dynamism" / "table1_niah.csv").write_text(TABLE1)
    (folder / "runs.json").write_text(json.dumps({"01_dynamism": {"model": model, "preset": preset, "parameters": {},
                                                                  "date": "2026-12-05", "minutes": 1.0}}))
    build_index(folder)
    return folder


def _pills(page: str) -> dict[str, list[str]]:
    """The status pills of index.html: those of the legend, and those of every table (item -> its pill's text)."""
    soup = BeautifulSoup(page, "html.parser")
    legend = [span.get_text() for span in soup.select("dl.legend span.status")]
    rows = {}
    for row in soup.select("tr[data-item], tr[data-models], tr[data-preset]"):
        key = row.get("data-item") or row.get("data-models") or row.get("data-preset")
        rows[key] = [span.get_text() for span in row.select("span.status")]
    return {"legend": legend, **rows}


def test_a_nested_report_links_back_up_to_every_report_that_holds_it(tmp_path):
    """<root>/<preset>/<model>/ links up to its preset's index and the root's; a preset's index to the root's."""
    root = tmp_path / "report"
    first = _report(root / "default" / "m")
    gemma = _report(root / "default" / "gemma-3-270m", model="gemma-3-270m")
    long_gemma = _report(root / "long" / "gemma-3-270m", preset="long", model="gemma-3-270m")
    for folder in (root, root / "default", root / "long", first, gemma, long_gemma):
        build_index(folder)

    assert ("↑ [The report's top index](../../README.md) · ↑ [Preset default's index](../README.md)"
            in (gemma / "README.md").read_text())
    header = BeautifulSoup((gemma / "index.html").read_text(), "html.parser").find("header", class_="site")
    up = [(a["href"], a.get_text()) for a in header.select("a.up")]
    assert up == [("../../index.html", "↑ The report's top index"), ("../index.html", "↑ Preset default's index")]
    assert "↑ [The report's top index](../README.md)" in (root / "long" / "README.md").read_text()
    assert ("↑ [The report's top index](../../README.md) · ↑ [Preset long's index](../README.md)"
            in (long_gemma / "README.md").read_text())
    for folder in (root, root / "default", root / "long", first, gemma, long_gemma):
        assert link_problems(folder) == [], folder  # the way up is the one link allowed to leave the folder
    assert "↑" not in (root / "README.md").read_text(), "the top index holds no link up"
    readme = gemma / "README.md"
    readme.write_text(readme.read_text() + "\n[up](../../secret.md)\n")
    (root / "secret.md").write_text("x")
    assert link_problems(gemma) == ["README.md links to ../../secret.md, outside the folder"], \
        "any other link that leaves the folder is still reported"


def test_a_nested_report_built_alone_has_no_dead_link_up(tmp_path):
    alone = _report(tmp_path / "runs" / "smoke" / "gemma-3-270m", preset="smoke", model="gemma-3-270m")
    assert "↑" not in (alone / "README.md").read_text() and 'class="up"' not in (alone / "index.html").read_text()
    assert link_problems(alone) == []
    assert not (tmp_path / "runs" / "smoke" / "index.html").exists(), "no index is made for a folder that had none"


def test_the_legend_defines_every_status_the_index_shows(tmp_path):
    top = tmp_path / "report" / "default"  # a preset's index: every model's statuses side by side
    _report(top / "m")
    _report(top / "gemma-3-270m", model="gemma-3-270m")
    build_index(top)
    pills = _pills((top / "index.html").read_text())
    legend = pills.pop("legend")
    assert set(PAPER_STATUSES) | set(BEYOND_STATUSES) | {MISSING, NOT_IN_PRESET} <= set(legend)
    shown = {text for texts in pills.values() for text in texts}
    assert {MISSING} < shown and shown <= set(legend), shown - set(legend)
    soup = BeautifulSoup((top / "index.html").read_text(), "html.parser")
    assert all(dd.get_text().strip() for dd in soup.select("dl.legend dd")), "each status with what it says"
    readme = (top / "README.md").read_text()
    assert all(f"- **{status}**: " in readme for status in legend), "the README carries the same legend"


def test_a_presets_index_shows_notebooks_it_leaves_out_as_not_run_in_this_preset(tmp_path):
    long = _report(tmp_path / "long", preset="long")
    default = _report(tmp_path / "default")
    for folder, fig2 in ((long, NOT_IN_PRESET), (default, MISSING)):
        page = (folder / "index.html").read_text()
        soup = BeautifulSoup(page, "html.parser")
        row = soup.find("tr", attrs={"data-item": "Fig 2"})  # notebook 02: no long preset of its own
        pill = row.find("span", class_="status")
        assert pill.get_text() == fig2 and ("bad" in pill["class"]) == (fig2 == MISSING), folder
        assert row.find(class_="ours").get_text() == "not produced"
        fig1 = soup.find("tr", attrs={"data-item": "Fig 1"}).find("span", class_="status")
        assert fig1.get_text() == MISSING and "bad" in fig1["class"], "01 ran in this preset: its files are missing"
        line = next(line for line in (folder / "README.md").read_text().splitlines() if line.startswith("| Fig 2 |"))
        assert f"| not produced | {fig2} |" in line
    assert "not-run" in str(BeautifulSoup((long / "index.html").read_text(), "html.parser")
                            .find("tr", attrs={"data-item": "Fig 2"}).find(class_="ours")["class"])


def test_a_presets_folder_shows_what_its_models_leave_out_by_design_as_not_run_in_this_preset(tmp_path):
    """The models side by side (``<preset>/<model>/``): each model's cell of a notebook its preset leaves out says
    "not run in this preset" (neutral), on the page and in the README; a notebook the preset runs whose files are
    not there still says "missing"."""
    for preset, fig2 in (("long", NOT_IN_PRESET), ("default", MISSING)):
        folder = tmp_path / preset
        for model in ("m", "gemma-3-270m"):
            _report(folder / model, preset=preset, model=model)
        build_index(folder)
        soup = BeautifulSoup((folder / "index.html").read_text(), "html.parser")
        cells = lambda item: [span for span in soup.find("tr", attrs={"data-models": item}).select("span.status")]
        assert [span.get_text() for span in cells("Fig 2")] == [fig2, fig2], preset
        assert all(("bad" in span["class"]) == (fig2 == MISSING) for span in cells("Fig 2"))
        assert [span.get_text() for span in cells("Fig 1")] == [MISSING, MISSING], "01 ran: its files are missing"
        readme = (folder / "README.md").read_text().splitlines()
        row = lambda item: next(line for line in readme if line.startswith(f"| {item} |"))
        assert row("Fig 2").count(f"| {fig2}: – ") == 2 and "not produced" not in row("Fig 2"), preset
        assert row("Fig 2").endswith(f"| {NOT_IN_PRESET if fig2 == NOT_IN_PRESET else 'not on every model'} |")
        assert row("Fig 1").count(f"| {MISSING}: – ") == 2


def test_a_rule_docstring_and_the_index_notes_show_inline_code_as_code(tmp_path):
    rule = ("The declared rule of Fig 2 (preregistration.yaml; :func:`masking_rule`) on ``<task>_conditions.csv`` and "
            ":data:`~.config.PRIMARY`, :func:`~dynheads_tl.analysis.statistics.resampled_t_interval`; a < b.")
    html = templating.part("results", PageResults("verdicts.json", None, "abc", None,
                                                  [ResultRow("Fig 2", "weaker", "h", rule)], []))
    rendered = BeautifulSoup(html, "html.parser").find("details").find("p")
    assert [code.get_text() for code in rendered.find_all("code")] == [
        "masking_rule", "<task>_conditions.csv", "PRIMARY", "resampled_t_interval"]
    assert ":func:" not in html and "``" not in html and ":data:" not in html and "a &lt; b" in html

    heads = tmp_path / "01_dynamism" / "head_scores"
    heads.mkdir(parents=True)
    (heads / "m_static_wu.json").write_text(json.dumps({"0-0": [0.5]}))
    build_index(tmp_path)
    page = (tmp_path / "index.html").read_text()
    assert "<code>head_score</code>" in page and "`" not in BeautifulSoup(page, "html.parser").get_text()
