"""What decoders share, and the switches that turn each sharing off: prompt prefixes prefilled once within a batch
(:func:`prefix_plan`) and across batches (:class:`PrefixStore`, :func:`shared_prefill`), one copy of a prompt's keys
and values for every row of a batch that decodes it (:func:`shared_prompts`), and the sliding-window bound of the
cache (:func:`bounded_windows`). None of them is part of any cache key: each gives the same tokens and Eq. 1 sets,
floats to rounding.

The decoder that reads them is :class:`dynheads_tl.engine.decoder.BatchDecoder`.
"""
from __future__ import annotations

import contextlib
import os
from collections import OrderedDict
from typing import Any, Iterator, Sequence

import numpy as np

from dynheads_tl.engine.kv_cache import window_starts

_SHARE_PREFIXES: list[bool] = [True]
_BOUND_WINDOWS: list[bool] = [True]
_SHARE_PROMPTS: list[bool] = [True]


def prefix_plan(prompts: Sequence[Sequence[int]], shareable: Sequence[int]) -> list[tuple[int, int | None, int]]:
    """The order in which to prefill ``prompts`` and what each reuses: ``(index, source, shared)`` per prompt,
    meaning prompt ``index`` copies its first ``shared`` positions from prompt ``source`` (prefilled before it;
    None when nothing is shared). Only the first ``shareable[i]`` positions of prompt ``i`` may be shared.

    The prompts are visited in lexicographic order of their ids: then the longest common prefix of a prompt with
    any earlier one is its common prefix with the one just before it, so one pass finds every reuse."""
    plan: list[tuple[int, int | None, int]] = []
    previous = None
    for index in sorted(range(len(prompts)), key=lambda i: tuple(prompts[i])):
        shared = 0
        if previous is not None:
            ids, before = prompts[index], prompts[previous]
            limit = min(shareable[index], shareable[previous])
            while shared < limit and ids[shared] == before[shared]:
                shared += 1
        plan.append((index, previous if shared else None, shared))
        previous = index
    return plan


class WindowedPrefix:
    """A store entry of ``n`` twin-prefilled positions whose sliding-window layers keep only the keys a query at
    position ``n`` or later can still see (``starts``: :func:`~dynheads_tl.engine.kv_cache.window_starts`; a global
    layer keeps all ``n``). It serves only a prompt that begins with all ``n`` of its tokens: a shorter shared
    prefix would need keys the entry dropped. :func:`cache_prefix` rebuilds a full-length cache from it, the dropped
    positions as zeros, which the window masks from every query that continues it."""

    def __init__(self, cache, n: int, windows: Sequence[int | None]):
        self.n = int(n)
        self.starts = window_starts(list(windows), self.n)
        self.layers = [(layer.keys[:, :, start:self.n].clone(), layer.values[:, :, start:self.n].clone())
                       for layer, start in zip(cache.layers, self.starts)]

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for pair in self.layers for t in pair)


