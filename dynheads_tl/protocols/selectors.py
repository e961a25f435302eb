"""Selectors of the two-pass protocol: at each step, from what the clean pass saw (a
:class:`~dynheads_tl.protocols.stepwise.StepView`), the heads to mask (None: nothing).

Each builder here is one rule; :mod:`dynheads_tl.protocols.conditions` names the rules the experiments run and
builds them from the calibration setup. Random rules draw from generators seeded by the sample (and the step,
for the per-step draws), so a run is reproducible and every condition of a sample sees the same draws.
"""
from __future__ import annotations

from typing import Callable

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from dynheads_tl.protocols.stepwise import Selector, StepView
from dynheads_tl.tasks.common import mix_seed


def select_dynamic(view: StepView) -> Tensor:
    return view.retrieval


def select_fixed(mask: Bool[Tensor, "layer head"]) -> Selector:
    return lambda view: mask


def current_size(view: StepView) -> int:
    """|D_t|: the size the matched controls of D_t take at each step."""
    return int(view.retrieval.sum())


def previous_size(view: StepView) -> int:
    """|D_{t-1}|: the size the matched controls of ``previous_step`` take at each step (0 at step 0)."""
    return 0 if view.previous_retrieval is None else int(view.previous_retrieval.sum())


def select_previous_step(view: StepView):
    """D_{t-1}, the previous step's set from its clean pass: a set known before step t, so it is not chosen on step
    t's outcome (the fair comparison of claim 2); nothing at step 0 (no previous set) or when D_{t-1} is empty."""
    previous = view.previous_retrieval
    if previous is None or not bool(previous.any()):
        return None
    return previous.to(view.retrieval.device)


def top_scored(scores: Float[Tensor, "layer head"], n: int) -> Bool[Tensor, "layer head"]:
    """The ``n`` heads with the highest ``scores`` (ties broken by the flat head index, lower first)."""
    order = torch.argsort(scores.float().flatten(), descending=True, stable=True)[:n]
    mask = torch.zeros(scores.numel(), dtype=torch.bool, device=scores.device)
    mask[order] = True
    return mask.reshape(scores.shape)


def select_predicted(probe: Callable[[Tensor], Tensor], size: Callable[[StepView], int] = previous_size) -> Selector:
    """The probe's set, known before step t: the top-``size(view)`` heads (|D_{t-1}| by default, so it is
    size-matched with ``previous_step``, ``static_previous`` and ``random_previous``) of ``probe`` read on the
    previous step's clean-pass hidden state (``view.previous_clean_hidden``: the final-norm state at the last
    position of step t-1's forward, whose logits chose token t-1, the input claim 3's probe at lag k = 1 reads).
    ``probe`` maps that state [d_model] to one score per head (reshaped to [layer, head]). Nothing at step 0 (no
    previous step), when the size is 0, or when the policy gave no clean hidden state."""

    def select(view: StepView):
        hidden, n = view.previous_clean_hidden, size(view)
        if hidden is None or n == 0:
            return None
        scores = torch.as_tensor(probe(hidden.float().cpu()), dtype=torch.float32).reshape(view.retrieval.shape)
        return top_scored(scores, n).to(view.retrieval.device)

    return select


def select_static_matched(static_order: Int[Tensor, "rank"], size: Callable[[StepView], int] = current_size) -> Selector:
    """Size-matched static baseline: at each step, the top-``size(view)`` heads of the static ranking
    (``static_order``: flat head indices, best first; ``size``: |D_t| by default, :func:`previous_size` for the
    control of ``previous_step``); nothing when the size is 0."""

    def select(view: StepView):
        n = size(view)
        if n == 0:
            return None
        mask = torch.zeros(view.retrieval.numel(), dtype=torch.bool, device=view.retrieval.device)
        mask[static_order[:n].to(mask.device)] = True
        return mask.reshape(view.retrieval.shape)

    return select


