"""The decoder's preallocated KV cache (:class:`StaticKVCache`), written in place by a step and rewound by moving its
length, and what a sliding-window layer may drop from it (:func:`window_starts`, :func:`check_dropped_keys`).

The decoding step that reads and writes it is :func:`dynheads_tl.engine.grouped.grouped_forward`; the batch that
owns it, :class:`dynheads_tl.engine.decoder.BatchDecoder`.
"""
from __future__ import annotations

from typing import Sequence

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

    ``owners`` (one per row) and ``prompt``: rows with the same owner decode the same prompt, whose ``prompt``
    positions are then held once per owner (``prompt_keys[i]``: ``[owner, kv_head, prompt - starts[i], d_head]``)
    and the per-row buffers begin at ``prompt`` (:meth:`base`). The grouped step multiplies all of an owner's rows
    against that copy at once (:meth:`prompt_scores`, :meth:`prompt_output`); :meth:`held`, :meth:`padded` and
    ``layers`` then return copies with each row's prompt in front, and :meth:`unshare` gives every row its own
    copy again (a rewind into the prompt). The masking conditions of one sample (a grid cell's 15 rows) read one
    copy, so a batch of 225 rows over 15 prompts holds 15 prompts' keys, not 225.
    """

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, d_head: int, capacity: int, *,
                 dtype: torch.dtype, device: torch.device, starts: list[int] | None = None,
                 windows: list[int | None] | None = None, owners: Sequence[int] | None = None, prompt: int = 0):
        capacity = max(int(capacity), 1)
        self.starts = [0] * n_layers if starts is None else [int(s) for s in starts]
        self.windows = [None] * n_layers if windows is None else list(windows)
        if len(self.starts) != n_layers or len(self.windows) != n_layers:
            raise ValueError(f"starts and windows need one entry per layer ({n_layers}).")
        if not all(0 <= s < capacity for s in self.starts):
            raise ValueError(f"Every layer's start must lie in [0, {capacity}), got {self.starts}.")
        self._capacity = capacity
        self.prompt = int(prompt) if owners is not None else 0
        if owners is not None and (len(owners) != batch or not 0 < self.prompt < capacity):
            raise ValueError(f"owners needs one entry per row ({batch}) and prompt a length in (0, {capacity}).")
        self.owners = None if owners is None else [int(o) for o in owners]
        self.groups = _owner_groups(self.owners, device) if owners is not None else []
        # r when owner u holds rows [u * r, (u + 1) * r) (a grid cell's conditions, sample by sample), else 0
        self.per_owner = len(self.owners) // len(self.groups) if owners is not None and self.owners == [
            u for u in range(len(self.groups)) for _ in range(len(self.owners) // len(self.groups))] else 0
        n_owners = len(self.groups)
        self.prompt_keys = [torch.zeros((n_owners, n_kv_heads, max(self.prompt - s, 0), d_head), dtype=dtype,
                                        device=device) for s in self.starts] if owners is not None else []
        self.prompt_values = [torch.zeros_like(k) for k in self.prompt_keys]
        self.keys = [torch.zeros((batch, n_kv_heads, capacity - self.base(i), d_head), dtype=dtype, device=device)
                     for i in range(n_layers)]
        self.values = [torch.zeros_like(k) for k in self.keys]
        self.length = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def shared(self) -> bool:
        """Whether the prompt's positions are held once per owner (``owners``) rather than once per row."""
        return self.owners is not None

    def base(self, layer: int) -> int:
        """The first position layer ``layer``'s per-row buffer holds: its start, or the prompt's end when shared."""
        return max(self.starts[layer], self.prompt)

    @property
    def nbytes(self) -> int:
        """Bytes held by every buffer (per-row and shared)."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values, *self.prompt_keys,
                                                         *self.prompt_values))

    def reserve(self, length: int) -> None:
        """Make room for ``length`` positions (reallocating to at least twice the size when short)."""
        if length <= self.capacity:
            return
        new = max(length, 2 * self.capacity)
        for store in (self.keys, self.values):
            for index, old in enumerate(store):
                base = self.base(index)
                grown = torch.zeros((*old.shape[:2], new - base, old.shape[3]), dtype=old.dtype, device=old.device)
                held = max(self.length - base, 0)
                grown[:, :, :held] = old[:, :, :held]
                store[index] = grown
        self._capacity = new

    def write(self, layer: int, keys: Float[Tensor, "batch kv_head query d_head"],
              values: Float[Tensor, "batch kv_head query d_head"], start: int, rows: slice | int = slice(None)) -> None:
        """Write one layer's new keys and values at positions ``[start, start + query)``, in place (``rows``: the
        batch rows written, all by default); positions before the layer's start are not kept. A shared prompt's
        positions are written once, by :meth:`write_prompt`."""
        if self.shared and start < self.prompt and start + keys.shape[-2] > self.starts[layer]:
            raise ValueError(f"Positions before {self.prompt} hold the shared prompt; unshare() the cache first.")
        first = self.base(layer)
        skip = max(first - start, 0)
        if skip >= keys.shape[-2]:
            return
        begin, end = start + skip - first, start + keys.shape[-2] - first
        self.keys[layer][rows, :, begin:end] = keys[..., skip:, :]
        self.values[layer][rows, :, begin:end] = values[..., skip:, :]

    def write_prompt(self, layer: int, owner: int, keys: Float[Tensor, "kv_head query d_head"],
                     values: Float[Tensor, "kv_head query d_head"], start: int) -> None:
        """Write owner ``owner``'s prompt keys and values at positions ``[start, start + query)`` (within the
        prompt), for every row it owns."""
        first = self.starts[layer]
        skip = max(first - start, 0)
        if start + keys.shape[-2] > self.prompt:
            raise ValueError(f"A shared prompt spans positions [0, {self.prompt}).")
        if skip < keys.shape[-2]:
            self.prompt_keys[layer][owner, :, start + skip - first:start + keys.shape[-2] - first] = keys[:, skip:]
            self.prompt_values[layer][owner, :, start + skip - first:start + keys.shape[-2] - first] = values[:, skip:]

    def tail(self, layer: int, end: int | None = None) -> tuple[Tensor, Tensor]:
        """Views of layer ``layer``'s per-row keys and values at positions ``[base(layer), end)`` (default:
        ``length``): every held position unless the prompt is shared, then the positions after it."""
        stop = max((self.length if end is None else end) - self.base(layer), 0)
        return self.keys[layer][:, :, :stop], self.values[layer][:, :, :stop]

    def held(self, layer: int, end: int | None = None) -> tuple[Tensor, Tensor]:
        """Layer ``layer``'s keys and values at positions ``[starts[layer], end)`` (default: ``length``): views,
        or, when the prompt is shared, copies with each row's prompt in front."""
        keys, values = self.tail(layer, end)
        if not self.shared:
            return keys, values
        owners = torch.tensor(self.owners, device=keys.device)
        stop = min(self.length if end is None else end, self.prompt) - self.starts[layer]
        return (torch.cat([self.prompt_keys[layer][owners, :, :max(stop, 0)], keys], dim=2),
                torch.cat([self.prompt_values[layer][owners, :, :max(stop, 0)], values], dim=2))

    def padded(self, layer: int, end: int) -> tuple[Tensor, Tensor]:
        """Layer ``layer``'s keys and values at positions ``[0, end)``: views when it keeps every position, else
        copies with zeros before its start (positions outside every remaining query's window)."""
        keys, values = self.held(layer, end)
        first = self.starts[layer]
        if first == 0:
            return keys, values
        pad = (*keys.shape[:2], first, keys.shape[3])
        return (torch.cat([keys.new_zeros(pad), keys], dim=2), torch.cat([values.new_zeros(pad), values], dim=2))

    def unshare(self) -> None:
        """Give every row its own copy of its prompt (before a rewind into the prompt, which the next step would
        overwrite row by row)."""
        if not self.shared:
            return
        whole = [self.held(index, self._capacity) for index in range(len(self.keys))]
        self.keys, self.values = [k for k, _ in whole], [v for _, v in whole]
        self.owners, self.groups, self.prompt_keys, self.prompt_values, self.prompt = None, [], [], [], 0
        self.per_owner = 0

    def prompt_scores(self, layer: int, query: Float[Tensor, "batch kv_head rows d_head"]
                      ) -> Float[Tensor, "batch kv_head rows key"]:
        """``query @ keys^T`` over the shared prompt's positions ``[starts[layer], prompt)``: the rows of one owner
        multiply against its one copy together (the prompt's keys are read once per owner, not once per row)."""
        return self._owner_product(query, self.prompt_keys[layer].transpose(-2, -1))

    def prompt_output(self, layer: int, pattern: Float[Tensor, "batch kv_head rows key"]
                      ) -> Float[Tensor, "batch kv_head rows d_head"]:
        """``pattern @ values`` over the shared prompt's positions, one owner's rows together."""
        return self._owner_product(pattern, self.prompt_values[layer])

    def _owner_product(self, rows: Tensor, operand: Tensor) -> Tensor:
        """``rows[b] @ operand[owners[b]]`` for every row ``b`` ([batch, kv_head, m, n] against [owner, kv_head, n,
        k]), each owner's rows stacked along ``m``: one batched product when owner u holds rows
        ``[u * r, (u + 1) * r)``, else owner by owner."""
        if self.per_owner:
            return _by_owner(rows, self.per_owner, lambda stacked: torch.matmul(stacked, operand))
        out = rows.new_empty((*rows.shape[:3], operand.shape[-1]))
        for owner, members in self.groups:
            part = rows[members]  # [r, kv_head, m, n]
            r, n_kv, m, n = part.shape
            product = torch.matmul(part.transpose(0, 1).reshape(n_kv, r * m, n), operand[owner])
            out[members] = product.view(n_kv, r, m, -1).transpose(0, 1)
        return out

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


