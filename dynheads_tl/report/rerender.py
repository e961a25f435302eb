"""Re-render a report from what its runs left, without running a model::

    python -m dynheads_tl.report.rerender papers_figures                      # pages + index
    python -m dynheads_tl.report.rerender papers_figures --results            # + each folder's verdicts.json
    python -m dynheads_tl.report.rerender papers_figures --results --readme README.md   # + the README's answer and findings.md

``--results`` recomputes every notebook folder's ``verdicts.json`` from the CSVs it holds, by the claims' own
functions (the ones the notebooks call), under the current ``preregistration.yaml``; without it a missing file is
computed in memory and a present one is read as it is. Every model's report of every preset (``<preset>/<model>/``)
is re-rendered, with each preset's index and the top index, which lists every preset and model.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Iterable

from dynheads_tl.report.findings import update_readme
from dynheads_tl.report.index import build_index
from dynheads_tl.report.legend import enclosing_reports
from dynheads_tl.report.results import is_model_report, model_reports, preset_reports, read_runs, write_results
from dynheads_tl.report.site import notebook_order, render_page, run_meta


def _pages(output_dir: Path, notebooks: Iterable[str] | None) -> list[Path]:
    meta = run_meta(read_runs(output_dir))
    chosen = set(notebooks) if notebooks is not None else None
    return [render_page(output_dir / "executed" / f"{stem}.ipynb", output_dir, meta=meta)
            for stem in notebook_order(output_dir) if chosen is None or stem in chosen]


def render_site(output_dir: Path, notebooks: Iterable[str] | None = None, *, results: bool = False) -> list[Path]:
    """Render every executed notebook of ``output_dir`` (or those named) as a page, then the index; with
    ``results``, first recompute each notebook folder's ``verdicts.json``. The indexes that list it (its preset's
    folder, the report's root: :func:`~dynheads_tl.report.legend.enclosing_reports`, where they exist) are rebuilt
    after it, innermost first."""
    output_dir = Path(output_dir)
    if results:
        write_results(output_dir, list(notebooks) if notebooks is not None else None)
    pages = _pages(output_dir, notebooks)
    build_index(output_dir)
    for _, holder in reversed(enclosing_reports(output_dir)):
        build_index(holder)
    return pages


def render_report(output_dir: Path, *, results: bool = False) -> list[Path]:
    """Re-render a whole report: (with ``results``, every model's ``verdicts.json`` first,) the root's index, each
    preset's, then every model's report of every preset (``<preset>/<model>/``: pages and index, which link up to the
    indexes built before them); for a folder that is one model's report, that report. Returns the pages written."""
    output_dir = Path(output_dir)
    if is_model_report(output_dir):
        return render_site(output_dir, results=results)
    presets = preset_reports(output_dir)
    reports = [report for preset in presets for report in model_reports(preset.folder)]
    if results:
        for report in reports:
            write_results(report.folder)
    build_index(output_dir)
    for preset in presets:
        build_index(preset.folder)
    pages = []
    for report in reports:
        pages += _pages(report.folder, None)
        build_index(report.folder)
    return pages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dynheads_tl.report.rerender",
        description="Re-render a report's pages and index from its executed notebooks and files (no model is run).")
    parser.add_argument("output_dir", nargs="?", default="papers_figures", help="the report folder (default: papers_figures)")
    parser.add_argument("--results", action="store_true",
                        help="recompute each notebook folder's verdicts.json from its CSVs first")
    parser.add_argument("--readme", default=None, help="also refresh this README's answer table and figure, and the report's findings.md")
    args = parser.parse_args(argv)
    output_dir = Path(args.output_dir)
    pages = render_report(output_dir, results=args.results)
    print(f"Rendered {len(pages)} page(s) and the index in {args.output_dir}"
          + (" after recomputing every verdicts.json." if args.results else "."))
    if args.readme:
        prefix = Path(os.path.relpath(output_dir.resolve(), Path(args.readme).resolve().parent)).as_posix()
        changed = update_readme(Path(args.readme), output_dir, link_prefix=f"{prefix}/")
        print(f"{args.readme}: answer and findings {'updated' if changed else 'already current'}.")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
