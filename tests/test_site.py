"""The report site's renderer (math, progress, tables, verdicts, parameters), the index's statuses, and the
README as a front door whose findings are the committed report's computed verdicts."""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from bs4 import BeautifulSoup
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from dynheads_tl import verdicts
from dynheads_tl.report import findings, site, templating, text
from dynheads_tl.report.status import item_status

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "papers_figures"
DEFAULT = COMMITTED / "default"  # every model's default report, <model>/
SMOLLM2 = DEFAULT / "smollm2-135m-instruct"
README = ROOT / "README.md"
PNG_1PX = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


# --- the README ------------------------------------------------------------------------------------

def test_readme_findings_are_the_committed_reports_verdicts():
    """The block between the README's markers is exactly what the executed notebooks' verdict outputs give
    (refresh it with `python -m dynheads_tl.report.rerender papers_figures --readme README.md`)."""
    from dynheads_tl.report.results import model_reports

    expected = findings.findings_markdown(COMMITTED, link_prefix="")
    reports = model_reports(DEFAULT)
    ran = sum(len([f for f in findings.declared_findings() if (report.folder / "executed" / f"{f[1]}.ipynb").exists()])
              + 2 for report in reports)
    per_model = expected.split("**Do the models agree?**")[0]
    bullets = [line for line in per_model.splitlines() if line.startswith("- **")]
    assert len(bullets) == ran, "per model: every declared finding of a notebook that ran, the statuses and the runs"
    if len(reports) > 1:  # each model's block is headed by its name
        assert [line.split("**")[1] for line in per_model.splitlines() if line.startswith("**")] == \
            [report.model for report in reports]
    page = (COMMITTED / findings.FINDINGS_FILE).read_text()
    assert findings.page_findings(page) == findings.findings_markdown(COMMITTED, link_prefix="")
    assert page == findings.findings_page(COMMITTED), "refresh it: rerender papers_figures --readme README.md"
    empty = [(report.model, label) for report in reports for label, _, chosen in findings.findings(report.folder)
             if not chosen]
    assert not empty, f"declared findings whose pattern matched no sentence of their verdict: {empty}"


def test_the_readme_says_per_claim_whether_the_models_agree(monkeypatch):
    """With two model reports, one computed line per claim: statuses that are settled and equal agree, settled and
    different differ, an undetermined or no-headroom status on either model is not settled (two "undetermined" do not
    agree), a missing item is said so, pictures and descriptions are left out, and synthetic data are named."""
    from dynheads_tl.report.across import ModelCell, agreement

    assert agreement(["weaker", "weaker"]) == "agree" and agreement(["weaker", "reproduced"]) == "differ"
    assert agreement(["undetermined", "undetermined"]) == "not settled" == agreement(["reproduced", "no headroom"])
    assert agreement(["weaker", "not produced"]) == "not on every model" == agreement(["weaker", "missing"])
    assert agreement(["not run in this preset"] * 2) == "not run in this preset"  # left out by design everywhere
    assert agreement(["not run in this preset", "missing"]) == "not on every model"
    assert agreement(["qualitative", "qualitative"]) == "no verdict"
    hand_built = [("Claim 9: toy", [
        ("Fig 2", [ModelCell("not reproduced"), ModelCell("not reproduced")]),
        ("Table 2", [ModelCell("weaker"), ModelCell("reproduced")]),
        ("Fig 4", [ModelCell("undetermined", synthetic=True), ModelCell("undetermined", synthetic=True)]),
        ("Fig 5", [ModelCell("qualitative"), ModelCell("qualitative")]),
        ("Fig 9", [ModelCell("weaker"), ModelCell("not produced")])])]
    monkeypatch.setattr(findings, "model_agreement", lambda output_dir: hand_built)
    lines = findings.agreement_lines(Path("unused"), ["a", "b"])
    assert lines[1] == ("- **Claim 9: toy**: Agree: Fig 2 (not reproduced). Differ: Table 2 (weaker on a, reproduced on "
                        "b). Not settled: Fig 4 (undetermined on a, undetermined on b, synthetic). Not on every model: "
                        "Fig 9 (weaker on a, not produced on b).")
    monkeypatch.undo()
    from dynheads_tl.report.results import model_reports

    committed = findings.agreement_lines(DEFAULT, [report.model for report in model_reports(DEFAULT)])
    assert committed and committed[0].startswith("**Do the models agree?**")
    assert "\n".join(committed) in (COMMITTED / findings.FINDINGS_FILE).read_text(), "the findings carry the lines"


