"""Retrieval scores and dynamism metrics, computed from ``Trace`` objects alone (no model).

- Eq. 1 (dynamic, NIAH): :attr:`Trace.retrieval_mask`.
- Eq. 2 (dynamic, HotpotQA): :attr:`Trace.support_score`, thresholded by :func:`dynamic_sets`.
- Wu et al.'s static retrieval score: :func:`static_retrieval_scores` (with the filter it used,
  :func:`wu_static_scores`), and :func:`static_top_k`.
- Table 1's metrics: :func:`dynamism_metrics`.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
from typing import Literal, Sequence

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from dynheads_tl.tasks.metrics import rouge1_recall
from dynheads_tl.engine.equations import Eq2Rule
from dynheads_tl.engine.trace_data import Trace
from dynheads_tl.analysis.statistics import bootstrap_interval, ratio_of_sums

logger = logging.getLogger(__name__)

DynamicKind = Literal["eq1", "eq2"]


def dynamic_sets(trace: Trace, kind: DynamicKind = "eq1", threshold: "float | Eq2Rule" = 0.1
                 ) -> Bool[Tensor, "step layer head"]:
    """D_t for every step: Eq. 1's retrieval mask, or the heads Eq. 2 marks under ``threshold`` (an
    :class:`~dynheads_tl.engine.equations.Eq2Rule`, or a number: the fixed threshold)."""
    if kind == "eq1":
        return trace.retrieval_mask
    if kind == "eq2":
        return trace.eq2_sets(threshold)
    raise ValueError(f"kind must be 'eq1' or 'eq2', got {kind!r}.")


def static_retrieval_scores(
    traces: Sequence[Trace], *, rouge_filter: float | None = 0.5
) -> Float[Tensor, "layer head"]:
    """Wu et al. (2024): per sample, each step where the head's top-1 source is in the needle and
    holds the generated token adds 1/|needle tokens|; the head's score is the mean over samples.

    With ``rouge_filter`` set, a sample counts only if the response's ROUGE-1 recall of the answer
    exceeds it. This is Wu et al.'s filter: ``rouge-score``'s ROUGE-1 recall (Porter stemmer) against
    ``real_needle``, the part of the needle the model must reproduce (here the answer, not the whole
    needle sentence), kept if above 0.5. Raises if no sample passes.
    """
    return static_retrieval_per_sample(traces, rouge_filter=rouge_filter).mean(0)


WU_FILTER = "ROUGE-1 recall > 0.5 (Wu et al.)"
WU_UNFILTERED = "none (no calibration answer passed Wu et al.'s ROUGE filter)"


@dataclass(frozen=True)
class WuScores:
    """Wu et al.'s static scores of one calibration split, with the filter they were computed under: Wu's ROUGE
    filter (:data:`WU_FILTER`), or none (:data:`WU_UNFILTERED`) when no calibration answer passed it, in which case
    every sample counts (preregistration.yaml, deviation of 2026-12-06). ``n_passed`` of the ``n_calibration``
    samples passed the filter; ``n_kept`` is how many the scores average."""
    scores: Float[Tensor, "layer head"]
    filter: str
    n_passed: int
    n_calibration: int

    @property
    def filtered(self) -> bool:
        return self.filter == WU_FILTER

    @property
    def n_kept(self) -> int:
        return self.n_passed if self.filtered else self.n_calibration


def wu_static_scores(traces: Sequence[Trace], label: str = "NIAH calibration") -> WuScores:
    """:func:`static_retrieval_scores` under Wu et al.'s filter, or without it when no calibration answer passes:
    the model then never reproduced more than half of an answer, so the filtered score is undefined, and the
    unfiltered one (every step at which a head copies a needle token, whatever the answer) is what is left to rank
    heads by. The filter used travels with the scores; a caller reports it beside every result they decide. The
    fallback is logged as a warning naming ``label`` (which split, which seed)."""
    wu = wu_static_per_sample(traces)[1]
    if not wu.filtered:
        logger.warning("%s: none of %s answers passed Wu et al.'s ROUGE filter; the static heads are ranked by "
                       "unfiltered scores.", label, wu.n_calibration)
    return wu


def wu_static_per_sample(traces: Sequence[Trace]) -> tuple[Float[Tensor, "sample layer head"], WuScores]:
    """The per-sample terms of :func:`wu_static_scores` under the filter it chooses for ``traces`` (Wu's, or none
    when no answer passes), with its :class:`WuScores` (their mean): what a per-seed stability, overlap or
    head-score file reads, so that each rests on the same samples as the seed's static set."""
    passed = sum(rouge1_recall(t.response, t.answers[0]) > 0.5 for t in traces)
    terms = static_retrieval_per_sample(traces, rouge_filter=0.5 if passed else None)
    return terms, WuScores(terms.mean(0), WU_FILTER if passed else WU_UNFILTERED, passed, len(traces))


