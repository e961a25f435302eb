"""The answer: does the paper hold on these models? One table and one figure, rendered from every results file of
a report (``verdicts.json``, read through the schema as typed data), with no sentence selected by its words.

- **Columns** are settings: every model's report of the default preset (``default/<model>/``), then of each
  committed preset (``<preset>/<model>/``). They are found by walking the report, so a third model is one more
  folder and no change here.
- **Rows** are each claim's primary (the row its status decides, ``Primary.item``: its status with the primary's
  estimate and interval), then every item beyond the paper that some setting gives a verdict (descriptive and
  qualitative rows say nothing to a reader skimming for the answer; the index has them).
- **The figure** is a forest plot: one panel per primary, one row per setting with its estimate and interval,
  coloured by the row's status, the smallest effect of interest as a band around zero.

The README quotes :func:`answer_markdown` between its ``answer`` markers, and shows the figure; the top index shows
both on its first screen. ``python -m dynheads_tl.report.rerender papers_figures --readme README.md`` refreshes
them; a test fails when the README's table differs from the committed results.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from dynheads_tl import preregistration
from dynheads_tl.claim import ReportSection
from dynheads_tl.claims import all_claims
from dynheads_tl.report.results import PresetReport, all_results, model_reports, preset_reports
from dynheads_tl.results_schema import ItemResult, Results
from dynheads_tl.store import atomic_write_text

__all__ = ["ANSWER_START", "ANSWER_END", "ANSWER_ALT", "FIGURE", "Setting", "Cell", "Row", "settings", "answer_rows",
           "answer_markdown", "answer_figure", "update_answer", "has_answer_block", "readme_answer", "summed_presets",
           "preset_sections"]

ANSWER_START, ANSWER_END = "<!-- answer:start -->", "<!-- answer:end -->"
FIGURE = "answer.png"  # in the report's root folder
ANSWER_ALT = "Forest plot: each claim's primary per model and setting, estimate, interval and status"
TEMPLATES = Path(__file__).parent / "templates" / "markdown"
SILENT = {"descriptive", "qualitative"}  # statuses that answer nothing on their own


@dataclass(frozen=True)
class Setting:
    """One column: a model's report under one preset."""

    model: str
    preset: str
    folder: Path
    link: str  # the folder's path from the report's root ("", "models/gemma-3-270m/", "long/")
    results: dict[str, Results]  # notebook stem -> its typed results

    @property
    def label(self) -> str:
        return f"{self.model} · {self.preset}"


@dataclass(frozen=True)
class Cell:
    """One setting's reading of one row: the status and, on a primary's row, its numbers (None when the setting
    did not run the item)."""

    status: str | None
    estimate: float | None = None
    low: float | None = None
    high: float | None = None
    n: int | None = None
    units: str = ""
    synthetic: bool = False

    @property
    def side(self) -> str:
        """Where the primary's interval lies: "above 0", "below 0" or "includes 0" (the item's status reads more
        than the primary, so a reader sees the primary's own direction beside it)."""
        if self.low is None or self.high is None:
            return ""
        return "above 0" if self.low > 0 else "below 0" if self.high < 0 else "includes 0"

    @property
    def text(self) -> str:
        if self.status is None:
            return "–"
        text = f"**{self.status}**"
        if self.estimate is not None and self.low is not None and self.high is not None:
            text += f"; primary {_signed(self.estimate)} [{_signed(self.low)}, {_signed(self.high)}], {self.side}"
        return text + (" (synthetic)" if self.synthetic else "")


@dataclass(frozen=True)
class Row:
    """One row of the answer: a claim's primary (``measure`` and ``sesoi`` set) or an item beyond the paper."""

    label: str
    item: str
    notebook: str
    cells: list[Cell]
    measure: str = ""
    sesoi: float | None = None


def _signed(value: float) -> str:
    return f"{value:+.3f}".replace("-", "−")


def settings(output_dir: Path) -> list[Setting]:
    """Every column of the answer: each model's report of the default preset, then of each committed preset."""
    output_dir = Path(output_dir)
    found = []
    summed = summed_presets()  # quoted by their claims' sections, not a column per model
    for preset in preset_reports(output_dir):
        if preset.preset in summed:
            continue
        for report in model_reports(preset.folder):
            results = all_results(report.folder)
            if results:
                found.append(Setting(report.model, preset.preset, report.folder, f"{preset.prefix}{report.prefix}",
                                     results))
    return found


