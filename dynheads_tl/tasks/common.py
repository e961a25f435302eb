"""What every task shares: the paper's chat prompt and exact token spans from character offsets."""
from __future__ import annotations

from dataclasses import dataclass, field
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


def build_chat_prompt(tokenizer, context: str, question: str, instruction: str) -> str:
    """The paper's prompt (App. A.1) rendered with the model's own chat template."""
    user = USER_TEMPLATE.format(context=context, question=question, instruction=instruction)
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": user},
    ]
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    # Base models without a template: a plain rendering that keeps the same text.
    return f"{SYSTEM_PROMPT}\n\n{user}\n\nAnswer:"


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
    # Templates without a BOS token of their own (Llama 3 has one, SmolLM2 does not need one).
    if getattr(tokenizer, "add_bos_token", False) and bos is not None and (not ids or ids[0] != bos):
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


def check_fits(n_tokens: int, max_tokens: int | None, max_new_tokens: int, what: str) -> None:
    if max_tokens is not None and n_tokens + max_new_tokens > max_tokens:
        raise ValueError(
            f"The {what} prompt has {n_tokens} tokens; with max_new_tokens={max_new_tokens} it "
            f"exceeds the model's maximum context of {max_tokens} tokens. Lower context_tokens."
        )
