"""Notebook 05's features of one answer: dynamic-head features (knowing the evidence, and from the context alone), a
Lookback-style ratio, the logits, and an answer-in-context string match.
"""
from __future__ import annotations

import numpy as np
import torch

from dynheads_tl.analysis.correlation import SetProbe
from dynheads_tl.engine.equations import eq1_mask
from dynheads_tl.engine.tracing import Trace

from .config import CONTEXT_FEATURES, DYNAMIC_FEATURES, LOGIT_FEATURES

__all__ = [
    "lookback_ratios", "context_copy_mask", "context_match_share", "static_heads", "probe_gap", "answer_features",
    "feature_matrices",
]


# --- features ----------------------------------------------------------------------------------------
def _require_signals(trace: Trace) -> None:
    if trace.evidence_mass is None or trace.token_logprob is None:
        raise ValueError("This trace was recorded without signals; trace with TraceConfig(signals=True).")


def lookback_ratios(trace: Trace) -> np.ndarray:
    """Per head [layer * head], the mean over steps 1.. of A_ctx / (A_ctx + A_new): A_ctx is the head's mean
    attention per context token, A_new its mean attention per generated token so far (step t reads t of them).
    Step 0 has no generated token and is left out; a one-step answer gives 1 (all context)."""
    _require_signals(trace)
    start, end = trace.meta["context_span"]  # recorded with the signals
    n_context = max(int(end) - int(start), 1)
    steps = torch.arange(trace.n_steps, dtype=torch.float32)
    ctx = trace.context_mass / n_context
    new = trace.generated_mass / steps.clamp_min(1)[:, None, None]
    ratio = ctx / (ctx + new).clamp_min(1e-12)
    if trace.n_steps < 2:
        return np.ones(trace.n_layers * trace.n_heads)
    return ratio[1:].mean(0).flatten().numpy().astype(float)


def context_copy_mask(trace: Trace) -> torch.Tensor:
    """Eq. 1 with the whole context span in place of the evidence: [step, layer, head] heads whose top-1 source
    lies in the context and holds the generated token. Needs no knowledge of where the answer is."""
    ids = torch.cat([trace.prompt_ids, trace.tokens])
    start, end = trace.meta["context_span"]
    span = torch.zeros(len(ids), dtype=torch.bool)
    span[int(start): int(end)] = True
    return eq1_mask(trace.argmax_pos, ids, span, trace.tokens)


def context_match_share(trace: Trace) -> float:
    """The answer-in-context string match: the longest run of the answer's generated tokens that occurs verbatim
    (same token ids, contiguous) in the context span, as a share of the answer's tokens. 1: the whole answer is
    copied from the context; a garbled UUID keeps only its copied prefix. Needs no training and no knowledge of
    where the evidence lies."""
    start, end = trace.meta["context_span"]
    context = trace.prompt_ids[int(start): int(end)].numpy()
    answer = trace.tokens.numpy()
    if len(answer) == 0 or len(context) == 0:
        return 0.0
    run = np.zeros(len(context), dtype=int)  # run[j]: the copied run ending at answer token i and context token j
    best = 0
    for token in answer:
        previous = np.concatenate([[0], run[:-1]])
        run = np.where(context == token, previous + 1, 0)
        best = max(best, int(run.max()))
    return best / len(answer)


def _set_features(hits: torch.Tensor, mass: torch.Tensor, static: torch.Tensor) -> tuple[float, ...]:
    """(mean |set|, share of steps with a non-empty set, mean mass of the set's heads, mean mass of the static
    heads, entropy of the answer's hits over heads) for [step, heads] hits and masses."""
    sizes = hits.sum(1).float()
    active = sizes > 0
    set_mass = ((mass * hits).sum(1)[active] / sizes[active]).mean() if active.any() else torch.tensor(0.0)
    per_head = hits.sum(0).float()
    p = per_head[per_head > 0] / per_head.sum() if per_head.sum() > 0 else torch.ones(1)
    return (float(sizes.mean()), float(active.float().mean()), float(set_mass), float(mass[:, static].mean()),
            float(-(p * p.log()).sum()))