def static_retrieval_per_sample(
    traces: Sequence[Trace], *, rouge_filter: float | None = 0.5
) -> Float[Tensor, "sample layer head"]:
    """The per-sample terms of :func:`static_retrieval_scores` (the samples the filter keeps, in order): what
    Wu et al.'s ``head_score`` files list under each ``"layer-head"`` key."""
    if not traces:
        raise ValueError("static_retrieval_scores needs at least one trace.")
    kept = []
    for trace in traces:
        if rouge_filter is not None and rouge1_recall(trace.response, trace.answers[0]) <= rouge_filter:
            continue
        per_sample = trace.retrieval_mask.float().sum(0) / max(sum(e - s for s, e in trace.evidence_spans), 1)
        kept.append(per_sample)
    if not kept:
        raise ValueError(
            f"No calibration sample passed the ROUGE-1 recall filter (> {rouge_filter}); the model "
            "never reproduced more than half of the answer. In a notebook: give it more decoding steps (max_new_tokens), "
            "more calibration samples (n_calibration) or an easier haystack; a direct caller may also pass "
            "rouge_filter=None to keep every sample."
        )
    return torch.stack(kept)


def chance_ratios(traces: Sequence[Trace]) -> Float[Tensor, "n"]:
    """Every head-step's Eq. 2 share divided by that step's chance share (steps with a chance of 0 left out)."""
    ratios = []
    for trace in traces:
        chance = trace.eq2_chance
        keep = chance > 0
        ratios.append((trace.support_score[keep] / chance[keep, None, None]).flatten())
    return torch.cat(ratios) if ratios else torch.zeros(0)


def calibrate_chance_factor(placebo: Sequence[Trace], false_rate: float = 0.01) -> float:
    """The factor c of :class:`~dynheads_tl.engine.equations.Eq2Rule` ``("chance", c)`` at which heads reading
    placebo spans (:func:`~dynheads_tl.tasks.common.placebo_sample`: the evidence moved to random context
    positions) are marked on a ``false_rate`` share of head-steps: the (1 - ``false_rate``) quantile of their
    share / chance ratios. A head then counts on real evidence only when it reads it more than all but
    ``false_rate`` of heads read arbitrary context of the same size."""
    if not 0 < false_rate < 1:
        raise ValueError(f"false_rate must lie strictly between 0 and 1, got {false_rate!r}.")
    ratios = chance_ratios(placebo)
    if not len(ratios):
        raise ValueError("calibrate_chance_factor needs placebo traces with at least one step.")
    return float(np.quantile(ratios.double().numpy(), 1 - false_rate))  # torch.quantile stops at 2**24 values


def eq2_rule_curve(real: Sequence[Trace], placebo: Sequence[Trace], factors: Sequence[float]) -> "pd.DataFrame":
    """For each factor c: the share of head-steps marked on the real evidence and on placebo spans under
    share > c x chance, the mean |D_t| and the heads ever active on the real evidence (the figure that justifies
    the calibrated factor)."""
    import pandas as pd

    real_ratio, placebo_ratio = chance_ratios(real), chance_ratios(placebo)
    chances = [t.eq2_chance for t in real]  # once per trace, not once per factor
    rows = []
    for factor in factors:
        rule = Eq2Rule("chance", float(factor))
        sets = [rule.select(t.support_score, chance) for t, chance in zip(real, chances)]
        rows.append({"factor": float(factor), "real_rate": float((real_ratio > factor).float().mean()),
                     "placebo_rate": float((placebo_ratio > factor).float().mean()),
                     "heads_per_step": float(torch.cat([s.flatten(1).sum(1) for s in sets]).float().mean()),
                     "heads_ever_active": int(torch.stack([s.any(0) for s in sets]).any(0).sum())})
    return pd.DataFrame(rows)


