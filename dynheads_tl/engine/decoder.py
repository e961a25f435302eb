"""The KV cache of a left-padded batch and one greedy step over the hooked bridge: :class:`BatchDecoder`.

Decoding at the hardware's pace
-------------------------------
A step reads each KV head's keys and values directly (no copies to every query head) from a cache
preallocated for the whole generation and written in place, and prompts that share a prefix prefill it
once (``dynheads_tl.engine.grouped``, :class:`BatchDecoder`). The bridge's eager forward stays available
as the reference (``attention_path("eager")``) and is what runs whenever a hook or an architecture needs it.

Batching
--------
Decoding one query row is bound by reading the weights, so several rows cost little more than one
(``bench/bench_ablation.py``). Rows are left-padded, padding is masked out of attention and each
row keeps its own RoPE positions; source positions are reported in each row's own coordinates.

The loop that runs the decoder step by step under a policy is :func:`dynheads_tl.engine.tracing.decode`.
"""
from __future__ import annotations

import contextlib
from typing import Any, Sequence

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from dynheads_tl.engine.grouped import (AttentionPath, choose_path, default_attention, grouped_forward,
                                        grouped_unsupported, kept_windows, layer_attention, scores_hooked)
from dynheads_tl.engine.kv_cache import StaticKVCache, check_dropped_keys, window_starts
from dynheads_tl.engine.models import fast_twin
from dynheads_tl.engine.sharing import (DEFAULT_STORE_MB, PrefixStore, bounded_windows, bounding_windows,  # noqa: F401
                                        cache_prefix, open_store, prefix_plan, prefix_sharing, prefix_store,
                                        shared_prefill, shared_prompts, sharing_prefixes, sharing_prompts,
                                        store_budget)
from dynheads_tl.engine.trace_data import PrefillMode

# The SDPA twin prefills a prompt this many positions at a time. With an explicit attention mask (a sliding window,
# a continued prefix) the prefill's attention holds [queries, keys]-sized masks per layer (PyTorch 2.13's CPU SDPA
# keeps no score matrix: bench/probe_sdpa_memory.py; the scores would be 1 GiB for an 8k Gemma 3 prompt). In
# chunks they are at most [PREFILL_CHUNK, keys], so prefill memory grows linearly with the context (Gemma 3 at 8k:
# peak 1,699 -> 1,373 MiB, docs/benchmarks.md). Prompts no longer than it (every default preset's) run in one call.
PREFILL_CHUNK = 4096


def prefill_context(model, ids: Sequence[int], store: PrefixStore | None = None):
    """A ``DynamicCache`` of every position of ``ids``, prefilled by the SDPA twin, for a caller that runs further
    tokens through the hooked bridge itself (the query-focused scores). With ``store`` (:func:`prefix_store`), the
    longest prefix an earlier prompt in it shares is copied instead of prefilled (counted in ``hits`` /
    ``reused_positions``), and ``ids`` joins the store: the returned cache is then the store's entry (unless the
    store keeps it windowed, :class:`~dynheads_tl.engine.sharing.WindowedPrefix`), so a caller that runs further
    tokens against it passes a copy (a forward appends to the cache it is given)."""
    ids = [int(i) for i in ids]
    if not ids:
        raise ValueError("The context to prefill is empty.")
    windows = store_windows(model) if store is not None else None
    found = store.take(model, ids, len(ids), windowed=windows is not None) if store is not None else None
    # _prefill caches a prompt minus its last token: one more (never run) makes it cache all of ids
    padded = torch.tensor(ids + ids[-1:], device=next(model.parameters()).device)
    cache = BatchDecoder._prefill(model, padded, "fast", reuse=found)
    if store is not None:
        store.add(model, ids, cache, len(ids), windows=windows)
    return cache


def store_windows(model) -> list[int | None] | None:
    """The sliding windows a :class:`PrefixStore` may bound an entry of ``model`` by, and whether a consumer may take
    such an entry: the windows a decoder built now bounds its own cache by
    (:func:`~dynheads_tl.engine.grouped.kept_windows` inside :func:`bounded_windows`, the default), so that the
    positions an entry dropped are ones the consumer drops too and its refusals (a rewind before the prompt's end, a
    hook reaching a dropped key) guard them; None where the decoder keeps every key."""
    return kept_windows(model) if bounding_windows() else None


