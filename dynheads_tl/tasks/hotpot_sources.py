"""Real HotpotQA sources as disjoint splits: the records of a source read once per process, a split's block of them,
the pool longer contexts draw distractor paragraphs from, the table that names a run's questions by ``_id``, and the
source's name in a sentence."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import importlib.util
import logging

from .hotpot import _HF_MISSING, HotpotRecords, load_hotpot_records
from .real_data import DEV_POOL, data_file

logger = logging.getLogger(__name__)

__all__ = ["check_hotpot_source", "split_records", "source_key", "source_records", "record_block", "distractor_paragraphs", "questions_table", "source_label"]


_SOURCE_CACHE: dict[tuple[str, bool], HotpotRecords] = {}


def source_records(source: str | Path, *, skip_incomplete: bool = False) -> HotpotRecords | None:
    """The usable records of a real ``source`` (:func:`load_hotpot_records`, read once per process for the installed
    dev pool, which every split of a notebook draws from), or None for ``"synthetic"`` (the generator makes records
    per split)."""
    if str(source) == "synthetic":
        return None
    if str(source) != "dev":
        return load_hotpot_records(source, skip_incomplete=skip_incomplete)
    key = ("dev", bool(skip_incomplete))
    if key not in _SOURCE_CACHE:
        _SOURCE_CACHE[key] = load_hotpot_records("dev", skip_incomplete=skip_incomplete)
    cached = _SOURCE_CACHE[key]
    return HotpotRecords(cached, skipped=cached.skipped, source=cached.source)


def record_block(records: list[dict[str, Any]], start: int, n: int, what: str) -> list[dict[str, Any]]:
    """Records ``[start, start + n)`` of a real source: one split's questions. Splits take disjoint ranges (each
    caller lays its splits out one after another), so no question is both calibrated on and analysed; a source too
    short for the range is an error naming the split, never a shorter split."""
    if start < 0 or n < 0:
        raise ValueError(f"{what}: a record range needs start >= 0 and n >= 0, got start={start}, n={n}.")
    if start + n > len(records):
        source = getattr(records, "source", "") or "the HotpotQA source"
        raise ValueError(f"{what} takes records {start:,}-{start + n - 1:,} of {source!r}, which holds "
                         f"{len(records):,} usable records; lower the split sizes or the seeds.")
    return list(records[start: start + n])


def distractor_paragraphs(records: Iterable[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """Every paragraph of ``records`` once (the first of each title): the pool a longer context draws distractor
    paragraphs from. :func:`build_hotpot_sample` never draws a paragraph whose title is one of the question's own
    (gold or distractor), so the added paragraphs come from other records and none appears twice."""
    seen, pool = set(), []
    for record in records:
        for title, sentences in record["context"]:
            if title not in seen:
                seen.add(title)
                pool.append((title, list(sentences)))
    return pool


def questions_table(source: str | Path, splits: Iterable[tuple[str, int, int, int]], *,
                    skip_incomplete: bool = False):
    """The questions a run asks, by ``_id``: one row per record of each ``(split, seed, start, n)`` block of a real
    ``source`` (its record number in the source, ``_id`` and question type). Empty for ``"synthetic"``."""
    import pandas as pd

    columns = ["split", "seed", "record", "_id", "type"]
    records = source_records(source, skip_incomplete=skip_incomplete)
    if records is None:
        return pd.DataFrame(columns=columns)
    rows = []
    for split, seed, start, n in splits:
        for offset, record in enumerate(record_block(records, start, n, f"HotpotQA {split} split")):
            rows.append((split, seed, start + offset, record.get("_id"), record.get("type")))
    return pd.DataFrame(rows, columns=columns)



def source_label(source: str) -> str:
    """The questions' name in a status line: "synthetic HotpotQA-format", "HotpotQA dev" or "HotpotQA (<source>)"."""
    if source == "synthetic":
        return "synthetic HotpotQA-format"
    return "HotpotQA dev" if source == "dev" else f"HotpotQA ({Path(source).name if source != 'hf' else 'hf'})"


def check_hotpot_source(source: str | Path, n_needed: int, *, skip_incomplete: bool = False,
                        needed_for: str | None = None) -> int:
    """The check a notebook config runs before any model loads; returns the usable record count.

    ``"synthetic"`` always has enough (its generator makes ``n_needed``). ``"hf"`` needs
    ``datasets`` installed; its size is only known after a download, so it is not counted here.
    A file is loaded and validated in full (see :func:`load_hotpot_records`), and must hold at least
    ``n_needed`` usable records; ``needed_for`` (e.g. ``"calibration 10 + analysis 20"``) says why.
    """
    if not isinstance(n_needed, int) or isinstance(n_needed, bool) or n_needed < 0:
        raise ValueError(f"n_needed must be an integer >= 0, got {n_needed!r}.")
    if str(source) == "synthetic":
        return n_needed
    if str(source) == "dev":
        data_file("hotpotqa")  # installed, or an error with the install command
        if n_needed > DEV_POOL:
            purpose = f" ({needed_for})" if needed_for else ""
            raise ValueError(f"hotpot_source='dev' is DRAGIN's pool of {DEV_POOL:,} dev records; the splits asked for "
                             f"need {n_needed:,}{purpose}.")
        return DEV_POOL
    if str(source) == "hf":
        if importlib.util.find_spec("datasets") is None:
            raise ImportError(_HF_MISSING)
        return n_needed
    records = load_hotpot_records(source, skip_incomplete=skip_incomplete)
    if len(records) < n_needed:
        skipped = f" ({records.skipped} skipped as incomplete)" if records.skipped else ""
        purpose = f" ({needed_for})" if needed_for else ""
        raise ValueError(
            f"HotpotQA file {records.source!r} has {len(records)} usable records{skipped}; the splits "
            f"asked for need {n_needed}{purpose}."
        )
    return len(records)


def split_records(config: Any, split: str, index: int = 0) -> list[dict[str, Any]] | None:
    """The records of a notebook's HotpotQA split from a real source: the ``index``-th block named ``split`` among
    ``config.hotpot_splits()`` (each notebook config lays out its disjoint blocks there), or None for the synthetic
    generator. Incomplete records left out of the source are reported once, with a warning."""
    records = source_records(config.hotpot_source, skip_incomplete=config.hotpot_skip_incomplete)
    if records is None:
        return None
    if records.skipped:
        logger.warning("%d incomplete HotpotQA records of %s were skipped (hotpot_skip_incomplete=True).",
                       records.skipped, config.hotpot_source)
    start, n = [(start, n) for name, _, start, n in config.hotpot_splits() if name == split][index]
    return record_block(records, start, n, f"the HotpotQA {split} split")


def source_key(source: str, samples) -> dict[str, Any]:
    """What a real source adds to a HotpotQA cache key: the source and the questions' ``_id`` s; nothing for the
    synthetic generator (its keys stay as they were, so its cached traces are still found)."""
    if str(source) == "synthetic":
        return {}
    return {"source": str(source), "ids": [sample.meta.get("id") for sample in samples]}
