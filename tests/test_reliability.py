"""Failing first and clearly at the edges: devices, dtypes, Ray addresses, folders that cannot be written, cache
entries that cannot be read, concurrent runs, stale partial notebooks, Ctrl-C and shell quoting.

Each refusal is checked to come before any model work: ``no_model_work`` records every load and every conversion
of the embedded model (and every notebook start), and each test asserts that none happened. CI runs as root, for
whom permissions do not deny anything, so the permission cases replace the store's one write probe and one read
with functions that raise ``PermissionError`` as they would for a normal user; a real ``chmod`` case runs too
where the tests do not run as root.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from pathlib import Path

import nbformat
import pytest
import torch

from dynheads_tl import store
from dynheads_tl.engine import models, preflight, trace_data
from dynheads_tl.engine.trace_data import Trace
from dynheads_tl.executors import check_ray_address
from dynheads_tl.report import cli
from dynheads_tl.report import runner as report
from conftest import link_converted_models
from factories import make_trace
from test_runner import tiny_suite  # noqa: F401  (the one-cell notebook suite, a fixture)

SMOLLM2 = "smollm2-135m-instruct"  # the folder a run of the default model gets: runs/<preset>/<model>/


@pytest.fixture
def no_model_work(monkeypatch, tmp_path):
    """Every model load, embedded-model conversion and notebook start is recorded (and none is performed); the
    cache is a fresh, empty folder, as on a new machine."""
    calls: list[str] = []

    def record(what):
        def stand_in(*args, **kwargs):
            calls.append(what)
            raise AssertionError(f"{what} was called before the refusal")
        return stand_in

    import papermill

    monkeypatch.setattr(models, "_convert_embedded", record("conversion of the embedded model"))
    monkeypatch.setattr(models, "load_model", record("load_model"))
    monkeypatch.setattr(papermill, "execute_notebook", record("a notebook start"))
    monkeypatch.setenv("DYNHEADS_CACHE", str(tmp_path / "fresh-cache"))
    monkeypatch.setenv(preflight.ALLOW_CPU_HALF_ENV, "0")
    return calls


def _refused(argv, capsys) -> str:
    """Run the command line, check it failed with one sentence and no traceback, and return that sentence."""
    assert cli.main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("Report failed: ") and "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- before any model work ----------------------------------------------------------------------------
def test_a_ray_address_that_does_not_answer_is_refused_in_seconds(no_model_work, tmp_path, capsys):
    pytest.importorskip("ray")
    port = _free_port()  # bound and released: nothing listens there now
    started = time.time()
    err = _refused(["report", "--only", "01", "--backend", "ray", "--address", f"127.0.0.1:{port}",
                    "--output-dir", str(tmp_path / "out")], capsys)
    assert f"'ray_address' is '127.0.0.1:{port}', but nothing answers there within 3 s" in err
    assert "ray start --head" in err
    assert time.time() - started < 60, "refused by a short connection check, not by Ray's retries"
    assert no_model_work == []


def test_a_malformed_ray_address_names_the_expected_form():
    with pytest.raises(ValueError, match=r"must look like HOST:PORT .* got 'my-cluster'"):
        check_ray_address("my-cluster")


def test_an_answering_address_passes_the_check():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        check_ray_address(f"127.0.0.1:{server.getsockname()[1]}", timeout=2)


def test_cuda_without_cuda_is_refused_before_any_model_work(no_model_work, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    err = _refused(["report", "--only", "01", "--device", "cuda", "--output-dir", str(tmp_path / "out")], capsys)
    assert "Parameter 'device' is 'cuda', but torch sees no CUDA GPU on this machine" in err
    assert "device='cpu'" in err
    assert no_model_work == []


def test_a_cuda_index_past_the_device_count_is_refused(no_model_work, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    err = _refused(["report", "--only", "01", "--device", "cuda:2", "--output-dir", str(tmp_path / "out")], capsys)
    assert "'cuda:2', but this machine has 2 CUDA device(s) (cuda:0 to cuda:1)" in err
    preflight.check_device("cuda:1")  # in range: accepted
    assert no_model_work == []


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_on_the_cpu_needs_an_explicit_flag(no_model_work, monkeypatch, tmp_path, capsys, dtype):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    err = _refused(["report", "--only", "01", "--dtype", dtype, "--output-dir", str(tmp_path / "out")], capsys)
    assert f"Parameter 'dtype' is '{dtype}', but the model would run on the CPU" in err
    assert "--allow-cpu-half" in err
    assert no_model_work == []
    preflight.check_dtype(dtype, "cuda")  # on a GPU it is fine
    seen = {}
    monkeypatch.setattr(cli, "run_report", lambda **kwargs: seen.update(
        allowed=preflight.cpu_half_allowed(), kwargs=kwargs))
    assert cli.main(["report", "--only", "01", "--dtype", dtype, "--allow-cpu-half"]) == 0
    assert seen["allowed"] and seen["kwargs"]["overrides"]["dtype"] == dtype
    preflight.check_dtype(dtype, "cpu")  # with the flag, accepted


def _deny_writes_under(monkeypatch, root: Path) -> None:
    """The store's write probe raises PermissionError inside ``root``, as a read-only folder does for a normal user."""
    probe = store._probe_write

    def denied(folder: Path) -> None:
        if Path(folder).resolve().is_relative_to(root.resolve()):
            raise PermissionError(13, "Permission denied", str(folder))
        probe(folder)

    monkeypatch.setattr(store, "_probe_write", denied)


