"""Which cell wrote which file, as a page links it: under a cut table, the "full table" link names the CSVs the
table's own cell wrote, and the "All outputs" list links each file to the section of the cell that wrote it. Checked
on a notebook executed here by the runner (papermill, a real kernel), whose cells write tables one after the other,
against what each cell wrote by construction; and on hand-made notebooks for the cases a run does not give."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from pathlib import Path

import nbformat
import pytest
from bs4 import BeautifulSoup
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from dynheads_tl import verdicts
from dynheads_tl.report import site

PNG_1PX = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
LONG = "pd.DataFrame({'row': range(20), 'value': [0.5 * i for i in range(20)]})"  # cut on a page (> 15 rows)

# What each cell of the notebook below writes, by construction: the truth the page is checked against.
WROTE = {"setup": [], "writes-first": ["first_long"], "writes-second": ["second_long", "second_small"],
         "writes-figure": ["tiny_value"], "writes-nothing": []}


def _linked_notebook(folder: Path) -> Path:
    """The tiny claim's notebook (tests/test_runner.py) with tables written in consecutive cells, each cell showing a
    long table, so that a file placed one cell off shows under the wrong table."""
    nb = new_notebook()
    nb.cells = [
        new_code_cell("fail = False  # raise in the next cell\nvalue = 1  # written out\n"
                      "output_dir = 'papers_figures'  # where outputs go", metadata={"tags": ["parameters"]}),
        new_code_cell("import pathlib\nimport pandas as pd\nfrom IPython.display import Image, display\n"
                      "from dynheads_tl.report.figures import save_figure, save_table\n"
                      "out = pathlib.Path(output_dir) / '01_tiny'\nout.mkdir(parents=True, exist_ok=True)\n"
                      "(out / 'value.txt').write_text(str(value))", id="setup"),
        new_markdown_cell("## First tables"),
        new_code_cell(f"first = {LONG}\nsave_table(first, 'first_long', out, {{}}, 'The first table')\n"
                      "display(first)", id="writes-first"),
        new_code_cell(f"second = {LONG}\nsave_table(second, 'second_long', out, {{}})\n"
                      "save_table(second.head(3), 'second_small', out, {})\ndisplay(second)", id="writes-second"),
        new_markdown_cell("## The tiny figure"),
        new_code_cell("import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
                      "fig, ax = plt.subplots(figsize=(2, 2))\nax.bar([0], [value])\nax.set_title('The tiny value')\n"
                      "display(Image(filename=str(save_figure(fig, 'tiny_value', out, "
                      f"pd.DataFrame({{'value': [value]}}), {{}}))))\ndisplay({LONG})", id="writes-figure"),
        new_markdown_cell("## Only shown"),
        new_code_cell(f"display({LONG})", id="writes-nothing"),
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "01_tiny.ipynb"
    nbformat.write(nb, path)
    return path


@pytest.fixture
def linked_run(tmp_path, monkeypatch):
    """The tiny claim of tests/test_runner.py, its notebook replaced by :func:`_linked_notebook`, run once by the
    runner into a temporary folder; yields that folder."""
    import sys

    from test_runner import install_tiny_suite

    from dynheads_tl.report import runner

    work = install_tiny_suite(tmp_path, monkeypatch, _linked_notebook)
    out = work / "out"
    runner.run_report(only="01_tiny", output_dir=out, cwd=work, show_cells=False)
    yield out
    sys.modules.pop("dynheads_tl.claims.tinyclaim", None)


def _cell_of(tag) -> str | None:
    """The id of the notebook cell a tag of a rendered page lies in (nbconvert's ``<div id="cell-id=...">``)."""
    cell = tag.find_parent(lambda t: str(t.get("id", "")).startswith("cell-id="))
    return cell["id"].split("=", 1)[1] if cell else None


def _heading_above(soup, cell_id: str) -> str:
    """The anchor of the last heading before the cell, in the page's order."""
    above = None
    for tag in soup.find_all(lambda t: (t.name in ("h1", "h2", "h3") and t.has_attr("id"))
                             or t.get("id") == f"cell-id={cell_id}"):
        if tag.get("id") == f"cell-id={cell_id}":
            return above
        above = tag["id"]
    raise AssertionError(f"no cell {cell_id} on the page")


def check_links(page: str, wrote: dict[str, list[str]], folder: Path, files_known: bool = True) -> None:
    """Every "full table" note under a cut table links exactly the CSVs its own cell wrote (the page's list of every
    output when it wrote none, or when ``files_known`` is False: some file's cell is unknown), and every "section"
    link of the All outputs list goes to the heading above the cell that wrote the file."""
    soup = BeautifulSoup(page, "html.parser")
    notes = soup.find_all("p", class_="shortened")
    assert notes, "the page cuts no table: this check checks nothing"
    for note in notes:
        cell = _cell_of(note)
        expected = [f"{stem}.csv" for stem in wrote[cell] if files_known and (folder / f"{stem}.csv").exists()]
        links = [(a.get_text(), a["href"]) for a in note.find_all("a")]
        if expected:
            assert links == [(name, f"../{folder.name}/{name}") for name in expected], (cell, links)
        else:
            assert links == [("all outputs", "#all-outputs")], (cell, links)
    writer = {stem: cell for cell, stems in wrote.items() for stem in stems}
    listed = soup.find("h2", id="all-outputs").find_next("ul").find_all("li", recursive=False)
    sections = {li.find("strong").get_text(): a["href"] for li in listed for a in li.find_all("a")
                if a.get_text() == "section"}
    assert set(sections) == set(writer), sections
    for stem, href in sections.items():
        assert href == f"#{_heading_above(soup, writer[stem])}", (stem, href)


def test_full_table_and_section_links_name_the_cell_that_wrote_the_file(linked_run):
    out = linked_run
    folder = out / "01_tiny"
    page = (out / "executed" / "01_tiny.html").read_text()
    check_links(page, WROTE, folder)
    soup = BeautifulSoup(page, "html.parser")
    second = [note for note in soup.find_all("p", class_="shortened") if _cell_of(note) == "writes-second"]
    assert [a.get_text() for a in second[0].find_all("a")] == ["second_long.csv", "second_small.csv"]
    # the figure's alternative text names the section of its own cell
    assert 'alt="Figure tiny_value (The tiny value) under “The tiny figure”' in page
    # recorded as data when the file was written: the cell's source as the kernel ran it (and its id, where the
    # front end sends one; nbclient, which papermill runs, sends none), never an execution count
    recorded = json.loads((folder / verdicts.FILE).read_text())["outputs_recorded"]
    executed = nbformat.read(out / "executed" / "01_tiny.ipynb", as_version=4)
    digests = {cell.id: verdicts.source_digest(cell.source) for cell in executed.cells if cell.cell_type == "code"}
    for cell, stems in WROTE.items():
        for stem in stems:
            assert recorded[stem]["cell_source"] == digests[cell], stem
            assert "cell" not in recorded[stem], "no execution count is recorded"
    # the index's links to each file's section read the same
    assert site.page_sections(out, "01_tiny") == {stem: _heading_above(soup, cell) for cell, stems in WROTE.items()
                                                   for stem in stems}


# --- the cases a papermill run does not give -------------------------------------------------------

def _shown(data: bytes):
    return new_output("display_data", data={"image/png": base64.b64encode(data).decode(), "text/plain": "<Image>"})


def _long_table():
    rows = "".join(f"<tr><td>{i}</td></tr>" for i in range(20))
    return new_output("display_data", data={"text/html": f"<table><tbody>{rows}</tbody></table>", "text/plain": "t"})


def _render(tmp_path: Path, notebook) -> str:
    executed = tmp_path / "executed"
    executed.mkdir(exist_ok=True)
    nbformat.write(notebook, executed / "02_irreplaceability.ipynb")
    return site.render_page(executed / "02_irreplaceability.ipynb", tmp_path).read_text()


def test_a_cell_is_found_by_its_id_else_by_its_source(tmp_path):
    """A front end that sends the cell's id (JupyterLab) gets it recorded and used; a papermill run is matched by
    the cell's source; a source two cells share places nothing (its figure would still be found by its bytes)."""
    folder = tmp_path / "02_irreplaceability"
    folder.mkdir()
    for stem in ("by_id", "by_source", "shared"):
        (folder / f"{stem}.csv").write_text("a\n1\n")
    verdicts.record_output(folder, "by_id", "table", cell_id="cell-b", cell_source=verdicts.source_digest("other()"))
    verdicts.record_output(folder, "by_source", "table", cell_source=verdicts.source_digest("b()"))
    verdicts.record_output(folder, "shared", "table", cell_source=verdicts.source_digest("same()"))
    notebook = new_notebook(cells=[
        new_markdown_cell("# Claim 2\n## A"),
        new_code_cell("a()", id="cell-a", execution_count=1, outputs=[_long_table()]),
        new_markdown_cell("## B"),
        new_code_cell("b()", id="cell-b", execution_count=2, outputs=[_long_table()]),
        new_code_cell("same()", id="cell-c", execution_count=3, outputs=[_long_table()]),
        new_code_cell("same()", id="cell-d", execution_count=4),
    ])
    wrote = {"cell-a": [], "cell-b": ["by_id", "by_source"], "cell-c": [], "cell-d": []}
    assert site.cell_files(notebook, folder) == {cell: stems for cell, stems in wrote.items() if stems}
    check_links(_render(tmp_path, notebook), wrote, folder)


def test_an_earlier_runs_execution_counts_are_never_used(tmp_path):
    """A results file of a run before cells were recorded holds execution counts, one more than the writing cell's
    own: none is used. Its figures are found by their bytes (alternative text, section links); its tables are not
    placed, so no cell's list of files is complete, and every cut table links the page's list of every output."""
    folder = tmp_path / "02_irreplaceability"
    folder.mkdir()
    png = base64.b64decode(PNG_1PX) + b"old"
    (folder / "old_figure.png").write_bytes(png)
    for stem in ("old_figure", "old_table"):
        (folder / f"{stem}.csv").write_text("a\n1\n")
    (folder / verdicts.FILE).write_text(json.dumps({"format": 1, "outputs_recorded": {
        "old_table": {"kind": "table", "caption": "", "cell": 2},
        "old_figure": {"kind": "figure", "caption": "", "cell": 2}}}))
    notebook = new_notebook(cells=[
        new_markdown_cell("# Claim 2\n## A"),
        new_code_cell("a()", id="cell-a", execution_count=1, outputs=[_long_table(), _shown(png)]),
        new_markdown_cell("## B"),
        new_code_cell("b()", id="cell-b", execution_count=2, outputs=[_long_table()]),
    ])
    assert site.cell_files(notebook, folder) == {"cell-a": ["old_figure"]}
    page = _render(tmp_path, notebook)
    check_links(page, {"cell-a": ["old_figure"], "cell-b": []}, folder, files_known=False)
    assert 'alt="Figure old_figure under “A”' in page


def test_the_running_cell_is_read_from_ipython(monkeypatch):
    """Outside a kernel nothing is recorded as the cell; inside one, the source IPython is running and the cell id
    the front end sent with it."""
    assert verdicts._current_cell() == {}

    class Info:
        raw_cell, cell_id = "save_table(t, 'x', out, {})\n", "abc-123"

    class Shell:
        class displayhook:
            class exec_result:
                info = Info

    import IPython

    monkeypatch.setattr(IPython, "get_ipython", lambda: Shell)
    assert verdicts._current_cell() == {"cell_id": "abc-123",
                                        "cell_source": hashlib.sha256(Info.raw_cell.encode()).hexdigest()}


def test_a_finished_run_drops_the_outputs_of_an_earlier_run_that_it_did_not_write(tmp_path):
    """A notebook that leaves a table out this time (an empty one, say) must not keep the previous run's file listed as
    its own; a stopped run keeps the earlier entries whose files are still there."""
    folder = tmp_path / "01_dynamism"
    folder.mkdir()
    for stem in ("kept", "dropped"):
        for suffix in (".csv", ".md", ".config.json"):
            (folder / f"{stem}{suffix}").write_text("x")
        verdicts.record_output(folder, stem, "table", cell_source=verdicts.source_digest("a()"))
    (folder / "dropped_other.csv").write_text("another stem sharing a prefix")
    before = verdicts.begin_outputs(folder)
    assert set(before) == {"kept", "dropped"} and verdicts.recorded_outputs(folder) == {}
    verdicts.record_output(folder, "kept", "table", cell_source=verdicts.source_digest("b()"))
    assert verdicts.end_outputs(folder, before, finished=True) == ["dropped"]
    assert sorted(p.name for p in folder.iterdir()) == ["dropped_other.csv", "kept.config.json", "kept.csv", "kept.md",
                                                        verdicts.RECORDED]
    assert set(verdicts.recorded_outputs(folder)) == {"kept"}

    again = verdicts.begin_outputs(folder)  # stopped before writing anything: the earlier entries stay, files too
    assert verdicts.end_outputs(folder, again, finished=False) == []
    assert verdicts.recorded_outputs(folder) == again and (folder / "kept.csv").exists()
    # a file the run writes outside its record (notebooks list their HotpotQA questions so) is this run's, not stale:
    # a finished run that did not record "kept" again removes only its files from before the run started
    started = time.time()
    os.utime(folder / "kept.md", (started - 60, started - 60))
    os.utime(folder / "kept.config.json", (started - 60, started - 60))
    os.utime(folder / "kept.csv", (started + 1, started + 1))  # rewritten by this run
    third = verdicts.begin_outputs(folder)
    assert verdicts.end_outputs(folder, third, finished=True, since=started) == ["kept"]
    assert (folder / "kept.csv").exists() and not (folder / "kept.md").exists()
    assert not (folder / "kept.config.json").exists()
    assert verdicts.begin_outputs(tmp_path / "new") == {} and not (tmp_path / "new").exists()  # a first run
