"""Attention inspection for one sample: full attention rows of every head at chosen decoding steps,
rendered with circuitsvis (offline: its bundled JavaScript is always inlined) and with seaborn.

Needle tokens are marked «like this»: guillemets are Latin-1, so DejaVu Sans (matplotlib's default)
and every browser font draw them, which CJK brackets are not.

circuitsvis' ``ColoredTokensMulti`` pads its view by 20 px per value it can show (room for the
tooltip that lists them all), so the views show a ranked dozen heads rather than every head, and sit in
a box of bounded height that scrolls.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from dynheads_tl.config import DeviceSettings, NotebookConfig, check_ints
from dynheads_tl.engine.equations import head_labels
from dynheads_tl.engine.hooks import StepState, pattern_hook_name
from dynheads_tl.tasks.common import Sample
from dynheads_tl.engine.tracing import Trace, TraceConfig, trace_generation

NEEDLE_OPEN, NEEDLE_CLOSE = "«", "»"
VIEW_MAX_HEIGHT_PX = 800  # circuitsvis views taller than this scroll inside their box


def mark_needle(text: str) -> str:
    """A token copied from, or lying in, the needle: «text», its leading space kept outside the marks."""
    word = text.lstrip()
    return f"{text[: len(text) - len(word)]}{NEEDLE_OPEN}{word}{NEEDLE_CLOSE}"


@dataclass
class InspectConfig(DeviceSettings, NotebookConfig):
    """Notebook 00's parameters, validated. Field comments are in the notebook."""

    model: str = "smollm2-135m-instruct"
    context_tokens: int = 200
    depth: float = 0.5
    seed: int = 0
    max_new_tokens: int = 32
    step: int = -1
    n_view_heads: int = 12
    output_dir: str = "papers_figures"

    def __post_init__(self):
        super().__post_init__()
        check_ints(self, ("context_tokens", "max_new_tokens", "n_view_heads"))
        check_ints(self, ("seed",), minimum=0)
        check_ints(self, ("step",), minimum=-1)
        if isinstance(self.depth, bool) or not isinstance(self.depth, (int, float)) or not 0 <= self.depth <= 1:
            raise ValueError(f"Parameter 'depth' must be a fraction in [0, 1], got {self.depth!r}.")

    def check_inputs(self) -> None:
        """The context against the model's window (every attention row is kept, so it must stay short)."""
        from dynheads_tl.config import model_context_window
        from dynheads_tl.tasks import check_context_fits

        check_context_fits(self.context_tokens, self.max_new_tokens, model_context_window(self.model),
                           name="context_tokens")
        if self.context_tokens > 2000:
            raise ValueError(f"Parameter 'context_tokens' must be at most 2000 here (every head's full attention row "
                             f"is kept at every step), got {self.context_tokens}.")


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


def _head_labels(flat_heads: list[int], n_heads: int) -> list[str]:
    return head_labels(flat_heads, n_heads)


def heads_by_needle_attention(inspected: InspectedSample, step: int) -> Int[Tensor, "layer_head"]:
    """Every head (flattened as layer * n_heads + head), most attention on the needle at ``step`` first
    (ties by index)."""
    if not 0 <= step < inspected.trace.n_steps:
        raise ValueError(f"step must be in [0, {inspected.trace.n_steps - 1}], got {step}.")
    on_needle = sum(inspected.rows[step, :, :, start:end].sum(-1) for start, end in inspected.trace.evidence_spans)
    return torch.argsort(on_needle.flatten(), descending=True, stable=True)


def heads_at_step_view(inspected: InspectedSample, step: int, n_top: int | None = 12,
                       max_tokens: int | None = None):
    """circuitsvis: the ``n_top`` heads with most attention on the needle at ``step`` (all heads if
    None), each colouring the text by its attention row (pick a head in the selector)."""
    import circuitsvis.tokens

    if n_top is not None and n_top < 1:
        raise ValueError(f"n_top must be a positive number of heads or None (all heads), got {n_top}.")
    heads = heads_by_needle_attention(inspected, step)[:n_top]
    key_len = len(inspected.trace.prompt_ids) + step
    row = inspected.rows[step, :, :, :key_len].flatten(0, 1)[heads]  # [head, key]
    labels = _head_labels(heads.tolist(), inspected.rows.shape[2])
    tokens = inspected.tokens[:key_len]
    if max_tokens is not None and key_len > max_tokens:
        tokens, row = tokens[-max_tokens:], row[:, -max_tokens:]
    # Three decimals are plenty for colour and keep the executed notebook small.
    return inline(circuitsvis.tokens.colored_tokens_multi(tokens, row.T.contiguous().double().round(decimals=3), labels))


