"""The dynamic-RAG case study: trigger, windows, masking and the loop."""
from __future__ import annotations

import pytest
import torch

from dynheads_tl.rag import (
    HeadSelector, RagConfig, is_content_word, rag_generate, rind_scores, segment_attention, sentence_start,
    table4, run_strategies, windows_from_positions,
)
from dynheads_tl.tasks import make_hotpot_samples


def test_rind_on_a_hand_built_case():
    # 2 heads, 3 tokens. Token 0 is attended by row 1 (0.6 / 0.2) and row 2 (0.3 / 0.8).
    attention = torch.zeros(2, 3, 3)
    attention[0, 1, 0], attention[1, 1, 0] = 0.6, 0.2
    attention[0, 2, 0], attention[1, 2, 0] = 0.3, 0.8
    attention[0, 2, 1], attention[1, 2, 1] = 0.5, 0.1
    attention[:, 0, 0] = 1.0  # a row attending to its own token is not a *later* row: ignored
    entropy = torch.tensor([2.0, 1.0, 5.0])
    content = torch.tensor([True, True, True])
    scores = rind_scores(attention, entropy, content)
    # token 0: max over rows per head = (0.6, 0.8) -> mean 0.7 -> x 2.0 = 1.4
    # token 1: (0.5, 0.1) -> 0.3 -> x 1.0 = 0.3; token 2 has no later row -> 0
    torch.testing.assert_close(scores, torch.tensor([1.4, 0.3, 0.0]))
    stop = rind_scores(attention, entropy, torch.tensor([False, True, True]))
    assert float(stop[0]) == 0.0


def test_content_words_use_sklearn_stopwords():
    assert is_content_word(" Paris") and is_content_word("born")
    assert not is_content_word(" the") and not is_content_word("which") and not is_content_word(" 1987")


def test_windows_cluster_and_merge():
    spans = windows_from_positions([10, 12, 14, 40, 90], cluster_gap=5, window=10, lo=5, hi=95)
    # cluster {10,12,14} -> centre 12 -> [7, 17); {40} -> [35, 45); {90} -> [85, 95) clipped at hi
    assert spans == [(7, 17), (35, 45), (85, 95)]
    merged = windows_from_positions([10, 20], cluster_gap=5, window=16, lo=0, hi=100)
    assert merged == [(2, 28)]  # [2, 18) and [12, 28) overlap
    assert windows_from_positions([], cluster_gap=1, window=4, lo=0, hi=10) == []


def test_sentence_start():
    texts = ["The", " cat", ".", " It", " sat", "."]
    assert sentence_start(texts, 4) == 3 and sentence_start(texts, 1) == 0


def test_segment_attention_reads_later_rows_only():
    prompt_len = 4
    rows = [torch.arange(10, dtype=torch.float32).repeat(2, 1) * (i + 1) for i in range(3)]
    seg = segment_attention(rows, 0, 3, prompt_len)
    assert seg.shape == (2, 3, 3)
    assert float(seg[0, 2, 0]) == 3 * 4 and float(seg[0, 2, 1]) == 3 * 5 and float(seg[0, 1, 0]) == 2 * 4
    assert float(seg[0, 0, 0]) == 0 and float(seg[0, 1, 1]) == 0


def test_selector_validation(embedded_model):
    with pytest.raises(ValueError, match="Unknown strategy"):
        HeadSelector("magic", embedded_model, RagConfig())
    with pytest.raises(ValueError, match="static_scores"):
        HeadSelector("static", embedded_model, RagConfig())
    with pytest.raises(ValueError, match="probe"):
        HeadSelector("dynamic", embedded_model, RagConfig())


@pytest.fixture(scope="module")
def samples(embedded_model):
    return make_hotpot_samples(embedded_model.tokenizer, n=2, seed=5)


def test_without_rag_the_context_stays_invisible(embedded_model, samples):
    sample = samples[0]
    result = rag_generate(embedded_model, sample, HeadSelector("none", embedded_model, RagConfig()), RagConfig())
    assert result.retrievals == 0 and result.visible_context_tokens == 0 and result.evidence_recall == 0.0
    full = rag_generate(embedded_model, sample, HeadSelector("full", embedded_model, RagConfig()), RagConfig())
    assert full.visible_context_tokens == sample.context_span[1] - sample.context_span[0]


def test_a_retrieval_opens_windows_inside_the_context(embedded_model, samples):
    config = RagConfig(rind_threshold=0.0, max_retrievals=1)  # fire on the first sentence
    scores = torch.rand(embedded_model.cfg.n_layers, embedded_model.cfg.n_heads)
    table = run_strategies(embedded_model, samples, ["oracle", "static", "fixed_random"], config, static_scores=scores)
    assert (table["retrievals"] == 1).all()
    c0, c1 = samples[0].context_span
    assert (table["visible_context_tokens"] > 0).all()
    assert (table["visible_context_tokens"] <= (c1 - c0)).all()
    summary = table4(table)
    assert list(summary["strategy"]) == ["oracle", "static", "fixed_random"]
    assert summary["f1"].between(0, 1).all()


def test_evaluation_samples_read_an_official_format_file(embedded_model, tmp_path):
    import json

    from dynheads_tl.rag import RagStudyConfig, evaluation_samples
    from dynheads_tl.tasks import synthetic_hotpot_records

    records = synthetic_hotpot_records(3, seed=77)
    path = tmp_path / "dev_distractor.json"
    path.write_text(json.dumps(records))
    samples = evaluation_samples(embedded_model, RagStudyConfig(n_samples=2, hotpot_source=str(path)))
    assert [s.answers[0] for s in samples] == [r["answer"] for r in records[:2]]
