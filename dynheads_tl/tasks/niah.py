"""Needle-in-a-haystack samples (paper App. A.1).

The haystack is cut to ``context_tokens`` tokens, the needle is inserted at ``depth`` (a fraction of
the context) after backing up to the nearest sentence end, and the prompt follows the paper's chat
template. The needle's token span comes from the tokenizer's character offsets, never from a guess.
"""
from __future__ import annotations

import math
import random
import uuid
from bisect import bisect_left, bisect_right
from dataclasses import asdict, dataclass
from functools import lru_cache

from .common import (
    NIAH_INSTRUCTION,
    mix_seed,
    Sample,
    build_chat_prompt,
    check_context_cannot_fit,
    check_fits,
    find_unique,
    locate_spans,
    resolve_max_tokens,
    tokenize_with_offsets,
)
from .haystacks import load_haystack
from .wu_detect import is_wu_spec, make_wu_samples

# Every haystack is first loaded at this many characters (~45k tokens); longer contexts reload it longer.
_BASE_HAYSTACK_CHARS = 200_000
# A built context below this share of what was planned (haystack kept + needle) means text was lost.
_MIN_CONTEXT_SHARE = 0.9
_CONTEXT_SLACK_TOKENS = 8  # boundary merges around the needle; matters only for tiny contexts


@dataclass
class NiahConfig:
    """One NIAH sample's recipe. ``{answer}`` in ``needle`` is replaced by a seeded UUID."""

    context_tokens: int = 1000
    depth: float = 0.5
    haystack: str = "filler"
    needle: str = "The magic word is {answer}."
    question: str = "What is the magic word?"
    instruction: str = NIAH_INSTRUCTION
    seed: int = 0
    max_new_tokens: int = 24
    haystack_offset: int = 0  # haystack tokens skipped before the context starts (at the next sentence start)

    def __post_init__(self):
        if not isinstance(self.context_tokens, int) or self.context_tokens < 16:
            raise ValueError(f"context_tokens must be an integer >= 16, got {self.context_tokens!r}.")
        if not isinstance(self.haystack_offset, int) or isinstance(self.haystack_offset, bool) or self.haystack_offset < 0:
            raise ValueError(f"haystack_offset must be a non-negative integer, got {self.haystack_offset!r}.")
        if not 0.0 <= float(self.depth) <= 1.0:
            raise ValueError(f"depth must be a fraction in [0, 1], got {self.depth!r}.")
        if "{answer}" not in self.needle:
            raise ValueError(f"needle must contain '{{answer}}', got {self.needle!r}.")


@lru_cache(maxsize=8)
def _haystack_tokens(tokenizer, source: str, min_chars: int = _BASE_HAYSTACK_CHARS):
    text = load_haystack(source, min_chars)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return text, [tuple(o) for o in encoded["offset_mapping"]]


def _haystack_for(tokenizer, source: str, context_tokens: int):
    """A haystack with at least ``context_tokens`` tokens.

    Every source repeats its text to reach a length, and a longer haystack starts with the shorter
    one, so reloading it longer leaves the samples of shorter contexts unchanged.
    """
    text, offsets = _haystack_tokens(tokenizer, source)
    if context_tokens > len(offsets) and offsets:
        chars = math.ceil(len(text) * context_tokens / len(offsets) * 1.25) + 1000
        text, offsets = _haystack_tokens(tokenizer, source, chars)
    if context_tokens > len(offsets):
        raise ValueError(
            f"The {source!r} haystack has only {len(offsets)} tokens; context_tokens={context_tokens} "
            "is too long."
        )
    return text, offsets


def _sentence_start_before(text: str, position: int) -> int:
    """The start of the sentence containing ``position`` (just after the previous '. ')."""
    best = -1
    for mark in (". ", "! ", "? ", ".\n"):
        best = max(best, text.rfind(mark, 0, position))
    return 0 if best < 0 else best + 2


