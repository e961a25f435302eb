"""Eq. 1, Eq. 2, Wu's static score and Table 1's metrics on hand-built traces."""
from __future__ import annotations

import logging
import math

import pytest
import torch

from factories import make_trace
from dynheads_tl.analysis.scoring import (
    activation_frequency, calibrate_chance_factor, distinct_heads_curve, dynamic_sets, dynamism_metrics, eq2_rule_curve,
    jaccard, static_retrieval_scores, static_top_k, wu_static_scores, WU_FILTER, WU_UNFILTERED,
)
from dynheads_tl.engine.equations import Eq2Rule
from dynheads_tl.tasks.metrics import rouge1_recall, rouge_l


def hand_trace(argmax_pos, tokens, prompt_ids, span, response="the magic word is abc", scores=None,
               answer="abc"):
    return make_trace(tokens, argmax_pos, scores, prompt_ids=prompt_ids, evidence_spans=[span], answers=[answer],
                      response=response, meta={"needle_text": f"the magic word is {answer}"})


# prompt: positions 0..7, needle span [3, 6) holds tokens 30, 31, 32
PROMPT = [10, 11, 12, 30, 31, 32, 13, 14]


def test_eq1_known_answer():
    # 2 steps, 1 layer, 3 heads; generated tokens 30 then 31.
    argmax = [[[3, 4, 0]],   # step 0: head0 -> pos3 (tok 30 == gen 30): yes; head1 -> pos4 (31 != 30): no
              [[4, 6, 8]]]   # step 1: head0 -> pos4 (31 == 31): yes; head1 -> pos6 outside needle; head2 -> pos8 (generated)
    trace = hand_trace(argmax, [30, 31], PROMPT, (3, 6))
    assert trace.retrieval_mask.tolist() == [[[True, False, False]], [[True, False, False]]]


def test_eq1_token_outside_span_does_not_count():
    # Token 31 also occurs outside the needle (position 7): pointing there is not retrieval.
    prompt = [10, 11, 12, 30, 31, 32, 13, 31]
    trace = hand_trace([[[7, 4]]], [31], prompt, (3, 6))
    assert trace.retrieval_mask.tolist() == [[[False, True]]]


def test_eq2_threshold():
    scores = [[[0.05, 0.2]], [[0.5, 0.1]]]
    trace = hand_trace([[[0, 0]], [[0, 0]]], [1, 2], PROMPT, (3, 6), scores=scores)
    assert dynamic_sets(trace, "eq2", threshold=0.1).tolist() == [[[False, True]], [[True, False]]]
    with pytest.raises(ValueError, match="kind"):
        dynamic_sets(trace, "eq3")


def _eq2_trace(scores):
    # sink 1, window 2: step 0 sees 8 keys, eligible [1, 6) = 5 positions, 3 of them evidence -> chance 0.6;
    # step 1 sees 9 keys, eligible [1, 7) = 6 positions -> chance 0.5.
    trace = hand_trace([[[0, 0]], [[0, 0]]], [1, 2], PROMPT, (3, 6), scores=scores)
    trace.config = {"sink_tokens": 1, "local_window": 2}
    return trace


def test_eq2_chance_rule_on_hand_built_scores():
    trace = _eq2_trace([[[0.65, 0.9]], [[0.55, 0.7]]])
    torch.testing.assert_close(trace.eq2_chance, torch.tensor([0.6, 0.5]))
    # c = 1.2: cutoffs 0.72 and 0.60
    assert dynamic_sets(trace, "eq2", Eq2Rule("chance", 1.2)).tolist() == [[[False, True]], [[False, True]]]
    # c = 1.0: cutoffs 0.60 and 0.50
    assert dynamic_sets(trace, "eq2", Eq2Rule("chance", 1.0)).tolist() == [[[True, True]], [[True, True]]]
    # the fixed rule ignores chance: 0.6 everywhere
    assert dynamic_sets(trace, "eq2", Eq2Rule("fixed", 0.6)).tolist() == [[[True, True]], [[False, True]]]
    with pytest.raises(ValueError, match="kind"):
        Eq2Rule("median", 1.0)


