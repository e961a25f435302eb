"""The decoder's preallocated KV cache (:class:`StaticKVCache`), written in place by a step and rewound by moving its
length, and what a sliding-window layer may drop from it (:func:`window_starts`, :func:`check_dropped_keys`).

The decoding step that reads and writes it is :func:`dynheads_tl.engine.grouped.grouped_forward`; the batch that
owns it, :class:`dynheads_tl.engine.decoder.BatchDecoder`.
"""
from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

__all__ = ["StaticKVCache", "check_dropped_keys", "window_starts"]


class StaticKVCache:
    """Every layer's keys and values in one preallocated ``[batch, kv_head, capacity - start, d_head]`` buffer.

    ``length`` positions (cache coordinates) are valid; a step writes its keys and values at
    ``[length, length + q)`` in place and a rewind only moves ``length`` back. When a write would pass
    ``capacity`` the buffers are reallocated to twice the size (one copy, rare: the decoder sizes them for the
    generation).

    ``starts[i]``: the first position layer ``i`` keeps (0 by default). A sliding-window layer needs no key
    older than its window before the earliest query it will ever run (the decoder sets ``starts`` so, see
    :func:`window_starts`), so its buffer begins there: Gemma 3 270M's 15 sliding layers then hold about 512
    + the generation's positions instead of the whole prompt. ``keys[i][:, :, j]`` is position ``starts[i] + j``.
    ``windows[i]`` (None: a global layer) lets :meth:`check_reach` refuse a rewind that would need a dropped key.
    ``layers[i].keys`` / ``.values`` are views of the positions a layer holds, ``[starts[i], length)``
    (the ``DynamicCache`` layout when every start is 0); :meth:`padded` gives ``[0, end)`` with zeros before
    ``starts[i]`` (keys no query may attend to), for the eager path's ``DynamicCache``.
    """

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, d_head: int, capacity: int, *,
                 dtype: torch.dtype, device: torch.device, starts: list[int] | None = None,
                 windows: list[int | None] | None = None):
        capacity = max(int(capacity), 1)
        self.starts = [0] * n_layers if starts is None else [int(s) for s in starts]
        self.windows = [None] * n_layers if windows is None else list(windows)
        if len(self.starts) != n_layers or len(self.windows) != n_layers:
            raise ValueError(f"starts and windows need one entry per layer ({n_layers}).")
        if not all(0 <= s < capacity for s in self.starts):
            raise ValueError(f"Every layer's start must lie in [0, {capacity}), got {self.starts}.")
        self._capacity = capacity
        self.keys = [torch.zeros((batch, n_kv_heads, capacity - s, d_head), dtype=dtype, device=device)
                     for s in self.starts]
        self.values = [torch.zeros_like(k) for k in self.keys]
        self.length = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    def reserve(self, length: int) -> None:
        """Make room for ``length`` positions (reallocating to at least twice the size when short)."""
        if length <= self.capacity:
            return
        new = max(length, 2 * self.capacity)
        for store in (self.keys, self.values):
            for index, old in enumerate(store):
                start = self.starts[index]
                grown = torch.zeros((*old.shape[:2], new - start, old.shape[3]), dtype=old.dtype, device=old.device)
                held = max(self.length - start, 0)
                grown[:, :, :held] = old[:, :, :held]
                store[index] = grown
        self._capacity = new

    def write(self, layer: int, keys: Float[Tensor, "batch kv_head query d_head"],
              values: Float[Tensor, "batch kv_head query d_head"], start: int, rows: slice | int = slice(None)) -> None:
        """Write one layer's new keys and values at positions ``[start, start + query)``, in place (``rows``: the
        batch rows written, all by default); positions before the layer's start are not kept."""
        first = self.starts[layer]
        skip = max(first - start, 0)
        if skip >= keys.shape[-2]:
            return
        begin, end = start + skip - first, start + keys.shape[-2] - first
        self.keys[layer][rows, :, begin:end] = keys[..., skip:, :]
        self.values[layer][rows, :, begin:end] = values[..., skip:, :]

    def held(self, layer: int, end: int | None = None) -> tuple[Tensor, Tensor]:
        """Views of layer ``layer``'s keys and values at positions ``[starts[layer], end)`` (default: ``length``)."""
        stop = max((self.length if end is None else end) - self.starts[layer], 0)
        return self.keys[layer][:, :, :stop], self.values[layer][:, :, :stop]

    def padded(self, layer: int, end: int) -> tuple[Tensor, Tensor]:
        """Layer ``layer``'s keys and values at positions ``[0, end)``: views when it keeps every position, else
        copies with zeros before its start (positions outside every remaining query's window)."""
        keys, values = self.held(layer, end)
        first = self.starts[layer]
        if first == 0:
            return keys, values
        pad = (*keys.shape[:2], first, keys.shape[3])
        return (torch.cat([keys.new_zeros(pad), keys], dim=2), torch.cat([values.new_zeros(pad), values], dim=2))

    def check_reach(self, n_cached: int) -> None:
        """Refuse a length whose next query (at position ``n_cached``) would see a key a sliding layer dropped."""
        for index, (first, window) in enumerate(zip(self.starts, self.windows)):
            if first > 0 and window is not None and n_cached - window + 1 < first:
                raise ValueError(
                    f"Cannot rewind to {n_cached} positions: sliding-window layer {index} keeps keys from position "
                    f"{first} on (its {window}-token window before the prompt's last token); build the decoder "
                    "inside bounded_windows(False) to keep every key.")

    @property
    def layers(self) -> list["_LayerView"]:
        return [_LayerView(*self.held(index)) for index in range(len(self.keys))]

    def get_seq_length(self) -> int:
        return self.length


def check_dropped_keys(pattern: Tensor, first: int, layer: int) -> None:
    """Refuse a pattern that gives weight to a position before ``first``, a key this layer's cache dropped (only a
    hook can: the window masks them)."""
    if bool(pattern[..., :first].any()):
        raise RuntimeError(
            f"A hook gave attention to keys of layer {layer} older than its sliding window (or masked every key "
            "inside it), which this cache no longer holds; build the decoder inside bounded_windows(False).")


def window_starts(windows: list[int | None], n_cached: int) -> list[int]:
    """Each layer's first kept position for a cache whose earliest query is at position ``n_cached`` (a decoder's
    prompt minus its last token): a query at q sees the keys k > q - w on a layer with window w, so such a layer
    never needs a key before ``n_cached - w + 1``; a global layer (None) keeps every key."""
    return [0 if window is None else max(n_cached - int(window) + 1, 0) for window in windows]


class _LayerView:
    def __init__(self, keys: Tensor, values: Tensor):
        self.keys, self.values = keys, values
