"""Notebook 00's pipeline: one sample traced with every head's full attention row at every decoding step.

Needle tokens are marked «like this»: guillemets are Latin-1, so DejaVu Sans (matplotlib's default) and every
browser font draw them, which CJK brackets are not.
"""
from __future__ import annotations

from dataclasses import dataclass
import torch
from jaxtyping import Float, Int
from torch import Tensor

from dynheads_tl.engine.hooks import StepState, pattern_hook_name
from dynheads_tl.tasks.common import Sample
from dynheads_tl.engine.tracing import Trace, TraceConfig, trace_generation

__all__ = [
    "NEEDLE_OPEN", "NEEDLE_CLOSE", "mark_needle", "InspectedSample", "trace_with_rows", "heads_by_needle_attention",
    "needle_window",
]


NEEDLE_OPEN, NEEDLE_CLOSE = "«", "»"


def mark_needle(text: str) -> str:
    """A token copied from, or lying in, the needle: «text», its leading space kept outside the marks."""
    word = text.lstrip()
    return f"{text[: len(text) - len(word)]}{NEEDLE_OPEN}{word}{NEEDLE_CLOSE}"


@dataclass
class InspectedSample:
    trace: Trace
    rows: Float[Tensor, "step layer head key"]  # attention rows at every step, padded with zeros
    tokens: list[str]  # prompt + generated tokens, needle tokens marked «like this»

    @property
    def n_heads_total(self) -> int:
        return self.rows.shape[1] * self.rows.shape[2]


def trace_with_rows(model, sample: Sample, config: TraceConfig | None = None) -> InspectedSample:
    """Trace ``sample`` and keep every head's full attention row at every step.

    Only for short prompts: memory is steps x layers x heads x T floats.
    """
    config = config or TraceConfig()
    total = len(sample.prompt_ids) + config.max_new_tokens
    if total * config.max_new_tokens * model.cfg.n_layers * model.cfg.n_heads > 200_000_000:
        raise ValueError("trace_with_rows keeps every attention row; use a prompt under ~2k tokens.")
    rows = torch.zeros(config.max_new_tokens, model.cfg.n_layers, model.cfg.n_heads, total)
    state = StepState()

    def make(layer):
        def hook(pattern, hook):
            if state.active:
                row = pattern[0, :, -1, :].float().cpu()
                rows[state.step, layer, :, : row.shape[-1]] = row
        return hook

    hooks = [(pattern_hook_name(layer), make(layer)) for layer in range(model.cfg.n_layers)]
    trace = trace_generation(model, sample, config, hooks=hooks, state=state)
    ids = torch.cat([trace.prompt_ids, trace.tokens]).tolist()
    evidence = trace.evidence_mask.tolist() + [False] * trace.n_steps
    tokens = []
    for token_id, is_evidence in zip(ids, evidence):
        text = model.tokenizer.decode([token_id]).replace("\n", "\\n")
        tokens.append(mark_needle(text) if is_evidence else text)
    return InspectedSample(trace, rows[: trace.n_steps, :, :, : len(ids)], tokens)


def heads_by_needle_attention(inspected: InspectedSample, step: int) -> Int[Tensor, "layer_head"]:
    """Every head (flattened as layer * n_heads + head), most attention on the needle at ``step`` first
    (ties by index)."""
    if not 0 <= step < inspected.trace.n_steps:
        raise ValueError(f"step must be in [0, {inspected.trace.n_steps - 1}], got {step}.")
    on_needle = sum(inspected.rows[step, :, :, start:end].sum(-1) for start, end in inspected.trace.evidence_spans)
    return torch.argsort(on_needle.flatten(), descending=True, stable=True)


def needle_window(inspected: InspectedSample, margin: int = 12) -> tuple[int, int]:
    start, end = inspected.trace.evidence_spans[0]
    return max(start - margin, 0), min(end + margin, len(inspected.trace.prompt_ids))
