"""The dynamic-RAG case study: trigger, windows, masking and the loop."""
from __future__ import annotations

import pytest
import torch
from torch import Tensor

from dynheads_tl.claims.dynamic_rag import table4
from dynheads_tl.protocols.rag import (
    HeadSelector, RagConfig, calibrate_rind_threshold, is_content_word, question_groups, rag_generate,
    rag_generate_many, rind_scores, segment_attention, sentence_start, run_strategies, windows_from_positions,
    word_starts,
)
from dynheads_tl.tasks import make_hotpot_samples


def test_rind_on_a_worked_example():
    # A sentence of 4 tokens in 3 words: "Paris" | " Dor" "vaka" | " the" (a stopword).
    texts = ["Paris", " Dor", "vaka", " the"]
    starts = word_starts(texts)
    assert starts.tolist() == [True, True, False, True]
    attention = torch.zeros(2, 4, 4)  # [head, query, key], causal: a query sees keys up to itself
    attention[0, 0, 0], attention[0, 3, 0] = 0.6, 0.1  # head 0: column maxima 0.6, 0.4, 0.2, 0.1
    attention[0, 1, 1], attention[0, 2, 2], attention[0, 3, 3] = 0.4, 0.2, 0.1
    attention[1, 2, 0], attention[1, 3, 1] = 0.2, 0.2  # head 1: column maxima 0.2, 0.2, 0.4, 0.3
    attention[1, 2, 2], attention[1, 3, 3] = 0.4, 0.3
    entropies = torch.tensor([1.5, 2.0, 1.0, 3.0])
    content = torch.tensor([True, True, False])
    scores = rind_scores(attention, entropies, starts, content)
    # token influence (mean over heads of the column maxima): 0.4, 0.3, 0.3, 0.2
    # words: attention 0.4, 0.6, 0.2 (sum 1.2) -> normalised 1/3, 1/2, 1/6; entropy 1.5, mean(2, 1) = 1.5, 3.0
    # value = normalised x entropy x 3 words: 1.5, 2.25, (1.5 for the stopword, zeroed)
    torch.testing.assert_close(scores, torch.tensor([1.5, 2.25, 0.0]))
    with pytest.raises(ValueError, match="content flags"):
        rind_scores(attention, entropies, starts, torch.tensor([True, True]))


def test_word_starts_follow_spaces_and_newlines():
    assert word_starts(["The", " Dor", "vaka", ".\n", "It"]).tolist() == [True, True, False, False, True]


def test_rind_threshold_maximises_youden_j():
    assert calibrate_rind_threshold([0.5, 1.0, 2.0, 3.0], [False, False, True, True]) == pytest.approx(1.5)
    # overlapping classes: 1.25 (J = 1 - 1/2) and 2.75 (J = 1/2 - 0) tie; the higher threshold wins
    assert calibrate_rind_threshold([0.5, 2.5, 2.0, 3.0], [False, False, True, True]) == pytest.approx(2.75)
    # no right answer: fire on every wrong one
    assert calibrate_rind_threshold([1.0, 2.0], [True, True]) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="one label per score"):
        calibrate_rind_threshold([1.0], [True, False])


def _rows(f1_a, f1_b, a="dynamic", b="static"):
    import pandas as pd

    return pd.DataFrame([{"sample": i, "strategy": s, "f1": f} for s, values in ((a, f1_a), (b, f1_b))
                         for i, f in enumerate(values)])


def test_holm_adjustment_on_a_known_case():
    from dynheads_tl.analysis.statistics import holm_adjust

    # sorted 0.01, 0.02, 0.04 -> 3 x 0.01 = 0.03, max(0.03, 2 x 0.02) = 0.04, max(0.04, 0.04) = 0.04
    assert holm_adjust([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])


def test_a_few_wins_among_ties_are_not_called_a_difference():
    from dynheads_tl.claims.dynamic_rag import comparison_table

    # 30 questions, 26 tied, 4 won by a: the bootstrap interval excludes 0 but a sign test gives p = 0.125
    table = comparison_table(_rows([1.0] * 4 + [0.5] * 26, [0.0] * 4 + [0.5] * 26)).set_index("a")
    row = table.loc["dynamic"]
    assert row["low"] > 0 and row["a_better"] == 4 and row["b_better"] == 0
    assert row["sign_p"] == pytest.approx(0.125) and not row["separated"]
    # 20 wins and no loss separate
    clear = comparison_table(_rows([1.0] * 20 + [0.5] * 10, [0.0] * 20 + [0.5] * 10)).set_index("a")
    assert bool(clear.loc["dynamic", "separated"])


def test_the_verdict_ranks_nothing_without_headroom():
    import pandas as pd

    from dynheads_tl.claims.dynamic_rag import comparison_table, rag_verdict, table4

    rows = pd.concat([_rows([1.0] * 20 + [0.5] * 10, [0.0] * 20 + [0.5] * 10),
                      _rows([0.3] * 30, [0.2] * 30, a="full", b="none")], ignore_index=True)
    for column, value in (("em", 0.0), ("retrievals", 1), ("visible_context_tokens", 10), ("context_tokens", 40),
                          ("evidence_recall", 0.5)):
        rows[column] = value
    verdict = rag_verdict(table4(rows), comparison_table(rows))
    assert "no strategy is ranked" in verdict and "beats" not in verdict and "for the record" in verdict


def test_the_verdict_states_the_primary_first_and_what_the_design_could_detect():
    import pandas as pd

    from dynheads_tl.claims.dynamic_rag import comparison_table, rag_verdict, table4

    rows = pd.concat([_rows([1.0] * 8 + [0.0] * 7 + [0.5] * 15, [0.0] * 8 + [1.0] * 7 + [0.5] * 15, a="dynamic",
                            b="dynamic_random"),
                      _rows([1.0] * 4 + [0.5] * 26, [0.0] * 4 + [0.5] * 26)[lambda r: r["strategy"] == "static"]
                      .assign(f1=[0.0] * 4 + [0.5] * 26),
                      _rows([1.0] * 30, [0.0] * 30, a="full", b="none")], ignore_index=True)
    # dynamic's own rows beside static: 4 questions won, 26 tied (from the dynamic_random block's first 30 rows)
    rows.loc[(rows["strategy"] == "dynamic"), "f1"] = [1.0] * 4 + [0.5] * 26
    for column, value in (("em", 0.0), ("retrievals", 1), ("visible_context_tokens", 10), ("context_tokens", 40),
                          ("evidence_recall", 0.5)):
        rows[column] = value
    comparisons = comparison_table(rows).set_index(["a", "b"])
    assert not comparisons.loc[("dynamic", "static"), "testable"]  # 4 differing questions: min p 0.125
    # the primary is tested alone: its p is its own sign-test p (0.125), never Holm-adjusted or left out
    assert comparisons.loc[("dynamic", "static"), "p_adjusted"] == pytest.approx(0.125)
    assert comparisons.loc[("dynamic", "static"), "primary"] and comparisons["primary"].sum() == 1
    verdict = rag_verdict(table4(rows), comparison_table(rows))
    assert verdict.index("Primary comparison (declared): Dynamic (probe) and Static cannot be tested") < \
        verdict.index("Dynamic (probe) and Dynamic Random")
    assert "the design detects F1 differences of about ±" in verdict and "with 80% power" in verdict
    assert "synthetic HotpotQA-format questions" in verdict