def summed_presets() -> set[str]:
    """The committed presets a claim's section sums up across their models (``Claim.section_presets``)."""
    return {preset for claim in all_claims() for preset in claim.section_presets}


def preset_sections(preset: PresetReport) -> list[ReportSection]:
    """The sections of the claims that sum up ``preset``'s runs, read without redrawing them (the index drew them)."""
    return [section for claim in all_claims() if claim.section and preset.preset in claim.section_presets
            for section in [claim.section(preset.folder, write=False)] if section is not None]


def _cell(setting: Setting, notebook: str, item: str) -> Cell:
    results = setting.results.get(notebook)
    row: ItemResult | None = results.item(item) if results else None
    if row is None or not row.produced:
        return Cell(None)
    observed = row.primary.observed if row.primary is not None else None
    if observed is None:
        return Cell(row.status, synthetic=row.data == "synthetic")
    return Cell(row.status, observed.estimate, observed.interval.low, observed.interval.high, observed.n,
                observed.units, row.data == "synthetic")


def answer_rows(columns: list[Setting]) -> list[Row]:
    """The claims' primaries, then the items beyond the paper some setting gives a verdict, in notebook order."""
    rows = []
    for claim in all_claims():
        primary = claim.primary
        if primary is not None and primary.item is not None:
            declared = next((s.results[claim.notebook].primary.declared for s in columns
                             if claim.notebook in s.results and s.results[claim.notebook].primary is not None
                             and s.results[claim.notebook].primary.declared is not None), None)
            rows.append(Row(f"{claim.title} ({primary.item})", primary.item, claim.notebook,
                            [_cell(s, claim.notebook, primary.item) for s in columns],
                            measure=(("difference in " if "minus" in declared.comparison else "")
                                     + _short(declared.measure)) if declared else primary.id,
                            sesoi=declared.sesoi if declared else None))
    for claim in all_claims():
        for item in claim.items:
            if not item.beyond or (claim.primary is not None and claim.primary.item == item.item):
                continue
            cells = [_cell(s, claim.notebook, item.item) for s in columns]
            if any(c.status is not None and c.status not in SILENT for c in cells):
                rows.append(Row(f"{item.item}: {item.what.split(' (')[0].split('? ')[0]}", item.item, claim.notebook,
                                cells))
    return rows


def _short(measure: str) -> str:
    """A declared measure's name without its qualifications: its parentheses removed, then its text up to the first
    comma."""
    return " ".join(re.sub(r"\([^()]*\)", "", measure).split(",")[0].split())


def _environment() -> Environment:
    return Environment(loader=FileSystemLoader(TEMPLATES), autoescape=False, trim_blocks=True, lstrip_blocks=True,
                       keep_trailing_newline=False, undefined=StrictUndefined)


def answer_markdown(output_dir: Path, link_prefix: str = "papers_figures/", *,
                    columns: list[Setting] | None = None) -> str:
    """The answer table (Markdown, from ``answer.md.j2``), its reading line, the sentences of the claims' sections
    over the presets they sum up (the size axis: ``Claim.section_presets``) and the figure's link; ``columns``:
    :func:`settings` of ``output_dir`` where the caller has read them already."""
    columns = settings(output_dir) if columns is None else columns
    rows = answer_rows(columns)
    declared = preregistration.load()
    sections = [(report.prefix, section) for report in preset_reports(Path(output_dir))
                for section in preset_sections(report)]
    return _environment().get_template("answer.md.j2").render(
        columns=columns, rows=rows, link_prefix=link_prefix, figure=FIGURE, alt=ANSWER_ALT, sections=sections,
        has_figure=(Path(output_dir) / FIGURE).exists(), confirmatory=declared.get("confirmatory") or [],
        exploratory=declared.get("exploratory") or [],
        synthetic=any(c.synthetic for r in rows for c in r.cells)).strip()


STATUS_COLOURS = {"reproduced": "#1a7f37", "supported": "#1a7f37", "weaker": "#bf8700", "partly supported": "#bf8700",
                  "not reproduced": "#cf222e", "not supported": "#cf222e", "absent in this setting": "#8250df",
                  "undetermined": "#57606a", "no headroom": "#afb8c1"}


