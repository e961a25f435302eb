"""The index of the reproduction: every declared claim's rows, read from the outputs present.

``build_index`` writes ``README.md`` and ``index.html`` (the template ``report.html.j2``,
:mod:`dynheads_tl.report.templating`) from the outputs present; ``render_notebook_html`` turns an executed notebook
into a page that opens offline. What keeps an output folder from being a report to commit is
:mod:`dynheads_tl.report.checks`.
"""
from __future__ import annotations

import json as _json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any


from dynheads_tl import verdicts
from dynheads_tl.claim import ReportSection
from dynheads_tl.claims import all_claims
from dynheads_tl.report.answer import ANSWER_ALT, FIGURE as ANSWER_FIGURE
from dynheads_tl.report.results import (ModelReport, PresetReport, all_results, is_model_report, longest_context,
                                        model_reports, preset_names, preset_reports, read_runs)
from dynheads_tl.results_schema import ItemResult, Results
from dynheads_tl.report.site import (PAPER_TITLE, PAPER_URL, Link, notebook_order, notebook_title, output_groups,
                                     page_sections, render_page, run_meta)
from dynheads_tl.report.templating import INDEX_TEMPLATE, render
from dynheads_tl.report.legend import (MISSING, NOT_IN_PRESET, SMOKE_PRESETS, STATUS_LEGEND, UpLink,  # noqa: F401
                                       enclosing_reports, smoke_banner, status_legend, up_links)
from dynheads_tl.store import atomic_write_text

logger = logging.getLogger(__name__)

# --- the index of the reproduction -----------------------------------------------------------------

def index_items() -> list[tuple[Any, Any]]:
    """Every declared claim's index rows, as (claim, item), in the paper's order (``PaperItem.position``)."""
    return sorted(((claim, item) for claim in all_claims() for item in claim.items), key=lambda pair: pair[1].position)


def find_item(name: str) -> tuple[Any, Any]:
    """(claim, item) of the index row called ``name`` ("Fig 2")."""
    for claim, item in index_items():
        if item.item == name:
            return claim, item
    raise KeyError(f"No claim declares an index row {name!r}.")


def item_stem(claim, item) -> str:
    """The row's file stem relative to the output folder: ``02_irreplaceability/fig2_niah_masking``."""
    return f"{claim.notebook}/{item.output}"


def _headline(claim, item, output_dir: Path) -> str:
    """A one-line summary of our numbers, read from the files actually present by the item's own headline."""
    if item.headline is None:
        return "see figure"
    try:
        return item.headline(Path(output_dir) / claim.notebook)
    except Exception:  # a file of another shape (an older run): link it, do not summarise it
        return "see file"


# HotpotQA items (``PaperItem.hotpot``) are labelled synthetic unless the config names a real file
# (:func:`dynheads_tl.verdicts.synthetic`).
SYNTHETIC_NOTE = "(synthetic HotpotQA-format data)"


def item_task(item) -> str | None:
    """The task an index row reads: "HotpotQA" for a HotpotQA item, "NIAH" where its file stem names NIAH, else
    None (the row reads whatever its notebook read)."""
    return "HotpotQA" if item.hotpot else "NIAH" if "niah" in item.output else None


def _produced_files(stem: Path) -> list[Path]:
    if not stem.parent.exists():
        return []
    return sorted(p for p in stem.parent.glob(stem.name + ".*") if not p.name.endswith(".tmp"))


def ours_text(output_dir: Path, item: str) -> str:
    """The "ours" cell of an index row: the headline from the files present, or "not produced", plus the
    synthetic-data label for HotpotQA items."""
    claim, declared = find_item(item)
    stem = Path(output_dir) / item_stem(claim, declared)
    if not _produced_files(stem):
        return "not produced"
    text = _headline(claim, declared, output_dir)
    if verdicts.synthetic(declared, stem.parent):
        text += " " + SYNTHETIC_NOTE
    return text


