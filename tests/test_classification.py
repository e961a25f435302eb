"""Generic classification statistics (:mod:`dynheads_tl.analysis.classification`): AUROC against scikit-learn, the
placement shares that sum to it, cluster-bootstrap draws, and folds that need both classes."""
from __future__ import annotations

import numpy as np
import pytest

from dynheads_tl.analysis import classification as cl


def test_auroc_equals_scikit_learn_with_ties():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(3)
    labels = rng.integers(0, 2, 200)
    scores = np.round(rng.normal(labels * 0.5, 1.0), 1)  # rounded: many ties
    assert cl.auroc(labels, scores) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)
    assert np.isnan(cl.auroc(np.zeros(5), np.arange(5)))


def test_placement_shares_sum_to_the_auroc_by_hand():
    # wrong answers score 0.9 and 0.4, right ones 0.5 and 0.1: of the 4 (wrong, right) pairs, 3 are ordered -> 0.75.
    labels, scores = np.array([1, 1, 0, 0]), np.array([0.9, 0.4, 0.5, 0.1])
    groups, shares = cl.placement_contributions(labels, scores, np.array(["a", "b", "a", "b"]))
    # wrong 0.9 outscores both right answers (1/(2*2) each... placement 1 -> 1/4), wrong 0.4 one of two (1/8);
    # right 0.5 is outscored by one wrong (1/8), right 0.1 by both (1/4)
    assert groups.tolist() == ["a", "b"] and shares.tolist() == pytest.approx([0.25 + 0.125, 0.125 + 0.25])
    assert shares.sum() == pytest.approx(cl.auroc(labels, scores)) == pytest.approx(0.75)


def test_folds_need_both_classes():
    with pytest.raises(ValueError, match="2 right and 2 wrong"):
        cl.folds(np.array([0, 0, 0, 1]), 5, 0)
    assert len(cl.folds(np.array([0, 1] * 3), 5, 0)) == 3  # capped by the smaller class


def test_cluster_bootstrap_draws_whole_groups_and_skips_one_class_resamples():
    labels = np.array([1, 1, 0, 0, 1, 0])
    groups = np.array(["a", "a", "b", "b", "c", "c"])
    members = [np.flatnonzero(groups == g) for g in ("a", "b", "c")]
    for index in cl.cluster_resamples(labels, members, seed=0, n_resamples=50):
        assert 0 < labels[index].sum() < len(index)  # both classes in every kept resample
        assert all(set(np.flatnonzero(groups == groups[i])) <= set(index) for i in index)  # whole groups only
    scores = {"perfect": labels.astype(float), "flipped": 1.0 - labels}
    draws = cl.bootstrap_aurocs(labels, scores, groups, seed=0, n_resamples=50)
    assert set(draws["perfect"]) == {1.0} and set(draws["flipped"]) == {0.0}
    paired = cl.paired_auroc_draws(labels, scores, groups, [("perfect", "flipped")], seed=0, n_resamples=50)
    assert len(paired[("perfect", "flipped")]) == len(draws["perfect"]) and set(paired[("perfect", "flipped")]) == {1.0}
    assert np.isnan(cl.quantile(np.array([]), 0.5))
