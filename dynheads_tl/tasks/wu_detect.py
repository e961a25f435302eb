"""Wu et al.'s retrieval-head detection data as a NIAH source (``haystack="wu:PATH"``).

``nightdessert/Retrieval_Head`` detects its static heads on ``haystack_for_detect/``: a ``needles.jsonl`` whose
lines hold ``needle`` (the sentence inserted), ``question`` and ``real_needle`` (the part the answer must
reproduce), and one haystack folder per needle, ``part1``, ``part2``, ... (``.txt`` files). This module builds
samples from such a folder the way Wu et al.'s ``retrieval_head_detection.py`` does:

- **context**: the part's text (repeated until it has as many words as tokens are asked for) is encoded, cut to
  ``context_tokens + 200`` tokens and decoded; the needle is inserted at ``depth`` of what is left after Wu's
  200-token buffer, backing up to the previous "." token, and the tokens are decoded again (so the context holds
  about ``context_tokens`` tokens);
- **prompt** (:data:`WU_PROMPT_KINDS`): base models read the raw text ``context + "Based on the content of the
  book, Question: {question}\\nAnswer:"`` (tokenized with the tokenizer's special tokens); instruct models one user
  turn ``"<book>{context}</book>\\nBased on the content of the book, Question: {question}\\nAnswer:"`` in their chat
  template with the generation prompt. ``"wu:PATH"`` picks instruct when the tokenizer has a chat template, base
  otherwise; ``"wu-base:PATH"`` and ``"wu-chat:PATH"`` force one;
- **evidence span** (:func:`wu_needle_span`): ``real_needle`` is tokenized alone; the span is the first window of
  that many prompt tokens whose distinct ids hold more than 90% of the needle's distinct ids;
- **decoding** (:func:`wu_trace_config`, :func:`truncate_at_newline`): 50 greedy steps, no stop at EOS, stopping
  after the first token whose text holds a newline (that token is scored and kept);
- **filter**: ``rouge-score`` ROUGE-1 recall of ``real_needle`` above 0.5 (Wu: ``recall * 100 > 50``), which
  :func:`~dynheads_tl.analysis.scoring.static_retrieval_scores` applies with the sample's answer = ``real_needle``.

Where this differs from Wu et al.'s script (each a deliberate choice, see ``docs/coming_from_peers.md``): files of a
part are read in name order (Wu: ``glob`` order, which the file system decides); the tokenizer is the fast one (Wu
loads the slow one; the same ids for the embedded model); the context is encoded without special tokens (Wu's
``encode`` puts a BOS token into the decoded context for Llama tokenizers); the "." tokens are the model's own
(Wu's default provider hard-codes Llama-2's ids); a prompt whose needle span cannot be found is refused (Wu scores
it 0 for every head); depths are drawn per sample (stratified over ``n``, from the seed) instead of Wu's fixed
grid, so two splits never share a prompt.
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Literal

from .common import Sample, check_fits, read_utf8, resolve_max_tokens

WU_PREFIXES = {"wu:": "auto", "wu-base:": "base", "wu-chat:": "chat"}
WU_PROMPT_KINDS = ("auto", "base", "chat")
WU_DECODE_STEPS = 50   # Wu's decode(..., 50)
WU_BUFFER_TOKENS = 200  # Wu's final_context_length_buffer
WU_SPAN_OVERLAP = 0.9  # Wu's find_needle_idx: overlap > 0.9
WU_FIELDS = ("needle", "question", "real_needle")
PromptKind = Literal["auto", "base", "chat"]


def is_wu_spec(source) -> bool:
    return isinstance(source, str) and any(source.startswith(prefix) for prefix in WU_PREFIXES)


def split_wu_spec(source: str) -> tuple[str, PromptKind]:
    """(folder, prompt kind) of a ``wu:``, ``wu-base:`` or ``wu-chat:`` haystack spec."""
    for prefix, kind in WU_PREFIXES.items():
        if source.startswith(prefix):
            folder = source[len(prefix):]
            if not folder.strip():
                raise ValueError(f"The haystack spec {source!r} names no folder; use '{prefix}/path/to/haystack_for_detect'.")
            return folder, kind  # type: ignore[return-value]
    raise ValueError(f"{source!r} is not a Wu et al. haystack spec (wu:PATH, wu-base:PATH or wu-chat:PATH).")


@lru_cache(maxsize=8)
def load_wu_detection(folder: str) -> tuple[tuple[dict, str], ...]:
    """The needles of a ``haystack_for_detect`` folder, each with its part's text: ``((record, text), ...)``,
    needle ``i`` (0-based line of ``needles.jsonl``) reading ``part{i + 1}``. Every problem raises a sentence."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise ValueError(f"Wu et al.'s detection folder {str(root)!r} does not exist (it holds needles.jsonl and "
                         "part1, part2, ...).")
    needles_file = root / "needles.jsonl"
    if not needles_file.is_file():
        raise ValueError(f"Wu et al.'s detection folder {str(root)!r} has no needles.jsonl.")
    records = []
    for number, line in enumerate(read_utf8(needles_file, f"Needles file {str(needles_file)!r}").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"Line {number} of {str(needles_file)!r} is not JSON: {error}.") from error
        if not isinstance(record, dict) or not all(isinstance(record.get(f), str) and record[f].strip()
                                                    for f in WU_FIELDS):
            raise ValueError(f"Line {number} of {str(needles_file)!r} must be an object with the non-empty strings "
                             f"{list(WU_FIELDS)}, got {line[:120]!r}.")
        if record["real_needle"].strip() not in record["needle"]:
            raise ValueError(f"Line {number} of {str(needles_file)!r}: real_needle {record['real_needle'][:60]!r} is "
                             "not part of its needle, so the answer cannot be found in the context.")
        records.append({f: record[f] for f in WU_FIELDS})
    if not records:
        raise ValueError(f"{str(needles_file)!r} holds no needles.")
    out = []
    for index, record in enumerate(records):
        part = root / f"part{index + 1}"
        files = sorted(f for f in part.glob("*.txt") if f.is_file()) if part.is_dir() else []
        if not files:
            raise ValueError(f"Needle {index + 1} of {str(needles_file)!r} reads the haystack folder {str(part)!r}, "
                             "which is missing or holds no .txt files.")
        text = "".join(read_utf8(f, f"Haystack file {str(f)!r}") for f in files)  # Wu: context += f.read()
        if not text.strip():
            raise ValueError(f"The haystack folder {str(part)!r} holds only empty or whitespace files.")
        out.append((record, text))
    return tuple(out)


