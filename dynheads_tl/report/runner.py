"""The batch runner: every notebook in order through papermill, with presets and overrides.

Where outputs go (relative to the working directory). Only ``dynheads report --committed`` writes the committed
report, ``papers_figures/`` (:func:`run_committed_report`, naming each of its folders). Every other run writes
``runs/<preset>/`` (git-ignored), or ``runs/<preset>/models/<model>/`` for a model other than the preset's own, so a
quick look (a preset, ``--only``, ``-p``) never overwrites the committed report and no model's run replaces
another's. ``output_dir`` (``--output-dir`` on the command line) sends a run anywhere, except into a folder that
holds another model's runs (``runs.json`` records each notebook's model).

What a run leaves. ``<out>/<notebook>/`` holds figures and tables, ``<out>/executed/<notebook>.ipynb`` the
executed notebook and ``.html`` its rendering, ``<out>/runs.json`` what ran with which parameters, and
``<out>/README.md`` + ``index.html`` the index. A notebook is executed into a hidden partial file and
moved into place only when it finishes, so a failed run never replaces a finished executed notebook; the
failed copy is kept beside it as ``<notebook>.failed.ipynb`` for debugging.

Validation. Before the first notebook starts, every notebook's parameters (its defaults, the preset's and
the overrides) are built into its config class (its claim's ``CLAIM.config``), which checks every value and
every input file that can be checked without loading the model.
"""
from __future__ import annotations

import ast
import dataclasses
import datetime
import json as _json
import logging
import os
import shutil
import sys
import tempfile
import textwrap
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import nbformat

from dynheads_tl.claims import all_claims, claim_for
from dynheads_tl.engine.models import DEFAULT_MODEL, EMBEDDED_MODELS
from dynheads_tl.params import check_parameters, field_default
from dynheads_tl.report.findings import readme_has_findings_block, update_readme
from dynheads_tl.report.index import build_index, render_notebook_html
from dynheads_tl.report.rerender import render_site
from dynheads_tl.report.results import MODELS_DIR, model_folder_name, read_runs, write_results
from dynheads_tl.store import atomic_write_text, cache_dir, check_cache_writable, check_writable_folder
from dynheads_tl.report.terminal import ProgressRelay, repeat_heal_warnings, repeat_kernel_log

logger = logging.getLogger(__name__)

COMMITTED_REPORT = Path("papers_figures")  # `dynheads report --committed`'s output, relative to the working directory
RUNS_DIR = Path("runs")  # every other run: runs/<preset>/[models/<model>/] (git-ignored)
# Parameters that choose who computes, not what (results equal to float rounding: a Ray actor's torch thread count
# may differ from the local process's): a run that sets only these is still the preset's own run.
EXECUTION_ONLY = {"backend", "ray_address"}

# Presets every claim may fill in: ``default`` is each config's own defaults, ``smoke`` the smallest run that takes
# every code path (the tests' notebook runs), ``paper`` the paper's grid on its model. Each claim declares its own
# overrides (``Claim.presets``); a claim may add a preset of its own.
BUILTIN_PRESETS = ("default", "smoke", "paper")


def preset_names() -> list[str]:
    """Every preset a run may name: the built-in ones and any a claim declares."""
    return sorted(set(BUILTIN_PRESETS) | {name for claim in all_claims() for name in claim.presets})


def parameters_help(width: int = 100) -> str:
    """``dynheads report --help``'s list of the notebooks (for ``--only``) and of each one's parameters (for ``-p``),
    read from the claims' config classes, where the parameters are declared (the notebooks' parameters cells match
    them: tests/test_runner.py checks)."""
    claims = all_claims()
    names = {claim.notebook: [f.name for f in dataclasses.fields(claim.config)] for claim in claims}
    shared = [name for name in names[claims[0].notebook] if all(name in fields for fields in names.values())]

    def wrapped(label: str, items: list[str]) -> list[str]:
        return textwrap.wrap(", ".join(items), width, initial_indent=f"  {label}: ", subsequent_indent="      ")

    lines = ["notebooks (--only NAME, or a prefix that matches one):"]
    lines += textwrap.wrap(", ".join(names), width, initial_indent="  ", subsequent_indent="  ")
    lines += ["", "parameters (-p name=value; each notebook's defaults are in its parameters cell):"]
    if shared and len(names) > 1:
        lines += wrapped("every notebook", shared)
    for notebook, fields in names.items():
        own = [name for name in fields if name not in shared or len(names) == 1]
        if own:
            lines += wrapped(notebook, own)
    return "\n".join(lines)


