"""Case study — dynamic in-context RAG guided by predicted retrieval heads (DRAGIN-style, Table 4): one import for
the protocol (:mod:`~dynheads_tl.protocols.rag_protocol`: its configuration, RIND, the windows, the head
selectors), its loop (:mod:`~dynheads_tl.protocols.rag_loop`: :class:`RagPolicy`, :func:`rag_generate`,
:func:`rag_generate_many`) and, here, its runs: every strategy on every question through the model's executor, one
question per batch, with cached answers; and, teacher-forced, each strategy's gold-answer log-probability
(:func:`run_strategies` with ``teacher_forced``), cached as units of their own.
"""
from __future__ import annotations

from dataclasses import asdict

import pandas as pd
from torch import Tensor

from dynheads_tl.engine.models import model_identity
from dynheads_tl.executors import cached_units
from dynheads_tl.protocols.rag_loop import RETRIEVING, RagPolicy, rag_generate, rag_generate_many
from dynheads_tl.protocols.rag_protocol import (STRATEGIES, HeadSelector, RagConfig, RagResult, Strategy,
                                                calibrate_rind_threshold, is_content_word, rind_scores,
                                                segment_attention, sentence_start, windows_from_positions,
                                                word_starts)
from dynheads_tl.protocols.stepwise import gold_token_ids
from dynheads_tl.store import tensor_digest
from dynheads_tl.tasks.common import Sample, prompt_digest
from dynheads_tl.tasks.metrics import exact_match, token_f1

__all__ = ["RETRIEVING", "STRATEGIES", "HeadSelector", "RagConfig", "RagPolicy", "RagResult", "Strategy",
           "answer_keys", "calibrate_rind_threshold", "is_content_word", "question_groups", "rag_generate",
           "rag_generate_many", "rag_units", "rind_scores", "run_strategies", "run_units", "segment_attention",
           "sentence_start", "teacher_forced_score", "windows_from_positions", "word_starts"]


def question_groups(units: list[tuple[str, int, Sample]]) -> list[list[int]]:
    """The units (positions in ``units``) that :func:`rag_units` answers together: those of one question (same index
    and prompt) with distinct strategies other than ``full``, which share their generation up to the first
    retrieval; ``full`` and a strategy asked twice for one question go alone. In order of first appearance."""
    groups: list[list[int]] = []
    for position, (strategy, index, sample) in enumerate(units):
        home = None
        if strategy != "full":
            home = next((group for group in groups
                         if units[group[0]][1] == index and units[group[0]][0] != "full"
                         and list(units[group[0]][2].prompt_ids) == list(sample.prompt_ids)
                         and tuple(units[group[0]][2].context_span) == tuple(sample.context_span)
                         and strategy not in {units[i][0] for i in group}), None)
        if home is None:
            groups.append([position])
        else:
            home.append(position)
    return groups


def teacher_forced_score(token_logprobs: list[float]) -> float | None:
    """The teacher-forced measure of one (question, strategy): the mean log-probability of the gold answer's tokens,
    in nats per token (None without a gold token)."""
    return float(sum(token_logprobs) / len(token_logprobs)) if token_logprobs else None


