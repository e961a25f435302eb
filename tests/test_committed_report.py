"""The committed report (papers_figures/) and the checks it must pass, each shown on small fixtures.

No model and no papermill run here: notebooks are built with nbformat, outputs are hand-written CSVs.
"""
from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from dynheads_tl.report.checks import (absolute_paths, headline_problems, link_problems, notebook_problems,
                                       offline_problems, path_problems, report_problems)
from dynheads_tl.report.index import build_index, render_notebook_html
from dynheads_tl.report.items import SYNTHETIC_NOTE, index_items, item_stem, ours_text
from dynheads_tl.report.site import remote_resources
from dynheads_tl.tasks.hotpot import hotpot_label

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "papers_figures"

# A 1×1 PNG, enough for links and thumbnails.
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")
TABLE1_HEADER = "model,task,jaccard_static,jaccard_adjacent,entropy,heads_per_step_mean,heads_per_step_sd,ever_active,n_heads\n"


def test_the_committed_report_has_no_problems():
    """The report as committed, every model's and every kept preset's part: notebooks finished with the recorded
    parameters, no machine paths, live links, and numbers that match their CSVs. Regenerate it with `make report-all`
    when this fails."""
    from dynheads_tl.report.results import model_reports, preset_reports

    presets = preset_reports(COMMITTED)
    assert [p.preset for p in presets] == ["default", "long", "scale"], "the committed presets, default first"
    assert sum(len(model_reports(p.folder)) for p in presets) >= 9, "every model's run of every committed preset"
    problems = report_problems(COMMITTED)
    assert not problems, f"{len(problems)} problem(s) in papers_figures/:\n" + "\n".join(problems)


# --- a small clean report ---------------------------------------------------------------------------

def _executed_notebook(path: Path, parameters: dict, *, failed: bool = False) -> None:
    cells = [new_code_cell("n_analysis = 20", metadata={"tags": ["parameters"]}),
             new_code_cell("print(n_analysis)", outputs=[new_output("stream", name="stdout", text="4\n")])]
    if failed:
        cells.append(new_code_cell("raise ValueError('n_analysis must be positive')", outputs=[
            new_output("error", ename="ValueError", evalue="n_analysis must be positive", traceback=[])]))
    notebook = new_notebook(cells=cells)
    notebook.metadata["papermill"] = {"exception": True if failed else None, "parameters": parameters}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, path)


def _write_outputs(out: Path, *, hotpot_source: str | None = "synthetic") -> None:
    dynamism, masking = out / "01_dynamism", out / "02_irreplaceability"
    dynamism.mkdir(parents=True)
    masking.mkdir(parents=True)
    (dynamism / "table1_niah.csv").write_text(TABLE1_HEADER + "m,niah,0.25,0.5,3.1,4.5,2.0,40,270\n")
    (dynamism / "table1_niah.md").write_text("| x |\n")
    (dynamism / "table1_niah.config.json").write_text(json.dumps({"model": "m", "output_dir": "papers_figures"}))
    (masking / "fig6_hotpot_masking.csv").write_text(
        "context,depth,run,condition,f1\n250,0.1,0,none,0.5\n250,0.1,0,dynamic,0.1\n250,0.1,0,random,0.4\n")
    (masking / "fig6_hotpot_masking.png").write_bytes(PNG)
    config = {"model": "m"} if hotpot_source is None else {"model": "m", "hotpot_source": hotpot_source}
    (masking / "fig6_hotpot_masking.config.json").write_text(json.dumps(config))


@pytest.fixture
def clean_report(tmp_path) -> Path:
    """Outputs of notebooks 01 and 02 only (the other items are "not produced"), both runs finished."""
    out = tmp_path / "report"
    _write_outputs(out)
    parameters = {"01_dynamism": {"n_analysis": 4}, "02_irreplaceability": {}}
    for notebook, params in parameters.items():
        _executed_notebook(out / "executed" / f"{notebook}.ipynb", {**params, "output_dir": "report"})
    runs = {notebook: {"model": "m", "preset": "smoke", "parameters": params, "date": "2026-11-30", "minutes": 1.5}
            for notebook, params in parameters.items()}
    (out / "runs.json").write_text(json.dumps(runs))
    build_index(out)
    return out


