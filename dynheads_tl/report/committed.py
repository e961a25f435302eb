"""The committed report: which runs regenerate ``papers_figures/`` (:func:`committed_plan`) and the one command that
runs them, then re-renders the indexes, the findings page and the README's answer (:func:`run_committed_report`,
``dynheads report --committed``, ``make report-all``). The only writer of the committed report; every other run
writes ``runs/<preset>/<model>/`` or the folder it names (:mod:`dynheads_tl.report.runner`)."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from dynheads_tl.claims import all_claims
from dynheads_tl.engine.models import DEFAULT_MODEL, EMBEDDED_MODELS, embedded_installed
from dynheads_tl.report.answer import has_answer_block
from dynheads_tl.report.findings import update_readme
from dynheads_tl.report.rerender import render_report
from dynheads_tl.report.results import model_folder_name
from dynheads_tl.report.runner import EXECUTION_ONLY, run_report

COMMITTED_REPORT = Path("papers_figures")  # `dynheads report --committed`'s output, relative to the working directory


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """One :func:`run_report` call of :func:`committed_plan`: ``model`` None is each notebook's own, ``only`` None
    every notebook, ``output_dir`` its folder of the committed report."""

    preset: str
    model: str | None = None
    only: str | None = None
    output_dir: Path | None = None


def committed_plan(models: list[str] | None = None) -> list[PlannedRun]:
    """The runs that regenerate the whole committed report, in order: every embedded model's default report, then each
    claim's committed presets (``Claim.committed``: the ``long`` preset of notebooks 01, 03, 05, 06 and 07, the
    ``scale`` preset of 07) on every model, each into ``papers_figures/<preset>/<model>/``; an embedded model only in
    the presets it declares (``EmbeddedModel.committed``). Every run names its model; the embedded models in their
    declared order."""
    models = list(models) if models else list(EMBEDDED_MODELS)
    runs_in = lambda model, preset: model not in EMBEDDED_MODELS or preset in EMBEDDED_MODELS[model].committed  # noqa: E731

    def folder(preset: str, model: str) -> Path:
        return COMMITTED_REPORT / preset / model_folder_name(model)

    # Each folder named: a run that names none writes runs/ (output_dir_for), never the committed report.
    plan = [PlannedRun("default", model, None, folder("default", model)) for model in models if runs_in(model, "default")]
    for claim in all_claims():
        for preset in claim.committed:
            for model in models:
                if runs_in(model, preset):
                    plan.append(PlannedRun(preset, model, claim.notebook, folder(preset, model)))
    return plan


def run_committed_report(*, models: list[str] | None = None, overrides: dict[str, Any] | None = None,
                         cwd: str | Path | None = None, readme: str | Path = "README.md") -> list[Path]:
    """Regenerate the whole committed report (:func:`committed_plan`), then its top index, its findings page and the
    answer block of ``readme`` (relative to ``cwd``; skipped when it lacks either answer marker, checked first).
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
    has_findings = path.exists() and has_answer_block(path.read_text(encoding="utf-8"))
    plan = committed_plan(models)
    planned = {p.model or DEFAULT_MODEL for p in plan}
    missing = sorted(name for name in planned if name in EMBEDDED_MODELS and not embedded_installed(name))
    if missing:  # checked before hours of runs, not at the run that needs it
        raise ModuleNotFoundError("The committed report runs " + ", ".join(missing) + ", whose weights are not "
                                  "installed; install them first: " + "; ".join(
                                      f"dynheads install-model --name {name}" for name in missing)
                                  + " (make setup-qwen installs the Qwen2.5 models).")
    done = []
    for i, planned in enumerate(plan, 1):
        what = f"{planned.preset} preset, {planned.model or DEFAULT_MODEL}" + (f", {planned.only}" if planned.only else "")
        print(f"=== committed report, run {i}/{len(plan)}: {what}", flush=True)
        done += run_report(preset=planned.preset, model=planned.model, only=planned.only, overrides=overrides,
                           output_dir=planned.output_dir, cwd=cwd)
    report = cwd / COMMITTED_REPORT
    # Each run rendered its own pages and index; the indexes that list them (each preset's, then the root's) are
    # built from every run, then each model's index again, to link up to them.
    render_report(report)
    if has_findings:
        prefix = Path(os.path.relpath(report, path.resolve().parent)).as_posix()
        update_readme(path, report, link_prefix=f"{prefix}/")
    return done
