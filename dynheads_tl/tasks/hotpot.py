"""HotpotQA (distractor setting) samples: the official format, and a seeded synthetic generator.

A record has ``question``, ``answer``, ``context`` = [[title, [sentence, ...]], ...] and
``supporting_facts`` = [[title, sentence_index], ...], as in the official JSON. The synthetic
generator (:mod:`dynheads_tl.tasks.hotpot_synthetic`, re-exported here) writes records in the same schema about fictional people, films and towns, so that the
answer can only come from the context (a small model cannot know it from pre-training).

Context control (paper Fig 6): with ``context_tokens`` set, the gold paragraphs are placed at
``depth`` among distractor paragraphs, and distractors are added or dropped to reach the length.
"""
from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable

from .common import (
    Sample,
    mix_seed,
    build_chat_prompt,
    check_context_cannot_fit,
    check_fits,
    find_unique,
    locate_spans,
    read_utf8,
    resolve_max_tokens,
    tokenize_with_offsets,
)
# The seeded synthetic generator (re-exported here: callers read records from one module).
from .hotpot_synthetic import QUESTION_KINDS, synthetic_hotpot_records  # noqa: F401
from .real_data import DEV_POOL, data_file

HOTPOT_INSTRUCTION = "Answer the question with a short phrase taken from the document."
REQUIRED_FIELDS = ("question", "answer", "context", "supporting_facts")
SOURCE_CHOICES = ("'synthetic', 'dev' (HotpotQA's dev set from the installed data package: DRAGIN's first 1,000 "
                  "distractor records), 'hf' or the path of an official distractor-setting .json/.jsonl file")


class HotpotRecords(list):
    """The records loaded from one source: a plain list, plus where they came from and how many
    incomplete records were skipped, so that a run can say "3 of 500 skipped" instead of silently
    analysing fewer records than the file holds."""

    def __init__(self, records: Iterable[dict[str, Any]] = (), *, skipped: int = 0, source: str = ""):
        super().__init__(records)
        self.skipped = skipped
        self.source = source


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_pair(item: Any) -> bool:
    return isinstance(item, (list, tuple)) and len(item) == 2


def _check_structure(record: Any, where: str) -> None:
    """Fields present and shaped as in the official JSON; a sentence naming ``where`` otherwise."""
    if not isinstance(record, dict):
        raise ValueError(
            f"HotpotQA {where} is a JSON {type(record).__name__}, not an object with the fields "
            f"{list(REQUIRED_FIELDS)}."
        )
    missing = [name for name in REQUIRED_FIELDS if name not in record]
    if missing:
        raise ValueError(
            f"HotpotQA {where} is missing the field(s) {missing}; a distractor-setting record "
            f"needs {list(REQUIRED_FIELDS)}."
        )
    for name in ("question", "answer"):
        if not isinstance(record[name], str):
            raise ValueError(f"HotpotQA {where}: field {name!r} must be a string, got {_short(record[name])}.")
    context, facts = record["context"], record["supporting_facts"]
    if not isinstance(context, list) or not all(
        _is_pair(item) and isinstance(item[0], str) and isinstance(item[1], list)
        and all(isinstance(sentence, str) for sentence in item[1])
        for item in context
    ):
        raise ValueError(
            f"HotpotQA {where}: field 'context' must be a list of [title, [sentence, ...]] pairs, "
            f"got {_short(context)}."
        )
    if not isinstance(facts, list) or not all(
        _is_pair(item) and isinstance(item[0], str) and isinstance(item[1], int) and not isinstance(item[1], bool)
        for item in facts
    ):
        raise ValueError(
            f"HotpotQA {where}: field 'supporting_facts' must be a list of [title, sentence_index] "
            f"pairs, got {_short(facts)}."
        )


def _absent_facts(record: dict[str, Any]) -> list:
    """Supporting facts whose paragraph title is not in the record's context."""
    titles = {title for title, _ in record["context"]}
    return [fact for fact in record["supporting_facts"] if fact[0] not in titles]


