"""The runner's promises: outputs go where asked, a failed run never replaces a finished one, every value is
checked before the first notebook starts, notebooks ship with the package, and the CLI explains itself."""
from __future__ import annotations

import ast
import dataclasses
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

from dynheads_tl.report import cli
from dynheads_tl.report import runner as report
from dynheads_tl import claims
from dynheads_tl.params import field_default
from dynheads_tl.claim import Claim
from dynheads_tl.report.runner import (config_class, default_output_dir, list_notebooks, notebook_parameters,
                                       preset_names, run_report)

STEMS = [claim.notebook for claim in claims.all_claims()]

ROOT = Path(__file__).resolve().parent.parent
SMOLLM2 = "smollm2-135m-instruct"  # the folder a run of the default model gets: runs/<preset>/<model>/


def test_every_claim_folder_is_found_without_a_list_and_ordered_by_notebook():
    folders = {p.parent.name for p in (ROOT / "dynheads_tl" / "claims").glob("*/__init__.py")}
    assert {package.rsplit(".", 1)[1] for package in claims.claim_packages()} == folders
    assert STEMS == sorted(STEMS) and len(STEMS) == len(folders)
    assert [path.stem for path in list_notebooks()] == STEMS


def test_a_run_that_names_no_folder_writes_a_git_ignored_one_per_preset_and_model():
    """Only `--committed` writes papers_figures/ (test_the_committed_plan_...); every other run writes
    runs/<preset>/<model>/, the committed report's layout: no model is the folder's root."""
    smollm2 = "smollm2-135m-instruct"
    assert default_output_dir("default") == Path("runs/default") / smollm2, "the preset's own model, named"
    assert default_output_dir("smoke") == Path("runs/smoke") / smollm2 == default_output_dir("smoke", smollm2)
    assert default_output_dir("smoke", "gemma-3-270m") == Path("runs/smoke/gemma-3-270m")
    # the paper preset runs Llama-3.1-8B on every notebook but 00: its folder is named after the model most run
    assert default_output_dir("paper") == Path("runs/paper/meta-llama--Llama-3.1-8B-Instruct")
    assert default_output_dir("paper", smollm2) == Path("runs/paper") / smollm2
    assert report.output_dir_for("default", None, {}) == Path("runs/default") / smollm2
    assert report.output_dir_for("default", "gemma-3-270m", {}) == Path("runs/default/gemma-3-270m")
    assert report.output_dir_for("default", None, {"model": "google/gemma-3-270m", "n_analysis": 4}) == \
        Path("runs/default/google--gemma-3-270m"), "-p model= is --model"
    assert report.output_dir_for("default", None, {"backend": "ray", "n_analysis": 4}) == Path("runs/default") / smollm2
    with pytest.raises(ValueError, match="also a preset's name"):
        report.run_folder_name("long")
    assert report.run_folder_name("/data/models/my-model") == "my-model", "a local folder: its own name"
    with pytest.raises(ValueError, match="--output-dir"):
        report.run_folder_name("my model")
    assert "/runs/" in (ROOT / ".gitignore").read_text().split()


def test_only_needs_an_exact_name_or_an_unambiguous_prefix():
    assert [nb.stem for nb in list_notebooks("01_dynamism")] == ["01_dynamism"]
    assert [nb.stem for nb in list_notebooks("01")] == ["01_dynamism"]
    assert [nb.stem for nb in list_notebooks("02_irreplaceability.ipynb")] == ["02_irreplaceability"]
    with pytest.raises(ValueError, match=rf"'0' matches {len(STEMS)} notebooks .* give an exact name or a longer prefix"):
        list_notebooks("0")
    with pytest.raises(ValueError, match="No notebook matches '99'"):
        list_notebooks("99")


@pytest.mark.parametrize("stem", STEMS)
def test_each_notebook_declares_exactly_its_config_fields_with_the_same_defaults(stem):
    declared = {name: ast.literal_eval(text) for name, text in notebook_parameters(
        report.notebook_dir() / f"{stem}.ipynb").items()}
    config = config_class(stem)
    defaults = {f.name: field_default(f) for f in dataclasses.fields(config)}
    assert declared == defaults