def test_content_words_use_sklearn_stopwords():
    assert is_content_word(" Paris") and is_content_word("born") and is_content_word(" Dorvaka.")
    assert not is_content_word(" the") and not is_content_word("which") and not is_content_word(" 1987")
    assert not is_content_word("\n")


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
    # 300 context tokens (prompts of about 350 tokens): the loop's cost is mostly prefill, and the tests here need
    # both evidence sentences inside the context (they are), not a long one
    return make_hotpot_samples(embedded_model.tokenizer, n=2, seed=5, context_tokens=300)


def test_without_rag_the_context_stays_invisible(embedded_model, samples):
    sample = samples[0]
    result = rag_generate(embedded_model, sample, HeadSelector("none", embedded_model, RagConfig()), RagConfig())
    assert result.retrievals == 0 and result.visible_context_tokens == 0 and result.evidence_recall == 0.0
    full = rag_generate(embedded_model, sample, HeadSelector("full", embedded_model, RagConfig()), RagConfig())
    with pytest.raises(ValueError, match="needs a number"):  # a strategy that retrieves needs RIND's threshold
        rag_generate(embedded_model, sample, HeadSelector("fixed_random", embedded_model, RagConfig()), RagConfig())
    assert full.visible_context_tokens == sample.context_span[1] - sample.context_span[0]


def test_a_retrieval_opens_windows_inside_the_context(embedded_model, samples, monkeypatch):
    from dynheads_tl.engine import decoder as decoder_module

    # fire on the first sentence (RIND also reads the unfinished one when the 8 steps run out)
    config = RagConfig(rind_threshold=0.0, max_retrievals=1, max_new_tokens=8)
    scores = torch.rand(embedded_model.cfg.n_layers, embedded_model.cfg.n_heads)
    built, init = [], decoder_module.BatchDecoder.__init__

    def spying(self, *args, **kwargs):
        init(self, *args, **kwargs)
        built.append((len(self.pending), int(self.prompt_lengths[0]), self.stored_positions))

    monkeypatch.setattr(decoder_module.BatchDecoder, "__init__", spying)
    strategies = ["oracle", "static", "fixed_random", "full"]
    table = run_strategies(embedded_model, samples, strategies, config, static_scores=scores)
    # Question by question: a question's strategies but full share one generation (one decoder); its full strategy,
    # in a batch of its own, copies the question's prefill (up to the context's end) from the executor's prefix
    # store, and every answer is exactly as without the store.
    ends = [sample.context_span[1] for sample in samples]
    first, second = samples[0].prompt_ids, samples[1].prompt_ids
    common = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b)  # the chat template's head
    assert [stored for _, _, stored in built] == [0, ends[0], common, ends[1]]
    with decoder_module.prefix_sharing(False):
        alone = run_strategies(embedded_model, samples, strategies, config, static_scores=scores)
    assert list(alone["response"]) == list(table["response"]) and list(alone["retrievals"]) == list(table["retrievals"])
    assert list(table["retrievals"]) == [1] * 6 + [0] * 2
    retrieving = table["strategy"] != "full"
    assert (table["visible_context_tokens"] > 0).all()
    assert (table["visible_context_tokens"][retrieving] < table["context_tokens"][retrieving]).all()
    assert (table["visible_context_tokens"][~retrieving] == table["context_tokens"][~retrieving]).all()
    summary = table4(table)
    assert list(summary["strategy"]) == strategies
    assert summary["f1"].between(0, 1).all()


def _official_records(n: int) -> list[dict]:
    """Records in the official distractor-setting schema: two gold paragraphs among four, facts as [title, index]."""
    records = []
    for i in range(n):
        records.append({
            "_id": f"official-{i}", "type": "bridge", "level": "hard",
            "question": f"Where was the author of Book {i} born?", "answer": f"Town {i}",
            "context": [[f"Other {i}", ["An unrelated sentence.", "Another one."]],
                        [f"Book {i}", [f"Book {i} is a novel.", f"It was written by Author {i}."]],
                        [f"Filler {i}", ["Nothing to see here."]],
                        [f"Author {i}", [f"Author {i} is a writer.", f"Author {i} was born in Town {i}."]]],
            "supporting_facts": [[f"Book {i}", 1], [f"Author {i}", 1]],
        })
    return records


@pytest.mark.parametrize("setting, paragraphs", [("multihop", 4), ("headroom", 3)])  # headroom: gold + 1
def test_an_official_format_file_feeds_every_split(embedded_model, tmp_path, setting, paragraphs):
    import json

    from dynheads_tl.claims.dynamic_rag import RagStudyConfig, split_samples

    records = _official_records(8)
    path = tmp_path / "dev_distractor.json"
    path.write_text(json.dumps(records))
    config = RagStudyConfig(n_samples=2, n_rind_calibration=2, n_hotpot_train=1, train_seeds=[0, 1],
                            hotpot_source=str(path), rag_setting=setting)
    config.check_inputs()  # 2 + 2 (+ 2 x 1 for the headroom probe, or claim 1's 2 x 2 before them) fit in 8
    tokenizer = embedded_model.tokenizer
    evaluation, rind = split_samples(embedded_model, config, "evaluation"), split_samples(embedded_model, config, "rind")
    # multihop: claim 1's splits (seed s: calibration record 2s, analysis record 2s + 1) train its probe, so
    # evaluation starts at record 4
    offset = 4 if setting == "multihop" else 0
    assert [s.answers[0] for s in evaluation + rind] == [r["answer"] for r in records[offset: offset + 4]]
    records = records[offset:]
    if setting == "headroom":
        train = split_samples(embedded_model, config, "train", 1)
        assert [s.meta["id"] for s in train] == ["official-5"]
    for sample, record in zip(evaluation, records):
        context = tokenizer.decode(sample.prompt_ids[slice(*sample.context_span)])
        assert sum(f"{title}:" in context for title, _ in record["context"]) == paragraphs
        decoded = [tokenizer.decode(sample.prompt_ids[s:e]).strip() for s, e in sample.evidence_spans]
        assert decoded == [f"It was written by Author {record['_id'][-1]}.", f"Author {record['_id'][-1]} was born in "
                                                                            f"Town {record['_id'][-1]}."]
    too_many = RagStudyConfig(n_samples=6, n_rind_calibration=2, hotpot_source=str(path), rag_setting=setting)
    with pytest.raises(ValueError, match="usable records"):
        too_many.check_inputs()