def _sentence_start_after(text: str, position: int) -> int:
    """The start of the first sentence that begins at or after ``position`` (``position`` if none)."""
    if position == 0:
        return 0
    found = [text.find(mark, max(position - 2, 0)) for mark in (". ", "! ", "? ", ".\n")]
    found = [f + 2 for f in found if f >= 0]
    return min(found) if found else position


def build_niah_sample(tokenizer, config: NiahConfig, *, max_tokens: int | None = None) -> Sample:
    rng = random.Random(config.seed)
    answer = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    needle = config.needle.format(answer=answer)
    max_tokens = resolve_max_tokens(tokenizer, max_tokens)
    check_context_cannot_fit(config.context_tokens, config.max_new_tokens, max_tokens, "NIAH")
    skip = config.haystack_offset
    # With an offset, room for the sentence boundary the start moves to (a few hundred tokens at most).
    text, offsets = _haystack_for(tokenizer, config.haystack, config.context_tokens + (skip + 400 if skip else 0))
    start = _sentence_start_after(text, offsets[skip][0]) if skip else 0
    first = bisect_left(offsets, start, key=lambda offset: offset[0])  # the first token of the window
    needle_tokens = len(tokenizer(" " + needle, add_special_tokens=False)["input_ids"])
    keep = max(config.context_tokens - needle_tokens, 1)
    haystack = text[start: offsets[first + keep - 1][1]]
    # Cut the haystack at a sentence end so the context never ends mid-word.
    last_end = max(haystack.rfind(". "), haystack.rfind("."))
    if last_end > len(haystack) // 2:
        haystack = haystack[: last_end + 1]
    insert_at = _sentence_start_before(haystack, int(round(config.depth * len(haystack))))
    if config.depth >= 1.0:
        insert_at = len(haystack)
    before, after = haystack[:insert_at].rstrip(), haystack[insert_at:].lstrip()
    context = " ".join(part for part in (before, needle, after) if part)
    prompt = build_chat_prompt(tokenizer, context, config.question, config.instruction)
    ids, prompt_offsets = tokenize_with_offsets(tokenizer, prompt)
    check_fits(len(ids), max_tokens, config.max_new_tokens, "NIAH")
    needle_char = find_unique(prompt, needle, "needle")
    context_char = prompt.index(context)
    [needle_span] = locate_spans(prompt_offsets, [(needle_char, needle_char + len(needle))])
    [context_span] = locate_spans(prompt_offsets, [(context_char, context_char + len(context))])
    planned = bisect_right(offsets, start + len(haystack), key=lambda offset: offset[1]) - first + needle_tokens
    _check_context_built(config, context_span[1] - context_span[0], planned)
    return Sample(
        task="niah",
        prompt_ids=ids,
        evidence_spans=[needle_span],
        answers=[answer],
        question=config.question,
        context_span=context_span,
        meta={
            **asdict(config),
            "needle_text": needle,
            "actual_depth": (needle_span[0] - context_span[0])
            / max(context_span[1] - context_span[0], 1),
            "context_len": context_span[1] - context_span[0],
        },
    )


def _check_context_built(config: NiahConfig, built: int, planned: int) -> None:
    """Fail when the context came out clearly shorter than planned, rather than run on it.

    ``planned`` counts the haystack tokens kept after cutting at a sentence end, plus the needle;
    the sentence cut is by design (it may keep as little as half of ``context_tokens`` in prose
    with long sentences), but losing more than that means the haystack text vanished when the
    prompt was built (e.g. a haystack of whitespace, which collapses to nothing).
    """
    if built < _MIN_CONTEXT_SHARE * planned - _CONTEXT_SLACK_TOKENS:
        raise ValueError(
            f"The NIAH context built from the {config.haystack!r} haystack has {built} tokens, clearly "
            f"fewer than the {planned} planned for context_tokens={config.context_tokens}; the "
            "haystack text is lost when the prompt is built (is it mostly whitespace or markup?)."
        )