def test_every_notebook_has_a_declared_claim_and_presets_name_real_parameters():
    stems = [nb.stem for nb in list_notebooks()]
    assert stems == STEMS, "one claim per notebook, in notebook order"
    assert set(preset_names()) >= {"default", "smoke", "paper"}
    for claim in claims.all_claims():
        assert claim.name == claim.notebook.partition("_")[2]
        assert claim.config.__module__.startswith(f"dynheads_tl.claims.{claim.name}."), "the claim's folder holds its config"
        for preset, parameters in claim.presets.items():
            fields = {f.name for f in dataclasses.fields(claim.config)}
            assert set(parameters) <= fields, (claim.notebook, preset, set(parameters) - fields)


def test_seed_offsets_are_declared_once_and_never_shared():
    """Each claim declares the seed offsets of its own splits (``CLAIM.seeds``); the shared ones are the corpus's.
    No two splits may draw the same seeds."""
    from dynheads_tl.corpus import SEED_OFFSETS

    declared = [("corpus", name, value) for name, value in SEED_OFFSETS.items()]
    declared += [(claim.notebook, name, value) for claim in claims.all_claims() for name, value in claim.seeds.items()]
    names = [name for _, name, _ in declared]
    values = [value for _, _, value in declared]
    assert len(set(names)) == len(names) and len(set(values)) == len(values), declared


def test_impossible_values_and_missing_files_fail_before_any_notebook_starts(tmp_path):
    with pytest.raises(ValueError, match="01_dynamism: Parameter 'n_analysis' must be a positive integer"):
        run_report(only="01_dynamism", overrides={"n_analysis": -3}, output_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="01_dynamism: .*missing.json"):
        run_report(only="01_dynamism", overrides={"hotpot_source": str(tmp_path / "missing.json")},
                   output_dir=tmp_path)
    with pytest.raises(ValueError, match="02_irreplaceability: .*niah_contexts.*8,192"):
        run_report(only="02", overrides={"niah_contexts": [100000]}, output_dir=tmp_path)
    assert not (tmp_path / "executed").exists(), "nothing ran"


def test_output_dir_given_twice_must_agree(tmp_path):
    with pytest.raises(ValueError, match="output_dir is given twice"):
        run_report(only="01", overrides={"output_dir": str(tmp_path / "a")}, output_dir=tmp_path / "b")


