"""What every task shares: the paper's chat prompt and exact token spans from character offsets."""
from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

SYSTEM_PROMPT = (
    "You are a helpful AI bot that answers questions for a user. Keep your response short and direct."
)
USER_TEMPLATE = (
    "Context:\n{context}\nQuestion:\n{question}\nInstruction:\n{instruction}"
)
NIAH_INSTRUCTION = "Don't give information outside the document or repeat your findings."


@dataclass
class Sample:
    """One prompt ready for generation.

    ``evidence_spans`` are half-open token spans ``[start, end)`` in ``prompt_ids``: the needle for
    NIAH (Eq. 1 and the Wu score), the supporting-fact sentences for HotpotQA (Eq. 2).
    ``context_span`` is the token span of the whole context, which the RAG study masks.
    """

    task: str
    prompt_ids: list[int]
    evidence_spans: list[tuple[int, int]]
    answers: list[str]
    question: str
    context_span: tuple[int, int]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def evidence_len(self) -> int:
        return sum(end - start for start, end in self.evidence_spans)


# Strides that keep mixed seeds apart: a stride larger than any index a run uses means two (seed, index) pairs
# never give one number. SAMPLE_STRIDE for samples and decoding steps, WIDE_STRIDE where the index is itself a seed.
SAMPLE_STRIDE = 100_003
WIDE_STRIDE = 1_000_003


def mix_seed(seed: int, index: int, stride: int = SAMPLE_STRIDE) -> int:
    """The one way this package derives a seed from a run's seed and an index (a sample, a step, a split):
    ``seed * stride + index``. Different seeds give disjoint ranges as long as ``index < stride``."""
    return seed * stride + index


def build_chat_prompt(tokenizer, context: str, question: str, instruction: str,
                      demonstrations: Sequence[tuple[str, str, str]] = ()) -> str:
    """The paper's prompt (App. A.1) rendered with the model's own chat template. ``demonstrations``
    ((context, question, answer) triples) come first as earlier user / assistant turns in the same format."""
    turns = []
    for demo_context, demo_question, demo_answer in demonstrations:
        turns.append((USER_TEMPLATE.format(context=demo_context, question=demo_question, instruction=instruction),
                      demo_answer))
    user = USER_TEMPLATE.format(context=context, question=question, instruction=instruction)
    messages = [{"role": "system", "content": SYSTEM_PROMPT}]
    for demo_user, demo_answer in turns:
        messages += [{"role": "user", "content": demo_user}, {"role": "assistant", "content": demo_answer}]
    messages.append({"role": "user", "content": user})
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    # Base models without a template: a plain rendering that keeps the same text.
    shown = "".join(f"{demo_user}\n\nAnswer: {demo_answer}\n\n" for demo_user, demo_answer in turns)
    return f"{SYSTEM_PROMPT}\n\n{shown}{user}\n\nAnswer:"