def test_a_clean_partial_report_passes_every_check(clean_report):
    assert report_problems(clean_report) == []
    readme = (clean_report / "README.md").read_text()
    assert next(line for line in readme.splitlines() if line.startswith("| Fig 1 |")).count("not produced") == 1
    assert "## Runs" in readme


def test_a_file_its_run_did_not_record_is_reported_as_an_earlier_runs(clean_report):
    from dynheads_tl import verdicts
    from dynheads_tl.report.checks import stale_output_problems

    folder = clean_report / "01_dynamism"
    verdicts.record_output(folder, "table1_niah", "table", cell_source=verdicts.source_digest("a()"))
    (folder / "hotpot_questions.csv").write_text("_id\n")  # written by the setup line, never recorded: not stale
    assert stale_output_problems(clean_report) == []
    (folder / "fig4_niah_cca_table.csv").write_text("k\n")
    assert stale_output_problems(clean_report) == [
        "01_dynamism/ holds files its run did not write (an earlier run's): fig4_niah_cca_table.csv"]
    assert any("fig4_niah_cca_table.csv" in problem for problem in report_problems(clean_report))


def test_a_failed_notebook_is_reported(clean_report):
    _executed_notebook(clean_report / "executed" / "01_dynamism.ipynb", {"n_analysis": 4}, failed=True)
    problems = notebook_problems(clean_report)
    assert any("papermill recorded an exception" in p for p in problems)
    assert any("raised ValueError: n_analysis must be positive" in p for p in problems)


def test_parameters_that_differ_from_runs_json_are_reported(clean_report):
    _executed_notebook(clean_report / "executed" / "01_dynamism.ipynb", {"n_analysis": -1, "output_dir": "x"})
    assert notebook_problems(clean_report) == [
        "executed/01_dynamism.ipynb ran with parameters {'n_analysis': -1}, but runs.json records {'n_analysis': 4}"]
    runs = json.loads((clean_report / "runs.json").read_text())
    runs["03_correlation"] = runs["01_dynamism"]
    (clean_report / "runs.json").write_text(json.dumps(runs))
    assert any("executed/03_correlation.ipynb is missing" in p for p in notebook_problems(clean_report))


def test_absolute_paths_are_found_and_urls_are_not():
    text = ('{"output_dir": "/home/alice/papers_figures"} File /opt/venv/lib/x.py:3 '
            "PosixPath('/work/main/out.md') see https://example.org/a/b/c and //cdn.example.org/x/y "
            'if(/Trident/i.test(n)) "folder:/path/to/txts" file:///srv/data/x C:\\\\Users\\\\bob\\\\run 1/2/3 and/or')
    assert absolute_paths(text) == sorted(["/home/alice/papers_figures", "/opt/venv/lib/x.py", "/work/main/out.md",
                                           "file:///srv/data/x", "C:\\\\Users\\\\bob\\\\run"])


def test_a_machine_path_in_any_committed_file_is_reported(clean_report):
    config = clean_report / "01_dynamism" / "table1_niah.config.json"
    config.write_text(json.dumps({"output_dir": "/home/alice/papers_figures"}))
    assert path_problems(clean_report) == [
        "01_dynamism/table1_niah.config.json holds absolute path(s) of a machine: /home/alice/papers_figures"]


def test_the_index_writes_no_path_of_the_machine(clean_report):
    for name in ("README.md", "index.html"):
        text = (clean_report / name).read_text()
        assert str(clean_report) not in text and absolute_paths(text) == []


def test_dead_absolute_or_outside_links_are_reported(clean_report):
    readme = clean_report / "README.md"
    readme.write_text(readme.read_text() + "\n[gone](01_dynamism/gone.csv) [up](../secret.txt) [web](https://arxiv.org/abs/2602.11162)\n")
    page = clean_report / "index.html"
    page.write_text(page.read_text().replace("</body>", f'<img src="{clean_report}/x.png"></body>'))
    problems = link_problems(clean_report)
    assert problems == ["index.html links to the absolute path " + f"{clean_report}/x.png",
                        "README.md links to 01_dynamism/gone.csv, which does not exist",
                        "README.md links to ../secret.txt, outside the folder"]


