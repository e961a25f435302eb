"""The report's data: each notebook folder's ``verdicts.json`` (:mod:`dynheads_tl.verdicts`), for every model and
preset a report holds.

One layout for every model: ``<report>/<preset>/<model>/NN_name/``. A model's run of a preset is a report of its own
(``<report>/<preset>/<model>/``, with its ``executed/``, ``runs.json`` and index; :func:`model_reports`); a preset's
folder holds one such report per model and an index that puts them side by side (:func:`preset_reports`); the report's
root holds only the indexes and pages that read all of them (the top index, ``findings.md``, the answer's figure).
No model is the report's root: the default model is the CLI's default, nothing more.

A folder without ``verdicts.json`` (a report written without one) is computed in memory from its CSVs
by the same claim functions that write the file (:func:`dynheads_tl.verdicts.build`);
``python -m dynheads_tl.report.rerender`` writes the files.
"""
from __future__ import annotations

import json as _json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynheads_tl import verdicts
from dynheads_tl.claims import all_claims
from dynheads_tl.engine.embedded import EMBEDDED_MODELS
from dynheads_tl.results_schema import Results

logger = logging.getLogger(__name__)

# Presets every claim may fill in: ``default`` is each config's own defaults, ``smoke`` the smallest run that takes
# every code path (the tests' notebook runs), ``paper`` the paper's grid on its model. Each claim declares its own
# overrides (``Claim.presets``); a claim may add a preset of its own.
BUILTIN_PRESETS = ("default", "smoke", "paper")
# Presets that run every notebook, a notebook they leave alone at its defaults. Any other preset (``long``, ``scale``,
# or one a claim adds) is a focused run: only the notebooks whose claims declare it run in it.
WHOLE_REPORT_PRESETS = BUILTIN_PRESETS + ("thorough",)


def preset_names() -> list[str]:
    """Every preset a run may name: the built-in ones and any a claim declares."""
    return sorted(set(BUILTIN_PRESETS) | {name for claim in all_claims() for name in claim.presets})


def read_runs(output_dir: Path) -> dict[str, Any]:
    """``<output_dir>/runs.json`` (what ran, with which parameters), or nothing when it is missing or
    damaged: the index then lists no runs, and the next run rewrites it with its own records."""
    path = Path(output_dir) / "runs.json"
    if not path.exists():
        return {}
    try:
        runs = _json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        logger.warning("%s is unreadable (%s); it is rewritten by the next run.", path, error)
        return {}
    return runs if isinstance(runs, dict) else {}


def claim_results(output_dir: Path, claim) -> Results | None:
    """``claim``'s typed results in the report at ``output_dir``: its ``verdicts.json``, or, where that is missing or
    of another schema version, the same computed from its files and checked against the schema; None when the
    notebook wrote no folder. A file of this version that breaks the schema raises
    :class:`~dynheads_tl.verdicts.ResultsError`: a damaged result is refused, never shown as "not run"."""
    folder = Path(output_dir) / claim.notebook
    if not folder.is_dir():
        return None
    found = verdicts.load(folder)
    if found is not None:
        return found
    return verdicts.compute(claim, folder, read_runs(output_dir).get(claim.notebook))


def all_results(output_dir: Path) -> dict[str, Results]:
    """Notebook stem -> :func:`claim_results`, for every declared claim whose folder exists."""
    out = {}
    for claim in all_claims():
        data = claim_results(output_dir, claim)
        if data is not None:
            out[claim.notebook] = data
    return out


def write_results(output_dir: Path, notebooks: list[str] | None = None) -> list[Path]:
    """(Re)compute and write ``verdicts.json`` of every claim folder in ``output_dir`` (or those named), from the
    files the notebooks wrote and the runs recorded in ``runs.json``; returns the files written."""
    output_dir = Path(output_dir)
    runs = read_runs(output_dir)
    written = []
    for claim in all_claims():
        folder = output_dir / claim.notebook
        if folder.is_dir() and (notebooks is None or claim.notebook in notebooks):
            written.append(verdicts.write(claim, folder, runs.get(claim.notebook)))
    return written


@dataclass(frozen=True)
class ModelReport:
    """One model's run of one preset: its model's name, its folder and the link prefix from the folder listing it."""

    model: str
    folder: Path
    prefix: str  # "<model>/" from its preset's folder; "" for a report read on its own


def is_model_report(folder: Path) -> bool:
    """Whether ``folder`` holds one model's runs (its ``runs.json``), as opposed to a folder that lists reports."""
    return (Path(folder) / "runs.json").is_file()


def report_model(output_dir: Path) -> str:
    """The model whose results ``output_dir`` holds, from ``runs.json`` (the names when they differ), else from
    the results files, else "?"."""
    runs = read_runs(output_dir)
    names = sorted({str(r.get("model")) for r in runs.values() if r.get("model")})
    if names:
        return ", ".join(names)
    for data in all_results(output_dir).values():
        if data.model:
            return str(data.model)
    return "?"