# --- what the loop's queries actually see, and which heads the oracle picks -----------------------
def test_oracle_selector_takes_the_top_k_eq2_heads():
    from types import SimpleNamespace

    model = SimpleNamespace(cfg=SimpleNamespace(n_layers=2, n_heads=3))
    selector = HeadSelector("oracle", model, RagConfig(n_heads=2))
    eq2 = torch.tensor([[0.10, 0.70, 0.20], [0.65, 0.05, 0.30]])  # best: L0H1 (flat 1), then L1H0 (flat 3)
    hidden = torch.randn(8)  # the oracle ignores the hidden state
    assert sorted(selector(hidden, eq2).tolist()) == [1, 3]


class RecordingSelector(HeadSelector):
    """A HeadSelector that keeps every Eq. 2 tensor it was shown and every choice it made. The loop calls
    it right after the retrieval pass, so each call also marks the pattern events just seen as that pass."""

    def __init__(self, *args, on_call, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[Tensor, Tensor]] = []
        self.on_call = on_call

    def __call__(self, hidden, eq2_scores):
        chosen = super().__call__(hidden, eq2_scores)
        self.calls.append((eq2_scores.clone(), chosen.clone()))
        self.on_call()
        return chosen


RECORD_CONFIG = RagConfig(rind_threshold=0.0, max_retrievals=1, max_new_tokens=10, top_k_positions=8, window=24)  # retrieve on the first sentence


@pytest.fixture(scope="module")
def short_sample(embedded_model):
    [sample] = make_hotpot_samples(embedded_model.tokenizer, n=1, seed=0, context_tokens=250)
    return sample


@pytest.fixture(scope="module")
def recorded_runs(embedded_model, short_sample):
    """``rag_generate`` per strategy with every layer's attention pattern recorded (computed once per module)."""
    runs = {}

    def run(strategy):
        if strategy in runs:
            return runs[strategy]
        n_layers = embedded_model.cfg.n_layers
        events = []  # one per (forward, layer): layer, pattern [head, query, key], retrieval pass?, retrievals before

        def grab(layer):
            def hook(pattern, hook):
                events.append({"layer": layer, "pattern": pattern[0].float().clone(), "retrieval_pass": False,
                               "retrievals_before": len(selector.calls)})
            return hook

        def mark_retrieval_pass():
            last = events[-n_layers:]
            assert [e["layer"] for e in last] == list(range(n_layers)), "the retrieval pass is one forward"
            for event in last:
                event["retrieval_pass"] = True

        selector = RecordingSelector(strategy, embedded_model, RECORD_CONFIG, on_call=mark_retrieval_pass)
        hooks = [(f"blocks.{layer}.attn.hook_pattern", grab(layer)) for layer in range(n_layers)]
        with embedded_model.hooks(fwd_hooks=hooks):
            result = rag_generate(embedded_model, short_sample, selector, RECORD_CONFIG)
        runs[strategy] = (result, events, selector)
        return runs[strategy]

    return run


@pytest.mark.parametrize("strategy", ["none", "oracle"])
def test_closed_context_gets_exactly_zero_attention(recorded_runs, short_sample, strategy):
    result, events, selector = recorded_runs(strategy)
    c0, c1 = short_sample.context_span
    if strategy == "none":
        assert result.retrievals == 0 and result.opened == []
    else:
        # max_retrievals=1: every opened window comes from the one retrieval.
        assert result.retrievals == 1 == len(selector.calls) and result.opened
    opened = torch.zeros(c1, dtype=torch.bool)
    for start, end in result.opened:
        assert c0 <= start < end <= c1
        opened[start:end] = True
    checked = seen_opened = 0
    for event in events:
        pattern = event["pattern"]  # [head, query, key]
        key_len = pattern.shape[-1]
        assert key_len - pattern.shape[1] >= c1, "hooked queries all come after the context (it is prefilled unhooked)"
        context = pattern[:, :, c0:c1]
        if event["retrieval_pass"]:
            assert float(context.sum()) > 0, "the retrieval pass sees the whole context"
            continue
        is_open = opened[c0:c1] if event["retrievals_before"] else torch.zeros(c1 - c0, dtype=torch.bool)
        # Exact: the loop writes -inf into the scores of closed keys, and exp(-inf) is 0.0 in any float.
        assert float(context[:, :, ~is_open].abs().max()) == 0.0
        seen_opened += float(context[:, :, is_open].sum()) > 0
        checked += 1
    assert checked > 0
    if strategy == "oracle":
        assert seen_opened > 0, "after the retrieval, the generated text does attend to the opened windows"


