"""What an index shows beside its rows: the legend of every status it can show, the banner of smoke-size runs, and
the links from a nested index (a model's report in ``<preset>/<model>/``, a preset's folder ``<preset>/``) back up to
the indexes that hold it."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynheads_tl.claim import BEYOND_STATUSES, PAPER_STATUSES
from dynheads_tl.report.results import is_model_report, preset_names

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


# Presets whose sizes only exercise the code (a few samples per cell: the tests' notebook runs); an index of such runs
# says, above its table, that its statuses are no evidence either way.
SMOKE_PRESETS = ("smoke",)


def smoke_banner(runs: dict[str, Any]) -> str:
    """The warning an index of smoke-size runs carries, or "" when no run of this folder used a smoke preset."""
    smoke = sorted(notebook for notebook, run in runs.items() if run.get("preset") in SMOKE_PRESETS)
    if not smoke:
        return ""
    which = "every notebook" if len(smoke) == len(runs) else ", ".join(smoke)
    return (f"Smoke-size runs ({which}): a few samples per cell, enough to run every code path and no more. Their "
            "statuses and intervals are not evidence for or against any claim (a 'not reproduced' here means nothing); "
            "the report's findings come from the default preset.")


@dataclass(frozen=True)
class UpLink:
    """A link from a nested index (a model's report in ``<preset>/<model>/``, a preset's folder ``<preset>/``) back
    to an index that holds it: ``href`` (relative, ``../../index.html``) and ``markdown`` (the same to its README.md),
    ``title``."""
    title: str
    href: str
    markdown: str


def enclosing_reports(output_dir: Path) -> list[tuple[str, Path]]:
    """The indexes that hold ``output_dir`` and list it, outermost first, each with its title: a model's report
    (``runs.json``) in a folder named after a preset is held by that preset's folder, and a preset's folder by the
    folder above it (the report's root). Only folders whose index exists count: a folder a user named is never
    given an index it did not have."""
    presets = set(preset_names())
    found, folder = [], Path(output_dir).resolve()
    while True:
        parent = folder.parent
        if not (parent / "index.html").is_file() or is_model_report(parent) or parent == folder:
            break
        if is_model_report(folder) and parent.name in presets:
            found.append((f"Preset {parent.name}'s index", parent))
        elif not is_model_report(folder) and folder.name in presets:
            found.append(("The report's top index", parent))
        else:
            break
        folder = parent
    return found[::-1]


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