def _model_order(name: str) -> tuple[int, str]:
    """The embedded models in their declared order (smallest family first), then any other by name: an order for
    tables and columns, the same for every preset; no model decides a path."""
    order = list(EMBEDDED_MODELS)
    return (order.index(name), name) if name in order else (len(order), name)


def model_reports(folder: Path) -> list[ModelReport]:
    """The model reports ``folder`` holds: itself when it is one (:func:`is_model_report`), else every subfolder that
    is one (``<preset>/<model>/``), the embedded models in their declared order, then others by name."""
    folder = Path(folder)
    if is_model_report(folder):
        return [ModelReport(report_model(folder), folder, "")]
    if not folder.is_dir():
        return []
    found = [ModelReport(report_model(sub), sub, f"{sub.name}/") for sub in folder.iterdir()
             if sub.is_dir() and is_model_report(sub)]
    return sorted(found, key=lambda report: _model_order(report.folder.name))


def model_folder_name(model: str) -> str:
    """A model name as a folder name under a preset's folder (``google/gemma-3-270m`` -> ``google--gemma-3-270m``)."""
    name = model.strip().replace("/", "--")
    if not name or name.startswith(".") or any(c in name for c in "\\:*?\"<>| "):
        raise ValueError(f"The model name {model!r} cannot name a report folder; give a plain name such as "
                         "'gemma-3-270m'.")
    if name in preset_names():
        raise ValueError(f"The model name {model!r} is also a preset's name, and would be read as that preset's "
                         "folder; name the output folder with --output-dir.")
    return name


@dataclass(frozen=True)
class PresetReport:
    """The runs of one preset in a report: ``<report>/<preset>/``, one model report per model (:func:`model_reports`)
    and an index that lists them."""

    preset: str
    folder: Path
    prefix: str  # "<preset>/": the link prefix from the report's root


def preset_reports(output_dir: Path) -> list[PresetReport]:
    """Every folder directly under ``output_dir`` named after a preset (:func:`preset_names`) that holds model reports
    recording runs of that preset only: ``default`` first, then the others by name. A preset's folder where a model's
    ``runs.json`` records runs of another preset is left out with a warning (they would be quoted as the preset's)."""
    output_dir = Path(output_dir)
    found = []
    for preset in sorted(preset_names(), key=lambda name: (name != "default", name)):
        folder = output_dir / preset
        if is_model_report(folder):
            continue  # a model's report that happens to be named after a preset, not a preset's folder
        mixed = {report.folder.name: sorted({str(r.get("preset")) for r in read_runs(report.folder).values()} - {preset})
                 for report in model_reports(folder)}
        if any(mixed.values()):
            logger.warning("%s is left out of the report: its model folders %s record runs of other presets, not only "
                           "%r.", folder, {name: others for name, others in mixed.items() if others}, preset)
        elif mixed:
            found.append(PresetReport(preset, folder, f"{preset}/"))
    return found


def contexts_phrase(contexts: dict[str, list[int]] | None) -> str:
    """ "NIAH up to 2,000 tokens (1,000 and 2,000); HotpotQA-format" from a results file's ``contexts``; "" when
    it records none."""
    parts = []
    for task, lengths in sorted((contexts or {}).items(), key=lambda pair: pair[0] != "NIAH"):
        if task == "NIAH" and lengths:
            listed = " and ".join(f"{n:,}" for n in lengths) if len(lengths) <= 2 else \
                ", ".join(f"{n:,}" for n in lengths[:-1]) + f" and {lengths[-1]:,}"
            parts.append(f"NIAH up to {max(lengths):,} tokens" + (f" ({listed})" if len(lengths) > 1 else ""))
        elif lengths:
            parts.append(f"{task} up to {max(lengths):,} tokens")
        else:
            parts.append(f"{task}-format" if task == "HotpotQA" else task)
    return "; ".join(parts)


def longest_context(contexts: dict[str, list[int]] | None, task: str | None = None) -> str:
    """The index's "longest context" cell from a results file's ``contexts``: "NIAH 2,000 tokens" (the longest
    length the run read, per task), "HotpotQA-format" for a task read at its own lengths; only ``task``'s where
    the run read it; "–" when it records none."""
    contexts = contexts or {}
    if task in contexts:
        contexts = {task: contexts[task]}
    parts = []
    for task, lengths in sorted(contexts.items(), key=lambda pair: pair[0] != "NIAH"):
        parts.append(f"{task} {max(lengths):,} tokens" if lengths else
                     (f"{task}-format" if task == "HotpotQA" else task))
    return "; ".join(parts) or "–"