def make_niah_samples(
    tokenizer,
    *,
    n: int,
    context_tokens: int | list[int] = 1000,
    depths: list[float] | None = None,
    seed: int = 0,
    max_tokens: int | None = None,
    random_layout: bool = False,
    max_offset: int = 3000,
    **overrides,
) -> list[Sample]:
    """``n`` samples with depths spread evenly (or drawn from ``depths``) and one UUID each.

    ``random_layout=True`` draws each sample's depth uniformly from [0, 1] and its haystack offset (tokens
    skipped at the start of the haystack) uniformly from [0, ``max_offset``), both from the sample's seed, so
    that samples (and seeds) differ in where the needle sits and in the text around it, not only in the UUID.

    Sample ``i`` uses seed ``mix_seed(seed, i)``, so two splits with different ``seed`` never
    share a needle. Without ``max_tokens`` the tokenizer's own limit is used when it knows one
    (:func:`~dynheads_tl.tasks.common.tokenizer_max_tokens`), so a prompt longer than the model's
    window fails here instead of at generation.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}.")
    max_tokens = resolve_max_tokens(tokenizer, max_tokens)
    if is_wu_spec(overrides.get("haystack")):  # Wu et al.'s needles, questions, prompt and span rule
        unknown = sorted(set(overrides) - {"haystack", "max_new_tokens"})
        if unknown:
            raise ValueError(f"A Wu et al. haystack sets its own needle and prompt; {unknown} cannot be changed.")
        return make_wu_samples(tokenizer, overrides["haystack"], n=n, context_tokens=context_tokens, seed=seed,
                               depths=depths, max_tokens=max_tokens, random_layout=random_layout)
    lengths = context_tokens if isinstance(context_tokens, list) else [context_tokens]
    samples = []
    if random_layout and depths:
        raise ValueError("Give either depths or random_layout=True, not both.")
    if not isinstance(max_offset, int) or max_offset < 1:
        raise ValueError(f"max_offset must be a positive integer, got {max_offset!r}.")
    for i in range(n):
        depth = depths[i % len(depths)] if depths else (i + 0.5) / max(n, 1)
        layout = {}
        if random_layout:
            rng = random.Random(f"layout:{mix_seed(seed, i)}")
            depth = round(rng.random(), 4)
            layout = {"haystack_offset": rng.randrange(max_offset)}
        config = NiahConfig(
            context_tokens=lengths[i % len(lengths)],
            depth=depth,
            seed=mix_seed(seed, i),
            **layout,
            **overrides,
        )
        samples.append(build_niah_sample(tokenizer, config, max_tokens=max_tokens))
    return samples


def needle_lengths(tokenizer, needle: str = NiahConfig.needle, samples: int = 16) -> tuple[int, int]:
    """What a NIAH sample needs from ``tokenizer``'s model, as (answer tokens, needle tokens), over ``samples`` seeded
    UUIDs drawn as :func:`build_niah_sample` draws them.

    Answer tokens: the fewest tokens in which an answer can pass Wu et al.'s filter (ROUGE-1 recall above 0.5 of the
    UUID's five words, so its first three words), the least number of decoding steps with which a calibration sample
    can count. Needle tokens: the most any needle sentence takes, which a context must exceed to hold any haystack."""
    answer_tokens, needle_tokens = [], []
    for index in range(samples):
        answer = str(uuid.UUID(int=random.Random(mix_seed(0, index)).getrandbits(128), version=4))
        words = answer.split("-")
        passing = "-".join(words[: len(words) // 2 + 1])
        answer_tokens.append(len(tokenizer(" " + passing, add_special_tokens=False)["input_ids"]))
        needle_tokens.append(len(tokenizer(" " + needle.format(answer=answer), add_special_tokens=False)["input_ids"]))
    return min(answer_tokens), max(needle_tokens)
