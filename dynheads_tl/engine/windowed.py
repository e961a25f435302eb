"""The fast twin's attention: transformers' SDPA, with a sliding-window layer's keys cut to those its queries can see.

The twin prefills into a ``DynamicCache`` that keeps every position of every layer (the prefix store,
``cache_prefix`` and ``bounded_windows(False)`` read them all), so on a sliding-window layer (Gemma 3: 15 of its 18
layers, window 512) each chunk's queries would meet every earlier key, though the window masks every key more than
``window - 1`` positions before its query. :func:`windowed_sdpa` hands SDPA only the last ``queries + window - 1``
keys, values and mask columns, the ones the chunk's earliest query can still see; the cache is not touched. The
result is the stock SDPA's up to float rounding (the softmax sums over fewer masked keys, in another order).

It is registered with transformers (:func:`register_attention`) as :data:`ATTENTION`, with "sdpa"'s mask function:
transformers builds a mask only for an implementation its mask interface knows. Every other layer and model (no
``sliding_window``: Llama, Qwen2.5, Gemma 3's global layers) passes through to transformers' own SDPA unchanged.
:func:`stock_attention` switches a twin back to plain "sdpa" for a block (the benchmarks' transformers baselines).
"""
from __future__ import annotations

import contextlib
import logging
from typing import Iterator

import torch

logger = logging.getLogger(__name__)

ATTENTION = "dynheads_sdpa"  # the fast twin's attention implementation, as registered with transformers

_WARNED: list[bool] = [False]


def visible_keys(queries: int, keys: int, window: int | None) -> int | None:
    """How many of the last ``keys`` keys a sliding layer's ``queries`` (the last ``queries`` positions, in cache
    coordinates) can see, when that is fewer than all: a query at position q sees keys k with q - window < k <= q,
    so the earliest query, at ``keys - queries``, sees ``queries + window - 1`` keys back from the end. None for a
    global layer (``window`` None) or when every key is within reach."""
    if window is None or window < 1:
        return None
    keep = queries + int(window) - 1
    return keep if keys > keep else None


def windowed_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, sliding_window: int | None = None, **kwargs):
    """transformers' ``sdpa_attention_forward`` over the keys a sliding layer's queries can see (:func:`visible_keys`).

    ``query`` is [batch, heads, queries, d_head], ``key`` and ``value`` [batch, kv_heads, keys, d_head] with the
    queries as the last positions (a ``DynamicCache`` layer after its update), ``attention_mask`` the boolean
    [batch, 1, queries, keys] mask transformers built for the layer. The cut is made only where it provably changes
    nothing but rounding: a boolean mask as wide as the keys that masks every dropped key from every query (checked,
    one reduction over the dropped columns; otherwise it passes through with a warning, once). Without a mask SDPA
    runs with ``is_causal``, whose alignment assumes the keys begin at position 0: nothing is cut."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    keep = visible_keys(query.shape[2], key.shape[2], sliding_window)
    if keep is not None and _cuttable(attention_mask, key, keep, kwargs):
        key, value, attention_mask = key[:, :, -keep:], value[:, :, -keep:], attention_mask[..., -keep:]
    return sdpa_attention_forward(module, query, key, value, attention_mask, sliding_window=sliding_window, **kwargs)


def _cuttable(attention_mask: torch.Tensor | None, key: torch.Tensor, keep: int, kwargs: dict) -> bool:
    """Whether :func:`windowed_sdpa` may drop all but the last ``keep`` keys: a boolean mask of the keys' width that
    masks every dropped one, and no position bias or paged cache (which index the keys themselves)."""
    if (attention_mask is None or attention_mask.dtype != torch.bool or attention_mask.dim() != 4
            or attention_mask.shape[-1] != key.shape[2] or kwargs.get("position_bias") is not None
            or kwargs.get("cache") is not None):
        return False
    if bool(attention_mask[..., :-keep].any()):
        if not _WARNED[0]:
            _WARNED[0] = True
            logger.warning("A sliding-window layer's mask lets a query see a key more than its window before it; "
                           "the fast twin attends to every key there (as stock SDPA does).")
        return False
    return True


def register_attention() -> str:
    """Register :func:`windowed_sdpa` with transformers' ``AttentionInterface`` and "sdpa"'s mask function with its
    ``AttentionMaskInterface``, both under :data:`ATTENTION` (idempotent), and return the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, windowed_sdpa)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    return ATTENTION


@contextlib.contextmanager
def stock_attention(twin: torch.nn.Module, implementation: str = "sdpa") -> Iterator[torch.nn.Module]:
    """Run ``twin`` (a transformers model) with transformers' own ``implementation`` for the block, then switch it
    back to the one it had: a baseline that times stock transformers, not :func:`windowed_sdpa`."""
    before = twin.config._attn_implementation
    twin.set_attn_implementation(implementation)
    if twin.config._attn_implementation != implementation:  # transformers only warns when a model refuses it
        twin.set_attn_implementation(before)
        raise ValueError(f"The model refused attention {implementation!r} (it kept {before!r}); a baseline timed "
                         "with it would not be stock transformers.")
    try:
        yield twin
    finally:
        twin.set_attn_implementation(before)


def stock_generate(twin: torch.nn.Module, ids: torch.Tensor, **kwargs) -> torch.Tensor:
    """transformers' own ``generate`` on ``twin`` with its stock SDPA (:func:`stock_attention`): the benchmarks'
    untraced baseline."""
    with stock_attention(twin):
        return twin.generate(ids, **kwargs)