def tokenize_with_offsets(tokenizer, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(
            "Exact evidence spans need character offsets, which only fast (Rust) tokenizers give; "
            f"{type(tokenizer).__name__} is not fast."
        )
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(encoded["input_ids"])
    offsets = [tuple(o) for o in encoded["offset_mapping"]]
    bos = getattr(tokenizer, "bos_token_id", None)
    # Templates without a BOS token of their own (Llama 3 has one, SmolLM2 does not need one); a tokenizer may add
    # its BOS through its post-processor without saying so in add_bos_token (Gemma 3's, converted from GGUF).
    adds_bos = getattr(tokenizer, "add_bos_token", False) or (
        bos is not None and tokenizer("a", add_special_tokens=True)["input_ids"][:1] == [bos])
    if adds_bos and bos is not None and (not ids or ids[0] != bos):
        ids, offsets = [bos] + ids, [(0, 0)] + offsets
    return ids, offsets


def locate_spans(
    offsets: Sequence[tuple[int, int]], char_spans: Sequence[tuple[int, int]]
) -> list[tuple[int, int]]:
    """Token spans covering each character span: every token whose characters overlap it.

    Raises if a character span covers no token (it was cut away or never in the prompt).
    """
    token_spans = []
    for char_start, char_end in char_spans:
        hits = [
            i
            for i, (start, end) in enumerate(offsets)
            if end > start and start < char_end and end > char_start
        ]
        if not hits:
            raise ValueError(
                f"The evidence text at characters {char_start}..{char_end} is not in the prompt's "
                "tokens; it may have been truncated away."
            )
        token_spans.append((hits[0], hits[-1] + 1))
    return token_spans


def find_unique(haystack: str, needle: str, what: str) -> int:
    """Character index of the only occurrence of ``needle``; a sentence if absent or repeated."""
    index = haystack.find(needle)
    if index < 0:
        raise ValueError(f"The {what} {needle[:80]!r} is absent from the prompt.")
    if haystack.find(needle, index + 1) >= 0:
        raise ValueError(
            f"The {what} {needle[:80]!r} occurs more than once in the prompt, so its span is "
            "ambiguous; use a haystack that does not contain it."
        )
    return index


# The prompt around the context: the paper's system prompt, the chat template's role markers, the
# question and the instruction. Measured on SmolLM2's template: 63 tokens for NIAH and 70-75 for the
# synthetic HotpotQA questions. Llama 3's template adds a ~25-token date header and real HotpotQA
# questions run to ~50 tokens, so 128 is a conservative bound for a check made before any tokenizer is
# loaded; the exact count is checked again when the samples are built (``check_fits``).
PROMPT_TEMPLATE_TOKENS = 128

# Tokenizers without a recorded limit report ``model_max_length`` as a huge sentinel (1e30).
_SENSIBLE_MAX_TOKENS = 10**7
_CONFIG_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def _sensible_length(value) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < _SENSIBLE_MAX_TOKENS:
        return value
    return None


def tokenizer_max_tokens(tokenizer) -> int | None:
    """The context window a tokenizer knows of, or None: used when a caller gives no ``max_tokens``.

    ``model_max_length`` first, when it is a real number rather than transformers' 1e30 sentinel.
    Many tokenizers (the embedded SmolLM2 one included) carry only the sentinel, so next comes the
    model's ``config.json`` when the tokenizer was loaded from a local folder that holds one (never
    the network). Without this fallback ``make_niah_samples(tok, n=1, context_tokens=9000)`` would
    build a prompt longer than an 8,192-token model can read, and nothing would say so.
    """
    length = _sensible_length(getattr(tokenizer, "model_max_length", None))
    if length is not None:
        return length
    name = getattr(tokenizer, "name_or_path", None)
    if not name:
        return None
    config_path = Path(str(name)).expanduser() / "config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    except (OSError, ValueError):
        return None
    for section in (config, config.get("text_config") or {}):
        for key in _CONFIG_LENGTH_KEYS:
            length = _sensible_length(section.get(key)) if isinstance(section, dict) else None
            if length is not None:
                return length
    return None


def resolve_max_tokens(tokenizer, max_tokens: int | None) -> int | None:
    """``max_tokens`` when given, else what the tokenizer knows (see :func:`tokenizer_max_tokens`)."""
    return max_tokens if max_tokens is not None else tokenizer_max_tokens(tokenizer)


def check_fits(n_tokens: int, max_tokens: int | None, max_new_tokens: int, what: str) -> None:
    if max_tokens is not None and n_tokens + max_new_tokens > max_tokens:
        raise ValueError(
            f"The {what} prompt has {n_tokens} tokens; with max_new_tokens={max_new_tokens} it "
            f"exceeds the model's maximum context of {max_tokens} tokens. Lower context_tokens."
        )


def check_context_cannot_fit(context_tokens: int, max_new_tokens: int, max_tokens: int | None, what: str) -> None:
    """Fail before any tokenizing when the context alone, with the answer, is over the model's window.

    Without it a very long ``context_tokens`` would first tokenize a haystack of that length, and the error would
    name the haystack's size rather than the model's window.
    """
    if max_tokens is not None and context_tokens + max_new_tokens > max_tokens:
        room = max_tokens - PROMPT_TEMPLATE_TOKENS - max_new_tokens
        raise ValueError(
            f"The {what} context_tokens={context_tokens} with max_new_tokens={max_new_tokens} exceeds "
            f"the model's maximum context of {max_tokens:,} tokens even before the prompt template is "
            f"added; lower context_tokens (at most about {max(room, 0):,})."
        )


def check_context_fits(
    context_tokens: int | Sequence[int] | None,
    max_new_tokens: int,
    n_ctx: int,
    *,
    name: str = "context_tokens",
    template_tokens: int = PROMPT_TEMPLATE_TOKENS,
    written: str | None = None,
) -> int:
    """Check, without a tokenizer or model, that ``context_tokens`` fits the model's window ``n_ctx``.

    A notebook config runs this before loading the model, with ``n_ctx`` read from the model's
    config, so that a too-long context fails in seconds and is stated against the model's limit
    (not against the size of the haystack). The prompt template is estimated as ``template_tokens``
    (:data:`PROMPT_TEMPLATE_TOKENS`, deliberately generous); ``make_niah_samples`` and
    ``make_hotpot_samples`` check the exact count again. A list is checked by its largest value;
    ``None`` (HotpotQA's "the record's own paragraphs") has no length to check.

    ``written``: the value as the user wrote it, when that is not the number itself (a ``"haystack:tokens"``
    setting such as ``'prose:9000'``); the message quotes it, and its advice is a setting of the same haystack.

    Returns the largest ``context_tokens`` that fits.
    """
    for label, value, minimum in (("max_new_tokens", max_new_tokens, 0), ("n_ctx", n_ctx, 1),
                                  ("template_tokens", template_tokens, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ValueError(f"{label} must be an integer >= {minimum}, got {value!r}.")
    largest = n_ctx - template_tokens - max_new_tokens
    if context_tokens is None:
        return largest
    values = list(context_tokens) if isinstance(context_tokens, (list, tuple)) else [context_tokens]
    for value in values:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must hold positive integers (token counts), got {value!r}.")
    if not values:
        raise ValueError(f"{name} is an empty list; give at least one context length in tokens.")
    longest = max(values)
    if longest > largest:
        shown = f"{name}={longest}" if len(values) == 1 else f"{name} (largest {longest})"
        advice = (f"use at most {largest:,}." if largest > 0 else
                  f"max_new_tokens={max_new_tokens} alone leaves no room; lower it.")
        if written is not None:
            haystack = str(written).rpartition(":")[0]
            if largest > 0 and haystack:
                advice = f"use at most {largest:,} tokens of context ({f'{haystack}:{largest}'!r})."
            raise ValueError(
                f"Parameter '{name}' holds {written!r}: {longest:,} tokens of context plus about {template_tokens} "
                f"prompt-template tokens and max_new_tokens={max_new_tokens} exceed the model's context window of "
                f"{n_ctx:,} tokens; " + advice)
        raise ValueError(
            f"{shown} plus about {template_tokens} prompt-template tokens and "
            f"max_new_tokens={max_new_tokens} exceeds the model's context window of {n_ctx:,} tokens; "
            + advice
        )
    return largest


def prompt_digest(sample: "Sample") -> str:
    """A short hash of a sample's prompt tokens and evidence spans: part of every cache key, so a changed
    prompt (a new template, another tokenizer) never reads another prompt's results."""
    blob = ",".join(map(str, sample.prompt_ids)) + "|" + repr(sample.evidence_spans)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def read_utf8(path: Path, label: str, *, advice: str = "re-save it as UTF-8") -> str:
    """A file's text, or an error naming the file (``label``) and the first byte that is not UTF-8.

    Decoding with ``errors="replace"`` would quietly put U+FFFD characters into a prompt, which tokenize
    into junk the model then reads as context.
    """
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ValueError(
            f"{label} is not valid UTF-8: byte 0x{data[error.start]:02x} at byte offset {error.start} "
            f"(line {line}); {advice}."
        ) from None


def placebo_sample(sample: Sample, seed: int) -> Sample:
    """``sample`` with its evidence moved to random context positions: one span of the same length for each
    evidence span, inside ``context_span``, overlapping neither the real evidence nor each other (seeded).

    The prompt is unchanged, so a generation traced on it is the real one; only the positions that Eq. 2 counts
    as evidence change. A head's share on such a span is the share that context of the same size gets: the
    null against which Eq. 2's selection is calibrated. The spans may fall in a gold paragraph beside the
    evidence (in short contexts, often), where heads have some reason to look, which makes the null
    conservative: the calibrated factor can only come out higher, not lower."""
    rng = random.Random(seed)
    c0, c1 = sample.context_span
    taken = [False] * len(sample.prompt_ids)
    for start, end in sample.evidence_spans:
        taken[start:end] = [True] * (end - start)
    spans = []
    for start, end in sample.evidence_spans:
        length = end - start
        starts = [s for s in range(c0, c1 - length + 1) if not any(taken[s: s + length])]
        if not starts:
            raise ValueError(f"The context {sample.context_span} has no free room for a placebo span of {length} "
                             "tokens beside the evidence.")
        chosen = rng.choice(starts)
        taken[chosen: chosen + length] = [True] * length
        spans.append((chosen, chosen + length))
    return Sample(sample.task, list(sample.prompt_ids), sorted(spans), list(sample.answers), sample.question,
                  sample.context_span, {**sample.meta, "placebo_seed": seed})
