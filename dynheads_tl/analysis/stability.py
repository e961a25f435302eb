"""How stable is the static set? Overlap of S_k between calibration sources and across calibration resamples.

Every "dynamic vs static" verdict inherits the calibration that chose S_k (Wu et al.'s top-k heads), so the report
says how much S_k moves when the calibration changes:

- :func:`split_half_curve`: for each calibration size m, two disjoint random halves of m samples each, the share of
  S_k that the two halves' S_k share (|S_a ∩ S_b| / k), over resamples: the curve that says at which size S_k stops
  changing (:func:`stable_size`);
- :func:`source_overlap`: the overlap of two sources' S_k (e.g. the suite's NIAH and Wu's detection data, or two
  seeds' calibration splits) with a bootstrap interval that resamples the samples of each source, and the Spearman
  correlation of their per-head scores.

Inputs are per-sample score tensors ([sample, layer, head], e.g.
:func:`~dynheads_tl.analysis.scoring.static_retrieval_per_sample`), so these run on cached traces without a model.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from dynheads_tl.analysis.scoring import static_top_k


def _top_k(mean: np.ndarray, k: int) -> np.ndarray:
    return static_top_k(torch.from_numpy(mean), k).flatten().numpy()


def _overlap(a: np.ndarray, b: np.ndarray, k: int) -> float:
    return float((a & b).sum()) / k


def split_half_curve(per_sample: Float[Tensor, "sample layer head"], k: int = 20, *, sizes: list[int] | None = None,
                     n_resamples: int = 200, seed: int = 0) -> pd.DataFrame:
    """For each size m (default: 1 .. n // 2), ``n_resamples`` draws of two disjoint sets of m samples; per draw the
    overlap |S_k(a) ∩ S_k(b)| / k of the two top-k sets. Rows: m, the mean overlap, its 2.5% and 97.5% quantiles over
    draws (the spread of the overlap between two calibrations of that size, not an interval of the mean), and n."""
    scores = per_sample.detach().double().flatten(1).numpy()
    n = scores.shape[0]
    if n < 2:
        raise ValueError(f"split_half_curve needs at least 2 calibration samples, got {n}.")
    if not 0 < k <= scores.shape[1]:
        raise ValueError(f"k must be in [1, {scores.shape[1]}], got {k}.")
    sizes = sizes or list(range(1, n // 2 + 1))
    if any(not 1 <= m <= n // 2 for m in sizes):
        raise ValueError(f"Every size must lie in [1, {n // 2}] (two disjoint halves of {n} samples), got {sizes}.")
    rng = np.random.default_rng(seed)
    rows = []
    for m in sizes:
        values = []
        for _ in range(n_resamples):
            order = rng.permutation(n)
            a, b = scores[order[:m]].mean(0), scores[order[m:2 * m]].mean(0)
            values.append(_overlap(_top_k(a, k), _top_k(b, k), k))
        values = np.array(values)
        rows.append({"calibration_size": m, "overlap": float(values.mean()), "low": float(np.quantile(values, 0.025)),
                     "high": float(np.quantile(values, 0.975)), "k": k, "n_samples": n, "n_resamples": n_resamples,
                     # two top-k sets drawn at random from all heads share k / heads of their heads on average
                     "chance": k / scores.shape[1]})
    return pd.DataFrame(rows)


def above_chance(curve: pd.DataFrame, tolerance: float = 0.05) -> bool:
    """Whether the mean split-half overlap at the largest size exceeds the chance overlap (``chance``, k / heads: two
    random top-k sets) by more than ``tolerance``: only then is there a static set whose stability can be asked
    about."""
    chance = float(curve["chance"].iloc[-1]) if "chance" in curve else 0.0
    return float(curve["overlap"].iloc[-1]) > chance + tolerance


def stable_size(curve: pd.DataFrame, tolerance: float = 0.05) -> int | None:
    """The smallest calibration size whose mean split-half overlap is within ``tolerance`` (absolute) of the largest
    size's: where more samples stop changing S_k by more than that. None when only the largest size qualifies and the
    curve is still rising into it (the data cannot say where S_k settles), or when the overlap at the largest size is
    no more than chance (:func:`above_chance`: there is no stable set to speak of)."""
    if len(curve) < 2 or not above_chance(curve, tolerance):
        return None  # one size cannot show settling
    last = float(curve["overlap"].iloc[-1])
    within = curve[curve["overlap"] >= last - tolerance]
    first = int(within["calibration_size"].iloc[0])
    return None if first == int(curve["calibration_size"].iloc[-1]) and len(curve) > 1 else first


def source_overlap(a: Float[Tensor, "sample layer head"], b: Float[Tensor, "sample layer head"], k: int = 20, *,
                   n_resamples: int = 1000, seed: int = 0) -> dict[str, float]:
    """The overlap |S_k(a) ∩ S_k(b)| / k of two sources' top-k sets (each from its samples' mean score) with a
    percentile-bootstrap 95% interval that resamples each source's samples, and the Spearman correlation of the two
    mean score maps (all heads)."""
    from scipy.stats import spearmanr

    sa, sb = a.detach().double().flatten(1).numpy(), b.detach().double().flatten(1).numpy()
    if sa.shape[1] != sb.shape[1]:
        raise ValueError(f"The two sources score {sa.shape[1]} and {sb.shape[1]} heads; they must be of one model.")
    estimate = _overlap(_top_k(sa.mean(0), k), _top_k(sb.mean(0), k), k)
    rng = np.random.default_rng(seed)
    draws = [_overlap(_top_k(sa[rng.integers(0, len(sa), len(sa))].mean(0), k),
                      _top_k(sb[rng.integers(0, len(sb), len(sb))].mean(0), k), k) for _ in range(n_resamples)]
    rho = spearmanr(sa.mean(0), sb.mean(0)).statistic
    return {"overlap": estimate, "low": float(np.quantile(draws, 0.025)), "high": float(np.quantile(draws, 0.975)),
            "shared_heads": int(round(estimate * k)), "k": k, "spearman": float(rho), "n_a": len(sa), "n_b": len(sb)}


def stability_verdict(curve: pd.DataFrame, seeds: pd.DataFrame | None = None, tolerance: float = 0.05, *,
                      calibration_size: int | None = None) -> str:
    """One computed sentence: where the split-half overlap of S_k settles (:func:`stable_size` at ``tolerance``), and,
    with ``seeds`` (rows of :func:`source_overlap` between calibration splits), how much two splits share. With
    ``calibration_size`` (the samples the run's S_k rests on: per seed, those that pass Wu's filter, the fewest of any
    seed), whether that size is at or past the settling size, which is how the default calibration size is
    chosen."""
    k, n = int(curve["k"].iloc[0]), int(curve["n_samples"].iloc[0])
    last = curve.iloc[-1]
    size = stable_size(curve, tolerance)
    text = (f"Two disjoint calibrations of {int(last['calibration_size'])} samples each share "
            f"{last['overlap']:.2f} of their top-{k} heads on average (95% of draws in [{last['low']:.2f}, "
            f"{last['high']:.2f}]; {n} samples, {int(last['n_resamples'])} draws). ")
    if not above_chance(curve, tolerance):
        text += (f"That is no more than chance ({float(last['chance']):.2f}, the overlap of two top-{k} sets drawn at "
                 f"random): these calibrations find no stable S_{k}, and no calibration size can be read off.")
    elif len(curve) < 2:
        text += (f"With one calibration size only, the {n} samples cannot say at which calibration size S_{k} stops "
                 "changing: more calibration samples would.")
    elif size is None:
        text += (f"The overlap is still rising at the largest size the {n} samples allow, so they cannot say at which "
                 f"calibration size S_{k} stops changing: more calibration samples would.")
    else:
        text += (f"From {size} samples per calibration on, the mean overlap is within {tolerance:g} of that value: "
                 f"S_{k} stops changing by more than that at about {size} calibration samples.")
    if calibration_size is not None:
        if size is None:
            text += (f" So the curve gives no size to check this run's calibration of {calibration_size} samples "
                     "against.")
        elif calibration_size >= size:
            text += (f" This run's S_{k} rests on {calibration_size} kept calibration samples per seed (the fewest of "
                     "any seed), at or past that size.")
        else:
            text += (f" This run's S_{k} rests on {calibration_size} kept calibration samples per seed (the fewest of "
                     f"any seed), fewer than that: it is still moving; calibrate on at least {size} kept samples.")
    if seeds is not None and len(seeds):
        text += (f" Between calibration splits of different seeds, S_{k} overlaps by {seeds['overlap'].mean():.2f} on "
                 f"average ({len(seeds)} pairs; per pair 95% bootstrap intervals from {seeds['low'].min():.2f} to "
                 f"{seeds['high'].max():.2f}).")
    return text