# A row whose files are not there shows ``absent``: MISSING (red) or NOT_IN_PRESET (neutral; report/legend.py).
@dataclass(frozen=True)
class _Row:
    item: str
    what: str
    paper: str
    ours: str
    files: list[str]  # relative to the output folder, POSIX
    notebook: str
    notebook_link: str | None  # the HTML rendering when present, else the executed .ipynb
    ipynb_link: str | None
    run: dict[str, Any]
    status: str = "not produced"  # report.status: computed from the item's CSVs
    headline: str = "not produced"  # the headline number with its interval and n
    section: str | None = None  # the link to the page section that makes the item's files
    context: str = "–"  # the longest context its run read, per task (results.longest_context)
    absent: str = MISSING  # what a row that is not produced shows: MISSING, or NOT_IN_PRESET by design


def absent_status(claim, runs: dict[str, Any]) -> str:
    """What a report lacking ``claim``'s files shows: NOT_IN_PRESET where its runs, all of one named preset (not
    ``default``) the claim declares nothing for (``Claim.presets``: ``long`` never runs 02 or 04), hold no run of the
    notebook (left out by design), else MISSING."""
    presets = {str(run.get("preset")) for run in runs.values()}
    return NOT_IN_PRESET if (len(presets) == 1 and not presets & {"default", "None"} and claim.notebook not in runs
                             and not presets & set(claim.presets)) else MISSING


def _rel(path: Path, output_dir: Path) -> str:
    return path.relative_to(output_dir).as_posix()


def _notebook_links(output_dir: Path, notebook: str) -> tuple[str | None, str | None]:
    ipynb = output_dir / "executed" / f"{notebook}.ipynb"
    rendered = ipynb.with_suffix(".html")
    ipynb_link = _rel(ipynb, output_dir) if ipynb.exists() else None
    return (_rel(rendered, output_dir) if rendered.exists() else ipynb_link), ipynb_link


def _result_row(results: dict[str, Results], claim, item) -> ItemResult | None:
    """The item's row of its claim's results (``verdicts.json``), or None when the notebook wrote no folder."""
    found = results.get(claim.notebook)
    return found.item(item.item) if found is not None else None


def _rows(output_dir: Path, runs: dict[str, Any]) -> list[_Row]:
    results = all_results(output_dir)
    rows, sections = [], {}
    for claim, declared in index_items():
        item, notebook = declared.item, claim.notebook
        found = _result_row(results, claim, declared)
        produced = bool(found and found.produced)
        files = [f"{notebook}/{name}" for name in found.files] if produced else []
        link, ipynb = _notebook_links(output_dir, notebook) if files else (None, None)
        status, headline, ours, section, context = "not produced", "not produced", "not produced", None, "–"
        if produced:
            status, headline, ours = found.status, found.headline, found.ours
            context = longest_context(results[notebook].contexts, item_task(declared))
            if found.data == "synthetic":
                ours += " " + SYNTHETIC_NOTE
                if status != "qualitative":
                    headline += " " + SYNTHETIC_NOTE
            if link and link.endswith(".html"):
                if notebook not in sections:
                    sections[notebook] = page_sections(output_dir, notebook)
                anchor = sections[notebook].get(declared.output)
                section = f"{link}#{anchor}" if anchor else link
        absent = MISSING if produced else absent_status(claim, runs)
        rows.append(_Row(item, declared.what, declared.paper, ours, files, notebook, link, ipynb,
                         runs.get(notebook, {}), status, headline, section, context, absent))
    return rows


def _file_label(name: str) -> str:
    return "config" if name.endswith(".config.json") else name.rsplit(".", 1)[-1]


INTRO = ("Regenerated by `dynheads report` from the files present in this folder; an item whose files are "
         "missing says so. Numbers labelled *paper* are quoted from arXiv 2602.11162.")
SYNTHETIC_INTRO = (f" HotpotQA items marked {SYNTHETIC_NOTE} were computed on questions from the seeded synthetic "
                   "generator, not the real dataset.")


def intro(*shown: object) -> str:
    """The index's opening paragraph; it explains the synthetic-data mark only where something the page shows
    (its rows, its model and preset tables) carries it, which outside the smoke preset nothing does."""
    return INTRO + (SYNTHETIC_INTRO if any(SYNTHETIC_NOTE in repr(part) for part in shown) else "")