def _rate_of_rates(rows: np.ndarray) -> float:
    """(Σ real marked / Σ real head-steps) / (Σ placebo marked / Σ placebo head-steps) over rows of those four
    counts; NaN when the placebo spans are never marked."""
    real = ratio_of_sums(rows[:, :2])
    placebo = ratio_of_sums(rows[:, 2:])
    return real / placebo if placebo > 0 else float("nan")


def eq2_placebo_ratio(real: Sequence[Trace], placebo: Sequence[Trace], factor: float, *, seed: int = 0,
                      n_resamples: int = 2000):
    """How many times as often the rule ``share > factor x chance`` marks head-steps on the real evidence as on
    placebo spans of the same sizes, with its BCa 95% interval over questions (``real[i]`` and ``placebo[i]`` are
    one question's two traces, resampled together). The factor is held at its calibrated value (the interval does
    not include the calibration's own uncertainty). An interval that reaches 1 means the marked heads are not shown
    to read the supporting facts more than any span of their size."""
    if len(real) != len(placebo) or not real:
        raise ValueError(f"eq2_placebo_ratio needs one placebo trace per real trace, got {len(real)} and "
                         f"{len(placebo)}.")
    rows = []
    for one, other in zip(real, placebo):
        a, b = chance_ratios([one]), chance_ratios([other])
        rows.append([float((a > factor).sum()), float(a.numel()), float((b > factor).sum()), float(b.numel())])
    return bootstrap_interval(np.asarray(rows), _rate_of_rates, seed=seed, n_resamples=n_resamples)


def static_eq2_scores(traces: Sequence[Trace]) -> Float[Tensor, "layer head"]:
    """The HotpotQA analogue of the static score: each head's mean Eq. 2 score over all steps."""
    if not traces:
        raise ValueError("static_eq2_scores needs at least one trace.")
    return torch.cat([t.support_score for t in traces]).mean(0)


def static_top_k(scores: Float[Tensor, "layer head"], k: int = 20) -> Bool[Tensor, "layer head"]:
    """The static retrieval set: the ``k`` heads with the highest score (ties broken by index)."""
    if not 0 < k <= scores.numel():
        raise ValueError(f"k must be in [1, {scores.numel()}], got {k}.")
    mask = torch.zeros(scores.numel(), dtype=torch.bool)
    order = torch.argsort(scores.flatten(), descending=True, stable=True)
    mask[order[:k]] = True
    return mask.reshape(scores.shape)


def jaccard(a: Tensor, b: Tensor) -> float:
    """|a ∩ b| / |a ∪ b| of two boolean masks; NaN when both are empty."""
    a, b = a.bool().flatten(), b.bool().flatten()
    union = int((a | b).sum())
    return float("nan") if union == 0 else int((a & b).sum()) / union


