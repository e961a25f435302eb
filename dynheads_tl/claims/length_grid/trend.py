"""The length trend test of the pre-registration file's ``lengths:`` section: the slope of a per-unit measure against
log2(context length) (one doubling of the context = 1), with a BCa bootstrap interval that resamples layouts
within each length, an achieved significance level read off the same BCa construction, and Holm over the family.

BCa (Efron 1987): the bootstrap percentiles are shifted by a bias correction ``z0`` (the share of resampled slopes
below the estimate) and an acceleration ``a`` (from the jackknife that leaves out one layout at a time), so the
interval can be asymmetric and always contains its own estimate's neighbourhood the way the sampling distribution
does. The p-value is the two-sided level at which the BCa interval's bound reaches 0, so "p < alpha" and "the
1 - alpha interval excludes 0" say the same thing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from dynheads_tl.analysis.bca import bca_bounds, bca_p_value
from dynheads_tl.analysis.statistics import holm_adjust

__all__ = ["Slope", "log2_slope", "slope_test", "holm_family", "slope_reading", "MIN_LAYOUTS_PER_LENGTH"]

# A slope is tested only when every length has at least this many layouts: a bootstrap within fewer clusters gives
# an interval too narrow to trust (claim 2 asks the same minimum of its comparisons).
MIN_LAYOUTS_PER_LENGTH = 5


@dataclass(frozen=True)
class Slope:
    """A slope per doubling with its BCa interval (``confidence``), the 1 - 2 alpha interval for the equivalence
    test, the two-sided p-value, and its units: ``n`` values in ``layouts`` layouts over ``lengths`` lengths.
    ``degenerate``: every resample gave the same slope (the interval is a point, not an interval)."""

    estimate: float
    low: float
    high: float
    tost_low: float
    tost_high: float
    p: float
    n: int
    layouts: int
    lengths: int
    degenerate: bool = False


def log2_slope(lengths: np.ndarray, values: np.ndarray) -> float:
    """The least-squares slope of ``values`` on log2(``lengths``); NaN with fewer than two distinct lengths or
    no finite value."""
    keep = np.isfinite(values)
    x, y = np.log2(np.asarray(lengths, dtype=float)[keep]), np.asarray(values, dtype=float)[keep]
    if len(np.unique(x)) < 2:
        return float("nan")
    x = x - x.mean()
    return float((x * (y - y.mean())).sum() / (x * x).sum())


def _strata(layouts: np.ndarray, lengths: np.ndarray) -> list[list[np.ndarray]]:
    """Per length, the members (indices) of each layout at that length."""
    out = []
    for length in dict.fromkeys(lengths.tolist()):
        at = np.flatnonzero(lengths == length)
        labels = layouts[at]
        out.append([at[labels == label] for label in dict.fromkeys(labels.tolist())])
    return out


def slope_test(values: Sequence[float], lengths: Sequence[int], layouts: Sequence, *, alpha: float = 0.05,
               n_resamples: int = 2000, seed: int = 0, min_layouts: int = 2,
               statistic: Callable[[np.ndarray, np.ndarray], float] = log2_slope) -> Slope:
    """The slope per doubling of ``values`` (one per unit: a layout's value, or a sample's) against their
    ``lengths``, with the BCa interval at 1 - ``alpha`` and at 1 - 2 ``alpha`` (for TOST), resampling the
    ``layouts`` (cluster labels) within each length, ``n_resamples`` times. NaN values are left out first. A length
    with fewer than ``min_layouts`` layouts leaves the slope untested (NaN interval): a bootstrap within so few
    clusters gives an interval too narrow to trust."""
    values, lengths, layouts = (np.asarray(values, dtype=float), np.asarray(lengths), np.asarray(layouts).astype(str))
    if not len(values) == len(lengths) == len(layouts):
        raise ValueError(f"slope_test needs one length and one layout per value: {len(values)} values, "
                         f"{len(lengths)} lengths, {len(layouts)} layouts.")
    keep = np.isfinite(values)
    values, lengths, layouts = values[keep], lengths[keep], layouts[keep]
    strata = _strata(layouts, lengths)
    n_layouts = sum(len(s) for s in strata)
    estimate = statistic(lengths, values)
    nan = Slope(estimate, float("nan"), float("nan"), float("nan"), float("nan"), float("nan"), len(values),
                n_layouts, len(strata))
    if estimate != estimate or any(len(s) < max(min_layouts, 2) for s in strata):
        return nan  # fewer than two lengths, or a length with too few layouts to resample within it
    rng = np.random.default_rng(seed)
    draws = np.empty(n_resamples)
    for r in range(n_resamples):
        index = np.concatenate([members[j] for members in strata for j in rng.integers(0, len(members), len(members))])
        draws[r] = statistic(lengths[index], values[index])
    everything = [members for stratum in strata for members in stratum]
    jackknife = np.array([statistic(np.delete(lengths, m), np.delete(values, m)) for m in everything])
    finite = draws[np.isfinite(draws)]
    if len(finite) and np.ptp(finite) == 0:
        return Slope(estimate, estimate, estimate, estimate, estimate, 0.0 if estimate != 0 else 1.0, len(values),
                     n_layouts, len(strata), degenerate=True)
    low, high = bca_bounds(estimate, draws, jackknife, 1 - alpha)
    tost_low, tost_high = bca_bounds(estimate, draws, jackknife, 1 - 2 * alpha)
    return Slope(estimate, low, high, tost_low, tost_high, bca_p_value(estimate, draws, jackknife), len(values),
                 n_layouts, len(strata))


def int_list(value) -> list[int]:
    """A table column of space-separated lengths as ints (a file from before the column, or an empty cell: none)."""
    if value is None or (isinstance(value, float) and value != value):
        return []
    return [int(float(x)) for x in str(value).split()]


def holm_family(p_values: Sequence[float]) -> list[float]:
    """Holm's adjustment over the defined p-values of the family (NaN stays NaN and leaves the family)."""
    defined = [i for i, p in enumerate(p_values) if p == p]
    adjusted = [float("nan")] * len(p_values)
    for i, value in zip(defined, holm_adjust([float(p_values[i]) for i in defined])):
        adjusted[i] = value
    return adjusted


def slope_reading(slope: Slope, p_adjusted: float, sesoi: float, alpha: float = 0.05) -> str:
    """One of: "increases", "decreases" (Holm-adjusted p below ``alpha`` and the interval away from 0),
    "flat within the sesoi" (TOST: the 1 - 2 alpha interval inside ±``sesoi``), "undetermined", or
    "not tested" (no interval)."""
    if slope.low != slope.low:
        return "not tested"
    if p_adjusted == p_adjusted and p_adjusted < alpha and (slope.low > 0 or slope.high < 0):
        return "increases" if slope.estimate > 0 else "decreases"
    if -sesoi < slope.tost_low and slope.tost_high < sesoi:
        return "flat within the sesoi"
    return "undetermined"