RUN_TIME_NOTE = ("Run times are those of the last run, which reads finished traces and ablation runs from the on-disk "
                 "cache instead of recomputing them; docs/benchmarks.md in the repository gives the times from scratch.")
STATUS_NOTE = ("The status is computed from each item's CSV by the rule its claim declares in preregistration.yaml, "
               "where its thresholds are declared too (with the dated deviations that amend them), and coded in "
               "dynheads_tl/claims/<claim>/ (rules.py or report.py). Items beyond the paper test a hypothesis of ours. "
               "Every status the index shows:")

def head_score_files(output_dir: Path) -> list[dict[str, str]]:
    """Every head-score file a notebook wrote (``<notebook>/head_scores/<model>_<score>.json``, Wu et al.'s format),
    each with its provenance file and what its provenance says it holds: model, score, n. Sorted by model."""
    found = []
    for path in sorted(Path(output_dir).glob("*/head_scores/*.json")):
        if path.name.endswith(".provenance.json"):
            continue
        provenance = path.with_name(path.stem + ".provenance.json")
        try:
            info = _json.loads(provenance.read_text())
        except (OSError, ValueError):
            info = {}
        found.append({"model": str(info.get("model", path.stem.rsplit("_", 2)[0])), "score": str(info.get("score", "?")),
                      "n": str(info.get("n_kept", info.get("n", "?"))), "file": _rel(path, Path(output_dir)),
                      "provenance": _rel(provenance, Path(output_dir)) if provenance.exists() else ""})
    return sorted(found, key=lambda f: (f["model"], f["file"]))


HEAD_FILES_NOTE = ("Head scores in Wu et al.'s `head_score` JSON format (`{\"layer-head\": [scores...]}`), which "
                   "Wu's, DuoAttention's and QRHead's tools read, each beside a provenance file (model fingerprint, "
                   "tokenizer and chat-template digest, prompt format, library versions, seeds, n, filter); "
                   "`static_source=PATH` reads one back as the static set of any claim.")


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


@dataclass(frozen=True)
class _Tables:
    """What the index's README and page both show beside the item rows, read once per :func:`build_index`."""

    heads: list[dict[str, str]]  # head_score_files
    reports: list[ModelReport]  # model_table's models
    by_model: list[tuple[str, str, list[tuple[str, str]]]]  # model_table's rows (empty in a model's own report)
    presets: list[PresetTable]
    answer: bool  # the report's root holds the answer's figure (report/answer.py), shown first
    sections: list[ReportSection]  # the claims' sections across the report's models (the size axis), after the answer
    banner: str  # smoke_banner of the folder's runs, or of every run of the reports it lists

    @classmethod
    def read(cls, output_dir: Path) -> "_Tables":
        reports, by_model = model_table(output_dir)
        # A model's report inside its preset's folder leaves the sections across models to that folder's index.
        nested = is_model_report(output_dir) and Path(output_dir).parent.name in preset_names()
        sections = [] if nested else [s for s in (c.section(Path(output_dir)) for c in all_claims() if c.section) if s]
        presets = preset_tables(output_dir)
        listed = [r.folder for r in reports] + [m.folder for table in presets for m in table.models]
        runs = read_runs(output_dir) or {f"{folder}/{stem}": run for folder in listed
                                         for stem, run in read_runs(folder).items()}
        return cls(head_score_files(output_dir), reports, by_model, presets,
                   (Path(output_dir) / ANSWER_FIGURE).is_file(), sections, smoke_banner(runs))


