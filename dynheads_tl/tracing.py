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
:class:`Decoder` owns the KV cache and runs one step at a time with whatever hooks it is given;
:func:`trace_generation` attaches the reduction hooks plus any caller hooks (ablation, attention
restriction) once around the whole generation. Ablation and the RAG study reuse the same Decoder.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from .hooks import HookList, StepState, pattern_hook_name
from .models import fast_twin, model_name
from .tasks.common import Sample

PrefillMode = Literal["fast", "hooked"]


@dataclass
class TraceConfig:
    """Knobs of one traced generation (saved beside every Trace).

    ``sink_tokens`` and ``local_window`` define Eq. 2's denominator: attention on the first
    ``sink_tokens`` positions (attention sinks) and on the last ``local_window`` key positions is
    left out. The paper gives no values; 4 and 32 follow a third-party reproduction.
    """

    max_new_tokens: int = 24
    sink_tokens: int = 4
    local_window: int = 32
    prefill: PrefillMode = "fast"
    stop_at_eos: bool = True

    def __post_init__(self):
        for name in ("max_new_tokens", "sink_tokens", "local_window"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0 or (name == "max_new_tokens" and value < 1):
                raise ValueError(f"{name} must be a non-negative integer (max_new_tokens >= 1), got {value!r}.")
        if self.prefill not in ("fast", "hooked"):
            raise ValueError(f"prefill must be 'fast' or 'hooked', got {self.prefill!r}.")


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
        mask = torch.zeros(len(self.prompt_ids), dtype=torch.bool)
        for start, end in self.evidence_spans:
            mask[start:end] = True
        return mask

    @property
    def retrieval_mask(self) -> Bool[Tensor, "step layer head"]:
        """Eq. 1: the head's top-1 source lies in the evidence (needle) span AND holds the token
        generated at this step."""
        all_ids = torch.cat([self.prompt_ids, self.tokens])
        in_span = torch.cat([self.evidence_mask, torch.zeros(len(self.tokens), dtype=torch.bool)])
        source_ids = all_ids[self.argmax_pos]
        return in_span[self.argmax_pos] & (source_ids == self.tokens[:, None, None])

    # --- persistence ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "tensors": {k: getattr(self, k) for k in ("tokens", "argmax_pos", "support_score", "hidden", "prompt_ids")},
            "info": json.dumps({k: getattr(self, k) for k in ("evidence_spans", "task", "answers", "response", "config", "meta")}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Trace":
        info = json.loads(data["info"])
        info["evidence_spans"] = [tuple(s) for s in info["evidence_spans"]]
        return cls(**data["tensors"], **info)

    def save(self, path: str | Path) -> Path:
        """Atomic: written to a temporary file in the same folder, then renamed."""
        return atomic_torch_save(self.to_dict(), path)

    @classmethod
    def load(cls, path: str | Path) -> "Trace":
        return cls.from_dict(torch.load(path, weights_only=True))


def atomic_torch_save(obj: Any, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    os.close(fd)
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def save_traces(traces: list[Trace], path: str | Path) -> Path:
    return atomic_torch_save([t.to_dict() for t in traces], path)


def load_traces(path: str | Path) -> list[Trace]:
    return [Trace.from_dict(d) for d in torch.load(path, weights_only=True)]


def eos_token_ids(model) -> set[int]:
    ids = set()
    for source in (getattr(model, "tokenizer", None), getattr(getattr(model, "original_model", None), "config", None),
                   getattr(getattr(model, "original_model", None), "generation_config", None)):
        value = getattr(source, "eos_token_id", None)
        if value is None:
            continue
        ids.update(value if isinstance(value, (list, tuple)) else [value])
    return ids


class Decoder:
    """One sequence's KV cache and a greedy step function over the hooked bridge.

    After construction, the cache holds the prompt minus its last token and ``pending`` is the last
    prompt token, so the first :meth:`step` computes decoding step 0's query row.
    ``prefill="fast"`` fills the cache with the SDPA twin; ``"hooked"`` with the bridge itself.
    """

    def __init__(self, model, prompt_ids: list[int] | Tensor, *, prefill: PrefillMode = "fast"):
        from transformers import DynamicCache

        self.model = model
        ids = torch.as_tensor(prompt_ids, dtype=torch.long).reshape(1, -1)
        if ids.shape[1] < 1:
            raise ValueError("The prompt is empty.")
        self.device = next(model.parameters()).device
        ids = ids.to(self.device)
        self.cache = DynamicCache()
        head = ids[:, :-1]
        if head.shape[1] > 0:
            with torch.no_grad():
                if prefill == "fast":
                    out = fast_twin(model)(input_ids=head, past_key_values=self.cache, use_cache=True)
                    self.cache = out.past_key_values
                else:
                    _, self.cache = model(head, return_type="logits_and_cache", past_key_values=self.cache)
        self.pending = int(ids[0, -1])
        self.n_cached = head.shape[1]

    def step(self, token_id: int | None = None) -> Float[Tensor, "vocab"]:
        """Run one token (default: the pending one) and return the next-token logits."""
        token = self.pending if token_id is None else token_id
        with torch.no_grad():
            logits, self.cache = self.model(
                torch.tensor([[token]], device=self.device),
                return_type="logits_and_cache",
                past_key_values=self.cache,
            )
        self.n_cached += 1
        return logits[0, -1]

    def rewind(self, n_cached: int) -> None:
        """Drop cached positions from ``n_cached`` on (to redo a step, e.g. a second pass)."""
        remove = self.n_cached - n_cached
        if remove < 0:
            raise ValueError(f"Cannot rewind forward: {self.n_cached} positions cached, asked for {n_cached}.")
        if remove:
            self.cache.crop(-remove)  # transformers 5: a negative count of positions to drop
        self.n_cached = n_cached

    def last_position(self) -> list[tuple[Tensor, Tensor]]:
        """A copy of every layer's key and value at the newest cached position."""
        return [(layer.keys[..., -1:, :].clone(), layer.values[..., -1:, :].clone()) for layer in self.cache.layers]

    def replace_last_position(self, saved: list[tuple[Tensor, Tensor]]) -> None:
        """Swap the newest cached position's keys and values for ``saved`` (from :meth:`last_position`)."""
        self.rewind(self.n_cached - 1)
        for layer_idx, (keys, values) in enumerate(saved):
            self.cache.update(keys, values, layer_idx)
        self.n_cached += 1


def reduction_hooks(state: StepState, buffers: dict[str, Tensor], masks: dict[str, Tensor], n_layers: int) -> HookList:
    def make(layer: int):
        def hook(pattern: Float[Tensor, "batch head query key"], hook):
            if not state.active:
                return None
            row = pattern[0, :, -1, :].float()  # [head, key]
            buffers["argmax_pos"][state.step, layer] = row.argmax(-1)
            key_len = row.shape[-1]
            eligible = masks["eligible"][:key_len]
            numerator = row @ (masks["evidence"][:key_len] & eligible).float()
            denominator = row @ eligible.float()
            buffers["support_score"][state.step, layer] = torch.where(
                denominator > 0, numerator / denominator.clamp_min(1e-30), torch.zeros_like(numerator))
            return None

        return hook

    def hidden_hook(resid: Float[Tensor, "batch pos d_model"], hook):
        if state.active:
            buffers["hidden"][state.step] = resid[0, -1].float()
        return None

    hooks = [(pattern_hook_name(layer), make(layer)) for layer in range(n_layers)]
    hooks.append(("ln_final.hook_out", hidden_hook))
    return hooks


def eligible_positions(total: int, state_key_len: int, sink: int, window: int, device) -> Tensor:
    """Eq. 2's denominator positions: all but the first ``sink`` and the last ``window`` keys."""
    mask = torch.ones(total, dtype=torch.bool, device=device)
    mask[: min(sink, total)] = False
    if window:
        mask[max(state_key_len - window, 0): state_key_len] = False
    return mask


def trace_generation(
    model,
    sample: Sample,
    config: TraceConfig | None = None,
    *,
    hooks: HookList | None = None,
    state: StepState | None = None,
    record: bool = True,
) -> Trace:
    """Greedy-decode ``sample`` and record, at every step and for every layer and head at once:
    the top-1 source position (-> Eq. 1), the Eq. 2 evidence score, the final-norm hidden state
    (``ln_final.hook_out``) and the generated token.

    ``hooks`` (e.g. from :func:`dynheads_tl.hooks.ablate_heads`) are attached beside the reduction
    hooks; pass the same ``state`` to both so per-step hooks see the current step.
    ``record=False`` runs the same loop without the reduction hooks (the untraced baseline).
    """
    config = config or TraceConfig()
    state = state or StepState()
    prompt_len, max_steps = len(sample.prompt_ids), config.max_new_tokens
    total = prompt_len + max_steps
    device = next(model.parameters()).device
    buffers = new_buffers(model, max_steps)
    masks = {"evidence": evidence_vector(sample, total, device), "eligible": None}
    all_hooks = (reduction_hooks(state, buffers, masks, model.cfg.n_layers) if record else []) + list(hooks or [])
    stop_ids = eos_token_ids(model) if config.stop_at_eos else set()

    tokens: list[int] = []
    state.active = False
    with model.hooks(fwd_hooks=all_hooks):
        decoder = Decoder(model, sample.prompt_ids, prefill=config.prefill)
        state.active = True
        next_input = None
        for step in range(max_steps):
            state.step = step
            state.key_len = prompt_len + step
            masks["eligible"] = eligible_positions(total, state.key_len, config.sink_tokens, config.local_window, device)
            logits = decoder.step(next_input)
            token = int(logits.argmax())
            tokens.append(token)
            next_input = token
            if token in stop_ids:
                break
    return build_trace(model, sample, config, tokens, buffers)


def new_buffers(model, max_steps: int) -> dict[str, Tensor]:
    """Per-step outputs of the reduction hooks, preallocated for ``max_steps`` steps."""
    n_layers, n_heads, d_model = model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_model
    device = next(model.parameters()).device
    return {
        "argmax_pos": torch.zeros(max_steps, n_layers, n_heads, dtype=torch.long, device=device),
        "support_score": torch.zeros(max_steps, n_layers, n_heads, dtype=torch.float32, device=device),
        "hidden": torch.zeros(max_steps, d_model, dtype=torch.float32, device=device),
    }


def evidence_vector(sample: Sample, total: int, device) -> Bool[Tensor, "key"]:
    evidence = torch.zeros(total, dtype=torch.bool, device=device)
    for start, end in sample.evidence_spans:
        evidence[start:end] = True
    return evidence


def build_trace(model, sample: Sample, config: TraceConfig, tokens: list[int], buffers: dict[str, Tensor],
                **extra_config) -> Trace:
    n = len(tokens)
    return Trace(
        tokens=torch.tensor(tokens, dtype=torch.long),
        argmax_pos=buffers["argmax_pos"][:n].cpu(),
        support_score=buffers["support_score"][:n].cpu(),
        hidden=buffers["hidden"][:n].cpu(),
        prompt_ids=torch.as_tensor(sample.prompt_ids, dtype=torch.long),
        evidence_spans=[tuple(s) for s in sample.evidence_spans],
        task=sample.task,
        answers=list(sample.answers),
        response=model.tokenizer.decode(tokens, skip_special_tokens=True),
        config={**asdict(config), "model": model_name(model), **extra_config},
        meta=dict(sample.meta),
    )
