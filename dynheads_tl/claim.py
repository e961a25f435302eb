"""What a claim declares about itself, so that the report layer can iterate over the claims and keep no
per-claim tables of its own.

Each folder ``dynheads_tl/claims/<name>/`` exports one :class:`Claim` as ``CLAIM``: its notebook, its config class,
its presets (the parameters that differ from the config's defaults), its index rows (:class:`PaperItem`, each with
the paper's numbers typed once, a headline and a status read from the files the notebook wrote), the verdicts the
README quotes (:class:`Finding`), its primary comparison (:class:`Primary`) and its seed offsets.
``dynheads_tl.claims.all_claims`` finds them; adding a notebook is one folder.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from dynheads_tl.analysis.statistics import format_interval
from dynheads_tl.store import atomic_write_text
from dynheads_tl.tasks.hotpot_sources import questions_table

# Index statuses. Of the paper's items: reproduced, weaker (the same direction, less strongly than the paper), not
# reproduced, undetermined (the intervals cannot tell), no headroom (the setting does not separate its bounds, so
# the comparison says nothing) and qualitative (a picture, no verdict). Items beyond the paper test a hypothesis
# of ours: supported, partly supported, not supported, undetermined, no headroom, or descriptive (a measurement
# with no hypothesis attached).
# Either list also holds "absent in this setting": the phenomenon the paper describes does not occur here (for
# example D_t stays inside S_20), a finding distinct from "not reproduced" and from "no headroom". The
# pre-registration file (preregistration.yaml) lists the same words.
PAPER_STATUSES = ("reproduced", "weaker", "not reproduced", "absent in this setting", "undetermined", "no headroom",
                  "qualitative")
BEYOND_STATUSES = ("supported", "partly supported", "not supported", "absent in this setting", "undetermined",
                   "no headroom", "descriptive")


@dataclass(frozen=True)
class Status:
    """An index row's computed status, the headline number with its interval and n, and the rule that gave it."""

    status: str
    headline: str
    why: str = ""


@dataclass(frozen=True)
class PaperItem:
    """One row of the report's index.

    ``output`` is the file stem inside the claim's output folder (``fig2_niah_masking``: the notebook wrote
    ``fig2_niah_masking.png`` / ``.csv`` there). ``headline(stem)`` returns the "ours" cell from those files (every
    number of the item); ``status(folder)`` returns its :class:`Status` from the folder's CSVs (the rule is in the
    function's docstring). ``position`` orders the index (the paper's order: tables and figures, then ours).
    ``hotpot``: its data are HotpotQA-format questions, labelled synthetic unless the run names a real file. (The
    index deep-links each row to the notebook heading above the cell that wrote its files: ``report.site``.)"""

    item: str
    what: str
    paper: str
    output: str
    position: float
    headline: Callable[[Path], str] | None = None
    status: Callable[[Path], Status] | None = None
    hotpot: bool = False

    @property
    def beyond(self) -> bool:
        return self.item.startswith("Beyond")


@dataclass(frozen=True)
class Finding:
    """A verdict the README quotes. ``sentences(folder)`` computes its sentences from the files the notebook wrote
    in its output folder, by the same functions the notebook's verdict cell calls (so a committed report can be
    re-rendered without a model); ``section`` is the heading of the notebook section that shows the verdict (the
    README links there)."""

    label: str
    sentences: Callable[[Path], list[str]]
    section: str = ""


@dataclass(frozen=True)
class ReportSection:
    """A section a claim adds to the index of a report that holds its runs across models (after the answer): a
    ``title``, a ``figure`` (a file in the report's folder) and its ``alt`` text, computed ``sentences`` (Markdown),
    and a table (``header``, ``rows`` of cell texts). Notebook 07's size axis is one."""

    title: str
    figure: str
    alt: str
    sentences: tuple[str, ...]
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    brief: tuple[str, ...] = ()  # the sentences shortened for the README's first screen ("" parts left out)
    about: str = ""  # what the brief sentences rest on, said once (the models read)

    def markdown(self) -> list[str]:
        lines = [f"## {self.title}", "", f"![{self.alt}]({self.figure})", ""]
        lines += [f"- {sentence}" for sentence in self.sentences] + [""]
        lines += ["| " + " | ".join(self.header) + " |", "|" + "---|" * len(self.header)]
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        return lines + [""]


