"""Claim 1 beyond the paper: soft dynamism over settings with random layouts (haystacks x lengths), Eq. 1 against
heads that read the needle by attention mass, and how often heads leave the set from one step to the next.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from dynheads_tl.analysis.scoring import (adjacent_counts, copyable_steps, head_churn_counts, size_aware_counts,
                                          soft_sets, static_retrieval_scores, static_top_k)
from dynheads_tl.analysis.statistics import bootstrap_interval, ratio_of_sums, wilson_interval
from dynheads_tl.corpus import layout_traces
from dynheads_tl.engine.tracing import Trace
from dynheads_tl.tasks import niah_accuracy

from .config import DynamismConfig

__all__ = [
    "SettingResult", "run_settings", "soft_definitions", "definition_label", "SOFT_METRICS", "soft_dynamism_table",
    "setting_accuracy", "argmax_churn",
]

logger = logging.getLogger(__name__)


# --- soft dynamism over settings with random layouts (beyond the paper) ---------------------------
@dataclass
class SettingResult:
    """One (haystack, context length) setting: its traces (with evidence attention), static scores and accuracy."""

    haystack: str
    context: int
    calibration: list[Trace]
    analysis: list[Trace]
    static_scores: torch.Tensor | None  # None when no calibration answer passed Wu et al.'s filter

    @property
    def label(self) -> str:
        name = self.haystack if not self.haystack.startswith("folder:") else f"folder:{Path(self.haystack[7:]).name}"
        return f"{name} {self.context}"

    def static_mask(self, k: int) -> torch.Tensor | None:
        if self.static_scores is None:
            return None
        return static_top_k(self.static_scores, min(k, self.static_scores.numel()))


def run_settings(model, config: DynamismConfig) -> list[SettingResult]:
    """Trace every (haystack, context) setting of ``config.settings`` with the headline seed."""
    results = []
    for haystack, context in config.settings:
        calibration, analysis = layout_traces(
            model, config, haystack=haystack, context_tokens=context, n_calibration=config.n_setting_calibration,
            n_analysis=config.n_setting, seed=config.seeds[0], use_cache=config.use_cache,
            batch_size=config.trace_batch_size)
        try:
            override = config.static_override(config.model)  # static_source: the file's scores in every setting
            scores = static_retrieval_scores(calibration, rouge_filter=0.5) if override is None else override
        except ValueError:  # no calibration answer reproduced the needle: no static set for this setting
            logger.warning("Setting %s %s: no calibration sample passed the ROUGE filter; static metrics are NaN.",
                           haystack, context)
            scores = None
        results.append(SettingResult(haystack, context, calibration, analysis, scores))
    return results


def soft_definitions(config: DynamismConfig) -> list[tuple[str, float | None]]:
    """Eq. 1, then copy mass and evidence mass above each of ``config.copy_thresholds``."""
    return ([("eq1", None)] + [("copy", t) for t in config.copy_thresholds]
            + [("evidence", t) for t in config.copy_thresholds])


def definition_label(kind: str, threshold: float | None) -> str:
    return "Eq. 1 (argmax)" if kind == "eq1" else f"{kind} mass > {threshold:g}"


# Per-sample sums -> pooled ratios (see scoring.adjacent_counts / size_aware_counts).
SOFT_METRICS = {
    "jaccard_adjacent": ("jaccard_sum", "pairs"),   # mean J(D_t, D_t+1)
    "persistence": ("kept", "left"),                # share of a step's heads still active at the next step
    "heads_per_step": ("size_sum", "steps"),
    "ever_active_per_sample": ("ever", "one"),       # heads active at least once in a sample, mean over samples
    "static_coverage": ("coverage_sum", "active_steps"),  # |D_t ∩ S_k| / |D_t|
    "share_outside_static": ("outside", "activations"),
}


def _sample_counts(trace: Trace, kind: str, threshold: float | None, static: torch.Tensor | None) -> dict[str, float]:
    """One sample's sums for :data:`SOFT_METRICS`, over the steps whose token occurs in the needle
    (:func:`~dynheads_tl.analysis.scoring.copyable_steps`; pairs: two such steps in a row)."""
    sets = soft_sets(trace, kind, threshold if threshold is not None else 0.5)
    valid = copyable_steps(trace)
    counts = {**adjacent_counts(sets, valid), "one": 1.0}
    if static is not None:
        size = size_aware_counts(sets[valid], static)
        counts.update(coverage_sum=size["coverage_sum"], active_steps=size["steps"],
                      outside=size["activations"] - size["inside"], activations=size["activations"])
    else:
        counts.update(coverage_sum=float("nan"), active_steps=float("nan"), outside=float("nan"),
                      activations=float("nan"))
    return counts


def _pooled(per_sample: list[dict[str, float]], metric: str, seed: int = 0) -> dict[str, float]:
    """A ratio of sums pooled over samples, with a bootstrap interval over samples; samples without the metric
    (no static set in their setting) are left out, and n counts the samples used."""
    numerator, denominator = SOFT_METRICS[metric]
    values = np.array([[c[numerator], c[denominator]] for c in per_sample], dtype=float)
    values = values[~np.isnan(values).any(1)]
    if len(values) == 0:
        return {"value": float("nan"), "low": float("nan"), "high": float("nan"), "n_samples": 0}
    interval = bootstrap_interval(values, ratio_of_sums, seed=seed)
    return {"value": interval.estimate, "low": interval.low, "high": interval.high, "n_samples": interval.n}


def soft_dynamism_table(settings: list[SettingResult], config: DynamismConfig) -> pd.DataFrame:
    """Table 1's dynamism metrics for Eq. 1 and for copy / evidence mass above each threshold, per setting and
    pooled over settings ("all"), each a ratio pooled over analysis samples with a 95% bootstrap interval over
    samples. Only steps whose generated token occurs in the needle count (elsewhere Eq. 1 and copy mass are
    empty by definition). Static metrics use each setting's own static top-``static_k``; settings without one
    are left out of the pooled static metrics (``n_samples`` says how many samples each number uses)."""
    rows = []
    pooled: dict[tuple, list] = {}
    for setting in settings:
        static = setting.static_mask(config.static_k)
        for kind, threshold in soft_definitions(config):
            per_sample = [_sample_counts(t, kind, threshold, static) for t in setting.analysis]
            pooled.setdefault((kind, threshold), []).extend(per_sample)
            for metric in SOFT_METRICS:
                rows.append({"setting": setting.label, "definition": definition_label(kind, threshold), "kind": kind,
                             "threshold": threshold, "metric": metric, **_pooled(per_sample, metric)})
    for (kind, threshold), per_sample in pooled.items():
        for metric in SOFT_METRICS:
            rows.append({"setting": "all", "definition": definition_label(kind, threshold), "kind": kind,
                         "threshold": threshold, "metric": metric, **_pooled(per_sample, metric)})
    return pd.DataFrame(rows)


def setting_accuracy(settings: list[SettingResult]) -> pd.DataFrame:
    """NIAH accuracy of each setting's analysis split, with a Wilson 95% interval."""
    rows = []
    for setting in settings:
        hits = sum(niah_accuracy(t.response, t.answers[0]) >= 1.0 for t in setting.analysis)
        interval = wilson_interval(int(hits), len(setting.analysis))
        steps = torch.cat([copyable_steps(t) for t in setting.analysis]).float()
        rows.append({"setting": setting.label, "haystack": setting.haystack, "context": setting.context,
                     "accuracy": interval.estimate, "low": interval.low, "high": interval.high, "n": interval.n,
                     "static_set": setting.static_scores is not None,
                     "copyable_step_share": float(steps.mean()) if len(steps) else float("nan")})
    return pd.DataFrame(rows)