def test_oracle_heads_are_the_top_k_of_an_independent_eq2(recorded_runs, embedded_model, embedded_reference,
                                                          short_sample):
    """Recompute the retrieval pass's Eq. 2 in plain transformers (eager, with a hand-built 4D mask that
    closes the context to the question rows, as the loop does) and check the oracle's heads are its top-k."""
    result, events, selector = recorded_runs("oracle")
    [(eq2_seen, chosen)] = selector.calls
    retrieval_rows = [e["pattern"] for e in events if e["retrieval_pass"]]
    key_len = retrieval_rows[0].shape[-1]
    P = len(short_sample.prompt_ids)
    # rind_threshold=0 fires on the first sentence; its start is the first answer token, whose query is the
    # last prompt token. So the retrieval pass reads exactly the prompt.
    assert key_len == P
    c0, c1 = short_sample.context_span

    # Additive mask: causal; rows of the question (c1 .. P-2) do not see the context; the retrieval row
    # P-1 sees everything.
    blocked = torch.ones(P, P, dtype=torch.bool).triu(1)
    blocked[c1:P - 1, c0:c1] = True
    mask = torch.zeros(1, 1, P, P).masked_fill(blocked, float("-inf"))
    with torch.no_grad():
        out = embedded_reference(torch.tensor([short_sample.prompt_ids]), attention_mask=mask, output_attentions=True)
    rows = torch.stack([a[0, :, -1, :] for a in out.attentions])  # [layer, head, key]

    eligible = torch.ones(P, dtype=torch.bool)
    eligible[:RECORD_CONFIG.sink_tokens] = False
    eligible[P - RECORD_CONFIG.local_window:] = False
    evidence = torch.zeros(P, dtype=torch.bool)
    for start, end in short_sample.evidence_spans:
        evidence[start:end] = True
    expected = (rows * (evidence & eligible)).sum(-1) / (rows * eligible).sum(-1)

    # SDPA prefill + bridge vs one eager forward: float32 reordering only, ~1e-6 on shares in [0, 1].
    torch.testing.assert_close(eq2_seen, expected, atol=1e-5, rtol=1e-4)
    k = RECORD_CONFIG.n_heads
    ranked = expected.flatten().sort(descending=True).values
    assert float(ranked[k - 1] - ranked[k]) > 1e-4, "the top-k is well separated, so it is not a tie-break"
    assert sorted(chosen.tolist()) == sorted(torch.topk(expected.flatten(), k).indices.tolist())
    n_heads = embedded_model.cfg.n_heads
    assert sorted(result.heads_used[0]) == sorted(divmod(int(i), n_heads) for i in chosen)


