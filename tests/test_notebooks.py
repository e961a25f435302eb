"""Notebooks: committed without outputs, in step with their jupytext sources, and they run."""
from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_output_free_and_parameterised(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code)
    tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged 'parameters'"
    # Every parameter line is a literal assignment with a comment.
    for line in tagged[0].source.splitlines():
        if line.strip():
            assert "=" in line and "#" in line, f"parameter line without comment: {line!r}"
            assert "(" not in line.split("#")[0], "use lists, not tuples or calls, for papermill"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_matches_its_jupytext_source(path):
    jupytext = pytest.importorskip("jupytext")
    source = path.with_suffix(".py")
    assert source.exists(), f"{source.name} (jupytext percent source) is missing"
    from_py = jupytext.read(source)
    from_nb = nbformat.read(path, as_version=4)
    assert [(c.cell_type, c.source) for c in from_py.cells] == [(c.cell_type, c.source) for c in from_nb.cells]


@pytest.mark.notebook
def test_dynamism_notebook_runs_with_tiny_parameters(tmp_path):
    import papermill

    out = tmp_path / "figs"
    papermill.execute_notebook(
        str(ROOT / "notebooks" / "01_dynamism.ipynb"), str(tmp_path / "executed.ipynb"),
        parameters=dict(n_calibration=2, n_analysis=2, context_tokens=300, max_new_tokens=12, n_hotpot=2,
                        seeds=[0, 1], output_dir=str(out), use_cache=False),
        cwd=str(ROOT), kernel_name="python3", progress_bar=False,
    )
    folder = out / "01_dynamism"
    for name in ("fig1_niah_heatmap", "fig5_hotpot_heatmap", "long_tail_niah", "long_tail_hotpot"):
        for ext in ("png", "pdf", "csv", "config.json"):
            assert (folder / f"{name}.{ext}").stat().st_size > 0
    for name in ("table1_niah", "table1_hotpot", "static_size_sweep", "seed_robustness_niah"):
        for ext in ("csv", "md", "config.json"):
            assert (folder / f"{name}.{ext}").exists()
    config = json.loads((folder / "table1_niah.config.json").read_text())
    assert config["n_analysis"] == 2 and config["seeds"] == [0, 1]
    for task in ("niah", "hotpot"):
        ours = pd.read_csv(folder / f"table1_{task}.csv").iloc[0]
        assert ours["model"] == "smollm2-135m-instruct"
        for column in ("jaccard_static", "jaccard_adjacent"):
            assert pd.isna(ours[column]) or 0.0 <= ours[column] <= 1.0
        assert ours["entropy"] >= 0.0
        assert 0 <= ours["ever_active"] <= ours["n_heads"] == 270
        assert 0 <= ours["heads_per_step_mean"] <= ours["n_heads"]
    paper = pd.read_csv(folder / "table1_niah.csv").iloc[1]
    assert "paper" in paper["model"] and paper["jaccard_static"] == 0.3512
    robust = pd.read_csv(folder / "seed_robustness_niah.csv")
    assert set(robust["n_seeds"]) == {2}
    sweep = pd.read_csv(folder / "static_size_sweep.csv")
    assert sweep["static_k"].tolist() == [20, 50, 100, 20, 50, 100]