def validate_record(record: dict[str, Any], where: str = "record") -> None:
    """One record ready to become a sample: well-formed, and every supporting title in its context.

    (A sentence index past its paragraph's end is tolerated here, as before: that fact simply has
    no text to mark. :func:`load_hotpot_records` counts such records as incomplete.)
    """
    _check_structure(record, where)
    missing_title = _absent_facts(record)
    if missing_title:
        raise ValueError(f"HotpotQA {where}: supporting fact title {missing_title[0][0]!r} is not in context.")


def _decode(path: Path, label: str) -> str:
    text = read_utf8(path, label, advice="HotpotQA files are UTF-8 JSON, so re-save it as UTF-8")
    return text[1:] if text.startswith("\ufeff") else text  # json rejects a byte-order mark


def _jsonl_entries(text: str, label: str) -> list[tuple[Any, str]]:
    # split("\n"), not splitlines(): JSON strings may hold U+2028 and other characters that
    # splitlines() breaks on, which would cut a record in two and shift every line number after it.
    entries = []
    for line_number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{label}, line {line_number}: not valid JSON ({error.msg} at column {error.colno}); "
                "in a JSON Lines file each non-blank line must be one record."
            ) from None
        entries.append((value, f"record {len(entries) + 1} (line {line_number})"))
    return entries


def _file_entries(path: Path, label: str) -> list[tuple[Any, str]]:
    """(record, where) pairs of a file, its format told by its content rather than its extension.

    A JSON array is the official format; JSON Lines (one record per line) is what many mirrors and
    ``datasets`` exports write, whatever their file is named. One JSON value per document parses as
    JSON; several objects, one per line, fail with "Extra data" and are read as JSON Lines.
    """
    text = _decode(path, label)
    if not text.strip():
        raise ValueError(f"{label} is empty; it should hold a JSON array of records or JSON Lines.")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        if error.msg == "Extra data" and text.lstrip().startswith("{"):
            return _jsonl_entries(text, label)
        raise ValueError(
            f"{label} is not valid JSON: {error.msg} at line {error.lineno}, column {error.colno}."
        ) from None
    if isinstance(value, list):
        return [(record, f"record {i}") for i, record in enumerate(value, start=1)]
    if isinstance(value, dict):  # one record, as a JSON object or a one-line JSON Lines file
        line = text[: len(text) - len(text.lstrip())].count("\n") + 1
        return [(value, f"record 1 (line {line})")]
    raise ValueError(
        f"{label} holds a JSON {type(value).__name__}, not an array of records or JSON Lines of records."
    )


def _hf_entries():
    try:
        from datasets import load_dataset
    except ImportError:
        raise ImportError(_HF_MISSING) from None
    dataset = load_dataset("hotpotqa/hotpot_qa", "distractor", split="validation")
    for i, row in enumerate(dataset, start=1):
        context = [[t, s] for t, s in zip(row["context"]["title"], row["context"]["sentences"])]
        facts = [[t, k] for t, k in zip(row["supporting_facts"]["title"], row["supporting_facts"]["sent_id"])]
        yield {**row, "context": context, "supporting_facts": facts}, f"row {i}"


_HF_MISSING = (
    "hotpot_source='hf' reads HotpotQA through the `datasets` package, which is not installed; "
    "run `pip install datasets` (it also needs network access), or use 'synthetic' or the path of "
    "a local distractor-setting file."
)


def _incomplete_error(label: str, incomplete: list, examined: int) -> ValueError:
    first_where, titles = incomplete[0]
    return ValueError(
        f"{label}: {len(incomplete)} of {examined} records have supporting facts whose paragraph is not in "
        f"their own context (first: {first_where}, where title {titles[0][0]!r} is not among its paragraphs). "
        "This suggests a retrieval-based variant of HotpotQA (such as the fullwiki setting) rather than "
        "the distractor setting, whose contexts hold every gold paragraph. Pass skip_incomplete=True "
        f"(notebook parameter hotpot_skip_incomplete=True) to skip them and use the other "
        f"{examined - len(incomplete)}."
    )


