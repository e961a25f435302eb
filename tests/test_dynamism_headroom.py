"""Claim 1 when the model cannot find the needle (issue 62, deviation of 2026-12-06): a seed none of whose
calibration answers passes Wu et al.'s ROUGE filter is scored without it and says so, and the NIAH headroom table
counts the answers that hold the UUID. Hand-built traces, no model."""
from __future__ import annotations

import pandas as pd
import torch

from factories import make_trace
from dynheads_tl.analysis.scoring import WU_FILTER, WU_UNFILTERED, static_retrieval_scores
from dynheads_tl.claims.dynamism import (DynamismConfig, analyse_task, niah_headroom, niah_headroom_sentence,
                                         static_stability)

PROMPT = [10, 11, 12, 30, 31, 32, 13, 14]  # the needle span [3, 6) holds tokens 30, 31, 32
UUID = "e3e70682-c209-4cac-a29f-6fbed82c07cd"


def _trace(head: int, response: str):
    """Two steps generating tokens 30, 31; ``head`` copies them from the needle, the other head reads position 0."""
    argmax = torch.zeros(2, 1, 2, dtype=torch.long)
    argmax[0, 0, head], argmax[1, 0, head] = 3, 4
    return make_trace([30, 31], argmax, prompt_ids=PROMPT, evidence_spans=[(3, 6)], answers=[UUID], response=response)


def test_a_seed_whose_calibration_never_passes_the_filter_is_scored_unfiltered_and_says_so():
    wrong = "The magic word is \"don't give information outside the document\""
    config = DynamismConfig()
    failed = analyse_task("niah", [_trace(0, wrong), _trace(1, wrong), _trace(1, wrong)], [_trace(1, wrong)], config, 0)
    assert (failed.static_filter, failed.n_passed) == (WU_UNFILTERED, 0)
    torch.testing.assert_close(failed.static_scores, static_retrieval_scores(failed.calibration, rouge_filter=None))
    assert failed.static_scores[0, 1] > failed.static_scores[0, 0] > 0  # head 1 copied in two of three samples
    assert failed.metrics["jaccard_static"] == 0.5  # D_t = {head 1} at both steps; S_20 holds both heads of two
    # one answer that passes: the filtered score as before, that sample alone
    passed = analyse_task("niah", [_trace(0, UUID), _trace(1, wrong)], [_trace(1, UUID)], config, 1)
    assert (passed.static_filter, passed.n_passed) == (WU_FILTER, 1)
    assert passed.static_scores[0, 0] > 0 and passed.static_scores[0, 1] == 0


def test_niah_headroom_counts_exact_uuids_and_gives_the_first_seed_a_wilson_interval():
    config, wrong = DynamismConfig(), "no idea"
    seeds = [analyse_task("niah", [_trace(0, wrong)] * 2, [_trace(0, UUID)] + [_trace(0, wrong)] * 19, config, 0),
             analyse_task("niah", [_trace(0, UUID), _trace(0, wrong)], [_trace(0, wrong)] * 20, config, 1)]
    frame = niah_headroom(seeds)
    assert frame[["seed", "correct", "n_analysis", "n_calibration", "n_passed"]].values.tolist() == [[0, 1, 20, 2, 0],
                                                                                                    [1, 0, 20, 2, 1]]
    assert frame["static_filter"].tolist() == [WU_UNFILTERED, WU_FILTER]
    first = frame.iloc[0]
    assert first.accuracy == 0.05 and 0.008 < first.low < 0.01 and 0.23 < first.high < 0.25  # Wilson 1/20
    assert frame.iloc[1][["low", "high"]].isna().all()  # the same layouts again: no second interval
    sentence = niah_headroom_sentence(frame)
    assert "1/20" in sentence and "0/20" in sentence and "0/2, 1/2" in sentence
    assert "on seed 0, whose Wu static scores are unfiltered" in sentence and "seeds 0, 1" not in sentence


def test_table1_headline_quotes_the_headroom_table_when_the_run_wrote_it(tmp_path):
    from test_site import _table1
    from dynheads_tl.report.status import item_status

    root = _table1(tmp_path, 0.47, 0.50, (0.03, 0.04), (0.05, 0.08))
    before = item_status(root, "Table 1")
    pd.DataFrame([{"seed": 0, "correct": 1, "n_analysis": 20, "accuracy": 0.05, "low": 0.009, "high": 0.236,
                   "n_calibration": 10, "n_passed": 0, "static_filter": WU_UNFILTERED}]).to_csv(
        next(root.glob("*/table1_intervals.csv")).parent / "niah_headroom.csv", index=False)
    after = item_status(root, "Table 1")
    assert after.status == before.status == "absent in this setting"  # the declared rule does not read headroom
    assert after.headline.startswith(before.headline) and "NIAH accuracy 1/20" in after.headline
    assert "seed 0" in after.headline and "unfiltered" in after.headline


def test_static_stability_reads_each_seed_under_its_own_filter_and_names_the_unfiltered_ones():
    config, wrong = DynamismConfig(), "no idea"
    unfiltered = analyse_task("niah", [_trace(0, wrong), _trace(1, wrong), _trace(1, wrong)], [_trace(1, wrong)],
                              config, 0)
    filtered = analyse_task("niah", [_trace(0, UUID), _trace(1, wrong), _trace(0, UUID)], [_trace(1, wrong)], config, 1)
    curve, pairs, sentence = static_stability([unfiltered, filtered], k=1, n_resamples=20)
    assert pairs[["seed_a", "seed_b"]].values.tolist() == [[0, 1]]  # the unfiltered seed is compared, not dropped
    assert pairs["n_a"].tolist() == [3] and pairs["n_b"].tolist() == [2]  # every sample of 0; the two that passed of 1
    assert sentence.endswith("Seed 0: no calibration answer passed Wu et al.'s ROUGE filter, so their terms are "
                             "unfiltered (every calibration sample).")
    assert "Seed" not in static_stability([filtered, filtered], k=1, n_resamples=20)[2]
