"""The answer (report/answer.py): one table and one figure from every results file under a report, whatever the
number of models, with no sentence selected by its words."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dynheads_tl import verdicts
from dynheads_tl.report import answer

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "papers_figures"
SMOLLM2 = COMMITTED / "default" / "smollm2-135m-instruct"
GEMMA = COMMITTED / "default" / "gemma-3-270m"


def _copy_model(source: Path, target: Path, model: str, notebooks=("02_irreplaceability", "03_correlation")) -> None:
    runs = {}
    for notebook in notebooks:
        (target / notebook).mkdir(parents=True)
        data = json.loads((source / notebook / verdicts.FILE).read_text())
        data["model"] = model
        (target / notebook / verdicts.FILE).write_text(json.dumps(data))
        runs[notebook] = {"model": model, "preset": "default", "parameters": {}, "date": "2026-12-05", "minutes": 1}
    (target / "runs.json").write_text(json.dumps(runs))


def test_a_third_model_is_one_more_folder_and_one_more_column(tmp_path):
    """Adding a model to the report changes nothing in report/: the aggregator finds every model's folder, and the
    table and the figure gain a column and a row for it, read from its results file."""
    _copy_model(SMOLLM2, tmp_path / "default" / "model-a", "model-a")
    _copy_model(GEMMA, tmp_path / "default" / "model-b", "model-b")
    third = tmp_path / "default" / "model-c"
    _copy_model(GEMMA, third, "model-c", notebooks=("02_irreplaceability",))
    # the third model's claim 2 primary is made different, so its cell is read from its own file
    path = third / "02_irreplaceability" / verdicts.FILE
    data = json.loads(path.read_text())
    data["primary"]["observed"].update(estimate=0.5, interval={"low": 0.25, "high": 0.75, "level": 0.95})
    row = next(r for r in data["items"] if r["item"] == "Fig 2")
    row["primary"] = data["primary"]
    row["status"] = "reproduced"
    path.write_text(json.dumps(data))

    columns = answer.settings(tmp_path)
    assert [c.label for c in columns] == ["model-a · default", "model-b · default", "model-c · default"]
    rows = {r.item: r for r in answer.answer_rows(columns)}
    claim2 = rows["Fig 2"]
    assert claim2.cells[2].status == "reproduced" and (claim2.cells[2].estimate, claim2.cells[2].low) == (0.5, 0.25)
    assert claim2.cells[0].estimate == json.loads((SMOLLM2 / "02_irreplaceability" / verdicts.FILE).read_text())[
        "primary"]["observed"]["estimate"]
    assert rows["Table 2"].cells[2].status is None, "model-c did not run notebook 03: its cell says so"
    table = answer.answer_markdown(tmp_path, link_prefix="")
    assert "[model-c · default](default/model-c/index.html)" in table
    assert "**reproduced**; primary +0.500 [+0.250, +0.750], above 0" in table and "| – |" in table
    assert answer.answer_figure(tmp_path).stat().st_size > 10_000


def test_a_damaged_results_file_is_refused_not_shown_as_not_run(tmp_path):
    _copy_model(SMOLLM2, tmp_path / "default" / "model-a", "model-a", notebooks=("02_irreplaceability",))
    path = tmp_path / "default" / "model-a" / "02_irreplaceability" / verdicts.FILE
    data = json.loads(path.read_text())
    data["items"][0]["status"] = "fine"
    path.write_text(json.dumps(data))
    with pytest.raises(verdicts.ResultsError, match="items.0.status"):
        answer.settings(tmp_path)


def test_the_cell_states_the_primarys_own_side_of_zero():
    cell = answer.Cell("weaker", -0.015, -0.029, -0.002, 5, "splits")
    assert cell.text == "**weaker**; primary −0.015 [−0.029, −0.002], below 0"
    assert answer.Cell("undetermined", 0.01, -0.01, 0.03).side == "includes 0"
    assert answer.Cell(None).text == "–" and answer.Cell("descriptive").text == "**descriptive**"


def test_silent_rows_are_left_out_and_a_missing_results_file_is_not_a_column(tmp_path):
    _copy_model(SMOLLM2, tmp_path / "default" / "model-a", "model-a", notebooks=("01_dynamism",))
    rows = answer.answer_rows(answer.settings(tmp_path))
    assert [r.item for r in rows][0] == "Table 1"
    assert not any(r.item in ("Beyond 0", "Beyond 1", "Beyond 1b") for r in rows), "descriptive rows answer nothing"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert answer.settings(empty) == [] and answer.answer_figure(empty) is None


def test_the_readme_answer_block_is_refused_without_its_markers(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# x\n")
    with pytest.raises(ValueError, match="answer:start"):
        answer.update_answer(readme, tmp_path)
    readme.write_text(f"# x\n{answer.ANSWER_START}\nold\n{answer.ANSWER_END}\nrest\n")
    _copy_model(SMOLLM2, tmp_path / "report" / "default" / "model-a", "model-a")
    assert answer.update_answer(readme, tmp_path / "report", link_prefix="report/")
    text = readme.read_text()
    assert "old" not in text and text.endswith("rest\n") and "[model-a · default](report/default/model-a/index.html)" in text
    assert not answer.update_answer(readme, tmp_path / "report", link_prefix="report/"), "a second pass changes nothing"