def test_the_readme_quotes_every_deviation_of_the_preregistration(monkeypatch):
    """SCIENCE 14: a change after data is a dated deviation in preregistration.yaml, and the report quotes it."""
    from dynheads_tl import preregistration

    monkeypatch.setattr(preregistration, "deviations", lambda: [
        {"date": "2026-12-05", "what": "a secondary added.", "why": "an issue asked", "results already seen": "yes"}])
    assert findings.deviation_lines() == [
        "**Deviations from preregistration.yaml** (1 dated entry added after it was frozen, quoted whole):\n",
        "- 2026-12-05: a secondary added. Why: an issue asked. Results already seen: yes."]
    monkeypatch.setattr(preregistration, "deviations", lambda: [])
    assert findings.deviation_lines() == []
    monkeypatch.undo()
    assert "\n".join(findings.deviation_lines()) in (COMMITTED / findings.FINDINGS_FILE).read_text()


def test_the_readme_quotes_every_declared_primary_comparison_first():
    """A claim's primary comparison is what its verdict rests on: where a claim's results state one, the README's
    quote of that claim starts with it (quoting only the secondary comparisons would say more than the verdict).
    Claim 3's quote once started with a secondary sentence labelled as the primary; it now quotes the primary."""
    from dynheads_tl.report.results import all_results

    quoted = findings.findings(SMOLLM2)  # in the order declared, a claim's findings together
    results = {stem: typed.model_dump(mode="json") for stem, typed in all_results(SMOLLM2).items()}
    first_quote = {}
    for label, page, chosen in quoted:
        first_quote.setdefault(page.split("/")[1].split(".")[0], chosen)
    states_primary = {stem for stem, data in results.items() if (data.get("primary") or {}).get("observed")
                      and stem not in ("01_dynamism",)}  # claim 1 quotes readings, its primary is in the index
    for stem in sorted(states_primary):
        assert first_quote[stem] and first_quote[stem][0].startswith("Primary comparison"), (stem, first_quote[stem][:1])
    # claim 2's declared primary (the fair D_{t-1} comparison) is not in the committed run's files: its quote opens
    # with the primary's sentence saying so; 3 to 6 state theirs
    assert len(states_primary) >= 4, "claims 3, 4, 5 and 6 state a primary comparison"
    assert first_quote["02_irreplaceability"][0].startswith("Primary comparison")
    claim3 = first_quote["03_correlation"][0]
    primary = results["03_correlation"]["primary"]["observed"]
    assert f"{primary['estimate']:+.3f} [{primary['interval']['low']:+.3f}, {primary['interval']['high']:+.3f}]" in claim3
    tested = "p < 0.001" if primary["p"] < 0.001 else f"p = {primary['p']:.3f}"
    assert tested in claim3 and primary["p_adjusted"] == primary["p"], "the primary is tested alone"


def test_the_runs_line_is_read_from_runs_json(tmp_path):
    import json

    assert findings.runs_sentence(tmp_path) == ""  # no runs.json: no line
    runs = {"01_dynamism": {"date": "2026-12-02", "minutes": 27.6, "model": "m", "parameters": {}, "preset": "default"},
            "00_inspect_attention": {"date": "2026-12-01", "minutes": 0.3, "model": "m", "parameters": {},
                                     "preset": "default"}}
    (tmp_path / "runs.json").write_text(json.dumps(runs))
    assert findings.runs_sentence(tmp_path, "pf/") == (
        "- **Runs** (from [runs.json](pf/runs.json); model m, preset default, parameters as declared): "
        "00 on 2026-12-01, 0.3 min; 01 on 2026-12-02, 27.6 min.")
    runs["01_dynamism"].update(preset="smoke", parameters={"n_analysis": 4})
    (tmp_path / "runs.json").write_text(json.dumps(runs))
    assert findings.runs_sentence(tmp_path, "pf/") == (
        "- **Runs** (from [runs.json](pf/runs.json); model m): 00 on 2026-12-01, 0.3 min (preset default); "
        "01 on 2026-12-02, 27.6 min (preset smoke; parameters {'n_analysis': 4}).")