def test_chance_factor_is_the_placebo_quantile():
    placebo = _eq2_trace([[[0.65, 0.9]], [[0.55, 0.7]]])
    # share / chance: 0.65/0.6, 0.9/0.6 = 1.5, 0.55/0.5 = 1.1, 0.7/0.5 = 1.4 -> median (linear) 1.25
    assert calibrate_chance_factor([placebo], false_rate=0.5) == pytest.approx(1.25)
    assert calibrate_chance_factor([placebo], false_rate=0.01) == pytest.approx(1.5, abs=0.01)
    with pytest.raises(ValueError, match="strictly between"):
        calibrate_chance_factor([placebo], false_rate=0.0)
    real = _eq2_trace([[[0.9, 0.9]], [[0.9, 0.1]]])
    curve = eq2_rule_curve([real], [placebo], [1.0, 1.25])
    # factor 1.25: real ratios 1.5, 1.5, 1.8, 0.2 -> 3 of 4 marked; placebo 1.5 and 1.4 -> 2 of 4
    assert curve.loc[1, "real_rate"] == pytest.approx(0.75) and curve.loc[1, "placebo_rate"] == pytest.approx(0.5)
    assert curve.loc[1, "heads_per_step"] == pytest.approx(1.5) and curve.loc[1, "heads_ever_active"] == 2


def test_the_real_to_placebo_ratio_pairs_each_question_with_its_own_placebo():
    from dynheads_tl.analysis.scoring import eq2_placebo_ratio

    placebo = _eq2_trace([[[0.65, 0.9]], [[0.55, 0.7]]])  # at 1.25: 2 of 4 head-steps marked
    real = _eq2_trace([[[0.9, 0.9]], [[0.9, 0.1]]])       # at 1.25: 3 of 4
    same = eq2_placebo_ratio([real, real], [placebo, placebo], 1.25, n_resamples=200)
    assert same.estimate == pytest.approx(1.5) and same.n == 2 and same.method == "degenerate"
    # a question whose real spans are marked no more than its placebo ones pulls the interval down to 1
    flat = _eq2_trace([[[0.65, 0.9]], [[0.55, 0.7]]])
    mixed = eq2_placebo_ratio([real, flat, real, flat], [placebo] * 4, 1.25, n_resamples=500)
    assert mixed.estimate == pytest.approx(1.25) and mixed.low <= 1.0 + 1e-9 < mixed.estimate < mixed.high <= 1.5 + 1e-9
    # never-marked placebo spans leave the ratio undefined rather than infinite
    assert math.isnan(eq2_placebo_ratio([real], [_eq2_trace([[[0.1, 0.1]], [[0.1, 0.1]]])], 1.25).estimate)
    with pytest.raises(ValueError, match="one placebo trace per real trace"):
        eq2_placebo_ratio([real], [], 1.25)


def test_wu_static_score_known_answer():
    # Sample A: head0 retrieves at both steps -> 2/3; head1 never. Sample B: head1 once -> 1/3.
    a = hand_trace([[[3, 0]], [[4, 0]]], [30, 31], PROMPT, (3, 6))
    b = hand_trace([[[0, 3]], [[0, 0]]], [30, 31], PROMPT, (3, 6))
    scores = static_retrieval_scores([a, b], rouge_filter=None)
    torch.testing.assert_close(scores, torch.tensor([[1 / 3, 1 / 6]]))
    # The ROUGE filter drops a failed sample entirely.
    b_failed = hand_trace([[[0, 3]], [[0, 0]]], [30, 31], PROMPT, (3, 6), response="no idea")
    torch.testing.assert_close(static_retrieval_scores([a, b_failed]), torch.tensor([[2 / 3, 0.0]]))
    with pytest.raises(ValueError, match="ROUGE"):
        static_retrieval_scores([b_failed])