def check_wu_spec(source: str) -> int:
    """Check a ``wu:`` spec without a model (folder, needles, parts); returns the number of needles."""
    folder, _ = split_wu_spec(source)
    return len(load_wu_detection(folder))


def wu_prompt_kind(tokenizer, kind: PromptKind) -> str:
    """``"chat"`` or ``"base"``: ``"auto"`` is chat when the tokenizer has a chat template."""
    if kind not in WU_PROMPT_KINDS:
        raise ValueError(f"The Wu prompt kind must be one of {list(WU_PROMPT_KINDS)}, got {kind!r}.")
    if kind == "auto":
        return "chat" if getattr(tokenizer, "chat_template", None) else "base"
    if kind == "chat" and not getattr(tokenizer, "chat_template", None):
        raise ValueError("The 'wu-chat:' prompt needs a tokenizer with a chat template; this one has none (use 'wu:' "
                         "or 'wu-base:').")
    return kind


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def wu_context(tokenizer, text: str, needle: str, context_tokens: int, depth_percent: float) -> str:
    """Wu's ``generate_context``: repeat, cut to ``context_tokens`` + the buffer, insert the needle after the
    buffer is taken off (backing up to a "." token), decode."""
    length = context_tokens + WU_BUFFER_TOKENS
    words = max(len(text.split()), 1)
    context = text * math.ceil(length / words) if words < length else text  # Wu: until len(context.split()) >= length
    tokens = _encode(tokenizer, context)
    if len(tokens) > length:
        context = tokenizer.decode(tokens[:length])
    tokens_needle, tokens_context = _encode(tokenizer, needle), _encode(tokenizer, context)
    budget = length - WU_BUFFER_TOKENS
    if len(tokens_context) + len(tokens_needle) > budget:
        tokens_context = tokens_context[:max(budget - len(tokens_needle), 0)]
    if depth_percent >= 100:
        new = tokens_context + tokens_needle
    else:
        insertion = int(len(tokens_context) * (depth_percent / 100))
        periods = set(_encode(tokenizer, "."))
        while insertion > 0 and tokens_context[insertion - 1] not in periods:
            insertion -= 1
        new = tokens_context[:insertion] + tokens_needle + tokens_context[insertion:]
    return tokenizer.decode(new)