def preset_parameters(preset: str, stem: str) -> dict[str, Any]:
    """Notebook ``stem``'s parameter overrides in ``preset`` (its claim's declaration; empty: the defaults)."""
    return claim_for(stem).preset(preset)


def notebook_dir() -> Path:
    """The notebooks: ``dynheads_tl/notebooks`` in an installed package (setuptools copies ``notebooks/``
    there), else the source checkout's ``notebooks/`` (an editable install)."""
    package = Path(__file__).resolve().parent.parent  # dynheads_tl/
    for folder in (package / "notebooks", package.parent / "notebooks"):
        if any(folder.glob("[0-9][0-9]_*.ipynb")):
            return folder
    raise FileNotFoundError(
        f"No notebooks found in {package / 'notebooks'} or {package.parent / 'notebooks'}; the package was "
        "installed without its notebooks. Reinstall it with `pip install -e .` from the repository.")


def list_notebooks(only: str | None = None) -> list[Path]:
    """Every notebook in order, or the one that ``only`` names: an exact stem (``01_dynamism``) or file
    name, or a prefix that matches exactly one notebook (``01``)."""
    notebooks = sorted(notebook_dir().glob("[0-9][0-9]_*.ipynb"))
    if not only:
        return notebooks
    stems = [nb.stem for nb in notebooks]
    exact = [nb for nb in notebooks if only in (nb.stem, nb.name)]
    if exact:
        return exact
    prefixed = [nb for nb in notebooks if nb.stem.startswith(only)]
    if len(prefixed) == 1:
        return prefixed
    if not prefixed:
        raise ValueError(f"No notebook matches {only!r}; notebooks are {stems}.")
    raise ValueError(f"{only!r} matches {len(prefixed)} notebooks ({[nb.stem for nb in prefixed]}); give an exact "
                     f"name or a longer prefix. Notebooks are {stems}.")


def notebook_parameters(notebook: Path) -> dict[str, Any]:
    """The notebook's declared parameters and their defaults as source text (from its 'parameters' cell)."""
    import papermill

    papermill_log = logging.getLogger("papermill")
    level = papermill_log.level
    papermill_log.setLevel(logging.WARNING)  # inspecting is not running: no "Input Notebook:" line per notebook
    try:
        return {name: info["default"] for name, info in papermill.inspect_notebook(str(notebook)).items()}
    finally:
        papermill_log.setLevel(level)


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def config_class(stem: str):
    """The config class that notebook ``stem``'s claim declares (``Claim.config``)."""
    return claim_for(stem).config


def validate_overrides(notebook: Path, parameters: dict[str, Any], declared: dict[str, Any] | None = None) -> None:
    """Unknown names and bad values fail before any model work, with a sentence naming the parameter: each value is
    checked by its field of the notebook's config class (:func:`~dynheads_tl.params.check_parameters`, the checks
    the config runs when it is made). ``declared`` is :func:`notebook_parameters` of the notebook, when the caller
    already has it."""
    declared = notebook_parameters(notebook) if declared is None else declared
    unknown = [name for name in parameters if name not in declared]
    if unknown:
        raise ValueError(f"{notebook.stem} has no parameter {unknown[0]!r}; its parameters are {sorted(declared)}.")
    try:
        check_parameters(config_class(notebook.stem), parameters)
    except ValueError as error:
        raise ValueError(f"{notebook.stem}: {error}") from error


def check_notebook(notebook: Path, parameters: dict[str, Any], declared: dict[str, Any] | None = None):
    """Every value the notebook will see, checked by its config class without loading the model: names,
    types, ranges, input files, and lengths against the model's context window. Returns the config."""
    declared = notebook_parameters(notebook) if declared is None else declared
    validate_overrides(notebook, parameters, declared)
    values = {name: _literal(text) for name, text in declared.items()}
    values.update(parameters)
    try:
        return config_class(notebook.stem).from_params(values)
    except (ValueError, TypeError, FileNotFoundError, ModuleNotFoundError, ConnectionError) as error:
        raise type(error)(f"{notebook.stem}: {error}") from error