def test_a_read_only_cache_folder_is_refused_before_any_model_work(no_model_work, monkeypatch, tmp_path, capsys):
    (tmp_path / "fresh-cache").mkdir()
    _deny_writes_under(monkeypatch, tmp_path / "fresh-cache")
    err = _refused(["report", "--only", "01", "--output-dir", str(tmp_path / "out")], capsys)
    assert f"The cache folder (DYNHEADS_CACHE) {tmp_path / 'fresh-cache'} cannot be written (permission denied)" in err
    assert "set DYNHEADS_CACHE to another folder, or fix the permissions" in err
    assert no_model_work == []


def test_an_output_folder_that_cannot_be_written_or_is_a_file_is_refused(no_model_work, monkeypatch, tmp_path,
                                                                          capsys):
    a_file = tmp_path / "report.txt"
    a_file.write_text("not a folder")
    err = _refused(["report", "--only", "01", "--output-dir", str(a_file)], capsys)
    assert f"The output folder {a_file} is a file, not a folder; choose another with --output-dir." in err
    err = _refused(["report", "--only", "01", "--output-dir", str(a_file / "sub")], capsys)
    assert f"lies under {a_file}, which is a file" in err
    (tmp_path / "locked").mkdir()
    _deny_writes_under(monkeypatch, tmp_path / "locked")
    err = _refused(["report", "--only", "01", "--output-dir", str(tmp_path / "locked")], capsys)
    assert f"The output folder {tmp_path / 'locked'} cannot be written (permission denied)" in err
    err = _refused(["report", "--only", "01", "--output-dir", str(tmp_path / "locked" / "new" / "report")], capsys)
    assert (f"The output folder {tmp_path / 'locked' / 'new' / 'report'} cannot be created: {tmp_path / 'locked'} "
            "is not writable (permission denied)") in err
    assert not (tmp_path / "locked" / "new").exists(), "checking creates nothing"
    assert no_model_work == []


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root may write into any folder")
def test_a_really_read_only_output_folder_is_refused(no_model_work, tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        err = _refused(["report", "--only", "01", "--output-dir", str(locked)], capsys)
    finally:
        locked.chmod(0o700)
    assert "cannot be written (permission denied)" in err
    assert no_model_work == []


def test_a_fresh_cache_and_a_missing_file_is_refused_without_converting_the_model(no_model_work, tmp_path, capsys):
    err = _refused(["report", "--only", "01", "-p", f"hotpot_source='{tmp_path / 'missing.json'}'",
                    "--output-dir", str(tmp_path / "out")], capsys)
    assert "missing.json' does not exist" in err
    assert no_model_work == [], "the embedded model was converted (or loaded) before the refusal"
    assert not (tmp_path / "fresh-cache" / models.converted_model_dir(models.DEFAULT_MODEL).name).exists()


def test_the_embedded_context_window_and_head_shape_are_read_without_converting(no_model_work):
    from dynheads_tl.engine.preflight import model_context_window, model_head_shape

    assert preflight.embedded_context_window(models.DEFAULT_MODEL) == 8192  # SmolLM2's config states 8,192
    assert model_head_shape(models.DEFAULT_MODEL) == (30, 9)  # 30 layers x 9 query heads
    assert model_context_window(models.DEFAULT_MODEL) == 8192
    assert no_model_work == []


# Bad values that passed the checks once (issue 51), each refused before any model work with a sentence naming the
# parameter, for every embedded model that is installed: head counts and lengths come from the model's own header and
# tokenizer. (argv after `report --only 01 --model M`, what the sentence holds, with {layers}, {heads} and {model}
# filled in.)
BAD_VALUES = {
    "negative seed": (["-p", "seeds=[-1]"], "Parameter 'seeds' must be a non-empty list of integers >= 0, got [-1]."),
    "too few new tokens": (["-p", "max_new_tokens=1"], "Parameter 'max_new_tokens' is 1, but a NIAH answer (a UUID) "
                                                       "needs at least"),
    "more static heads than the model has": (
        ["-p", "static_k=100000"], "Parameter 'static_k' is 100000, but {model!r} has {total} heads ({layers} layers x "
                                   "{heads} query heads); use at most {total}."),
    "a context shorter than the needle": (["-p", "context_tokens=16"], "Parameter 'context_tokens' asks for a NIAH "
                                                                       "context of 16 tokens, but the needle sentence"),
    "-p model= beside --model": (["-p", "model='another-model'"], "model is given twice with different values "
                                                                  "(--model {model!r} and -p model='another-model')"),
}


def _installed_embedded_models() -> list[str]:
    return [name for name in models.EMBEDDED_MODELS if models.embedded_installed(name)]


@pytest.mark.parametrize("model", _installed_embedded_models())
@pytest.mark.parametrize("case", list(BAD_VALUES))
def test_bad_values_are_refused_with_the_parameter_before_any_model_work(no_model_work, tmp_path, capsys, case, model):
    extra, expected = BAD_VALUES[case]
    layers, heads = preflight.model_head_shape(model)
    link_converted_models(tmp_path / "fresh-cache", [model])
    err = _refused(["report", "--only", "01", "--model", model, *extra, "--output-dir", str(tmp_path / "out")], capsys)
    assert expected.format(model=model, layers=layers, heads=heads, total=layers * heads) in err
    assert "rouge_filter" not in err, "the advice names notebook parameters only"
    assert no_model_work == [], "a model was loaded or converted before the refusal"


def test_an_empty_model_name_is_refused(no_model_work, tmp_path, capsys):
    err = _refused(["report", "--only", "01", "--model", "", "--output-dir", str(tmp_path / "out")], capsys)
    assert "--model is ''; name a model" in err
    err = _refused(["report", "--only", "01", "-p", "model=''", "--output-dir", str(tmp_path / "out")], capsys)
    assert "Parameter 'model' must name a model" in err
    assert no_model_work == []


def test_a_model_folder_with_a_broken_config_is_refused_with_a_sentence(no_model_work, tmp_path, capsys):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama", ')  # cut short
    err = _refused(["report", "--only", "01", "--model", str(folder), "--output-dir", str(tmp_path / "out")], capsys)
    assert (f"Parameter 'model' is {str(folder)!r}, but its config file ({folder / 'config.json'}) cannot be read: "
            in err)
    assert "Fix or replace config.json" in err
    assert no_model_work == []


# --- the cache under faults ---------------------------------------------------------------------------
def _trace() -> Trace:
    return make_trace([5, 6], heads=4, d_model=8, prompt_ids=torch.arange(10), evidence_spans=[(2, 5)], answers=["a"],
                      response="a")


def test_an_unreadable_trace_entry_is_named_set_aside_and_recomputed(tmp_path, monkeypatch, caplog):
    config = {"what": "unreadable"}
    computed = trace_data.cached_traces(config, lambda: [_trace()], root=tmp_path)
    path = store.traces_path(config, tmp_path)

    def denied(p, *rest):
        raise PermissionError(13, "Permission denied", str(p))

    monkeypatch.setattr(trace_data, "load_traces", denied)
    with caplog.at_level(logging.WARNING, logger="dynheads_tl.store"):
        again = trace_data.cached_traces(config, lambda: computed, root=tmp_path)
    assert len(again) == 1 and torch.equal(again[0].tokens, computed[0].tokens)
    [message] = [r.getMessage() for r in caplog.records]
    assert message.startswith(f"{store.HEAL_PREFIX}{path} is unreadable (permission denied)")
    assert (tmp_path / (path.name + ".corrupt")).exists() and path.exists()


def test_an_unreadable_result_entry_heals_and_one_that_cannot_be_replaced_stops_with_a_sentence(tmp_path,
                                                                                                 monkeypatch):
    config = {"what": "result"}
    store.save_cached_json(config, {"score": 1.0}, root=tmp_path)
    path = store.result_path(config, tmp_path)

    def denied(p, *rest):
        raise PermissionError(13, "Permission denied", str(p))

    monkeypatch.setattr(store, "_read_text", denied)
    assert store.load_cached_json(config, root=tmp_path) is None  # set aside: the caller recomputes
    assert (tmp_path / (path.name + ".corrupt")).exists() and not path.exists()

    store.save_cached_json(config, {"score": 1.0}, root=tmp_path)
    monkeypatch.setattr(store.os, "replace", denied)
    monkeypatch.setattr(store.os, "access", lambda *args: False)
    with pytest.raises(store.CacheError, match=r"cannot be read \(permission denied\), and its folder is not "
                                               r"writable.*chmod u\+rw.*DYNHEADS_CACHE"):
        store.load_cached_json(config, root=tmp_path)


def test_a_heal_warning_drops_torchs_unsafe_advice(tmp_path, caplog):
    path = tmp_path / "old.pt"
    torch.save([{"when": time.struct_time((2026, 1, 1, 0, 0, 0, 0, 1, 0))}], path)  # refused by weights_only
    with pytest.raises(Exception) as raised:
        trace_data.load_traces(path)
    with caplog.at_level(logging.WARNING, logger="dynheads_tl.store"):
        store.quarantine(path, raised.value.__cause__ or raised.value)
    [message] = [r.getMessage() for r in caplog.records]
    assert "weights_only" not in message and "arbitrary code" not in message
    assert "a safe (weights-only) load refuses" in message


def _write_notebook(path: Path, code: str) -> None:
    """The tiny suite's notebook (tests/test_runner.py's tiny claim: parameters fail, value, output_dir) with ``code``
    as its one cell after the parameters."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("fail = False  # unused\nvalue = 1  # the cache key\n"
                                          "output_dir = 'papers_figures'  # where outputs go",
                                          metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell(code)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


# Two cached results, read as a claim reads its units; between them the cell installs a root logging handler, as any
# library's logging.warning() call does in a kernel (TransformerLens makes such calls): a heal warning is then
# printed behind "WARNING:dynheads_tl.store:", the form a real report's kernel printed.
_HEALING_CELL = """
import logging
import time
from dynheads_tl import store
from dynheads_tl.progress import progress

def unit(name):
    key = {"tiny": name, "value": value}
    return store.load_cached_json(key) or store.save_cached_json(key, {"name": name, "value": value})

unit("before")
logging.basicConfig()
unit("after")
for step in progress(range(3), desc="tiny units"):
    time.sleep(0.7)
"""


def test_heal_warnings_and_progress_from_a_real_run_reach_the_terminal(tiny_suite, tmp_path, monkeypatch, capsys):
    """A cache entry truncated on disk is healed inside a notebook's kernel; the runner repeats the kernel's warning
    on the terminal, whether the kernel printed it bare or behind a logging prefix. The cell's progress lines reach
    the terminal while it runs (every item here: DYNHEADS_PROGRESS_EVERY_S=0), none the notebook."""
    monkeypatch.setenv("DYNHEADS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("DYNHEADS_PROGRESS_EVERY_S", "0")
    _write_notebook(tiny_suite.parent / "notebooks" / "01_tiny.ipynb", _HEALING_CELL)
    entries = []
    for name in ("before", "after"):  # what an earlier run cached, then truncated, as by a full disk
        key = {"tiny": name, "value": 4}
        store.save_cached_json(key, {"name": name, "value": 4})
        entries.append(store.result_path(key))
        entries[-1].write_bytes(entries[-1].read_bytes()[: entries[-1].stat().st_size // 2])
    report.run_report(only="01_tiny", overrides={"value": 4}, cwd=tiny_suite, show_cells=False)
    err = capsys.readouterr().err.splitlines()
    healed = [line for line in err if "Cache entry" in line]
    assert len(healed) == 2, err
    for line, entry in zip(healed, entries):
        assert line.startswith(f"01_tiny: Cache entry {entry} is unreadable (JSONDecodeError: "), line
        assert line.endswith(f"moved it to {entry.name}.corrupt and recomputing it."), line
    executed = (tiny_suite / "runs" / "default" / SMOLLM2 / "executed" / "01_tiny.ipynb").read_text()
    assert "WARNING:dynheads_tl.store:Cache entry" in executed, "the kernel printed the second behind the prefix"
    assert all(json.loads(entry.read_text())["result"]["value"] == 4 for entry in entries), "recomputed and saved"
    shown = [line.strip() for line in err if "tiny units" in line]
    assert shown[0] == "01_tiny: tiny units: 3 to compute" and shown[-1].startswith("01_tiny: tiny units: 3/3 done in")
    assert [line.split(" after ")[0] for line in shown[1:-1]] == ["01_tiny: tiny units: 1/3", "01_tiny: tiny units: 2/3"]
    assert "tiny units: 3" not in executed, "progress stays out of the executed notebook"


def test_a_notebook_error_is_one_line_without_its_traceback():
    import papermill

    error = papermill.PapermillExecutionError(cell_index=3, exec_count=4, source="x", ename="CacheError",
                                              evalue="Cache entry X cannot be read", traceback=["Traceback ...", "..."])
    assert cli._failure(error) == "a notebook cell (In [4]) raised CacheError: Cache entry X cannot be read"


# --- concurrent runs, stale partials, Ctrl-C ---------------------------------------------------------------
def test_a_second_holder_of_a_notebook_lock_waits_and_says_for_whom(tmp_path, capsys):
    lock = tmp_path / "locks" / "01_x.lock"
    inside, release, order = threading.Event(), threading.Event(), []

    def first():
        with report.notebook_lock(lock, "01_x on the cache C"):
            order.append("first in")
            inside.set()
            release.wait(10)
            order.append("first out")

    thread = threading.Thread(target=first)
    thread.start()
    inside.wait(10)
    threading.Timer(0.5, release.set).start()
    with report.notebook_lock(lock, "01_x on the cache C"):
        order.append("second in")
    thread.join(10)
    assert order == ["first in", "first out", "second in"], "the second run waited for the first"
    out = capsys.readouterr().out
    assert f"Waiting: a dynheads run (pid {os.getpid()}" in out and "is running 01_x on the cache C" in out


def test_a_run_waits_for_another_run_of_the_same_notebook_then_reuses_its_output(tiny_suite, capsys, tmp_path,
                                                                                  monkeypatch):
    monkeypatch.setenv("DYNHEADS_CACHE", str(tmp_path / "cache"))
    lock = tmp_path / "cache" / "locks" / "01_tiny.lock"
    inside, released = threading.Event(), []

    def other_run():
        with report.notebook_lock(lock, "01_tiny"):
            inside.set()
            time.sleep(1.0)
            released.append(time.time())

    thread = threading.Thread(target=other_run)
    thread.start()
    inside.wait(10)
    run_report = report.run_report
    run_report(only="01_tiny", overrides={"value": 3}, cwd=tiny_suite, show_cells=False)
    finished = time.time()
    thread.join(10)
    assert released and finished >= released[0], "the run started its notebook only after the other run ended"
    assert "Waiting: a dynheads run" in capsys.readouterr().out
    assert (tiny_suite / "runs" / "default" / SMOLLM2 / "executed" / "01_tiny.ipynb").exists()


def test_a_stale_partial_notebook_is_removed_and_the_run_completes(tiny_suite, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("DYNHEADS_CACHE", str(tmp_path / "cache"))
    executed = tiny_suite / "runs" / "default" / SMOLLM2 / "executed"
    executed.mkdir(parents=True)
    stale = executed / ".01_tiny.partial.ipynb"
    stale.write_text("{ left by a killed run")
    report.run_report(only="01_tiny", overrides={"value": 5}, cwd=tiny_suite, show_cells=False)
    assert "Removed runs/default/smollm2-135m-instruct/executed/.01_tiny.partial.ipynb, left by an earlier run that was stopped." \
        in capsys.readouterr().out
    assert not stale.exists() and (executed / "01_tiny.ipynb").exists()


def test_an_interrupted_run_says_only_what_is_true(tiny_suite, capsys, tmp_path, monkeypatch):
    import papermill

    monkeypatch.setenv("DYNHEADS_CACHE", str(tmp_path / "cache"))

    def interrupted(source, output, **kwargs):
        nbformat.write(nbformat.read(source, as_version=4), output)  # papermill had written part of it
        raise KeyboardInterrupt

    monkeypatch.setattr(papermill, "execute_notebook", interrupted)
    with pytest.raises(KeyboardInterrupt):
        report.run_report(only="01_tiny", overrides={"value": 5}, cwd=tiny_suite, show_cells=False)
    out = capsys.readouterr().out
    assert ("The interrupted run is kept in runs/default/smollm2-135m-instruct/executed/01_tiny.failed.ipynb; there is no finished "
            "runs/default/smollm2-135m-instruct/executed/01_tiny.ipynb yet.") in out
    assert "left as it was" not in out


# `dynheads report` on the tiny suite, in a process of its own: the claims package and the notebook folder pointed at
# the suite's, as the tiny_suite fixture does in this process.
_REPORT_ON_THE_TINY_SUITE = """
import sys
from pathlib import Path
from dynheads_tl import claims
from dynheads_tl.report import cli, runner
suite = Path(sys.argv[1])
claims.__path__ = [str(suite / "claims")]
runner.notebook_dir = lambda: suite / "notebooks"
sys.exit(cli.main(sys.argv[2:]))
"""


def _stopped_mid_cell(tiny_suite, tmp_path, stop) -> tuple[int, str, str]:
    """A real `dynheads report`, in a process group of its own, stopped by ``stop(process)`` while its notebook runs
    a cell; its exit status, stdout and stderr."""
    import signal
    import subprocess
    import sys

    suite = tiny_suite.parent
    started = tiny_suite / "started"
    _write_notebook(suite / "notebooks" / "01_tiny.ipynb",
                    f"import pathlib, time\npathlib.Path({str(started)!r}).write_text('x')\ntime.sleep(120)")
    env = {**os.environ, "DYNHEADS_CACHE": str(tmp_path / "cache")}
    # A terminal's foreground job starts with SIGINT at its default; a test run launched in the background of a
    # non-interactive shell inherits it ignored, so the child restores the default before Python starts.
    process = subprocess.Popen([sys.executable, "-c", _REPORT_ON_THE_TINY_SUITE, str(suite), "report", "--only",
                                "01_tiny"], cwd=tiny_suite, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 120
        while not started.exists() and process.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert started.exists(), "the notebook's cell never started"
        stop(process)
        out, err = process.communicate(timeout=180)  # a hang detector: the run ends in seconds on an idle machine
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    return process.returncode, out, err


def test_ctrl_c_in_a_terminal_ends_with_the_one_documented_line(tiny_suite, tmp_path):
    """Ctrl-C in a terminal signals the whole foreground process group: a real `dynheads report` in a process group
    of its own gets SIGINT while its notebook runs a cell. Its stderr ends with the resume line, with no traceback
    before it (the kernel, stopped mid-cell, logs one about its closed sockets)."""
    import signal

    code, out, err = _stopped_mid_cell(tiny_suite, tmp_path,
                                       lambda process: os.killpg(process.pid, signal.SIGINT))  # what Ctrl-C does
    assert code == 130, err
    assert err.strip().splitlines()[-1] == ("Interrupted. Finished traces and ablation runs are cached; run the same "
                                            "command again to resume from where it stopped.")
    assert "Traceback" not in err and "Error" not in err, err
    assert "The interrupted run is kept in runs/default/smollm2-135m-instruct/executed/01_tiny.failed.ipynb" in out  # --only: runs/


def test_sigterm_takes_the_interrupted_path_and_says_so(tiny_suite, tmp_path):
    """`kill` (or a scheduler's time limit) sends SIGTERM to the runner alone: it ends like Ctrl-C (the notebook kept
    as .failed.ipynb, one closing line, no traceback) with exit 143, instead of dying silently."""
    import signal

    code, out, err = _stopped_mid_cell(tiny_suite, tmp_path,
                                       lambda process: process.send_signal(signal.SIGTERM))  # the runner only
    assert code == 143, err
    assert err.strip().splitlines()[-1] == ("Stopped by SIGTERM. Finished traces and ablation runs are cached; run the "
                                            "same command again to resume from where it stopped.")
    assert "Traceback" not in err, err
    assert "The interrupted run is kept in runs/default/smollm2-135m-instruct/executed/01_tiny.failed.ipynb" in out


# --- the shell --------------------------------------------------------------------------------------------
def test_an_unquoted_list_value_gets_a_quoting_hint(no_model_work, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["report", "--only", "01", "-p", "seeds=[0,", "1]"])  # what the shell makes of -p seeds=[0, 1]
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "'seeds=[0,' is not a complete Python literal" in err and "-p 'seeds=[0, 1]'" in err
    with pytest.raises(SystemExit):
        cli.main(["report", "--only", "01", "-p", "seeds=[0,1]", "2]"])
    err = capsys.readouterr().err
    assert "unrecognized arguments: 2]" in err and "must be quoted for the shell" in err
    assert no_model_work == []




def test_every_test_the_reliability_page_names_exists():
    """docs/reliability.md names a test for each row; each named test is defined in the file it names."""
    import re

    root = Path(__file__).resolve().parent
    text = (root.parent / "docs" / "reliability.md").read_text()
    named, current = [], None
    for match in re.finditer(r"`(test_[a-z_]+\.py|…)::(test_\w+)`", text):
        current = match.group(1) if match.group(1) != "…" else current
        named.append((current, match.group(2)))
    assert len(named) >= 20
    missing = [f"{file}::{name}" for file, name in named
               if not re.search(rf"^def {name}\(", (root / file).read_text(), re.MULTILINE)]
    assert not missing, f"docs/reliability.md names tests that do not exist: {missing}"


_OTHER_RUN_CELL = """
import json
import pathlib
runs = pathlib.Path(output_dir) / "runs.json"  # another run into this folder finishes a notebook meanwhile
data = json.loads(runs.read_text()) if runs.exists() else {}
data["99_other"] = {"model": "other", "minutes": 1.0}
runs.write_text(json.dumps(data))
"""


def test_a_run_keeps_the_runs_json_entries_another_run_wrote_meanwhile(tiny_suite, tmp_path, monkeypatch):
    """Two runs into one report folder (a model's full run and a `--only` run beside it): each finished notebook
    replaces its own entry of runs.json as the file is then, so neither run drops the other's record."""
    monkeypatch.setenv("DYNHEADS_CACHE", str(tmp_path / "cache"))
    _write_notebook(tiny_suite.parent / "notebooks" / "01_tiny.ipynb", _OTHER_RUN_CELL)
    report.run_report(only="01_tiny", overrides={"value": 6}, cwd=tiny_suite, show_cells=False)
    runs = json.loads((tiny_suite / "runs" / "default" / SMOLLM2 / "runs.json").read_text())
    assert set(runs) == {"01_tiny", "99_other"}
    assert runs["99_other"]["model"] == "other" and runs["01_tiny"]["computed"] in (True, False)
