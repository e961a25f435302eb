"""The report's data: each notebook folder's ``verdicts.json`` (:mod:`dynheads_tl.verdicts`), for every model a
report holds.

A report folder holds the default model's results at its top (``papers_figures/NN_name/``) and each
other model's beside them, as a report of its own: ``papers_figures/models/<model>/NN_name/`` (with its own
``executed/``, ``runs.json`` and index). :func:`model_reports` lists them; the top index reads all of them.

A report may also hold the runs of a named preset beside the default ones, as a report of its own (with its own
``models/``): ``papers_figures/<preset>/``, such as notebook 07's ``long`` grid (:func:`preset_reports`); the top
index and the README quote them apart, labelled with the preset.

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
from dynheads_tl.results_schema import Results

logger = logging.getLogger(__name__)

MODELS_DIR = "models"  # <report>/models/<model>/: every model's report beside the default one's


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
    """One model's results in a report: its name, its folder and the link prefix from the report's root."""

    model: str
    folder: Path
    prefix: str  # "" for the report's own folder, "models/<model>/" for the others


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


def model_reports(output_dir: Path) -> list[ModelReport]:
    """The report's own model first, then every ``models/<model>/`` report beside it (by name)."""
    output_dir = Path(output_dir)
    found = [ModelReport(report_model(output_dir), output_dir, "")]
    models = output_dir / MODELS_DIR
    if models.is_dir():
        for folder in sorted(p for p in models.iterdir() if p.is_dir()):
            found.append(ModelReport(report_model(folder) if (folder / "runs.json").exists() else folder.name,
                                     folder, f"{MODELS_DIR}/{folder.name}/"))
    return found


def model_folder_name(model: str) -> str:
    """A model name as a folder name under ``models/`` (``google/gemma-3-270m`` -> ``google--gemma-3-270m``)."""
    name = model.strip().replace("/", "--")
    if not name or name.startswith(".") or any(c in name for c in "\\:*?\"<>| "):
        raise ValueError(f"The model name {model!r} cannot name a report folder; give a plain name such as "
                         "'gemma-3-270m'.")
    return name


@dataclass(frozen=True)
class PresetReport:
    """The runs of one named preset kept in a report beside the default ones: ``<report>/<preset>/``, a report of
    its own (its own ``executed/``, ``runs.json``, index and ``models/``)."""

    preset: str
    folder: Path
    prefix: str  # "<preset>/": the link prefix from the report's root


def committed_presets() -> set[str]:
    """The presets whose runs the committed report keeps beside the default one (``Claim.committed``)."""
    return {preset for claim in all_claims() for preset in claim.committed}


def preset_reports(output_dir: Path) -> list[PresetReport]:
    """Every folder directly under ``output_dir`` named after a committed preset (:func:`committed_presets`:
    ``long/``) whose ``runs.json`` records runs of that preset only; by name. A folder of that name holding runs
    of another preset is left out with a warning (it would be quoted as the preset's)."""
    output_dir = Path(output_dir)
    found = []
    for preset in sorted(committed_presets()):
        folder = output_dir / preset
        runs = read_runs(folder) if folder.is_dir() else {}
        if not runs:
            continue
        others = sorted({str(r.get("preset")) for r in runs.values()} - {preset})
        if others:
            logger.warning("%s is left out of the report: its runs.json records runs of preset(s) %s, not only %r.",
                           folder, others, preset)
            continue
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
