"""HotpotQA (distractor setting) samples: the official format, and a seeded synthetic generator.

A record has ``question``, ``answer``, ``context`` = [[title, [sentence, ...]], ...] and
``supporting_facts`` = [[title, sentence_index], ...], as in the official JSON. The synthetic
generator writes records in the same schema about fictional people, films and towns, so that the
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

from .common import Sample, build_chat_prompt, check_fits, find_unique, locate_spans, tokenize_with_offsets

HOTPOT_INSTRUCTION = "Answer the question with a short phrase taken from the document."
REQUIRED_FIELDS = ("question", "answer", "context", "supporting_facts")


def validate_record(record: dict[str, Any], where: str = "record") -> None:
    missing = [name for name in REQUIRED_FIELDS if name not in record]
    if missing:
        raise ValueError(
            f"HotpotQA {where} is missing the field(s) {missing}; a distractor-setting record "
            f"needs {list(REQUIRED_FIELDS)}."
        )
    titles = {title for title, _ in record["context"]}
    for title, index in record["supporting_facts"]:
        if title not in titles:
            raise ValueError(f"HotpotQA {where}: supporting fact title {title!r} is not in context.")


def load_hotpot_records(source: str | Path, limit: int | None = None) -> list[dict[str, Any]]:
    """Read the official distractor file (``.json`` list or ``.jsonl``), or ``"hf"`` for the
    ``hotpotqa/hotpot_qa`` ``distractor`` validation split through ``datasets`` (needs network)."""
    if str(source) == "hf":
        from datasets import load_dataset

        dataset = load_dataset("hotpotqa/hotpot_qa", "distractor", split="validation")
        records = []
        for row in dataset.select(range(min(limit or len(dataset), len(dataset)))):
            context = [[t, s] for t, s in zip(row["context"]["title"], row["context"]["sentences"])]
            facts = [[t, i] for t, i in zip(row["supporting_facts"]["title"], row["supporting_facts"]["sent_id"])]
            records.append({**row, "context": context, "supporting_facts": facts})
    else:
        path = Path(source).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"HotpotQA file {str(path)!r} does not exist.")
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".jsonl":
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            records = json.loads(text)
        records = records[:limit] if limit else records
    for i, record in enumerate(records):
        validate_record(record, f"record {i}")
    return records


# --- the synthetic generator -----------------------------------------------------------------
_SYLLABLES = ["ka", "lo", "mi", "ren", "to", "va", "sel", "dor", "an", "bri", "cu", "fen", "gal",
              "hes", "ir", "jo", "lem", "nor", "pa", "quin", "ros", "tam", "ul", "wen", "zar"]
_JOBS = ["painter", "engineer", "poet", "botanist", "architect", "violinist", "chemist", "sculptor"]
_GENRES = ["drama", "comedy", "documentary", "thriller", "musical", "western"]
_RIVERS = ["the Arlen", "the Mosk", "the Tirra", "the Velde", "the Oskan", "the Brem"]


def _name(rng: random.Random, parts: int = 2) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(parts)).capitalize()


def _person(rng):
    return f"{_name(rng)} {_name(rng, 3)}"


def _town_paragraph(rng, town):
    river, year = rng.choice(_RIVERS), rng.randint(1200, 1800)
    return [f"{town} is a small town on the banks of {river}.",
            f"It was founded in {year} by wool merchants.",
            f"The town is known for its {rng.choice(['bridges', 'markets', 'mills', 'gardens'])}."]


def _person_paragraph(rng, person, town, year):
    job = rng.choice(_JOBS)
    return [f"{person} (born {year}) is a {job}.",
            f"{person.split()[0]} was born in {town}.",
            f"Critics have praised the {job}'s early work."]


def _film_paragraph(rng, film, director, year):
    return [f"{film} is a {year} {rng.choice(_GENRES)} film.",
            f"It was directed by {director}.",
            f"The film premiered at a regional festival."]


def synthetic_hotpot_records(n: int, *, seed: int = 0, n_paragraphs: int = 10) -> list[dict[str, Any]]:
    """``n`` seeded multi-hop records in the official schema, alternating bridge and comparison."""
    rng = random.Random(seed)
    records = []
    for i in range(n):
        people = [_person(rng) for _ in range(4)]
        towns = [_name(rng, 3) for _ in range(4)]
        years = rng.sample(range(1931, 1990), 4)
        paragraphs: dict[str, list[str]] = {}
        if i % 2 == 0:  # bridge: film -> director -> birthplace
            film = f"The {_name(rng)} {rng.choice(['Affair', 'Letters', 'Harbour', 'Winter'])}"
            paragraphs[film] = _film_paragraph(rng, film, people[0], rng.randint(1960, 2015))
            paragraphs[people[0]] = _person_paragraph(rng, people[0], towns[0], years[0])
            question = f"In which town was the director of {film} born?"
            answer, facts, kind = towns[0], [[film, 1], [people[0], 1]], "bridge"
        else:  # comparison: who was born first
            paragraphs[people[0]] = _person_paragraph(rng, people[0], towns[0], years[0])
            paragraphs[people[1]] = _person_paragraph(rng, people[1], towns[1], years[1])
            question = f"Who was born first, {people[0]} or {people[1]}?"
            answer = people[0] if years[0] < years[1] else people[1]
            facts, kind = [[people[0], 0], [people[1], 0]], "comparison"
        while len(paragraphs) < n_paragraphs:
            if rng.random() < 0.5:
                extra = _person(rng)
                paragraphs[extra] = _person_paragraph(rng, extra, rng.choice(towns[2:]), rng.randint(1931, 1990))
            else:
                town = _name(rng, 3)
                paragraphs[town] = _town_paragraph(rng, town)
        context = list(paragraphs.items())
        rng.shuffle(context)
        records.append({
            "_id": f"synthetic-{seed}-{i}", "type": kind, "level": "synthetic",
            "question": question, "answer": answer,
            "supporting_facts": facts, "context": [[t, s] for t, s in context],
        })
    return records


# --- records -> samples ----------------------------------------------------------------------
@dataclass
class HotpotConfig:
    """How a record becomes a prompt. ``context_tokens=None`` keeps the record's own paragraphs."""

    context_tokens: int | None = None
    depth: float | None = None
    seed: int = 0
    instruction: str = HOTPOT_INSTRUCTION
    max_new_tokens: int = 16

    def __post_init__(self):
        if self.context_tokens is not None and self.context_tokens < 32:
            raise ValueError(f"context_tokens must be >= 32 or None, got {self.context_tokens!r}.")
        if self.depth is not None and not 0.0 <= float(self.depth) <= 1.0:
            raise ValueError(f"depth must be a fraction in [0, 1] or None, got {self.depth!r}.")