def test_readme_is_a_front_door():
    """The README answers in a minute: at most 12,000 bytes, the answer table and its figure, the two commands, a
    claim on your own model; prose lines wrap (only table rows run long); no hand-typed result outside the
    computed answer."""
    from dynheads_tl.report import answer

    text = README.read_text()
    assert len(text.encode()) <= 12_000
    for command in ("make report", "make test", "dynheads report --only", "from dynheads_tl.claims import"):
        assert command in text
    assert "https://arxiv.org/abs/2602.11162" in text
    # 6,000: the answer table (three families and the long settings), its reading lines and the size axis's one line
    # per claim (issue 63) come first
    assert text.index("## The answer") < text.index("## Two commands") < 6_000, "the answer and commands come first"
    long_prose = [line for line in text.splitlines() if len(line) > 125 and not line.startswith("|")]
    assert not long_prose, long_prose
    block = answer.readme_answer(text)
    assert block.count("\n| ") >= 6 and f"]({'papers_figures/'}{answer.FIGURE})" in block
    # No hand-typed result numbers: outside the answer block (rendered by code) no interval and no 0.xx value.
    outside = text.replace(block, "")
    assert not re.findall(r"\b0\.\d\d|\[[-−+]?\d+\.\d+, [-−+]?\d+\.\d+\]", outside)


def test_the_readme_answer_is_rendered_from_the_committed_results():
    """The table between the README's answer markers is exactly what the committed results files give, and the
    figure it shows exists (refresh both: rerender papers_figures --readme README.md)."""
    from dynheads_tl.report import answer

    assert answer.readme_answer(README.read_text()) == answer.answer_markdown(COMMITTED)
    assert (COMMITTED / answer.FIGURE).stat().st_size > 10_000


def test_readme_and_docs_links_resolve():
    pages = [README, *sorted((ROOT / "docs").glob("*.md"))]
    assert (ROOT / "docs" / "reliability.md").exists()
    missing = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", page.read_text()):
            if not re.match(r"^[a-z]+:", target) and not (page.parent / target).exists():
                missing.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not missing, "links to files that do not exist:\n" + "\n".join(missing)


# --- the renderer's parts --------------------------------------------------------------------------

def test_tex_becomes_mathml_outside_code():
    """nbconvert's Markdown renderer finds the math ($…$, $$…$$, never inside code); the site draws it as MathML."""
    html = templating.markdown_html("Heads in $S_{20} \\setminus D_t$, `$not math$`, and $$a^2$$ top-20$|$.")
    assert html.count("<math") == 3 and "<code>$not math$</code>" in html and "\\setminus" not in html
    assert 'display="block"' in html  # $$…$$ is display math
    assert text.raw_tex(html) == []
    assert text.raw_tex("<p>see $|E_t \\cap$ here</p><script>var s='$x_1$'</script>") == ["$|E_t \\cap$"]
    # a formula latex2mathml cannot parse reads as code, never as raw TeX
    assert '<code class="tex">\\left( x</code>' in templating.markdown_html("$\\left( x$")


def test_a_heading_with_math_keeps_plain_mathml_and_nbconverts_anchor():
    """The heading's id is nbconvert's (its text, spaces to dashes) and its MathML has no namespace prefix
    (nbconvert's ElementTree round trip would write <ns0:math>, which browsers do not draw)."""
    html = templating.markdown_html("## Table 1 — metrics $D_t$")
    assert html.startswith('<h2 id="Table-1-%E2%80%94-metrics-Dt">') and "ns0" not in html
    math = BeautifulSoup(html, "html.parser").find("math")
    assert math.name == "math" and math["xmlns"] == "http://www.w3.org/1998/Math/MathML"
    assert html.endswith('<a class="anchor-link" href="#Table-1-%E2%80%94-metrics-Dt">¶</a></h2>')
    [heading] = site.headings(html)
    assert (heading.level, heading.text) == (2, "Table 1 — metrics Dt") and "<math" in heading.html
    assert "anchor-link" not in heading.html