def rag_units(model, units: list[tuple[str, int, Sample]], config: RagConfig, static_scores: Tensor | None = None,
              probe=None, teacher_forced: bool = False) -> list[dict]:
    """One batch of RAG units (the executors' ``compute``): each ``(strategy, sample index, sample)`` answered
    under the protocol, with a fresh selector seeded by the index (as :meth:`HeadSelector.new_sample` does for a
    reused one). The strategies of one question are answered together (:func:`question_groups`,
    :func:`rag_generate_many`): the same answers as one at a time. Returns what the tables read from each
    :class:`RagResult` (not its trace), in the order of ``units``.

    ``teacher_forced``: each unit is instead the strategy teacher-forced on the question's gold answer
    (:func:`~dynheads_tl.protocols.stepwise.gold_token_ids`; the forced loop in
    :mod:`~dynheads_tl.protocols.rag_loop`), with the same selectors and seeds: its gold tokens' log-probabilities,
    their mean (:func:`teacher_forced_score`, nats/token) and what the forced run opened. A question whose gold
    answer encodes to no token gets no run (an empty list and a None mean)."""
    out: list[dict | None] = [None] * len(units)
    for group in question_groups(units):
        _, index, sample = units[group[0]]
        selectors = [HeadSelector(units[i][0], model, config, static_scores=static_scores, probe=probe) for i in group]
        if not teacher_forced:
            for i, result in zip(group, rag_generate_many(model, sample, selectors, config, sample_seed=index)):
                out[i] = {"response": result.response, "retrievals": result.retrievals,
                          "visible_context_tokens": result.visible_context_tokens,
                          "evidence_recall": result.evidence_recall, "rind_values": list(result.rind_values)}
            continue
        gold = gold_token_ids(model.tokenizer, sample)
        results = (rag_generate_many(model, sample, selectors, config, sample_seed=index, gold=gold) if gold
                   else [RagResult("", units[i][0], 0, 0) for i in group])
        for i, result in zip(group, results):
            out[i] = {"gold_tokens": len(gold), "token_logprobs": list(result.token_logprobs),
                      "gold_logprob": teacher_forced_score(result.token_logprobs), "retrievals": result.retrievals,
                      "visible_context_tokens": result.visible_context_tokens,
                      "evidence_recall": result.evidence_recall, "rind_values": list(result.rind_values)}
    return out


# Bump when the protocol's answers change for the same settings (a fix to RIND, the windows or the selector), so
# answers cached by an older version are never read back.
RAG_PROTOCOL_VERSION = 1
# Bump when the teacher-forced units change for the same settings and the same protocol (how the gold is fed or
# scored); a change of the protocol itself bumps RAG_PROTOCOL_VERSION, which their keys hold too.
RAG_TEACHER_FORCED_VERSION = 1


def answer_keys(model, units: list[tuple[str, int, Sample]], config: RagConfig, cache_key: dict,
                static_scores: Tensor | None = None, teacher_forced: bool = False) -> list[dict]:
    """The cache key of each unit's answer: ``cache_key`` (the caller's name for the run; it must name the probe,
    if there is one, under ``"probe"``) + the unit (strategy, index, prompt digest, context span) + every knob of
    the protocol and its version + the model (name and fingerprint). The static scores' digest enters only the
    static strategy's keys and the probe's name only the dynamic strategy's: no other strategy reads them.
    ``teacher_forced``: the keys of the teacher-forced units (``unit`` "rag_teacher_forced", their own version and
    the gold token ids), which never meet an answer's key."""
    shared = {k: v for k, v in cache_key.items() if k != "probe"}
    base = {**shared, "unit": "rag_answer", "protocol_version": RAG_PROTOCOL_VERSION, "rag": asdict(config),
            **model_identity(model)}
    reads = {"static": {"static_scores": None if static_scores is None else tensor_digest(static_scores)},
             "dynamic": {"probe": cache_key.get("probe")}}
    if teacher_forced:
        base = {**base, "unit": "rag_teacher_forced", "teacher_forced_version": RAG_TEACHER_FORCED_VERSION}
    forced = lambda sample: {"gold": gold_token_ids(model.tokenizer, sample)} if teacher_forced else {}
    return [{**base, **reads.get(strategy, {}), "strategy": strategy, "index": index, "prompt": prompt_digest(sample),
             "context_span": list(sample.context_span), **forced(sample)} for strategy, index, sample in units]