def _paragraph_text(title: str, sentences: list[str]) -> str:
    return f"{title}: " + " ".join(s.strip() for s in sentences)


def _arrange(record, config, tokenizer, distractor_pool):
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
        pool = [p for p in distractor_pool if p[0] not in gold_titles]
        rng.shuffle(pool)
        count = lambda ps: len(tokenizer("\n".join(_paragraph_text(*p) for p in ps), add_special_tokens=False)["input_ids"])
        while count(gold + distractors) < config.context_tokens and pool:
            distractors.append(pool.pop())
        while distractors and count(gold + distractors) > config.context_tokens:
            distractors.pop()
    depth = 0.5 if config.depth is None else config.depth
    cut = int(round(depth * len(distractors)))
    return distractors[:cut] + gold + distractors[cut:]


def build_hotpot_sample(tokenizer, record: dict[str, Any], config: HotpotConfig | None = None, *,
                        max_tokens: int | None = None, distractor_pool: Iterable = ()) -> Sample:
    config = config or HotpotConfig()
    validate_record(record, f"record {record.get('_id', '?')!r}")
    paragraphs = _arrange(record, config, tokenizer, list(distractor_pool))
    texts = [_paragraph_text(t, s) for t, s in paragraphs]
    context = "\n".join(texts)
    prompt = build_chat_prompt(tokenizer, context, record["question"], config.instruction)
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
                        max_tokens: int | None = None) -> list[Sample]:
    """``n`` samples from ``records`` (default: synthetic records seeded by ``seed``)."""
    records = records if records is not None else synthetic_hotpot_records(n, seed=seed)
    pool = [tuple(p) for r in (records if context_tokens else []) for p in r["context"]]
    if context_tokens:
        pool += [tuple(p) for r in synthetic_hotpot_records(64, seed=seed + 7919) for p in r["context"]]
    return [
        build_hotpot_sample(tokenizer, record, HotpotConfig(context_tokens, depth, seed=seed * 1000 + i),
                            max_tokens=max_tokens, distractor_pool=pool)
        for i, record in enumerate(records[:n])
    ]
