"""The statistics the verdicts rest on, on hand-built data with a known answer: cluster bootstrap, grouped splits,
the exact sign test, and Holm with untestable comparisons left out (Tarone)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dynheads_tl.analysis.statistics import (Interval, bootstrap_interval, detectable_effect, grouped_splits,
                                             holm_adjust, holm_testable, interval_words, mark_separated, n_to_resolve,
                                             paired_sign_test, primary_and_holm, detectable_words, resampled_t_interval,
                                             resampled_t_test, sensitivity_words, sign_test_min_p, sign_test_needs,
                                             tost, tost_interval)


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


@pytest.mark.parametrize("n, n_resamples", [(1, 50), (2, 2000), (7, 2000), (33, 999), (5000, 300), (3, 0)])
def test_a_bootstrap_of_the_mean_draws_in_blocks_what_the_loop_draws(n, n_resamples):
    """The mean's resamples drawn a block at a time are the loop's, float for float (same generator stream, same
    sums), so every interval the report computed before the blocks is unchanged; NaN values stay NaN."""
    data = np.random.default_rng(n).normal(size=n) * 37.0
    if n == 33:
        data[2] = np.nan  # every resample that draws it is NaN and left out, as in the loop
    looped = bootstrap_interval(data, lambda x: np.mean(x), n_resamples=n_resamples, seed=4)
    blocked = bootstrap_interval(data, np.mean, n_resamples=n_resamples, seed=4)
    assert (blocked.n, blocked.clusters, blocked.method) == (looped.n, looped.clusters, looped.method)
    np.testing.assert_array_equal([blocked.estimate, blocked.low, blocked.high], [looped.estimate, looped.low, looped.high])


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


def test_the_detectable_effect_is_2_8_standard_errors_not_the_half_width():
    # a 95% interval of half-width 1.96 is one standard error; 80% power at 0.05 detects 1.96 + 0.8416 = 2.8016 of them
    interval = Interval(0.5, 0.5 - 1.96, 0.5 + 1.96, n=25)
    assert interval.standard_error == pytest.approx(1.0, rel=1e-3)
    assert detectable_effect(interval) == pytest.approx(2.8016, rel=1e-3)
    assert interval.detectable > interval.half_width
    assert detectable_effect(interval, power=0.5) == pytest.approx(1.96, rel=1e-3)  # the half-width is 50% power


def test_n_to_resolve_detects_the_observed_effect_at_80_percent_power():
    # 25 units, one standard error 1.0: an effect of 2.8 standard errors (and a hair) is detected as it stands;
    # half of it needs 4x the units
    z, power = stats.norm.ppf(0.975), stats.norm.ppf(0.8)
    effect = (z + power) * 1.0001
    interval = Interval(effect, effect - z, effect + z, n=25)
    assert n_to_resolve(interval) == 25
    assert n_to_resolve(interval, effect=effect / 2) == 100
    assert n_to_resolve(Interval(0.1, -1.0, 1.2, n=30, clusters=10), effect=0.1) > 10  # counts clusters, not samples
    assert n_to_resolve(interval, effect=0.0) is None
    assert n_to_resolve(Interval(0.0, 0.0, 0.0, n=30)) is None  # every unit ties: no width, no n


def test_tost_on_paired_differences_matches_a_hand_computation():
    d = np.array([0.01, -0.02, 0.00, 0.015, -0.005, 0.01, -0.01, 0.0])
    mean, se = d.mean(), d.std(ddof=1) / np.sqrt(len(d))
    result = tost(d, 0.05)
    lower = stats.t.sf((mean + 0.05) / se, len(d) - 1)
    upper = stats.t.cdf((mean - 0.05) / se, len(d) - 1)
    assert result.p == pytest.approx(max(lower, upper)) and result.equivalent
    # the same differences cannot be called negligible at a margin they reach
    assert not tost(d, 0.005).equivalent
    # a large, clearly non-zero difference is not equivalent either
    assert not tost(d + 0.3, 0.05).equivalent
    # all tied at 0: exactly inside any positive margin
    assert tost(np.zeros(10), 0.01).equivalent
    assert np.isnan(tost([0.1], 0.05).p)
    with pytest.raises(ValueError, match="must be positive"):
        tost(d, 0.0)


def test_tost_read_from_an_interval_needs_the_whole_interval_inside_the_margin():
    assert tost_interval(-0.01, 0.015, 0.02)
    assert not tost_interval(-0.051, 0.029, 0.02)  # Beyond 5 today: cannot be told apart, and not shown negligible
    assert not tost_interval(float("nan"), 0.01, 0.02)


def test_bca_interval_never_excludes_the_estimate_of_a_count():
    # "heads ever active": the number of distinct heads over samples; resampling can only lose heads, so the
    # percentile interval lies below the estimate (as HotpotQA's 221 [195, 217] did)
    rng = np.random.default_rng(4)
    sets = [set(rng.choice(300, size=8, replace=False).tolist()) for _ in range(60)]
    index = np.arange(60).astype(float)
    distinct = lambda rows: float(len(set().union(*(sets[int(i)] for i in rows))))
    percentile = bootstrap_interval(index, distinct, method="percentile")
    assert percentile.high < percentile.estimate  # the defect
    fixed = bootstrap_interval(index, distinct)
    assert fixed.method == "tail rule" and fixed.high == fixed.estimate and fixed.low == percentile.low
    assert "count" in interval_words(fixed)


def test_bca_interval_of_a_mean_is_close_to_the_percentile_one_and_contains_the_estimate():
    values = np.random.default_rng(5).exponential(1.0, 80)  # skewed: BCa moves the bounds to the right
    bca = bootstrap_interval(values, n_resamples=4000)
    percentile = bootstrap_interval(values, n_resamples=4000, method="percentile")
    assert bca.method == "bca" and bca.low <= bca.estimate <= bca.high
    assert bca.high > percentile.high and abs(bca.half_width - percentile.half_width) < 0.3 * percentile.half_width
    with pytest.raises(ValueError, match="'bca' or 'percentile'"):
        bootstrap_interval(values, method="basic")


def test_a_degenerate_interval_is_said_as_such():
    zeros = bootstrap_interval(np.zeros(30))
    assert zeros.degenerate and zeros.method == "degenerate" and (zeros.low, zeros.high) == (0.0, 0.0)
    assert interval_words(zeros) == "every sample at 0.00 (no interval: all equal)"
    assert "ties" in sensitivity_words(zeros) and "±0.00" not in sensitivity_words(zeros)
    spread = bootstrap_interval(np.random.default_rng(6).normal(0, 1, 30))
    assert not spread.degenerate and "80% power" in sensitivity_words(spread)


def test_the_primary_is_tested_alone_and_the_secondaries_holm_corrected():
    # primary p = 0.03 stays 0.03 (alone at 0.05); the three secondaries: Holm over 0.01, 0.02, 0.04
    p = [0.03, 0.01, 0.02, 0.04]
    adjusted = primary_and_holm(p, [True, False, False, False])
    assert adjusted == pytest.approx([0.03, 0.03, 0.04, 0.04])
    # inside Holm the primary would have been 4 x 0.01 ... 0.06: not separated
    assert holm_adjust(p)[0] == pytest.approx(0.06)
    # a secondary outside the family and not testable gets NaN
    adjusted = primary_and_holm(p, [True, False, False, False], family=[True, True, False, True],
                                min_p=[0.0, 0.0, 0.0, 0.25])
    assert adjusted[0] == 0.03 and adjusted[1] == pytest.approx(0.01) and np.isnan(adjusted[2]) and np.isnan(adjusted[3])


def test_mark_separated_keeps_the_primary_out_of_the_family():
    table = pd.DataFrame({"sign_p": [0.02, 0.03, 0.04], "low": [0.1, 0.1, 0.1], "high": [0.3, 0.3, 0.3],
                          "a_better": [9, 9, 9], "b_better": [1, 1, 1]})
    marked = mark_separated(table.copy(), testable_only=True, primary=np.array([True, False, False]))
    # primary alone: 0.02; the two secondaries: Holm 2 x 0.03 = 0.06, max(0.06, 0.04) = 0.06
    assert marked["p_adjusted"].tolist() == pytest.approx([0.02, 0.06, 0.06])
    assert marked["separated"].tolist() == [True, False, False]
    inside = mark_separated(table.copy(), testable_only=True)  # the old way: primary inside Holm, 3 x 0.02
    assert inside["p_adjusted"].iloc[0] == pytest.approx(0.06) and not inside["separated"].iloc[0]


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


def test_detectable_words_from_a_half_width():
    assert detectable_words(1.96, digits=2) == "the design detects differences of about ±2.80 with 80% power"
    assert detectable_words(0.0, n=30) == "every one of the 30 samples ties, so the design names no detectable effect"
    assert "±0.00" not in detectable_words(0.0, n=30) and "no interval" in detectable_words(float("nan"))
