"""Two reports started together from one checkout do not disturb each other (issue #65): each notebook kernel talks
to its runner over sockets in a private folder of its own (under the system's temporary folder), never over sockets
named ``kernel-ipc-1`` … ``kernel-ipc-5`` in the working folder, which two runs started within the same second both
took (one run then waited 60 s for a kernel that answered the other, and the other printed ``Invalid Signature``
tracebacks for every message signed by the first)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import build_tiny_model
from dynheads_tl.report import cli
from dynheads_tl.report import runner as report
from test_reliability import _REPORT_ON_THE_TINY_SUITE, _write_notebook
from test_runner import tiny_suite  # noqa: F401  (the one-cell notebook suite, a fixture)

# The tiny suite's notebook with a cell that loads a tiny random model, runs it on a prompt and writes its top logits
# as a figure with its CSV file, as every notebook writes one: a kernel that imports the libraries, loads a model and
# writes results, in seconds.
_TINY_MODEL_CELL = """
import pathlib
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from dynheads_tl.report.figures import save_figure

torch.set_num_threads(1)
out = pathlib.Path(output_dir) / "01_tiny"
out.mkdir(parents=True, exist_ok=True)
(out / "value.txt").write_text(str(value))
tokenizer = AutoTokenizer.from_pretrained({model!r})
lm = AutoModelForCausalLM.from_pretrained({model!r}).eval()
with torch.no_grad():
    logits = lm(tokenizer("The needle is in the haystack", return_tensors="pt").input_ids).logits[0, -1]
top = torch.topk(logits, 8)
data = pd.DataFrame({{"token": top.indices.tolist(), "logit": [f"{{v:.5f}}" for v in top.values.tolist()]}})
fig, ax = plt.subplots(figsize=(2, 2))
ax.bar(range(8), top.values.tolist())
ax.set_title("The tiny logits")
save_figure(fig, "tiny_value", out, data, {{"value": value}})
"""


def _csv_files(folder: Path) -> dict[str, bytes]:
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in sorted(folder.rglob("*.csv"))}


@pytest.mark.side_by_side  # two reports at once: run late, when the notebook smoke runs have left the cores
def test_two_reports_started_together_from_one_checkout_do_not_disturb_each_other(tiny_suite, tmp_path):
    """Two `dynheads report` processes started at once in one working folder, each with its own cache and output
    folder: both finish, neither prints a traceback or an ``Invalid Signature``, their results are byte-identical,
    and nothing appears in the working folder meanwhile (the old sockets, ``kernel-ipc-N``, did; the check fails on
    them) or is left in the temporary folder after."""
    model = build_tiny_model("llama", tmp_path / "tiny-llama")
    suite = tiny_suite.parent
    _write_notebook(suite / "notebooks" / "01_tiny.ipynb", _TINY_MODEL_CELL.format(model=str(model)))
    checkout = tiny_suite  # the one working folder both runs start in, as two terminals in one checkout
    before = set(os.listdir(checkout))
    runs = {}
    for name in ("a", "b"):
        env = {**os.environ, "DYNHEADS_CACHE": str(tmp_path / name / "cache"), "OMP_NUM_THREADS": "1",
               "MKL_NUM_THREADS": "1"}
        out = tmp_path / name / "out"
        command = [sys.executable, "-c", _REPORT_ON_THE_TINY_SUITE, str(suite), "report", "--only", "01_tiny",
                   "--output-dir", str(out)]
        runs[name] = (subprocess.Popen(command, cwd=checkout, env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True), out)
    # While both run: whatever appears in the working folder (no output is sent there).
    seen: set[str] = set()
    deadline = time.time() + 300  # a hang detector: both end in seconds on an idle machine
    try:
        while any(process.poll() is None for process, _ in runs.values()) and time.time() < deadline:
            seen.update(set(os.listdir(checkout)) - before)
            time.sleep(0.05)
    finally:
        for process, _ in runs.values():
            if process.poll() is None:
                process.kill()
    logs = {name: process.communicate()[0] for name, (process, _) in runs.items()}
    for name, (process, _) in runs.items():
        assert process.returncode == 0, f"run {name} failed (exit {process.returncode}):\n{logs[name][-6000:]}"
        for bad in ("Traceback", "Invalid Signature", "didn't respond"):
            assert bad not in logs[name], f"run {name} printed {bad!r}:\n{logs[name][-6000:]}"
    assert not seen, f"the runs put {sorted(seen)} into the working folder (kernel sockets belong in a private folder)"
    assert set(os.listdir(checkout)) == before
    results = {name: _csv_files(out) for name, (_, out) in runs.items()}
    assert "01_tiny/tiny_value.csv" in results["a"], "the notebook wrote no CSV file: this test compares nothing"
    assert results["a"] == results["b"], "the two runs' results differ"
    # Each kernel's private folder goes with its kernel: nothing of these runs is left in the temporary folder.
    left = [folder for process, _ in runs.values() for folder in _kernel_folders_of(process.pid)]
    assert not left, f"kernel folders left behind: {left}"


def test_a_kernel_that_does_not_start_says_why_and_what_to_do(tiny_suite, capsys, monkeypatch):
    """A kernel that exits before it answers (here one whose command writes a line on its stderr and exits): the run
    stops with one paragraph that names the notebook, says what probably happened and what to do, after the kernel's
    own log; the failed run is kept as for any failure, and the kernel's private folder is gone."""
    real = report.ipc_kernel_manager

    def dying_kernel_manager(stderr=None):
        class Dying(real(stderr)):
            def format_kernel_cmd(self, extra_arguments=None):
                return [sys.executable, "-c", "import sys; sys.stderr.write('no module named ipykernel\\n'); "
                        "sys.exit(1)"]
        return Dying

    monkeypatch.setattr(report, "ipc_kernel_manager", dying_kernel_manager)
    with pytest.raises(report.KernelError) as raised:
        report.run_report(only="01_tiny", cwd=tiny_suite, show_cells=False)
    message = str(raised.value)
    assert message.startswith("01_tiny: the notebook's kernel exited before it answered (RuntimeError: Kernel died "
                              "before replying to kernel_info)"), message
    for advice in ('its own log is above (the lines "01_tiny kernel: …")', "cannot start in this environment",
                   "-m ipykernel_launcher --version", "run the same command again", "resumes from where it stopped"):
        assert advice in message, advice
    captured = capsys.readouterr()
    assert "01_tiny kernel: no module named ipykernel" in captured.err
    assert "The failed run is kept in " in captured.out and "/executed/01_tiny.failed.ipynb;" in captured.out
    assert not _kernel_folders_of(os.getpid())
    assert cli._failure(raised.value) == message, "the command line prints the paragraph as it is"