def load_hotpot_records(source: str | Path, limit: int | None = None, *,
                        skip_incomplete: bool = False) -> HotpotRecords:
    """Read the official distractor file, or ``"hf"`` for the ``hotpotqa/hotpot_qa`` ``distractor``
    validation split through ``datasets`` (needs network).

    A file may hold a JSON array or JSON Lines whatever its extension. Every error names the file
    and the 1-based record (and, for JSON Lines, the line in the file). A record with a supporting
    fact whose paragraph title is not in its own context cannot be scored by Eq. 2, since part of its
    evidence is not in the prompt; such records are counted and, by default, reported in one error;
    ``skip_incomplete=True`` leaves them out. A sentence index past its paragraph's end is tolerated,
    as in the official distractor files where it occurs: that fact simply has no text to mark.
    ``limit`` keeps the first ``limit`` records (with ``skip_incomplete``: the first ``limit``
    complete ones). The result's ``skipped`` says how many were left out.
    """
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
        raise ValueError(f"limit must be None or an integer >= 0, got {limit!r}.")
    limit = limit or None  # 0 has always meant "no limit"
    if str(source) == "dev":  # the installed dev file, DRAGIN's pool: its first 1,000 records, then any filter
        path = data_file("hotpotqa")
        entries = _file_entries(path, f"HotpotQA file {str(path)!r}")[:DEV_POOL]
        records = _kept_records(entries, f"HotpotQA dev pool ({path})", "dev pool, ", skip_incomplete)
        kept = records[:limit] if limit is not None else records
        return HotpotRecords(list(kept), skipped=records.skipped, source="dev")
    if str(source) == "hf":
        label, entries, shown = "HotpotQA 'hf' source", _hf_entries(), "hf"
        record_prefix = "'hf' source, "
    else:
        if not isinstance(source, (str, Path)) or not str(source).strip():
            raise ValueError(f"The HotpotQA source must be {SOURCE_CHOICES}; got {source!r}.")
        path = Path(source).expanduser()
        shown, label = str(path), f"HotpotQA file {str(path)!r}"
        if not path.exists():
            raise FileNotFoundError(f"HotpotQA file {str(path)!r} does not exist; use {SOURCE_CHOICES}.")
        if not path.is_file():
            raise ValueError(f"HotpotQA file {str(path)!r} is a folder, not a file; use {SOURCE_CHOICES}.")
        entries = _file_entries(path, label)
        record_prefix = f"file {str(path)!r}, "
    records = _kept_records(entries, label, record_prefix, skip_incomplete, limit)
    return HotpotRecords(list(records), skipped=records.skipped, source=shown)


def _kept_records(entries, label: str, record_prefix: str, skip_incomplete: bool,
                  limit: int | None = None) -> HotpotRecords:
    """The records of ``entries`` whose structure checks, without the incomplete ones when ``skip_incomplete`` (else
    an error naming them); at most ``limit`` (counting kept records with ``skip_incomplete``, else examined ones)."""
    kept, incomplete, examined = [], [], 0
    for record, where in entries:
        if limit is not None and (len(kept) if skip_incomplete else examined) >= limit:
            break
        examined += 1
        _check_structure(record, record_prefix + where)
        missing_title = _absent_facts(record)
        if missing_title:
            incomplete.append((where, missing_title))
            continue
        kept.append(record)
    if incomplete and not skip_incomplete:
        raise _incomplete_error(label, incomplete, examined)
    return HotpotRecords(kept, skipped=len(incomplete))


def with_fewer_distractors(record: dict[str, Any], n_paragraphs: int) -> dict[str, Any]:
    """``record`` with its gold paragraphs and only its first distractors, ``n_paragraphs`` paragraphs in all (in
    the record's own order). How the headroom setting shortens an official distractor-setting record."""
    if not isinstance(n_paragraphs, int) or isinstance(n_paragraphs, bool) or n_paragraphs < 1:
        raise ValueError(f"n_paragraphs must be a positive integer, got {n_paragraphs!r}.")
    gold = {title for title, _ in record["supporting_facts"]}
    room = max(n_paragraphs - sum(title in gold for title, _ in record["context"]), 0)
    kept, distractors = [], 0
    for title, sentences in record["context"]:
        if title in gold:
            kept.append([title, sentences])
        elif distractors < room:
            kept.append([title, sentences])
            distractors += 1
    return {**record, "context": kept}