def test_wu_scores_keep_the_filter_and_fall_back_to_every_sample_only_when_none_passes(caplog):
    a = hand_trace([[[3, 0]], [[4, 0]]], [30, 31], PROMPT, (3, 6))
    b_failed = hand_trace([[[0, 3]], [[0, 0]]], [30, 31], PROMPT, (3, 6), response="no idea")
    with caplog.at_level(logging.WARNING, logger="dynheads_tl.analysis.scoring"):
        kept = wu_static_scores([a, b_failed])  # one passes: exactly the filtered score, the failed sample left out
    assert not caplog.records  # the filter held: nothing to warn about
    assert (kept.filter, kept.n_passed, kept.n_kept, kept.n_calibration, kept.filtered) == (WU_FILTER, 1, 1, 2, True)
    torch.testing.assert_close(kept.scores, static_retrieval_scores([a, b_failed]))
    c_failed = hand_trace([[[3, 0]], [[0, 0]]], [30, 31], PROMPT, (3, 6), response="no idea")
    with caplog.at_level(logging.WARNING, logger="dynheads_tl.analysis.scoring"):
        none = wu_static_scores([b_failed, c_failed], "NIAH calibration, seed 7")  # none passes: every sample counts
    assert [r.getMessage() for r in caplog.records] == [  # and the filter says so, once, naming the split
        "NIAH calibration, seed 7: none of 2 answers passed Wu et al.'s ROUGE filter; the static heads are ranked by "
        "unfiltered scores."]
    assert (none.filter, none.n_passed, none.n_kept, none.filtered) == (WU_UNFILTERED, 0, 2, False)
    torch.testing.assert_close(none.scores, torch.tensor([[1 / 6, 1 / 6]]))


UUID = "e3e70682-c209-4cac-a29f-6fbed82c07cd"  # NiahConfig(seed=0)'s answer
NEEDLE = f"The magic word is {UUID}."
WRONG = "The magic word is 1234-5678."


def test_rouge_matches_rouge_score_library():
    # rouge-score lower-cases and splits at every non-alphanumeric, so the UUID is five tokens
    # (e3e70682 c209 4cac a29f 6fbed82c07cd), the needle nine and WRONG six (the magic word is 1234 5678).
    # Wu et al. compare against the answer (their real_needle): WRONG shares none of its tokens, the
    # bare UUID all five. (The old hand-written recall, which dropped punctuation and articles without
    # splitting, gave 0.75 and 0.25 against the needle: the wrong answer passed, the right one did not.)
    assert rouge1_recall(WRONG, UUID) == 0.0
    assert rouge1_recall(UUID, UUID) == 1.0
    assert rouge1_recall(f"The magic word is {UUID}.", UUID) == 1.0
    # Against the whole needle sentence: 4/9 (the, magic, word, is) and 5/9 (the UUID's tokens).
    assert rouge1_recall(WRONG, NEEDLE) == pytest.approx(4 / 9)
    assert rouge1_recall(UUID, NEEDLE) == pytest.approx(5 / 9)
    # ROUGE-L F: longest common subsequence 4 of 6 predicted and 9 reference tokens.
    assert rouge_l(WRONG, NEEDLE) == pytest.approx(2 * (4 / 6) * (4 / 9) / (4 / 6 + 4 / 9))
    # The Porter stemmer (words over 3 letters) matches inflections, as in Wu et al.'s scorer.
    assert rouge1_recall("walking parks", "walked park") == 1.0


