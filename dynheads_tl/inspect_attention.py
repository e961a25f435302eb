"""Attention inspection for one sample: full attention rows of every head at chosen decoding steps,
rendered with circuitsvis (offline: its bundled JavaScript is always inlined) and with seaborn.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from .hooks import StepState, pattern_hook_name
from .tasks.common import Sample
from .tracing import Trace, TraceConfig, trace_generation


@dataclass
class InspectedSample:
    trace: Trace
    rows: Float[Tensor, "step layer head key"]  # attention rows at every step, padded with zeros
    tokens: list[str]  # prompt + generated tokens, needle tokens marked

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
        tokens.append(f"【{text}】" if is_evidence else text)
    return InspectedSample(trace, rows[: trace.n_steps, :, :, : len(ids)], tokens)


def heads_at_step_view(inspected: InspectedSample, step: int, max_tokens: int | None = None):
    """circuitsvis: every head's attention over the text at one step (pick a head to colour the tokens)."""
    import circuitsvis.tokens

    if not 0 <= step < inspected.trace.n_steps:
        raise ValueError(f"step must be in [0, {inspected.trace.n_steps - 1}], got {step}.")
    key_len = len(inspected.trace.prompt_ids) + step
    row = inspected.rows[step, :, :, :key_len].flatten(0, 1)  # [layer*head, key]
    n_heads = inspected.rows.shape[2]
    labels = [f"L{i // n_heads}H{i % n_heads}" for i in range(row.shape[0])]
    tokens = inspected.tokens[:key_len]
    if max_tokens is not None and key_len > max_tokens:
        tokens, row = tokens[-max_tokens:], row[:, -max_tokens:]
    # Three decimals are plenty for colour and keep the executed notebook small.
    return inline(circuitsvis.tokens.colored_tokens_multi(tokens, row.T.contiguous().double().round(decimals=3), labels))


def dynamic_heads_view(inspected: InspectedSample):
    """circuitsvis: the Eq. 1 retrieval heads over the generated tokens (1 = retrieving at that step);
    generated tokens copied from the needle by at least one head are marked 【like this】."""
    import circuitsvis.tokens

    mask = inspected.trace.retrieval_mask.flatten(1).float()  # [step, layer*head]
    active = mask.sum(0) > 0
    if not bool(active.any()):
        raise ValueError("No head retrieved at any step of this sample; pick another sample.")
    n_heads = inspected.rows.shape[2]
    labels = [f"L{i // n_heads}H{i % n_heads}" for i in active.nonzero().flatten().tolist()]
    # Generated tokens that some head copied from the needle are marked like the needle itself.
    copied = mask.sum(1) > 0
    tokens = [f"【{tok}】" if hit else tok
              for tok, hit in zip(inspected.tokens[len(inspected.trace.prompt_ids):], copied.tolist())]
    return inline(circuitsvis.tokens.colored_tokens_multi(tokens, mask[:, active].contiguous(), labels))


class _InlineHTML:
    def __init__(self, html: str):
        self.html = html

    def _repr_html_(self) -> str:
        return self.html


def inline(rendered) -> _InlineHTML:
    """Always the self-contained version (circuitsvis' bundled JS inlined), never the CDN one, so the
    view renders offline and the executed notebook keeps it."""
    return _InlineHTML(rendered.local_src)


def needle_window(inspected: InspectedSample, margin: int = 12) -> tuple[int, int]:
    start, end = inspected.trace.evidence_spans[0]
    return max(start - margin, 0), min(end + margin, len(inspected.trace.prompt_ids))


def static_step_heatmap(inspected: InspectedSample, step: int, n_top: int = 12):
    """seaborn: the ``n_top`` heads with most attention on the needle at ``step``, over the needle window."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    start, end = needle_window(inspected)
    row = inspected.rows[step].flatten(0, 1)
    on_needle = row[:, slice(*inspected.trace.evidence_spans[0])].sum(-1)
    top = torch.argsort(on_needle, descending=True, stable=True)[:n_top]
    n_heads = inspected.rows.shape[2]
    labels = [f"L{int(i) // n_heads}H{int(i) % n_heads}" for i in top]
    fig, ax = plt.subplots(figsize=(max(8, 0.28 * (end - start)), 0.32 * n_top + 1.8))
    sns.heatmap(row[top, start:end].numpy(), ax=ax, cmap="magma", xticklabels=inspected.tokens[start:end],
                yticklabels=labels, cbar_kws={"label": "attention"})
    generated = inspected.tokens[len(inspected.trace.prompt_ids) + step] if step < inspected.trace.n_steps else "?"
    ax.set_title(f"step {step} (generating {generated!r}): top-{n_top} heads by attention on the needle 【…】")
    plt.setp(ax.get_xticklabels(), rotation=90, fontsize=7)
    fig.tight_layout()
    return fig