def test_numbers_that_differ_from_their_csv_are_reported(clean_report):
    csv = clean_report / "01_dynamism" / "table1_niah.csv"
    csv.write_text(TABLE1_HEADER + "m,niah,0.3,0.5,3.1,4.5,2.0,40,270\n")  # the index is now stale
    problems = headline_problems(clean_report)
    assert len(problems) == 2 and all("Table 1" in p and "Jaccard top-20 0.3000" in p for p in problems)
    build_index(clean_report)
    assert headline_problems(clean_report) == []
    readme = clean_report / "README.md"
    readme.write_text(readme.read_text().replace("dynamic 0.10", "dynamic 0.01"))  # edited by hand
    assert [p.split(" quotes")[0] for p in headline_problems(clean_report)] == ["README.md"]


@pytest.mark.parametrize("stem_name, header, first, second, number", [
    ("01_dynamism/table1_niah", TABLE1_HEADER, "m,niah,0.25,0.5,3.1,4.5,2.0,40,270",
     "m,niah,0.25,0.5,3.1,4.5,2.0,41,270", "41 of 270"),
    ("02_irreplaceability/fig2_niah_masking", "condition,accuracy\n", "none,1.0\nnone,1.0", "none,1.0\nnone,0.0",
     "none 0.50"),
    ("04_dynamic_rag/table4_rag", "strategy,em,f1\n", "dynamic,0.5,0.25", "dynamic,0.5,0.125", "dynamic 0.500/0.125"),
])
def test_headlines_only_format_numbers_read_from_the_csv(tmp_path, stem_name, header, first, second, number):
    csv = (tmp_path / stem_name).with_suffix(".csv")
    csv.parent.mkdir(parents=True)
    item = next(item.item for claim, item in index_items() if item_stem(claim, item) == stem_name)
    csv.write_text(header + first + "\n")
    before = ours_text(tmp_path, item)
    csv.write_text(header + second + "\n")
    after = ours_text(tmp_path, item)
    assert before != after and number in after


def test_synthetic_hotpot_results_say_so(tmp_path):
    assert hotpot_label("synthetic") == "HotpotQA (synthetic)"
    assert hotpot_label("data/hotpot_dev_distractor_v1.json") == "HotpotQA"
    for source, labelled in (("synthetic", True), (None, True), ("data/hotpot_dev_distractor_v1.json", False)):
        out = tmp_path / str(source).replace("/", "_")
        _write_outputs(out, hotpot_source=source)
        build_index(out)
        for name in ("README.md", "index.html"):
            text = (out / name).read_text()
            fig6 = next(line for line in text.splitlines() if "Fig 6" in line and "0.50" in line)
            assert (SYNTHETIC_NOTE in fig6) == labelled, (source, name)
            # the opening paragraph explains the mark only on a page that shows it
            assert ("seeded synthetic generator" in text) == labelled, (source, name)
        table1 = next(line for line in (out / "README.md").read_text().splitlines() if line.startswith("| Table 1"))
        assert SYNTHETIC_NOTE not in table1  # NIAH items are never labelled


def test_a_presets_table_of_models_marks_synthetic_results_too(tmp_path):
    from dynheads_tl.report.across import model_cells

    preset = tmp_path / "default"
    for model, source in (("m1", "synthetic"), ("m2", "data/hotpot_dev_distractor_v1.json")):
        _write_outputs(preset / model, hotpot_source=source)
        (preset / model / "runs.json").write_text(json.dumps({"02_irreplaceability": {"model": model}}))
    _, rows = model_cells(preset)
    [fig6] = [cells for _, item, cells in rows if item.item == "Fig 6"]
    assert [SYNTHETIC_NOTE in cell.headline for cell in fig6] == [True, False]
    assert [cell.synthetic for cell in fig6] == [True, False]
    build_index(preset)
    text = (preset / "README.md").read_text()
    assert SYNTHETIC_NOTE in next(line for line in text.splitlines() if line.startswith("| Fig 6"))
    assert "seeded synthetic generator" in text  # the intro explains the mark the table shows