def wu_question(question: str) -> str:
    return f"Based on the content of the book, Question: {question}\nAnswer:"


def wu_prompt_ids(tokenizer, context: str, question: str, kind: str) -> tuple[list[int], str]:
    """(ids, rendered text) of Wu's prompt: ``"base"`` the raw text with the tokenizer's special tokens;
    ``"chat"`` one user turn in the chat template with the generation prompt."""
    if kind == "base":
        text = context + wu_question(question)
        return list(tokenizer(text)["input_ids"]), text
    messages = [{"role": "user", "content": f"<book>{context}</book>\n{wu_question(question)}"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    return [int(i) for i in ids], text


def wu_needle_span(prompt_ids: list[int], needle_ids: list[int]) -> tuple[int, int] | None:
    """Wu's ``find_needle_idx``: the first window ``[i, i + len(needle_ids))`` whose distinct ids hold more than
    90% of the needle's distinct ids; None when no window does."""
    wanted = set(needle_ids)
    if not wanted:
        return None
    width = len(needle_ids)
    for start in range(len(prompt_ids)):
        if len(set(prompt_ids[start:start + width]) & wanted) / len(wanted) > WU_SPAN_OVERLAP:
            return start, start + width
    return None


def _context_span(tokenizer, rendered: str, ids: list[int], context: str, kind: str) -> tuple[int, int]:
    """The context's token span, from the character offsets of the rendered prompt (whose ids must be Wu's)."""
    encoded = tokenizer(rendered, add_special_tokens=(kind == "base"), return_offsets_mapping=True)
    if list(encoded["input_ids"]) != ids:
        raise ValueError("The rendered Wu prompt does not tokenize to the ids Wu's code feeds the model; this "
                         "tokenizer's chat template cannot be mapped to character offsets.")
    start = rendered.index(context)
    end = start + len(context)
    hits = [i for i, (s, e) in enumerate(encoded["offset_mapping"]) if e > s and s < end and e > start]
    return (hits[0], hits[-1] + 1) if hits else (0, len(ids))


def build_wu_sample(tokenizer, record: dict, text: str, *, context_tokens: int, depth: float, kind: PromptKind = "auto",
                    max_tokens: int | None = None, meta: dict | None = None) -> Sample:
    """One sample of Wu's protocol (module docstring): the prompt, the span rule's evidence span, ``real_needle``
    as the answer; ``meta["protocol"] == "wu"`` makes :func:`dynheads_tl.corpus.collect_traces` decode it Wu's way."""
    if not isinstance(context_tokens, int) or context_tokens < 16:
        raise ValueError(f"context_tokens must be an integer >= 16, got {context_tokens!r}.")
    if not 0.0 <= float(depth) <= 1.0:
        raise ValueError(f"depth must be a fraction in [0, 1], got {depth!r}.")
    kind = wu_prompt_kind(tokenizer, kind)
    context = wu_context(tokenizer, text, record["needle"], context_tokens, 100 * float(depth))
    ids, rendered = wu_prompt_ids(tokenizer, context, record["question"], kind)
    check_fits(len(ids), resolve_max_tokens(tokenizer, max_tokens), WU_DECODE_STEPS, "Wu NIAH")
    span = wu_needle_span(ids, _encode(tokenizer, record["real_needle"]))
    if span is None:
        raise ValueError(f"No window of the Wu prompt holds more than 90% of the tokens of real_needle "
                         f"{record['real_needle'][:60]!r} (Wu's span rule); the needle was cut away or tokenizes "
                         "differently in context. Use a longer context_tokens.")
    return Sample(task="niah", prompt_ids=ids, evidence_spans=[span], answers=[record["real_needle"]],
                  question=record["question"], context_span=_context_span(tokenizer, rendered, ids, context, kind),
                  meta={"protocol": "wu", "prompt_kind": kind, "needle_text": record["needle"], "depth": float(depth),
                        "context_tokens": context_tokens, **(meta or {})})


def make_wu_samples(tokenizer, source: str, *, n: int, context_tokens: int | list[int], seed: int = 0,
                    depths: list[float] | None = None, max_tokens: int | None = None,
                    random_layout: bool = False) -> list[Sample]:
    """``n`` samples of a ``wu:`` spec: sample ``i`` reads needle ``(seed + i) mod k`` and its part, at depth
    ``depths[i mod len]`` if given, else drawn uniformly within the i-th of n equal strata (``random_layout``:
    uniformly from [0, 1]), from ``seed``; context lengths cycle through ``context_tokens``."""
    folder, kind = split_wu_spec(source)
    needles = load_wu_detection(folder)
    lengths = context_tokens if isinstance(context_tokens, list) else [context_tokens]
    samples = []
    for i in range(n):
        rng = random.Random(f"wu:{seed}:{i}")
        depth = (depths[i % len(depths)] if depths else rng.random() if random_layout
                 else (i + rng.random()) / max(n, 1))
        record, text = needles[(seed + i) % len(needles)]
        samples.append(build_wu_sample(tokenizer, record, text, context_tokens=lengths[i % len(lengths)],
                                       depth=round(depth, 4), kind=kind, max_tokens=max_tokens,
                                       meta={"needle_index": (seed + i) % len(needles), "seed": seed, "index": i}))
    return samples


# --- Wu's decoding: 50 steps, no EOS stop, stop after a newline ---------------------------------------------
def is_wu_sample(sample) -> bool:
    return isinstance(getattr(sample, "meta", None), dict) and sample.meta.get("protocol") == "wu"


def wu_trace_config(config):
    """``config`` (a :class:`~dynheads_tl.engine.tracing.TraceConfig`) with Wu's decode: 50 steps, no EOS stop, and
    each row stops after its first newline token (so no step past the stop is decoded)."""
    return replace(config, max_new_tokens=WU_DECODE_STEPS, stop_at_eos=False, stop_at_newline=True)


def newline_stop(tokenizer, tokens) -> int:
    """How many of ``tokens`` Wu's loop keeps: up to and including the first whose text holds a newline (Wu: the
    ``<0x0A>`` byte token, or Qwen's id 144), else all."""
    for index, token in enumerate(tokens):
        if "\n" in tokenizer.decode([int(token)]):
            return index + 1
    return len(tokens)


def truncate_at_newline(trace, tokenizer):
    """The trace of Wu's loop: greedy decoding is causal, so the steps up to the newline stop are exactly those of
    the longer decode; every per-step field is cut there and the response decoded again. Traces decoded with
    :func:`wu_trace_config` already stop there (the loop's ``stop_at_newline``) and come back unchanged; a trace
    decoded in full by another loop is cut."""
    import torch

    keep = newline_stop(tokenizer, trace.tokens.tolist())
    if keep == trace.n_steps:
        return trace
    steps = trace.n_steps
    cut = {name: value[:keep] for name, value in vars(trace).items()
           if name != "prompt_ids" and isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == steps}
    return replace(trace, **cut, response=tokenizer.decode(trace.tokens[:keep].tolist(), skip_special_tokens=True),
                   meta={**trace.meta, "wu_newline_stop": keep})
