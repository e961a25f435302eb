"""Greedy generation with per-step reductions of every head's attention row: the ``Trace``.

Why it is fast
--------------
Eq. 1 and Eq. 2 only need the query row of each decoding step, and step 0's row is the last prompt
token. So the prompt minus its last token is prefilled by the SDPA "fast twin" (no attention
patterns are ever materialised), and only one query row per step runs through the hooked bridge,
reusing the twin's KV cache. The hooks reduce each [head, 1, key] pattern row to what the paper
needs (top-1 source position, Eq. 2 score) before the next layer runs. Memory grows linearly in T.

The single loop
---------------
:class:`BatchDecoder` owns the KV cache of one or more left-padded sequences and runs one step at a
time with whatever hooks are attached; :class:`BatchLoop` adds the per-row masks and stopping.
:func:`decode` is the one loop: a :class:`StepPolicy` decides each step (:class:`Greedy` for
:func:`trace_batch` / :func:`trace_generation`; the two-pass ablation and the RAG loop are policies in
``dynheads_tl.protocols``). The reduction hooks, the policy's hooks and any caller hooks (ablation,
attention restriction) are attached once around the whole generation.

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
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, Literal, Sequence

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from dynheads_tl.engine.equations import (Eq2Rule, eligible_positions, eq1_mask, eq2_chance_per_step, eq2_share,
                                         evidence_positions)
from dynheads_tl.engine.grouped import AttentionPath, StaticKVCache, choose_path, default_attention, grouped_forward
from dynheads_tl.engine.hooks import HookList, StepState, pattern_hook_name
from dynheads_tl.engine.models import fast_twin, model_fingerprint, model_name
from dynheads_tl.tasks.common import Sample

PrefillMode = Literal["fast", "hooked"]
# The per-step fields TraceConfig(signals=True) adds to a Trace: per head, then per step.
HEAD_SIGNALS = ("evidence_mass", "context_mass", "generated_mass")
SIGNALS = HEAD_SIGNALS + ("token_logprob", "token_entropy")


@dataclass
class TraceConfig:
    """Knobs of one traced generation (saved beside every Trace).

    ``sink_tokens`` and ``local_window`` define Eq. 2's denominator: attention on the first
    ``sink_tokens`` positions (attention sinks) and on the last ``local_window`` key positions is
    left out. The paper gives no values; 4 and 32 follow a third-party reproduction.

    ``evidence_attention``: also record every head's attention weight on each evidence position at every
    step (:attr:`Trace.evidence_attention`), for soft retrieval measures such as the copy mass
    (:func:`dynheads_tl.analysis.scoring.copy_mass`). Off by default: it costs memory in proportion to the
    evidence length.

    ``signals``: also record, at every step, each head's raw attention mass on the evidence, on the whole
    context (``Sample.context_span``) and on the tokens generated so far, and the log-probability and the
    entropy of the next-token distribution the kept token came from (:attr:`Trace.evidence_mass` and the
    others): the inputs of answer-level error signals such as the Lookback Lens ratio, from the same pass.
    """

    max_new_tokens: int = 24
    sink_tokens: int = 4
    local_window: int = 32
    prefill: PrefillMode = "fast"
    stop_at_eos: bool = True
    evidence_attention: bool = False
    signals: bool = False

    def __post_init__(self):
        for name in ("max_new_tokens", "sink_tokens", "local_window"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0 or (name == "max_new_tokens" and value < 1):
                raise ValueError(f"{name} must be a non-negative integer (max_new_tokens >= 1), got {value!r}.")
        if self.prefill not in ("fast", "hooked"):
            raise ValueError(f"prefill must be 'fast' or 'hooked', got {self.prefill!r}.")
        for name in ("evidence_attention", "signals"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}.")

    def key(self) -> dict[str, Any]:
        """The settings as a cache key. ``evidence_attention`` and ``signals`` appear only when on, so traces
        cached before they existed keep their keys (a trace recorded with them also holds everything without)."""
        values = asdict(self)
        for name in ("evidence_attention", "signals"):
            if not values[name]:
                del values[name]
        return values


@dataclass
class Trace:
    """Everything later stages need from one generation, per decoding step, all layers x heads."""

    tokens: Int[Tensor, "step"]
    argmax_pos: Int[Tensor, "step layer head"]
    support_score: Float[Tensor, "step layer head"]
    hidden: Float[Tensor, "step d_model"]
    prompt_ids: Int[Tensor, "pos"]
    evidence_spans: list[tuple[int, int]]
    task: str
    answers: list[str]
    response: str
    config: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    # With TraceConfig(evidence_attention=True): each head's attention weight on each evidence position
    # (the positions of ``evidence_mask``, in order), at every step; None otherwise.
    evidence_attention: Float[Tensor, "step layer head evidence"] | None = None
    # With TraceConfig(signals=True): each head's attention mass on the evidence, on the context span and on the
    # generated tokens so far (the query's own token included), and the kept token's log-probability and the
    # entropy (nats) of its next-token distribution, at every step; None otherwise.
    evidence_mass: Float[Tensor, "step layer head"] | None = None
    context_mass: Float[Tensor, "step layer head"] | None = None
    generated_mass: Float[Tensor, "step layer head"] | None = None
    token_logprob: Float[Tensor, "step"] | None = None
    token_entropy: Float[Tensor, "step"] | None = None

    @property
    def n_steps(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def n_layers(self) -> int:
        return int(self.argmax_pos.shape[1])

    @property
    def n_heads(self) -> int:
        return int(self.argmax_pos.shape[2])

    @property
    def evidence_mask(self) -> Bool[Tensor, "pos"]:
        return evidence_positions(self.evidence_spans, len(self.prompt_ids))

    @property
    def eq2_chance(self) -> Float[Tensor, "step"]:
        """Each step's chance Eq. 2 share (:func:`~dynheads_tl.engine.equations.eq2_chance_per_step`), with the
        trace's own sink and window."""
        return eq2_chance_per_step(self.evidence_mask, len(self.prompt_ids), self.n_steps,
                                   int(self.config.get("sink_tokens", 4)), int(self.config.get("local_window", 32)))

    def eq2_sets(self, rule: "Eq2Rule | float") -> Bool[Tensor, "step layer head"]:
        """The heads Eq. 2 marks at every step under ``rule`` (a bare number: the fixed threshold); the chance
        shares are computed only for the chance rule."""
        rule = Eq2Rule.of(rule)
        if rule.kind == "fixed":
            return self.support_score > rule.value
        return rule.select(self.support_score, self.eq2_chance)

    @property
    def retrieval_mask(self) -> Bool[Tensor, "step layer head"]:
        """Eq. 1: the head's top-1 source lies in the evidence (needle) span AND holds the token
        generated at this step."""
        all_ids = torch.cat([self.prompt_ids, self.tokens])
        in_span = evidence_positions(self.evidence_spans, len(all_ids))
        return eq1_mask(self.argmax_pos, all_ids, in_span, self.tokens)

    # --- persistence ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "tensors": {k: getattr(self, k) for k in ("tokens", "argmax_pos", "support_score", "hidden", "prompt_ids",
                                                      "evidence_attention", *SIGNALS) if getattr(self, k) is not None},
            "info": json.dumps({k: getattr(self, k) for k in ("evidence_spans", "task", "answers", "response", "config", "meta")}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Trace":
        info = json.loads(data["info"])
        info["evidence_spans"] = [tuple(s) for s in info["evidence_spans"]]
        return cls(**data["tensors"], **info)

    def save(self, path: str | Path) -> Path:
        """Atomic (see :func:`atomic_write`), so an interrupted save never leaves half a trace."""
        return atomic_torch_save(self.to_dict(), path)

    @classmethod
    def load(cls, path: str | Path) -> "Trace":
        """Read a file written by :meth:`save`; a damaged one raises :class:`UnreadableFileError`."""
        return _read_saved(path, lambda data: cls.from_dict(data))


class UnreadableFileError(ValueError):
    """A saved file exists but cannot be read back: truncated, of another format, or written by an
    older version whose layout this one does not know. Its message names the file."""


def atomic_write(path: str | Path, write: Callable[[BinaryIO], None]) -> Path:
    """Write ``path`` all at once or not at all: ``write`` fills a temporary file in the same folder,
    which is flushed to disk and then renamed over ``path``.

    Why: a run killed mid-write (or a full disk) must never leave a half-written file under the final
    name, since every later run would read it as a finished result. The temporary name ends in
    ``.tmp`` and is removed if ``write`` fails. This is the one writer for every cache and result file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())  # the data is on disk before the name points at it
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """:func:`atomic_write` for UTF-8 text (JSON results, sidecars, CSV and Markdown tables)."""
    return atomic_write(path, lambda handle: handle.write(text.encode("utf-8")))


def atomic_torch_save(obj: Any, path: str | Path) -> Path:
    """:func:`atomic_write` for ``torch.save``."""
    return atomic_write(path, lambda handle: torch.save(obj, handle))


def save_traces(traces: list[Trace], path: str | Path) -> Path:
    """Several traces in one file, atomically; :func:`load_traces` reads them back."""
    return atomic_torch_save([t.to_dict() for t in traces], path)


def load_traces(path: str | Path) -> list[Trace]:
    """Read a file written by :func:`save_traces`; a damaged one raises :class:`UnreadableFileError`."""
    def parse(data: Any) -> list[Trace]:
        if not isinstance(data, list):
            raise TypeError(f"expected a list of saved traces, found a {type(data).__name__}")
        return [Trace.from_dict(d) for d in data]

    return _read_saved(path, parse)


def _read_saved(path: str | Path, parse: Callable[[Any], Any]) -> Any:
    """``parse(torch.load(path))``, with any failure to read or parse re-raised as one error naming the file.

    A missing file or a permission problem is not damage and passes through unchanged.
    """
    try:
        return parse(torch.load(path, weights_only=True))
    except (FileNotFoundError, PermissionError, IsADirectoryError):
        raise
    except Exception as error:  # truncation (OSError, EOFError, RuntimeError), pickle errors, old layouts
        raise UnreadableFileError(
            f"Cannot read the saved traces in {str(path)!r}: the file is truncated, not a dynheads_tl trace "
            f"file, or written by an older version ({type(error).__name__}: {error})."
        ) from error


_SHARE_PREFIXES: list[bool] = [True]


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


@contextlib.contextmanager
def prefix_sharing(enabled: bool) -> Iterator[None]:
    """Decoders built inside this block share (True, the default) or do not share (False) the prefill of the
    prompt prefixes their rows have in common (:meth:`BatchDecoder._prefill_distinct`). Not part of any cache
    key: both give the same tokens and Eq. 1 sets, floats to rounding."""
    _SHARE_PREFIXES.append(bool(enabled))
    try:
        yield
    finally:
        _SHARE_PREFIXES.pop()


def eos_token_ids(model) -> set[int]:
    ids = set()
    for source in (getattr(model, "tokenizer", None), getattr(getattr(model, "original_model", None), "config", None),
                   getattr(getattr(model, "original_model", None), "generation_config", None)):
        value = getattr(source, "eos_token_id", None)
        if value is None:
            continue
        ids.update(value if isinstance(value, (list, tuple)) else [value])
    return ids


class BatchDecoder:
    """Several sequences' KV cache (left-padded to one width) and a greedy step over the hooked bridge.

    After construction the cache holds every prompt minus its last token and ``pending`` holds the
    last prompt tokens, so the first :meth:`step` computes decoding step 0's query rows.
    ``prefill="fast"`` fills the cache with the SDPA twin; ``"hooked"`` with the bridge itself.

    Batching: each distinct prompt is prefilled once, alone and unpadded (so its keys and values are
    those of an unbatched run, and the prefill never pays for padding), and the caches are written,
    left-padded, into one preallocated cache (:class:`~dynheads_tl.engine.grouped.StaticKVCache`, sized
    for ``max_new_tokens`` steps; a step writes in place, a rewind moves its length). Padding is masked
    out of attention and every row keeps its own positions, so RoPE sees exactly the positions of an
    unbatched run. Decoding steps of a batch agree with unbatched runs to float rounding (~1e-5 in the
    logits, tested), not bit for bit.

    Shared prefixes (``share_prefixes``, default on, see :func:`prefix_sharing`): a prompt that begins with
    the same tokens as another copies that prefix's keys and values instead of prefilling it again
    (:meth:`_prefill_distinct`); ``prefilled_positions`` / ``prompt_positions`` say how much was run.

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
        # an unbatched run), then write the keys and values, left-padded, into the preallocated cache;
        # padding is never attended.
        until = list(fast_until) if fast_until is not None else [None] * len(rows)
        if len(until) != len(rows):
            raise ValueError(f"fast_until has {len(until)} entries for {len(rows)} prompts.")
        distinct: dict[tuple[tuple[int, ...], int | None], int] = {}
        row_of = [distinct.setdefault((tuple(r.tolist()), u), len(distinct)) for r, u in zip(rows, until)]
        share_prefixes = _SHARE_PREFIXES[-1] if share_prefixes is None else share_prefixes
        prefilled = self._prefill_distinct(model, list(distinct), prefill, share_prefixes)
        # What was actually prefilled, against what prefilling every row alone would cost.
        self.prompt_positions = int((self.prompt_lengths - 1).clamp_min(0).sum())
        self.cache = self._new_cache(model, prefilled, width - 1 + max(int(max_new_tokens), 1) + 1)
        for layer_idx in range(len(self.cache.keys)):
            for b, source in enumerate(row_of):
                if self.prompt_lengths[b] > 1:
                    layer = prefilled[source].layers[layer_idx]
                    start = int(self.offsets[b])
                    self.cache.keys[layer_idx][b, :, start: width - 1] = layer.keys[0]
                    self.cache.values[layer_idx][b, :, start: width - 1] = layer.values[0]
        self.cache.length = width - 1
        self.pending = torch.stack([r[-1] for r in rows]).to(self.device)

    def _new_cache(self, model, prefilled: list, capacity: int) -> StaticKVCache:
        """An empty :class:`StaticKVCache` for this batch, shaped and typed like the prefilled caches."""
        template = next((c.layers[0].keys for c in prefilled if c.get_seq_length() > 0), None)
        if template is not None:
            n_layers = len(next(c for c in prefilled if c.get_seq_length() > 0).layers)
            n_kv, d_head, dtype = template.shape[1], template.shape[-1], template.dtype
        else:  # every prompt is one token: nothing prefilled
            n_layers, d_head = model.cfg.n_layers, model.cfg.d_head
            n_kv = getattr(model.cfg, "n_key_value_heads", None) or model.cfg.n_heads
            dtype = next(model.parameters()).dtype
        return StaticKVCache(n_layers, self.batch, n_kv, d_head, capacity, dtype=dtype, device=self.device)

    @property
    def n_cached(self) -> int:
        """How many positions (padded coordinates) the cache holds."""
        return self.cache.length

    def _prefill_distinct(self, model, prompts: list[tuple[tuple[int, ...], int | None]], prefill: PrefillMode,
                          share_prefixes: bool) -> list:
        """The KV cache of each distinct ``(prompt ids, fast_until)``, each prompt's shared prefix computed once.

        Shared-prefix prefill: the prompts are visited in lexicographic order of their ids, so each one's longest
        common prefix with any earlier prompt is its common prefix with the one just before it; the keys and
        values of that prefix (the same tokens at the same positions, hence the same keys and values up to float
        rounding) are copied from that prompt's cache and only the rest is prefilled. Only positions the SDPA
        twin prefilled are shared (never a tail run through the hooked bridge, nor a ``prefill="hooked"`` run).
        Sets ``prefilled_positions``: the positions actually run through a model."""
        caches: list = [None] * len(prompts)
        splits = [self._split(len(ids) - 1, prefill, until) for ids, until in prompts]
        plan = prefix_plan([ids for ids, _ in prompts], splits) if share_prefixes else [
            (index, None, 0) for index in range(len(prompts))]
        self.prefilled_positions = 0
        for index, source, shared in plan:
            ids, until = prompts[index]
            reuse = (caches[source], shared) if shared > 0 else None
            caches[index] = self._prefill(model, torch.tensor(ids, device=self.device), prefill, until, reuse=reuse)
            self.prefilled_positions += max(len(ids) - 1, 0) - shared
        return caches

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
            for index, layer in enumerate(source.layers):  # update concatenates onto empty: a copy, not a view
                cache.update(layer.keys[:, :, :start], layer.values[:, :, :start], index)
        with torch.no_grad():
            if split > start:
                # Only the cache is kept: logits for the last position alone (every position's would be
                # [T, vocab], 12 GiB at 50k tokens for a 128k vocabulary in bf16).
                cache = fast_twin(model)(input_ids=body[None, start:split], past_key_values=cache, use_cache=True,
                                         logits_to_keep=1).past_key_values
            if split < len(body):
                cache = model(body[None, split:], return_type="logits_and_cache", past_key_values=cache)[1]
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
            for index, (keys, values) in enumerate(zip(self.cache.keys, self.cache.values)):
                past.update(keys[:, :, :start], values[:, :, :start], index)
        logits, past = self.model(tokens, return_type="logits_and_cache", past_key_values=past, **kwargs)
        end = start + tokens.shape[1]
        self.cache.reserve(end)
        for index, layer in enumerate(past.layers):
            self.cache.write(index, layer.keys[:, :, start:end], layer.values[:, :, start:end], start)
        self.cache.length = end
        return logits

    def rewind(self, n_cached: int) -> None:
        """Drop cached positions from ``n_cached`` on (to redo a step, e.g. a second pass): the cache is
        preallocated, so only its length moves; the next step overwrites those positions in place."""
        if n_cached > self.n_cached:
            raise ValueError(f"Cannot rewind forward: {self.n_cached} positions cached, asked for {n_cached}.")
        if n_cached < 0:
            raise ValueError(f"Cannot rewind to {n_cached} positions.")
        self.cache.length = n_cached

    def last_position(self) -> list[tuple[Tensor, Tensor]]:
        """A copy of every layer's keys and values at the newest cached position (all rows)."""
        end = self.n_cached
        return [(keys[:, :, end - 1: end].clone(), values[:, :, end - 1: end].clone())
                for keys, values in zip(self.cache.keys, self.cache.values)]

    def replace_last_position(self, saved: list[tuple[Tensor, Tensor]], rows: Bool[Tensor, "batch"] | None = None) -> None:
        """Write ``saved`` (from :meth:`last_position`) back over the newest cached position, in place, for
        ``rows`` only (default: every row)."""
        select = slice(None) if rows is None else rows.to(self.device)
        end = self.n_cached
        for store_keys, store_values, (keys, values) in zip(self.cache.keys, self.cache.values, saved):
            store_keys[select, :, end - 1: end] = keys[select]
            store_values[select, :, end - 1: end] = values[select]


class Decoder(BatchDecoder):
    """A :class:`BatchDecoder` over one sequence whose :meth:`step` takes and returns single values."""

    def __init__(self, model, prompt_ids: Sequence[int] | Tensor, *, prefill: PrefillMode = "fast"):
        super().__init__(model, [prompt_ids], prefill=prefill)

    def step(self, token_id: int | None = None) -> Float[Tensor, "vocab"]:
        return super().step(None if token_id is None else torch.tensor([token_id]))[0]


def reduction_hooks(state: StepState, buffers: dict[str, Tensor], masks: dict[str, Tensor], n_layers: int) -> HookList:
    """Hooks that reduce each step's attention rows to Eq. 1 / Eq. 2 inputs, for every row of a batch.

    ``buffers`` come from :func:`new_buffers` ([batch, step, ...]). ``masks`` holds ``"evidence"`` and
    ``"eligible"`` ([batch, key], padded coordinates) and ``"offsets"`` (each row's left padding);
    source positions are stored in each row's own, unpadded coordinates.
    """
    def make(layer: int):
        def hook(pattern: Float[Tensor, "batch head query key"], hook):
            if not state.active:
                return None
            rows = pattern[:, :, -1, :].float()  # [batch, head, key]
            buffers["argmax_pos"][:, state.step, layer] = rows.argmax(-1) - masks["offsets"][:, None]
            key_len = rows.shape[-1]
            buffers["support_score"][:, state.step, layer] = eq2_share(
                rows, masks["evidence"][:, :key_len], masks["eligible"][:, :key_len])
            if "evidence_attention" in buffers:  # each evidence position's weight (padding slots get 0)
                index, valid = masks["evidence_index"], masks["evidence_valid"]
                taken = rows.gather(-1, index[:, None, :].expand(-1, rows.shape[1], -1).clamp_max(key_len - 1))
                buffers["evidence_attention"][:, state.step, layer] = (taken * valid[:, None, :]).to(
                    buffers["evidence_attention"].dtype)
            if "context_mass" in buffers:
                buffers["evidence_mass"][:, state.step, layer] = (rows * masks["evidence"][:, None, :key_len]).sum(-1)
                buffers["context_mass"][:, state.step, layer] = (rows * masks["context"][:, None, :key_len]).sum(-1)
                buffers["generated_mass"][:, state.step, layer] = rows[..., masks["first_generated"]:].sum(-1)
            return None

        return hook

    def hidden_hook(resid: Float[Tensor, "batch pos d_model"], hook):
        if state.active:
            buffers["hidden"][:, state.step] = resid[:, -1].float()
        return None

    hooks = [(pattern_hook_name(layer), make(layer)) for layer in range(n_layers)]
    hooks.append(("ln_final.hook_out", hidden_hook))
    return hooks


class BatchLoop:
    """The bookkeeping of one greedy generation over a batch of samples: the decoder, the masks the
    reduction hooks read, each row's tokens so far and which rows have stopped.

    Shared by :func:`trace_batch` and the two-pass ablation loop. Build it inside
    ``model.hooks(...)`` (it prefills with ``state.active`` False, then sets it True). Rows that
    stop early keep being computed with their last token until every row has stopped; nothing of
    theirs is recorded after the stop.
    """

    def __init__(self, model, samples: list[Sample], config: TraceConfig, state: StepState,
                 masks: dict[str, Tensor], *, fast_until: Sequence[int | None] | None = None):
        if not samples:
            raise ValueError("No samples to generate from.")
        self.samples, self.config, self.state = samples, config, state
        state.active = False
        self.decoder = BatchDecoder(model, [s.prompt_ids for s in samples], prefill=config.prefill,
                                    fast_until=fast_until, max_new_tokens=config.max_new_tokens)
        state.active = True
        device, offsets = self.decoder.device, self.decoder.offsets.tolist()
        self.width = self.decoder.n_cached + 1  # the longest prompt
        longest = self.width + config.max_new_tokens  # key positions, padded or in the longest row's own
        # Each row's prompt + generated ids and evidence, in its own coordinates (for Eq. 1) ...
        self.ids = torch.zeros(len(samples), longest, dtype=torch.long, device=device)
        self.evidence = torch.stack([evidence_positions(s.evidence_spans, longest, device) for s in samples])
        # ... and the evidence in padded coordinates (for the reduction hooks).
        padded_evidence = torch.zeros_like(self.evidence)
        for b, sample in enumerate(samples):
            self.ids[b, : len(sample.prompt_ids)] = torch.as_tensor(sample.prompt_ids, device=device)
            padded_evidence[b, offsets[b]:] = self.evidence[b, : longest - offsets[b]]
        masks.update(evidence=padded_evidence, eligible=None, offsets=self.decoder.offsets)
        # The evidence positions of each row (padded coordinates), for recording evidence attention.
        positions = [torch.nonzero(padded_evidence[b]).flatten() for b in range(len(samples))]
        width = max([len(p) for p in positions] + [1])
        masks["evidence_index"] = torch.zeros(len(samples), width, dtype=torch.long, device=device)
        masks["evidence_valid"] = torch.zeros(len(samples), width, dtype=torch.float32, device=device)
        for b, where in enumerate(positions):
            masks["evidence_index"][b, : len(where)] = where
            masks["evidence_valid"][b, : len(where)] = 1.0
        if config.signals:  # the context span and the first generated position, in padded coordinates
            masks["context"] = torch.zeros(len(samples), longest, dtype=torch.float32, device=device)
            for b, sample in enumerate(samples):
                start, end = sample.context_span
                masks["context"][b, offsets[b] + start: offsets[b] + end] = 1.0
            masks["first_generated"] = self.width
        self.masks = masks
        self.stop_ids = eos_token_ids(model) if config.stop_at_eos else set()
        self.tokens: list[list[int]] = [[] for _ in samples]
        self.done = torch.zeros(len(samples), dtype=torch.bool)
        self.next_input: Tensor | None = None
        self.step = 0  # the next decoding step to run

    def prepare(self, step: int) -> None:
        """Point the hooks at decoding step ``step``."""
        self.state.step = step
        self.state.key_len = self.width + step
        self.masks["eligible"] = eligible_positions(self.decoder.offsets, self.masks["evidence"].shape[1],
                                               self.state.key_len, self.config.sink_tokens, self.config.local_window)

    def commit(self, step: int, chosen: Int[Tensor, "batch"]) -> bool:
        """Keep ``chosen`` as step ``step``'s tokens of the running rows; True once every row has stopped."""
        for b in torch.nonzero(~self.done).flatten().tolist():
            token = int(chosen[b])
            self.tokens[b].append(token)
            self.ids[b, int(self.decoder.prompt_lengths[b]) + step] = token
            if token in self.stop_ids:
                self.done[b] = True
        self.next_input = chosen
        self.step = step + 1
        return self.finished

    @property
    def finished(self) -> bool:
        return bool(self.done.all())

    def retract(self, n_tokens: int) -> None:
        """Forget every generated token from index ``n_tokens`` on, so that decoding resumes at step
        ``n_tokens`` (a protocol that takes back text, like the RAG loop's retraction). Batches of one only.

        The decoder is rewound to the query of step ``n_tokens`` and the row runs again; the recorder's
        buffers of the forgotten steps are overwritten as those steps are decoded again."""
        if self.decoder.batch != 1:
            raise ValueError("Retraction is supported for a batch of one sample only.")
        tokens = self.tokens[0]
        if not 0 <= n_tokens <= len(tokens):
            raise ValueError(f"Cannot retract to {n_tokens} tokens: {len(tokens)} were generated.")
        del tokens[n_tokens:]
        prompt_length = int(self.decoder.prompt_lengths[0])
        self.decoder.rewind(prompt_length - 1 + n_tokens)
        last = tokens[-1] if tokens else int(self.samples[0].prompt_ids[-1])
        self.next_input = torch.tensor([last], device=self.decoder.device)
        self.done[0] = False
        self.step = n_tokens

    @property
    def running(self) -> Bool[Tensor, "batch"]:
        return ~self.done


class StepPolicy:
    """What the decoding loop does at each step, between preparing the hooks and keeping the tokens.

    :func:`decode` owns the KV cache, the per-row masks, stopping and the recorder's buffers; a policy
    decides how each step's tokens are chosen (one greedy forward, or a clean pass, a selection and a
    masked pass, ...), may add hooks of its own, may ask for part of the prompt to run through the hooked
    bridge, and may take back generated text after a step. Protocols are policies: :class:`Greedy` here,
    :class:`dynheads_tl.protocols.ablation.TwoPass` for the per-step ablation and
    :class:`dynheads_tl.protocols.rag.RagPolicy` for the dynamic-RAG loop. The defaults do nothing."""

    def hooks(self, state: StepState) -> HookList:
        """Hooks of this policy, attached beside the recorder's for the whole generation (prefill included)."""
        return []

    def buffers(self, recorded: dict[str, Tensor]) -> None:
        """Called once with the dict the recorder writes into (a policy may swap its tensors per pass)."""
        return None

    def fast_until(self, samples: list[Sample]) -> list[int | None] | None:
        """Per sample, how many prompt tokens the SDPA twin prefills (None: all but the last). The rest of
        the prompt runs through the hooked bridge, under this policy's hooks."""
        return None

    def choose(self, loop: "BatchLoop", step: int) -> Int[Tensor, "batch"]:
        """Run this step's forward pass(es) through ``loop.decoder`` and return each row's token."""
        raise NotImplementedError

    def after_step(self, loop: "BatchLoop", step: int) -> None:
        """Called after step ``step``'s tokens are kept; may call :meth:`BatchLoop.retract`."""
        return None


class Greedy(StepPolicy):
    """One forward per step; keep its argmax (plain greedy decoding)."""

    def choose(self, loop: "BatchLoop", step: int) -> Int[Tensor, "batch"]:
        return loop.decoder.step(loop.next_input).argmax(-1)


def decode(
    model,
    samples: list[Sample],
    config: TraceConfig,
    policy: StepPolicy,
    *,
    hooks: HookList | None = None,
    state: StepState | None = None,
    record: bool = True,
) -> tuple["BatchLoop", dict[str, Tensor]]:
    """THE decoding loop: greedy steps over a left-padded batch of ``samples`` under ``policy``.

    Builds the recorder's per-step buffers (:func:`new_buffers`) and its reduction hooks
    (:func:`reduction_hooks`; ``record=False`` leaves them out, for the untraced baseline), attaches them
    with the policy's hooks and ``hooks``, prefills, then at every step points the hooks at the step
    (:meth:`BatchLoop.prepare`), lets the policy choose the tokens, keeps them (:meth:`BatchLoop.commit`)
    and gives the policy its say after the step (:meth:`StepPolicy.after_step`, which may retract), until
    every row has stopped or ``max_new_tokens`` steps are kept. Returns the loop (tokens, masks, decoder)
    and the recorded buffers.
    """
    check_context_length(model, samples, config.max_new_tokens)
    state = state or StepState()
    buffers = new_buffers(model, config.max_new_tokens, batch=len(samples),
                          evidence_width=max_evidence(samples) if config.evidence_attention else 0,
                          signals=config.signals and record)
    policy.buffers(buffers)
    masks: dict[str, Tensor] = {}
    all_hooks = ((reduction_hooks(state, buffers, masks, model.cfg.n_layers) if record else [])
                 + list(policy.hooks(state)) + list(hooks or []))
    with model.hooks(fwd_hooks=all_hooks):
        loop = BatchLoop(model, samples, config, state, masks, fast_until=policy.fast_until(samples))
        while loop.step < config.max_new_tokens:
            step = loop.step
            loop.prepare(step)
            chosen = policy.choose(loop, step)
            if "token_logprob" in buffers:  # the distribution of the decoder's last forward, the kept token's
                record_token_signals(buffers, step, loop.decoder.last_logits, chosen)
            loop.commit(step, chosen)
            policy.after_step(loop, step)
            if loop.finished:
                break
    return loop, buffers


def trace_batch(
    model,
    samples: list[Sample],
    config: TraceConfig | None = None,
    *,
    hooks: HookList | None = None,
    state: StepState | None = None,
    record: bool = True,
) -> list[Trace]:
    """Greedy-decode every sample of ``samples`` in one batch and record, at every step and for every
    layer and head at once: the top-1 source position (-> Eq. 1), the Eq. 2 evidence score, the
    final-norm hidden state (``ln_final.hook_out``) and the generated token. One :class:`Trace` per sample.

    ``hooks`` (e.g. from :func:`dynheads_tl.engine.hooks.ablate_heads`) are attached beside the reduction
    hooks; pass the same ``state`` to both so per-step hooks see the current step.
    ``record=False`` runs the same loop without the reduction hooks (the untraced baseline).
    See :class:`BatchDecoder` for how batched rows compare with unbatched runs.
    """
    config = config or TraceConfig()
    loop, buffers = decode(model, samples, config, Greedy(), hooks=hooks, state=state, record=record)
    return [build_trace(model, sample, config, loop.tokens[b], buffers, row=b) for b, sample in enumerate(samples)]


def check_context_length(model, samples: Sequence[Sample], max_new_tokens: int) -> None:
    """Refuse, before any model work, a sample whose prompt plus ``max_new_tokens`` does not fit in the
    model's context (``model.cfg.n_ctx``).

    Why: past its context a RoPE model still runs, on positions it never saw in training, and returns
    plausible-looking but meaningless attention patterns; nothing downstream would notice.
    """
    limit = getattr(model.cfg, "n_ctx", None)
    if not limit:
        return
    for index, sample in enumerate(samples):
        prompt_tokens = len(sample.prompt_ids)
        if prompt_tokens + max_new_tokens > limit:
            raise ValueError(
                f"Sample {index} ({sample.task}) needs room for {prompt_tokens + max_new_tokens} tokens "
                f"({prompt_tokens} prompt tokens + max_new_tokens={max_new_tokens}), more than the model's "
                f"context of n_ctx={limit} tokens; use shorter prompts or fewer new tokens."
            )


def trace_generation(
    model,
    sample: Sample,
    config: TraceConfig | None = None,
    *,
    hooks: HookList | None = None,
    state: StepState | None = None,
    record: bool = True,
) -> Trace:
    """:func:`trace_batch` for one sample (no padding: exactly the unbatched computation)."""
    return trace_batch(model, [sample], config, hooks=hooks, state=state, record=record)[0]


def max_evidence(samples: Sequence[Sample]) -> int:
    """The largest number of evidence positions of any sample (the evidence-attention buffer's width)."""
    return max(int(evidence_positions(s.evidence_spans, len(s.prompt_ids)).sum()) for s in samples)


def record_token_signals(buffers: dict[str, Tensor], step: int, logits: Float[Tensor, "batch vocab"],
                         chosen: Int[Tensor, "batch"]) -> None:
    """Step ``step``'s kept-token log-probability and next-token entropy (nats) from ``logits``."""
    log_p = torch.log_softmax(logits.float(), dim=-1)
    buffers["token_logprob"][:, step] = log_p.gather(-1, chosen.reshape(-1, 1).to(log_p.device))[:, 0]
    buffers["token_entropy"][:, step] = -(log_p.exp() * log_p).sum(-1)


def new_buffers(model, max_steps: int, batch: int = 1, evidence_width: int = 0,
                signals: bool = False) -> dict[str, Tensor]:
    """Per-row, per-step outputs of the reduction hooks, preallocated for ``max_steps`` steps; with
    ``evidence_width`` > 0 also the attention on up to that many evidence positions (float16); with ``signals``
    the fields of :data:`SIGNALS`."""
    n_layers, n_heads, d_model = model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_model
    device = next(model.parameters()).device
    buffers = {
        "argmax_pos": torch.zeros(batch, max_steps, n_layers, n_heads, dtype=torch.long, device=device),
        "support_score": torch.zeros(batch, max_steps, n_layers, n_heads, dtype=torch.float32, device=device),
        "hidden": torch.zeros(batch, max_steps, d_model, dtype=torch.float32, device=device),
    }
    if evidence_width > 0:
        buffers["evidence_attention"] = torch.zeros(batch, max_steps, n_layers, n_heads, evidence_width,
                                                    dtype=torch.float16, device=device)
    if signals:
        for name in HEAD_SIGNALS:
            buffers[name] = torch.zeros(batch, max_steps, n_layers, n_heads, dtype=torch.float32, device=device)
        for name in SIGNALS[len(HEAD_SIGNALS):]:
            buffers[name] = torch.zeros(batch, max_steps, dtype=torch.float32, device=device)
    return buffers


def build_trace(model, sample: Sample, config: TraceConfig, tokens: list[int], buffers: dict[str, Tensor],
                row: int = 0, **extra_config) -> Trace:
    n = len(tokens)
    # Copies, not views: a view of the batch's buffer would carry (and save) the whole batch's storage.
    own = lambda tensor: tensor.detach().to("cpu", copy=True).contiguous()
    evidence_attention = None
    if "evidence_attention" in buffers:
        n_evidence = int(evidence_positions(sample.evidence_spans, len(sample.prompt_ids)).sum())
        evidence_attention = own(buffers["evidence_attention"][row, :n, ..., :n_evidence])
    return Trace(
        tokens=torch.tensor(tokens, dtype=torch.long),
        argmax_pos=own(buffers["argmax_pos"][row, :n]),
        support_score=own(buffers["support_score"][row, :n]),
        hidden=own(buffers["hidden"][row, :n]),
        prompt_ids=torch.as_tensor(sample.prompt_ids, dtype=torch.long),
        evidence_spans=[tuple(s) for s in sample.evidence_spans],
        task=sample.task,
        answers=list(sample.answers),
        response=model.tokenizer.decode(tokens, skip_special_tokens=True),
        config={**asdict(config), "model": model_name(model), "model_fingerprint": model_fingerprint(model),
                **extra_config},
        # With signals, the context span the context mass was taken over (its length normalises it).
        meta={**sample.meta, **({"context_span": list(sample.context_span)} if "context_mass" in buffers else {})},
        evidence_attention=evidence_attention,
        **{name: own(buffers[name][row, :n]) for name in SIGNALS if name in buffers},
    )