def test_index_html_links_renderings_thumbnails_and_runs(clean_report):
    (clean_report / "executed" / "02_irreplaceability.html").write_text("<html></html>")
    build_index(clean_report)
    page = (clean_report / "index.html").read_text()
    fig6 = re.search(r'<tr data-item="Fig 6">.*?</tr>', page).group(0)
    assert '<a href="executed/02_irreplaceability.html">02_irreplaceability</a>' in fig6
    assert '<a href="executed/01_dynamism.ipynb">01_dynamism</a>' in page  # no rendering: the notebook itself
    image = "02_irreplaceability/fig6_hotpot_masking.png"
    assert re.search(rf'<a href="{image}"><img src="{image}"', page) and "max-width:100%" in page
    assert '<h2 id="runs">Runs</h2>' in page and "Run times are those of the last run" in page
    # model, preset and date once at the top, not on every row
    assert re.search(r'<p class="meta"><strong>Runs:</strong> m · preset smoke · 2026-11-30</p>', page)
    assert "smoke" not in fig6
    assert not list(clean_report.glob("*.tmp"))
    assert link_problems(clean_report) == []


def test_html_that_loads_from_the_network_is_reported(clean_report):
    page = '<script src="https://cdn.example.org/require.js"></script><script type="module">import x from "https://unpkg.com/cv";</script>'
    assert remote_resources(page) == ['import x from "https://unpkg.com/cv', "script https://cdn.example.org/require.js"]
    assert remote_resources('<link rel="stylesheet" href="//cdn.example.org/a.css">') == ["link //cdn.example.org/a.css"]
    assert remote_resources('<script>var u="https://reactjs.org/docs/x"; /a/.test(u)</script>') == []
    # read as HTML, not as text: a tag written inside a script's string loads nothing
    assert remote_resources("""<script>var tag = '<script src="https://cdn.example.org/x.js">';</script>""") == []
    (clean_report / "executed" / "01_dynamism.html").write_text(page)
    assert [p.split(":")[0] for p in offline_problems(clean_report)] == ["executed/01_dynamism.html loads from the network"]


def test_rendered_notebooks_open_offline(tmp_path):
    pytest.importorskip("nbconvert")
    png = base64.b64encode(PNG).decode()
    notebook = new_notebook(cells=[
        new_markdown_cell("Eq. 2: $h \\in D_t$"),
        new_code_cell("show()", outputs=[
            new_output("display_data", data={"image/png": png, "text/plain": "<Figure>"}),
            new_output("execute_result", execution_count=1, data={
                "text/html": '<div id="vis"></div><script type="module">document.getElementById("vis").textContent="ok";</script>',
                "text/plain": "<vis>"})])])
    path = tmp_path / "executed" / "00_inspect_attention.ipynb"
    path.parent.mkdir()
    nbformat.write(notebook, path)
    page_path = render_notebook_html(path)
    assert page_path == path.with_suffix(".html") and not list(path.parent.glob("*.tmp"))
    page = page_path.read_text()
    assert not re.search(r"""<script[^>]*\bsrc\s*=\s*["']?(https?:)?//""", page, re.I)
    assert remote_resources(page) == [] and "mathjax" not in page.lower() and "require.min.js" not in page
    # the image is a file beside the page, named by its bytes, never a base64 copy inside it
    assert not re.search(r"<img[^>]*src=\"data:", page)
    images = list((path.parent / "00_inspect_attention_files").glob("*.png"))
    assert [p.read_bytes() for p in images] == [PNG] and f'src="00_inspect_attention_files/{images[0].name}"' in page
    assert 'document.getElementById("vis").textContent="ok";' in page  # inline scripts still run


def test_no_committed_page_embeds_an_image():
    """Figures are files the pages link (one regeneration adds only the images whose bytes changed), never base64
    inside the HTML; nbconvert's stylesheet keeps its few icon data URLs, which are not figures."""
    root = Path(__file__).resolve().parents[1] / "papers_figures"
    pages = sorted(root.rglob("*.html"))
    assert len(pages) > 26
    embedded = [str(p.relative_to(root)) for p in pages if re.search(r"<img[^>]*src=\"data:", p.read_text())]
    assert not embedded, embedded


