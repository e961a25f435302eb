"""Several models' results side by side: each index row's cell on every model of a preset's folder, what the cells say
together (:func:`agreement`), and the tables of the presets a report holds. The index (:mod:`dynheads_tl.report.index`)
and the findings (:mod:`dynheads_tl.report.findings`) show them."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynheads_tl.claims import all_claims
from dynheads_tl.report.items import SYNTHETIC_NOTE, _result_row, absent_status, index_items, item_task
from dynheads_tl.report.legend import MISSING, NOT_IN_PRESET
from dynheads_tl.report.results import (ModelReport, PresetReport, all_results, is_model_report, longest_context,
                                        model_reports, preset_reports, read_runs)


# Statuses that state no test's outcome (a picture, a description), and those whose test settled nothing (the
# intervals cannot tell, or the setting cannot separate its bounds): neither can agree or differ with another model.
NO_VERDICT = ("qualitative", "descriptive")
UNSETTLED = ("undetermined", "no headroom")


def agreement(statuses: list[str]) -> str:
    """What one item's statuses on several models say together: "not on every model" (a model lacks the item),
    "not run in this preset" (every model's preset leaves it out by design), "no verdict" (a picture or a
    description on every model), "not settled" (undetermined or without headroom on some model: nothing to agree or
    differ with), "agree" (one settled status on every model) or "differ" (settled statuses that differ)."""
    if any(status in ("not produced", MISSING, NOT_IN_PRESET) for status in statuses):
        return NOT_IN_PRESET if set(statuses) == {NOT_IN_PRESET} else "not on every model"
    if all(status in NO_VERDICT for status in statuses):
        return "no verdict"
    if any(status in UNSETTLED for status in statuses):
        return "not settled"
    return "agree" if len(set(statuses)) == 1 else "differ"


@dataclass(frozen=True)
class ModelCell:
    """One index row's result on one model: its status ("not produced" when its report lacks it), headline and more."""

    status: str
    headline: str = "–"
    synthetic: bool = False
    context: str = "–"  # the longest context the model's run read (results.longest_context)
    absent: str = MISSING  # what it shows when not produced: MISSING, or NOT_IN_PRESET when its preset leaves it out


def model_cells(output_dir: Path) -> tuple[list[ModelReport], list[tuple[Any, Any, list[ModelCell]]]]:
    """Every index row on every model of a preset's folder (``<preset>/<model>/``): (the models, [(claim, item, [cell
    per model])]) in the paper's order; no rows in a model's own report (its main table says it all)."""
    if is_model_report(output_dir):
        return model_reports(output_dir), []
    reports = model_reports(output_dir)
    if not reports:
        return reports, []
    return reports, _cells([report.folder for report in reports])


def _cells(folders: list[Path]) -> list[tuple[Any, Any, list[ModelCell]]]:
    """[(claim, item, [its cell in each folder's report])] for every index row, in the paper's order."""
    results = [all_results(folder) for folder in folders]
    rows, runs = [], [read_runs(folder) for folder in folders]
    for claim, item in index_items():
        cells = []
        for found, folder_runs in zip(results, runs):
            row = _result_row(found, claim, item)
            synthetic = bool(row and row.data == "synthetic")  # marked as in a model's own table (SCIENCE 9)
            mark = f" {SYNTHETIC_NOTE}" if synthetic and row.status != "qualitative" else ""
            cells.append(ModelCell(row.status, row.headline + mark, synthetic, longest_context(
                found[claim.notebook].contexts, item_task(item))) if row and row.produced else ModelCell(
                "not produced", absent=absent_status(claim, folder_runs)))
        rows.append((claim, item, cells))
    return rows


@dataclass(frozen=True)
class PresetTable:
    """A preset's runs in a report (:func:`~dynheads_tl.report.results.preset_reports`): its models and, for every row
    it produced on some model, that row's cell on each model and what they say together (:func:`agreement`, "" with
    one model)."""

    preset: PresetReport
    models: list[ModelReport]
    rows: list[tuple[str, str, list[ModelCell], str]]  # (item, paper, [cell per model], agreement)


def preset_tables(output_dir: Path) -> list[PresetTable]:
    """One :class:`PresetTable` per preset's folder under ``output_dir`` (``default/`` first, then ``long/``...)."""
    tables = []
    for preset in preset_reports(output_dir):
        reports = model_reports(preset.folder)
        rows = [(item.item, item.paper, cells, agreement([c.status for c in cells]) if len(cells) > 1 else "")
                for _, item, cells in _cells([r.folder for r in reports])
                if any(c.status != "not produced" for c in cells)]
        tables.append(PresetTable(preset, reports, rows))
    return tables


PRESETS_NOTE = ("Each preset's runs, one report per model (`<preset>/<model>/`, each with its own index), and the "
                "preset's index, which puts the models side by side: `default` is the default report's hour, the "
                "others larger grids (such as notebook 07's pre-registered `long` length grid and `scale` size axis); "
                "every status comes from the same notebooks and rules, at the contexts shown.")


def model_table(output_dir: Path) -> tuple[list[ModelReport], list[tuple[str, str, list[tuple[str, str]]]]]:
    """The index's model table (:func:`model_cells`): (the models, [(item, paper, [(status, headline) per model,
    then (:func:`agreement` of the statuses, "")])], a cell not produced as (its ``absent``, "–")); no rows with one
    model (the main table says it all)."""
    reports, rows = model_cells(output_dir)
    shown = lambda c: (c.absent, "–") if c.status == "not produced" else (c.status, c.headline)
    return reports, [(item.item, item.paper, [shown(c) for c in cells] + [(agreement([shown(c)[0] for c in cells]), "")])
                     for _, item, cells in rows]


def model_agreement(output_dir: Path) -> list[tuple[str, list[tuple[str, list[ModelCell]]]]]:
    """Per claim (its page title, in notebook order), each of its index rows' cells on every model
    (:func:`model_cells`), leaving out rows no model produced; empty with one model."""
    _, rows = model_cells(output_dir)
    order = {claim.notebook: i for i, claim in enumerate(all_claims())}
    out: dict[str, list[tuple[str, list[ModelCell]]]] = {}
    for claim, item, cells in sorted(rows, key=lambda row: (order[row[0].notebook], row[1].position)):
        if any(c.status != "not produced" for c in cells):
            out.setdefault(claim.title or claim.notebook, []).append((item.item, cells))
    return list(out.items())


MODELS_NOTE = ("Each model's results sit in a report of their own (`<model>/` in this preset's folder), computed by "
               "the same notebooks and the same rules; this table puts their statuses side by side.")