def test_progress_lines_are_dropped_and_other_output_kept():
    stream = ("NIAH analysis (50 units in 7 batches): 7 to compute\nNIAH analysis (50 units in 7 batches): 2/7 after "
              "22 s, about 55 s left\nk = 5; static top-5: ['L17H3']\nRAG (7 x 30): 210/210 done in 6.3 min\n"
              "Notebook compute time: 6.4 min\n")
    assert site.quiet_stream(stream) == "k = 5; static top-5: ['L17H3']\n"


def test_long_tables_are_cut_with_the_csv_linked():
    rows = "".join(f"<tr><td>{i}</td></tr>" for i in range(44))
    html = f"<table><thead><tr><th>k</th></tr></thead><tbody>{rows}</tbody></table><p>44 rows × 1 columns</p>"
    short = site.shorten_table(html, [("x.csv", "../01_dynamism/x.csv")])
    assert short.count("<tr>") == 1 + site.TABLE_ROWS_SHOWN and "44 rows × 1 columns" not in short
    assert short.endswith('<p class="shortened">Showing 10 of 44 rows. Full table: '
                          '<a href="../01_dynamism/x.csv">x.csv</a>.</p>')
    several = site.shorten_table(html, [("a.csv", "a.csv"), ("b<c.csv", "b.csv")])
    assert 'Full tables of this cell: <a href="a.csv">a.csv</a>, <a href="b.csv">b&lt;c.csv</a>.' in several  # escaped
    assert 'Every table of this notebook: <a href="#all-outputs">all outputs</a>.' in site.shorten_table(html, [])
    small = "<table><tbody><tr><td>1</td></tr></tbody></table>"
    assert site.shorten_table(small, []) == small


def test_verdict_paragraphs_become_one_bullet_per_sentence():
    verdict = ("**Verdict.** " + "Bounds: full 0.53 [0.36, 0.69], none 0.00 (n = 30); this setting leaves room. " * 3
               + "Dynamic (probe) and Static cannot be told apart (Eq. 2 heads, p = 0.44). Dynamic beats random.")
    bullets = text.verdict_bullets(verdict)
    lines = bullets.splitlines()
    assert lines[0] == "**Verdict.**" and sum(l.startswith("- ") for l in lines) == 5
    assert "- Dynamic (probe) and Static cannot be told apart (Eq. 2 heads, p = 0.44)." in lines
    assert text.verdict_bullets("A short verdict. Two sentences.") == "A short verdict. Two sentences."


def test_a_prepared_notebook_folds_parameters_and_drops_logs(tmp_path):
    (tmp_path / "01_dynamism").mkdir()
    (tmp_path / "01_dynamism" / "table1_niah.csv").write_text("a\n1\n")
    # what save_table records: the digest of the source of the cell that wrote it
    verdicts.record_output(tmp_path / "01_dynamism", "table1_niah", "table",
                           cell_source=verdicts.source_digest('save(t)\nprint("ok")'))
    rows = "".join(f"<tr><td>{i}</td></tr>" for i in range(30))
    notebook = new_notebook(cells=[
        new_markdown_cell("# Claim 1\nEq. 1 marks $h \\in D_t$."),
        new_code_cell("n_analysis = 20", metadata={"tags": ["parameters"]}),
        new_code_cell("# Parameters\noutput_dir = 'x'", metadata={"tags": ["injected-parameters"]}),
        new_code_cell('save(t)\nprint("ok")', execution_count=1, outputs=[
            new_output("stream", name="stderr", text="Loading weights 100%\n"),
            new_output("stream", name="stdout", text="traces: 2/7 after 3 s, about 9 s left\nok\n"),
            new_output("display_data", data={"text/html": f"<table><tbody>{rows}</tbody></table>", "text/plain": "t"})]),
    ])
    prepared = site.prepare_notebook(notebook, tmp_path, "01_dynamism")
    assert len(prepared.cells) == 3 and prepared.cells[1].cell_type == "markdown"
    assert prepared.cells[1].source.startswith('<details class="parameters">') and "n_analysis = 20" in prepared.cells[1].source
    assert prepared.cells[0].source == notebook.cells[0].source  # its TeX becomes MathML when the page is rendered
    outputs = prepared.cells[2].outputs
    assert [o.output_type for o in outputs] == ["stream", "display_data"] and outputs[0].text == "ok\n"
    assert '<a href="../01_dynamism/table1_niah.csv">table1_niah.csv</a>' in outputs[1].data["text/html"]
    assert len(notebook.cells) == 4  # the executed notebook itself is untouched
    again = site.prepare_notebook(notebook, tmp_path, "01_dynamism")
    assert [c.id for c in again.cells] == [c.id for c in prepared.cells]  # the same page on every render
    notebook.cells[3].source = "other()"  # another cell wrote the table: this one links every output instead
    elsewhere = site.prepare_notebook(notebook, tmp_path, "01_dynamism").cells[2].outputs[1].data["text/html"]
    assert "table1_niah.csv" not in elsewhere and 'href="#all-outputs"' in elsewhere