@dataclass(frozen=True)
class Primary:
    """A claim's primary comparison as its code computes it. ``id`` names the declaration in the pre-registration
    file (``preregistration.yaml``: ``claims.<name>.primary.id``) that this computation implements; ``observed``
    reads its numbers from the output folder: a dict with ``estimate``, ``low``, ``high``, ``n``, ``units``,
    ``test``, ``p``, ``p_adjusted`` and ``computed`` (what exactly the files hold; ``level``, the interval's, where
    it is not 0.95), or None when this run's files hold no such comparison. ``item`` names the index row whose
    status reads this primary (the README's answer table shows the two together)."""

    id: str
    observed: Callable[[Path], dict[str, Any] | None]
    item: str | None = None


@dataclass(frozen=True)
class Claim:
    """A notebook's declaration: ``notebook`` is its stem (``02_irreplaceability``, the file name in
    ``notebooks/`` and the output folder's name), ``config`` its config class, ``presets`` its parameter overrides
    per preset (``{"smoke": {...}, "paper": {...}}``; ``default`` is the config's own defaults), ``title`` the name
    of its page in the report's site, ``items`` its index rows, ``findings`` the verdicts the README quotes,
    ``seeds`` the seed offsets of the sample splits only this claim draws (added to a run's seed; the shared ones
    are ``corpus.SEED_OFFSETS``), ``primary`` its primary comparison (None for a claim that tests nothing),
    ``committed`` the presets of its own whose runs the committed report keeps beside the default one, for every
    embedded model (``papers_figures/<preset>/``: notebook 07's pre-registered ``long`` grid and its ``scale`` size
    axis), ``section`` what the claim shows in the index of a report across its models (:class:`ReportSection`)."""

    notebook: str
    config: type
    title: str = ""  # the site's name for the notebook's page ("Claim 2: irreplaceability")
    presets: dict[str, dict[str, Any]] = field(default_factory=dict)
    items: tuple[PaperItem, ...] = ()
    findings: tuple[Finding, ...] = ()
    seeds: dict[str, int] = field(default_factory=dict)
    primary: Primary | None = None
    committed: tuple[str, ...] = ()
    # Called by the index of every report but a model's inside another: the claim's section across that report's
    # models (it first writes its own files there), or None where the report holds nothing for it; called with
    # write=False by the pages that quote it after the index was built (the README's answer, the findings).
    section: Callable[..., ReportSection | None] | None = None
    # The committed presets whose runs the section sums up: the README's answer quotes the section's sentences for
    # them instead of giving each of their models a column (notebook 07's scale).
    section_presets: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        number, _, name = self.notebook.partition("_")
        if not (number.isdigit() and name):
            raise ValueError(f"A claim's notebook stem is NN_name, got {self.notebook!r}.")
        if "default" in self.presets and self.presets["default"]:
            raise ValueError(f"{self.notebook}: the default preset is the config's own defaults; change those instead.")
        for finding in self.findings:
            if not isinstance(finding, Finding) or not callable(finding.sentences):
                raise ValueError(f"{self.notebook}: each finding is a Finding(label, sentences, section) whose "
                                 f"sentences(folder) computes its sentences from the notebook's files; got {finding!r}.")
        if self.primary is not None and not (isinstance(self.primary, Primary) and callable(self.primary.observed)):
            raise ValueError(f"{self.notebook}: the primary is a Primary(id, observed) whose observed(folder) reads its "
                             f"numbers from the notebook's files; got {self.primary!r}.")
        for preset in self.committed:
            if preset not in self.presets or preset in ("default", "smoke"):
                raise ValueError(f"{self.notebook}: a committed preset is one of the claim's own presets (not default or "
                                 f"smoke), got {preset!r}; its presets are {sorted(self.presets)}.")
            if "model" in self.presets[preset]:
                raise ValueError(f"{self.notebook}: committed preset {preset!r} names a model; the committed report runs "
                                 "it on every embedded model, so it must leave the model to the run.")
        fields = set(getattr(self.config, "__dataclass_fields__", {}))
        for preset, values in self.presets.items():
            unknown = sorted(set(values) - fields)
            if unknown:
                raise ValueError(f"{self.notebook}: preset {preset!r} sets {unknown}, which "
                                 f"{self.config.__name__} does not have.")

    @property
    def name(self) -> str:
        """The claim's folder name: the notebook stem without its number (``irreplaceability``)."""
        return self.notebook.partition("_")[2]

    @property
    def page_title(self) -> str:
        """``"02 · Claim 2: irreplaceability"``: the notebook's number and title (its stem when untitled)."""
        return f"{self.notebook[:2]} · {self.title}" if self.title else self.notebook

    def preset(self, name: str) -> dict[str, Any]:
        """This claim's overrides in preset ``name`` (empty where the preset leaves it at its defaults)."""
        return dict(self.presets.get(name, {}))

    def output_folder(self, output_dir: str | Path) -> str:
        """Where the notebook writes its figures and tables: ``<output_dir>/<notebook stem>``."""
        return f"{output_dir}/{self.notebook}"

    def outputs(self, config) -> tuple[str, dict[str, Any]]:
        """A notebook's setup line: (its output folder, the run config written beside every figure and table).
        A config that reads HotpotQA from a real source (``hotpot_splits``) also gets its questions recorded by
        ``_id`` in ``hotpot_questions.csv`` there, before any model work."""
        folder, run = self.output_folder(config.output_dir), {"notebook": self.notebook, **config.__dict__}
        splits = config.hotpot_splits() if callable(getattr(config, "hotpot_splits", None)) else []
        if splits and str(getattr(config, "hotpot_source", "synthetic")) != "synthetic":
            table = questions_table(config.hotpot_source, splits, skip_incomplete=config.hotpot_skip_incomplete)
            Path(folder).mkdir(parents=True, exist_ok=True)
            atomic_write_text(Path(folder) / "hotpot_questions.csv", table.to_csv(index=False))
        return folder, run


