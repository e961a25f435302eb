"""QRHead-style query-focused head scores (issue #31): the hooked TransformerLens computation equals an independent
plain-transformers one (eager attention, output_attentions=True) on a tiny random Llama, and the outlier rule and the
null-query calibration on hand-built attention."""
from __future__ import annotations

import pytest
import torch

import dynheads_tl
from conftest import build_tiny_model
from dynheads_tl.analysis.query_focus import (NULL_QUERY, calibrated_document_score, null_query_prompt, query_attention,
                                              query_focused_scores)
from dynheads_tl.engine.decoder import prefill_context
from dynheads_tl.engine.models import model_identity
from dynheads_tl.store import result_path
from dynheads_tl.tasks.common import prompt_digest
from dynheads_tl.tasks import make_niah_samples


def test_calibration_and_outlier_rule_by_hand():
    # one layer, one head, 6 positions; the gold span [1, 5) holds 4 tokens
    real = torch.tensor([[[0.1, 0.25, 0.50, 0.25, 0.50, 0.0]]], dtype=torch.float64)
    null = torch.tensor([[[0.1, 0.05, 0.10, 0.05, 0.10, 0.0]]], dtype=torch.float64)
    # calibrated 0.2, 0.4, 0.2, 0.4: mean 0.3, sample sd 0.115, threshold 0.069: all kept, sum 1.2
    assert calibrated_document_score(real, null, [(1, 5)]).item() == pytest.approx(1.2)
    # QRHead's rule is strict (> mean - 2 sd): a constant span (sd 0) keeps nothing
    assert calibrated_document_score(torch.full((1, 1, 4), 0.5, dtype=torch.float64), torch.zeros(1, 1, 4, dtype=torch.float64),
                                     [(0, 4)]).item() == 0.0
    # one very negative token among many equal ones falls below mean - 2 sd and is dropped
    real = torch.zeros(1, 1, 12)
    real[..., :11], real[..., 11] = 0.5, -5.0
    kept = calibrated_document_score(real, torch.zeros(1, 1, 12), [(0, 12)])
    assert kept.item() == pytest.approx(11 * 0.5)
    with pytest.raises(ValueError, match="shared prompt prefix"):
        calibrated_document_score(real, torch.zeros(1, 1, 12), [(5, 20)])


def test_hooked_scores_equal_an_independent_transformers_computation(tmp_path):
    from transformers import AutoModelForCausalLM

    folder = build_tiny_model("llama", tmp_path / "llama")
    bridge = dynheads_tl.load_model(str(folder), device="cpu", dtype="float32")
    hf = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", torch_dtype=torch.float32).eval()
    samples = make_niah_samples(bridge.tokenizer, n=2, context_tokens=120, seed=0, max_tokens=512)
    ours = query_focused_scores(bridge, samples)
    assert ours.shape == (2, 2, 4)
    for sample, score in zip(samples, ours):
        real_ids, null_ids, start = null_query_prompt(bridge.tokenizer, sample.prompt_ids, sample.question)
        assert NULL_QUERY in bridge.tokenizer.decode(null_ids[start:]) and sample.question not in bridge.tokenizer.decode(null_ids)
        with torch.no_grad():
            real = hf(torch.tensor([real_ids]), output_attentions=True).attentions
            null = hf(torch.tensor([null_ids]), output_attentions=True).attentions
        (a, b), = sample.evidence_spans
        expected = torch.zeros(2, 4, dtype=torch.float64)
        for layer in range(2):
            for head in range(4):
                r = real[layer][0, head, start:, a:b].double().mean(0)
                n = null[layer][0, head, start:, a:b].double().mean(0)
                c = r - n
                keep = c > c.mean() - 2 * c.std()
                expected[layer, head] = c[keep].sum()
        # float32 attention against float32 attention of another implementation: agreement to 1e-5 of a weight sum
        torch.testing.assert_close(score, expected, rtol=0, atol=1e-5)