class BatchDecoder:
    """Several sequences' KV cache (left-padded to one width) and a greedy step over the hooked bridge.

    After construction the cache holds every prompt minus its last token and ``pending`` holds the
    last prompt tokens, so the first :meth:`step` computes decoding step 0's query rows.
    ``prefill="fast"`` fills the cache with the SDPA twin; ``"hooked"`` with the bridge itself.

    Batching: each distinct prompt is prefilled once, alone and unpadded (so its keys and values are
    those of an unbatched run, and the prefill never pays for padding), and each prompt's cache is written,
    left-padded, into one preallocated cache (:class:`~dynheads_tl.engine.kv_cache.StaticKVCache`, sized
    for ``max_new_tokens`` steps; a step writes in place, a rewind moves its length) as soon as it is prefilled,
    then dropped unless a later prompt copies a prefix from it (a batch of ten 32k-token prompts never holds ten
    prefill caches beside its own; an open prefix store keeps up to its budget of them). Padding is masked
    out of attention and every row keeps its own positions, so RoPE sees exactly the positions of an
    unbatched run. Decoding steps of a batch agree with unbatched runs to float rounding (~1e-5 in the
    logits, tested), not bit for bit.

    Shared prefixes (``share_prefixes``, default on, see :func:`prefix_sharing`): a prompt that begins with
    the same tokens as another copies that prefix's keys and values instead of prefilling it again
    (:meth:`_prefill_distinct`); inside :func:`shared_prefill` also a prefix of a prompt an earlier decoder
    prefilled. ``prefilled_positions`` / ``prompt_positions`` say how much was run.

    Attention (``attention``, default :func:`~dynheads_tl.engine.grouped.default_attention`): "grouped"
    steps each query group against its KV head's keys and values directly
    (:func:`~dynheads_tl.engine.grouped.grouped_forward`); "eager" runs the bridge's own forward (the
    reference). A grouped decoder falls back to the eager forward, step by step, when the model or a hook
    attached at that step needs it; ``last_path`` says which ran.
    """

    def __init__(self, model, prompts: Sequence[Sequence[int] | Tensor], *, prefill: PrefillMode = "fast",
                 fast_until: Sequence[int | None] | None = None, attention: AttentionPath | None = None,
                 max_new_tokens: int = 64, share_prefixes: bool | None = None):
        if prefill not in ("fast", "hooked"):
            raise ValueError(f"prefill must be 'fast' or 'hooked', got {prefill!r}.")
        attention = attention or default_attention()
        if attention not in ("grouped", "eager"):
            raise ValueError(f"attention must be 'grouped' or 'eager', got {attention!r}.")
        rows = [torch.as_tensor(p, dtype=torch.long).flatten() for p in prompts]
        if not rows:
            raise ValueError("No prompts to decode.")
        if any(len(r) == 0 for r in rows):
            raise ValueError("The prompt is empty.")
        self.model = model
        self.attention = attention
        self.last_path: AttentionPath | None = None  # the path the latest step ran
        self.device = next(model.parameters()).device
        self.batch = len(rows)
        width = max(len(r) for r in rows)
        self.prompt_lengths = torch.tensor([len(r) for r in rows])
        self.offsets = (width - self.prompt_lengths).to(self.device)  # left padding per row
        self.padded = bool(self.offsets.any())
        # Prefill each distinct prompt once, alone and unpadded (so the cache rows are exactly those of
        # an unbatched run), and write its keys and values, left-padded, into the preallocated cache;
        # padding is never attended.
        until = list(fast_until) if fast_until is not None else [None] * len(rows)
        if len(until) != len(rows):
            raise ValueError(f"fast_until has {len(until)} entries for {len(rows)} prompts.")
        distinct: dict[tuple[tuple[int, ...], int | None], int] = {}
        row_of = [distinct.setdefault((tuple(r.tolist()), u), len(distinct)) for r, u in zip(rows, until)]
        share_prefixes = sharing_prefixes() if share_prefixes is None else share_prefixes
        # Rows that decode the same prompt keep one copy of its keys and values (the grouped step reads it once).
        self._owners = row_of if (sharing_prompts() and width > 1 and len(distinct) < len(rows)
                                  and attention == "grouped" and grouped_unsupported(model) is None) else None
        self._width = width
        # the rows each distinct prompt's prefilled keys and values are written into (a one-token row has none)
        self._rows_of: dict[int, list[int]] = {}
        for b, source in enumerate(row_of):
            if len(rows[b]) > 1:
                self._rows_of.setdefault(source, []).append(b)
        self._capacity = width - 1 + max(int(max_new_tokens), 1) + 1
        self.cache: StaticKVCache | None = None
        # Each distinct prompt's keys and values go into the batch's cache as soon as they are prefilled, and its
        # prefill cache is dropped once no later prompt copies a prefix from it (_place): a batch of long prompts
        # never holds every prompt's prefill cache beside its own cache.
        self._prefill_distinct(model, list(distinct), prefill, share_prefixes)
        if self.cache is None:  # every prompt is one token: nothing prefilled
            self.cache = self._new_cache(model)
        # What was actually prefilled, against what prefilling every row alone would cost.
        self.prompt_positions = int((self.prompt_lengths - 1).clamp_min(0).sum())
        self.cache.length = width - 1
        self.pending = torch.stack([r[-1] for r in rows]).to(self.device)

    def _new_cache(self, model, prefilled=None) -> StaticKVCache:
        """An empty :class:`StaticKVCache` for this batch, its ``width - 1`` prompt positions and its new tokens,
        shaped and typed like the ``prefilled`` cache (a prompt's prefill cache; None when every prompt is one
        token: the model's shape). Inside :func:`bounded_windows` (the default), when the grouped step reproduces
        the model (its windows are then the ones it masks with), each sliding layer's buffer begins at the first key
        its earliest query, at position ``width - 1``, can see. When rows share prompts (``_owners``, each row's
        distinct prompt), a prompt's positions are held once per distinct prompt."""
        n_cached = self._width - 1
        if prefilled is not None:
            template = prefilled.layers[0].keys
            n_layers, n_kv, d_head, dtype = len(prefilled.layers), template.shape[1], template.shape[-1], template.dtype
        else:
            n_layers, d_head = model.cfg.n_layers, model.cfg.d_head
            n_kv = getattr(model.cfg, "n_key_value_heads", None) or model.cfg.n_heads
            dtype = next(model.parameters()).dtype
        windows = kept_windows(model) if bounding_windows() else None
        starts = window_starts(windows, n_cached) if windows is not None else None
        return StaticKVCache(n_layers, self.batch, n_kv, d_head, self._capacity, dtype=dtype, device=self.device,
                             starts=starts, windows=windows, owners=self._owners, prompt=n_cached)

    @property
    def n_cached(self) -> int:
        """How many positions (padded coordinates) the cache holds."""
        return self.cache.length

    def _prefill_distinct(self, model, prompts: list[tuple[tuple[int, ...], int | None]], prefill: PrefillMode,
                          share_prefixes: bool) -> None:
        """Prefill each distinct ``(prompt ids, fast_until)``, each prompt's shared prefix computed once, and write
        its keys and values into the batch's cache (:meth:`_place`) as soon as they exist; a prompt's prefill cache
        lives only until the last prompt that copies a prefix from it is prefilled.

        Shared-prefix prefill: the prompts are visited in lexicographic order of their ids, so each one's longest
        common prefix with any earlier prompt is its common prefix with the one just before it; the keys and
        values of that prefix (the same tokens at the same positions, hence the same keys and values up to float
        rounding) are copied from that prompt's cache and only the rest is prefilled. Only positions the SDPA
        twin prefilled are shared (never a tail run through the hooked bridge, nor a ``prefill="hooked"`` run).
        Inside :func:`shared_prefill` a prompt may instead copy a longer prefix from the block's
        :class:`PrefixStore` (a prompt of an earlier batch), and every prompt's twin-prefilled part joins the store.
        Sets ``prefilled_positions`` (the positions actually run through a model) and ``stored_positions`` (those
        copied from the store)."""
        caches: list = [None] * len(prompts)
        splits = [self._split(len(ids) - 1, prefill, until) for ids, until in prompts]
        plan = prefix_plan([ids for ids, _ in prompts], splits) if share_prefixes else [
            (index, None, 0) for index in range(len(prompts))]
        store = open_store() if share_prefixes else None
        windows = store_windows(model) if store is not None else None
        self.prefilled_positions = self.stored_positions = 0
        last_source = {source: step for step, (_, source, _) in enumerate(plan) if source is not None}
        for step, (index, source, shared) in enumerate(plan):
            ids, until = prompts[index]
            reuse = (caches[source], shared) if shared > 0 else None
            # an earlier batch's prompt may share more than this batch's
            found = (store.take(model, ids, splits[index], longer_than=shared, windowed=windows is not None)
                     if store is not None else None)
            if found is not None:
                reuse, shared = found, found[1]
                self.stored_positions += shared
            caches[index] = self._prefill(model, torch.tensor(ids, device=self.device), prefill, until, reuse=reuse)
            self.prefilled_positions += max(len(ids) - 1, 0) - shared
            if store is not None:
                store.add(model, ids, caches[index], splits[index], windows=windows)
            self._place(model, index, ids, caches[index])
            # A prefill cache no later prompt copies from is dropped (the batch's cache, and the store, keep it).
            for done in (index, source):
                if done is not None and last_source.get(done, -1) <= step:
                    caches[done] = None

    def _place(self, model, source: int, ids: tuple[int, ...], prefilled) -> None:
        """Write distinct prompt ``source``'s prefilled keys and values (``ids`` minus its last token) into the batch's
        cache, left-padded, for every row that decodes it (once, for its owner, when rows share prompts); the batch's
        cache is made when the first prompt with prefilled positions arrives."""
        if prefilled.get_seq_length() == 0:
            return
        if self.cache is None:
            self.cache = self._new_cache(model, prefilled)
        for layer_idx, layer in enumerate(prefilled.layers):
            if self.cache.shared:
                self.cache.write_prompt(layer_idx, source, layer.keys[0], layer.values[0], self._width - len(ids))
                continue
            for b in self._rows_of.get(source, ()):
                self.cache.write(layer_idx, layer.keys[0], layer.values[0], int(self.offsets[b]), rows=b)

    @staticmethod
    def _split(n_body: int, prefill: PrefillMode, fast_until: int | None) -> int:
        """How many of a prompt's ``n_body`` cached positions the SDPA twin prefills."""
        if n_body < 1:
            return 0
        if prefill == "fast" and fast_until is not None:
            if not 0 <= fast_until <= n_body:
                raise ValueError(f"fast_until={fast_until} lies outside the prompt's {n_body} prefilled positions.")
            return fast_until
        return n_body if prefill == "fast" else 0

    @staticmethod
    def _prefill(model, ids: Int[Tensor, "pos"], prefill: PrefillMode, fast_until: int | None = None,
                 reuse: tuple[Any, int] | None = None):
        """The KV cache of ``ids`` minus its last token, for one unpadded sequence.

        ``fast_until`` (with ``prefill="fast"``): the twin prefills only ``ids[:fast_until]`` and the rest
        of the prompt runs through the hooked bridge, so the hooks attached around the loop (an attention
        restriction, say) act on those positions too. Recording hooks see ``state.active`` False there.
        ``reuse=(cache, n)``: the first ``n`` positions are copied from ``cache`` (another prompt's, which holds
        the same first ``n`` tokens, all prefilled by the twin) and the twin prefills from position ``n`` on."""
        from transformers import DynamicCache

        cache = DynamicCache()
        if len(ids) < 2:
            return cache
        body = ids[:-1]
        split = BatchDecoder._split(len(body), prefill, fast_until)
        start = 0
        if reuse is not None:
            source, start = reuse
            if not 0 < start <= split:
                raise ValueError(f"Cannot reuse {start} positions of a prompt whose twin prefill covers {split}.")
            cache = cache_prefix(source, start)
        with torch.no_grad():
            # Only the cache is kept: logits for the last position alone (every position's would be [T, vocab],
            # 12 GiB at 50k tokens for a 128k vocabulary in bf16); a long prompt in chunks of PREFILL_CHUNK.
            for begin in range(start, split, PREFILL_CHUNK):
                end = min(begin + PREFILL_CHUNK, split)
                cache = fast_twin(model)(input_ids=body[None, begin:end], past_key_values=cache, use_cache=True,
                                         logits_to_keep=1).past_key_values
            if split < len(body):  # the hooked tail: only its cache is kept, so the output layer runs on one position
                cache = model(body[None, split:], return_type="logits_and_cache", past_key_values=cache,
                              logits_to_keep=1)[1]
        return cache

    def _position_kwargs(self, start: int, end: int) -> dict[str, Tensor]:
        """Attention mask over cached + new positions and each row's own positions for [start, end)."""
        if not self.padded:
            return {}
        positions = torch.arange(end, device=self.device)[None, :] - self.offsets[:, None]
        return {"attention_mask": (positions >= 0).long(), "position_ids": positions[:, start:end].clamp_min(0)}

    def step(self, tokens: Int[Tensor, "batch"] | None = None) -> Float[Tensor, "batch vocab"]:
        """Run one token per row (default: the pending ones) and return each row's next-token logits.

        With ``attention="grouped"`` the step runs :func:`~dynheads_tl.engine.grouped.grouped_forward`
        unless the model or a hook attached now needs the bridge's eager forward
        (:func:`~dynheads_tl.engine.grouped.choose_path`); both write into the same preallocated cache."""
        tokens = self.pending if tokens is None else torch.as_tensor(tokens, dtype=torch.long).to(self.device)
        tokens = tokens.reshape(self.batch, 1)
        start = self.n_cached
        kwargs = self._position_kwargs(start, start + 1)
        self.last_path = choose_path(self.model, self.attention)
        with torch.no_grad():
            if self.last_path == "grouped":
                positions = kwargs.get("position_ids")
                if positions is None:
                    positions = torch.full((self.batch, 1), start, dtype=torch.long, device=self.device)
                logits = grouped_forward(self.model, tokens, positions, self.cache, kwargs.get("attention_mask"))
            else:
                logits = self._eager_forward(tokens, kwargs)
        self.last_logits = logits[:, -1]
        return self.last_logits

    def _eager_forward(self, tokens: Int[Tensor, "batch query"], kwargs: dict[str, Tensor]) -> Tensor:
        """The bridge's own forward (the reference): the cached positions are handed to it as a
        ``DynamicCache`` and the positions it adds are written back into the preallocated cache."""
        from transformers import DynamicCache

        start = self.n_cached
        past = DynamicCache()
        if start > 0:
            for index in range(len(self.cache.keys)):
                past.update(*self.cache.padded(index, start), index)
        # A sliding layer's dropped keys reach the bridge as zeros, hidden by its window mask; a hook that lifts the
        # mask there is refused, as on the grouped path (the check runs after every other hook on the pattern).
        checks = [(f"blocks.{index}.attn.hook_pattern",
                   lambda pattern, hook, first=first, index=index: check_dropped_keys(pattern, first, index))
                  for index, first in enumerate(self.cache.starts)
                  if first and scores_hooked(layer_attention(self.model, index))]
        with self.model.hooks(fwd_hooks=checks) if checks else contextlib.nullcontext():
            logits, past = self.model(tokens, return_type="logits_and_cache", past_key_values=past, **kwargs)
        end = start + tokens.shape[1]
        self.cache.reserve(end)
        for index, layer in enumerate(past.layers):
            self.cache.write(index, layer.keys[:, :, start:end], layer.values[:, :, start:end], start)
        self.cache.length = end
        return logits

    def rewind(self, n_cached: int) -> None:
        """Drop cached positions from ``n_cached`` on (to redo a step, e.g. a second pass): the cache is
        preallocated, so only its length moves; the next step overwrites those positions in place. Refused before
        the prompt's end when a sliding layer dropped the keys that would need (:meth:`StaticKVCache.check_reach`)."""
        if n_cached > self.n_cached:
            raise ValueError(f"Cannot rewind forward: {self.n_cached} positions cached, asked for {n_cached}.")
        if n_cached < 0:
            raise ValueError(f"Cannot rewind to {n_cached} positions.")
        self.cache.check_reach(n_cached)
        if n_cached < self.cache.prompt:  # the next step writes prompt positions row by row
            self.cache.unshare()
        self.cache.length = n_cached

    def last_position(self) -> list[tuple[Tensor, Tensor]]:
        """A copy of every layer's keys and values at the newest cached position (all rows)."""
        if self.n_cached <= self.cache.prompt:  # the newest position is the shared prompt's
            self.cache.unshare()
        return [(keys[:, :, -1:].clone(), values[:, :, -1:].clone())
                for keys, values in (self.cache.tail(index) for index in range(len(self.cache.keys)))]

    def replace_last_position(self, saved: list[tuple[Tensor, Tensor]], rows: Bool[Tensor, "batch"] | None = None) -> None:
        """Write ``saved`` (from :meth:`last_position`) back over the newest cached position, in place, for
        ``rows`` only (default: every row)."""
        select = slice(None) if rows is None else rows.to(self.device)
        if self.n_cached <= self.cache.prompt:
            self.cache.unshare()
        for index, (keys, values) in enumerate(saved):
            store_keys, store_values = self.cache.tail(index)
            store_keys[select, :, -1:] = keys[select]
            store_values[select, :, -1:] = values[select]


class Decoder(BatchDecoder):
    """A :class:`BatchDecoder` over one sequence whose :meth:`step` takes and returns single values."""

    def __init__(self, model, prompt_ids: Sequence[int] | Tensor, *, prefill: PrefillMode = "fast"):
        super().__init__(model, [prompt_ids], prefill=prefill)

    def step(self, token_id: int | None = None) -> Float[Tensor, "vocab"]:
        return super().step(None if token_id is None else torch.tensor([token_id]))[0]