def _nanmean(values: list[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return float("nan") if not values else sum(values) / len(values)


def dynamism_metrics(
    step_sets: Sequence[Bool[Tensor, "step layer head"]],
    static_mask: Bool[Tensor, "layer head"],
) -> dict[str, float]:
    """Table 1 from the per-sample dynamic sets of the analysis split.

    - ``jaccard_static``: mean over steps with non-empty D_t of J(D_t, static set);
    - ``jaccard_adjacent``: mean over consecutive steps (with a non-empty union) of J(D_t, D_{t+1});
    - ``entropy``: -sum p_h ln p_h, p_h = head h's share of all activations pooled over steps and
      samples (natural log; a uniform top-20 gives ln 20 = 2.9957);
    - ``heads_per_step_mean`` / ``_sd``: |D_t| over all steps (population sd);
    - ``ever_active``: heads active at least once; ``n_heads``: heads in the model.
    """
    if not step_sets:
        raise ValueError("dynamism_metrics needs at least one sample.")
    static_vals, adjacent_vals, sizes = [], [], []
    counts = torch.zeros_like(step_sets[0][0], dtype=torch.float64) if len(step_sets[0]) else torch.zeros(static_mask.shape, dtype=torch.float64)
    for sets in step_sets:
        for t in range(sets.shape[0]):
            sizes.append(int(sets[t].sum()))
            if sets[t].any():
                static_vals.append(jaccard(sets[t], static_mask))
            if t + 1 < sets.shape[0]:
                adjacent_vals.append(jaccard(sets[t], sets[t + 1]))
        counts += sets.double().sum(0) if sets.shape[0] else 0
    total = float(counts.sum())
    p = counts.flatten() / total if total else counts.flatten()
    entropy = float(-(p[p > 0] * p[p > 0].log()).sum()) if total else 0.0
    size_tensor = torch.tensor(sizes, dtype=torch.float64) if sizes else torch.zeros(1, dtype=torch.float64)
    return {
        "jaccard_static": _nanmean(static_vals),
        "jaccard_adjacent": _nanmean(adjacent_vals),
        "entropy": entropy,
        "entropy_ref_ln20": math.log(20),
        "heads_per_step_mean": float(size_tensor.mean()),
        "heads_per_step_sd": float(size_tensor.std(unbiased=False)),
        "ever_active": int((counts > 0).sum()),
        "n_heads": int(static_mask.numel()),
        "n_steps": len(sizes),
    }


def activation_frequency(step_sets: Sequence[Bool[Tensor, "step layer head"]]) -> Float[Tensor, "layer head"]:
    """Fraction of all steps at which each head is active (the long tail)."""
    stacked = torch.cat([s.float() for s in step_sets]) if step_sets else torch.zeros(0)
    if stacked.numel() == 0:
        raise ValueError("activation_frequency needs at least one step.")
    return stacked.mean(0)


def distinct_heads_curve(step_sets: Sequence[Bool[Tensor, "step layer head"]]) -> list[int]:
    """Number of distinct heads seen after 1, 2, ... steps (samples concatenated in order)."""
    seen, curve = None, []
    for sets in step_sets:
        for t in range(sets.shape[0]):
            seen = sets[t].clone() if seen is None else seen | sets[t]
            curve.append(int(seen.sum()))
    return curve


# --- size-aware views of the overlap with the static set (beyond the paper) -----------------------
def size_aware_counts(sets: Bool[Tensor, "step layer head"], static_mask: Bool[Tensor, "layer head"]) -> dict[str, float]:
    """Sums over one sample's steps, from which :func:`size_aware_metrics` pools ratios:

    - ``steps``: steps with a non-empty D_t; ``inside`` / ``activations``: Σ |D_t ∩ S| and Σ |D_t|;
    - ``coverage_sum``: Σ |D_t ∩ S| / |D_t|; ``jaccard_sum``: Σ J(D_t, S); ``bound_sum``: Σ of the largest
      Jaccard that the set sizes allow, min(|D_t|, k) / max(|D_t|, k); ``normalised_sum``: Σ J / bound;
    all over steps with a non-empty D_t.
    """
    k = int(static_mask.sum())
    flat, static = sets.flatten(1), static_mask.flatten()
    sizes = flat.sum(1).double()
    inside = (flat & static).sum(1).double()
    union = (flat | static).sum(1).double()
    active = sizes > 0
    jaccard_t = inside[active] / union[active]
    bound_t = torch.minimum(sizes[active], torch.tensor(float(k))) / torch.maximum(sizes[active], torch.tensor(float(k)))
    return {"steps": float(active.sum()), "inside": float(inside.sum()), "activations": float(sizes.sum()),
            "coverage_sum": float((inside[active] / sizes[active]).sum()), "jaccard_sum": float(jaccard_t.sum()),
            "bound_sum": float(bound_t.sum()), "normalised_sum": float((jaccard_t / bound_t).sum())}


SIZE_AWARE_METRICS = {
    "jaccard_static": ("jaccard_sum", "steps"),        # the paper's metric: mean J(D_t, S_k)
    "jaccard_bound": ("bound_sum", "steps"),           # the mean largest J that |D_t| and k allow
    "jaccard_over_bound": ("normalised_sum", "steps"),  # mean J / bound: 1 when D_t ⊂ S_k or S_k ⊂ D_t
    "static_coverage": ("coverage_sum", "steps"),      # mean |D_t ∩ S_k| / |D_t|
    "share_inside_static": ("inside", "activations"),  # pooled share of all activations that fall in S_k
}


def size_aware_metrics(per_sample: Sequence[dict[str, float]], *, seed: int = 0,
                       clusters: Sequence | None = None) -> list[dict[str, float]]:
    """Each metric of :data:`SIZE_AWARE_METRICS` pooled over samples (a ratio of sums), with a percentile
    bootstrap 95% interval that resamples samples, or whole ``clusters`` (one label per sample, e.g. its NIAH
    layout; ``n_layouts`` then says how many); ``share_outside_static`` = 1 − ``share_inside_static``."""

    if not per_sample:
        raise ValueError("size_aware_metrics needs at least one sample.")
    rows = []
    for name, (numerator, denominator) in SIZE_AWARE_METRICS.items():
        values = np.array([[s[numerator], s[denominator]] for s in per_sample])
        interval = bootstrap_interval(values, ratio_of_sums, seed=seed, clusters=clusters)
        layouts = {"n_layouts": interval.clusters} if clusters is not None else {}
        rows.append({"metric": name, "value": interval.estimate, "low": interval.low, "high": interval.high,
                     "n_samples": interval.n, **layouts})
        if name == "share_inside_static":
            rows.append({"metric": "share_outside_static", "value": 1 - interval.estimate, "low": 1 - interval.high,
                         "high": 1 - interval.low, "n_samples": interval.n, **layouts})
    return rows


# --- soft retrieval: attention mass instead of the argmax (beyond the paper) -----------------------
def _evidence_attention(trace: Trace) -> Float[Tensor, "step layer head evidence"]:
    if trace.evidence_attention is None:
        raise ValueError("This trace has no evidence attention; trace with TraceConfig(evidence_attention=True).")
    return trace.evidence_attention.float()


def evidence_mass(trace: Trace) -> Float[Tensor, "step layer head"]:
    """Each head's total attention weight on the evidence positions at every step (sinks and recent tokens
    included in the denominator, unlike Eq. 2: this is the raw softmax mass)."""
    return _evidence_attention(trace).sum(-1)


def copy_mass(trace: Trace) -> Float[Tensor, "step layer head"]:
    """The soft counterpart of Eq. 1: each head's attention weight on the evidence positions that hold the
    token generated at that step. Eq. 1 asks whether the single most-attended position is such a position;
    the copy mass asks how much of the head's attention goes to them."""
    attention = _evidence_attention(trace)
    evidence_ids = trace.prompt_ids[trace.evidence_mask]  # the ids at the evidence positions, in order
    holds = evidence_ids[None, :] == trace.tokens[:, None]  # [step, evidence]
    return (attention * holds[:, None, None, :].float()).sum(-1)


SoftKind = Literal["eq1", "copy", "evidence"]


def soft_sets(trace: Trace, kind: SoftKind, threshold: float = 0.5) -> Bool[Tensor, "step layer head"]:
    """Per-step head sets from one trace: ``"eq1"`` (the paper's argmax criterion), ``"copy"`` (copy mass
    above ``threshold``) or ``"evidence"`` (evidence mass above ``threshold``: the heads that read the
    evidence at all, whatever token they look at)."""
    if kind == "eq1":
        return trace.retrieval_mask
    if not 0 < threshold < 1:
        raise ValueError(f"threshold must lie in (0, 1), got {threshold!r}.")
    if kind == "copy":
        return copy_mass(trace) > threshold
    if kind == "evidence":
        return evidence_mass(trace) > threshold
    raise ValueError(f"kind must be 'eq1', 'copy' or 'evidence', got {kind!r}.")


def copyable_steps(trace: Trace) -> Bool[Tensor, "step"]:
    """Steps whose generated token occurs somewhere in the evidence. Elsewhere (a wrong token, the end of the
    answer) Eq. 1 and the copy mass are empty by definition, whatever the heads attend to, so comparisons of
    those sets with token-independent ones (evidence mass) are made on these steps only."""
    evidence_ids = trace.prompt_ids[trace.evidence_mask]
    return (trace.tokens[:, None] == evidence_ids[None, :]).any(1)


def adjacent_counts(sets: Bool[Tensor, "step layer head"], valid: Bool[Tensor, "step"] | None = None) -> dict[str, float]:
    """Sums over one sample's consecutive step pairs with a non-empty union, from which per-sample ratios
    are pooled: ``pairs``, ``jaccard_sum`` (Σ J(D_t, D_{t+1})), ``kept`` (Σ |D_t ∩ D_{t+1}|) and ``left``
    (Σ |D_t|, over the same pairs: so kept / left is the share of a step's heads still active at the next);
    ``steps``, ``size_sum``: steps and Σ |D_t|; ``ever``: heads active at least once. With ``valid``, only
    steps where it is True count, and only pairs of two consecutive valid steps."""
    flat = sets.flatten(1)
    valid = torch.ones(flat.shape[0], dtype=torch.bool) if valid is None else valid.bool()
    a, b = flat[:-1], flat[1:]
    union = (a | b).sum(1)
    inter = (a & b).sum(1)
    pair_ok = (union > 0) & valid[:-1] & valid[1:]
    kept = flat[valid]
    return {"pairs": float(pair_ok.sum()), "jaccard_sum": float((inter[pair_ok].double() / union[pair_ok].double()).sum()),
            "kept": float(inter[pair_ok].sum()), "left": float(a[pair_ok].sum()),
            "steps": float(kept.shape[0]), "size_sum": float(kept.sum()), "ever": float(kept.any(0).sum())}


def bound_ratio_counts(sets: Bool[Tensor, "step layer head"]) -> dict[str, float]:
    """Sums over one sample's consecutive step pairs whose sets are both non-empty: ``pairs`` and ``ratio_sum``
    (Σ J(D_t, D_{t+1}) / (min(|D_t|, |D_{t+1}|) / max(|D_t|, |D_{t+1}|))), each adjacent-step Jaccard over the
    largest Jaccard two sets of those sizes allow (nested sets reach it). 1 means no more turnover than the sizes
    force; a pair with an empty set has no bound above 0 and is left out."""
    flat = sets.flatten(1)
    a, b = flat[:-1], flat[1:]
    size_a, size_b = a.sum(1).double(), b.sum(1).double()
    ok = (size_a > 0) & (size_b > 0)
    jaccard = (a & b).sum(1).double()[ok] / (a | b).sum(1).double()[ok]
    bound = torch.minimum(size_a, size_b)[ok] / torch.maximum(size_a, size_b)[ok]
    return {"pairs": float(ok.sum()), "ratio_sum": float((jaccard / bound).sum())}


def head_churn_counts(hits: Bool[Tensor, "step layer head"], reads: Bool[Tensor, "step layer head"],
                      valid: Bool[Tensor, "step"] | None = None) -> dict[str, float]:
    """Argmax churn: of the times a head drops out of the Eq. 1 set from one step to the next (hit at t, no hit
    at t + 1), how often it still reads the evidence at t + 1 (``reads``, e.g. evidence mass above a threshold).
    With ``valid``, only drops into a valid step t + 1 count (see :func:`copyable_steps`: at a step whose token is
    not in the evidence every head drops out of Eq. 1). Returns the counts ``drops`` and ``drops_still_reading``."""
    drop = hits[:-1] & ~hits[1:]
    if valid is not None:
        drop = drop & valid[1:].bool()[:, None, None]
    return {"drops": float(drop.sum()), "drops_still_reading": float((drop & reads[1:]).sum())}