def test_a_rendered_page_has_navigation_and_its_outputs(tmp_path):
    pytest.importorskip("nbconvert")
    (tmp_path / "01_dynamism").mkdir()
    (tmp_path / "01_dynamism" / "table1_niah.csv").write_text("a\n1\n")
    verdicts.record_output(tmp_path / "01_dynamism", "table1_niah", "table",
                           cell_source=verdicts.source_digest("save(t)"))
    executed = tmp_path / "executed"
    executed.mkdir()
    for stem in ("00_inspect_attention", "01_dynamism", "02_irreplaceability"):
        nbformat.write(new_notebook(cells=[
            new_markdown_cell("# Title\n## Table 1 — metrics $D_t$"),
            new_code_cell("save(t)", execution_count=1)]), executed / f"{stem}.ipynb")
    page = site.render_page(executed / "01_dynamism.ipynb", tmp_path).read_text()
    assert '<a href="../index.html">' in page and site.PAPER_URL in page
    assert 'href="00_inspect_attention.html" rel="prev"' in page and 'href="02_irreplaceability.html" rel="next"' in page
    assert 'id="all-outputs"' in page and 'href="../01_dynamism/table1_niah.csv"' in page
    assert text.raw_tex(page) == [] and "<math" in page and "ns0:" not in page
    sections = site.page_sections(tmp_path, "01_dynamism")
    assert sections["table1_niah"].startswith("Table-1")
    soup = BeautifulSoup(page, "html.parser")
    assert len(soup.find_all("main")) == 1 and soup.find("nav", class_="site").find("math"), "headings' MathML in the contents"
    assert soup.find("footer").find("a", href=f"#{sections['table1_niah']}").get_text() == "section"


def test_the_sites_templates_escape_their_data_and_keep_the_notebooks_html(tmp_path):
    """What the report's own templates are given is escaped (a model name with markup reads as text, on a page and
    on the index); a notebook's HTML outputs, written by nbconvert's templates, stay HTML."""
    import json

    from dynheads_tl.report.index import build_index

    executed = tmp_path / "executed"
    executed.mkdir()
    nbformat.write(new_notebook(cells=[new_markdown_cell("# Title"), new_code_cell("show()", execution_count=1, outputs=[
        new_output("display_data", data={"text/html": '<b id="kept">bold</b>', "text/plain": "bold"})])]),
        executed / "01_dynamism.ipynb")
    page = site.render_page(executed / "01_dynamism.ipynb", tmp_path, meta="<i>m</i> · preset x").read_text()
    assert "&lt;i&gt;m&lt;/i&gt; · preset x" in page and "<i>m</i>" not in page
    assert '<b id="kept">bold</b>' in page
    (tmp_path / "runs.json").write_text(json.dumps({"01_dynamism": {"model": "<i>m</i>", "preset": "x", "parameters": {},
                                                                    "date": "d", "minutes": 1}}))
    build_index(tmp_path)
    index = (tmp_path / "index.html").read_text()
    assert "&lt;i&gt;m&lt;/i&gt;" in index and "<i>m</i>" not in index