def select_random_matched(seed: int, size: Callable[[StepView], int] = current_size) -> Selector:
    """Size-matched random control: at each step, ``size(view)`` heads (|D_t| by default; :func:`previous_size`
    for the control of ``previous_step``) drawn uniformly from all heads (they may overlap the set they match) by a
    generator seeded with ``seed`` (one per sample) and the step; nothing when the size is 0."""
    return select_random_sized(seed, size, lambda view: torch.ones(view.retrieval.shape, dtype=torch.bool))


def select_dynamic_nonstatic(static_top20: Bool[Tensor, "layer head"]) -> Selector:
    """D_t minus the static top-20: the dynamic heads a static view misses; nothing when that is empty."""

    def select(view: StepView):
        mask = view.retrieval & ~static_top20.to(view.retrieval.device)
        return mask if bool(mask.any()) else None

    return select


def select_static_nondynamic(static_top20: Bool[Tensor, "layer head"]) -> Selector:
    """The static top-20 heads that are not in D_t at this step; nothing when D_t covers all of them."""

    def select(view: StepView):
        mask = static_top20.to(view.retrieval.device) & ~view.retrieval
        return mask if bool(mask.any()) else None

    return select


def random_heads_from(pool: Bool[Tensor, "layer head"], n: int, seed: int) -> Bool[Tensor, "layer head"]:
    """``n`` heads drawn uniformly from the heads of ``pool`` (at most all of them), seeded by ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    candidates = torch.nonzero(pool.flatten().cpu()).flatten()
    chosen = candidates[torch.randperm(len(candidates), generator=generator)[: min(n, len(candidates))]]
    mask = torch.zeros(pool.numel(), dtype=torch.bool)
    mask[chosen] = True
    return mask.reshape(pool.shape)


def select_random_sized(seed: int, size: Callable[[StepView], int], pool: Callable[[StepView], Tensor]) -> Selector:
    """A random control sized per step: ``size(view)`` heads drawn from ``pool(view)`` with a generator seeded by
    ``seed`` (one per sample) and the step; nothing when the size is 0."""

    def select(view: StepView):
        n = size(view)
        if n == 0:
            return None
        return random_heads_from(pool(view), n, mix_seed(seed, view.step)).to(view.retrieval.device)

    return select


def select_random_nonstatic(static_top20: Bool[Tensor, "layer head"], seed: int) -> Selector:
    """The size-matched control of ``dynamic_nonstatic``: |D_t minus S_20| random heads from outside S_20."""
    static = static_top20.bool()
    return select_random_sized(seed, lambda view: int((view.retrieval & ~static.to(view.retrieval.device)).sum()),
                               lambda view: ~static)


def select_random_nondynamic(static_top20: Bool[Tensor, "layer head"], seed: int) -> Selector:
    """The size-matched control of ``static_nondynamic``: |S_20 minus D_t| random heads from outside D_t."""
    static = static_top20.bool()
    return select_random_sized(seed, lambda view: int((static.to(view.retrieval.device) & ~view.retrieval).sum()),
                               lambda view: ~view.retrieval.cpu())


def select_top_ranked(k: int) -> Selector:
    """Progressive masking: D_t first, then by attention share on the evidence; the top k."""

    def select(view: StepView):
        if k == 0:
            return None
        rank_key = view.retrieval.float() * 2.0 + view.support_score.float()
        order = torch.argsort(rank_key.flatten(), descending=True, stable=True)[:k]
        mask = torch.zeros(rank_key.numel(), dtype=torch.bool, device=rank_key.device)
        mask[order] = True
        return mask.reshape(rank_key.shape)

    return select


def select_random_k(k: int, seed: int) -> Selector:
    """The size-matched control of progressive masking: at each step, ``k`` heads drawn uniformly from all heads
    by a generator seeded with ``seed`` (one per sample) and the step; nothing at k = 0."""
    return select_random_sized(seed, lambda view: k, lambda view: torch.ones(view.retrieval.shape, dtype=torch.bool))


def random_heads(n_layers: int, n_heads: int, k: int, seed: int) -> Bool[Tensor, "layer head"]:
    """``k`` heads drawn without replacement from all ``n_layers`` x ``n_heads`` by a generator seeded with ``seed``."""
    return random_heads_from(torch.ones(n_layers, n_heads, dtype=torch.bool), k, seed)
