"""Re-render a report from what its runs left, without running a model::

    python -m dynheads_tl.report.rerender papers_figures                      # pages + index
    python -m dynheads_tl.report.rerender papers_figures --results            # + each folder's verdicts.json
    python -m dynheads_tl.report.rerender papers_figures --results --readme README.md   # + the README's answer and findings.md

``--results`` recomputes every notebook folder's ``verdicts.json`` from the CSVs it holds, by the claims' own
functions (the ones the notebooks call), under the current ``preregistration.yaml``; without it a missing file is
computed in memory and a present one is read as it is. Each model's report under ``models/<model>/`` is re-rendered
too, and so is each preset's report kept beside the default one (``<preset>/``, with its own models); the top index
lists every model and every preset.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Iterable

from dynheads_tl.report.findings import update_readme
from dynheads_tl.report.index import build_index
from dynheads_tl.report.results import MODELS_DIR, model_reports, preset_reports, read_runs, write_results
from dynheads_tl.report.site import notebook_order, render_page, run_meta


def _pages(output_dir: Path, notebooks: Iterable[str] | None) -> list[Path]:
    meta = run_meta(read_runs(output_dir))
    chosen = set(notebooks) if notebooks is not None else None
    return [render_page(output_dir / "executed" / f"{stem}.ipynb", output_dir, meta=meta)
            for stem in notebook_order(output_dir) if chosen is None or stem in chosen]


def render_site(output_dir: Path, notebooks: Iterable[str] | None = None, *, results: bool = False) -> list[Path]:
    """Render every executed notebook of ``output_dir`` (or those named) as a page, then the index; with
    ``results``, first recompute each notebook folder's ``verdicts.json``. A model's report under
    ``<report>/models/<model>/`` also rebuilds the index of ``<report>``, which lists every model."""
    output_dir = Path(output_dir)
    if results:
        write_results(output_dir, list(notebooks) if notebooks is not None else None)
    pages = _pages(output_dir, notebooks)
    build_index(output_dir)
    if output_dir.parent.name == MODELS_DIR and (output_dir.parent.parent / "runs.json").exists():
        build_index(output_dir.parent.parent)
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
    pages = []
    # every preset report's models and its own index, every other model's report, then this one (its index lists them)
    for folder in [preset.folder for preset in preset_reports(output_dir)] + [output_dir]:
        for report in model_reports(folder)[1:]:
            pages += render_site(report.folder, results=args.results)
        pages += render_site(folder, results=args.results)
    print(f"Rendered {len(pages)} page(s) and the index in {args.output_dir}"
          + (" after recomputing every verdicts.json." if args.results else "."))
    if args.readme:
        prefix = Path(os.path.relpath(output_dir.resolve(), Path(args.readme).resolve().parent)).as_posix()
        changed = update_readme(Path(args.readme), output_dir, link_prefix=f"{prefix}/")
        print(f"{args.readme}: answer and findings {'updated' if changed else 'already current'}.")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