def test_the_templates_ship_as_package_data():
    """An installed package finds its templates: pyproject.toml's package data covers every file of the folder."""
    import tomllib

    from dynheads_tl.report import answer

    shipped = set()
    for folder in (templating.SITE_TEMPLATES, answer.TEMPLATES):  # the site's, and the Markdown answer's
        package = folder.relative_to(ROOT).as_posix().replace("/", ".")
        assert f'"{package}"' in (ROOT / "setup.py").read_text(), "setup.py lists each template folder as a package"
        patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][package]
        shipped |= {path for pattern in patterns for path in folder.glob(pattern)}
    files = {path for path in templating.TEMPLATES.rglob("*") if path.is_file()}
    assert {"notebook.html.j2", "report.html.j2", "parts.html.j2", "conf.json", "notebook.css", "report.css"} <= {
        path.name for path in files}
    assert files <= shipped, sorted(str(path) for path in files - shipped)


def test_every_figure_on_a_page_has_alternative_text_naming_its_file_and_numbers(tmp_path):
    """Which image is which file is read from the data: the cell each figure was saved from (recorded in the
    folder's verdicts.json as the digest of the source the kernel ran) and the image's bytes; no cell's source is
    parsed."""
    pytest.importorskip("nbconvert")
    import base64

    folder = tmp_path / "02_irreplaceability"
    folder.mkdir()
    images = {name: base64.b64decode(PNG_1PX) + name.encode() for name in
              ("fig2_niah_masking", "size_aware_niah", "size_aware_hotpot", "niah_controls")}
    for name, data in images.items():
        (folder / f"{name}.png").write_bytes(data)
    (folder / "fig2_niah_masking.csv").write_text("a\n1\n")
    verdicts.record_output(folder, "fig2_niah_masking", "figure", "Fig 2 (NIAH): masking",
                           cell_source=verdicts.source_digest("a()"))
    for name in ("size_aware_niah", "size_aware_hotpot"):
        verdicts.record_output(folder, name, "figure", cell_source=verdicts.source_digest("b()"))
    # niah_controls: recorded without its cell (an older run), found by its bytes
    shown = lambda name: new_output("display_data", data={"image/png": base64.b64encode(images[name]).decode(),
                                                           "text/plain": "<Image>"})
    unknown = new_output("display_data", data={"image/png": PNG_1PX, "text/plain": "<Image>"})
    executed = tmp_path / "executed"
    executed.mkdir()
    nbformat.write(new_notebook(cells=[
        new_markdown_cell("# Claim 2\n## Fig 2: masking $D_t$"),
        new_code_cell("a()", execution_count=1, outputs=[shown("fig2_niah_masking")]),
        new_code_cell("b()", execution_count=2, outputs=[shown("size_aware_hotpot"), shown("size_aware_niah")]),
        new_code_cell("c()", execution_count=3, outputs=[shown("niah_controls"), unknown]),
    ]), executed / "02_irreplaceability.ipynb")
    page = site.render_page(executed / "02_irreplaceability.ipynb", tmp_path).read_text()
    alts = re.findall(r'<img [^>]*alt="([^"]*)"', page)
    where = "under “Fig 2: masking D_t”"
    assert alts == [f"Figure fig2_niah_masking (Fig 2 (NIAH): masking) {where}; the numbers it plots are in "
                    "fig2_niah_masking.csv.", f"Figure size_aware_hotpot {where}.", f"Figure size_aware_niah {where}.",
                    f"Figure niah_controls {where}.", f"Figure 2 of 2 of this cell {where}."]
    assert "No description has been provided" not in page


# --- statuses --------------------------------------------------------------------------------------

def _table4(tmp_path: Path, bounds_separated: bool, difference: float, sign_p: float, half: float = 0.1) -> Path:
    folder = tmp_path / "04_dynamic_rag"
    folder.mkdir(parents=True)
    (folder / "table4_rag.csv").write_text(
        "strategy,f1,f1_low,f1_high\ndynamic,0.5,0.4,0.6\nstatic,0.3,0.2,0.4\nfull,0.6,0.5,0.7\nnone,0.0,0.0,0.0\n")
    (folder / "table4_comparisons.csv").write_text(
        "a,b,f1_difference,low,high,n,sign_p,p_adjusted,separated\n"
        f"full,none,0.6,{0.4 if bounds_separated else -0.1},0.7,30,{0.001 if bounds_separated else 0.3},0.001,"
        f"{bounds_separated}\n"
        f"dynamic,static,{difference},{difference - half},{difference + half},30,{sign_p},0.9,False\n")
    return tmp_path


