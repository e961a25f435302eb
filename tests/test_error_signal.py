"""Notebook 05's error signals: features on hand-built traces with known values, and the evaluation on planted
signals (separable -> AUROC near 1, shuffled labels -> near 0.5)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from dynheads_tl.analysis.classification import auroc, folds
from dynheads_tl.claims import error_signal as es
from dynheads_tl.engine.trace_data import Trace
import factories

PROMPT = [10, 11, 12, 13, 14, 15]
EVIDENCE = [(2, 5)]  # tokens 12, 13, 14


def make_trace(tokens, argmax_pos, *, evidence_mass=None, context_mass=None, generated_mass=None, support=None,
               logprob=None, entropy=None, hidden=None) -> Trace:
    steps = len(tokens)
    zeros = torch.zeros(steps, 2, 2)
    return factories.make_trace(tokens, argmax_pos, support, hidden=hidden, d_model=3, prompt_ids=PROMPT,
                                evidence_spans=EVIDENCE, meta={"context_span": [0, 6]},
                                evidence_mass=zeros.clone() if evidence_mass is None else evidence_mass,
                                context_mass=zeros.clone() if context_mass is None else context_mass,
                                generated_mass=zeros.clone() if generated_mass is None else generated_mass,
                                token_logprob=torch.zeros(steps) if logprob is None else logprob,
                                token_entropy=torch.zeros(steps) if entropy is None else entropy)


def known_trace() -> Trace:
    # Step 0 generates 12: heads (0,0) and (1,1) point at position 2 (token 12) -> D_0 = {0, 3}.
    # Step 1 generates 13: head (0,0) points at position 3 -> D_1 = {0}. Step 2 generates 99: nothing.
    argmax = [[[2, 0], [0, 2]], [[3, 0], [0, 0]], [[0, 0], [0, 0]]]
    mass = torch.tensor([[[0.8, 0.1], [0.0, 0.6]], [[0.9, 0.2], [0.1, 0.0]], [[0.0, 0.3], [0.0, 0.0]]])
    support = torch.tensor([[[0.5, 0.1], [0.2, 0.9]], [[0.4, 0.3], [0.1, 0.0]], [[0.0, 0.2], [0.0, 0.1]]])
    context = torch.full((3, 2, 2), 0.6)
    generated = torch.tensor([[[0.0, 0.0], [0.0, 0.0]], [[0.2, 0.1], [0.4, 0.3]], [[0.4, 0.2], [0.2, 0.0]]])
    return make_trace([12, 13, 99], argmax, evidence_mass=mass, support=support, context_mass=context,
                      generated_mass=generated, logprob=torch.tensor([-0.1, -0.5, -2.0]),
                      entropy=torch.tensor([0.2, 1.0, 3.0]))


def test_answer_features_on_a_hand_built_trace():
    trace = known_trace()
    f = es.answer_features(trace, torch.tensor([1]), probe=None)
    assert f["dt_size"] == pytest.approx(1.0)  # sizes 2, 1, 0
    assert f["dt_active_share"] == pytest.approx(2 / 3)
    assert f["dt_evidence_mass"] == pytest.approx(((0.8 + 0.6) / 2 + 0.9) / 2)
    assert f["static_evidence_mass"] == pytest.approx((0.1 + 0.2 + 0.3) / 3)
    assert f["active_set_entropy"] == pytest.approx(-(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3)))
    assert f["eq2_max"] == pytest.approx((0.9 + 0.4 + 0.2) / 3)
    assert f["eq2_top10"] == pytest.approx(float(trace.support_score.mean()))  # 4 heads < 10: every share
    assert f["probe_gap"] == 1.0  # no probe: a full miss
    assert (f["logprob_mean"], f["logprob_min"]) == (pytest.approx(-2.6 / 3), pytest.approx(-2.0))
    assert (f["entropy_mean"], f["entropy_max"]) == (pytest.approx(4.2 / 3), pytest.approx(3.0))
    # Context only: the context span [0, 6) holds the evidence, so the copy sets equal D_t here; masses are 0.6.
    assert (f["ctx_dt_size"], f["ctx_dt_active_share"]) == (pytest.approx(1.0), pytest.approx(2 / 3))
    assert f["ctx_dt_context_mass"] == pytest.approx(0.6) and f["ctx_static_context_mass"] == pytest.approx(0.6)
    trace.meta["context_span"] = [0, 3]  # position 3 (token 13) now lies outside: step 1's copy no longer counts
    assert es.context_copy_mask(trace).flatten(1).sum(1).tolist() == [2, 0, 0]


def test_lookback_ratio_by_hand():
    ratios = es.lookback_ratios(known_trace())
    ctx = 0.6 / 6  # mean attention per context token (6 context tokens)
    step1 = np.array([0.2, 0.1, 0.4, 0.3]) / 1  # one generated token at step 1
    step2 = np.array([0.4, 0.2, 0.2, 0.0]) / 2  # two at step 2
    expected = (ctx / (ctx + step1) + ctx / (ctx + step2)) / 2
    np.testing.assert_allclose(ratios, expected, rtol=1e-6)


class _Probe:
    def __init__(self, scores):
        self._scores = np.asarray(scores, dtype=float)

    def scores(self, trace):
        return self._scores


def test_probe_gap_is_size_matched():
    trace = known_trace()  # D_1 = {0}, D_2 empty (left out)
    assert es.probe_gap(trace, _Probe([[1, 0, 0, 0], [0, 0, 0, 1]])) == 0.0  # ranks head 0 first at step 1
    assert es.probe_gap(trace, _Probe([[0, 0, 0, 1], [1, 0, 0, 0]])) == 1.0  # ranks head 3 first
    empty = make_trace([99, 99], [[[0, 0], [0, 0]]] * 2)
    assert es.probe_gap(empty, _Probe([[1, 0, 0, 0]])) == 1.0  # nothing to predict: a full miss


def test_features_refuse_a_trace_without_signals():
    trace = known_trace()
    trace.evidence_mass = None
    with pytest.raises(ValueError, match="signals"):
        es.answer_features(trace, torch.tensor([0]), None)


def _planted(n: int, seed: int):
    """n traces: wrong answers have no Eq. 1 hit and a low kept-token log-probability; right ones copy."""
    rng = np.random.default_rng(seed)
    traces, labels = [], []
    for i in range(n):
        wrong = i % 2
        hit = [[[2, 0], [0, 0]], [[3, 0], [0, 0]]]
        argmax = [[[0, 0], [0, 0]]] * 2 if wrong else hit
        noise = lambda: torch.tensor(rng.uniform(0, 1, (2, 2, 2)), dtype=torch.float32)
        logprob = torch.tensor(rng.normal(-3.0 if wrong else -0.2, 0.1, 2), dtype=torch.float32)
        traces.append(make_trace([12, 13], argmax, evidence_mass=noise(), context_mass=noise(),
                                 generated_mass=noise(), support=noise(), logprob=logprob,
                                 hidden=torch.tensor(rng.normal(0, 1, (2, 3)), dtype=torch.float32)))
        labels.append(wrong)
    return traces, np.array(labels)


def test_planted_signal_reaches_auroc_near_one_and_shuffled_labels_near_half():
    traces, labels = _planted(120, seed=0)
    scores = es.out_of_fold_scores(traces, labels, static_k=2, n_folds=5, seed=0)
    for group in ("dynamic", "logit", "dynamic+logit"):
        assert auroc(labels, scores[group]) > 0.95, group
    assert abs(auroc(labels, scores["lookback"]) - 0.5) < 0.2  # the attention masses carry no signal here
    shuffled = np.random.default_rng(1).permutation(labels)
    null = es.out_of_fold_scores(traces, shuffled, static_k=2, n_folds=5, seed=0)
    for group in es.GROUPS:
        assert abs(auroc(shuffled, null[group]) - 0.5) < 0.2, group


def test_auroc_intervals_and_verdict_words():
    labels = np.array([0, 1] * 40)
    rng = np.random.default_rng(0)
    scores = {"dynamic": labels + rng.normal(0, 0.1, 80), "lookback": rng.normal(0, 1, 80),
              "logit": labels + rng.normal(0, 0.1, 80), "dynamic+logit": labels + rng.normal(0, 0.1, 80)}
    table = es.auroc_intervals(labels, scores, n_resamples=300)
    row = table.set_index("group")
    assert row.loc["dynamic", "auroc"] == 1.0 and row.loc["dynamic", "low"] > 0.95
    assert row.loc["lookback", "dynamic_minus_low"] > 0  # separated from the noise baseline
    comparisons = es.comparison_table(labels, scores, np.arange(80), n_resamples=300)
    text = es.verdict(table, comparisons)
    assert "beat the lookback ratio" in text and "p_adj < 0.001" in text
    # dynamic and logit both separate perfectly: no layout differs, so no sign test can reach 0.05
    assert "cannot be tested against the logit" in text and "Holm over the 1 testable secondary comparisons" in text
    assert "Lookback Lens (in-domain) 0.85-0.91" in text


def test_answer_in_context_string_match_by_hand():
    trace = make_trace([11, 12, 13, 99], [[[0, 0], [0, 0]]] * 4)  # the prompt (all context) is 10..15
    assert es.context_match_share(trace) == pytest.approx(3 / 4)  # 11 12 13 copied, 99 is not
    garbled = make_trace([12, 99, 14, 15], [[[0, 0], [0, 0]]] * 4)
    assert es.context_match_share(garbled) == pytest.approx(2 / 4)  # the longest copied run is 14 15
    assert es.untrained_scores([trace, garbled])["string_match"].tolist() == pytest.approx([0.25, 0.5])


def test_comparisons_leave_untestable_and_too_easy_scopes_out_of_holm():
    rng = np.random.default_rng(1)
    # setting A: 40 answers, 20 wrong, a detector that separates them; setting B: 40 answers, only 3 wrong
    labels = np.r_[np.tile([0, 1], 20), np.r_[np.ones(3), np.zeros(37)]].astype(int)
    settings = ["A"] * 40 + ["B"] * 40
    good = labels + rng.normal(0, 0.2, 80)
    scores = {"dynamic": good, "dynamic_ctx": good.copy(), "lookback": rng.normal(0, 1, 80),
              "logit": good.copy(), "string_match": rng.normal(0, 1, 80)}
    table = es.comparison_table(labels, scores, np.arange(80), settings, n_resamples=200)
    assert set(table["scope"]) == {"pooled", "A", "B"}
    assert not table[table["scope"] == "B"]["evaluable"].any() and table[table["scope"] == "B"]["p_adjusted"].isna().all()
    same = table[(table["a"] == "dynamic") & (table["b"] == "logit")]
    assert (same["a_better"] + same["b_better"] == 0).all() and not same["testable"].any()  # identical scores
    # the declared primary (pooled, context-only against the Lookback ratio) is tested alone; Holm runs over the rest
    family = table["evaluable"] & table["testable"] & ~table["primary"]
    raw = table.loc[family, "sign_p"].to_numpy()
    expected = np.minimum(1, np.maximum.accumulate(np.sort(raw) * np.arange(len(raw), 0, -1)))
    assert sorted(table.loc[family, "p_adjusted"]) == pytest.approx(expected.tolist())
    assert table["primary"].sum() == 1
    primary = table[table["primary"]].iloc[0]
    assert (primary["scope"], primary["a"], primary["b"]) == ("pooled", "dynamic_ctx", "lookback")
    assert primary["p_adjusted"] == primary["sign_p"]
    data = es.data_table({"A": ([make_trace([11], [[[0, 0], [0, 0]]])] * 40, labels[:40]),
                          "B": ([make_trace([11], [[[0, 0], [0, 0]]])] * 40, labels[40:])})
    assert data["too_easy"].tolist() == [False, True]
    text = es.verdict(es.auroc_intervals(labels, {**scores, "dynamic+logit": good}, n_resamples=100), table, data)
    assert "B has only 3 wrong answers of 40 (fewer than 10): too easy" in text
    assert text.count("Within A (n = 40, 20 wrong)") == 1  # the scope's sizes are stated once
    small = es.data_table({"C": ([make_trace([11], [[[0, 0], [0, 0]]])] * 5, np.ones(5))})
    assert es.difficulty_sentences(small) == ["C has 5 wrong and 0 right answers (fewer than 10 of each): too small "
                                              "to evaluate an error detector on its own; its within-setting "
                                              "comparisons are shown but not tested."]
    assert "Primary comparison (declared): pooled, the context-only dynamic-head features beat the lookback ratio" in text


@pytest.mark.parametrize("bad, match", [({"niah_settings": ["prose"]}, "haystack:context_tokens"),
                                        ({"niah_settings": [], "n_hotpot": 0}, "No pooled data"),
                                        ({"n_folds": 1}, "n_folds"), ({"hotpot_setting": "x"}, "hotpot_setting")])
def test_config_rejects_bad_parameters(bad, match):
    with pytest.raises(ValueError, match=match):
        es.ErrorSignalConfig(**bad)


def test_fold_fitting_never_sees_the_test_answers_and_groups_stay_together(monkeypatch):
    traces, labels = _planted(40, seed=2)
    for i, t in enumerate(traces):
        t.meta["seed"] = i // 2  # pairs of answers share a sample seed (as NIAH settings do)
    fitted = []
    from dynheads_tl.claims.error_signal import features

    real = features.static_heads
    monkeypatch.setattr(features, "static_heads",
                        lambda fit, k, **kw: fitted.append({id(t) for t in fit}) or real(fit, k, **kw))
    groups = es.answer_groups(traces)
    splits = folds(labels, 4, 0, groups=groups)
    for train, test in splits:
        assert not set(groups[train]) & set(groups[test])  # a pair is never split across train and test
    es.out_of_fold_scores(traces, labels, static_k=2, n_folds=4, seed=0)
    tests = [{id(traces[i]) for i in test} for _, test in splits]
    # every fit set misses at least one fold's test answers entirely: it was fitted without them
    assert fitted and all(any(not (f & t) for t in tests) for f in fitted)


def test_the_primary_is_read_from_the_preregistration_file():
    from dynheads_tl import preregistration
    from dynheads_tl.claims.error_signal.config import PRIMARY

    assert preregistration.primary("error_signal")["id"] == f"{PRIMARY[1]}_vs_{PRIMARY[2]}"


@pytest.mark.parametrize("difference, low, high, sign_p, wrong, status", [
    (0.10, 0.05, 0.15, 0.001, 32, "supported"),
    (0.01, 0.005, 0.015, 0.001, 32, "not supported"),  # separated, but within ±0.02: TOST says negligible
    (0.10, 0.05, 0.15, 0.08, 32, "undetermined"),  # the interval above 0, the exact test alone not below 0.05
    (-0.10, -0.15, -0.05, 0.001, 32, "not supported"),
    (-0.008, -0.051, 0.029, 0.38, 32, "undetermined"),  # the SmolLM2 run: cannot be told apart, not negligible
    (0.10, 0.05, 0.15, 0.001, 8, "no headroom")])
def test_beyond5_rule_on_hand_built_numbers(difference, low, high, sign_p, wrong, status):
    from dynheads_tl.claims.error_signal.report import error_rule

    row = pd.Series({"difference": difference, "low": low, "high": high, "sign_p": sign_p, "wrong": wrong,
                     "right": 72})
    assert error_rule(row, sesoi=0.02, alpha=0.05, min_per_class=10) == status


@pytest.mark.parametrize("wrong", [12, 13, 0])
def test_too_few_of_one_class_scores_nothing_trained_and_the_verdict_says_so_instead_of_failing(wrong):
    # 12 wrong and 1 right, or one class only: no fold can hold both classes on both sides (the real dev set at a
    # smoke preset's n)
    traces, _ = _planted(13, seed=0)
    labels = np.array([1] * wrong + [0] * (13 - wrong))
    names = ["NIAH prose 300"] * 13
    scores = es.out_of_fold_scores(traces, labels, static_k=2, n_folds=5, seed=0, settings=names)
    assert all(np.isnan(scores[group]).all() for group in es.POOLED_GROUPS)
    assert np.isfinite(scores["string_match"]).all()  # an untrained detector is scored as always
    groups = es.answer_groups(traces)
    table = es.auroc_intervals(labels, scores, groups=groups, n_resamples=100)
    comparisons = es.comparison_table(labels, scores, groups, names, n_resamples=100)
    # every pooled comparison keeps its row and counts (the headroom rule reads them); an unscored side is not tested
    assert len(comparisons) == len(es.COMPARISONS) and (comparisons["scope"] == "pooled").all()
    assert (comparisons["wrong"] == wrong).all() and (comparisons["right"] == 13 - wrong).all()
    unscored = comparisons[comparisons["a"].isin(es.POOLED_GROUPS) | comparisons["b"].isin(es.POOLED_GROUPS)]
    assert unscored["difference"].isna().all() and unscored["sign_p"].isna().all()
    assert (unscored["a_better"] == 0).all() and (unscored["b_better"] == 0).all()
    assert not comparisons["separated"].any() and not comparisons["evaluable"].any()
    assert set(es.roc_points(labels, scores)["group"]) <= {"string_match"}
    text = es.verdict(table, comparisons)
    assert "Dynamic-head features (knowing the evidence) not scored (too few of one class to train on)" in text
    row = comparisons.set_index(["scope", "a", "b"]).loc[("pooled", "dynamic_ctx", "lookback")]
    from dynheads_tl.claims.error_signal.report import error_rule

    assert error_rule(row, sesoi=0.02, alpha=0.05, min_per_class=10) == "no headroom"
