"""The seeded synthetic HotpotQA generator: records in the official distractor-setting schema about fictional people,
films and towns, so that the answer can only come from the context (a small model cannot know it from
pre-training). :mod:`dynheads_tl.tasks.hotpot` turns them, like official records, into samples.
"""
from __future__ import annotations

import random
from typing import Any, Iterable


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


def _person_paragraph(rng, person, town, year, *, full_name: bool = False):
    job = rng.choice(_JOBS)
    return [f"{person} (born {year}) is a {job}.",
            f"{person if full_name else person.split()[0]} was born in {town}.",
            f"Critics have praised the {job}'s early work."]


def _film_paragraph(rng, film, director, year):
    return [f"{film} is a {year} {rng.choice(_GENRES)} film.",
            f"It was directed by {director}.",
            "The film premiered at a regional festival."]


QUESTION_KINDS = ("bridge", "comparison", "single_birthplace", "single_director")
"""Question kinds of the synthetic generator: the paper's two multi-hop kinds (HotpotQA's own ``bridge`` and
``comparison``), and two single-hop kinds whose answer is one fictional name stated in one supporting sentence
(the headroom setting, :data:`HEADROOM`)."""


def synthetic_hotpot_records(n: int, *, seed: int = 0, n_paragraphs: int = 10,
                             kinds: Iterable[str] = ("bridge", "comparison")) -> list[dict[str, Any]]:
    """``n`` seeded records in the official schema, cycling through ``kinds`` (:data:`QUESTION_KINDS`):

    - ``bridge``: "In which town was the director of <film> born?" (facts: the film's director sentence and the
      director's birthplace sentence);
    - ``comparison``: "Who was born first, <A> or <B>?" (facts: both birth sentences; the answer also appears in
      the question);
    - ``single_birthplace``: "In which town was <person> born?" (one fact);
    - ``single_director``: "Who directed <film>?" (one fact).

    Every answer is a fictional name (or, for ``comparison``, one of the two names in the question), so it can
    only come from the context. Each record has ``n_paragraphs`` paragraphs: the gold ones plus distractors (no
    distractor when the gold paragraphs already reach ``n_paragraphs``).
    """
    kinds = list(kinds)
    unknown = [kind for kind in kinds if kind not in QUESTION_KINDS]
    if not kinds or unknown:
        raise ValueError(f"kinds must be a non-empty list drawn from {list(QUESTION_KINDS)}, got {kinds!r}.")
    if not isinstance(n_paragraphs, int) or isinstance(n_paragraphs, bool) or n_paragraphs < 1:
        raise ValueError(f"n_paragraphs must be a positive integer, got {n_paragraphs!r}.")
    rng = random.Random(seed)
    records = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        people = [_person(rng) for _ in range(4)]
        towns = [_name(rng, 3) for _ in range(4)]
        years = rng.sample(range(1931, 1990), 4)
        paragraphs: dict[str, list[str]] = {}
        single = kind.startswith("single")  # single-hop: every birth sentence names the person in full
        if kind in ("bridge", "single_director"):  # film -> director (-> birthplace)
            film = f"The {_name(rng)} {rng.choice(['Affair', 'Letters', 'Harbour', 'Winter'])}"
            paragraphs[film] = _film_paragraph(rng, film, people[0], rng.randint(1960, 2015))
            if kind == "bridge":
                paragraphs[people[0]] = _person_paragraph(rng, people[0], towns[0], years[0])
                question = f"In which town was the director of {film} born?"
                answer, facts = towns[0], [[film, 1], [people[0], 1]]
            else:
                question, answer, facts = f"Who directed {film}?", people[0], [[film, 1]]
        elif kind == "single_birthplace":
            paragraphs[people[0]] = _person_paragraph(rng, people[0], towns[0], years[0], full_name=True)
            question, answer, facts = f"In which town was {people[0]} born?", towns[0], [[people[0], 1]]
        else:  # comparison: who was born first
            paragraphs[people[0]] = _person_paragraph(rng, people[0], towns[0], years[0])
            paragraphs[people[1]] = _person_paragraph(rng, people[1], towns[1], years[1])
            question = f"Who was born first, {people[0]} or {people[1]}?"
            answer = people[0] if years[0] < years[1] else people[1]
            facts = [[people[0], 0], [people[1], 0]]
        while len(paragraphs) < n_paragraphs:
            if rng.random() < 0.5:
                extra = _person(rng)
                paragraphs[extra] = _person_paragraph(rng, extra, rng.choice(towns[2:]), rng.randint(1931, 1990),
                                                      full_name=single)
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