def test_wu_filter_keeps_the_bare_uuid_and_drops_a_wrong_answer():
    argmax = [[[3, 0]], [[4, 0]]]  # head0 retrieves at both steps: 2/3 for a kept sample
    wrong = hand_trace(argmax, [30, 31], PROMPT, (3, 6), response=WRONG, answer=UUID)
    bare = hand_trace([[[0, 3]], [[0, 0]]], [30, 31], PROMPT, (3, 6), response=UUID, answer=UUID)
    torch.testing.assert_close(static_retrieval_scores([wrong, bare]), torch.tensor([[0.0, 1 / 3]]))
    with pytest.raises(ValueError, match="ROUGE"):
        static_retrieval_scores([wrong])


def test_static_top_k_and_jaccard():
    scores = torch.tensor([[0.1, 0.9, 0.3], [0.8, 0.0, 0.5]])
    top2 = static_top_k(scores, 2)
    assert top2.tolist() == [[False, True, False], [True, False, False]]
    with pytest.raises(ValueError):
        static_top_k(scores, 7)
    a = torch.tensor([True, True, False, False])
    b = torch.tensor([False, True, True, False])
    assert jaccard(a, b) == pytest.approx(1 / 3)
    assert math.isnan(jaccard(torch.zeros(3, dtype=torch.bool), torch.zeros(3, dtype=torch.bool)))


def test_dynamism_metrics_known_answer():
    # 4 heads as [1, 4]; static set = heads {0, 1}.
    static = torch.tensor([[True, True, False, False]])
    sets = torch.tensor([
        [[True, False, False, False]],   # D0 = {0}: J(static) = 1/2
        [[False, False, True, False]],   # D1 = {2}: J = 0; J(D0, D1) = 0
        [[False, False, False, False]],  # empty: skipped for J(static); J(D1, D2) = 0
        [[False, False, True, True]],    # D3 = {2, 3}: J = 0; J(D2, D3) = 0
    ])
    m = dynamism_metrics([sets], static)
    assert m["jaccard_static"] == pytest.approx((0.5 + 0 + 0) / 3)
    assert m["jaccard_adjacent"] == pytest.approx(0.0)
    # activation counts: head0 1, head2 2, head3 1 -> p = 1/4, 1/2, 1/4
    assert m["entropy"] == pytest.approx(-(0.25 * math.log(0.25) * 2 + 0.5 * math.log(0.5)))
    assert m["heads_per_step_mean"] == pytest.approx(1.0)
    assert m["heads_per_step_sd"] == pytest.approx(math.sqrt(((0) ** 2 * 2 + 1 + 1) / 4))
    assert m["ever_active"] == 3 and m["n_heads"] == 4


def test_uniform_top20_entropy_is_ln20():
    sets = torch.zeros(20, 1, 40, dtype=torch.bool)
    for t in range(20):
        sets[t, 0, t] = True
    m = dynamism_metrics([sets], torch.zeros(1, 40, dtype=torch.bool))
    assert m["entropy"] == pytest.approx(math.log(20))
    assert m["jaccard_static"] == 0.0


def test_long_tail_helpers():
    sets = torch.tensor([[[True, False, False]], [[True, True, False]]])
    torch.testing.assert_close(activation_frequency([sets]), torch.tensor([[1.0, 0.5, 0.0]]))
    assert distinct_heads_curve([sets, sets]) == [1, 2, 2, 2]


