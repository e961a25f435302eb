"""The batch runner: every notebook in order through papermill, with presets and overrides.

Where outputs go (relative to the working directory). Only ``dynheads report --committed`` writes the committed
report, ``papers_figures/`` (:mod:`dynheads_tl.report.committed`, naming each of its folders). Every other run writes
``runs/<preset>/<model>/`` (git-ignored; ``runs/<preset>/`` and ``runs/`` get the indexes that list them, as the
committed report's preset folders and root do), so a quick look (a preset, ``--only``, ``-p``) never overwrites the
committed report and no model's run replaces another's. ``output_dir`` (``--output-dir`` on the command line) sends a
run anywhere, except into a folder that holds another model's runs (``runs.json`` records each notebook's model).

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
import tempfile
import textwrap
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import nbformat

from dynheads_tl.claims import all_claims, claim_for
from dynheads_tl.engine.models import DEFAULT_MODEL
from dynheads_tl.params import check_parameters
from dynheads_tl.report.index import build_index, render_notebook_html
from dynheads_tl.report.rerender import render_site
from dynheads_tl.report.results import (BUILTIN_PRESETS, preset_names, preset_reports,  # noqa: F401
                                        read_runs, write_results)
from dynheads_tl.verdicts import begin_outputs, end_outputs
from dynheads_tl.store import atomic_write_text, cache_dir, check_cache_writable, check_writable_folder
from dynheads_tl.report.terminal import ProgressRelay, repeat_heal_warnings, repeat_kernel_log
from dynheads_tl.report.folders import (RUNS_DIR, default_output_dir, other_model_runs, output_dir_for,  # noqa: F401
                                        preset_models, preset_notebooks, refuse_other_models, run_folder_name,
                                        run_models)
from dynheads_tl.report.kernels import (KERNEL_FOLDER_PREFIX, KernelError, _kernel_failure,  # noqa: F401
                                        _kernel_folder_base, ipc_kernel_manager, make_kernel_folder,
                                        remove_stale_kernel_folders)

logger = logging.getLogger(__name__)

# Parameters that choose who computes, not what (results equal to float rounding: a Ray actor's torch thread count
# may differ from the local process's): a run that sets only these is still the preset's own run.
EXECUTION_ONLY = {"backend", "ray_address"}
# papermill's bar counts cells: cells take seconds to an hour each, so a rate and an ETA from them mean nothing (the
# runner's own "[i/n] … min so far, about … left" line and the progress relay say how far the work is). The bar keeps
# the cell count and the time spent.
CELL_BAR = {"desc": "cells", "bar_format": "{desc}: {n_fmt}/{total_fmt} [{elapsed} so far]"}

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
    notebooks, left_out = preset_notebooks(preset, notebooks, named=bool(only))
    if left_out:  # a focused preset: long, scale
        print(f"The {preset} preset leaves out {', '.join(nb.stem for nb in left_out)} (no {preset} setting).", flush=True)
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
                earlier_outputs = begin_outputs(output_dir / notebook.stem)  # the run records only what it writes
                kernel_log = tempfile.TemporaryFile()
                kernel_manager = ipc_kernel_manager(kernel_log)
                try:
                    # No progress lines, and no library bars (transformers' "Loading weights"), in the notebooks:
                    # they are read as a report. Their progress goes to a file the runner prints on the terminal.
                    with ProgressRelay(notebook.stem) as relay, _environment(
                            DYNHEADS_PROGRESS="file", DYNHEADS_PROGRESS_FILE=relay.path, HF_HUB_DISABLE_PROGRESS_BARS="1"):
                        papermill.execute_notebook(str(notebook), str(partial), parameters=parameters, cwd=str(cwd),
                                                   progress_bar=CELL_BAR if show_cells else False, kernel_name="python3",
                                                   kernel_manager_class=kernel_manager)
                except BaseException as error:
                    failure = None
                    if not isinstance(error, KeyboardInterrupt):
                        repeat_kernel_log(kernel_log, notebook.stem)
                        kernel_log.seek(0)
                        failure = _kernel_failure(error, notebook.stem, logged=bool(kernel_log.read().strip()))
                    kernel_log.close()
                    end_outputs(output_dir / notebook.stem, earlier_outputs, finished=False)
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
                removed = end_outputs(output_dir / notebook.stem, earlier_outputs, finished=True, since=t0)
                if removed:
                    print(f"Removed {len(removed)} output(s) of an earlier run that this run did not write: "
                          f"{', '.join(removed)}.", flush=True)
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
        if not named and (output_dir / "runs.json").is_file():  # runs/<preset>/ and runs/ list every run, as the
            # committed report's preset folders and root do: made here where missing, rebuilt by render_site
            for holder in (output_dir.parent, output_dir.parent.parent):
                if not (holder / "index.html").is_file():
                    build_index(holder)
        render_site(output_dir)  # every page (their previous / next links), the index, then the indexes listing it
    print(f"Report done in {(time.time() - started) / 60:.1f} min: {len(done)} notebook(s) in "
          f"{_shown_path(executed_dir, cwd)}; index: {_shown_path(output_dir / 'index.html', cwd)}"
          + ("" if named else f" (every run: {_shown_path(output_dir.parent.parent / 'index.html', cwd)})"), flush=True)
    return done