def dynamic_heads_view(inspected: InspectedSample, n_top: int | None = 12):
    """circuitsvis: the Eq. 1 retrieval heads over the generated tokens (1 = retrieving at that step),
    the ``n_top`` that retrieve at the most steps (all if None); generated tokens copied from the
    needle by at least one head are marked «like this»."""
    import circuitsvis.tokens

    if n_top is not None and n_top < 1:
        raise ValueError(f"n_top must be a positive number of heads or None (all heads), got {n_top}.")
    mask = inspected.trace.retrieval_mask.flatten(1).float()  # [step, layer*head]
    steps_retrieving = mask.sum(0)
    if not bool((steps_retrieving > 0).any()):
        raise ValueError("No head retrieved at any step of this sample; pick another sample.")
    order = torch.argsort(steps_retrieving, descending=True, stable=True)
    heads = order[: int((steps_retrieving > 0).sum())][:n_top]
    labels = _head_labels(heads.tolist(), inspected.rows.shape[2])
    # Generated tokens that some head copied from the needle are marked like the needle itself.
    copied = mask.sum(1) > 0
    tokens = [mark_needle(tok) if hit else tok
              for tok, hit in zip(inspected.tokens[len(inspected.trace.prompt_ids):], copied.tolist())]
    return inline(circuitsvis.tokens.colored_tokens_multi(tokens, mask[:, heads].contiguous(), labels))


class _InlineHTML:
    def __init__(self, html: str):
        self.html = html

    def _repr_html_(self) -> str:
        return self.html


def inline(rendered, max_height_px: int | None = VIEW_MAX_HEIGHT_PX) -> _InlineHTML:
    """Always the self-contained version (circuitsvis' bundled JS inlined), never the CDN one, so the
    view renders offline and the executed notebook keeps it; in a box that scrolls past
    ``max_height_px`` (None: no box)."""
    if max_height_px is None:
        return _InlineHTML(rendered.local_src)
    # circuitsvis writes its mount point as ``<div .../>``, which HTML leaves open: close it, then the box.
    return _InlineHTML(f'<div style="max-height: {max_height_px}px; overflow: auto;">'
                       f"{rendered.local_src}</div></div>")


def needle_window(inspected: InspectedSample, margin: int = 12) -> tuple[int, int]:
    start, end = inspected.trace.evidence_spans[0]
    return max(start - margin, 0), min(end + margin, len(inspected.trace.prompt_ids))


def static_step_heatmap(inspected: InspectedSample, step: int, n_top: int = 12):
    """seaborn: the ``n_top`` heads with most attention on the needle at ``step``, over the needle window.

    The figure is made without pyplot, so it is never left open in pyplot's registry (nothing to close)
    and is shown only where the caller displays it.
    """
    import seaborn as sns
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    start, end = needle_window(inspected)
    top = heads_by_needle_attention(inspected, step)[:n_top]
    row = inspected.rows[step].flatten(0, 1)
    labels = _head_labels(top.tolist(), inspected.rows.shape[2])
    fig = Figure(figsize=(max(8, 0.28 * (end - start)), 0.32 * len(labels) + 1.8))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    sns.heatmap(row[top, start:end].numpy(), ax=ax, cmap="magma", xticklabels=inspected.tokens[start:end],
                yticklabels=labels, cbar_kws={"label": "attention"})
    generated = inspected.tokens[len(inspected.trace.prompt_ids) + step]
    ax.set_title(f"step {step} (generating {generated!r}): top-{len(labels)} heads by attention on the "
                 f"needle {mark_needle('…')}")
    for label in ax.get_xticklabels():
        label.set_rotation(90)
        label.set_fontsize(7)
    fig.tight_layout()
    return fig