def static_heads(traces: list[Trace], k: int, context: bool = False) -> torch.Tensor:
    """Flat indices of the ``k`` heads with the highest Eq. 1 rate over every step of ``traces`` (``context``: of
    the context-copy rate, :func:`context_copy_mask`)."""
    hits = torch.cat([(context_copy_mask(t) if context else t.retrieval_mask).flatten(1).float() for t in traces])
    return torch.topk(hits.mean(0), min(k, hits.shape[1])).indices


def probe_gap(trace: Trace, probe: SetProbe | None) -> float:
    """Mean over steps t >= 1 with a non-empty D_t of 1 - |P_t ∩ D_t| / |D_t|, where P_t holds the |D_t| heads the
    probe ranks highest from the hidden state at t - 1 (size-matched, so a set's size does not enter). 1 when no
    such step exists (nothing to predict, counted as a full miss) or there is no probe."""
    if probe is None or trace.n_steps < 2:
        return 1.0
    actual = trace.retrieval_mask[1:].flatten(1).numpy()
    predicted = probe.scores(trace)
    gaps = []
    for row, scores in zip(actual, predicted):
        size = int(row.sum())
        if size == 0:
            continue
        top = np.argsort(-scores, kind="stable")[:size]
        gaps.append(1.0 - row[top].sum() / size)
    return float(np.mean(gaps)) if gaps else 1.0


def answer_features(trace: Trace, static: torch.Tensor, probe: SetProbe | None,
                    static_ctx: torch.Tensor | None = None) -> dict[str, float]:
    """The dynamic-head, context-only and logit features of one answer (module docstring); ``static`` and
    ``static_ctx``: flat head indices (the Eq. 1 and the context-copy static heads; the latter defaults to the
    former)."""
    _require_signals(trace)
    dynamic = _set_features(trace.retrieval_mask.flatten(1), trace.evidence_mass.flatten(1), static)
    context = _set_features(context_copy_mask(trace).flatten(1), trace.context_mass.flatten(1),
                            static if static_ctx is None else static_ctx)
    shares = trace.support_score.flatten(1)
    top10 = torch.topk(shares, min(10, shares.shape[1]), dim=1).values
    return {
        **dict(zip(("dt_size", "dt_active_share", "dt_evidence_mass", "static_evidence_mass", "active_set_entropy"),
                   dynamic)),
        **dict(zip(CONTEXT_FEATURES, context)),
        "eq2_max": float(shares.max(1).values.mean()),
        "eq2_top10": float(top10.mean()),
        "probe_gap": probe_gap(trace, probe),
        "logprob_mean": float(trace.token_logprob.mean()),
        "logprob_min": float(trace.token_logprob.min()),
        "entropy_mean": float(trace.token_entropy.mean()),
        "entropy_max": float(trace.token_entropy.max()),
    }


def feature_matrices(traces: list[Trace], fit_traces: list[Trace], static_k: int) -> dict[str, np.ndarray]:
    """Each group's [answer, feature] matrix for ``traces``, with static heads and the probe fitted on
    ``fit_traces`` only (the training answers)."""
    static = static_heads(fit_traces, static_k)
    static_ctx = static_heads(fit_traces, static_k, context=True)
    probe = SetProbe.fit(fit_traces)
    rows = [answer_features(t, static, probe, static_ctx) for t in traces]
    matrix = lambda names: np.array([[r[name] for name in names] for r in rows])
    dynamic, logit = matrix(DYNAMIC_FEATURES), matrix(LOGIT_FEATURES)
    return {"dynamic": dynamic, "dynamic_ctx": matrix(CONTEXT_FEATURES),
            "lookback": np.stack([lookback_ratios(t) for t in traces]), "logit": logit,
            "dynamic+logit": np.concatenate([dynamic, logit], axis=1)}
