"""Each index row's status and one-cell headline, computed by the rule its claim declares.

The index's "ours" column holds every number of an item (``index.ours_text``); a reader skimming the index needs
less: whether the item reproduced, and the one number that says so, with its interval and n. Each claim's report
part (``dynheads_tl/claims/<claim>/report.py``) declares, per index row, a rule that reads the CSVs its notebook
wrote and states its thresholds in its docstring (:class:`~dynheads_tl.claim.PaperItem`). The statuses are
:data:`~dynheads_tl.claim.PAPER_STATUSES` for the paper's items and :data:`~dynheads_tl.claim.BEYOND_STATUSES` for
ours.
"""
from __future__ import annotations

from pathlib import Path

from dynheads_tl.claim import BEYOND_STATUSES, PAPER_STATUSES, Status

__all__ = ["BEYOND_STATUSES", "PAPER_STATUSES", "STATUS_CLASS", "Status", "item_status"]

STATUS_CLASS = {"reproduced": "good", "supported": "good", "weaker": "mixed", "partly supported": "mixed",
                "not reproduced": "bad", "not supported": "bad", "absent in this setting": "absent", "undetermined": "open", "no headroom": "open",
                "qualitative": "none", "descriptive": "none", "not produced": "bad", "see files": "none"}


def item_status(output_dir: Path, item: str) -> Status:
    """The status and headline of the index row called ``item`` in the report at ``output_dir``; ``see files`` when
    no rule is declared or its CSVs are missing or of another shape (an older run), so the index is still written."""
    from dynheads_tl.report.index import find_item

    try:
        claim, declared = find_item(item)
    except KeyError:
        return Status("see files", "see the files")
    if declared.status is None:
        return Status("see files", "see the files")
    try:
        return declared.status(Path(output_dir) / claim.notebook)
    except (OSError, KeyError, IndexError, ValueError, AttributeError, TypeError):
        return Status("see files", "see the files")