# --- size-aware overlap with the static set -------------------------------------------------------
def test_size_aware_metrics_on_hand_built_sets():
    from dynheads_tl.analysis.scoring import size_aware_counts, size_aware_metrics

    static = torch.zeros(2, 5, dtype=torch.bool)
    static[0, :4] = True  # S_4 = L0H0..L0H3
    sets = torch.zeros(3, 2, 5, dtype=torch.bool)
    sets[0, 0, :2] = True            # D ⊂ S, |D| = 2: coverage 1, J = 2/4 = its bound
    sets[1, 0, 0] = True             # D ⊂ S, |D| = 1: coverage 1, J = 1/4 = its bound
    sets[2, 1, 0] = True             # D outside S: coverage 0, J = 0, bound 1/4
    counts = size_aware_counts(sets, static)
    assert counts["steps"] == 3 and counts["activations"] == 4 and counts["inside"] == 3
    assert counts["coverage_sum"] == pytest.approx(2.0)
    assert counts["jaccard_sum"] == pytest.approx(0.75) and counts["bound_sum"] == pytest.approx(1.0)
    assert counts["normalised_sum"] == pytest.approx(2.0)  # 1 + 1 + 0
    rows = {r["metric"]: r for r in size_aware_metrics([counts, counts])}
    assert rows["static_coverage"]["value"] == pytest.approx(2 / 3)
    assert rows["jaccard_over_bound"]["value"] == pytest.approx(2 / 3)
    assert rows["share_inside_static"]["value"] == pytest.approx(0.75)
    assert rows["share_outside_static"]["value"] == pytest.approx(0.25)
    # Two identical samples: the bootstrap has nothing to vary.
    assert rows["static_coverage"]["low"] == pytest.approx(rows["static_coverage"]["high"])


def test_a_subset_of_the_static_set_has_coverage_one_and_jaccard_at_its_bound():
    from dynheads_tl.analysis.scoring import size_aware_counts, size_aware_metrics

    rng = torch.Generator().manual_seed(0)
    static = torch.zeros(4, 6, dtype=torch.bool)
    static.view(-1)[:20] = True
    samples = []
    for _ in range(5):
        sets = torch.zeros(8, 4, 6, dtype=torch.bool)
        for t in range(8):
            chosen = torch.randperm(20, generator=rng)[: int(torch.randint(1, 6, (1,), generator=rng))]
            sets[t].view(-1)[chosen] = True
        samples.append(size_aware_counts(sets, static))
    rows = {r["metric"]: r for r in size_aware_metrics(samples)}
    assert rows["static_coverage"]["value"] == pytest.approx(1.0)
    assert rows["jaccard_over_bound"]["value"] == pytest.approx(1.0)
    assert rows["share_outside_static"]["value"] == pytest.approx(0.0)
    assert rows["jaccard_static"]["value"] == pytest.approx(rows["jaccard_bound"]["value"])
    assert rows["jaccard_static"]["value"] < 0.3  # low, from set sizes alone


def test_size_aware_verdict_reads_the_interval_of_the_outside_share():
    import pandas as pd

    from dynheads_tl.claims.dynamism import size_aware_verdict

    def table(value, low, high):
        rows = [{"task": "niah", "static_k": 20, "metric": m, "value": 0.5, "low": 0.4, "high": 0.6, "n_samples": 60}
                for m in ("jaccard_static", "jaccard_bound", "jaccard_over_bound", "static_coverage")]
        rows.append({"task": "niah", "static_k": 20, "metric": "share_outside_static", "value": value, "low": low,
                     "high": high, "n_samples": 60})
        return pd.DataFrame(rows)

    assert "stays inside the static top-20" in size_aware_verdict(table(0.03, 0.02, 0.05))
    assert "substantial share" in size_aware_verdict(table(0.4, 0.3, 0.5))
    assert "mostly, but not only" in size_aware_verdict(table(0.2, 0.1, 0.3))
    assert "do not determine" in size_aware_verdict(table(0.6, 0.2, 1.0))
    assert "undefined" in size_aware_verdict(table(float("nan"), float("nan"), float("nan")))