def test_the_query_rows_over_a_prefilled_context_equal_one_hooked_pass_over_the_whole_prompt(tmp_path):
    """query_focused_scores prefills the context once (SDPA twin) and runs only each prompt's query tokens through the
    hooked bridge: the rows equal those of one hooked pass over the whole prompt (the reference) to float rounding, for
    the real and the null prompt from one cache, which is left as it was."""
    bridge = dynheads_tl.load_model(str(build_tiny_model("llama", tmp_path / "llama")), device="cpu", dtype="float32")
    sample = make_niah_samples(bridge.tokenizer, n=1, context_tokens=120, seed=1, max_tokens=512)[0]
    real_ids, null_ids, start = null_query_prompt(bridge.tokenizer, sample.prompt_ids, sample.question)
    context = prefill_context(bridge, real_ids[:start])
    before = [(layer.keys.clone(), layer.values.clone()) for layer in context.layers]
    for ids in (real_ids, null_ids):
        reference = query_attention(bridge, ids, start)
        prefixed = query_attention(bridge, ids, start, prefix=context)
        assert prefixed.shape == reference.shape == (2, 4, len(ids))
        torch.testing.assert_close(prefixed, reference, rtol=0, atol=1e-6)
        assert context.get_seq_length() == start
        assert all(torch.equal(layer.keys, keys) and torch.equal(layer.values, values)
                   for layer, (keys, values) in zip(context.layers, before))
    with pytest.raises(ValueError, match="prefix cache holds"):
        query_attention(bridge, real_ids, start + 1, prefix=context)


def test_contexts_share_their_prefixes_through_the_store_with_the_same_scores(tmp_path):
    """NIAH samples of one haystack share their context up to the needle: query_focused_scores prefills what an earlier
    sample's context shares once (the enclosing shared_prefill block's store, or its own), with the scores of prefilling
    every context alone, to float rounding; with prefix sharing off no store is used."""
    from dynheads_tl.engine.decoder import prefix_sharing, prefix_store, shared_prefill

    bridge = dynheads_tl.load_model(str(build_tiny_model("llama", tmp_path / "llama")), device="cpu", dtype="float32")
    samples = make_niah_samples(bridge.tokenizer, n=3, context_tokens=120, seed=2, max_tokens=512)
    with prefix_sharing(False):
        with prefix_store() as none:
            assert none is None
        alone = query_focused_scores(bridge, samples)
    with shared_prefill() as store:
        with prefix_store() as inner:
            assert inner is store
        shared = query_focused_scores(bridge, samples)
    # each later context copied the longest prefix it shares with an earlier one (the haystack up to the needle)
    contexts = [null_query_prompt(bridge.tokenizer, s.prompt_ids, s.question) for s in samples]
    contexts = [real[:start] for real, _, start in contexts]

    def common(a, b):
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

    expected = sum(max(common(contexts[i], earlier) for earlier in contexts[:i]) for i in range(1, len(contexts)))
    assert store.hits == 2 and store.reused_positions == expected
    # into the haystack, not only the chat template: at least up to the earliest needle, for each later context
    assert expected >= (len(samples) - 1) * min(s.evidence_spans[0][0] for s in samples)
    torch.testing.assert_close(shared, alone, rtol=0, atol=1e-6)