def test_a_kernel_that_times_out_or_dies_mid_run_is_explained_and_a_cell_error_is_left_alone():
    import papermill
    from nbclient.exceptions import DeadKernelError

    late = report._kernel_failure(RuntimeError("Kernel didn't respond in 60 seconds"), "03_correlation", logged=False)
    assert str(late).startswith("03_correlation: the notebook's kernel did not answer in time after it was started "
                                "(RuntimeError: Kernel didn't respond in 60 seconds); it wrote nothing on its own "
                                "stderr. Most likely the machine is overloaded")
    dead = report._kernel_failure(DeadKernelError("Kernel died"), "01_dynamism", logged=True)
    assert str(dead).startswith("01_dynamism: the notebook's kernel died while it ran (DeadKernelError: Kernel died)")
    assert "lack of memory" in str(dead) and "Run the same command again" in str(dead)
    assert "Run the same command again" in str(late) and "-m ipykernel_launcher --version" in str(late)
    cell = papermill.PapermillExecutionError(1, 4, "raise RuntimeError('Kernel died')", "RuntimeError",
                                             "Kernel died", [])
    assert report._kernel_failure(cell, "01_dynamism", logged=False) is None, "a cell's own error is not the kernel's"
    assert report._kernel_failure(RuntimeError("something else"), "01_dynamism", logged=False) is None


def test_kernel_folders_left_by_runs_that_are_gone_are_removed(tmp_path):
    """A run killed with SIGKILL cannot remove its kernel's folder; the next kernel started removes every such
    folder of this user whose run (the pid in its name) is gone, and leaves those of running runs."""
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = int(finished.stdout)
    stale = tmp_path / f"{report.KERNEL_FOLDER_PREFIX}{gone}-abcdefgh"
    (stale / "kernel-1").mkdir(parents=True)  # stands in for a socket
    running = tmp_path / f"{report.KERNEL_FOLDER_PREFIX}{os.getpid()}-abcdefgh"
    running.mkdir()
    other = tmp_path / "dynheads-kernel-notes"
    other.mkdir()
    assert report.remove_stale_kernel_folders(str(tmp_path)) == [str(stale)]
    assert not stale.exists() and running.exists() and other.exists()


def test_each_kernel_has_its_own_folder_and_connection_file():
    """Sockets and connection file in a private folder (mode 0700) per kernel, with a path short enough for a Unix
    socket; the folder goes with the kernel."""
    import asyncio

    manager_class = report.ipc_kernel_manager()

    async def start_two():
        managers = [manager_class(kernel_name="python3") for _ in range(2)]
        infos = []
        for manager in managers:
            await manager._async_pre_start_kernel()
            infos.append((manager.kernel_folder, manager.connection_file, manager.get_connection_info()))
        for manager in managers:
            await manager.cleanup_resources()
        return infos

    (folder_a, file_a, info_a), (folder_b, file_b, info_b) = asyncio.run(start_two())
    assert folder_a != folder_b and file_a != file_b and info_a["key"] != info_b["key"]
    for folder, file, info in ((folder_a, file_a, info_a), (folder_b, file_b, info_b)):
        assert Path(folder).name.startswith(f"{report.KERNEL_FOLDER_PREFIX}{os.getpid()}-")
        assert Path(file).parent == Path(folder) and Path(info["ip"]).parent == Path(folder)
        assert info["transport"] == "ipc" and len(f"{info['ip']}-{info['hb_port']}") < 100
        assert not Path(folder).exists(), "the folder goes with the kernel"
    assert not _kernel_folders_of(os.getpid())


def _kernel_folders_of(pid: int) -> list[str]:
    return [entry for entry in os.listdir(report._kernel_folder_base())
            if entry.startswith(f"{report.KERNEL_FOLDER_PREFIX}{pid}-")]
