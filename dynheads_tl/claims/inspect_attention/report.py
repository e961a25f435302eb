"""Notebook 00's views: circuitsvis (offline: its bundled JavaScript is always inlined) and seaborn.

circuitsvis' ``ColoredTokensMulti`` pads its view by 20 px per value it can show (room for the tooltip that lists
them all), so the views show a ranked dozen heads rather than every head, and sit in a box of bounded height that
scrolls.
"""
from __future__ import annotations

import torch

from dynheads_tl.engine.equations import head_labels

from .pipeline import InspectedSample, heads_by_needle_attention, mark_needle, needle_window

__all__ = ["VIEW_MAX_HEIGHT_PX", "heads_at_step_view", "dynamic_heads_view", "inline", "static_step_heatmap"]


VIEW_MAX_HEIGHT_PX = 800  # circuitsvis views taller than this scroll inside their box


def _head_labels(flat_heads: list[int], n_heads: int) -> list[str]:
    return head_labels(flat_heads, n_heads)


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
    fig = Figure(figsize=(max(9, 0.34 * (end - start)), 0.4 * len(labels) + 2.4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    sns.heatmap(row[top, start:end].numpy(), ax=ax, cmap="magma", xticklabels=inspected.tokens[start:end],
                yticklabels=labels, cbar_kws={"label": "attention weight", "shrink": 0.8})
    generated = inspected.tokens[len(inspected.trace.prompt_ids) + step]
    ax.set_title(f"step {step} (generating {generated!r}): the top-{len(labels)} heads by attention on the "
                 f"needle {mark_needle('…')}", fontsize=11)
    ax.set_xlabel("context token (the needle ± 12 tokens)", fontsize=10)
    ax.set_ylabel("head", fontsize=10)
    ax.tick_params(axis="y", labelsize=9, rotation=0)
    for label in ax.get_xticklabels():
        label.set_rotation(90)
        label.set_fontsize(9)
    fig.tight_layout()
    return fig