class PrefixStore:
    """The twin-prefilled keys and values of recently prefilled prompts, per model, within a byte budget: a later
    decoder (another batch, another unit of the same call) copies the longest prefix it shares with one of them
    instead of prefilling it again. Least recently used entries leave first; an entry larger than the whole budget
    is never kept. Only positions the SDPA twin prefilled are kept (never a tail run through the hooked bridge).

    On a model with sliding-window layers (``windows`` given to :meth:`add`), an entry too large for the budget is
    kept as a :class:`WindowedPrefix` instead, if that fits: its sliding layers hold only their window (at 32k
    tokens of Gemma 3 270M about 0.2 of the 1.2 GB a full entry holds), and it serves a later prompt that begins with
    the whole entry (the same prompt in another batch) but no shorter shared prefix.

    ``hits`` / ``reused_positions`` count what later decoders took from the store."""

    def __init__(self, max_bytes: int):
        self.max_bytes = int(max_bytes)
        self.entries: OrderedDict[tuple[int, tuple[int, ...]], tuple[Any, int]] = OrderedDict()
        self.bytes = 0
        self.hits = self.reused_positions = 0

    @staticmethod
    def _size(cache) -> int:
        """Bytes the entry holds alive: every layer's whole key and value tensors (a bridge-run tail included)."""
        if isinstance(cache, WindowedPrefix):
            return cache.bytes
        return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))

    def add(self, model, ids: Sequence[int], cache, n: int, windows: Sequence[int | None] | None = None) -> None:
        """Keep ``cache``'s first ``n`` positions (twin-prefilled) as the keys and values of ``ids[:n]``; with
        ``windows`` (each layer's sliding window, None for a global layer), as a :class:`WindowedPrefix` when the
        whole cache would not fit the budget."""
        if n < 1:
            return
        key = (id(model), tuple(int(i) for i in ids[:n]))
        if key in self.entries:
            self.entries.move_to_end(key)
            return
        size = self._size(cache)
        if size > self.max_bytes and windows is not None and any(w is not None for w in windows):
            cache = WindowedPrefix(cache, n, windows)
            size = self._size(cache)
        if size > self.max_bytes:
            return
        self.entries[key] = (cache, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (_, dropped) = self.entries.popitem(last=False)
            self.bytes -= dropped

    def longest(self, model, ids: Sequence[int], limit: int, *, windowed: bool = True) -> tuple[Any, int] | None:
        """``(cache, n)``: the entry sharing the longest prefix with ``ids`` (at most ``limit`` positions) and the
        length of that prefix; None when no entry shares a position. ``windowed=False`` passes over every
        :class:`WindowedPrefix` (for a consumer that keeps every key and could read the positions it dropped)."""
        query = np.asarray(ids[:limit], dtype=np.int64)
        best, best_n, best_key = None, 0, None
        for key, (cache, _) in self.entries.items():
            if key[0] != id(model):
                continue
            n = min(len(query), len(key[1]))
            if n <= best_n:
                continue
            differ = np.flatnonzero(query[:n] != np.asarray(key[1][:n], dtype=np.int64))
            shared = int(differ[0]) if len(differ) else n
            if isinstance(cache, WindowedPrefix) and (shared < cache.n or not windowed):
                continue  # its sliding layers dropped keys a shorter shared prefix (or this consumer) would need
            if shared > best_n:
                best, best_n, best_key = cache, shared, key
        if best is None:
            return None
        self.entries.move_to_end(best_key)
        return best, best_n

    def take(self, model, ids: Sequence[int], limit: int, *, longer_than: int = 0,
             windowed: bool = True) -> tuple[Any, int] | None:
        """:meth:`longest` (``windowed`` as there), when it shares more than ``longer_than`` positions (what the
        caller has already), counted in ``hits`` / ``reused_positions``; None otherwise."""
        found = self.longest(model, ids, limit, windowed=windowed) if limit > 0 else None
        if found is None or found[1] <= longer_than:
            return None
        self.hits += 1
        self.reused_positions += found[1]
        return found


_STORES: list[PrefixStore] = []  # the stores of the open shared_prefill blocks, innermost last

# The default byte budget of shared_prefill's store, in MiB (DYNHEADS_PREFIX_STORE_MB overrides it; 0 turns it off).
DEFAULT_STORE_MB = 1024


def store_budget() -> int:
    """The byte budget of a new :class:`PrefixStore`: ``$DYNHEADS_PREFIX_STORE_MB`` MiB, else
    :data:`DEFAULT_STORE_MB`."""
    value = os.environ.get("DYNHEADS_PREFIX_STORE_MB", "") or DEFAULT_STORE_MB
    try:
        megabytes = float(value)
    except ValueError:
        raise ValueError(f"DYNHEADS_PREFIX_STORE_MB must be a number of MiB (0 turns the store off), got {value!r}.")
    if megabytes < 0:
        raise ValueError(f"DYNHEADS_PREFIX_STORE_MB must be >= 0, got {value!r}.")
    return int(megabytes * 2 ** 20)


@contextlib.contextmanager
def shared_prefill(store: PrefixStore | None = None) -> Iterator[PrefixStore]:
    """Decoders built inside this block share prompt prefixes across batches and calls, not only within a batch:
    each keeps its twin-prefilled keys and values in ``store`` (default: a new :class:`PrefixStore` of
    :func:`store_budget` bytes) and copies the longest prefix it shares with an earlier prompt from it. Same tokens
    at the same positions, so the same keys and values up to float rounding, as within a batch. The executors run
    every batch of a call inside one (the RAG strategies of one question, a NIAH split's batches, the grid cells of
    an ablation sample); a Ray actor keeps one store for its life. :func:`prefix_sharing` (False) turns this off
    too. Yields the store."""
    store = PrefixStore(store_budget()) if store is None else store
    _STORES.append(store)
    try:
        yield store
    finally:  # by identity: blocks opened in generators may close out of order
        for index in range(len(_STORES) - 1, -1, -1):
            if _STORES[index] is store:
                del _STORES[index]
                break


@contextlib.contextmanager
def _switched(stack: list[bool], enabled: bool) -> Iterator[None]:
    """Push ``enabled`` on a switch's stack for the block (the innermost block wins)."""
    stack.append(bool(enabled))
    try:
        yield
    finally:
        stack.pop()


@contextlib.contextmanager
def prefix_sharing(enabled: bool) -> Iterator[None]:
    """Decoders built inside this block share (True, the default) or do not share (False) the prefill of the
    prompt prefixes their rows have in common (:meth:`~dynheads_tl.engine.decoder.BatchDecoder._prefill_distinct`).
    Not part of any cache key: both give the same tokens and Eq. 1 sets, floats to rounding."""
    with _switched(_SHARE_PREFIXES, enabled):
        yield


@contextlib.contextmanager
def bounded_windows(enabled: bool) -> Iterator[None]:
    """Decoders built inside this block keep only the keys a sliding-window layer can still attend to (True, the
    default: :func:`~dynheads_tl.engine.kv_cache.window_starts`) or every key on every layer (False: a rewind to
    before the prompt's end stays possible); so does a :class:`PrefixStore` entry too large for its budget
    (:class:`WindowedPrefix`; False: such an entry is not kept). Not part of any cache key: both give the same tokens and Eq. 1 sets,
    floats to rounding, since a dropped key is one every remaining query masks. Only a prompt longer than a layer's
    window drops anything, so only then is a rewind before the prompt's end refused."""
    with _switched(_BOUND_WINDOWS, enabled):
        yield


@contextlib.contextmanager
def shared_prompts(enabled: bool) -> Iterator[None]:
    """Decoders built inside this block keep one copy of a prompt's keys and values for all the rows of their batch
    that decode that prompt (True, the default: the grouped step attends to it once for all of them, see
    :class:`~dynheads_tl.engine.kv_cache.StaticKVCache` ``owners``) or a copy per row (False). Only batches with a
    repeated prompt share anything (the masking conditions of one sample, say). Not part of any cache key: both give
    the same tokens and Eq. 1 sets, floats to rounding."""
    with _switched(_SHARE_PROMPTS, enabled):
        yield


def sharing_prompts() -> bool:
    """Whether a decoder built now shares its rows' prompt keys and values (:func:`shared_prompts`)."""
    return _SHARE_PROMPTS[-1]


def sharing_prefixes() -> bool:
    """Whether a decoder built now prefills shared prompt prefixes once (:func:`prefix_sharing`)."""
    return _SHARE_PREFIXES[-1]


def bounding_windows() -> bool:
    """Whether a decoder built now bounds sliding layers by their window (:func:`bounded_windows`)."""
    return _BOUND_WINDOWS[-1]


def open_store() -> "PrefixStore | None":
    """The store of the innermost open :func:`shared_prefill` block, None outside one."""
    return _STORES[-1] if _STORES else None


@contextlib.contextmanager
def prefix_store() -> Iterator[PrefixStore | None]:
    """The store a prefill outside :class:`BatchDecoder` (one prompt at a time) shares prefixes through: the innermost
    open :func:`shared_prefill` block's, else a new one for this block; None where :func:`prefix_sharing` is off."""
    if not _SHARE_PREFIXES[-1]:
        yield None
    elif _STORES:
        yield _STORES[-1]
    else:
        with shared_prefill() as store:
            yield store


def cache_prefix(cache, n: int | None = None):
    """A new ``DynamicCache`` holding copies of the first ``n`` positions (default: all) of ``cache``'s keys and
    values, so that a forward appending to it leaves ``cache`` as it was. From a :class:`WindowedPrefix` (all of
    its positions only), the positions a sliding layer dropped are zeros: its window masks them from every query at
    or after the entry's end."""
    from transformers import DynamicCache

    copy = DynamicCache()
    if isinstance(cache, WindowedPrefix):
        if n is not None and n != cache.n:
            raise ValueError(f"A windowed store entry serves all of its {cache.n} positions, not {n}.")
        for index, ((keys, values), start) in enumerate(zip(cache.layers, cache.starts)):
            full_keys = keys.new_zeros(*keys.shape[:2], cache.n, keys.shape[-1])
            full_values = values.new_zeros(*values.shape[:2], cache.n, values.shape[-1])
            full_keys[:, :, start:] = keys
            full_values[:, :, start:] = values
            copy.update(full_keys, full_values, index)
        return copy
    for index, layer in enumerate(cache.layers):  # update concatenates onto empty: a copy, not a view
        keys, values = (layer.keys, layer.values) if n is None else (layer.keys[:, :, :n], layer.values[:, :, :n])
        copy.update(keys, values, index)
    return copy