# --- records -> samples ----------------------------------------------------------------------
# Two worked examples shown before the question in the headroom setting (fictional, like the generator's records,
# and in its format): the embedded model answers with a short name after them, and with a copy of the context's
# first paragraph without them. The gold paragraph comes first in one and second in the other, so the examples do
# not teach "the answer is in the first paragraph". Measured on 40 selection questions (seed 30000, never used
# again; full context through the RAG loop): F1 0.60 with these, 0.53 with the gold paragraph first in both, and
# 0.39-0.42 with longer examples in the generator's three-sentence format (which the model then copies).
HOTPOT_DEMONSTRATIONS = (
    ("Mira Olsen: Mira Olsen (born 1950) is a poet. Mira Olsen was born in Tarvik.\n"
     "Brenna Hall: Brenna Hall is a small town on the banks of the Lune.",
     "In which town was Mira Olsen born?", "Tarvik"),
    ("David Ruhl: David Ruhl (born 1944) is a chemist.\n"
     "The Quiet Pier: The Quiet Pier is a 1971 drama film. It was directed by Oskar Belmonte.",
     "Who directed The Quiet Pier?", "Oskar Belmonte"),
)


@dataclass
class HotpotConfig:
    """How a record becomes a prompt. ``context_tokens=None`` keeps the record's own paragraphs;
    ``demonstrations`` puts :data:`HOTPOT_DEMONSTRATIONS` before the question as earlier chat turns."""

    context_tokens: int | None = None
    depth: float | None = None
    seed: int = 0
    instruction: str = HOTPOT_INSTRUCTION
    max_new_tokens: int = 16
    demonstrations: bool = False

    def __post_init__(self):
        if self.context_tokens is not None and self.context_tokens < 32:
            raise ValueError(f"context_tokens must be >= 32 or None, got {self.context_tokens!r}.")
        if self.depth is not None and not 0.0 <= float(self.depth) <= 1.0:
            raise ValueError(f"depth must be a fraction in [0, 1] or None, got {self.depth!r}.")


FILL_TRIES = 24  # unused pool paragraphs tried for the room a context has left under its length


def _paragraph_text(title: str, sentences: list[str]) -> str:
    return f"{title}: " + " ".join(s.strip() for s in sentences)


def _arrange(record, config, tokenizer, distractor_pool, exclusive: bool = False):
    gold_titles = {t for t, _ in record["supporting_facts"]}
    gold = [(t, s) for t, s in record["context"] if t in gold_titles]
    others = [(t, s) for t, s in record["context"] if t not in gold_titles]
    if config.context_tokens is None:
        if config.depth is None:
            return record["context"]
        distractors = others
    else:
        rng = random.Random(config.seed)
        distractors = list(others)
        # ``exclusive`` (a real source's pool, which holds the record itself): none of the record's own paragraphs,
        # already in or left out; the generator's pool keeps its recorded arrangement (gold titles only left out)
        own = {t for t, _ in record["context"]} if exclusive else gold_titles
        pool = [p for p in distractor_pool if p[0] not in own]
        rng.shuffle(pool)
        count = lambda ps: len(tokenizer("\n".join(_paragraph_text(*p) for p in ps), add_special_tokens=False)["input_ids"])
        while count(gold + distractors) < config.context_tokens and pool:
            distractors.append(pool.pop())
        available = count(gold + distractors)
        if available < 0.9 * config.context_tokens:
            raise ValueError(
                f"HotpotQA record {record.get('_id', '?')!r}: its paragraphs and the distractor pool "
                f"hold only {available} tokens, short of context_tokens={config.context_tokens}; lower "
                "context_tokens or pass more records to draw distractors from."
            )
        while distractors and count(gold + distractors) > config.context_tokens:
            distractors.pop()
        # The paragraph dropped last can leave the context short by its own length (a real paragraph holds up to a
        # few hundred tokens): unused paragraphs that still fit are added, the next ones of the shuffled pool first.
        for candidate in pool[::-1][:FILL_TRIES if exclusive else 0]:
            if count(gold + distractors + [candidate]) <= config.context_tokens:
                distractors.append(candidate)
    depth = 0.5 if config.depth is None else config.depth
    cut = int(round(depth * len(distractors)))
    return distractors[:cut] + gold + distractors[cut:]