# The declared rule (preregistration.yaml): the primary tested alone by its own sign-test p (p_adjusted is ignored),
# reproduced only at or above the smallest effect of interest (0.05 F1), not reproduced also by TOST.
@pytest.mark.parametrize("bounds, difference, sign_p, half, status", [
    (False, 0.2, 0.01, 0.1, "no headroom"), (True, 0.2, 0.01, 0.1, "reproduced"),
    (True, -0.2, 0.01, 0.1, "not reproduced"), (True, 0.05, 0.3, 0.1, "undetermined"),
    (True, 0.0, 0.8, 0.02, "not reproduced"),  # TOST: [-0.02, 0.02] within ±0.05
    (True, 0.2, 0.07, 0.1, "undetermined")])  # interval above 0 but the exact test alone does not reach 0.05
def test_table4_status_follows_its_rule(tmp_path, bounds, difference, sign_p, half, status):
    found = item_status(_table4(tmp_path, bounds, difference, sign_p, half), "Table 4")
    assert found.status == status and "n = 30 questions" in found.headline
    assert "synthetic" in found.headline  # no run config names a real file


def _table1(tmp_path: Path, low: float, high: float, wu: tuple | None, query: tuple | None) -> Path:
    folder = tmp_path / "01_dynamism"
    folder.mkdir()
    (folder / "table1_intervals.csv").write_text(
        "task,metric,value,low,high,n_samples,n_layouts,n_seeds\n"
        f"niah,jaccard_adjacent,{(low + high) / 2},{low},{high},60,20,3\n")
    rows = ["task,static_k,metric,value,low,high,n_samples,n_layouts,baseline"]
    for name, share in (("wu", wu), ("query_focused", query)):
        if share is not None:
            rows.append(f"niah,20,share_outside_static,{sum(share) / 2},{share[0]},{share[1]},60,20,{name}")
    (folder / "static_baselines_niah.csv").write_text("\n".join(rows) + "\n")
    return tmp_path


# Rotation as in the paper: the adjacent Jaccard's upper bound <= 0.5056 + 0.05; the share outside S_20 present at a
# lower bound >= 0.10, absent at an upper bound < 0.10, against Wu's and the query-focused static set.
@pytest.mark.parametrize("low, high, wu, query, status", [
    (0.30, 0.37, (0.20, 0.30), (0.25, 0.35), "reproduced"),
    (0.47, 0.50, (0.032, 0.039), (0.279, 0.296), "weaker"),  # the SmolLM2 run: present against one set only
    (0.47, 0.50, (0.03, 0.04), (0.05, 0.08), "absent in this setting"),  # D_t stays inside both static sets
    (0.70, 0.80, (0.20, 0.30), (0.25, 0.35), "weaker"),  # less rotation than the paper, but outside both
    (0.70, 0.80, (0.05, 0.20), (0.05, 0.08), "not reproduced"),
    (0.50, 0.60, (0.05, 0.20), (0.05, 0.20), "undetermined"),
    (0.30, 0.37, (0.20, 0.30), None, "weaker")])  # the query-focused half missing: cannot read reproduced
def test_table1_status_reads_rotation_and_both_static_sets(tmp_path, low, high, wu, query, status):
    found = item_status(_table1(tmp_path, low, high, wu, query), "Table 1")
    assert found.status == status
    assert "20 layouts (60 samples)" in found.headline


def _cca_report(tmp_path: Path, tests: list[tuple[float, bool]] | None) -> Path:
    folder = tmp_path / "03_correlation"
    folder.mkdir()
    rows = ["k,control,pairs,first,leading"]
    for k in range(len(tests or [(0, False), (0, False)])):
        rows += [f"{k},held-out,100,0.9,0.9", f"{k},shuffled,100,0.1,0.1", f"{k},shuffled, same step,100,0.5,0.5"]
    (folder / "fig4_niah_cca.csv").write_text("\n".join(rows).replace("shuffled, same step", '"shuffled, same step"')
                                              + "\n")
    if tests is not None:
        lines = ["k,a,b,difference,low,high,p,p_adjusted,separated,splits"]
        for k, (difference, separated) in enumerate(tests):
            lines.append(f'{k},held-out,"shuffled, same step",{difference},{difference - 0.1},{difference + 0.1},'
                         f"{0.01 if separated else 0.5},0.02,{separated},5")
        (folder / "fig4_niah_cca_tests.csv").write_text("\n".join(lines) + "\n")
    return tmp_path