def argmax_churn(settings: list[SettingResult], config: DynamismConfig) -> pd.DataFrame:
    """Of the times a head leaves the Eq. 1 set from step t to t + 1 (t + 1 generating a token that occurs in the
    needle), the share that still puts more than τ of its attention on the needle (evidence mass) or on the token
    being copied (copy mass) at t + 1, per setting and pooled; 95% bootstrap intervals over samples."""
    rows = []
    pooled: dict[tuple, list] = {}
    for setting in settings:
        for kind in ("evidence", "copy"):
            for threshold in config.copy_thresholds:
                per_sample = []
                for trace in setting.analysis:
                    counts = head_churn_counts(trace.retrieval_mask, soft_sets(trace, kind, threshold),
                                               copyable_steps(trace))
                    per_sample.append([counts["drops_still_reading"], counts["drops"]])
                pooled.setdefault((kind, threshold), []).extend(per_sample)
                rows.append(_churn_row(setting.label, kind, threshold, per_sample))
    for (kind, threshold), per_sample in pooled.items():
        rows.append(_churn_row("all", kind, threshold, per_sample))
    return pd.DataFrame(rows)


def _churn_row(label: str, kind: str, threshold: float, per_sample: list[list[float]]) -> dict:
    values = np.array(per_sample, dtype=float)
    interval = bootstrap_interval(values, ratio_of_sums)
    return {"setting": label, "still_reading": definition_label(kind, threshold), "kind": kind, "threshold": threshold,
            "drops": int(values[:, 1].sum()), "share": interval.estimate, "low": interval.low, "high": interval.high,
            "n_samples": interval.n}
