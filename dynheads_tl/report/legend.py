"""What an index shows beside its rows: the legend of every status it can show, and the links from a nested report
(a model's under ``models/<model>/``, a preset's under ``<preset>/``) back up to the indexes that hold it."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dynheads_tl.claim import BEYOND_STATUSES, PAPER_STATUSES
from dynheads_tl.report.results import MODELS_DIR, committed_presets

MISSING = "missing"
NOT_IN_PRESET = "not run in this preset"

# Every status an index can show, with what it says (the page's and the README's legend): the paper's items'
# statuses, then those of items beyond the paper, then what a row or a cell shows without a status.
STATUS_LEGEND = (
    ("reproduced", "the paper's item holds here, on every measure its rule reads"),
    ("weaker", "the same direction as the paper, less strongly or on only part of its measures (synthetic data "
               "and a missing half also cap a status here)"),
    ("not reproduced", "the data go against the paper's item"),
    ("absent in this setting", "the phenomenon the paper describes does not occur here (for example D_t stays "
                               "inside the static set); a finding, not a failed run"),
    ("undetermined", "the intervals cannot tell"),
    ("no headroom", "the setting cannot separate the conditions compared (for example the model fails the task "
                    "even unmasked), so the comparison says nothing and ranks nothing"),
    ("qualitative", "a picture, with no verdict"),
    ("supported", "an item beyond the paper: our hypothesis holds"),
    ("partly supported", "it holds in part (at some lags or settings only, or against a weaker control than the "
                         "declared one)"),
    ("not supported", "it does not hold"),
    ("descriptive", "a measurement with no hypothesis attached"),
    ("see files", "no rule could read the item's files (an older run's, of another shape); see the files"),
    (MISSING, "the report (in the table of every model: that model's report) has no files for the item, and its "
              "numbers say so: its notebook has not run there, or failed; run it"),
    (NOT_IN_PRESET, "this preset does not run the item's notebook, by design; the default report has it"),
)


def status_legend() -> list[tuple[str, str]]:
    """:data:`STATUS_LEGEND`, checked to hold every status a claim may give (``PAPER_STATUSES``,
    ``BEYOND_STATUSES``)."""
    named = {status for status, _ in STATUS_LEGEND}
    undefined = [status for status in (*PAPER_STATUSES, *BEYOND_STATUSES) if status not in named]
    if undefined:
        raise ValueError(f"The index's legend defines no meaning for the status(es) {undefined}; add them to "
                         "STATUS_LEGEND in dynheads_tl/report/legend.py.")
    return list(STATUS_LEGEND)


@dataclass(frozen=True)
class UpLink:
    """A link from a report nested in another (a model's under ``models/<model>/``, a preset's under ``<preset>/``)
    back to the index of a report that holds it: ``href`` (relative, ``../../index.html``) and ``markdown`` (the
    same to its README.md), ``title``."""
    title: str
    href: str
    markdown: str


def enclosing_reports(output_dir: Path) -> list[tuple[str, Path]]:
    """The reports that hold ``output_dir`` and list it, outermost first, each with its title: a model's report under
    ``<report>/models/<model>/`` is held by ``<report>``; a preset's under ``<report>/<preset>/`` (a committed preset,
    :func:`~dynheads_tl.report.results.committed_presets`) by ``<report>``. Only folders that hold a report
    (``runs.json`` or an index) count."""
    def is_report(folder: Path) -> bool:
        return any((folder / name).is_file() for name in ("runs.json", "index.html"))

    found, folder = [], Path(output_dir).resolve()
    while True:
        if folder.parent.name == MODELS_DIR and is_report(folder.parent.parent):
            holder = folder.parent.parent
        elif folder.name in committed_presets() and is_report(folder.parent):
            holder = folder.parent
        else:
            break
        found.append(holder)
        folder = holder
    outermost_first = found[::-1]
    return [("The report's top index" if i == 0 else f"Preset {f.name}'s index", f)
            for i, f in enumerate(outermost_first)]


def up_links(output_dir: Path) -> list[UpLink]:
    """:func:`enclosing_reports` as links from ``output_dir``'s index to theirs, each only where that index exists (a
    nested report built before the report that holds it links up once the latter is built and it is built again)."""
    here = Path(output_dir).resolve()
    links = []
    for title, folder in enclosing_reports(here):
        if (folder / "index.html").is_file() and (folder / "README.md").is_file():
            up = Path(*[".."] * len(here.relative_to(folder).parts))
            links.append(UpLink(title, (up / "index.html").as_posix(), (up / "README.md").as_posix()))
    return links