def preset_models(preset: str) -> dict[str, str]:
    """Notebook stem -> the model a run of ``preset`` gives it when the run names none: the preset's own (``paper``:
    Llama-3.1-8B-Instruct, for every notebook but 00) or the notebook's default (the embedded SmolLM2-135M)."""
    found = {}
    for claim in all_claims():
        own = {f.name: field_default(f) for f in dataclasses.fields(claim.config)}.get("model", DEFAULT_MODEL)
        found[claim.notebook] = str(claim.preset(preset).get("model") or own or DEFAULT_MODEL)
    return found


def run_models(preset: str, model: str | None) -> dict[str, str]:
    """Notebook stem -> the model a run of ``preset`` gives it, with ``model`` (``--model`` or ``-p model=``) when
    one is named."""
    return {stem: str(model) if model else own for stem, own in preset_models(preset).items()}


def run_folder_name(model: str) -> str:
    """A model as the name of its runs' folder under ``models/``: :func:`~dynheads_tl.report.results.model_folder_name`
    of a model name or hub id (``google/gemma-3-270m`` -> ``google--gemma-3-270m``), the folder's own name for a
    local model folder."""
    text = str(model).strip()
    path = Path(text).expanduser()
    if text.startswith(("/", "./", "../", "~")) or (os.sep in text and path.is_dir()):
        text = path.resolve().name
    try:
        return model_folder_name(text)
    except ValueError as error:
        raise ValueError(f"{error} Or name the output folder with --output-dir.") from None


def output_dir_for(preset: str, model: str | None, overrides: dict[str, Any]) -> Path:
    """Where a run goes when no ``output_dir`` is given: always a git-ignored folder under ``runs/``
    (:func:`default_output_dir`), one per preset and model, so that no model's run replaces another's. ``model`` is
    ``--model``, else ``-p model=`` in ``overrides``; other overrides (``-p``, ``--device``) and ``--only`` keep
    the folder. The committed report, ``papers_figures/``, is written only by ``dynheads report --committed``
    (:func:`run_committed_report`, which names each of its folders: :func:`committed_plan`) or by a run that names it
    with ``--output-dir``."""
    named = model if model is not None else overrides.get("model")
    return default_output_dir(preset, str(named) if named else None)


def default_output_dir(preset: str, model: str | None = None) -> Path:
    """``runs/<preset>/`` for a run of the preset's own models (``model`` None, or the one model every notebook of the
    preset runs anyway); ``runs/<preset>/models/<model>/`` for another model, a report of its own, as the committed
    report nests ``models/<model>/``."""
    folder = RUNS_DIR / preset
    if model is None or set(preset_models(preset).values()) == {str(model)}:
        return folder
    return folder / MODELS_DIR / run_folder_name(model)


def other_model_runs(output_dir: Path, preset: str, model: str | None) -> dict[str, str]:
    """Notebook stem -> the model recorded in ``<output_dir>/runs.json`` for it, for each run there of another model
    than a run of ``preset`` with ``model`` (:func:`run_models`) gives that notebook: what such a run would replace,
    or mix with in one index."""
    expected = run_models(preset, model)
    found = {}
    for stem, record in read_runs(output_dir).items():
        recorded = record.get("model") if isinstance(record, dict) else None
        if recorded and str(recorded) != expected.get(stem, str(model or DEFAULT_MODEL)):
            found[stem] = str(recorded)
    return found


def refuse_other_models(output_dir: Path, preset: str, model: str | None, shown: str, named: bool) -> None:
    """A ValueError when ``output_dir`` holds runs of another model (:func:`other_model_runs`); ``named``: whether the
    user named the folder (``--output-dir``), which the sentence's advice follows."""
    others = other_model_runs(output_dir, preset, model)
    if not others:
        return
    models = sorted(set(run_models(preset, model).values()))
    held = ", ".join(f"{stem} on {recorded}" for stem, recorded in sorted(others.items()))
    advice = (f"name another folder with --output-dir, or leave it out: this run's own folder is "
              f"{default_output_dir(preset, model).as_posix()}/" if named else
              "move that folder away (an earlier version put every model's runs of a preset in one folder), or name "
              "another with --output-dir")
    raise ValueError(f"The output folder {shown} holds runs of another model ({held}); this run is of "
                     f"{', '.join(models)}, and would replace them or mix two models in one index. Nothing was run; "
                     f"{advice}.")


def _shown_path(path: Path, cwd: Path) -> str:
    """``path`` relative to ``cwd`` when it lies inside it (what notebooks and records store, so the
    committed report holds no path of the machine that made it), else absolute."""
    path = (cwd / path).resolve()
    try:
        return path.relative_to(cwd.resolve()).as_posix()
    except ValueError:
        return str(path)