# --- a run, with a tiny notebook instead of the real ones ----------------------------------------
def _tiny_notebook(folder: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("fail = False  # raise in the next cell\nvalue = 1  # written out\n"
                                  "output_dir = 'papers_figures'  # where outputs go",
                                  metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell("import pathlib\nout = pathlib.Path(output_dir) / '01_tiny'\n"
                                  "out.mkdir(parents=True, exist_ok=True)\n(out / 'value.txt').write_text(str(value))\n"
                                  "if fail:\n    raise RuntimeError('the tiny notebook failed on purpose')\nprint(value)"),
        nbformat.v4.new_markdown_cell("## The tiny figure"),
        # A figure written as every notebook writes one: the writer records it in the folder's verdicts.json.
        nbformat.v4.new_code_cell("import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
                                  "import pandas as pd\nfrom IPython.display import Image, display\n"
                                  "from dynheads_tl.report.figures import save_figure\n"
                                  "fig, ax = plt.subplots(figsize=(2, 2))\nax.bar([0], [value])\n"
                                  "ax.set_title('The tiny value')\n"
                                  "display(Image(filename=str(save_figure(fig, 'tiny_value', out, "
                                  "pd.DataFrame({'value': [value]}), {'value': value}))))"),
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "01_tiny.ipynb"
    nbformat.write(nb, path)
    return path


# A throwaway claim: a folder exporting CLAIM, found by the same discovery as claims/<name>/.
TINY_CLAIM = '''
from dataclasses import dataclass
from pathlib import Path

from dynheads_tl.claim import Claim, Finding, PaperItem, Status
from dynheads_tl.config import NotebookConfig


@dataclass
class TinyConfig(NotebookConfig):
    fail: bool = False
    value: int = 1
    output_dir: str = "papers_figures"

    def __post_init__(self):
        if self.value < 0:
            raise ValueError(f"Parameter 'value' must be >= 0, got {self.value!r}.")


def headline(folder: Path) -> str:
    return f"value {(folder / 'value.txt').read_text()}"


def status(folder: Path) -> Status:
    """Supported when the value written is above 5."""
    value = int((folder / "value.txt").read_text())
    return Status("supported" if value > 5 else "not supported", f"value {value}; n = 1")


def verdict(folder: Path) -> list[str]:
    value = int((folder / "value.txt").read_text())
    return [f"The tiny value is {value}, so the tiny hypothesis is {'supported' if value > 5 else 'not supported'}."]


CLAIM = Claim(notebook="01_tiny", config=TinyConfig, title="Tiny claim", presets={"smoke": {"value": 3}},
              items=(PaperItem("Beyond 9", "a tiny measurement", "not in the paper", "tiny_value", 99, headline,
                               status),),
              findings=(Finding("Tiny finding", verdict, "The tiny figure"),), seeds={"tiny": 987_654})
'''


def install_tiny_suite(tmp_path, monkeypatch, write_notebook=None) -> Path:
    """The tiny claim and its notebook (``write_notebook(folder)``; default :func:`_tiny_notebook`) in place of the
    suite's, under ``tmp_path``; returns the working folder a run starts in. The caller pops the claim's module
    from ``sys.modules`` afterwards (the next test imports its own folder's copy)."""
    notebooks = tmp_path / "notebooks"
    (write_notebook or _tiny_notebook)(notebooks)
    # The claim's folder is found the way claims/<name>/ folders are (claims.claim_packages walks the package's
    # path), here with the path pointed at a temporary folder that holds only it: nothing registers it.
    claims_path = tmp_path / "claims"
    (claims_path / "tinyclaim").mkdir(parents=True)
    (claims_path / "tinyclaim" / "__init__.py").write_text(TINY_CLAIM)
    monkeypatch.setattr(claims, "__path__", [str(claims_path)])
    monkeypatch.setattr(report, "notebook_dir", lambda: notebooks)
    work = tmp_path / "work"
    work.mkdir()
    return work


@pytest.fixture
def tiny_suite(tmp_path, monkeypatch):
    yield install_tiny_suite(tmp_path, monkeypatch)
    sys.modules.pop("dynheads_tl.claims.tinyclaim", None)  # the next test imports its own folder's copy


def test_a_claim_declaration_is_checked_when_it_is_made(tiny_suite):
    from dynheads_tl.claims.tinyclaim import TinyConfig

    from dynheads_tl.claim import Claim

    with pytest.raises(ValueError, match="stem is NN_name"):
        Claim(notebook="tiny", config=TinyConfig)
    with pytest.raises(ValueError, match=r"preset 'smoke' sets \['nope'\], which TinyConfig does not have"):
        Claim(notebook="01_tiny", config=TinyConfig, presets={"smoke": {"nope": 1}})
    with pytest.raises(ValueError, match="default preset is the config's own defaults"):
        Claim(notebook="01_tiny", config=TinyConfig, presets={"default": {"value": 2}})


def test_a_new_claim_is_one_folder_and_the_report_reads_it(tiny_suite):
    """A throwaway claim in a temporary package, with a figure and a verdict, is validated, run, indexed, given a
    status and quoted through its declaration and its notebook alone: no table in the report layer names it, and
    its verdict reaches the results file, the README's findings, the index and the site."""
    from dynheads_tl.report.findings import findings_markdown

    work = tiny_suite
    with pytest.raises(ValueError, match="01_tiny: Parameter 'value' must be >= 0"):
        run_report(only="01_tiny", overrides={"value": -1}, cwd=work, show_cells=False)
    run_report(only="01_tiny", preset="smoke", cwd=work, show_cells=False)
    out = work / "runs" / "smoke" / SMOLLM2
    assert (out / "01_tiny" / "value.txt").read_text() == "3", "the claim's smoke preset was applied"
    sentence = "The tiny value is 3, so the tiny hypothesis is not supported."
    results = json.loads((out / "01_tiny" / "verdicts.json").read_text())
    assert results["findings"] == [{"label": "Tiny finding", "section": "The tiny figure", "sentences": [sentence]}]
    assert results["items"][0]["status"] == "not supported"
    assert results["items"][0]["rule_id"] == "claims.tiny.items.Beyond 9"
    assert results["items"][0]["declared_rule"] is None, "the pre-registration file declares no rule for it"
    run = json.loads((out / "runs.json").read_text())["01_tiny"]
    assert (results["preset"], results["model"], results["run"]["date"]) == (run["preset"], run["model"], run["date"])
    assert results["primary"] is None, "a claim the pre-registration file does not declare states no primary"
    figure = next(entry for entry in results["outputs"] if entry["stem"] == "tiny_value")
    assert figure["kind"] == "figure" and figure["caption"] == "The tiny value" and len(figure["cell_source"]) == 64
    index = (out / "README.md").read_text()
    row = next(line for line in index.splitlines() if line.startswith("| Beyond 9 |"))
    assert "a tiny measurement" in row and "value 3" in row and "not supported" in row
    readme = findings_markdown(work / "runs", "runs/")  # runs/ is laid out as the committed report
    assert (f"- **Tiny finding** ([notebook 01](runs/smoke/{SMOLLM2}/executed/01_tiny.html#The-tiny-figure)): "
            f"{sentence}" in readme.splitlines())
    assert "Beyond 9 not supported" in readme and readme == findings_markdown(out.parent.parent, "runs/")
    assert f"[notebook 01](executed/01_tiny.html#The-tiny-figure)): {sentence}" in findings_markdown(out, "")
    page = (out / "executed" / "01_tiny.html").read_text()
    assert "01 · Tiny claim" in page, "the site titles the page from the claim"
    assert sentence in page and 'id="results"' in page, "the page shows the claim's results"
    assert 'alt="Figure tiny_value (The tiny value) under “The tiny figure”; the numbers it plots are in ' \
           'tiny_value.csv."' in page
    assert "#The-tiny-figure" in (out / "index.html").read_text(), "the index row links the section that makes it"
    # smoke-size statuses are marked as no evidence, above the table of the index (README and HTML)
    assert index.index("Smoke-size runs (every notebook)") < index.index("| Beyond 9 |")
    assert "are not evidence for or against any claim" in (out / "index.html").read_text()
    run_report(only="01_tiny", overrides={"value": 7}, cwd=work, show_cells=False)
    index = (work / "runs" / "default" / SMOLLM2 / "README.md").read_text()
    assert "| supported |" in next(line for line in index.splitlines() if line.startswith("| Beyond 9 |"))
    assert "Smoke-size" not in index + (work / "runs" / "default" / SMOLLM2 / "index.html").read_text()


def test_a_failed_run_keeps_the_finished_notebook_and_records_relative_paths(tiny_suite):
    work = tiny_suite
    run_report(only="01_tiny", overrides={"value": 7}, cwd=work, show_cells=False)
    out = work / "runs" / "default" / SMOLLM2  # an override: not the committed report
    assert not (work / "papers_figures").exists()
    executed = out / "executed" / "01_tiny.ipynb"
    finished = executed.read_bytes()
    nb = nbformat.reads(finished.decode(), as_version=4)
    assert nb.metadata.papermill.parameters == {"value": 7, "output_dir": "runs/default/smollm2-135m-instruct"}
    assert nb.metadata.papermill.input_path.endswith("notebooks/01_tiny.ipynb")
    assert nb.metadata.papermill.output_path == "runs/default/smollm2-135m-instruct/executed/01_tiny.ipynb"
    assert str(work) not in finished.decode(), "no absolute path of this machine in the executed notebook"
    assert (out / "01_tiny" / "value.txt").read_text() == "7"
    assert (out / "executed" / "01_tiny.html").exists()
    runs = json.loads((out / "runs.json").read_text())
    assert runs["01_tiny"]["parameters"] == {"value": 7} and runs["01_tiny"]["preset"] == "default"
    assert (out / "index.html").exists()

    import papermill

    with pytest.raises(papermill.PapermillExecutionError, match="failed on purpose"):
        run_report(only="01_tiny", overrides={"value": 8, "fail": True}, cwd=work, show_cells=False)
    assert executed.read_bytes() == finished, "a failed run never replaces a finished executed notebook"
    failed = out / "executed" / "01_tiny.failed.ipynb"
    assert nbformat.read(failed, as_version=4).metadata.papermill.exception is True
    assert json.loads((out / "runs.json").read_text()) == runs, "only finished runs are recorded"
    assert not list((out / "executed").glob(".*partial*"))


def test_a_partial_default_run_writes_runs_and_output_dir_sends_it_elsewhere(tiny_suite, tmp_path):
    """`dynheads report --only 02` with no preset writes runs/default/ (git-ignored), not the committed report."""
    work = tiny_suite
    run_report(only="01_tiny", cwd=work, show_cells=False)
    assert (work / "runs" / "default" / SMOLLM2 / "executed" / "01_tiny.ipynb").exists()
    assert not (work / "papers_figures").exists()
    elsewhere = tmp_path / "elsewhere"
    run_report(only="01_tiny", preset="smoke", output_dir=elsewhere, cwd=work, show_cells=False)
    assert (elsewhere / "executed" / "01_tiny.ipynb").exists() and (elsewhere / "01_tiny" / "value.txt").exists()
    assert not (work / "runs" / "smoke").exists()
    # the committed report is written by naming it, as --committed's plan does
    run_report(only="01_tiny", output_dir="papers_figures", cwd=work, show_cells=False)
    assert (work / "papers_figures" / "executed" / "01_tiny.ipynb").exists()


@pytest.fixture
def model_suite(tiny_suite):
    """The tiny claim with a model parameter, as every real notebook has (the tiny notebook loads none)."""
    notebook = tiny_suite.parent / "notebooks" / "01_tiny.ipynb"
    nb = nbformat.read(notebook, as_version=4)
    nb.cells[0].source += "\nmodel = 'smollm2-135m-instruct'  # the model"
    nbformat.write(nb, notebook)
    claim = tiny_suite.parent / "claims" / "tinyclaim" / "__init__.py"
    claim.write_text(claim.read_text().replace("    value: int = 1\n",
                                               "    value: int = 1\n    model: str = 'smollm2-135m-instruct'\n"))
    return tiny_suite


def test_a_second_models_run_gets_its_own_folder_and_never_replaces_the_firsts(model_suite, capsys):
    """`--preset smoke --model M` writes runs/smoke/M/ beside the preset's own run, which it leaves as it was (the
    preset's index, runs/smoke/, lists both);
    a folder named with --output-dir that holds another model's runs is refused before anything runs (runs.json
    records each notebook's model), and so is a folder an earlier version filled with two models."""
    work = model_suite
    run_report(only="01_tiny", preset="smoke", cwd=work, show_cells=False)
    first = work / "runs" / "smoke" / SMOLLM2
    before = {p: p.read_bytes() for p in first.rglob("*") if p.is_file() and not p.name.endswith(".lock")}
    other = str(work / "other-model")  # a local model folder (never loaded: the tiny notebook takes any name)
    (work / "other-model").mkdir()
    run_report(only="01_tiny", preset="smoke", model=other, cwd=work, show_cells=False)
    second = first.parent / "other-model"
    assert json.loads((second / "runs.json").read_text())["01_tiny"]["model"] == other
    assert (second / "executed" / "01_tiny.html").exists() and (second / "index.html").exists()
    listing = (first.parent / "README.md").read_text()
    assert f"[{other}](other-model/README.md)" in listing and f"[{SMOLLM2}]({SMOLLM2}/README.md)" in listing
    assert 'href="smoke/index.html"' in (work / "runs" / "index.html").read_text(), "the top index lists the preset"
    after = {p: p.read_bytes() for p in first.rglob("*") if p.is_file() and not p.name.endswith(".lock")
             and second not in p.parents}
    assert after.keys() == before.keys(), sorted(str(p) for p in after.keys() ^ before.keys())
    changed = [p for p in before if before[p] != after[p] and p.name not in ("index.html", "README.md")]
    assert changed == [], "the first model's run is left as it was"
    assert json.loads((first / "runs.json").read_text())["01_tiny"]["model"] == "smollm2-135m-instruct"
    capsys.readouterr()
    for asked in ({"output_dir": first, "model": other}, {"output_dir": second}):
        with pytest.raises(ValueError, match=r"holds runs of another model \(01_tiny on .*\); this run is of .*"
                                             r"Nothing was run; name another folder with --output-dir"):
            run_report(only="01_tiny", preset="smoke", cwd=work, show_cells=False, **asked)
    assert json.loads((second / "runs.json").read_text())["01_tiny"]["model"] == other
    assert "[1/1]" not in capsys.readouterr().out, "refused before any notebook started"
    # a runs/<preset>/ folder an earlier version filled with another model's run is refused too, with its remedy
    runs = json.loads((first / "runs.json").read_text())
    (first / "runs.json").write_text(json.dumps({k: {**v, "model": "gemma-3-270m"} for k, v in runs.items()}))
    with pytest.raises(ValueError, match="move that folder away"):
        run_report(only="01_tiny", preset="smoke", cwd=work, show_cells=False)


def test_make_report_passes_model_and_out_on_and_report_all_runs_committed():
    """`make report` runs the default model's default report into runs/default/ (the first command a newcomer runs
    finishes within the hour); `make report PRESET=smoke MODEL=gemma-3-270m` runs Gemma (--model), not SmolLM2; MODEL
    and OUT are documented beside PRESET in the Makefile and the README; `make report-all` alone regenerates the
    committed report."""
    import shutil

    if shutil.which("make") is None:
        pytest.skip("make is not installed")

    def command(*args: str) -> str:
        # -o: the set-up target counts as done, so only the report's command line is printed (nothing runs)
        target = "report-all" if args == ("all",) else "report"
        args = () if args == ("all",) else args
        out = subprocess.run(["make", "-s", "-n", "-o", ".venv/.installed", target, *args], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.strip().splitlines()
        return out[-1].split("dynheads ", 1)[1]

    assert command() == "report --preset default", "make report runs the default model's default report"
    assert command("PRESET=default") == "report --preset default"
    assert command("PRESET=smoke") == "report --preset smoke"
    assert command("PRESET=smoke", "MODEL=gemma-3-270m") == "report --preset smoke --model gemma-3-270m"
    assert command("MODEL=gemma-3-270m") == "report --preset default --model gemma-3-270m"
    assert command("OUT=/tmp/x") == "report --preset default --output-dir /tmp/x"
    assert command("all") == "report --committed", "make report-all regenerates the committed report"
    makefile, readme = (ROOT / "Makefile").read_text(), (ROOT / "README.md").read_text()
    assert "MODEL  ?=" in makefile and "MODEL=NAME" in makefile
    assert "make report PRESET=smoke MODEL=gemma-3-270m" in readme and "`OUT=DIR`" in readme


def test_notebooks_run_on_a_local_socket_without_the_plain_text_warning(tiny_suite, capfd, monkeypatch):
    """The runner starts kernels on IPC: over TCP, ipykernel 7 warns in every run's log that the traffic is not
    encrypted. The same run on jupyter_client's TCP default prints that warning, so the check can fail."""
    from jupyter_client.manager import AsyncKernelManager

    work = tiny_suite
    assert report.ipc_kernel_manager()().transport == "ipc"
    run_report(only="01_tiny", cwd=work, show_cells=False)
    assert "without encryption" not in capfd.readouterr().err
    monkeypatch.setattr(report, "ipc_kernel_manager", lambda stderr=None: AsyncKernelManager)
    run_report(only="01_tiny", cwd=work, show_cells=False)
    assert "without encryption" in capfd.readouterr().err, "the TCP default no longer warns: this test checks nothing"


def test_eta_uses_only_the_last_run_of_the_same_preset_and_cache_state():
    cold = {"preset": "default", "model": "m", "minutes": 10.0, "computed": True, "cache_entries": 100}
    warm = {"preset": "smoke", "model": "m", "minutes": 1.0, "computed": False, "cache_entries": 40}
    runs = {"01_a": cold, "02_b": warm}
    assert report._eta(runs, ["01_a", "02_b"], "smoke", "m", 100) == ""
    assert "about 1 min left by the last smoke run" in report._eta(runs, ["02_b"], "smoke", "m", 100)
    assert report._eta(runs, ["01_a"], "default", "other-model", 0) == ""
    # the cold run's minutes predict a run on an emptied cache, not a rerun that finds what it computed
    assert "about 10 min left" in report._eta(runs, ["01_a"], "default", "m", 0)
    assert report._eta(runs, ["01_a"], "default", "m", 100) == ""
    # and the warm run's minutes predict only a run that still finds its entries
    assert report._eta(runs, ["02_b"], "smoke", "m", 10) == ""
    assert report._eta({"02_b": {**warm, "computed": None}}, ["02_b"], "smoke", "m", 100) == "", \
        "a record that does not say whether it computed predicts nothing"


# --- the command line -----------------------------------------------------------------------------
def test_help_documents_every_option_and_where_outputs_go(capsys):
    with pytest.raises(SystemExit):
        cli.main(["report", "--help"])
    text = capsys.readouterr().out
    for option in ("--preset", "--model", "--only", "--output-dir", "--param"):
        assert option in text
    assert "papers_figures/" in text and "runs/<preset>/" in text
    for snippet in ("parameter set:", "model for every notebook", "run one notebook", "where outputs go",
                    "notebook parameter override"):
        assert snippet in text, f"an option lacks its help text: {snippet!r}"


def test_help_lists_the_notebooks_and_every_parameter_from_the_claims(capsys):
    """--help names every notebook --only can take and every parameter -p can set, read from the claims' config
    classes (where they are declared), each parameter under the notebooks that have it."""
    with pytest.raises(SystemExit):
        cli.main(["report", "--help"])
    text = capsys.readouterr().out
    listing = text[text.index("notebooks (--only"):]
    words = set(listing.replace(",", " ").replace(":", " ").split())
    for claim in claims.all_claims():
        assert claim.notebook in words
        missing = {f.name for f in dataclasses.fields(claim.config)} - words
        assert not missing, f"{claim.notebook}'s parameters {sorted(missing)} are not in --help"
    parameters = listing[listing.index("parameters (-p"):]
    own = parameters[parameters.index("01_dynamism:"):parameters.index("02_irreplaceability:")]
    assert "static_k" in own and "every notebook:" in parameters


def test_help_with_only_lists_that_notebooks_parameters_with_default_and_help(capsys):
    """`report --only NAME --help` prints the notebook's parameters cell as the config renders it: every field, its
    default and its help (with the note the claim's config adds, e.g. notebook 03's reuse of notebook 01's traces)."""
    with pytest.raises(SystemExit):
        cli.main(["report", "--only", "03", "--help"])
    text = capsys.readouterr().out
    listing = text[text.index("parameters of 03_correlation"):]
    config = claims.claim_for("03_correlation").config
    for f in dataclasses.fields(config):
        assert f"  {f.name} = " in listing, f.name
    assert 'n_calibration = 10  # NIAH samples used to find the static heads (Wu et al. score); as in notebook 01' in listing
    with pytest.raises(SystemExit):
        cli.main(["report", "--help"])
    assert "add --only NAME to --help" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # a name that matches no notebook: its sentence, then the names
        cli.main(["report", "--only", "99", "--help"])
    assert "No notebook matches '99'" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # the last --only counts, as for the run itself
        cli.main(["report", "--only", "01", "--only", "07", "--help"])
    assert "parameters of 07_length_grid" in capsys.readouterr().out


def test_parameters_command_prints_and_refuses_an_unknown_notebook(capsys):
    assert cli.main(["parameters", "--only", "07"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("parameters of 07_length_grid") and "lengths = [1000, 2000]  # context tokens" in out
    assert cli.main(["parameters", "--only", "99"]) == 2
    assert "No notebook matches '99'" in capsys.readouterr().err


def test_ctrl_c_ends_with_one_line_that_says_how_to_resume(monkeypatch, capsys):
    def interrupted(**kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "run_report", interrupted)
    assert cli.main(["report", "--only", "01"]) == 130
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "run the same command again to resume" in err
    assert "Traceback" not in err


def test_a_non_editable_install_ships_the_notebooks(tmp_path):
    import shutil

    source = tmp_path / "src"  # built from a copy: setuptools writes build/ and egg-info beside the sources
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        source.mkdir(exist_ok=True)
        shutil.copy(ROOT / name, source / name)
    for folder in ("dynheads_tl", "notebooks"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    # -v: setuptools' deprecation boxes (the `project.license` table form) show only in a verbose build
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(tmp_path), str(source)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "SetuptoolsDeprecationWarning" not in result.stdout + result.stderr, "setuptools warns about the build files"
    [wheel] = tmp_path.glob("dynheads_tl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names), "the licence file ships"
    for notebook in list_notebooks():
        assert f"dynheads_tl/notebooks/{notebook.name}" in names
    packages = {str(p.parent.relative_to(ROOT)).replace("/", ".") for p in (ROOT / "dynheads_tl").rglob("__init__.py")}
    assert all(f"{package.replace('.', '/')}/__init__.py" in names for package in packages), \
        "every subpackage ships in the wheel (setup.py finds them)"


def test_the_committed_plan_runs_every_model_then_each_committed_preset_into_its_folder():
    """One layout for every model: each run names its model and lands in papers_figures/<preset>/<model>/; no run
    writes the report's root."""
    from dynheads_tl.report.committed import PlannedRun, committed_plan

    plan = committed_plan(["smollm2-135m-instruct", "gemma-3-270m"])
    assert plan[:2] == [PlannedRun("default", SMOLLM2, None, Path("papers_figures/default") / SMOLLM2),
                        PlannedRun("default", "gemma-3-270m", None, Path("papers_figures/default/gemma-3-270m"))]
    assert PlannedRun("long", SMOLLM2, "07_length_grid", Path("papers_figures/long") / SMOLLM2) in plan
    assert PlannedRun("long", "gemma-3-270m", "07_length_grid", Path("papers_figures/long/gemma-3-270m")) in plan
    # every run of the plan names its model and folder: a run that names none never writes the committed report
    assert all(planned.output_dir.parts[:-1] == ("papers_figures", planned.preset) for planned in plan)
    assert all(planned.output_dir.name == planned.model for planned in plan)
    committed = {(claim.notebook, preset) for claim in claims.all_claims() for preset in claim.committed}
    assert len(plan) == 2 + 2 * len(committed) and ("07_length_grid", "long") in committed
    # every embedded model by default, in their declared order, each only in the presets it declares: the 1.5B in
    # the size axis's only
    everything = committed_plan()
    assert [p.model for p in everything if p.preset == "default"] == [SMOLLM2, "gemma-3-270m",
                                                                       "qwen2.5-coder-0.5b-instruct"]
    assert ("07_length_grid", "scale") in committed
    assert [(p.preset, p.only) for p in everything if p.model == "qwen2.5-coder-1.5b-instruct"] == [
        ("scale", "07_length_grid")]
    assert PlannedRun("scale", "qwen2.5-coder-1.5b-instruct", "07_length_grid",
                      Path("papers_figures/scale/qwen2.5-coder-1.5b-instruct")) in everything
    assert len(everything) == 3 + 3 * len(committed) + 1


def test_run_committed_report_runs_the_plan_then_refreshes_the_top_index_and_the_readme(tmp_path, monkeypatch, capsys):
    from dynheads_tl.report import committed
    from dynheads_tl.report.answer import ANSWER_END, ANSWER_START

    calls, rendered, updated = [], [], []
    monkeypatch.setattr(committed, "run_report", lambda **kw: calls.append(kw) or [])
    monkeypatch.setattr(committed, "render_report", lambda folder: rendered.append(folder))
    monkeypatch.setattr(committed, "update_readme", lambda path, folder, link_prefix: updated.append((path, link_prefix)))
    (tmp_path / "README.md").write_text(f"# x\n{ANSWER_START}\n{ANSWER_END}\n")
    committed.run_committed_report(models=["smollm2-135m-instruct", "gemma-3-270m"], overrides={"backend": "ray"},
                                cwd=tmp_path)
    assert [(c["preset"], c["model"], c["only"], c["output_dir"]) for c in calls] == [
        (p.preset, p.model, p.only, p.output_dir) for p in committed.committed_plan(["smollm2-135m-instruct", "gemma-3-270m"])]
    assert all(c["overrides"] == {"backend": "ray"} and c["cwd"] == tmp_path.resolve() for c in calls)
    assert rendered == [tmp_path.resolve() / "papers_figures"]
    assert updated == [(tmp_path.resolve() / "README.md", "papers_figures/")]
    assert "committed report, run 1/" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"\['n_analysis'\] would change what it says"):
        committed.run_committed_report(overrides={"n_analysis": 4}, cwd=tmp_path)
    calls.clear()
    updated.clear()
    (tmp_path / "README.md").write_text(f"# x\n{ANSWER_START}\n")  # no end marker: the README is left alone
    committed.run_committed_report(models=["smollm2-135m-instruct"], cwd=tmp_path)
    assert calls and updated == []


def test_the_committed_report_checks_every_model_is_installed_before_any_run(tmp_path, monkeypatch):
    from dynheads_tl.report import committed

    calls = []
    monkeypatch.setattr(committed, "run_report", lambda **kw: calls.append(kw) or [])
    monkeypatch.setattr(committed, "embedded_installed", lambda name: not name.startswith("qwen"))
    with pytest.raises(ModuleNotFoundError, match=r"dynheads install-model --name qwen2\.5-coder-0\.5b-instruct"):
        committed.run_committed_report(cwd=tmp_path)
    assert calls == [], "nothing ran before the check"


def test_the_committed_flag_refuses_what_would_change_the_report(capsys):
    assert cli.main(["report", "--committed", "--model", "gemma-3-270m"]) == 2
    assert "takes no --model" in capsys.readouterr().err


def test_a_committed_preset_must_be_one_of_the_claims_own():
    config = config_class("07_length_grid")
    with pytest.raises(ValueError, match="a committed preset is one of the claim's own presets"):
        Claim(notebook="09_x", config=config, presets={"long": {}}, committed=("huge",))
    with pytest.raises(ValueError, match="not default or smoke"):
        Claim(notebook="09_x", config=config, presets={"smoke": {}}, committed=("smoke",))
    with pytest.raises(ValueError, match="must leave the model to the run"):
        Claim(notebook="09_x", config=config, presets={"big": {"model": "gemma-3-270m"}}, committed=("big",))