@pytest.mark.parametrize("tests, status", [
    (None, "undetermined"),  # point estimates only: held-out above the shuffle at every lag is no status
    # above at every lag, but without the per-split curve the decline half is missing: at most weaker
    ([(0.4, True), (0.3, True)], "weaker"),
    ([(0.4, True), (0.01, False)], "absent in this setting"),  # above at k = 0 only: concurrent
    ([(0.02, False), (0.01, False)], "undetermined"), ([(-0.3, True), (-0.2, True)], "not reproduced")])
def test_cca_status_reads_the_notebooks_tests_with_lags_ahead_deciding(tmp_path, tests, status):
    assert item_status(_cca_report(tmp_path, tests), "Fig 4").status == status


def test_every_committed_item_has_a_computed_status():
    from dynheads_tl.report.items import index_items

    statuses = {item.item: item_status(COMMITTED, item.item) for _, item in index_items()}
    assert not [item for item, s in statuses.items() if s.status == "see files"]
    # "not run" only for a claim whose notebook has no folder in the committed report
    for claim, item in index_items():
        assert (statuses[item.item].status == "not run") == (not (COMMITTED / claim.notebook).is_dir()), item.item
    for item, found in statuses.items():
        if found.status not in ("qualitative", "not run"):
            assert "n = " in found.headline and "[" in found.headline or item == "Beyond 0", (item, found.headline)


def test_every_figure_and_table_of_the_committed_report_is_linked_from_the_index():
    from html.parser import HTMLParser

    class Links(HTMLParser):
        def __init__(self):
            super().__init__()
            self.links = set()

        def handle_starttag(self, tag, attrs):
            self.links |= {v for k, v in attrs if k in ("href", "src") and v}

    from dynheads_tl.report.results import model_reports, preset_reports

    def links(page: Path) -> set[str]:
        parser = Links()
        parser.feed(page.read_text(encoding="utf-8"))
        return parser.links

    # the root links every preset's index, each preset's index every model's report, and each model's index every
    # file its notebooks wrote
    presets = preset_reports(COMMITTED)
    assert {f"{p.prefix}index.html" for p in presets} <= links(COMMITTED / "index.html")
    missing = []
    for preset in presets:
        reports = model_reports(preset.folder)
        missing += sorted({f"{r.prefix}index.html" for r in reports} - links(preset.folder / "index.html"))
        for report in reports:
            outputs = {p.relative_to(report.folder).as_posix() for p in report.folder.glob("[0-9][0-9]_*/*")
                       if p.suffix in (".png", ".csv", ".md")}
            assert outputs, report.folder
            missing += [f"{report.folder.relative_to(COMMITTED)}/{name}"
                        for name in sorted(outputs - links(report.folder / "index.html"))]
    assert missing == []
    assert len({p.relative_to(SMOLLM2).as_posix() for p in SMOLLM2.glob("[0-9][0-9]_*/*")}) > 60
    index = (SMOLLM2 / "index.html").read_text(encoding="utf-8")
    assert "<th>status</th>" in index and site.PAPER_URL in index


def test_a_declared_finding_whose_files_are_missing_is_said_to_be_missing(tmp_path):
    """A run whose files lack what a declared verdict reads (an older run) quotes nothing for it, and says so,
    instead of dropping it."""
    (tmp_path / "executed").mkdir()
    nbformat.write(new_notebook(cells=[new_code_cell("print('an older cell')")]),
                   tmp_path / "executed" / "06_kv_retention.ipynb")
    (tmp_path / "06_kv_retention").mkdir()
    quoted = findings.findings(tmp_path)
    assert [label for label, _, _ in quoted] == ["Beyond 6, per-step KV retention"] * 2
    assert quoted[0][2] == ["Primary comparison (predicted against static retention over the KV-head budgets): not run."]
    assert quoted[1][2][0].startswith("not in this run: the files of 06_kv_retention lack what this verdict reads")