@contextmanager
def _environment(**values: str) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _relocate(executed: Path, notebook: Path, shown_output: str, cwd: Path) -> None:
    """Record the notebook's own paths relative to the working directory (papermill writes absolute ones)."""
    nb = nbformat.read(executed, as_version=4)
    meta = nb.metadata.setdefault("papermill", {})
    meta["input_path"] = _shown_path(notebook, cwd) if notebook.is_relative_to(cwd.resolve()) else f"notebooks/{notebook.name}"
    meta["output_path"] = shown_output
    nbformat.write(nb, executed)


def cache_entries() -> int:
    """How many entries the cache holds (traces and results): what a notebook's run found and left, for
    :func:`_eta` to tell a run that will compute from one that will read the cache."""
    count = 0
    for sub in ("traces", "results"):
        try:
            count += sum(1 for entry in os.scandir(cache_dir() / sub)
                         if entry.name.endswith((".pt", ".json")) and not entry.name.startswith("."))
        except OSError:
            pass
    return count


def _eta(runs: dict[str, Any], remaining: list[str], preset: str, model: str, entries: int) -> str:
    """Minutes left by the last run of the same preset and model, when every remaining notebook has one made in the
    same cache state as now. A run recorded whether it computed anything (``computed``) and how many entries the
    cache held after it (``cache_entries``): while the cache holds at least that many (``entries``), a new run
    reads what that run computed, so only a run that computed nothing predicts it; on a cache emptied since, only
    a run that computed does. Without a matching run for every notebook, no estimate (a warm rerun would
    otherwise quote a cold run's minutes)."""
    previous = [runs.get(stem, {}) for stem in remaining]

    def same_state(run: dict[str, Any]) -> bool:
        if not isinstance(run.get("computed"), bool) or not isinstance(run.get("cache_entries"), int):
            return False
        return run["computed"] == (entries < run["cache_entries"])

    if all(r.get("preset") == preset and r.get("model") == model and isinstance(r.get("minutes"), (int, float))
           and same_state(r) for r in previous):
        return f"; about {sum(r['minutes'] for r in previous):.0f} min left by the last {preset} run's times"
    return ""