# --- the loop on the one decoding engine ----------------------------------------------------------
def test_rag_loop_on_decode_reproduces_the_recorded_pre_move_outputs(embedded_model):
    """The RAG loop used to be a second engine (its own forward/rewind closures); it now runs as
    ``RagPolicy`` on ``engine.tracing.decode``. Outputs recorded with the old loop must come back exactly:
    responses, retrieval counts, opened windows and the heads each retrieval used."""
    import json
    from pathlib import Path

    reference = json.loads((Path(__file__).parent / "data" / "rag_reference.json").read_text())
    samples = make_hotpot_samples(embedded_model.tokenizer, n=3, seed=11, context_tokens=300)
    scores = torch.rand(embedded_model.cfg.n_layers, embedded_model.cfg.n_heads, generator=torch.Generator().manual_seed(3))
    config = RagConfig(rind_threshold=0.0, max_retrievals=2, max_new_tokens=20, top_k_positions=8, window=24)
    # one recorded run per strategy, the samples alternating (the other four were recorded too; the loop's cost
    # is the test's cost)
    runs = [run for i, run in enumerate(reference["runs"]) if run["sample"] == (i // 2) % 2]
    assert sorted({run["strategy"] for run in runs}) == sorted({run["strategy"] for run in reference["runs"]})
    assert {run["sample"] for run in runs} == {0, 1} and sum(run["retrievals"] for run in runs) >= 4
    for run in runs:
        selector = HeadSelector(run["strategy"], embedded_model, config, static_scores=scores)
        result = rag_generate(embedded_model, samples[run["sample"]], selector, config, sample_seed=run["sample"])
        assert result.response == run["response"], run["strategy"]
        assert result.retrievals == run["retrievals"]
        assert [list(span) for span in result.opened] == run["opened"]
        assert [[list(h) for h in heads] for heads in result.heads_used] == run["heads_used"]
        assert result.visible_context_tokens == run["visible_context_tokens"]
        assert abs(result.evidence_recall - run["evidence_recall"]) < 1e-9
        # The loop's Trace is the kept generation: its tokens decode to the response.
        assert embedded_model.tokenizer.decode(result.trace.tokens.tolist(), skip_special_tokens=True) == result.response
        assert result.trace.support_score.shape[0] == len(result.trace.tokens)


def _reference():
    import json
    from pathlib import Path

    return json.loads((Path(__file__).parent / "data" / "rag_reference.json").read_text())


def _same_result(result, run) -> None:
    assert result.response == run["response"], run["strategy"]
    assert result.retrievals == run["retrievals"], run["strategy"]
    assert [list(span) for span in result.opened] == run["opened"], run["strategy"]
    assert [[list(h) for h in heads] for heads in result.heads_used] == run["heads_used"], run["strategy"]
    assert result.visible_context_tokens == run["visible_context_tokens"]
    assert abs(result.evidence_recall - run["evidence_recall"]) < 1e-9


def test_strategies_answered_together_match_the_recorded_runs_and_share_their_trunk(embedded_model, monkeypatch):
    """The strategies of one question decode their common generation (up to the first retrieval) once and then
    fork: every strategy must still give the answer recorded for it alone, second retrievals included, while the
    first retrieval pass runs once for all of them."""
    from dynheads_tl.protocols.rag import RagPolicy

    reference = _reference()
    samples = make_hotpot_samples(embedded_model.tokenizer, n=3, seed=11, context_tokens=300)
    scores = torch.rand(embedded_model.cfg.n_layers, embedded_model.cfg.n_heads, generator=torch.Generator().manual_seed(3))
    config = RagConfig(rind_threshold=0.0, max_retrievals=2, max_new_tokens=20, top_k_positions=8, window=24)
    runs = [run for run in reference["runs"] if run["sample"] == 1]
    assert [run["strategy"] for run in runs] == ["none", "oracle", "static", "dynamic_random"]
    passes = []
    original = RagPolicy._retrieval_pass
    monkeypatch.setattr(RagPolicy, "_retrieval_pass", lambda self, *a: passes.append(a[1]) or original(self, *a))
    # "static" first: the fork must reorder, since "none" has to go on from the trunk before the retrieval pass
    order = ["static", "none", "dynamic_random", "oracle"]
    selectors = [HeadSelector(strategy, embedded_model, config, static_scores=scores) for strategy in order]
    results = rag_generate_many(embedded_model, samples[1], selectors, config, sample_seed=1)
    by_strategy = {run["strategy"]: run for run in runs}
    for strategy, result in zip(order, results):
        assert result.strategy == strategy
        _same_result(result, by_strategy[strategy])
        assert embedded_model.tokenizer.decode(result.trace.tokens.tolist(), skip_special_tokens=True) == result.response
        assert result.trace.config["strategy"] == strategy
    # Alone, the three retrieving strategies would run 6 retrieval passes; together the first is shared.
    assert sum(r.retrievals for r in results) == 6 and len(passes) == 4, passes
    # RIND first fired at the end of none's sentence, before its last step: none decoded on from the fork (to its
    # end-of-sequence, a second evaluated segment) before the retrieval pass ran
    none = results[order.index("none")]
    assert len(none.trace.tokens) < config.max_new_tokens and len(none.rind_values) >= 2


@pytest.fixture(scope="module")
def alone_runs():
    """Each strategy's ``rag_generate`` alone, per (strategy, threshold, steps): computed once for the module (the
    cases below with the same threshold and steps read the same run of a strategy they share)."""
    return {}


@pytest.mark.parametrize("case", ["fork_on_last_step", "never_fires", "without_none"])
def test_strategies_answered_together_record_the_same_traces_as_alone(embedded_model, samples, alone_runs, case):
    """Against each strategy alone: every recorded step's tokens and argmax positions, the response, the windows and
    heads exactly; the Eq. 2 shares, hidden states and every sentence's RIND value to float rounding (one full-suite
    run on 2026-12-06 saw a RIND value differ by 7e-8 relative, which the file run alone never showed: by inference the
    kernels' rounding followed the process's earlier work, not the fork). The paths: the trunk forks on its last step (every
    strategy but full, one retrieval at most: the default; the recorded-runs test above forks at a sentence end with
    none decoding on), it never fires (every strategy gets the trunk), and a group without none (the retrieval pass
    right at the fork)."""
    threshold, strategies, steps = {
        "fork_on_last_step": (0.0, ["dynamic", "oracle", "static", "dynamic_random", "fixed_random", "none"], 8),
        "never_fires": (1e9, ["none", "static", "oracle"], 8),
        "without_none": (0.0, ["static", "fixed_random"], 8)}[case]
    config = RagConfig(rind_threshold=threshold, max_retrievals=1, max_new_tokens=steps)
    scores = torch.rand(embedded_model.cfg.n_layers, embedded_model.cfg.n_heads, generator=torch.Generator().manual_seed(5))
    probe = lambda hidden: scores * hidden[: scores.numel()].reshape(scores.shape)
    make = lambda strategy: HeadSelector(strategy, embedded_model, config, static_scores=scores, probe=probe)
    together = rag_generate_many(embedded_model, samples[0], [make(s) for s in strategies], config, sample_seed=7)
    retrieving = sum(s != "none" for s in strategies)
    assert sum(r.retrievals for r in together) == (0 if case == "never_fires" else retrieving)
    for strategy, shared in zip(strategies, together):
        key = (strategy, threshold, steps)
        if key not in alone_runs:
            alone_runs[key] = rag_generate(embedded_model, samples[0], make(strategy), config, sample_seed=7)
        alone = alone_runs[key]
        assert shared.strategy == strategy
        assert shared.response == alone.response, strategy
        assert shared.rind_values == pytest.approx(alone.rind_values, rel=1e-5, abs=1e-6), strategy
        assert shared.opened == alone.opened and shared.heads_used == alone.heads_used, strategy
        assert shared.visible_context_tokens == alone.visible_context_tokens
        for name in ("tokens", "argmax_pos"):
            assert torch.equal(getattr(shared.trace, name), getattr(alone.trace, name)), (strategy, name)
        for name in ("support_score", "hidden"):
            torch.testing.assert_close(getattr(shared.trace, name), getattr(alone.trace, name), rtol=1e-5, atol=1e-5,
                                       msg=f"{strategy} {name}")
    if case == "fork_on_last_step":  # RIND first fired on the last step: none was done at the fork
        none = together[strategies.index("none")]
        assert len(none.rind_values) == 1 and len(none.trace.tokens) == steps


def test_question_groups_keep_full_and_repeats_apart():
    from dynheads_tl.tasks.common import Sample

    def sample(ids):
        return Sample(prompt_ids=ids, context_span=(0, 2), evidence_spans=[(0, 1)], answers=["a"], task="hotpotqa",
                      question="q")

    a, b, a_again = sample([1, 2, 3]), sample([4, 5, 6]), sample([1, 2, 3])
    units = [("none", 0, a), ("full", 0, a), ("static", 0, a_again), ("none", 1, b), ("static", 0, a),
             ("oracle", 1, b), ("full", 1, b), ("oracle", 0, sample([1, 2, 9]))]
    assert question_groups(units) == [[0, 2], [1], [3, 5], [4], [6], [7]]


def test_strategies_answered_together_are_checked(embedded_model, samples):
    config = RagConfig(rind_threshold=0.0)
    with pytest.raises(ValueError, match="once"):
        rag_generate_many(embedded_model, samples[0], [HeadSelector("none", embedded_model, config)] * 2, config)
    with pytest.raises(ValueError, match="full strategy"):
        rag_generate_many(embedded_model, samples[0], [HeadSelector(s, embedded_model, config)
                                                       for s in ("none", "full")], config)


def test_answers_are_cached_under_the_unit_the_protocol_and_the_scores(tiny_rag, tmp_path, monkeypatch):
    """On the tiny random Llama (tiny_rag, below): which answers are read back and which are computed again is the
    cache keys' work, the same for any model; the embedded model would only make each answer slower."""
    from dynheads_tl.protocols import rag

    _, model, samples = tiny_rag
    monkeypatch.setenv("DYNHEADS_CACHE", str(tmp_path))
    config = RagConfig(rind_threshold=0.0, max_retrievals=1, max_new_tokens=6)
    scores = torch.rand(model.cfg.n_layers, model.cfg.n_heads)
    run = lambda config, scores: run_strategies(model, samples[:1], ["static", "none"], config,
                                                static_scores=scores, cache_key={"test": "rag"})
    first = run(config, scores)
    assert len(list((tmp_path / "results").glob("*.json"))) == 2  # 2 strategies x 1 question
    answered: list[int] = []
    original = rag.rag_units
    monkeypatch.setattr(rag, "rag_units", lambda model, units, *args: answered.append(len(units)) or
                        original(model, units, *args))
    assert run(config, scores).equals(first) and answered == []  # every answer read back
    run(RagConfig(rind_threshold=0.0, max_retrievals=1, max_new_tokens=6, window=9), scores)
    assert answered == [2]  # another protocol knob: every answer again (one question: one batch)
    run(config, scores + 1.0)
    assert answered == [2, 1]  # other static scores: the static strategy's answer again, not the other one
    with pytest.raises(ValueError, match="name the probe"):  # an unnamed probe could read another probe's answers
        run_strategies(model, samples, ["dynamic"], config, probe=lambda hidden: scores, cache_key={"test": "rag"})
    assert answered == [2, 1]


def test_a_trained_probe_is_named_by_its_weights():
    from dynheads_tl.claims.dynamic_rag import HeadProbe, RagStudyConfig, answers_cache_key

    torch.manual_seed(0)
    network = torch.nn.Linear(4, 6)
    probe = HeadProbe(network, (2, 3))
    assert probe(torch.ones(4)).shape == (2, 3)
    same = HeadProbe(network, (2, 3))
    before = probe(torch.ones(4))
    with torch.no_grad():
        network.weight[0, 0] += 1e-3
    assert same.digest == probe.digest and HeadProbe(network, (2, 3)).digest != probe.digest
    assert torch.equal(probe(torch.ones(4)), before)  # the probe keeps the weights its digest names
    assert answers_cache_key(RagStudyConfig(), "evaluation", probe) == {"claim": "rag_study", "split": "evaluation",
                                                                        "probe": probe.digest}
    assert answers_cache_key(RagStudyConfig(use_cache=False), "evaluation", probe) is None


def test_the_primary_is_tested_alone_and_the_secondaries_holm_corrected_among_themselves():
    import pandas as pd

    from dynheads_tl.claims.dynamic_rag import comparison_table

    # dynamic beats static on 7 questions of 30 (p = 2 / 2^7 = 0.0156) and each random strategy on as many
    rows = pd.concat([_rows([1.0] * 7 + [0.5] * 23, [0.0] * 7 + [0.5] * 23, a="dynamic", b=b)[
        lambda r: r["strategy"] == b] for b in ("static", "dynamic_random", "fixed_random")]
        + [_rows([1.0] * 7 + [0.5] * 23, [0.0] * 7 + [0.5] * 23)[lambda r: r["strategy"] == "dynamic"]],
        ignore_index=True)
    table = comparison_table(rows).set_index(["a", "b"])
    raw = 2 / 2 ** 7
    primary = table.loc[("dynamic", "static")]
    assert primary["primary"] and primary["p_adjusted"] == pytest.approx(raw) and primary["separated"]
    # the two secondaries: Holm over two equal p-values, 2 x 0.0156 = 0.031; the primary is not in their family
    for b in ("dynamic_random", "fixed_random"):
        assert table.loc[("dynamic", b), "p_adjusted"] == pytest.approx(2 * raw)


# --- teacher forcing: the gold answer's log-probability under each strategy (tiny random Llama) -----------------
@pytest.fixture(scope="module")
def tiny_rag(tmp_path_factory):
    """A tiny random Llama and two headroom-setting questions (about 360 tokens: the model holds 512)."""
    import dynheads_tl
    from conftest import build_tiny_model
    from dynheads_tl.tasks.hotpot import HOTPOT_SETTINGS

    folder = build_tiny_model("llama", tmp_path_factory.mktemp("tiny_rag") / "llama")
    model = dynheads_tl.load_model(str(folder), device="cpu")
    return folder, model, HOTPOT_SETTINGS["headroom"].samples(model.tokenizer, 2, 3, max_tokens=512)


TF_CONFIG = RagConfig(rind_threshold=0.0, max_retrievals=1, max_new_tokens=6)  # fires on the gold's one sentence


def _plain_gold_logprobs(folder, sample, gold: list[int], open_spans: list[tuple[int, int]] | None) -> Tensor:
    """log p(gold[t] | prompt + gold[:t]) from one plain transformers forward (eager, float32) over prompt + gold,
    with a hand-built additive mask: causal; the rows after the context up to the last prompt token (the question)
    see no context; the rows from the last prompt token on (the answer's queries) see only ``open_spans`` of it
    (None: the whole context, no masking at all)."""
    from transformers import AutoModelForCausalLM

    P, (c0, c1) = len(sample.prompt_ids), sample.context_span
    ids = torch.tensor([list(sample.prompt_ids) + gold[:-1]])
    L = ids.shape[1]
    blocked = torch.ones(L, L, dtype=torch.bool).triu(1)
    if open_spans is not None:
        closed = torch.ones(L, dtype=torch.bool)
        for start, end in open_spans:
            closed[start:end] = False
        outside = torch.ones(L, dtype=torch.bool)
        outside[c0:c1] = False
        blocked[c1:P - 1, c0:c1] = True
        blocked[P - 1:] |= (closed & ~outside)[None, :]
    mask = torch.zeros(1, 1, L, L).masked_fill(blocked, float("-inf"))
    reference = AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager",
                                                     dtype=torch.float32).eval()
    with torch.no_grad():
        logits = reference(ids, attention_mask=mask).logits[0, P - 1:].float().log_softmax(-1)
    return logits.gather(-1, torch.tensor(gold)[:, None])[:, 0]


def test_teacher_forced_rag_scores_the_gold_answer_as_a_plain_forward_does(tiny_rag):
    """Teacher-forced, each strategy's gold-token log-probabilities equal one plain forward over prompt + gold under
    the visibility that strategy gives: none (the context closed to the question and the answer), full (nothing
    masked), and static after its retrieval (the windows it opened, visible to the answer's rows only)."""
    from dynheads_tl.protocols.rag import gold_token_ids

    folder, model, samples = tiny_rag
    sample = samples[0]
    gold = gold_token_ids(model.tokenizer, sample)
    assert len(gold) > 1 and not any(c in sample.answers[0] for c in ".!?\n"), "one sentence: RIND reads it at its end"
    scores = torch.rand(model.cfg.n_layers, model.cfg.n_heads, generator=torch.Generator().manual_seed(2))
    results = {strategy: rag_generate(model, sample, HeadSelector(strategy, model, TF_CONFIG, static_scores=scores),
                                      TF_CONFIG, sample_seed=0, gold=gold) for strategy in ("none", "full", "static")}
    for strategy, result in results.items():
        assert result.trace.tokens.tolist() == gold and result.response == model.tokenizer.decode(gold)
        assert len(result.token_logprobs) == len(gold)
    static = results["static"]
    # The gold's one sentence fired RIND at its last token: one retrieval from the answer's start (the last prompt
    # token's query), windows opened inside the context, the gold fed again with them open.
    assert static.retrievals == 1 and static.opened and len(static.rind_values) == 2
    c0, c1 = sample.context_span
    assert all(c0 <= start < end <= c1 for start, end in static.opened)
    assert results["none"].retrievals == 0 and results["none"].visible_context_tokens == 0
    # The loop runs the bridge in float32 after an SDPA prefill, the reference eager attention in one forward:
    # 1e-4 absorbs the op order; the strategies' values differ by 1e-2 on this model (checked below), so a wrong
    # mask would not pass.
    for strategy, spans in (("none", []), ("full", None), ("static", static.opened)):
        expected = _plain_gold_logprobs(folder, sample, gold, spans)
        torch.testing.assert_close(torch.tensor(results[strategy].token_logprobs), expected, atol=1e-4, rtol=1e-4)
    gap = torch.tensor(results["full"].token_logprobs) - torch.tensor(results["none"].token_logprobs)
    assert float(gap.abs().max()) > 1e-3, "the context moves the gold answer's probability on this model"


def test_teacher_forced_strategies_answered_together_match_each_alone(tiny_rag):
    """Teacher-forced, a question's strategies share their gold trunk up to the first retrieval and fork, as
    generated ones do: every strategy's gold log-probabilities, RIND values and windows are those it gets alone, bit
    for bit; and the generated answers are unchanged by the new record (their log-probabilities are the kept
    tokens')."""
    from dynheads_tl.protocols.rag import gold_token_ids

    _, model, samples = tiny_rag
    sample = samples[1]
    gold = gold_token_ids(model.tokenizer, sample)
    scores = torch.rand(model.cfg.n_layers, model.cfg.n_heads, generator=torch.Generator().manual_seed(4))
    strategies = ["static", "none", "fixed_random", "dynamic_random"]
    make = lambda strategy: HeadSelector(strategy, model, TF_CONFIG, static_scores=scores)
    together = rag_generate_many(model, sample, [make(s) for s in strategies], TF_CONFIG, sample_seed=3, gold=gold)
    for strategy, shared in zip(strategies, together):
        alone = rag_generate(model, sample, make(strategy), TF_CONFIG, sample_seed=3, gold=gold)
        assert shared.token_logprobs == alone.token_logprobs and shared.rind_values == alone.rind_values, strategy
        assert shared.opened == alone.opened and shared.heads_used == alone.heads_used, strategy
        assert shared.trace.tokens.tolist() == gold
    assert [r.retrievals for r in together] == [1, 0, 1, 1]
    generated = rag_generate(model, sample, make("static"), TF_CONFIG, sample_seed=3)
    assert len(generated.token_logprobs) == len(generated.trace.tokens)
    assert all(value <= 0 for value in generated.token_logprobs)
    with pytest.raises(ValueError, match="at least one gold token"):
        rag_generate(model, sample, make("none"), TF_CONFIG, gold=[])


def test_teacher_forced_units_are_cached_apart_from_the_answers(tiny_rag, tmp_path, monkeypatch):
    """``run_strategies(teacher_forced=True)``: each (question, strategy) also teacher-forced, its mean gold
    log-probability in ``tf_logprob``, cached under a unit of its own (the answers' keys and files unchanged), read
    back on a rerun."""
    from dynheads_tl.protocols import rag
    from dynheads_tl.protocols.rag import answer_keys, gold_token_ids

    _, model, samples = tiny_rag
    monkeypatch.setenv("DYNHEADS_CACHE", str(tmp_path))
    scores = torch.rand(model.cfg.n_layers, model.cfg.n_heads, generator=torch.Generator().manual_seed(6))
    units = [(s, 0, samples[0]) for s in ("static", "none")]
    answers = answer_keys(model, units, TF_CONFIG, {"test": "rag"}, scores)
    forced = answer_keys(model, units, TF_CONFIG, {"test": "rag"}, scores, teacher_forced=True)
    assert all(key["unit"] == "rag_answer" and "gold" not in key for key in answers)
    gold = gold_token_ids(model.tokenizer, samples[0])
    assert all(key["unit"] == "rag_teacher_forced" and key["gold"] == gold for key in forced)
    run = lambda: run_strategies(model, samples[:1], ["static", "none"], TF_CONFIG, static_scores=scores,
                                 cache_key={"test": "rag"}, teacher_forced=True)
    first = run()
    assert len(list((tmp_path / "results").glob("*.json"))) == 4  # 2 strategies x 1 question x (answer, forced)
    for row in first.itertuples():
        alone = rag_generate(model, samples[0], HeadSelector(row.strategy, model, TF_CONFIG, static_scores=scores),
                             TF_CONFIG, sample_seed=0, gold=gold)
        assert row.tf_logprob == pytest.approx(sum(alone.token_logprobs) / len(gold), abs=1e-12)
        assert row.tf_tokens == len(gold) and row.tf_retrievals == alone.retrievals
    computed: list[int] = []
    original = rag.rag_units
    monkeypatch.setattr(rag, "rag_units", lambda model, units, *args: computed.append(len(units)) or
                        original(model, units, *args))
    assert run().equals(first) and computed == []  # every answer and every forced score read back
    plain = run_strategies(model, samples[:1], ["static", "none"], TF_CONFIG, static_scores=scores,
                           cache_key={"test": "rag"})
    assert computed == [] and "tf_logprob" not in plain  # without teacher forcing: the answers alone, from the cache


# --- the teacher-forced secondary's statistics, on hand-built numbers ------------------------------------------
def _tf_rows(values: dict[str, list[float]]):
    """One row per (question, strategy) with the teacher-forced and generated columns table4 reads."""
    import pandas as pd

    return pd.DataFrame([{"sample": i, "strategy": s, "tf_logprob": v, "tf_tokens": 3, "tf_retrievals": 0 if s in
                          ("none", "full") else 1, "tf_visible_context_tokens": 0 if s == "none" else 10,
                          "em": 0.0, "f1": 0.0, "retrievals": 0, "visible_context_tokens": 0, "context_tokens": 50,
                          "evidence_recall": 0.0} for s, column in values.items() for i, v in enumerate(column)])


# 10 questions: full − none +1 on each; dynamic − static +0.5 on 8 and −0.1 on 2; dynamic − dynamic_random +0.3 on
# each; dynamic − fixed_random +0.1 on 3 (the rest tied: untestable); dynamic − none +0.5, dynamic − full −0.5.
TF_VALUES = {"dynamic": [-0.5] * 10, "static": [-1.0] * 8 + [-0.4] * 2, "dynamic_random": [-0.8] * 10,
             "fixed_random": [-0.6] * 3 + [-0.5] * 7, "none": [-1.0] * 10, "full": [0.0] * 10}


def test_teacher_forced_comparisons_holm_over_dynamic_minus_each_other_strategy():
    from dynheads_tl.claims.dynamic_rag import teacher_forced_comparisons

    table = teacher_forced_comparisons(_tf_rows(TF_VALUES)).set_index(["a", "b"])
    assert list(table.index) == [("full", "none"), ("dynamic", "static"), ("dynamic", "dynamic_random"),
                                 ("dynamic", "fixed_random"), ("dynamic", "none"), ("dynamic", "full")]
    all_ten = 2 / 2 ** 10  # every question on one side
    bounds = table.loc[("full", "none")]
    assert bounds["family"] == "bounds" and bounds["tf_logprob_difference"] == pytest.approx(1.0)
    assert bounds["p_adjusted"] == pytest.approx(all_ten) and bounds["separated"]  # tested alone
    static = table.loc[("dynamic", "static")]
    assert (static["a_better"], static["b_better"], static["n"]) == (8, 2, 10)
    assert static["tf_logprob_difference"] == pytest.approx((8 * 0.5 - 2 * 0.1) / 10)
    assert static["sign_p"] == pytest.approx(2 * (45 + 10 + 1) / 1024)  # two-sided, P(X >= 8 of 10) doubled
    # Holm over the 4 testable secondaries (fixed_random's 3 differing questions cannot reach 0.05, min p 0.25):
    # the three p = 2/1024 become 4x, 3x, 2x that (running maximum: all 4x); static's 0.109 keeps 1x.
    for b in ("dynamic_random", "none", "full"):
        assert table.loc[("dynamic", b), "p_adjusted"] == pytest.approx(4 * all_ten)
        assert table.loc[("dynamic", b), "separated"]
    assert static["p_adjusted"] == pytest.approx(static["sign_p"]) and not static["separated"]
    fixed = table.loc[("dynamic", "fixed_random")]
    assert not fixed["testable"] and fixed["p_adjusted"] != fixed["p_adjusted"] and not fixed["separated"]
    assert table.loc[("dynamic", "full"), "tf_logprob_difference"] == pytest.approx(-0.5)
    import pandas as pd

    assert teacher_forced_comparisons(pd.DataFrame({"sample": [0], "strategy": ["none"], "f1": [0.0]})).empty


def test_table4_carries_the_teacher_forced_measure_with_n_and_interval():
    import numpy as np

    values = {**TF_VALUES, "static": [-1.0] * 8 + [-0.4] + [float("nan")]}  # one question without a gold token
    table = table4(_tf_rows(values)).set_index("strategy")
    assert table.loc["dynamic", "tf_n"] == 10 and table.loc["static", "tf_n"] == 9
    assert table.loc["static", "tf_logprob"] == pytest.approx((8 * -1.0 - 0.4) / 9)
    assert table.loc["dynamic", "tf_logprob"] == table.loc["dynamic", "tf_logprob_low"] == -0.5  # all equal
    s = table.loc["static"]
    assert s["tf_logprob_low"] <= s["tf_logprob"] <= s["tf_logprob_high"] and s["tf_logprob_low"] < s["tf_logprob_high"]
    assert table.loc["none", "tf_visible_context_share"] == 0 and table.loc["full", "tf_visible_context_share"] == 0.2
    assert not np.isnan(table["tf_logprob"]).any()


def test_the_teacher_forced_verdict_names_n_the_data_and_ranks_only_with_headroom():
    from dynheads_tl.claims.dynamic_rag import teacher_forced_comparisons, teacher_forced_verdict

    rows = _tf_rows(TF_VALUES)
    text = teacher_forced_verdict(table4(rows), teacher_forced_comparisons(rows))
    bounds, family = text.split(" Teacher-forced, ")
    assert bounds.startswith("Teacher-forced gold-answer log-probability (secondary measure, nats/token, n = 10 "
                             "synthetic HotpotQA-format questions): full context 0.000")
    assert "full − none +1.000 [+1.000, +1.000] (10 questions higher with the context, 0 lower, sign test alone " \
           "p = 0.002)" in bounds and bounds.endswith("so the strategies can be compared on it.")
    assert "Holm over its 4 testable comparisons; paired over n = 10 synthetic HotpotQA-format questions" in family
    assert "against Dynamic Random higher: +0.300" in family and "Holm-adjusted 0.008" in family
    assert "against Full context (upper bound) lower: -0.500" in family
    assert "against Static cannot be told apart (the design detects log-probability differences of about" in family
    assert "against Fixed Random cannot be tested: +0.030" in family and "untestable, left out of the family" in family
    for word in ("reproduced", "supported", "undetermined"):  # a secondary: no status word of its own
        assert word not in text
    # No headroom: full no better than none on the gold answer -> nothing ranked, every comparison for the record.
    flat = _tf_rows({**TF_VALUES, "full": [-1.0] * 10})
    text = teacher_forced_verdict(table4(flat), teacher_forced_comparisons(flat), data="HotpotQA questions")
    assert "does not raise the gold answer's probability separably, so the comparisons below rank nothing" in text
    assert "against Dynamic Random for the record" in text and " higher:" not in text and " lower:" not in text
    assert "n = 10 HotpotQA questions" in text
    assert teacher_forced_verdict(table4(flat.drop(columns=["tf_logprob"])), teacher_forced_comparisons(flat)) == ""


def test_the_teacher_forced_secondary_reaches_the_findings_but_not_the_status(tmp_path):
    """Written as the notebook writes them, the teacher-forced CSV adds its sentences to the case study's finding in
    verdicts.json; Table 4's status (the declared rule on answer F1) is the same with or without it."""
    import json

    from dynheads_tl import verdicts
    from dynheads_tl.claims.dynamic_rag import (CLAIM, TEACHER_FORCED_COMPARISONS, comparison_table,
                                                teacher_forced_comparisons)

    rows = _tf_rows(TF_VALUES)
    rows["f1"] = rows["strategy"].map({"full": 1.0, "none": 0.0}).fillna(0.5)
    table4(rows).to_csv(tmp_path / "table4_rag.csv", index=False)
    comparison_table(rows).to_csv(tmp_path / "table4_comparisons.csv", index=False)
    (tmp_path / "table4_rag.config.json").write_text(json.dumps({"hotpot_source": "synthetic", "model": "tiny"}))
    before = verdicts.build(CLAIM, tmp_path)
    teacher_forced_comparisons(rows).to_csv(tmp_path / f"{TEACHER_FORCED_COMPARISONS}.csv", index=False)
    after = verdicts.build(CLAIM, tmp_path)
    [finding] = after["findings"]
    forced = [s for s in finding["sentences"] if s.startswith("Teacher-forced")]
    assert len(forced) == 2 and "secondary" in forced[0] and "secondary family" in forced[1]
    assert finding["sentences"][0].startswith("Primary comparison (declared): Dynamic (probe)")
    assert not any(s.startswith("Teacher-forced") for s in before["findings"][0]["sentences"])
    assert [i["status"] for i in after["items"]] == [i["status"] for i in before["items"]]
    assert "teacher-forced gold log-probability (secondary, nats/token, n = 10 questions): dynamic −0.50" in \
        after["items"][0]["why"]
