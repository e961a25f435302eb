"""Notebooks: committed without outputs, in step with their jupytext sources, and they run."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from dynheads_tl import preregistration
from dynheads_tl.engine.models import embedded_model_dir
from dynheads_tl.report.runner import preset_parameters

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
def test_parameters_cell_is_written_from_the_config(path):
    """The cell is the config's declaration, line for line (default and help of each parameter, in the cell's
    order): a parameter's help lives in param() alone; `dynheads parameters --write` rewrites a stale cell."""
    from dynheads_tl.claims import claim_for
    from dynheads_tl.report.parameters import cell_names, parameters_cell

    [cell] = [c for c in nbformat.read(path, as_version=4).cells if "parameters" in c.metadata.get("tags", [])]
    expected = parameters_cell(claim_for(path.stem).config, cell_names(cell.source))
    assert cell.source == expected, f"{path.name}: run `dynheads parameters --write` (the cell differs from its config)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_matches_its_jupytext_source(path):
    jupytext = pytest.importorskip("jupytext")
    source = path.with_suffix(".py")
    assert source.exists(), f"{source.name} (jupytext percent source) is missing"
    from_py = jupytext.read(source)
    from_nb = nbformat.read(path, as_version=4)
    assert [(c.cell_type, c.source) for c in from_py.cells] == [(c.cell_type, c.source) for c in from_nb.cells]


# --- the notebooks, run --------------------------------------------------------------------------------------
# Each test below reads one notebook's run: the smoke preset (``dynheads report --preset smoke``) with the test's
# smaller sizes on top (``SMOKE``: fewer samples and steps, every code path of the notebook kept), its outputs in a
# temporary folder. The session starts every run its selected tests need when it starts (``smoke_runs`` in
# conftest.py), as subprocesses that run beside the rest of the suite (see start_smoke_runs for how the cores are
# shared): a notebook spends much of its time in one-core Python (kernel start, imports, pandas, figures), which
# another run or another test fills.

SMOKE: dict[str, dict] = {
    "00_inspect_attention": {"context_tokens": 120, "max_new_tokens": 16},
    "01_dynamism": {},
    "02_irreplaceability": {},
    "03_correlation": {},
    "04_dynamic_rag": {},
    "05_error_signal": {},
    "06_kv_retention": {},
    "07_length_grid": {"max_new_tokens": 12, "runs_per_cell": 1},
}
# Longest first (seconds at one torch thread beside the rest of the suite, measured 2026-12-02), so that the last
# run to finish is a short one.
EXPECTED_SECONDS = {"01_dynamism": 120, "02_irreplaceability": 115, "06_kv_retention": 110, "03_correlation": 80,
                    "04_dynamic_rag": 65, "05_error_signal": 55, "00_inspect_attention": 25,
                    "07_length_grid": 110}  # 07: 1.9 min alone at a load of 5 on 2 cores (2026-12-04)
_READS: dict[str, str] = {}  # test function -> the notebook it reads


def reads(notebook: str):
    """Mark a test as reading ``notebook``'s run (a ``notebook`` test; the session starts its run, see
    :func:`start_smoke_runs`)."""
    def mark(test):
        _READS[test.__name__] = notebook
        return pytest.mark.notebook(test)
    return mark


_PAPERMILL = """
import json, sys
import papermill
from dynheads_tl.report.runner import ipc_kernel_manager
args = json.loads(sys.argv[1])
papermill.execute_notebook(args["input"], args["output"], parameters=args["parameters"], cwd=args["cwd"],
                           kernel_name="python3", progress_bar=False, kernel_manager_class=ipc_kernel_manager())
"""


def _empty_cache(folder: Path, model: Path) -> Path:
    """A cache folder of the run's own, empty but for the converted embedded ``model`` folder (linked, not converted
    again): the run computes every unit once, as a report from an empty cache does, reads back what a later cell
    asks for again, and writes nothing into the user's cache."""
    folder.mkdir(parents=True)
    (folder / model.name).symlink_to(model, target_is_directory=True)
    return folder