def ci_text(value: float, low: float, high: float, digits: int = 2, signed: bool = False) -> str:
    """``value [low, high]`` for an index cell (:func:`~dynheads_tl.analysis.statistics.format_interval`), with true
    minus signs."""
    return format_interval(value, low, high, digits, signed=signed).replace("-", "−")


def is_true(value) -> bool:
    """A boolean read back from a CSV (``True``, ``"True"``, ``"true"``)."""
    return str(value).strip().lower() == "true"


def sidecar(folder: Path, stem: str) -> dict[str, Any]:
    """The run config written beside ``<folder>/<stem>.*`` (``<stem>.config.json``); empty when absent."""
    path = Path(folder) / f"{stem}.config.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


_SENTENCE_END = re.compile(r"(?<=[.!?])(?:\*\*)?\s+(?=(?:\*\*)?[A-Za-z(])")
_ABBREVIATIONS = ("Eq.", "Fig.", "e.g.", "i.e.", "vs.", "cf.", "al.", "Tab.")


def sentences(paragraph: str) -> list[str]:
    """Split a paragraph into sentences at ". " before a letter, not after an abbreviation (Eq., Fig.)."""
    out: list[str] = []
    start = 0
    for match in _SENTENCE_END.finditer(paragraph):
        candidate = paragraph[start:match.start()].strip()
        if candidate.endswith(_ABBREVIATIONS):
            continue
        out.append(candidate)
        start = match.end()
    tail = paragraph[start:].strip()
    if tail:
        out.append(tail)
    return [s for s in out if s]


def plain(text: str) -> str:
    """A verdict's text as a quote: Markdown bold removed, whitespace collapsed."""
    return " ".join(str(text).replace("**", "").split())


class Verdict(str):
    """A computed verdict: the paragraph the notebook shows (the parts joined by spaces), made of keyed parts, so
    that a claim's :class:`Finding` quotes parts by their key (:meth:`quote`), never by their words. Built as
    ``Verdict(("primary", "Primary comparison ..."), ("reach", "..."), declared=KEYS)``; empty parts are dropped.
    ``declared`` names every key the verdict function can give (a part may be absent from one run): quoting a key
    outside it is a typo, and fails. It is a string, so a notebook shows it as before."""

    parts: tuple[tuple[str, str], ...]
    declared: frozenset[str]

    def __new__(cls, *parts: tuple[str, str], declared: Iterable[str] = ()):
        kept = tuple((key, str(text).strip()) for key, text in parts if str(text).strip())
        self = super().__new__(cls, " ".join(text for _, text in kept))
        self.parts = kept
        self.declared = frozenset(declared) | {key for key, _ in parts}
        return self

    def quote(self, *keys: str, limit: int | None = None) -> list[str]:
        """The parts with one of ``keys``, in order, as quotes (:func:`plain`); a declared key no part has in this run
        gives nothing, a key the verdict does not declare is an error."""
        unknown = sorted(key for key in keys if key not in self.declared)
        if unknown:
            raise KeyError(f"{unknown} name no part this verdict declares ({sorted(self.declared)}).")
        chosen = [plain(text) for key, text in self.parts if key in keys]
        return chosen[:limit] if limit is not None else chosen

    @property
    def keys(self) -> list[str]:
        return [key for key, _ in self.parts]

    def __reduce__(self):  # pickling and copying rebuild it from its parts and declared keys
        return (_rebuild_verdict, (self.parts, tuple(sorted(self.declared))))


def _rebuild_verdict(parts, declared) -> Verdict:
    return Verdict(*parts, declared=declared)
