"""The index's rows as the claims declare them (:class:`~dynheads_tl.claim.PaperItem`, in the paper's order) and what a
report folder holds for each: its file stem, its task, its row of the claim's results (``verdicts.json``), its "ours"
text from the files present, and what a report lacking it shows. :mod:`dynheads_tl.report.index` builds the index
from them; :mod:`dynheads_tl.report.across` puts several models' rows side by side."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from dynheads_tl import verdicts
from dynheads_tl.claims import all_claims
from dynheads_tl.report.legend import MISSING, NOT_IN_PRESET
from dynheads_tl.results_schema import ItemResult, Results


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


def absent_status(claim, runs: dict[str, Any]) -> str:
    """What a report lacking ``claim``'s files shows: NOT_IN_PRESET where its runs, all of one named preset (not
    ``default``) the claim declares nothing for (``Claim.presets``: ``long`` never runs 02 or 04), hold no run of the
    notebook (left out by design), else MISSING."""
    presets = {str(run.get("preset")) for run in runs.values()}
    return NOT_IN_PRESET if (len(presets) == 1 and not presets & {"default", "None"} and claim.notebook not in runs
                             and not presets & set(claim.presets)) else MISSING


def _rel(path: Path, output_dir: Path) -> str:
    return path.relative_to(output_dir).as_posix()


def _result_row(results: dict[str, Results], claim, item) -> ItemResult | None:
    """The item's row of its claim's results (``verdicts.json``), or None when the notebook wrote no folder."""
    found = results.get(claim.notebook)
    return found.item(item.item) if found is not None else None