def test_cached_scores_are_read_first_and_progress_counts_what_is_computed(tmp_path, monkeypatch):
    """With use_cache, the samples already cached are read back and only the others are computed, with progress over
    them alone (at 32k a sample's context prefill takes minutes); the scores are the same either way."""
    bridge = dynheads_tl.load_model(str(build_tiny_model("llama", tmp_path / "llama")), device="cpu", dtype="float32")
    samples = make_niah_samples(bridge.tokenizer, n=3, context_tokens=120, seed=2, max_tokens=512)
    log = tmp_path / "progress.log"
    monkeypatch.setenv("DYNHEADS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("DYNHEADS_PROGRESS", "file")
    monkeypatch.setenv("DYNHEADS_PROGRESS_FILE", str(log))
    lines = lambda: log.read_text().splitlines() if log.exists() else []
    first = query_focused_scores(bridge, samples, use_cache=True, desc="qf")
    assert lines()[0] == "qf (0 of 3 cached): 3 to compute" and lines()[-1].startswith("qf (0 of 3 cached): 3/3")
    log.unlink()
    entries = sorted((tmp_path / "cache" / "results").glob("*.json"))
    assert len(entries) == 3
    torch.testing.assert_close(query_focused_scores(bridge, samples, use_cache=True, desc="qf"), first, rtol=0, atol=0)
    assert lines() == []  # all read back: nothing to report
    first_key = {"kind": "query_focused", "version": 1, "prompt": prompt_digest(samples[0]),
                 "null_query": NULL_QUERY, **model_identity(bridge)}
    result_path(first_key).unlink()  # the first sample's entry: recomputed into its own row, not appended
    torch.testing.assert_close(query_focused_scores(bridge, samples, use_cache=True, desc="qf"), first,
                               rtol=0, atol=1e-6)
    assert lines()[0] == "qf (2 of 3 cached): 1 to compute"
    log.unlink()
    # a prompt given twice in one call is computed once (not cached: nothing to read back between the two)
    twice = query_focused_scores(bridge, [samples[1], samples[0], samples[1]], desc="qf twice")
    assert lines()[0] == "qf twice: 2 to compute"
    torch.testing.assert_close(twice, first[[1, 0, 1]], rtol=0, atol=1e-6)


def _baseline_rows(baseline: str, value: float, low: float, high: float):
    return {"task": "niah", "static_k": 20, "baseline": baseline, "metric": "share_outside_static", "value": value,
            "low": low, "high": high, "n_samples": 12}


@pytest.mark.parametrize("query_share, expected", [
    ((0.40, 0.30, 0.50), "does not change (both read: substantial share outside)"),
    ((0.05, 0.02, 0.08), "changes (Wu: substantial share outside; query-focused: stays inside)"),
])
def test_the_verdict_says_whether_the_stronger_baseline_changes_the_reading(query_share, expected):
    import pandas as pd

    from dynheads_tl.claims.dynamism import query_focused_verdict

    table = pd.DataFrame([_baseline_rows("wu", 0.6, 0.5, 0.7), _baseline_rows("query_focused", *query_share)])
    overlap = pd.DataFrame([{"seed": 0, "overlap": 0.45, "low": 0.3, "high": 0.6, "spearman": 0.5}])
    sentence = query_focused_verdict(table, overlap, 20)
    assert expected in sentence and "12 analysis samples" in sentence
    assert "share 0.45 of their heads" in sentence and "from 0.30 to 0.60" in sentence


def test_notebook_06_verdict_compares_the_readings_per_budget():
    import pandas as pd

    from dynheads_tl.claims.kv_retention import query_baseline_verdict

    def frame(rows, logprob=None):
        table = pd.DataFrame([{"granularity": g, "budget": b, "n": 12, "accuracy_difference": d, "low": lo, "high": hi,
                               "p_adjusted": p, "testable": p == p, "separated": sep, "predicted_better": 3,
                               "static_better": 1}
                              for g, b, d, lo, hi, p, sep in rows])
        if logprob is not None:
            table = table.assign(**{f"logprob_{k}" if k != "difference" else "logprob_difference": v
                                    for k, v in logprob.items()})
        return table

    wu = frame([("query", 0.05, 0.4, 0.2, 0.6, 0.01, True), ("query", 0.25, 0.0, -0.2, 0.2, 1.0, False)])
    same = frame([("query", 0.05, 0.3, 0.1, 0.5, 0.02, True), ("query", 0.25, 0.1, -0.1, 0.3, 0.8, False)])
    other = frame([("query", 0.05, 0.1, -0.1, 0.3, 0.5, False), ("query", 0.25, 0.0, -0.2, 0.2, float("nan"), False)])
    assert query_baseline_verdict(wu, same).endswith("does not change at any budget.")
    text = query_baseline_verdict(wu, other)
    assert text.endswith("changes at query 5% (accuracy).")
    assert "query heads 5% (n = 12): on accuracy predicted cannot be told apart from the query-focused static set" in text
    assert "against Wu's: beats" in text and "against Wu's: the same" in text
    assert "untestable: 4 samples differ, too few for a sign test to reach 0.05" in text and "nan" not in text
    assert "was not run" in query_baseline_verdict(wu, pd.DataFrame())
    # With the gold log-probability: a change on that measure alone is a change of the conclusion.
    lp_wu = {"difference": [-0.2], "low": [-0.3], "high": [-0.1], "p_adjusted": [0.01], "testable": [True],
             "separated": [True]}
    lp_query = {**lp_wu, "difference": [2.0], "low": [1.8], "high": [2.1]}
    text = query_baseline_verdict(frame([("kv", 0.05, 0.0, 0.0, 0.0, float("nan"), False)], lp_wu),
                                  frame([("kv", 0.05, 0.0, 0.0, 0.0, float("nan"), False)], lp_query))
    assert "on gold log-probability predicted beats the query-focused static set (+2.00 [+1.80, +2.10] nats/token, " \
           "Holm-adjusted sign-test p = 0.01; against Wu's: falls below)" in text
    assert text.endswith("changes at kv 5% (gold log-probability).")


def test_the_verdict_names_the_layouts_it_resampled():
    import pandas as pd

    from dynheads_tl.claims.dynamism import query_focused_verdict

    rows = [dict(_baseline_rows("wu", 0.036, 0.032, 0.039), n_samples=60, n_layouts=20),
            dict(_baseline_rows("query_focused", 0.287, 0.279, 0.296), n_samples=60, n_layouts=20)]
    sentence = query_focused_verdict(pd.DataFrame(rows), pd.DataFrame(), 20)
    assert "over 20 layouts (60 analysis samples)" in sentence and "60 analysis samples," not in sentence
