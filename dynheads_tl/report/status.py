"""Each index row's status and one-cell headline, as its claim's results give them.

The index's "ours" column holds every number of an item; a reader skimming the index needs less: whether the item
reproduced, and the one number that says so, with its interval and n. Each claim's report part
(``dynheads_tl/claims/<claim>/report.py``) declares, per index row, a rule that reads the CSVs its notebook wrote and
states its thresholds in its docstring (:class:`~dynheads_tl.claim.PaperItem`); the results file of the notebook's
folder (``verdicts.json``, :mod:`dynheads_tl.verdicts`) records what it gave. The statuses are
:data:`~dynheads_tl.claim.PAPER_STATUSES` for the paper's items and :data:`~dynheads_tl.claim.BEYOND_STATUSES` for
ours.
"""
from __future__ import annotations

from pathlib import Path

from dynheads_tl.claim import BEYOND_STATUSES, PAPER_STATUSES, Status
from dynheads_tl.claims import all_claims
from dynheads_tl.report.results import claim_results

__all__ = ["BEYOND_STATUSES", "PAPER_STATUSES", "STATUS_CLASS", "Status", "item_status"]

STATUS_CLASS = {"reproduced": "good", "supported": "good", "weaker": "mixed", "partly supported": "mixed",
                "not reproduced": "bad", "not supported": "bad", "absent in this setting": "absent",
                "undetermined": "open", "no headroom": "open", "qualitative": "none", "descriptive": "none",
                "not produced": "bad", "missing": "bad", "not run in this preset": "none", "not run": "none",
                "see files": "none"}


def item_status(output_dir: Path, item: str) -> Status:
    """The status and headline of the index row called ``item`` in the report at ``output_dir``, from its claim's
    results; ``not run`` when the report holds no run of the claim's notebook (its output folder is absent); ``see
    files`` when no rule is declared or its CSVs are missing or of another shape (an older run), so the index is
    still written."""
    for claim in all_claims():
        if any(declared.item == item for declared in claim.items):
            if not (Path(output_dir) / claim.notebook).is_dir():
                return Status("not run", f"this report holds no run of notebook {claim.notebook[:2]}")
            data = claim_results(output_dir, claim)
            row = data.item(item) if data is not None else None
            if row is None:
                return Status("see files", "see the files")
            return Status(row.status, row.headline, row.why)
    return Status("see files", "see the files")