def _markdown(rows: list[_Row], runs: dict[str, Any], tables: _Tables, up: list[UpLink]) -> str:
    md = ["# The reproduction at a glance", ""]
    if up:
        md += [" · ".join(f"↑ [{link.title}]({link.markdown})" for link in up), ""]
    if tables.banner:
        md += [f"> **{tables.banner}**", ""]
    md += [f"![{ANSWER_ALT}]({ANSWER_FIGURE})", ""] if tables.answer else []
    md += [line for section in tables.sections for line in section.markdown()]
    md += [intro(rows, tables), "", STATUS_NOTE, ""]
    md += [f"- **{status}**: {meaning}" for status, meaning in status_legend()] + [""]
    if runs:
        md += [f"Runs: {run_meta(runs)}. {RUN_TIME_NOTE}", ""]
    if rows:
        md += ["| item | what | paper | ours | status | headline | longest context | files | notebook |",
               "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        links = " ".join(f"[{_file_label(name)}]({name})" for name in row.files) or "–"
        notebook = f"[{row.notebook}]({row.ipynb_link})" if row.ipynb_link else "–"
        status, headline = (row.absent, "–") if row.status == "not produced" else (row.status, row.headline)
        md.append(f"| {row.item} | {row.what} | {row.paper} | {row.ours} | {status} | {headline} | {row.context} | "
                  f"{links} | {notebook} |")
    reports, by_model, heads = tables.reports, tables.by_model, tables.heads
    if by_model:
        md += ["", "## Every model", "", MODELS_NOTE, "",
               "| item | paper | " + " | ".join(f"[{r.model}]({r.prefix}README.md)" for r in reports) + " | statuses |",
               "|---|---|" + "---|" * (len(reports) + 1)]
        md += [f"| {item} | {paper} | " + " | ".join(f"{status}: {headline}" for status, headline in cells[:-1])
               + f" | {cells[-1][0]} |" for item, paper, cells in by_model]
    for table in tables.presets:
        several = len(table.models) > 1
        md += ["", f"## Preset {table.preset.preset}", "", f"{PRESETS_NOTE} [Its index]({table.preset.prefix}README.md).",
               "", "| item | paper | " + " | ".join(f"[{r.model}]({table.preset.prefix}{r.prefix}README.md)"
                                                   for r in table.models) + (" | statuses |" if several else " |"),
               "|---|---|" + "---|" * (len(table.models) + several)]
        md += [f"| {item} | {paper} | " + " | ".join(_cell_text(c) for c in cells) + (f" | {agree} |" if several else " |")
               for item, paper, cells, agree in table.rows]
    if heads:
        md += ["", "## Head-score files", "", HEAD_FILES_NOTE, "", "| model | score | n | file | provenance |",
               "|---|---|---|---|---|"]
        md += [f"| {h['model']} | {h['score']} | {h['n']} | [{h['file']}]({h['file']}) | "
               + (f"[provenance]({h['provenance']}) |" if h["provenance"] else "– |") for h in heads]
    if runs:
        md += ["", "## Runs", "", "| notebook | model | preset | parameters | date | minutes |", "|---|---|---|---|---|---|"]
        for notebook, run in sorted(runs.items()):
            md.append(f"| {notebook} | {run.get('model')} | {run.get('preset')} | "
                      f"`{_json.dumps(run.get('parameters', {}))}` | {run.get('date')} | {run.get('minutes')} |")
    return "\n".join(md) + "\n"


def _cell_text(cell: ModelCell) -> str:
    """A preset table's cell: "status: headline (longest context)", or "–" where the model did not produce it."""
    return "–" if cell.status == "not produced" else f"{cell.status}: {cell.headline} ({cell.context})"


def _anchor(item: str) -> str:
    return item.lower().replace(" ", "-")


@dataclass(frozen=True)
class _IndexRow:
    """An index row as the page shows it (``report.html.j2``)."""
    item: str
    anchor: str  # the id of the row's figure
    target: str | None  # where the item's name links: the page section that makes it, else its figure
    produced: bool
    status: str
    what: str
    paper: str
    ours: str
    headline: str
    files: list[tuple[str, str]]  # (label, href)
    notebook: str
    notebook_link: str | None
    ipynb_link: str | None  # only where it is not already the notebook link
    image: str | None
    section: str | None
    context: str = "–"
    absent: str = MISSING  # what the row shows in place of a status when it is not produced


def _index_row(row: _Row) -> _IndexRow:
    image = next((name for name in row.files if name.endswith(".png")), None)
    anchor = _anchor(row.item)
    return _IndexRow(row.item, anchor, row.section or (f"#{anchor}" if image else None), row.status != "not produced",
                     row.status, row.what, row.paper, row.ours, row.headline,
                     [(_file_label(name), name) for name in row.files], row.notebook, row.notebook_link,
                     row.ipynb_link if row.ipynb_link != row.notebook_link else None, image, row.section, row.context,
                     row.absent)


def _html_page(rows: list[_Row], runs: dict[str, Any], output_dir: Path, tables: _Tables, up: list[UpLink]) -> str:
    notebooks = notebook_order(output_dir)
    pages = []
    for notebook in notebooks:
        link, _ = _notebook_links(output_dir, notebook)
        if link:
            pages.append(Link(link, notebook_title(notebook)))
    shown = [_index_row(row) for row in rows]
    reports, by_model = tables.reports, tables.by_model
    outputs = []
    for folder in sorted({claim.notebook for claim, _ in index_items()} | set(notebooks)):
        if (output_dir / folder).is_dir():
            link, _ = _notebook_links(output_dir, folder)
            page = link if link and link.endswith(".html") else ""
            outputs.append({"title": notebook_title(folder), "page": page,
                            "groups": output_groups(output_dir / folder, f"{folder}/"),
                            "sections": page_sections(output_dir, folder) if page else {}})
    return render(
        INDEX_TEMPLATE, paper_url=PAPER_URL, paper_title=PAPER_TITLE, smoke_banner=tables.banner,
        run_meta=run_meta(runs), pages=pages, intro=intro(rows, tables), status_note=STATUS_NOTE, legend=status_legend(),
        up_links=up, not_in_preset=NOT_IN_PRESET, rows=shown,
        models=[Link(f"{r.prefix}index.html", r.model) for r in reports] if by_model else [], by_model=by_model,
        models_note=MODELS_NOTE, presets=tables.presets, presets_note=PRESETS_NOTE,
        figures=[row for row in shown if row.image], outputs=outputs, heads=tables.heads, heads_note=HEAD_FILES_NOTE, run_time_note=RUN_TIME_NOTE,
        answer=ANSWER_FIGURE if tables.answer else "", answer_alt=ANSWER_ALT, sections=tables.sections,
        runs=[{"notebook": notebook, "link": _notebook_links(output_dir, notebook)[0], "model": str(run.get("model")),
               "preset": str(run.get("preset")), "parameters": _json.dumps(run.get("parameters", {})),
               "date": str(run.get("date")), "minutes": str(run.get("minutes"))}
              for notebook, run in sorted(runs.items())])


def build_index(output_dir: Path) -> Path:
    """Write ``README.md`` and ``index.html`` in ``output_dir`` from the outputs actually present.

    Three kinds of folder get an index: a model's report (``<preset>/<model>/``: every item's row, its pages, files
    and runs), a preset's folder (the models side by side) and the report's root (the answer, then each preset's
    table). Every link is relative to ``output_dir`` and stays inside it, so the folder can be moved or published as
    it is, except the links of a nested index back up to each index that holds it (:func:`up_links`), which is
    published with it. Call it after :func:`render_notebook_html`, so notebook links go to the renderings. A claim's
    section across a preset's models (``Claim.section``: notebook 07's size axis in the ``scale`` preset's folder,
    drawn afresh here) follows the answer on both pages. Returns the README path.
    """
    output_dir = Path(output_dir)
    runs = read_runs(output_dir)
    tables = _Tables.read(output_dir)
    # A preset's folder and the report's root list reports; only a model's report (or an empty folder) has item rows.
    lists = not runs and bool(tables.by_model or tables.presets)
    rows = [] if lists else _rows(output_dir, runs)
    up = up_links(output_dir)
    atomic_write_text(output_dir / "README.md", _markdown(rows, runs, tables, up))
    atomic_write_text(output_dir / "index.html", _html_page(rows, runs, output_dir, tables, up))
    return output_dir / "README.md"


# --- HTML renderings of executed notebooks ---------------------------------------------------------

def render_notebook_html(executed_ipynb: Path) -> Path:
    """Render an executed notebook to ``<same folder>/<stem>.html``, a page of the report's site that works
    offline (see :func:`dynheads_tl.report.site.render_page`); returns its path."""
    return render_page(Path(executed_ipynb))