def run_units(model, units: list[tuple[str, int, Sample]], config: RagConfig, *, static_scores: Tensor | None = None,
              probe=None, desc: str = "RAG answers", cache_key: dict | None = None,
              teacher_forced: bool = False) -> list[dict]:
    """:func:`rag_units` for every unit, one question per batch (:func:`question_groups`: its strategies share their
    generation up to the first retrieval; ``full`` in a batch of its own), through the model's executor; results in
    order. ``teacher_forced``: the units teacher-forced on the gold answer (:func:`rag_units`), cached apart.

    With ``cache_key`` (a dict naming the run, see :func:`answer_keys`), answers already cached are read back and
    the others cached as they come back, so a rerun only answers what is missing; a ``probe`` is an opaque
    callable, so the key must then name it under ``"probe"`` (e.g. a digest of its weights). Without
    ``cache_key`` every answer is computed."""
    if cache_key is not None and probe is not None and "probe" not in cache_key:
        raise ValueError("cache_key must name the probe under 'probe' (a digest of its weights): otherwise answers "
                         "of another probe would be read back.")
    keys = ([None] * len(units) if cache_key is None
            else answer_keys(model, units, config, cache_key, static_scores, teacher_forced))

    def plan(missing: list[int]) -> list[list[int]]:
        # Question by question, so each batch after a question's first copies the question's prefill from the
        # executor's prefix store (engine.decoder.shared_prefill) instead of redoing it.
        return sorted(([missing[j] for j in group] for group in question_groups([units[i] for i in missing])),
                      key=lambda chunk: (units[chunk[0]][1], chunk[0]))

    return cached_units(model, rag_units, keys, plan, lambda i: units[i],
                        args=(config, static_scores, probe, teacher_forced), desc=desc)


def run_strategies(model, samples: list[Sample], strategies: list[str], config: RagConfig, *,
                   static_scores: Tensor | None = None, probe=None, cache_key: dict | None = None,
                   teacher_forced: bool = False) -> pd.DataFrame:
    """Every strategy on every sample; one row per (sample, strategy). ``cache_key``: see :func:`run_units`.

    ``teacher_forced``: every (sample, strategy) is also teacher-forced on the gold answer (:func:`rag_units`), and
    the row gains ``tf_logprob`` (the mean gold-token log-probability, nats/token; NaN without a gold token),
    ``tf_tokens`` (gold tokens scored) and what the forced run opened (``tf_retrievals``,
    ``tf_visible_context_tokens``, ``tf_evidence_recall``)."""
    for strategy in strategies:  # checks each strategy's inputs before any answer runs
        HeadSelector(strategy, model, config, static_scores=static_scores, probe=probe)
    units = [(strategy, index, sample) for strategy in strategies for index, sample in enumerate(samples)]
    results = run_units(model, units, config, static_scores=static_scores, probe=probe, cache_key=cache_key,
                        desc=f"RAG ({len(strategies)} strategies x {len(samples)} questions)")
    forced = ([None] * len(units) if not teacher_forced else
              run_units(model, units, config, static_scores=static_scores, probe=probe, cache_key=cache_key,
                        teacher_forced=True,
                        desc=f"RAG teacher-forced ({len(strategies)} strategies x {len(samples)} questions)"))
    rows = []
    for (strategy, index, sample), result, tf in zip(units, results, forced):
        gold = sample.answers[0]
        row = {"sample": index, "strategy": strategy, "em": exact_match(result["response"], gold),
               "f1": token_f1(result["response"], gold), "retrievals": result["retrievals"],
               "visible_context_tokens": result["visible_context_tokens"],
               "context_tokens": sample.context_span[1] - sample.context_span[0],
               "evidence_recall": result["evidence_recall"], "response": result["response"], "gold": gold}
        if tf is not None:
            row.update(tf_logprob=float("nan") if tf["gold_logprob"] is None else tf["gold_logprob"],
                       tf_tokens=tf["gold_tokens"], tf_retrievals=tf["retrievals"],
                       tf_visible_context_tokens=tf["visible_context_tokens"],
                       tf_evidence_recall=tf["evidence_recall"])
        rows.append(row)
    return pd.DataFrame(rows)
