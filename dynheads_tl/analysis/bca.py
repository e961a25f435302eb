"""The bias-corrected and accelerated (BCa) bootstrap (Efron 1987), the package's one implementation: bounds from
bootstrap draws and jackknife values, and the achieved significance level read off the same construction.
:func:`~dynheads_tl.analysis.statistics.bootstrap_interval` draws the resamples and adds its stated rules for
degenerate and one-tailed draws; the length slopes (``claims/length_grid/trend.py``) draw stratified ones."""
from __future__ import annotations

from typing import Callable

import numpy as np
from scipy import stats

__all__ = ["bca_bounds", "bca_p_value", "jackknife"]


def jackknife(data: np.ndarray, members: list[np.ndarray], statistic: Callable[[np.ndarray], float]) -> np.ndarray:
    """The statistic with each resampled unit (sample or cluster) left out in turn; NaNs dropped."""
    every = np.arange(len(data))
    values = []
    for left_out in members:
        keep = np.setdiff1d(every, left_out, assume_unique=True)
        values.append(float(statistic(data[keep])) if len(keep) else float("nan"))
    values = np.asarray(values)
    return values[~np.isnan(values)]


def _bias(below: float, n_draws: int) -> float:
    """Efron's bias correction z0 from the share of draws below the estimate (ties counted half), kept finite by
    clipping the share to half a draw from 0 and 1."""
    return float(stats.norm.ppf(np.clip(below, 0.5 / n_draws, 1 - 0.5 / n_draws)))


def _acceleration(jack: np.ndarray) -> float:
    """The acceleration from the jackknife's skewness (NaNs dropped); 0 with fewer than three jackknife values or no
    spread among them."""
    jack = np.asarray(jack, dtype=float)
    jack = jack[np.isfinite(jack)]
    if len(jack) < 3:
        return 0.0
    spread = jack.mean() - jack
    denominator = 6 * float((spread ** 2).sum()) ** 1.5
    return float((spread ** 3).sum()) / denominator if denominator > 0 else 0.0


def _bca_from(draws: np.ndarray, z0: float, acceleration: float, alpha: float) -> tuple[float, float]:
    bounds = []
    for q in (alpha, 1 - alpha):
        z = z0 + float(stats.norm.ppf(q))
        level = float(stats.norm.cdf(z0 + z / (1 - acceleration * z))) if 1 - acceleration * z > 0 else float("nan")
        bounds.append(float(np.quantile(draws, level if level == level else q)))  # extreme acceleration: percentile
    return bounds[0], bounds[1]


def bca_bounds(estimate: float, draws: np.ndarray, jackknife: np.ndarray, confidence: float) -> tuple[float, float]:
    """The BCa interval (Efron 1987) at ``confidence`` from bootstrap ``draws`` of a statistic and its
    leave-one-unit-out ``jackknife`` values: the percentiles shifted by the bias correction (the share of draws below
    ``estimate``) and the acceleration (the jackknife's skewness). Undefined draws are dropped; (NaN, NaN) when none
    is defined. Where the acceleration is so extreme that a corrected level is undefined, that bound is the plain
    percentile. :func:`bootstrap_interval` adds the stated rules for degenerate and one-tailed draws."""
    draws = np.asarray(draws, dtype=float)
    draws = draws[np.isfinite(draws)]
    if not len(draws):
        return float("nan"), float("nan")
    below = float((draws < estimate).mean() + 0.5 * (draws == estimate).mean())
    return _bca_from(draws, _bias(below, len(draws)), _acceleration(jackknife), (1 - confidence) / 2)


def bca_p_value(estimate: float, draws: np.ndarray, jackknife: np.ndarray) -> float:
    """The two-sided achieved significance level of 0 under the BCa construction of :func:`bca_bounds`: the smallest
    alpha whose 1 - alpha BCa interval excludes 0 (1 when 0 sits at the corrected distribution's median), so
    "p < alpha" and "the 1 - alpha interval excludes 0" say the same thing. NaN when no draw is defined."""
    draws = np.asarray(draws, dtype=float)
    draws = draws[np.isfinite(draws)]
    if not len(draws):
        return float("nan")
    below = float((draws < estimate).mean() + 0.5 * (draws == estimate).mean())
    z0, acceleration = _bias(below, len(draws)), _acceleration(jackknife)
    share = float((draws < 0).mean() + 0.5 * (draws == 0).mean())
    w = _bias(share, len(draws))
    u = (w - z0) / (1 + acceleration * (w - z0))
    level = float(stats.norm.cdf(u - z0))
    return float(min(1.0, 2 * min(level, 1 - level)))