def build_hotpot_sample(tokenizer, record: dict[str, Any], config: HotpotConfig | None = None, *,
                        max_tokens: int | None = None, distractor_pool: Iterable = (),
                        exclusive: bool = False) -> Sample:
    """One record's prompt, evidence spans and answer. With ``config.context_tokens`` the context is the gold
    paragraphs among distractors drawn from ``distractor_pool`` up to that length; ``exclusive`` (a real source's
    pool, :func:`distractor_paragraphs`) leaves out every paragraph of the record itself and fills the room the last
    dropped paragraph leaves with shorter ones that fit."""
    config = config or HotpotConfig()
    if not isinstance(record, dict):
        raise ValueError(f"A HotpotQA record must be a dict, got {type(record).__name__}.")
    validate_record(record, f"record {record.get('_id', '?')!r}")
    max_tokens = resolve_max_tokens(tokenizer, max_tokens)
    if config.context_tokens is not None:
        check_context_cannot_fit(config.context_tokens, config.max_new_tokens, max_tokens, "HotpotQA")
    paragraphs = _arrange(record, config, tokenizer, list(distractor_pool), exclusive)
    texts = [_paragraph_text(t, s) for t, s in paragraphs]
    context = "\n".join(texts)
    prompt = build_chat_prompt(tokenizer, context, record["question"], config.instruction,
                               HOTPOT_DEMONSTRATIONS if config.demonstrations else ())
    ids, offsets = tokenize_with_offsets(tokenizer, prompt)
    check_fits(len(ids), max_tokens, config.max_new_tokens, "HotpotQA")
    context_char = find_unique(prompt, context, "context")
    # Character spans of each supporting sentence, found inside its own paragraph.
    starts, cursor = {}, context_char
    for (title, sentences), text in zip(paragraphs, texts):
        starts[title] = (cursor, sentences)
        cursor += len(text) + 1
    char_spans = []
    for title, index in record["supporting_facts"]:
        paragraph_start, sentences = starts[title]
        if not 0 <= index < len(sentences):
            continue  # the official data has a few out-of-range indices; they carry no text
        sentence = sentences[index].strip()
        paragraph = prompt[paragraph_start: paragraph_start + len(_paragraph_text(title, sentences))]
        offset = paragraph.find(sentence)
        if offset < 0 or not sentence:
            continue
        char_spans.append((paragraph_start + offset, paragraph_start + offset + len(sentence)))
    if not char_spans:
        raise ValueError(f"HotpotQA record {record.get('_id', '?')!r} has no locatable supporting sentence.")
    evidence = locate_spans(offsets, char_spans)
    [context_span] = locate_spans(offsets, [(context_char, context_char + len(context))])
    return Sample(
        task="hotpot", prompt_ids=ids, evidence_spans=evidence, answers=[record["answer"]],
        question=record["question"], context_span=context_span,
        meta={**asdict(config), "id": record.get("_id"), "type": record.get("type"),
              "context_len": context_span[1] - context_span[0],
              "actual_depth": (evidence[0][0] - context_span[0]) / max(context_span[1] - context_span[0], 1)},
    )


