"""The declared schema of a notebook run's results file, ``<output folder>/verdicts.json`` (pydantic v2).

One model per level, each closed to unknown fields, so a results file either validates or says which field is
wrong. :mod:`dynheads_tl.verdicts` is the one writer: it validates what it writes and what it reads back. The
report layer (the README's answer table, the index, the site) reads these fields; nothing parses a verdict
sentence to learn what a run concluded.

``SCHEMA_VERSION`` is stored in every file; a file of another version is not read as results (the report then
recomputes them from the notebook's files). The JSON Schema of :class:`Results` is committed as
``docs/results.schema.json`` (``python -m dynheads_tl.results_schema`` prints it; a test keeps the two equal).
"""
from __future__ import annotations

import json
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from dynheads_tl.claim import BEYOND_STATUSES, PAPER_STATUSES

__all__ = ["SCHEMA_VERSION", "STATUSES", "Interval", "DeclaredPrimary", "Observed", "PrimaryResult", "ItemResult",
           "FindingResult", "OutputResult", "RunRecord", "Preregistration", "Results", "json_schema"]

SCHEMA_VERSION = 2
# Every status a rule may give, and "see files" (no rule could read the item's files: an older run's).
STATUSES = tuple(dict.fromkeys(PAPER_STATUSES + BEYOND_STATUSES + ("see files",)))
Status = Literal[STATUSES]  # type: ignore[valid-type]


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Interval(_Closed):
    """A confidence interval: its bounds and level (0.95 for a 95% interval)."""

    low: Optional[float]
    high: Optional[float]
    level: float = Field(0.95, gt=0, lt=1)


class DeclaredPrimary(_Closed):
    """A claim's primary comparison as ``preregistration.yaml`` declares it (after its dated amendments)."""

    id: str
    measure: str
    comparison: str
    test: str
    direction: str
    sesoi: float = Field(description="the smallest effect of interest, in the measure's units")
    units: str
    note: Optional[str] = None


class Observed(_Closed):
    """A primary comparison as a run's files give it."""

    estimate: Optional[float]
    interval: Interval
    n: Optional[int] = Field(description="independent units the test and interval count")
    units: str = Field(description="what n counts (samples, layouts, questions, splits)")
    test: str
    p: Optional[float]
    p_adjusted: Optional[float]
    computed: str = Field(description="what exactly the files hold (task, conditions, column)")
    n_answers: Optional[int] = None
    n_samples: Optional[int] = None


class PrimaryResult(_Closed):
    """A claim's primary: its declaration, its observed numbers (None where this run's files hold no such
    comparison, with ``missing`` saying why) and the index row whose status it decides."""

    id: Optional[str]
    item: Optional[str] = Field(None, description="the index row whose status reads this primary")
    declared: Optional[DeclaredPrimary]
    observed: Optional[Observed]
    missing: Optional[str] = None


class ItemResult(_Closed):
    """One index row (a paper item, or an item beyond the paper) of one run."""

    item: str
    rule_id: str = Field(description="where preregistration.yaml declares the rule: claims.<claim>.items.<item>")
    status: Status
    declared_rule: Optional[list[str]]
    produced: bool = Field(description="whether the row's own files are present")
    headline: str
    why: str
    ours: str
    files: list[str]
    data: Literal["real", "synthetic"] = Field(description="synthetic: HotpotQA-format questions from the seeded "
                                                          "generator; real: every other item")
    primary: Optional[PrimaryResult] = Field(None, description="the claim's primary where it decides this row")


class FindingResult(_Closed):
    """A verdict the notebook states, as sentences computed from its files, and the section that shows it."""

    label: str
    section: str
    sentences: list[str]


class OutputResult(_Closed):
    """A figure or table the notebook wrote: its files, caption and the cell that wrote it."""

    stem: str
    kind: Literal["figure", "table"]
    files: list[str]
    caption: str
    cell_id: Optional[str]
    cell_source: Optional[str] = Field(description="sha256 of the writing cell's source")


class RunRecord(_Closed):
    """The runner's record of the run: when, how long, and the parameters it changed from the preset's."""

    date: Optional[str]
    minutes: Optional[float]
    parameters: dict


class Preregistration(_Closed):
    file: str
    sha256: str


class Results(_Closed):
    """A notebook run's results: ``<output folder>/verdicts.json``."""

    schema_version: Literal[SCHEMA_VERSION]  # type: ignore[valid-type]
    notebook: str
    claim: str
    title: str
    model: Optional[str]
    preset: Optional[str]
    run: RunRecord
    contexts: Optional[dict[str, list[int]]] = Field(description="context lengths read, per task (tokens)")
    preregistration: Preregistration
    primary: Optional[PrimaryResult]
    items: list[ItemResult]
    findings: list[FindingResult]
    outputs: list[OutputResult]
    outputs_recorded: dict[str, dict] = Field(description="what the notebook recorded as it saved each output")

    def item(self, name: str) -> ItemResult | None:
        """The row named ``name`` ("Fig 2"), or None."""
        return next((row for row in self.items if row.item == name), None)


def json_schema() -> dict:
    """The JSON Schema of :class:`Results` (committed as ``docs/results.schema.json``)."""
    return Results.model_json_schema()


if __name__ == "__main__":  # pragma: no cover - prints the committed schema
    print(json.dumps(json_schema(), indent=1, sort_keys=True))
