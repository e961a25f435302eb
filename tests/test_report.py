"""The batch runner, the index, and resume-after-kill."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from dynheads_tl import load_traces
from dynheads_tl.report.index import build_index
from dynheads_tl.report.items import index_items
from dynheads_tl.report.runner import list_notebooks, preset_notebooks, run_report
from conftest import build_tiny_model, run_script_here, start_script

ROOT = Path(__file__).resolve().parent.parent


def test_unknown_or_mistyped_parameters_fail_before_any_work(tmp_path):
    with pytest.raises(ValueError, match=r"parameter\(s\) \['n_analyssis'\]; the parameters are \[.*'n_analysis'"):
        run_report(only="01_dynamism", overrides={"n_analyssis": 3}, output_dir=tmp_path)
    with pytest.raises(ValueError, match=r"'n_analysis' should be an integer \(like 20\), got 'many'"):
        run_report(only="01_dynamism", overrides={"n_analysis": "many"}, output_dir=tmp_path)
    with pytest.raises(ValueError, match="Unknown preset"):
        run_report(preset="huge", output_dir=tmp_path)
    with pytest.raises(ValueError, match="No notebook matches"):
        list_notebooks("99_nothing")
    assert not (tmp_path / "executed").exists(), "validation happens before anything runs"


def test_a_focused_preset_runs_only_the_notebooks_that_declare_it(tmp_path):
    """`--preset long` runs what the committed long report holds (01, 03, 05, 06, 07), `--preset scale` 07 alone, and
    the whole-report presets every notebook; `--only` naming a notebook the preset leaves out is refused before
    anything runs (it used to run the default report's 02 and 04 at their defaults inside a long run)."""
    def stems(notebooks):
        return [nb.stem for nb in notebooks]

    every = stems(list_notebooks())
    long, left = preset_notebooks("long", list_notebooks())
    assert stems(long) == ["01_dynamism", "03_correlation", "05_error_signal", "06_kv_retention", "07_length_grid"]
    assert stems(left) == ["00_inspect_attention", "02_irreplaceability", "04_dynamic_rag"]
    scale = [stems(part) for part in preset_notebooks("scale", list_notebooks())]
    assert scale == [["07_length_grid"], [stem for stem in every if stem != "07_length_grid"]]
    for preset in ("default", "smoke", "paper", "thorough"):
        assert [stems(part) for part in preset_notebooks(preset, list_notebooks())] == [every, []], preset
    assert [stems(part) for part in preset_notebooks("long", list_notebooks("03"), named=True)] == [["03_correlation"], []]
    runs = "01_dynamism, 03_correlation, 05_error_signal, 06_kv_retention, 07_length_grid"
    with pytest.raises(ValueError, match=f"02_irreplaceability has no setting in the 'long' preset, which runs {runs};"):
        run_report(preset="long", only="02", output_dir=tmp_path)
    assert not (tmp_path / "executed").exists(), "refused before anything runs"


def test_cli_exits_non_zero_on_failure(tmp_path):
    result = subprocess.run([sys.executable, "-m", "dynheads_tl.report.cli", "report", "--only", "01_dynamism",
                             "-p", "n_analysis=-1", "-p", f"output_dir='{tmp_path}'"],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 1
    assert "Report failed" in result.stderr and "n_analysis" in result.stderr


def test_index_lists_every_item_and_only_what_exists(tmp_path):
    folder = tmp_path / "01_dynamism"
    folder.mkdir()
    (folder / "table1_niah.csv").write_text(
        "model,task,jaccard_static,jaccard_adjacent,entropy,heads_per_step_mean,heads_per_step_sd,ever_active,n_heads\n"
        "m,niah,0.25,0.5,3.1,4.5,2.0,40,270\n")
    (folder / "table1_niah.md").write_text("| x |\n")
    (tmp_path / "runs.json").write_text(json.dumps({"01_dynamism": {"model": "m", "preset": "smoke", "date": "2026-11-30",
                                                                    "minutes": 1.5, "parameters": {}}}))
    index = build_index(tmp_path).read_text()
    for _, item in index_items():
        assert f"| {item.item} |" in index
    table1 = next(line for line in index.splitlines() if line.startswith("| Table 1 |"))
    assert "Jaccard top-20 0.2500" in table1 and "40 of 270 ever active" in table1
    assert "Runs: m · preset smoke · 2026-11-30." in index  # model, preset and date once, above the table
    fig1 = next(line for line in index.splitlines() if line.startswith("| Fig 1 |"))
    assert "not produced" in fig1
    page = (tmp_path / "index.html").read_text()
    assert "<table>" in page and page.count("not produced") == len(index_items()) - 1
    assert '<a href="01_dynamism/table1_niah.csv">csv</a>' in page and str(tmp_path) not in index + page


RESUME_RUN = textwrap.dedent("""
    import time
    import dynheads_tl
    from dynheads_tl import corpus, TraceConfig
    from dynheads_tl.tasks import make_niah_samples


    def traced_run(folder, delay):
        \"\"\"Six NIAH samples traced on the tiny model in ``folder`` into $DYNHEADS_CACHE, with ``delay`` seconds of
        pause after each sample (the killed run is killed in one).\"\"\"
        real = corpus.trace_generation

        def slow(*args, **kwargs):
            trace = real(*args, **kwargs)
            time.sleep(delay)
            return trace

        corpus.trace_generation = slow
        try:
            model = dynheads_tl.load_model(str(folder), device="cpu")
            samples = make_niah_samples(model.tokenizer, n=6, context_tokens=60, seed=3, max_new_tokens=8)
            corpus.collect_traces(model, samples, TraceConfig(max_new_tokens=8), {"test": "resume"})
        finally:
            corpus.trace_generation = real
""")


def test_killed_run_resumes_without_recomputing_and_matches(tmp_path, monkeypatch):
    """A run killed between samples resumes (here, in the test's process) without tracing again the samples it had
    finished, and its traces equal an uninterrupted run's bit for bit."""
    folder = build_tiny_model("llama", tmp_path / "tiny")
    resumed, fresh = tmp_path / "resumed", tmp_path / "fresh"
    process = start_script(RESUME_RUN, "traced_run", resumed, folder, 1.0)
    traces_dir = resumed / "traces"
    deadline = time.time() + 120
    # Kill once two samples are complete (trace and sidecar written), i.e. inside the next sample's 1 s of work,
    # not in the middle of a write (a kill there leaves a stray .tmp, by design never under a final name).
    while time.time() < deadline and len(list(traces_dir.glob("*.json"))) < 2:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    finished = {p: p.stat().st_mtime_ns for p in traces_dir.glob("*.pt")}
    assert 2 <= len(finished) < 6, "killed midway"
    run_script_here(RESUME_RUN, "traced_run", resumed, monkeypatch, folder, 0.0)
    assert all(p.stat().st_mtime_ns == t for p, t in finished.items()), "finished samples were not recomputed"
    run_script_here(RESUME_RUN, "traced_run", fresh, monkeypatch, folder, 0.0)
    a = sorted(traces_dir.glob("*.pt"))
    b = sorted((fresh / "traces").glob("*.pt"))
    assert [p.name for p in a] == [p.name for p in b] and len(a) == 6
    for pa, pb in zip(a, b):
        [ta], [tb] = load_traces(pa), load_traces(pb)
        for name in ("tokens", "argmax_pos", "support_score", "hidden"):
            assert torch.equal(getattr(ta, name), getattr(tb, name))
    assert not list(traces_dir.glob("*.tmp*")), "no half-written file is left under a final name"


def test_the_index_links_each_models_head_score_files_with_their_provenance(tmp_path):
    """Issue #31: the report links the head-score files notebook 01 writes, per model, beside their provenance."""
    heads = tmp_path / "01_dynamism" / "head_scores"
    heads.mkdir(parents=True)
    (heads / "tiny_static_wu.json").write_text(json.dumps({"0-0": [0.5]}))
    (heads / "tiny_static_wu.provenance.json").write_text(json.dumps({"model": "tiny-model", "score": "Wu et al.",
                                                                      "n": 4, "n_kept": 3}))
    (heads / "other_dynamic_frequency.json").write_text(json.dumps({"0-0": [0.1]}))  # no provenance beside it
    index = build_index(tmp_path).read_text()
    assert "## Head-score files" in index
    assert ("| tiny-model | Wu et al. | 3 | [01_dynamism/head_scores/tiny_static_wu.json]"
            "(01_dynamism/head_scores/tiny_static_wu.json) | [provenance](01_dynamism/head_scores/"
            "tiny_static_wu.provenance.json) |") in index
    assert "other_dynamic_frequency.json) | – |" in index
    page = (tmp_path / "index.html").read_text()
    assert 'id="head-scores"' in page and 'href="01_dynamism/head_scores/tiny_static_wu.provenance.json"' in page
