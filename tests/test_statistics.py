"""The statistics the verdicts rest on, on hand-built data with a known answer: cluster bootstrap, grouped splits,
the exact sign test, and Holm with untestable comparisons left out (Tarone)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dynheads_tl.analysis.statistics import (bootstrap_interval, grouped_splits, holm_adjust, holm_testable,
                                             mark_separated, n_to_resolve, paired_sign_test, resampled_t_interval,
                                             resampled_t_test, sign_test_min_p, sign_test_needs)


def test_a_cluster_bootstrap_is_wider_than_the_naive_one_on_clustered_data():
    # 20 layouts x 3 needle variants: the variants of one layout are nearly identical (as NIAH samples that differ
    # only in the UUID), so there are 20 independent units, not 60.
    rng = np.random.default_rng(1)
    layout_effect = rng.normal(0, 1, 20)
    values = np.repeat(layout_effect, 3) + rng.normal(0, 0.05, 60)
    layouts = np.repeat(np.arange(20), 3)
    naive = bootstrap_interval(values, n_resamples=4000)
    clustered = bootstrap_interval(values, n_resamples=4000, clusters=layouts)
    assert naive.n == clustered.n == 60 and clustered.clusters == 20 and naive.clusters is None
    assert clustered.estimate == pytest.approx(naive.estimate)
    # the naive interval is too narrow by about sqrt(3)
    assert 1.4 < clustered.half_width / naive.half_width < 2.1


def test_a_cluster_bootstrap_of_singletons_is_the_sample_bootstrap():
    values = np.random.default_rng(2).normal(size=25)
    plain = bootstrap_interval(values, n_resamples=3000)
    singletons = bootstrap_interval(values, n_resamples=3000, clusters=np.arange(25))
    assert singletons.clusters == 25
    assert singletons.half_width == pytest.approx(plain.half_width, rel=0.15)


def test_cluster_labels_must_match_the_samples():
    with pytest.raises(ValueError, match="one label per sample: 2 labels for 3 samples"):
        bootstrap_interval([1.0, 2.0, 3.0], clusters=[0, 1])


def test_a_grouped_split_never_puts_one_layout_on_both_sides():
    layouts = np.repeat(np.arange(30), 3)  # 30 layouts x 3 UUIDs, as claim 3's NIAH traces
    splits = grouped_splits(layouts, n_splits=5, test_fraction=0.3, seed=0)
    assert len(splits) == 5
    tests = []
    for train, test in splits:
        assert set(layouts[train]).isdisjoint(layouts[test])
        assert len(train) + len(test) == 90 and len(set(layouts[test])) == 9
        tests.append(frozenset(layouts[test]))
    assert len(set(tests)) > 1, "each split draws its own test layouts"
    with pytest.raises(ValueError, match="at least 2 groups"):
        grouped_splits([7, 7, 7])


def test_the_sign_test_matches_scipys_binomial_test():
    a = np.array([1, 1, 1, 1, 1, 0, 1, 0, 0.5, 0.5, 1, 1])
    b = np.array([0, 0, 0, 0, 1, 1, 0, 0, 0.5, 0.5, 0, 0])
    result = paired_sign_test(a, b)
    assert (result.a_better, result.b_better) == (7, 1)
    assert result.sign_p == pytest.approx(stats.binomtest(7, 8, 0.5).pvalue)
    assert result.sign_p == pytest.approx(2 * (1 + 8) / 2 ** 8)  # by hand: P(X <= 1) twice, X ~ Bin(8, 1/2)


def test_the_smallest_reachable_p_of_a_sign_test():
    assert sign_test_min_p(0) == 1.0
    assert sign_test_min_p(4) == pytest.approx(0.125)  # 4 wins and no loss: never below 0.05
    assert sign_test_min_p(5) == pytest.approx(0.0625)
    assert sign_test_min_p(6) == pytest.approx(0.03125)
    assert sign_test_min_p(6) == pytest.approx(stats.binomtest(6, 6, 0.5).pvalue)
    assert sign_test_needs(0.05) == 6 and sign_test_needs(0.01) == 8  # 2 / 2^7 = 0.0156 > 0.01 >= 2 / 2^8


def test_holm_with_an_untestable_comparison_left_out_matches_a_hand_computation():
    # Three comparisons; the second has 3 discordant pairs (minimum p 0.25) and cannot reach 0.05.
    p = [0.01, 0.25, 0.03]
    min_p = [sign_test_min_p(10), sign_test_min_p(3), sign_test_min_p(8)]
    adjusted = holm_testable(p, min_p)
    # by hand, over the two testable ones: sorted 0.01, 0.03 -> 2 x 0.01 = 0.02, max(0.02, 1 x 0.03) = 0.03
    assert adjusted[0] == pytest.approx(0.02) and adjusted[2] == pytest.approx(0.03)
    assert np.isnan(adjusted[1])
    # with all three in the family, the third would not survive 0.05 after all: 0.03, then max(0.03, 2 x 0.03)
    assert holm_adjust(p) == pytest.approx([0.03, 0.25, 0.06])


def test_mark_separated_can_leave_untestable_rows_out_of_the_family():
    table = pd.DataFrame({"sign_p": [0.01, 1.0, 0.03], "low": [0.1, 0.0, 0.05], "high": [0.3, 0.0, 0.2],
                          "a_better": [9, 0, 7], "b_better": [1, 0, 1]})
    everyone = mark_separated(table.copy())
    assert everyone["p_adjusted"].tolist() == pytest.approx([0.03, 1.0, 0.06])
    assert everyone["separated"].tolist() == [True, False, False]
    testable = mark_separated(table.copy(), testable_only=True)
    assert testable["testable"].tolist() == [True, False, True]
    assert testable["p_adjusted"].iloc[0] == pytest.approx(0.02) and testable["p_adjusted"].iloc[2] == pytest.approx(0.03)
    assert np.isnan(testable["p_adjusted"].iloc[1])
    assert testable["separated"].tolist() == [True, False, True]


def test_n_to_resolve_scales_with_the_square_of_the_half_width():
    values = np.random.default_rng(3).normal(0.1, 1.0, 40)
    interval = bootstrap_interval(values, n_resamples=2000)
    needed = n_to_resolve(interval, effect=interval.half_width / 2)  # an effect half the half-width needs 4x n
    assert needed == pytest.approx(4 * 40, abs=1)
    assert n_to_resolve(interval, effect=0.0) is None


def test_the_corrected_resampled_t_interval_matches_a_hand_computation():
    # 5 splits, test part a quarter of the training part: variance (1/5 + 1/4) * s², s² = 0.025, t_{0.975, 4} = 2.7764451
    values = [0.1, 0.2, 0.3, 0.4, 0.5]
    interval = resampled_t_interval(values, test_to_train=0.25)
    se = np.sqrt(0.45 * 0.025)
    assert interval.estimate == pytest.approx(0.3) and interval.n == 5
    assert interval.high - 0.3 == pytest.approx(2.7764451 * se, rel=1e-6)
    assert resampled_t_test(values, 0.25) == pytest.approx(2 * stats.t.sf(0.3 / se, 4))
    # wider than the naive t-interval over splits (which treats overlapping splits as independent)
    naive = stats.ttest_1samp(values, 0.0).pvalue
    assert resampled_t_test(values, 0.25) > naive
    assert np.isnan(resampled_t_test([0.2], 0.25)) and np.isnan(resampled_t_interval([0.2], 0.25).low)
    assert resampled_t_test([0.0, 0.0], 0.25) == 1.0