def _layout(clean_report: Path, root: Path, reports: dict[str, tuple[str, str]], only: tuple[str, ...] = ()) -> None:
    """``root/<preset>/<model>/`` for each folder name -> (preset, model) in ``reports``: the clean report's notebook
    folders and executed notebooks (``only`` those notebooks), its runs recorded under that preset and model."""
    import shutil

    runs = json.loads((clean_report / "runs.json").read_text())
    for name, (preset, model) in reports.items():
        target = root / preset / name
        for folder in ("01_dynamism", "02_irreplaceability", "executed"):
            if not only or folder in only or folder == "executed":
                shutil.copytree(clean_report / folder, target / folder)
        kept = {k: {**v, "preset": preset, "model": model} for k, v in runs.items() if not only or k in only}
        for stem in {"01_dynamism", "02_irreplaceability"} - set(kept):
            (target / "executed" / f"{stem}.ipynb").unlink()
        (target / "runs.json").write_text(json.dumps(kept))


def _index_all(root: Path) -> None:
    """The indexes render_report builds, in its order (the root's, each preset's, then each model's, which link up
    to them), without rendering the fixture's pages (its notebooks are stubs whose verdicts lack their files)."""
    from dynheads_tl.report.results import model_reports, preset_reports

    build_index(root)
    for preset in preset_reports(root):
        build_index(preset.folder)
        for report in model_reports(preset.folder):
            build_index(report.folder)


def test_a_second_models_report_lands_beside_the_first_and_the_presets_index_reads_both(clean_report, tmp_path):
    """One layout for every model: each model's run of a preset is a report of its own, <preset>/<model>/ (no model
    is the report's root); the preset's index puts their statuses side by side, the root's lists the preset, and
    each nested index links up to the ones that hold it."""
    from dynheads_tl.report.results import model_reports
    from dynheads_tl.report.runner import output_dir_for

    # by hand (not --committed) a run lands in the same layout under runs/
    assert output_dir_for("default", "gemma-3-270m", {}) == Path("runs/default/gemma-3-270m")
    assert output_dir_for("default", None, {}) == Path("runs/default/smollm2-135m-instruct")
    root = tmp_path / "root"
    preset = root / "default"
    _layout(clean_report, root, {"m": ("default", "m"), "gemma-3-270m": ("default", "gemma-3-270m")})
    first, second = preset / "m", preset / "gemma-3-270m"
    intervals = "task,metric,value,low,high,n_samples,n_seeds\nniah,jaccard_adjacent,{},{},{},60,3\n"
    (first / "01_dynamism" / "table1_intervals.csv").write_text(intervals.format(0.335, 0.30, 0.37))
    (second / "01_dynamism" / "table1_intervals.csv").write_text(intervals.format(0.94, 0.91, 0.97))
    shares = ("baseline,static_k,metric,value,low,high,n_samples\nwu,20,share_outside_static,{},{},{},60\n"
              "query_focused,20,share_outside_static,{},{},{},60\n")
    (first / "01_dynamism" / "static_baselines_niah.csv").write_text(shares.format(0.03, 0.02, 0.04, 0.30, 0.25, 0.35))
    (second / "01_dynamism" / "static_baselines_niah.csv").write_text(shares.format(0.02, 0.01, 0.03, 0.05, 0.03, 0.07))
    _index_all(root)
    # the embedded models in their declared order, then others by name: no model is first by being the default
    assert [(r.model, r.prefix) for r in model_reports(preset)] == [("gemma-3-270m", "gemma-3-270m/"), ("m", "m/")]
    assert "## Every model" not in (first / "README.md").read_text(), "a model's own index has its own rows only"
    readme = (preset / "README.md").read_text()
    assert "| item | what | paper | ours |" not in readme, "a preset's index lists reports, it has no item rows"
    table = readme.split("## Every model", 1)[1]
    assert "| item | paper | [gemma-3-270m](gemma-3-270m/README.md) | [m](m/README.md) | statuses |" in table
    table1 = next(line for line in table.splitlines() if line.startswith("| Table 1 |"))
    # Table 1 reads both halves (preregistration.yaml): the first rotates as in the paper with retrieval outside the
    # query-focused S_20 only (weaker); the second stays inside both static sets (absent in this setting)
    assert "| weaker: adjacent-step Jaccard 0.34 [0.30, 0.37]" in table1, "m's, from its files"
    assert "| absent in this setting: adjacent-step Jaccard 0.94 [0.91, 0.97]" in table1, "gemma's, from its own"
    assert table1.endswith("| differ |"), "the last column compares the two statuses"
    fig1 = next(line for line in table.splitlines() if line.startswith("| Fig 1 |"))
    assert fig1.count("missing: –") == 2, "a notebook the default preset runs, not here: missing (as on the page)"
    top = (root / "README.md").read_text().split("## Preset default", 1)[1]
    assert "| item | paper | [gemma-3-270m](default/gemma-3-270m/README.md) | [m](default/m/README.md) | statuses |" in top
    assert next(line for line in top.splitlines() if line.startswith("| Table 1 |")).endswith("| differ |")
    for folder in (root, preset, first, second):
        assert report_problems(folder) == [], folder
    page = (preset / "index.html").read_text()
    assert '<th><a href="gemma-3-270m/index.html">gemma-3-270m</a></th>' in page
    assert '<a class="up" href="../index.html">' in page
    nested = (first / "index.html").read_text()
    assert '<a class="up" href="../../index.html">' in nested and '<a class="up" href="../index.html">' in nested