def test_size_aware_verdict_states_both_static_sets_the_query_focused_one_first():
    """With the query-focused rows, the "So" sentence carries both readings (the README quotes it): here D_t stays
    inside Wu et al.'s S_20 (0.036 outside) but a substantial share leaves the query-focused one (0.287)."""
    import re

    import pandas as pd

    from dynheads_tl.claims.dynamism import size_aware_verdict

    def table(value, low, high, baseline=None):
        rows = [{"task": "niah", "static_k": 20, "metric": m, "value": 0.5, "low": 0.4, "high": 0.6, "n_samples": 60}
                for m in ("jaccard_static", "jaccard_bound", "jaccard_over_bound", "static_coverage")]
        rows.append({"task": "niah", "static_k": 20, "metric": "share_outside_static", "value": value, "low": low,
                     "high": high, "n_samples": 60})
        return pd.DataFrame(rows).assign(**({"baseline": baseline} if baseline else {}))

    text = size_aware_verdict(table(0.036, 0.03, 0.042), query_focused=table(0.287, 0.279, 0.296, "query_focused"))
    assert text.startswith("NIAH: 0.287 [0.279, 0.296] of all Eq. 1 activations fall outside the query-focused static "
                           "top-20")
    so = re.search(r"So (.*)$", text).group(1)
    assert so.startswith("a substantial share of retrieval happens outside the query-focused static top-20, and "
                         "retrieval stays inside Wu et al.'s static top-20")
    assert "0.036 [0.030, 0.042] outside Wu et al.'s static top-20" in text
    # Without a query-focused row at this size (or with an undefined one), the sentence is Wu's alone.
    alone = size_aware_verdict(table(0.036, 0.03, 0.042), query_focused=table(float("nan"), float("nan"), float("nan")))
    assert alone == size_aware_verdict(table(0.036, 0.03, 0.042)) and "query-focused" not in alone


def test_copy_and_evidence_mass_on_a_hand_built_trace():
    from dynheads_tl.analysis.scoring import adjacent_counts, copy_mass, evidence_mass, head_churn_counts, soft_sets

    # Needle [3, 6) holds tokens 30, 31, 32. 2 steps, 1 layer, 2 heads; attention on the 3 needle positions.
    attention = torch.tensor([[[[0.6, 0.1, 0.1], [0.05, 0.05, 0.0]]],   # step 0 (generates 30)
                              [[[0.3, 0.2, 0.4], [0.0, 0.7, 0.0]]]])    # step 1 (generates 31)
    trace = hand_trace([[[3, 0]], [[5, 4]]], [30, 31], PROMPT, (3, 6))
    trace.evidence_attention = attention.half()
    assert torch.allclose(evidence_mass(trace), torch.tensor([[[0.8, 0.1]], [[0.9, 0.7]]]), atol=1e-3)
    # Copy mass: only the needle position holding the generated token (30 at step 0, 31 at step 1).
    assert torch.allclose(copy_mass(trace), torch.tensor([[[0.6, 0.05]], [[0.2, 0.7]]]), atol=1e-3)
    # Head 0 reads the needle at both steps but its argmax leaves the copied token at step 1 (Eq. 1 churn).
    assert trace.retrieval_mask.tolist() == [[[True, False]], [[False, True]]]
    assert soft_sets(trace, "evidence", 0.5).tolist() == [[[True, False]], [[True, True]]]
    assert soft_sets(trace, "copy", 0.5).tolist() == [[[True, False]], [[False, True]]]
    churn = head_churn_counts(trace.retrieval_mask, soft_sets(trace, "evidence", 0.5))
    assert churn == {"drops": 1.0, "drops_still_reading": 1.0}
    eq1 = adjacent_counts(trace.retrieval_mask)
    assert eq1["pairs"] == 1 and eq1["jaccard_sum"] == 0.0 and eq1["kept"] == 0 and eq1["ever"] == 2
    readers = adjacent_counts(soft_sets(trace, "evidence", 0.5))
    assert readers["jaccard_sum"] == pytest.approx(0.5) and readers["kept"] == 1 and readers["left"] == 1
    with pytest.raises(ValueError, match="evidence attention"):
        copy_mass(hand_trace([[[3, 0]]], [30], PROMPT, (3, 6)))
    with pytest.raises(ValueError, match="threshold"):
        soft_sets(trace, "copy", 1.5)


