"""Hook factories. Each returns a list of ``(hook_name, fn)`` that any generation loop can attach.

Hooks are values: tracing, ablation and attention restriction all compose by concatenating lists
and attaching them once with ``model.hooks(fwd_hooks=...)`` around a whole generation. Hooks that
depend on the decoding step read it from a shared :class:`StepState` that the loop updates, so the
hooks are attached once rather than once per step.

Shapes use one vocabulary: ``step layer head pos d_model d_head``; ``key`` is the key position.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal

import torch
from jaxtyping import Bool, Float
from torch import Tensor

HookList = list[tuple[str, Callable]]
AblationMode = Literal["zero", "mean"]


@dataclass
class StepState:
    """What the generation loop is doing now; hooks read it, only the loop writes it."""

    step: int = 0  # decoding step index (step 0 = the query row of the last prompt token)
    key_len: int = 0  # number of key positions visible at this step (prompt + generated so far)
    active: bool = True  # hooks that record do nothing while False (e.g. during prefill)
    extra: dict = field(default_factory=dict)


def pattern_hook_name(layer: int) -> str:
    return f"blocks.{layer}.attn.hook_pattern"


def z_hook_name(layer: int) -> str:
    return f"blocks.{layer}.attn.hook_z"


def scores_hook_name(layer: int) -> str:
    return f"blocks.{layer}.attn.hook_attn_scores"


def _as_step_masks(head_mask, state: StepState | None) -> Callable[[], Tensor | None]:
    """Turn a [layer, head] or [step, layer, head] mask (or a function returning the current
    [layer, head] mask, or None for 'nothing now') into 'the mask for the current step'."""
    if callable(head_mask):
        return head_mask
    head_mask = head_mask.bool()
    if head_mask.dim() == 2:
        return lambda: head_mask
    if head_mask.dim() != 3:
        raise ValueError(f"head_mask must be [layer, head] or [step, layer, head], got {tuple(head_mask.shape)}.")
    if state is None:
        raise ValueError("A per-step head_mask [step, layer, head] needs the loop's StepState.")
    return lambda: head_mask[state.step] if state.step < head_mask.shape[0] else None


def ablate_heads(
    head_mask: Bool[Tensor, "layer head"] | Bool[Tensor, "step layer head"] | Callable[[], Tensor | None],
    *,
    state: StepState | None = None,
    n_layers: int | None = None,
    mode: AblationMode = "zero",
    mean_z: Float[Tensor, "layer head d_head"] | None = None,
) -> HookList:
    """Ablate the output (``hook_z``) of the selected heads, at every step or per step.

    ``mode="zero"`` writes zeros (the project's default for the paper's unstated masking type);
    ``mode="mean"`` writes ``mean_z`` (e.g. each head's mean ``z`` over a reference set). A function
    ``head_mask`` is asked for the current step's mask at every forward: [layer, head] for every row
    of the batch, or [batch, layer, head] for one mask per row (None: nothing now). Only the
    newest query position is ablated, so a prefill that runs through the hooks is ablated at its
    last row only, as the per-step protocol requires.
    """
    if mode not in ("zero", "mean"):
        raise ValueError(f"mode must be 'zero' or 'mean', got {mode!r}.")
    if mode == "mean" and mean_z is None:
        raise ValueError("mode='mean' needs mean_z of shape [layer, head, d_head].")
    current = _as_step_masks(head_mask, state)
    if n_layers is None:
        if callable(head_mask):
            raise ValueError("A head_mask given as a function needs n_layers.")
        n_layers = head_mask.shape[-2]

    def make(layer: int):
        def hook(z: Float[Tensor, "batch pos head d_head"], hook):
            mask = current()
            if mask is None:
                return z
            heads = (mask[layer] if mask.dim() == 2 else mask[:, layer]).to(z.device)  # [head] or [batch, head]
            if not bool(heads.any()):
                return z
            if heads.dim() == 1:
                heads = heads.expand(z.shape[0], -1)
            z = z.clone()
            fill = torch.zeros_like(z[:, -1]) if mode == "zero" else mean_z[layer].to(z).expand_as(z[:, -1])
            z[:, -1] = torch.where(heads[:, :, None], fill, z[:, -1])
            return z

        return hook

    return [(z_hook_name(layer), make(layer)) for layer in range(n_layers)]


def restrict_attention(
    allowed: Bool[Tensor, "key"] | Callable[[StepState], Tensor],
    *,
    n_layers: int,
    state: StepState | None = None,
    layers: list[int] | None = None,
) -> HookList:
    """Make disallowed key positions invisible by writing -inf into ``hook_attn_scores``.

    ``allowed`` is a boolean vector over key positions (longer than needed is fine: it is cut to the
    current key length) or a function of the loop's state returning one. Positions past its end are
    allowed (the generated text stays visible). Masked positions then receive exactly zero attention
    after the softmax and each row still sums to one.
    """

    def mask_now() -> Tensor:
        return allowed(state) if callable(allowed) else allowed

    def hook(scores: Float[Tensor, "batch head query key"], hook):
        visible = mask_now().to(scores.device).bool()
        key_len = scores.shape[-1]
        if visible.shape[0] < key_len:
            pad = torch.ones(key_len - visible.shape[0], dtype=torch.bool, device=scores.device)
            visible = torch.cat([visible, pad])
        visible = visible[:key_len]
        if bool(visible.all()):
            return scores
        return scores.masked_fill(~visible, float("-inf"))

    chosen = range(n_layers) if layers is None else layers
    return [(scores_hook_name(layer), hook) for layer in chosen]


def retain_heads(
    retained: Callable[[], Tensor | None],
    streaming: Callable[[], Tensor],
    *,
    n_layers: int,
) -> HookList:
    """Per-head KV retention at the newest query row: heads in ``retained()`` ([batch, layer, head] or
    [layer, head] bool; None: every head, nothing restricted now) attend to every key; every other head sees
    only the keys of ``streaming()`` ([batch, key] or [key] bool, e.g. the attention sinks and the local window),
    with exactly zero attention elsewhere (-inf in ``hook_attn_scores`` before the softmax). Keys past the end of
    ``streaming()`` count as visible. Earlier query rows (a prefill run through the hooks) are left alone."""

    def make(layer: int):
        def hook(scores: Float[Tensor, "batch head query key"], hook):
            keep = retained()
            if keep is None:
                return scores
            heads = (keep[layer] if keep.dim() == 2 else keep[:, layer]).to(scores.device).bool()
            if bool(heads.all()):
                return scores
            heads = heads.expand(scores.shape[0], -1) if heads.dim() == 1 else heads  # [batch, head]
            key_len = scores.shape[-1]
            visible = streaming().to(scores.device).bool()
            visible = visible.expand(scores.shape[0], -1) if visible.dim() == 1 else visible
            if visible.shape[-1] < key_len:
                pad = torch.ones(visible.shape[0], key_len - visible.shape[-1], dtype=torch.bool, device=scores.device)
                visible = torch.cat([visible, pad], dim=-1)
            block = (~heads)[:, :, None] & ~visible[:, None, :key_len]  # [batch, head, key]
            scores = scores.clone()
            scores[:, :, -1, :] = scores[:, :, -1, :].masked_fill(block, float("-inf"))
            return scores

        return hook

    return [(scores_hook_name(layer), make(layer)) for layer in range(n_layers)]
