"""Per-step KV retention (notebook 06): only the heads of R_t read the whole context at step t.

DuoAttention, RazorAttention and HeadKV keep the full KV cache for a *static* set of heads and a short window
for every other head. If the heads that retrieve change from step to step and the hidden state predicts them,
R_t can be chosen per step. The protocol runs on the two-pass loop (:func:`~dynheads_tl.protocols.ablation.
two_pass_batch` with ``intervention="retain"``):

1. a clean pass with every head on the full context (it gives D_t for the oracle and is otherwise discarded);
2. a retained pass in which the heads outside R_t attend only to the first ``sink_tokens`` positions and the
   last ``local_window`` keys, with exactly zero attention elsewhere; its token, its keys and values
   (``keep_cache="masked"``) are kept.

The prompt is prefilled with every head on the full context: retention acts on decoding, where the cache is
read. Strategies at an equal budget of b heads per step (:data:`STRATEGIES`):

- ``static``: the top b heads by Wu et al.'s retrieval score on calibration answers (the DuoAttention-style
  split), the same at every step;
- ``predicted``: the top b of a probe's scores from the hidden state of the *previous* step (of the retained
  pass: what a deployed system would have), so it never looks at step t; step 0 has no previous step and uses
  the static order;
- ``oracle``: D_t of the clean pass first, then by Eq. 2 share on the evidence (the upper bound);
- ``random``: b heads drawn per step (seeded by the sample and the step);
- ``streaming`` (b = 0) and ``full`` (every head) bound them.

GQA: heads sharing a KV head share its cache, so a KV head is kept when any of its query heads is retained;
:func:`kv_heads_kept` counts them. The KV-head-level variant (``granularity="kv"``) ranks KV heads by the best
score among their query heads and retains all query heads of the top b_kv.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from dynheads_tl.protocols.ablation import Selector, StepView

Strategy = Literal["static", "predicted", "oracle", "random", "streaming", "full"]
STRATEGIES: tuple[str, ...] = ("static", "predicted", "oracle", "random", "streaming", "full")
Granularity = Literal["query", "kv"]
Scorer = Callable[[StepView], Tensor]  # a step's view -> one score per query head [layer, head]


def oracle_scores(view: StepView) -> Tensor:
    """D_t first (Eq. 1 of the clean pass), then by Eq. 2 share on the evidence."""
    return view.retrieval.float() * 2.0 + view.support_score.float()


def fixed_scores(scores: Tensor) -> Scorer:
    return lambda view: scores


def random_scores(shape: tuple[int, int], seed: int) -> Scorer:
    """Fresh random scores at every step, from a generator seeded by ``seed`` and the step."""
    return lambda view: torch.rand(shape, generator=torch.Generator().manual_seed(seed * 100_003 + view.step))


def predicted_scores(probe: Callable[[Tensor], Tensor], fallback: Tensor) -> Scorer:
    """``probe(previous hidden)`` reshaped to [layer, head]; ``fallback`` (the static scores) at step 0."""
    return lambda view: fallback if view.previous_hidden is None else \
        torch.as_tensor(probe(view.previous_hidden.float().cpu()), dtype=torch.float32).reshape(fallback.shape)


def top_retained(scores: Float[Tensor, "layer head"], b: int, *, granularity: Granularity = "query",
                 group: int = 1) -> Bool[Tensor, "layer head"]:
    """The retained set: the ``b`` query heads with the highest scores (``"query"``), or every query head of the
    ``b`` KV heads whose best query head scores highest (``"kv"``; ``group`` query heads per KV head)."""
    scores = scores.float()
    n_layers, n_heads = scores.shape
    if granularity == "kv":
        per_kv = scores.reshape(n_layers, n_heads // group, group).amax(-1).flatten()
        keep = torch.zeros_like(per_kv, dtype=torch.bool)
        keep[torch.argsort(per_kv, descending=True, stable=True)[:b]] = True
        return keep.reshape(n_layers, n_heads // group, 1).expand(-1, -1, group).reshape(n_layers, n_heads)
    keep = torch.zeros(scores.numel(), dtype=torch.bool)
    keep[torch.argsort(scores.flatten(), descending=True, stable=True)[:b]] = True
    return keep.reshape(n_layers, n_heads)


def retention_selector(scorer: Scorer | None, b: int, *, granularity: Granularity = "query",
                       group: int = 1, n_units: int | None = None) -> Selector:
    """A selector for ``two_pass_batch(intervention="retain")``: R_t = :func:`top_retained` of the scorer's
    scores at every step. ``b`` is in query heads (``"query"``) or KV heads (``"kv"``); ``b`` = 0 is streaming
    (``scorer`` may be None) and ``b`` = ``n_units`` the full cache (None: nothing restricted)."""
    if n_units is not None and b >= n_units:
        return lambda view: None
    if scorer is None:
        if b:
            raise ValueError("Only b = 0 (streaming) or the full cache can do without a scorer.")
        return lambda view: torch.zeros_like(view.retrieval, dtype=torch.bool)
    return lambda view: top_retained(scorer(view), b, granularity=granularity, group=group).to(view.retrieval.device)


def kv_heads_kept(retained: Bool[Tensor, "step layer head"], group: int) -> Tensor:
    """Per step, how many KV heads some retained query head reads (a KV head is kept if any of its ``group``
    query heads is retained)."""
    steps, n_layers, n_heads = retained.shape
    return retained.reshape(steps, n_layers, n_heads // group, group).any(-1).flatten(1).sum(1)


# --- memory ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KVShape:
    """What a model's KV cache size depends on (from its config)."""

    name: str
    n_layers: int
    n_kv_heads: int
    head_dim: int
    bytes_per_value: int = 2  # bf16 / fp16

    def full_bytes(self, tokens: int) -> int:
        """Keys and values of every layer and KV head for ``tokens`` positions."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * tokens * self.bytes_per_value

    def retained_bytes(self, tokens: int, kept_share: float, sink_tokens: int, local_window: int) -> float:
        """A ``kept_share`` of the KV heads holds every position; the others the sinks and the window only."""
        short = min(tokens, sink_tokens + local_window)
        return kept_share * self.full_bytes(tokens) + (1 - kept_share) * self.full_bytes(short)


# Llama-3.1-8B: 32 layers, 8 KV heads of dimension 128 (its config.json).
LLAMA_31_8B = KVShape("Llama-3.1-8B", 32, 8, 128)


def model_kv_shape(model) -> KVShape:
    """The KV shape of a loaded model (named as :func:`~dynheads_tl.engine.models.model_name` names it)."""
    from dynheads_tl.engine.models import model_name

    cfg = model.cfg
    n_kv = int(getattr(cfg, "n_key_value_heads", None) or cfg.n_heads)
    return KVShape(model_name(model), int(cfg.n_layers), n_kv, int(cfg.d_head))


def memory_table(shapes: list[KVShape], shares: list[float], *, sink_tokens: int, local_window: int,
                 lengths: tuple[int, ...] = (8_000, 50_000, 128_000)) -> pd.DataFrame:
    """Computed (not measured) KV-cache memory in GiB per sequence, for each model, share of KV heads kept and
    context length; ``full`` is the whole cache, ``streaming`` keeps no head whole."""
    rows = []
    for shape in shapes:
        for share in shares:
            row = {"model": shape.name, "kv_heads_kept_share": share, "kv_heads_kept": share * shape.n_layers * shape.n_kv_heads}
            for tokens in lengths:
                row[f"GiB_at_{tokens // 1000}k"] = shape.retained_bytes(tokens, share, sink_tokens, local_window) / 2**30
            rows.append(row)
    return pd.DataFrame(rows)