def answer_figure(output_dir: Path, path: Path | None = None, *, columns: list[Setting] | None = None) -> Path | None:
    """Draw the forest plot of every primary (:func:`answer_rows`' primary rows) to ``<output_dir>/answer.png``;
    None (and no file) when no setting states a primary. ``columns`` as for :func:`answer_markdown`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = settings(output_dir) if columns is None else columns
    rows = [r for r in answer_rows(columns) if r.sesoi is not None
            and any(c.estimate is not None for c in r.cells)]
    if not rows:
        return None
    import textwrap

    n_cols = 3
    n_rows = (len(rows) + n_cols - 1) // n_cols
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(13, (0.45 * len(columns) + 1.6) * n_rows + 1.2),
                             squeeze=False, sharey=True)
    labels = [s.label.replace(" · ", "\n") for s in columns]
    shown = set()
    for ax, row in zip(axes.flat, rows):
        ax.axvspan(-row.sesoi, row.sesoi, color="#d0d7de", alpha=0.6, lw=0)
        ax.axvline(0, color="#57606a", lw=0.8)
        for y, cell in enumerate(row.cells):
            if cell.estimate is None or cell.low is None or cell.high is None:
                ax.text(0.5, y, cell.status or "not run", ha="center", va="center", fontsize=9, color="#57606a",
                        transform=ax.get_yaxis_transform(), style="italic")
                continue
            colour = STATUS_COLOURS.get(cell.status or "", "#57606a")
            marker = "s" if cell.synthetic else "o"
            ax.errorbar(cell.estimate, y, xerr=[[cell.estimate - cell.low], [cell.high - cell.estimate]],
                        fmt=marker, color=colour, capsize=3, ms=6, mfc="white" if cell.synthetic else colour)
            ax.text(1.01, y, f"n = {cell.n}", transform=ax.get_yaxis_transform(), va="center", fontsize=9,
                    color="#57606a")
            shown.add(cell.status)
        ax.set_yticks(range(len(labels)), labels, fontsize=9)
        ax.set_ylim(len(labels) - 0.5, -0.5)
        ax.set_title("\n".join(textwrap.wrap(row.label, 34)), fontsize=10, loc="left")
        ax.set_xlabel("\n".join(textwrap.wrap(row.measure, 42)), fontsize=9)  # "difference in ..." for a contrast
        ax.tick_params(axis="x", labelsize=9)
    for ax in list(axes.flat)[len(rows):]:
        ax.axis("off")
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], marker="o", ls="", color=STATUS_COLOURS[s], label=s) for s in STATUS_COLOURS
               if s in shown]
    handles.append(Line2D([], [], marker="s", ls="", color="#57606a", mfc="white",
                          label="synthetic HotpotQA-format data"))
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 5), fontsize=9, frameon=False)
    fig.suptitle("Each claim's pre-registered primary per model and setting: estimate and 95% interval (n: its "
                 "independent units); grey band: within ± the smallest effect of interest.\nThe paper reports none "
                 "of these comparisons (they are the fair versions this suite declared); colour: the row's status.",
                 fontsize=10, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0.05, 1, 0.93), w_pad=3.5)
    path = Path(path or Path(output_dir) / FIGURE)
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path


def has_answer_block(readme_text: str) -> bool:
    """Whether a README has both answer markers, start before end (:func:`update_answer` fills between them)."""
    start, end = readme_text.find(ANSWER_START), readme_text.find(ANSWER_END)
    return 0 <= start < end


def readme_answer(readme_text: str) -> str:
    """The block between a README's answer markers, stripped ("" when it has none)."""
    if not has_answer_block(readme_text):
        return ""
    return readme_text.split(ANSWER_START, 1)[1].split(ANSWER_END, 1)[0].strip()


def update_answer(readme: Path, output_dir: Path, link_prefix: str = "papers_figures/") -> bool:
    """Draw the figure and write :func:`answer_markdown` between ``readme``'s answer markers; True when the README
    changed."""
    readme = Path(readme)
    text = readme.read_text(encoding="utf-8")
    if not has_answer_block(text):
        raise ValueError(f"{readme} has no {ANSWER_START} … {ANSWER_END} block to fill.")
    columns = settings(output_dir)  # every results file read and validated once, for the figure and the table
    answer_figure(output_dir, columns=columns)
    head, rest = text.split(ANSWER_START, 1)
    _, tail = rest.split(ANSWER_END, 1)
    new = f"{head}{ANSWER_START}\n{answer_markdown(output_dir, link_prefix, columns=columns)}\n{ANSWER_END}{tail}"
    if new != text:
        atomic_write_text(readme, new)
    return new != text