class SmokeRuns:
    """The notebooks' runs as subprocesses (papermill, each in a new session), in the order given: ``workers`` at a
    time while the rest of the suite runs beside them, ``waiting_workers`` at a time while a test waits for one
    (:meth:`result`: the suite's own process then needs no core), each with ``threads`` torch threads; :meth:`idle`
    says when every run has finished. :meth:`result` fails the test with the end of the run's log if it failed."""

    def __init__(self, notebooks: list[str], base, workers: int, waiting_workers: int | None = None,
                 threads: int = 1):
        self.queue = list(dict.fromkeys(notebooks))
        self.workers = self.beside_workers = max(1, workers)
        self.waiting_workers = max(self.workers, waiting_workers or self.workers)
        self.threads = max(1, threads)
        self.base, self.running, self.done = base, {}, {}
        self.began, self.waited = time.time(), 0.0  # the seconds the suite's process spent waiting in result()
        # Found here, before any test runs: the scheduler thread starts runs while tests run, and a test may stand
        # in for the model's conversion (tests/test_reliability.py's no_model_work)
        self.model_dir = embedded_model_dir()
        # Read here too, for the same reason: a test may point the claims package at a folder of its own
        # (tests/test_runner.py's tiny_suite), and the presets come from the claims
        self.parameters = {notebook: self._parameters(notebook) for notebook in self.queue}
        self.base.getbasetemp()  # made here, not by the scheduler thread at the same time as a test's tmp_path
        self.changed = threading.Condition()
        self.stopping = False
        self.scheduler = threading.Thread(target=self._schedule, daemon=True)
        self.scheduler.start()

    @staticmethod
    def _parameters(notebook: str) -> dict:
        return {**preset_parameters("smoke", notebook), **SMOKE[notebook]}

    def _start(self, notebook: str) -> None:
        folder = self.base.mktemp(notebook)
        executed = folder / f"{notebook}.ipynb"
        parameters = {**self.parameters[notebook], "output_dir": str(folder / "figs")}
        env = {**os.environ, "OMP_NUM_THREADS": str(self.threads), "MKL_NUM_THREADS": str(self.threads),
               "DYNHEADS_CACHE": str(_empty_cache(folder / "cache", self.model_dir))}
        log = open(folder / "papermill.log", "wb")
        args = {"input": str(ROOT / "notebooks" / f"{notebook}.ipynb"), "output": str(executed),
                "parameters": parameters, "cwd": str(ROOT)}
        process = subprocess.Popen([sys.executable, "-c", _PAPERMILL, json.dumps(args)], env=env, stdout=log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.running[notebook] = (process, time.time(), folder, executed)

    def _schedule(self) -> None:
        while True:
            with self.changed:
                if self.stopping:
                    return
                while self.queue and len(self.running) < self.workers:
                    notebook = self.queue.pop(0)
                    try:
                        self._start(notebook)
                    except Exception as error:  # a run that cannot start fails its test instead of hanging it
                        self.done[notebook] = SmokeRun(notebook, -1, 0.0, Path(), Path(), None, f"not started: {error!r}",
                                                       finished=time.time())
                        self.changed.notify_all()
                for notebook, (process, started, folder, executed) in list(self.running.items()):
                    if process.poll() is not None:
                        del self.running[notebook]
                        self.done[notebook] = SmokeRun(notebook, process.returncode, time.time() - started,
                                                       folder / "figs" / notebook, executed, folder / "papermill.log",
                                                       finished=time.time())
                        self.changed.notify_all()
                if not self.queue and not self.running:
                    self.changed.wait(1.0)  # idle until result() queues another run
                else:
                    self.changed.wait(0.2)

    def idle(self) -> bool:
        """Whether every run has finished (none queued, none running)."""
        with self.changed:
            return not self.queue and not self.running

    def result(self, notebook: str) -> "SmokeRun":
        with self.changed:
            self.workers = self.waiting_workers  # this process now only waits: a run may have its core
            try:
                if notebook not in self.done and notebook not in self.running and notebook not in self.queue:
                    self.parameters.setdefault(notebook, self._parameters(notebook))  # in the test's thread
                    self.queue.append(notebook)
                    self.changed.notify_all()
                waiting_since = time.time()
                while notebook not in self.done:
                    self.changed.wait(1.0)
                self.waited += time.time() - waiting_since
            finally:
                self.workers = self.beside_workers
            run = self.done[notebook]
        if run.returncode != 0:
            log = run.error if run.log is None else run.log.read_text(errors="replace")
            pytest.fail(f"{notebook} failed (exit {run.returncode}); end of its papermill log:\n{log[-6000:]}",
                        pytrace=False)
        return run

    def summary(self) -> str:
        """Each finished run's seconds, when the last finished and how long the suite waited for runs: the line
        ``make test`` prints at the end (the runs take one core for most of the session, so their time is the
        suite's as much as the tests' own)."""
        with self.changed:
            done = sorted(self.done.values(), key=lambda run: -run.seconds)
            last = max((run.finished for run in done), default=self.began)
            return (f"smoke runs: {', '.join(f'{run.notebook} {run.seconds:.0f} s' for run in done) or 'none finished'} "
                    f"(sum {sum(run.seconds for run in done):.0f} s; the last finished {last - self.began:.0f} s "
                    f"into the session; the suite waited {self.waited:.0f} s for runs)")

    def stop(self) -> None:
        """Interrupt the runs still going (an interrupted or failed session): papermill stops its kernel."""
        with self.changed:
            self.stopping, self.queue = True, []
            self.changed.notify_all()
            running = list(self.running.values())
        for process, *_ in running:
            try:
                os.killpg(process.pid, signal.SIGINT)
                process.wait(timeout=15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


@dataclass
class SmokeRun:
    notebook: str
    returncode: int
    seconds: float
    figures: Path  # the notebook's output folder (output_dir / notebook)
    executed: Path  # the executed notebook
    log: Path | None  # papermill's log (None when the run could not start)
    error: str = ""  # why it could not start
    finished: float = 0.0  # time.time() when it finished


def selected_notebooks(session) -> list[str]:
    """The notebooks whose runs the session's selected tests read, longest first (so that the last run to finish is a
    short one)."""
    selected = [_READS[item.function.__name__] for item in session.items
                if getattr(item, "function", None) is not None and item.function.__name__ in _READS
                and item.get_closest_marker("notebook")]
    return sorted(dict.fromkeys(selected), key=lambda nb: -EXPECTED_SECONDS.get(nb, 0))


def start_smoke_runs(session, tmp_path_factory) -> "SmokeRuns | None":
    """Start the runs of every selected notebook test (None when none is selected). ``tests/conftest.py`` calls it
    when the session starts, so the runs go on beside the rest of the suite: while other tests run, one run fewer
    than the cores at a time, with one torch thread (beside the suite's own process, which conftest gives the
    remaining threads: one busy thread per core, none spinning for a core another holds); once the suite waits for a
    run, one run per core. When only notebook runs are selected, they run one per core with the cores shared out."""
    order = selected_notebooks(session)
    if not order:
        return None
    cores = os.cpu_count() or 1
    together = min(len(order), cores)
    if len(order) < len(session.items):  # other tests run beside them
        return SmokeRuns(order, tmp_path_factory, workers=max(1, cores - 1), waiting_workers=together, threads=1)
    return SmokeRuns(order, tmp_path_factory, workers=together, threads=max(1, cores // together))


@pytest.fixture(scope="module")
def smoke(smoke_runs):
    """``smoke(notebook)``: that notebook's finished run (:class:`SmokeRun`), from the runs the session started."""
    assert smoke_runs is not None, "no notebook test was selected, yet one asks for a run"
    return smoke_runs.result


@reads("01_dynamism")
def test_dynamism_notebook_runs_with_tiny_parameters(smoke):
    folder = smoke("01_dynamism").figures
    for name in ("fig1_niah_heatmap", "fig5_hotpot_heatmap", "long_tail_niah", "long_tail_hotpot"):
        for ext in ("png", "pdf", "csv", "config.json"):
            assert (folder / f"{name}.{ext}").stat().st_size > 0
    for name in ("table1_niah", "table1_hotpot", "static_size_sweep", "seed_robustness_niah", "size_aware_overlap",
                 "table1_intervals", "settings_accuracy", "soft_dynamism", "argmax_churn"):
        for ext in ("csv", "md", "config.json"):
            assert (folder / f"{name}.{ext}").exists()
    size_aware = pd.read_csv(folder / "size_aware_overlap.csv")
    assert set(size_aware["task"]) == {"niah", "hotpot"}
    assert {"static_coverage", "jaccard_over_bound", "share_outside_static"} <= set(size_aware["metric"])
    assert (size_aware["low"] <= size_aware["value"] + 1e-12).all() and (size_aware["value"] <= size_aware["high"] + 1e-12).all()
    for task in ("niah", "hotpot"):
        assert (folder / f"size_aware_{task}.png").stat().st_size > 0
    config = json.loads((folder / "table1_niah.config.json").read_text())
    assert config["n_analysis"] == 4 and config["seeds"] == [0, 1]
    for task in ("niah", "hotpot"):
        ours = pd.read_csv(folder / f"table1_{task}.csv").iloc[0]
        assert ours["model"] == "smollm2-135m-instruct"
        for column in ("jaccard_static", "jaccard_adjacent"):
            assert pd.isna(ours[column]) or 0.0 <= ours[column] <= 1.0
        assert ours["entropy"] >= 0.0
        assert 0 <= ours["ever_active"] <= ours["n_heads"] == 270
        assert 0 <= ours["heads_per_step_mean"] <= ours["n_heads"]
    paper = pd.read_csv(folder / "table1_niah.csv").iloc[1]
    assert "paper" in paper["model"]
    robust = pd.read_csv(folder / "seed_robustness_niah.csv")
    assert set(robust["n_seeds"]) == {2}
    sweep = pd.read_csv(folder / "static_size_sweep.csv")
    assert sweep["static_k"].tolist() == [20, 50, 100, 20, 50, 100]
    soft = pd.read_csv(folder / "soft_dynamism.csv")
    assert set(soft["setting"]) == {"prose 300", "all"} and set(soft["kind"]) == {"eq1", "copy", "evidence"}
    assert set(soft["n_samples"]) == {3}
    defined = soft.dropna(subset=["low"])
    assert (defined["low"] <= defined["value"] + 1e-12).all() and (defined["value"] <= defined["high"] + 1e-12).all()
    churn = pd.read_csv(folder / "argmax_churn.csv")
    assert ((churn["share"].isna()) | churn["share"].between(0, 1)).all()
    assert (folder / "soft_dynamism.png").stat().st_size > 0
    # Issue #31: the static set's stability, and the head-score files in Wu et al.'s format with their provenance
    baselines = pd.read_csv(folder / "static_baselines_niah.csv")
    assert set(baselines["baseline"]) == {"wu", "query_focused"} and set(baselines["static_k"]) == {20, 50, 100}
    for name in ("static_stability_curve", "static_stability_seeds", "static_baselines_niah"):
        for ext in ("csv", "md", "config.json"):
            assert (folder / f"{name}.{ext}").exists()
    stability = pd.read_csv(folder / "static_stability_curve.csv")
    assert stability["overlap"].between(0, 1).all() and (stability["low"] <= stability["high"]).all()
    from dynheads_tl.analysis.head_files import provenance_path, read_head_scores

    for stem in ("smollm2-135m-instruct_static_wu", "smollm2-135m-instruct_dynamic_frequency"):
        path = folder / "head_scores" / f"{stem}.json"
        scores = read_head_scores(path, (30, 9))
        assert (scores >= 0).all() and (stem.endswith("_static_wu") or (scores <= 1).all())  # a frequency is a share
        info = json.loads(provenance_path(path).read_text())
        assert info["seeds"] == [0, 1] and (info["layers"], info["heads"]) == (30, 9) and info["model_fingerprint"]
        assert info["tokenizer_digest"] and info["chat_template_digest"] and info["libraries"]["transformers"]


@reads("02_irreplaceability")
def test_irreplaceability_notebook_runs_with_tiny_parameters(smoke):
    folder = smoke("02_irreplaceability").figures
    for name in ("fig2_niah_masking", "fig3_niah_progressive", "fig6_hotpot_masking", "fig7_hotpot_progressive"):
        for ext in ("png", "pdf", "csv", "config.json"):
            assert (folder / f"{name}.{ext}").stat().st_size > 0
    grid = pd.read_csv(folder / "fig2_niah_masking.csv", keep_default_na=False)
    assert set(grid["condition"]) == {"none", "dynamic", "static", "static_matched", "random", "random_matched",
                                      "previous_step", "static_previous", "random_previous", "predicted",
                                      "dynamic_nonstatic", "random_nonstatic", "static_nondynamic",
                                      "random_nondynamic", "query_matched"}  # query_matched: issue #31
    # The fair comparison is the primary: its rows are read on the steps t >= 1.
    comparisons = pd.read_csv(folder / "comparisons.csv")
    primary = comparisons[comparisons["primary"]]
    assert primary[["a", "b", "metric"]].values.tolist() == [["previous_step", "static_previous", "tf_drop_t1"]]
    # The probe's set (known before step t) against its two size-matched controls, secondaries on the steps t >= 1,
    # and how well it predicted D_t on the grid's samples
    probe_rows = comparisons[(comparisons["a"] == "predicted") & (comparisons["metric"] == "tf_drop_t1")]
    for task in ("niah", "hotpot"):  # each task's pair (the smoke run has both)
        rows = probe_rows[probe_rows["task"] == task]
        assert sorted(rows["b"]) == ["random_previous", "static_previous"], task
    assert len(probe_rows) == 4 and not probe_rows["primary"].any()
    overlap = pd.read_csv(folder / "predicted_set_overlap.csv")
    assert set(overlap["task"]) <= {"niah", "hotpot"} and overlap["recall"].dropna().between(0, 1).all()
    sizes = grid.set_index(["context", "depth", "run", "condition"])["tf_heads_masked_per_step"].unstack("condition")
    assert (sizes["predicted"] == sizes["previous_step"]).all(), "size-matched with D_{t-1}"
    assert grid["accuracy"].between(0, 1).all()
    # Every run is also teacher-forced; with nothing masked the drop is exactly 0.
    assert (grid[grid["condition"] == "none"]["tf_drop"].astype(float) == 0).all() and (grid["tf_steps"].astype(int) > 0).all()
    assert (folder / "niah_controls.png").stat().st_size > 0
    # The three conditions mask different heads, on every grid run.
    masked = grid.pivot_table(index=["context", "depth", "run"], columns="condition", values="heads_ever_masked",
                              aggfunc="first").fillna("")
    assert (masked["none"] == "").all()
    assert (masked["static"] != masked["random"]).all()
    assert (masked["dynamic"] != masked["static"]).all() and (masked["dynamic"] != masked["random"]).all()
    assert (masked["dynamic"] != "").any(), "the model retrieves, so D_t is masked somewhere"
    # k = 0 is exactly the unmasked generation of the same sample.
    progressive = pd.read_csv(folder / "fig3_niah_progressive.csv", keep_default_na=False)
    assert sorted(set(progressive["k"])) == [0, 5, 10]
    k0 = progressive[progressive["k"] == 0]
    assert (k0["response"] == k0["unmasked_response"]).all() and (k0["heads_ever_masked"] == "").all()
    # The size-matched control: k random heads at every k > 0, on the same samples as the ranked runs.
    random = progressive[progressive["ranking"] == "random"]
    assert sorted(set(random["k"])) == [5, 10] and set(progressive["ranking"]) == {"ranked", "random"}
    assert (progressive[progressive["k"] == 0]["tf_drop"].astype(float) == 0).all(), "teacher-forced, k = 0 masks nothing"
    assert all(set(part["sample"]) == set(k0["sample"]) for _, part in random.groupby("k"))
    for task in ("niah", "hotpot"):
        checks = pd.read_csv(folder / f"{task}_protocol_checks.csv")
        assert checks.loc[0, "ok"], checks.loc[0, "passed"]  # k = 0 == unmasked
    assert pd.read_csv(folder / "niah_protocol_checks.csv")["ok"].all()
    assert (progressive["m_s"] >= 0).all() and (progressive["m_s"] <= 20).all()
    summary = pd.read_csv(folder / "niah_conditions.csv")
    assert (summary["k_static_random"] >= 1).all()
    hotpot = pd.read_csv(folder / "fig6_hotpot_masking.csv")
    assert hotpot["f1"].between(0, 1).all() and hotpot["em"].between(0, 1).all()


@reads("03_correlation")
def test_correlation_notebook_runs_with_tiny_parameters(smoke):
    folder = smoke("03_correlation").figures
    cca = pd.read_csv(folder / "fig4_niah_cca.csv")
    assert set(cca["control"]) == {"in-sample", "held-out", "shuffled", "shuffled, same step", "permuted within sample"}
    assert sorted(set(cca["k"])) == [0, 1, 2]
    assert cca["leading"].between(0, 1 + 1e-9).all()
    table2 = pd.read_csv(folder / "table2_niah_probe.csv")
    assert list(table2["predictor"])[:5] == ["MLP probe", "linear probe", "static-frequency prior", "step-aware prior",
                                             "step-and-token prior"]
    assert "(paper)" in table2["predictor"].iloc[5]
    ours = table2.iloc[:5]  # the last row is the paper's reference (precision/recall not reported)
    for column in ("f1", "precision", "recall"):
        assert ours[column].between(0, 1).all()
    table3 = pd.read_csv(folder / "table3_hotpot_probe.csv")
    assert (table3["mse"].dropna() >= 0).all() and (table3["mae"].dropna() >= 0).all()
    for name in ("fig4_niah_cca", "fig8_hotpot_cca", "lead_probes"):
        assert (folder / f"{name}.png").stat().st_size > 0
    resid = pd.read_csv(folder / "fig4_niah_cca_residualised.csv")
    assert set(resid["control"]) == {"held-out", "held-out, residualised", "held-out, residualised, chance",
                                     "held-out, residualised (tokens read only)",
                                     "held-out, residualised (tokens read only), chance"}
    assert (resid["splits"] == 2).all() and sorted(set(resid["k"])) == [0, 2]
    assert (resid["first_low"] <= resid["first"]).all() and (resid["first"] <= resid["first_high"]).all()
    lead = pd.read_csv(folder / "lead_probes.csv")
    assert set(zip(lead["task"], lead["metric"])) == {("niah", "f1"), ("niah", "auprc"), ("hotpot", "r2")}
    assert (lead["vs_step_prior_low"] <= lead["vs_step_prior_high"]).all()
    # means over splits by layout, with n and the number of layouts
    assert (cca["splits"] == 2).all() and (cca["first_low"] <= cca["first"] + 1e-12).all()
    assert (table2.iloc[:5]["splits"] == 2).all() and (table2.iloc[:5]["n_clusters"] <= table2.iloc[:5]["n_samples"]).all()
    assert (lead["vs_token_prior_low"] <= lead["vs_token_prior_high"]).all()
    assert (folder / "fig4_niah_generated_token.csv").exists() and (folder / "fig8_hotpot_generated_token.csv").exists()
    tests = pd.read_csv(folder / "lead_probes_tests.csv")
    assert tests["primary"].sum() == 1 and tests["p_adjusted"].notna().any()
    assert set(pd.read_csv(folder / "fig4_niah_cca_tests.csv")["b"]) == {"shuffled", "shuffled, same step"}


@reads("00_inspect_attention")
def test_inspect_notebook_renders_offline(smoke):
    run = smoke("00_inspect_attention")
    nb = nbformat.read(run.executed, as_version=4)
    html = [o["data"]["text/html"] for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if "text/html" in o.get("data", {})]
    views = [h for h in html if "CircuitsVis.render" in h]
    assert len(views) == 2
    for view in views:
        assert "unpkg.com" not in view, "no CDN: the bundled JavaScript is inlined"
        assert len(view) > 500_000
        assert "«" in view or "\\u00ab" in view, "needle tokens are marked"
    for name in ("step_attention", "answer_heatmap"):
        assert (run.figures / f"{name}.png").stat().st_size > 0


@reads("04_dynamic_rag")
def test_rag_notebook_runs_with_tiny_parameters(smoke):
    folder = smoke("04_dynamic_rag").figures
    table = pd.read_csv(folder / "table4_rag.csv")
    assert list(table["strategy"]) == ["dynamic", "static", "none", "full"]
    assert table["em"].between(0, 1).all() and table["f1"].between(0, 1).all()
    none = table.set_index("strategy").loc["none"]
    full = table.set_index("strategy").loc["full"]
    assert none["visible_context_share"] == 0 and none["retrievals"] == 0
    assert full["visible_context_share"] == 1
    assert "paper EM/F1 Llama-3.1-8B-Instruct" in table.columns
    assert (table["n"] == 2).all() and (table["f1_low"] <= table["f1"]).all() and (table["f1"] <= table["f1_high"]).all()
    assert (table["em_low"] <= table["em"]).all() and "recall_per_visible" in table
    comparisons = pd.read_csv(folder / "table4_comparisons.csv")
    assert {("full", "none"), ("dynamic", "static")} <= set(zip(comparisons["a"], comparisons["b"]))
    # the teacher-forced secondary: every strategy scored on both questions' gold answers (log-probabilities <= 0),
    # the bounds and Dynamic minus each other strategy, and its figure
    assert (table["tf_n"] == 2).all() and (table["tf_logprob"] <= 0).all()
    assert ((table["tf_logprob_low"] <= table["tf_logprob"] + 1e-12)
            & (table["tf_logprob"] <= table["tf_logprob_high"] + 1e-12)).all()
    forced = pd.read_csv(folder / "table4_teacher_forced_comparisons.csv")
    assert list(zip(forced["a"], forced["b"])) == [("full", "none"), ("dynamic", "static"), ("dynamic", "none"),
                                                   ("dynamic", "full")]
    assert list(forced["family"]) == ["bounds", "secondary", "secondary", "secondary"] and (forced["n"] == 2).all()
    assert (folder / "table4_teacher_forced.png").stat().st_size > 0
    runs = pd.read_csv(folder / "rag_runs.csv")
    assert runs["tf_logprob"].notna().all() and (runs["tf_tokens"] > 0).all()
    rind = pd.read_csv(folder / "rind_calibration.csv")  # the threshold was calibrated on 3 questions
    assert len(rind) == 3 and {"rind_max", "wrong"} <= set(rind.columns)


@reads("05_error_signal")
def test_error_signal_notebook_runs_with_tiny_parameters(smoke):
    run = smoke("05_error_signal")
    folder = run.figures
    answers = pd.read_csv(folder / "answers.csv")
    assert list(answers["n"]) == [5, 8, 6] and (answers["low"] <= answers["error_rate"]).all()
    table = pd.read_csv(folder / "auroc.csv")
    assert list(table["group"]) == ["dynamic", "dynamic_ctx", "lookback", "logit", "dynamic+logit", "setting",
                                    "string_match"]
    assert (table["n"] == 13).all() and table["auroc"].between(0, 1).all()
    assert (table["low"] <= table["auroc"] + 1e-12).all() and (table["auroc"] <= table["high"] + 1e-12).all()
    assert table["dynamic_minus"].notna().sum() == 6 and table["dynamic_ctx_minus"].notna().sum() == 2
    comparisons = pd.read_csv(folder / "auroc_comparisons.csv")
    assert comparisons["primary"].sum() == 1 and {"sign_p", "p_adjusted", "testable", "evaluable"} <= set(comparisons)
    assert pd.read_csv(folder / "answers.csv")["too_easy"].all()  # the smoke sizes hold fewer than 10 wrong answers
    assert (folder / "roc_transfer.png").stat().st_size > 0 and (folder / "transfer.csv").exists()
    executed = run.executed.read_text()
    assert "Verdict." in executed and "Lookback Lens (in-domain) 0.85-0.91" in executed
    assert "to evaluate an error detector" in executed  # the smoke settings are too small to test on


@reads("06_kv_retention")
def test_kv_retention_notebook_runs_with_tiny_parameters(smoke):
    run = smoke("06_kv_retention")
    folder = run.figures
    executed = run.executed.read_text()
    table = pd.read_csv(folder / "retention.csv")
    assert list(table["strategy"][:2]) == ["full", "streaming"] and (table["n"] == 2).all()
    assert set(table["strategy"]) == {"full", "streaming", "static", "query_static", "predicted", "oracle", "random"}
    assert set(table["budget"]) == {0.0, 0.05, 0.25, 1.0}
    assert (table["accuracy_low"] <= table["accuracy"]).all() and (table["accuracy"] <= table["accuracy_high"]).all()
    full = table.set_index("strategy").loc["full"]
    assert full["vs_full"] == 0 and full["heads_kept"] == 270 and full["kv_heads_kept"] == 90
    assert (table.set_index("strategy").loc["streaming", "heads_kept"] == 0)
    memory = pd.read_csv(folder / "kv_memory_computed.csv")
    assert set(memory["model"]) == {"smollm2-135m-instruct", "Llama-3.1-8B"} and "GiB_at_128k" in memory
    assert (folder / "retention.png").stat().st_size > 0
    assert "Verdict." in executed
    # Issue #31: the query-focused static set beside Wu's, with its computed sentence
    query = pd.read_csv(folder / "predicted_vs_query_static.csv")
    assert set(query["budget"]) == {0.05, 0.25} and (query["n"] == 2).all()
    assert "With the query-focused static set as the static baseline" in executed


@reads("07_length_grid")
def test_length_grid_notebook_runs_with_tiny_parameters(smoke):
    run = smoke("07_length_grid")
    folder = run.figures
    for name in ("table1_by_length", "fig2_by_length", "length_headroom", "length_trends", "window_layers",
                 "rotation_bound"):
        for ext in ("csv", "md", "config.json"):
            assert (folder / f"{name}.{ext}").exists()
    # headroom per length beside the slopes (deviation of 2026-12-06): one row per length of the masking runs
    headroom = pd.read_csv(folder / "length_headroom.csv")
    runs = pd.read_csv(folder / "masking_runs.csv")
    unmasked = runs[runs["condition"] == "none"].groupby("context")["accuracy"]
    assert headroom.set_index("length")["n"].to_dict() == unmasked.size().to_dict()
    assert headroom.set_index("length")["accuracy"].to_dict() == pytest.approx(unmasked.mean().to_dict())
    trends = pd.read_csv(folder / "length_trends.csv", keep_default_na=False)
    assert {"lengths_no_headroom", "lengths_run", "lengths_beyond_window", "context_window"} <= set(trends.columns)
    assert (trends["lengths_run"] == "200 400").all() and (trends["lengths_beyond_window"] == "").all()
    # the rotation slope's size bound (exploratory, deviation of 2026-12-06): per length and the slope, quoted
    bound = pd.read_csv(folder / "rotation_bound.csv", keep_default_na=False)
    assert bound["length"].tolist() == ["200", "200", "400", "400", "slope"]
    from dynheads_tl.claims.length_grid.bounded import bound_finding

    [said] = bound_finding(folder)
    assert said.startswith("On smollm2-135m-instruct, NIAH on the") and said in run.executed.read_text()
    # SmolLM2 has no sliding-window layer: the exploratory analysis says so in one computed sentence and is skipped
    layers = pd.read_csv(folder / "window_layers.csv")
    assert len(layers) == 30 and set(layers["kind"]) == {"global"}
    assert not (folder / "window_shares.csv").exists() and not (folder / "window_jaccard.csv").exists()
    from dynheads_tl.claims.length_grid.report import _window_finding

    [sentence] = _window_finding(folder)
    assert sentence.startswith("On smollm2-135m-instruct, every one of the 30 layers") and "skipped" in sentence
    assert sentence in run.executed.read_text()
    # the size axis (the smoke preset takes the scale preset's code path): five primaries and the descriptive rows,
    # with static sets of 10% of SmolLM2's 270 heads and its block parameters
    size = pd.read_csv(folder / "size_axis.csv")
    assert size[size["kind"] == "primary"]["primary"].tolist() == [
        p["id"] for p in preregistration.load()["scale"]["primaries"]]
    assert set(size["static_size"]) == {27} and set(size["n_heads"]) == {270}
    assert 100e6 < size["parameters"].iloc[0] < 135e6  # SmolLM2-135M without its tied embedding
    assert "Size axis on smollm2-135m-instruct" in run.executed.read_text()
    assert (pd.read_csv(folder / "table1_by_length.csv")["static_k"] == 27).all()