def test_a_presets_report_beside_the_default_one_is_quoted_apart_with_its_contexts(clean_report, tmp_path):
    """A named preset's runs (<root>/<preset>/<model>/: notebook 07's long grid, say) are quoted apart: the top
    index gives each preset a table of its own, labelled with the preset, each cell with its status, headline and
    the longest context it read; the README's findings quote them under the preset; a folder not named after a
    preset is not taken for one."""
    from dynheads_tl.report.findings import findings_markdown
    from dynheads_tl.report.results import preset_reports

    root = tmp_path / "root"
    _layout(clean_report, root, {"m": ("default", "m")})
    _layout(clean_report, root, {"m": ("long", "m")})
    (root / "long" / "m" / "01_dynamism" / "table1_niah.config.json").write_text(
        json.dumps({"model": "m", "output_dir": "papers_figures/long/m", "context_tokens": 8000}))
    _layout(clean_report, root, {"m": ("other", "m")})
    _index_all(root)
    assert [(p.preset, p.prefix) for p in preset_reports(root)] == [("default", "default/"), ("long", "long/")]
    readme = (root / "README.md").read_text()
    section = readme.split("## Preset long", 1)[1]
    assert "[Its index](long/README.md)" in section and "| item | paper | [m](long/m/README.md) |" in section
    table1 = next(line for line in section.splitlines() if line.startswith("| Table 1 |"))
    assert table1.endswith("(NIAH 8,000 tokens) |"), table1
    default = readme.split("## Preset default", 1)[1].split("## Preset long", 1)[0]
    top = next(line for line in default.splitlines() if line.startswith("| Table 1 |"))
    assert "(NIAH 1,000 tokens) |" in top, "the default run's own longest context, in its own table"
    for folder in (root, root / "default", root / "long", root / "long" / "m"):
        assert report_problems(folder) == [], folder
    page = (root / "index.html").read_text()
    assert '<h2 id="preset-long">Preset long</h2>' in page and '<a href="long/index.html">' in page
    block = findings_markdown(root, link_prefix="")
    assert "**Preset `long`** ([its index](long/index.html)" in block
    assert "**m** ([default/m/](default/m/index.html)" in block


def test_a_presets_report_holds_its_own_models_and_a_folder_with_other_runs_is_left_out(clean_report, tmp_path,
                                                                                        caplog):
    """long/<model>/ is the preset's run on each model: the top index links each through long/; a long/ where a
    model's runs.json records another preset's runs is not quoted as the long grid (a warning says why)."""
    from dynheads_tl.report.results import preset_reports

    root = tmp_path / "root"
    _layout(clean_report, root, {"m": ("long", "m"), "g2": ("long", "g2")}, only=("01_dynamism",))
    _index_all(root)
    readme = (root / "README.md").read_text()
    assert "[g2](long/g2/README.md)" in readme.split("## Preset long", 1)[1]
    assert report_problems(root) == [] and report_problems(root / "long") == []
    assert "not run in this preset" in (root / "long" / "m" / "README.md").read_text(), "02 is left out by design"
    (root / "long" / "m" / "runs.json").write_text(json.dumps({"01_dynamism": {"preset": "smoke", "model": "m"}}))
    with caplog.at_level("WARNING"):
        assert preset_reports(root) == []
    assert "record runs of other presets" in caplog.text