def _by_owner(rows: Tensor, per_owner: int, product) -> Tensor:
    """``product`` of each owner's rows stacked along the query dimension: ``rows`` [batch, kv_head, m, n] is viewed
    as [owner, kv_head, per_owner * m, n], multiplied, and viewed back as [batch, kv_head, m, -1]."""
    batch, n_kv, m, n = rows.shape
    owners = batch // per_owner
    stacked = rows.reshape(owners, per_owner, n_kv, m, n).transpose(1, 2).reshape(owners, n_kv, per_owner * m, n)
    out = product(stacked)
    return out.view(owners, n_kv, per_owner, m, -1).transpose(1, 2).reshape(batch, n_kv, m, -1)


def _owner_groups(owners: list[int], device) -> list[tuple[int, slice | Tensor]]:
    """``(owner, rows)`` per owner, in order: a slice where its rows are consecutive (a view), else an index."""
    groups = []
    for owner in sorted(set(owners)):
        rows = [b for b, o in enumerate(owners) if o == owner]
        consecutive = rows == list(range(rows[0], rows[-1] + 1))
        groups.append((owner, slice(rows[0], rows[-1] + 1) if consecutive else torch.tensor(rows, device=device)))
    return groups


def window_starts(windows: list[int | None], n_cached: int) -> list[int]:
    """Each layer's first kept position for a cache whose earliest query is at position ``n_cached`` (a decoder's
    prompt minus its last token): a query at q sees the keys k > q - w on a layer with window w, so such a layer
    never needs a key before ``n_cached - w + 1``; a global layer (None) keeps every key."""
    return [0 if window is None else max(n_cached - int(window) + 1, 0) for window in windows]


class _LayerView:
    def __init__(self, keys: Tensor, values: Tensor):
        self.keys, self.values = keys, values