def make_hotpot_samples(tokenizer, *, n: int, records: list[dict[str, Any]] | None = None,
                        seed: int = 0, context_tokens: int | None = None, depth: float | None = None,
                        max_tokens: int | None = None, demonstrations: bool = False,
                        distractors: list | None = None) -> list[Sample]:
    """``n`` samples from ``records`` (default: synthetic records seeded by ``seed``).

    Fewer records than ``n`` is an error rather than fewer samples, which would shrink a split
    without a word. ``demonstrations``: see :class:`HotpotConfig`. Without ``max_tokens`` the tokenizer's own limit is used when it knows one.
    With ``context_tokens``, distractor paragraphs come from ``distractors`` (real records: the source's
    :func:`distractor_paragraphs`), else from the records themselves and a seeded synthetic pool.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"n must be an integer >= 0, got {n!r}.")
    records = records if records is not None else synthetic_hotpot_records(n, seed=seed)
    if len(records) < n:
        source = getattr(records, "source", "")
        where = f" from {source!r}" if source else ""
        raise ValueError(
            f"make_hotpot_samples was asked for n={n} samples but was given only {len(records)} "
            f"record(s){where}; pass more records or lower n."
        )
    max_tokens = resolve_max_tokens(tokenizer, max_tokens)
    if not context_tokens:
        pool = []
    elif distractors is not None:
        pool = [tuple(p) for p in distractors]
    else:
        pool = [tuple(p) for r in records for p in r["context"]]
        pool += [tuple(p) for r in synthetic_hotpot_records(64, seed=seed + 7919) for p in r["context"]]
    return [
        build_hotpot_sample(tokenizer, record, HotpotConfig(context_tokens, depth, seed=mix_seed(seed, i, 1000),
                                                            demonstrations=demonstrations),
                            max_tokens=max_tokens, distractor_pool=pool, exclusive=distractors is not None)
        for i, record in enumerate(records[:n])
    ]


# --- the headroom setting --------------------------------------------------------------------
@dataclass(frozen=True)
class HotpotSetting:
    """Which HotpotQA-format questions a study asks and how: the question kinds and paragraph count of the
    synthetic generator (a file's records keep their questions and are cut to their gold paragraphs plus
    ``distractors``, or to ``n_paragraphs`` paragraphs: :meth:`paragraphs_of`, :func:`with_fewer_distractors`),
    and whether the prompt shows :data:`HOTPOT_DEMONSTRATIONS`."""

    name: str
    kinds: tuple[str, ...]
    n_paragraphs: int
    demonstrations: bool
    distractors: int | None = None  # a file's records: keep the gold paragraphs and this many distractors

    def records(self, n: int, seed: int, source_records: list | None = None) -> list[dict[str, Any]]:
        if source_records is None:
            return synthetic_hotpot_records(n, seed=seed, n_paragraphs=self.n_paragraphs, kinds=self.kinds)
        return [with_fewer_distractors(record, self.paragraphs_of(record)) for record in source_records[:n]]

    def paragraphs_of(self, record: dict[str, Any]) -> int:
        """How many of a file record's paragraphs the setting keeps: its gold ones plus ``distractors`` (the
        headroom setting: a real question has two gold paragraphs, so ``n_paragraphs`` alone would leave it none),
        else ``n_paragraphs``."""
        if self.distractors is None:
            return self.n_paragraphs
        gold = {title for title, _ in record["supporting_facts"]}
        return sum(title in gold for title, _ in record["context"]) + self.distractors

    def samples(self, tokenizer, n: int, seed: int, *, source_records: list | None = None,
                max_tokens: int | None = None) -> list[Sample]:
        return make_hotpot_samples(tokenizer, n=n, records=self.records(n, seed, source_records), seed=seed,
                                   max_tokens=max_tokens, demonstrations=self.demonstrations)


# The paper's setting: multi-hop questions (bridge, comparison) among 10 paragraphs, no demonstrations.
MULTIHOP = HotpotSetting("multihop", ("bridge", "comparison"), 10, False)
# A setting where the embedded model has headroom: single-hop questions whose answer is one fictional name, the
# gold paragraph and one distractor, two worked examples first. Measured on 32 questions before choosing it
# (SmolLM2-135M-Instruct, full context, both examples' gold paragraph first): F1 0.73 with no distractor, 0.51 with
# one, 0.32 with two, 0.24 with four; without the context 0.00. Without the demonstrations F1 is at most 0.20 at
# any of these paragraph counts. The examples were then reordered (see HOTPOT_DEMONSTRATIONS). On a file's records
# (the dev set's multi-hop questions, two gold paragraphs each) the setting keeps the gold paragraphs and one
# distractor, the same one distractor as the generator's.
HEADROOM = HotpotSetting("headroom", ("single_birthplace", "single_director"), 2, True, distractors=1)
HOTPOT_SETTINGS = {setting.name: setting for setting in (MULTIHOP, HEADROOM)}


def hotpot_label(source: str) -> str:
    """The dataset name for a title or a sentence: synthetic questions are never called plain "HotpotQA"."""
    return "HotpotQA (synthetic)" if source == "synthetic" else "HotpotQA"