@contextmanager
def notebook_lock(path: Path, what: str) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (POSIX ``flock``: released when the process ends, even when it is
    killed). When another run holds it, say so on the terminal and wait for it."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: concurrent runs are not serialised
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            print(f"Waiting: {holder} is running {what}; this run continues when it finishes and reads what it "
                  "computed from the cache (Ctrl-C to stop waiting).", flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        handle.truncate()
        handle.write(f"a dynheads run (pid {os.getpid()}, since {datetime.datetime.now():%Y-%m-%d %H:%M})")
        handle.flush()
        try:
            yield
        finally:
            handle.seek(0)
            handle.truncate()
            fcntl.flock(handle, fcntl.LOCK_UN)


# Each kernel's sockets and connection file live in a folder of its own, made when the kernel starts and removed when
# it is shut down: ``<temp>/dynheads-kernel-<pid>-<random>/`` (the pid of the run that made it, so that a later run
# can remove what a killed one left). jupyter_client's default names the sockets ``kernel-ipc-1`` … in the working
# folder, where two runs that start a kernel within the same second take the same names (issue #65).
KERNEL_FOLDER_PREFIX = "dynheads-kernel-"
_SOCKET_PATH_LIMIT = 100  # a Unix socket's path holds at most 107 bytes (104 on macOS); sockets are <folder>/kernel-N


def _kernel_folder_base() -> str:
    """The system's temporary folder, or ``/tmp`` where that is too long a path for a socket in it."""
    base = tempfile.gettempdir()
    longest = len(os.path.join(base, f"{KERNEL_FOLDER_PREFIX}{2**22}-{'x' * 8}", "kernel-99"))
    if longest > _SOCKET_PATH_LIMIT and os.path.isdir("/tmp") and os.access("/tmp", os.W_OK | os.X_OK):
        return "/tmp"
    return base


def _uid() -> int | None:
    return os.getuid() if hasattr(os, "getuid") else None


def _process_is_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # PermissionError: another user's process, alive
        return False
    return False


def remove_stale_kernel_folders(base: str | None = None) -> list[str]:
    """Remove the kernel folders that runs which are no longer running left (a run killed with SIGKILL cannot remove
    its own): this user's ``dynheads-kernel-<pid>-*`` folders whose pid is gone. Returns their paths."""
    base = base or _kernel_folder_base()
    removed = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    for entry in entries:
        pid = entry.name[len(KERNEL_FOLDER_PREFIX):].partition("-")[0]
        if not (entry.name.startswith(KERNEL_FOLDER_PREFIX) and pid.isdigit()):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != _uid():
                continue
        except OSError:
            continue
        if int(pid) != os.getpid() and _process_is_gone(int(pid)):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
    return removed


def make_kernel_folder() -> str:
    """A new private folder (mode 0700) for one kernel's sockets and connection file; earlier runs' leftovers are
    removed first (:func:`remove_stale_kernel_folders`)."""
    base = _kernel_folder_base()
    remove_stale_kernel_folders(base)
    return tempfile.mkdtemp(prefix=f"{KERNEL_FOLDER_PREFIX}{os.getpid()}-", dir=base)


def ipc_kernel_manager(stderr=None):
    """The kernel manager the notebooks run under: jupyter_client's, on IPC (Unix domain sockets) instead of TCP on
    localhost. The kernel is local either way; over TCP without encryption ipykernel 7 prints a warning about
    plain-text traffic into every run's log, and a local socket needs no port.

    Each kernel's sockets (``kernel-1`` … ``kernel-5``) and connection file (``kernel.json``, with the key that signs
    its messages) are in a private folder of its own (:func:`make_kernel_folder`), made when the kernel starts, kept
    across an automatic restart and removed when it is shut down; the class's ``remove_kernel_folders()`` removes
    those of every kernel it started (the runner calls it after each notebook, also after a failure or Ctrl-C). Two
    runs started together from one checkout therefore never share a socket, and nothing is written into the working
    folder (jupyter_client's default for IPC is ``kernel-ipc-N`` there).

    ``stderr``: a file the kernel process's own stderr goes to instead of the terminal (what the kernel application
    logs itself; a cell's output goes to the notebook either way). The runner passes one per notebook and repeats it
    after the notebook, unless the run was interrupted: a kernel stopped mid-cell logs a traceback of its closed
    sockets, which is not the user's business."""
    from jupyter_client.manager import AsyncKernelManager

    folders: list[str] = []

    class IPCKernelManager(AsyncKernelManager):
        kernel_folder: str | None = None

        def __init__(self, **kwargs):
            kwargs.setdefault("transport", "ipc")
            super().__init__(**kwargs)

        async def _async_pre_start_kernel(self, **kw):
            if self.transport == "ipc" and self.kernel_folder is None:  # a restart keeps its folder
                self.kernel_folder = make_kernel_folder()
                folders.append(self.kernel_folder)
                self.ip = os.path.join(self.kernel_folder, "kernel")
                self.connection_file = os.path.join(self.kernel_folder, "kernel.json")
            return await super()._async_pre_start_kernel(**kw)

        async def _async_launch_kernel(self, kernel_cmd, **kw):
            if stderr is not None:
                kw.setdefault("stderr", stderr)
            return await super()._async_launch_kernel(kernel_cmd, **kw)

        async def _async_cleanup_resources(self, restart: bool = False) -> None:
            try:
                await super()._async_cleanup_resources(restart=restart)
            finally:
                if not restart and self.kernel_folder is not None:
                    shutil.rmtree(self.kernel_folder, ignore_errors=True)
                    self.kernel_folder = None

        cleanup_resources = _async_cleanup_resources

        @staticmethod
        def remove_kernel_folders() -> None:
            while folders:
                shutil.rmtree(folders.pop(), ignore_errors=True)

    return IPCKernelManager


class KernelError(RuntimeError):
    """A notebook's kernel did not start, did not answer or died: what happened and what to do, in one paragraph."""


def _kernel_failure(error: BaseException, stem: str, logged: bool) -> KernelError | None:
    """The :class:`KernelError` that explains ``error``, when it is a kernel's failure to start, to answer or to
    stay alive (not a cell's error, which papermill reports as :class:`papermill.PapermillExecutionError`)."""
    from nbclient.exceptions import DeadKernelError

    text = str(error)
    log = (f"its own log is above (the lines \"{stem} kernel: …\")" if logged
           else "it wrote nothing on its own stderr")
    retry = ("Run the same command again: finished traces and ablation runs are cached, so it resumes from where it "
             "stopped.")
    check = (f"check that the kernel can start in this environment: `{sys.executable} -m ipykernel_launcher "
             "--version` prints a version, and `jupyter kernelspec list` shows no python3 kernel of another "
             "environment")
    if isinstance(error, DeadKernelError) or (text.startswith("Kernel died") and "before replying" not in text):
        return KernelError(
            f"{stem}: the notebook's kernel died while it ran ({type(error).__name__}: {text}); {log}. A kernel dies "
            "without a Python error when the system stops it, most often for lack of memory (look for the out-of-"
            f"memory killer in `dmesg` or the system log); close other programs or use smaller parameters. {retry}")
    if isinstance(error, RuntimeError) and text.startswith("Kernel didn't respond"):
        return KernelError(
            f"{stem}: the notebook's kernel did not answer in time after it was started ({type(error).__name__}: "
            f"{text}); {log}. Most likely the machine is overloaded: other runs or programs hold its cores or memory, "
            f"so a new Python process takes longer than that to import its libraries. {retry} If it fails again on "
            f"an idle machine, {check}.")
    if isinstance(error, RuntimeError) and "before replying" in text:
        which = "; its log says which" if logged else ""
        return KernelError(
            f"{stem}: the notebook's kernel exited before it answered ({type(error).__name__}: {text}); {log}. "
            f"Most likely it cannot start in this environment (a missing or broken package{which}), or the system "
            f"stopped it for lack of memory. {check[0].upper()}{check[1:]}, then run the same command "
            "again: finished traces and ablation runs are cached, so it resumes from where it stopped.")
    return None


def run_report(*, preset: str = "default", model: str | None = None, only: str | None = None,
               overrides: dict[str, Any] | None = None, output_dir: str | Path | None = None,
               cwd: str | Path | None = None, show_cells: bool = True) -> list[Path]:
    """Execute the notebooks in order; stop at the first failure (papermill's error names the cell).

    ``output_dir`` defaults to :func:`output_dir_for` (a folder under ``runs/``); a relative one is taken from
    ``cwd`` (the working directory by default), where the notebooks also run. ``overrides`` may carry ``output_dir``
    too, which means the same as the argument. Every notebook's parameters are checked (see
    :func:`check_notebook`) before the first one starts. Each finished run is recorded in ``runs.json``
    and the index is rebuilt at the end, also after a failure.
    """
    import papermill

    if preset not in preset_names():
        raise ValueError(f"Unknown preset {preset!r}; presets are {preset_names()}.")
    overrides = dict(overrides or {})
    if "output_dir" in overrides:
        asked = overrides.pop("output_dir")
        if output_dir is not None and Path(str(asked)) != Path(output_dir):
            raise ValueError(f"output_dir is given twice with different values ({str(asked)!r} and {str(output_dir)!r}); "
                             "give it once, with --output-dir.")
        output_dir = str(asked)
    if model is not None:
        if not (isinstance(model, str) and model.strip()):
            raise ValueError(f"--model is {model!r}; name a model (an embedded name, a paper alias, a local Hugging "
                             "Face folder or a hub id), or leave --model out for each notebook's own.")
        if "model" in overrides and overrides["model"] != model:
            raise ValueError(f"model is given twice with different values (--model {model!r} and -p "
                             f"model={overrides['model']!r}); give it once.")
    cwd = Path(cwd or os.getcwd()).resolve()
    named = output_dir is not None
    if output_dir is None:
        output_dir = output_dir_for(preset, model, overrides)
    output_dir = Path(output_dir)
    output_dir = output_dir if output_dir.is_absolute() else cwd / output_dir
    shown_output = _shown_path(output_dir, cwd)

    # Folders first: a run that cannot write its results is refused before any notebook is checked or started, and so
    # is a run into a folder that holds another model's runs (runs.json records each notebook's model).
    for folder in (output_dir, output_dir / "executed"):
        check_writable_folder(folder, "output folder", "choose another with --output-dir")
    refuse_other_models(output_dir, preset, model if model is not None else overrides.get("model"), shown_output, named)
    check_cache_writable()
    notebooks = list_notebooks(only)
    if not notebooks:
        raise FileNotFoundError(f"No notebooks found in {notebook_dir()}.")
    declared = {notebook: notebook_parameters(notebook) for notebook in notebooks}
    known = {name for names in declared.values() for name in names}
    unused = set(overrides) - known
    if unused:
        raise ValueError(f"No notebook has the parameter(s) {sorted(unused)}; the parameters are {sorted(known)}.")
    plans = []
    for notebook in notebooks:
        parameters = preset_parameters(preset, notebook.stem)
        if model is not None:
            parameters["model"] = model
        parameters.update({k: v for k, v in overrides.items() if k in declared[notebook]})
        parameters["output_dir"] = shown_output
        check_notebook(notebook, parameters, declared[notebook])
        plans.append((notebook, parameters))

    executed_dir = output_dir / "executed"
    executed_dir.mkdir(parents=True, exist_ok=True)
    runs_path = output_dir / "runs.json"
    runs = read_runs(output_dir)
    done, started = [], time.time()
    try:
        for i, (notebook, parameters) in enumerate(plans, 1):
            eta = _eta(runs, [nb.stem for nb, _ in plans[i - 1:]], preset, parameters.get("model", DEFAULT_MODEL),
                       cache_entries())
            print(f"[{i}/{len(plans)}] {notebook.stem} (preset {preset}, output {shown_output}; "
                  f"{(time.time() - started) / 60:.1f} min so far{eta})", flush=True)
            final = executed_dir / notebook.name
            partial = executed_dir / f".{notebook.stem}.partial.ipynb"
            failed = executed_dir / f"{notebook.stem}.failed.ipynb"
            shown_final = _shown_path(final, cwd)
            # One run at a time per notebook on one cache and on one output folder: a second run waits, then reads
            # what the first computed from the cache, and no two runs write one partial notebook.
            with notebook_lock(cache_dir() / "locks" / f"{notebook.stem}.lock", f"{notebook.stem} on the cache "
                               f"{cache_dir()}"), \
                    notebook_lock(executed_dir / f".{notebook.stem}.lock", f"{notebook.stem} into {shown_output}"):
                if partial.exists():  # nobody else holds the lock, so a killed run left it
                    partial.unlink()
                    print(f"Removed {_shown_path(partial, cwd)}, left by an earlier run that was stopped.", flush=True)
                t0, entries_before = time.time(), cache_entries()
                kernel_log = tempfile.TemporaryFile()
                kernel_manager = ipc_kernel_manager(kernel_log)
                try:
                    # No progress lines, and no library bars (transformers' "Loading weights"), in the notebooks:
                    # they are read as a report. Their progress goes to a file the runner prints on the terminal.
                    with ProgressRelay(notebook.stem) as relay, _environment(
                            DYNHEADS_PROGRESS="file", DYNHEADS_PROGRESS_FILE=relay.path, HF_HUB_DISABLE_PROGRESS_BARS="1"):
                        papermill.execute_notebook(str(notebook), str(partial), parameters=parameters, cwd=str(cwd),
                                                   progress_bar=show_cells, kernel_name="python3",
                                                   kernel_manager_class=kernel_manager)
                except BaseException as error:
                    failure = None
                    if not isinstance(error, KeyboardInterrupt):
                        repeat_kernel_log(kernel_log, notebook.stem)
                        kernel_log.seek(0)
                        failure = _kernel_failure(error, notebook.stem, logged=bool(kernel_log.read().strip()))
                    kernel_log.close()
                    if partial.exists():
                        _relocate(partial, notebook, _shown_path(failed, cwd), cwd)
                        partial.replace(failed)
                        repeat_heal_warnings(failed)
                        what = "interrupted" if isinstance(error, KeyboardInterrupt) else "failed"
                        kept = (f"the finished {shown_final} of an earlier run was left as it was" if final.exists()
                                else f"there is no finished {shown_final} yet")
                        print(f"The {what} run is kept in {_shown_path(failed, cwd)}; {kept}.", flush=True)
                    if failure is not None:
                        raise failure from error
                    raise
                finally:  # the kernel's private folder, also when it was not shut down (Ctrl-C, a failed start)
                    getattr(kernel_manager, "remove_kernel_folders", lambda: None)()
                repeat_kernel_log(kernel_log, notebook.stem)
                kernel_log.close()
                _relocate(partial, notebook, shown_final, cwd)
                partial.replace(final)
            failed.unlink(missing_ok=True)
            repeat_heal_warnings(final)
            render_notebook_html(final)
            record = {"model": parameters.get("model", DEFAULT_MODEL), "preset": preset,
                      "parameters": {k: v for k, v in parameters.items() if k != "output_dir"},
                      "date": datetime.date.today().isoformat(), "minutes": round((time.time() - t0) / 60, 1),
                      "computed": cache_entries() > entries_before, "cache_entries": cache_entries()}
            # Another run may write into the same folder meanwhile (another notebook, `--only`): the file is read
            # again under a lock and only this notebook's entry replaced, so no run drops another's record.
            with notebook_lock(executed_dir / ".runs.lock", f"runs.json of {shown_output}"):
                runs = {**read_runs(output_dir), notebook.stem: record}
                atomic_write_text(runs_path, _json.dumps(runs, indent=1, sort_keys=True, default=str) + "\n")
            write_results(output_dir, [notebook.stem])  # <folder>/verdicts.json, from the files it wrote
            done.append(final)
    finally:
        render_site(output_dir)  # every page (their previous / next links) and the index
    print(f"Report done in {(time.time() - started) / 60:.1f} min: {len(done)} notebook(s) in "
          f"{_shown_path(executed_dir, cwd)}; index: {_shown_path(output_dir / 'index.html', cwd)}", flush=True)
    return done


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """One :func:`run_report` call of :func:`committed_plan`: ``model`` None is each notebook's own (the default
    model), ``only`` None every notebook, ``output_dir`` its folder of the committed report."""

    preset: str
    model: str | None = None
    only: str | None = None
    output_dir: Path | None = None


def committed_plan(models: list[str] | None = None) -> list[PlannedRun]:
    """The runs that regenerate the whole committed report, in order: every embedded model's default report (the
    default model's in ``papers_figures/``, each other's in ``papers_figures/models/<model>/``), then each claim's
    committed presets (``Claim.committed``: the ``long`` preset of notebooks 01, 03, 05, 06 and 07) on every model, into
    ``papers_figures/<preset>/`` and ``papers_figures/<preset>/models/<model>/``."""
    models = list(models) if models else [DEFAULT_MODEL] + sorted(set(EMBEDDED_MODELS) - {DEFAULT_MODEL})
    own = [None if model == DEFAULT_MODEL else model for model in models]

    def folder(report: Path, model: str | None) -> Path:
        return report if model is None else report / MODELS_DIR / model_folder_name(model)

    # Each folder named: a run that names none writes runs/ (output_dir_for), never the committed report.
    plan = [PlannedRun("default", model, None, folder(COMMITTED_REPORT, model)) for model in own]
    for claim in all_claims():
        for preset in claim.committed:
            for model in own:
                plan.append(PlannedRun(preset, model, claim.notebook, folder(COMMITTED_REPORT / preset, model)))
    return plan


def run_committed_report(*, models: list[str] | None = None, overrides: dict[str, Any] | None = None,
                         cwd: str | Path | None = None, readme: str | Path = "README.md") -> list[Path]:
    """Regenerate the whole committed report (:func:`committed_plan`), then its top index and the findings block
    of ``readme`` (relative to ``cwd``; skipped when it lacks either findings marker, which is checked first).
    ``overrides`` may only choose who computes (:data:`EXECUTION_ONLY`), since anything else would change what the
    committed report says. Each run reads what an interrupted earlier one cached, so the same command resumes."""
    overrides = dict(overrides or {})
    changing = sorted(set(overrides) - EXECUTION_ONLY)
    if changing:
        raise ValueError(f"The committed report is regenerated as declared; {changing} would change what it says. "
                         "Run a single report with --preset/-p instead (it writes runs/<preset>/).")
    cwd = Path(cwd or os.getcwd()).resolve()
    path = cwd / readme
    # Checked before hours of runs: a README without both markers would fail only at the end.
    has_findings = path.exists() and readme_has_findings_block(path.read_text(encoding="utf-8"))
    plan = committed_plan(models)
    done = []
    for i, planned in enumerate(plan, 1):
        what = f"{planned.preset} preset, {planned.model or DEFAULT_MODEL}" + (f", {planned.only}" if planned.only else "")
        print(f"=== committed report, run {i}/{len(plan)}: {what}", flush=True)
        done += run_report(preset=planned.preset, model=planned.model, only=planned.only, overrides=overrides,
                           output_dir=planned.output_dir, cwd=cwd)
    report = cwd / COMMITTED_REPORT
    # The default model's run rendered its pages, and each other model's run rebuilt the top index; the preset runs
    # rebuilt their own indexes, so only the top index (which lists the presets) is left.
    build_index(report)
    if has_findings:
        prefix = Path(os.path.relpath(report, path.resolve().parent)).as_posix()
        update_readme(path, report, link_prefix=f"{prefix}/")
    return done