def _soft_frames(eq1, readers, copy, still):
    import pandas as pd

    rows = [{"setting": "all", "metric": "jaccard_adjacent", "kind": kind, "threshold": t, "value": v, "low": lo,
             "high": hi, "n_samples": 40} for kind, t, (v, lo, hi) in
            (("eq1", None, eq1), ("evidence", 0.3, readers), ("copy", 0.3, copy))]
    churn = [{"setting": "all", "kind": "evidence", "threshold": 0.3, "drops": 100, "share": still[0],
              "low": still[1], "high": still[2], "n_samples": 40}]
    return pd.DataFrame(rows), pd.DataFrame(churn)


@pytest.mark.parametrize("readers, expected", [
    ((0.85, 0.80, 0.90), "mostly only the argmax winner changes"),
    ((0.71, 0.50, 0.90), "both change"),  # a high estimate, but the lower bound is below 0.7
    ((0.60, 0.55, 0.65), "both change"),
    ((0.42, 0.35, 0.50), "cannot tell"),
    ((0.20, 0.15, 0.25), "changes more from step to step than the Eq. 1 set"),
])
def test_soft_verdict_reads_the_intervals(readers, expected):
    from dynheads_tl.claims.dynamism import soft_verdict

    table, churn = _soft_frames((0.40, 0.35, 0.45), readers, (0.5, 0.4, 0.6), (0.7, 0.6, 0.8))
    sentence = soft_verdict(table, churn, 0.3)
    assert expected in sentence and "0.40 [0.35, 0.45]" in sentence and "40 analysis samples" in sentence
    assert "not an artefact" not in sentence
    assert "holds at every evidence-mass threshold tested (0.3)" in sentence


def test_soft_verdict_says_when_the_reading_depends_on_the_threshold():
    import pandas as pd

    from dynheads_tl.claims.dynamism import soft_verdict

    table, churn = _soft_frames((0.40, 0.35, 0.45), (0.60, 0.55, 0.65), (0.5, 0.4, 0.6), (0.7, 0.6, 0.8))
    other = {"setting": "all", "metric": "jaccard_adjacent", "kind": "evidence", "threshold": 0.5, "value": 0.42,
             "low": 0.36, "high": 0.48, "n_samples": 40}
    sentence = soft_verdict(pd.concat([table, pd.DataFrame([other])], ignore_index=True), churn, 0.3)
    assert "both change" in sentence and "At other thresholds the reading differs: > 0.5: these samples cannot tell" in sentence


def test_steps_whose_token_is_not_in_the_needle_are_left_out_of_soft_comparisons():
    from dynheads_tl.analysis.scoring import adjacent_counts, copyable_steps, head_churn_counts, soft_sets

    # Step 2 generates 99 (not in the needle, e.g. the end of the answer): Eq. 1 is empty there by definition.
    attention = torch.tensor([[[[0.6, 0.1, 0.1]]], [[[0.1, 0.7, 0.0]]], [[[0.5, 0.3, 0.1]]]])
    trace = hand_trace([[[3]], [[4]], [[4]]], [30, 31, 99], PROMPT, (3, 6))
    trace.evidence_attention = attention.half()
    valid = copyable_steps(trace)
    assert valid.tolist() == [True, True, False]
    hits, reads = trace.retrieval_mask, soft_sets(trace, "evidence", 0.5)
    assert hits.flatten().tolist() == [True, True, False] and reads.flatten().tolist() == [True, True, True]
    assert head_churn_counts(hits, reads) == {"drops": 1.0, "drops_still_reading": 1.0}
    assert head_churn_counts(hits, reads, valid) == {"drops": 0.0, "drops_still_reading": 0.0}
    assert adjacent_counts(hits)["pairs"] == 2 and adjacent_counts(hits, valid)["pairs"] == 1
    assert adjacent_counts(reads, valid)["steps"] == 2 and adjacent_counts(reads, valid)["jaccard_sum"] == 1.0
