"""Static-set stability (issue #31): split-half overlap of S_k over calibration sizes and the overlap of two sources'
S_k, on hand-built per-sample scores whose top-k sets are known."""
from __future__ import annotations

import pandas as pd
import pytest
import torch

from dynheads_tl.analysis.stability import source_overlap, split_half_curve, stability_verdict, stable_size


def _scores(n: int, top: list[int], *, noise: float, seed: int = 0) -> torch.Tensor:
    """n samples of 4 x 5 heads: the ``top`` heads (flat indices) score 1 + noise, the others noise."""
    generator = torch.Generator().manual_seed(seed)
    scores = noise * torch.rand(n, 20, generator=generator, dtype=torch.float64)
    scores[:, top] += 1.0
    return scores.reshape(n, 4, 5)


def test_a_set_that_never_moves_has_overlap_one_at_every_size():
    curve = split_half_curve(_scores(8, [0, 3, 7, 11, 19], noise=0.1), k=5, n_resamples=20)
    assert curve["calibration_size"].tolist() == [1, 2, 3, 4]
    assert (curve["overlap"] == 1).all() and (curve["low"] == 1).all()
    assert stable_size(curve) == 1
    assert "share 1.00 of their top-5 heads" in stability_verdict(curve) and "about 1 calibration samples" in stability_verdict(curve)


def test_the_run_s_calibration_size_is_checked_against_where_the_curve_settles():
    curve = pd.DataFrame({"calibration_size": [1, 2, 3, 4, 5], "overlap": [0.5, 0.7, 0.86, 0.88, 0.89], "low": 0.0,
                          "high": 1.0, "k": 5, "n_samples": 10, "n_resamples": 10, "chance": 0.25})
    assert stable_size(curve) == 3  # 0.86 is the first within 0.05 of 0.89
    assert "rests on 10 kept calibration samples per seed (the fewest of any seed), at or past that size" in \
        stability_verdict(curve, calibration_size=10)
    assert "at or past" in stability_verdict(curve, calibration_size=3)
    assert "fewer than that" in stability_verdict(curve, calibration_size=2)
    assert "calibrate on at least 3" in stability_verdict(curve, calibration_size=2)
    rising = curve.assign(overlap=[0.2, 0.4, 0.6, 0.8, 0.95])
    assert "gives no size to check" in stability_verdict(rising, calibration_size=10)
    assert "rests on" not in stability_verdict(curve)
    chance = curve.assign(overlap=0.25)
    assert "no more than chance" in stability_verdict(chance, calibration_size=10)
    assert "gives no size to check" in stability_verdict(chance, calibration_size=10)
    one = curve.iloc[:1]  # one size cannot show settling
    assert stable_size(one) is None and "one calibration size only" in stability_verdict(one, calibration_size=10)


def test_pure_noise_overlaps_at_chance_and_the_curve_cannot_settle():
    # 20 heads, k = 5, no signal: two top-5 sets of small disjoint draws share k / 20 = 0.25 of their heads in
    # expectation (draws that exhaust the samples are complementary halves of one data set, so not independent).
    curve = split_half_curve(_scores(40, [], noise=1.0), k=5, sizes=[1, 2, 3, 4, 5], n_resamples=300, seed=1)
    assert curve["overlap"].between(0.15, 0.35).all()
    assert (curve["chance"] == 0.25).all()
    assert stable_size(curve) is None, "a curve at chance has no stable size"
    assert "no more than chance (0.25" in stability_verdict(curve)
    rising = pd.DataFrame({"calibration_size": [1, 2, 3], "overlap": [0.2, 0.5, 0.9], "low": 0.0, "high": 1.0, "k": 5,
                           "n_samples": 6, "n_resamples": 10})
    assert stable_size(rising) is None
    assert "cannot say" in stability_verdict(rising)


def test_two_sources_sharing_three_of_five_heads():
    a = _scores(6, [0, 1, 2, 3, 4], noise=0.01)
    b = _scores(6, [0, 1, 2, 10, 11], noise=0.01, seed=2)
    row = source_overlap(a, b, k=5, n_resamples=100)
    assert row["overlap"] == pytest.approx(0.6) and row["shared_heads"] == 3
    assert row["low"] == pytest.approx(0.6) and row["high"] == pytest.approx(0.6)  # the sets never move
    assert row["n_a"] == row["n_b"] == 6 and -1 <= row["spearman"] <= 1
    with pytest.raises(ValueError, match="of one model"):
        source_overlap(a, torch.zeros(2, 3, 3), k=5)
    with pytest.raises(ValueError, match="at least 2"):
        split_half_curve(a[:1], k=5)
