"""Samples: exact spans from offsets, the paper's prompt, bad input, metrics."""
from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from dynheads_tl.engine.models import embedded_model_dir
from dynheads_tl.tasks import (
    NiahConfig, build_niah_sample, exact_match, load_hotpot_records, make_hotpot_samples,
    make_niah_samples, niah_accuracy, normalize_answer, rouge_l, synthetic_hotpot_records, token_f1,
)
from dynheads_tl.tasks.common import locate_spans
from dynheads_tl.tasks.hotpot import build_hotpot_sample


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(embedded_model_dir())


@pytest.mark.parametrize("haystack", ["filler", "prose"])
@pytest.mark.parametrize("depth", [0.0, 0.37, 1.0])
def test_needle_span_decodes_to_the_needle(tokenizer, haystack, depth):
    sample = build_niah_sample(tokenizer, NiahConfig(context_tokens=300, depth=depth, haystack=haystack, seed=5))
    (start, end), = sample.evidence_spans
    decoded = tokenizer.decode(sample.prompt_ids[start:end])
    assert decoded.strip() == sample.meta["needle_text"]
    # The span is tight: one token less on either side loses part of the needle.
    assert sample.meta["needle_text"] not in tokenizer.decode(sample.prompt_ids[start + 1:end])
    assert sample.meta["needle_text"] not in tokenizer.decode(sample.prompt_ids[start:end - 1])
    assert abs(sample.meta["context_len"] - 300) <= 30
    assert sample.context_span[0] <= start and end <= sample.context_span[1]


def test_prompt_follows_the_papers_template(tokenizer):
    sample = build_niah_sample(tokenizer, NiahConfig(context_tokens=100, seed=1))
    text = tokenizer.decode(sample.prompt_ids)
    assert "You are a helpful AI bot that answers questions for a user. Keep your response short and direct." in text
    assert "Context:\n" in text and "\nQuestion:\nWhat is the magic word?\nInstruction:\nDon't give information" in text
    assert text.rstrip().endswith("assistant")


def test_needle_inserted_at_a_sentence_boundary(tokenizer):
    sample = build_niah_sample(tokenizer, NiahConfig(context_tokens=300, depth=0.5, seed=2))
    (start, _), = sample.evidence_spans
    before = tokenizer.decode(sample.prompt_ids[:start]).rstrip()
    assert before.endswith(".")


def test_seeded_uuids_are_reproducible_and_distinct(tokenizer):
    a = make_niah_samples(tokenizer, n=3, context_tokens=100, seed=0)
    b = make_niah_samples(tokenizer, n=3, context_tokens=100, seed=0)
    c = make_niah_samples(tokenizer, n=3, context_tokens=100, seed=1)
    assert [s.answers for s in a] == [s.answers for s in b]
    assert len({s.answers[0] for s in a + c}) == 6


def test_random_layout_varies_depth_and_haystack_text_reproducibly(tokenizer):
    a = make_niah_samples(tokenizer, n=4, context_tokens=300, seed=3, haystack="prose", random_layout=True)
    b = make_niah_samples(tokenizer, n=4, context_tokens=300, seed=3, haystack="prose", random_layout=True)
    c = make_niah_samples(tokenizer, n=4, context_tokens=300, seed=4, haystack="prose", random_layout=True)
    assert [s.prompt_ids for s in a] == [s.prompt_ids for s in b]
    contexts = lambda samples: {tuple(s.prompt_ids[s.context_span[0]: s.context_span[0] + 20]) for s in samples}
    assert len(contexts(a) | contexts(c)) == 8, "each sample starts the haystack somewhere else"
    depths = [s.meta["depth"] for s in a + c]
    assert all(0 <= d <= 1 for d in depths) and depths[:4] != depths[4:]
    assert depths[:4] != [(i + 0.5) / 4 for i in range(4)], "not the evenly spread depths of the default layout"
    assert len(set(depths)) >= 6
    for sample in a + c:
        (start, end), = sample.evidence_spans
        assert tokenizer.decode(sample.prompt_ids[start:end]).strip() == sample.meta["needle_text"]
        assert abs(sample.meta["context_len"] - 300) <= 30
        assert 0 <= sample.meta["actual_depth"] <= 1
    # Offset 0 is the old layout exactly (so cached traces of the default splits keep their keys).
    plain = build_niah_sample(tokenizer, NiahConfig(context_tokens=300, depth=0.4, seed=9))
    zero = build_niah_sample(tokenizer, NiahConfig(context_tokens=300, depth=0.4, seed=9, haystack_offset=0))
    assert plain.prompt_ids == zero.prompt_ids
    with pytest.raises(ValueError, match="not both"):
        make_niah_samples(tokenizer, n=1, context_tokens=300, depths=[0.5], random_layout=True)


@pytest.mark.parametrize("bad", [{"depth": 1.5}, {"depth": -0.1}, {"context_tokens": 3}, {"needle": "no slot"},
                                 {"haystack_offset": -1}])
def test_bad_niah_config_fails_with_a_sentence(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        NiahConfig(**bad)


def test_context_longer_than_model_maximum(tokenizer):
    with pytest.raises(ValueError, match="maximum context"):
        build_niah_sample(tokenizer, NiahConfig(context_tokens=2000), max_tokens=1024)


def test_needle_absent_from_prompt(tokenizer, monkeypatch):
    import dynheads_tl.tasks.niah as niah

    monkeypatch.setattr(niah, "build_chat_prompt", lambda tok, context, q, i: "nothing here")
    with pytest.raises(ValueError, match="absent"):
        build_niah_sample(tokenizer, NiahConfig(context_tokens=100))


def test_locate_spans_rejects_missing_text():
    with pytest.raises(ValueError, match="not in the prompt"):
        locate_spans([(0, 3), (3, 6)], [(10, 12)])


def test_hotpot_supporting_fact_spans(tokenizer):
    records = synthetic_hotpot_records(4, seed=9)
    for record, sample in zip(records, make_hotpot_samples(tokenizer, n=4, records=records)):
        titles = dict((t, s) for t, s in record["context"])
        expected = [titles[t][i] for t, i in record["supporting_facts"]]
        decoded = [tokenizer.decode(sample.prompt_ids[s:e]).strip() for s, e in sample.evidence_spans]
        assert decoded == expected
        assert sample.answers == [record["answer"]]


def test_hotpot_synthetic_is_seeded_and_answerable():
    a, b = synthetic_hotpot_records(6, seed=4), synthetic_hotpot_records(6, seed=4)
    assert a == b
    assert {r["type"] for r in a} == {"bridge", "comparison"}
    for record in a:
        text = json.dumps(record["context"])
        assert record["answer"] in text
        assert len(record["context"]) == 10


def test_hotpot_context_length_and_depth(tokenizer):
    shallow = make_hotpot_samples(tokenizer, n=1, seed=2, context_tokens=600, depth=0.05)[0]
    deep = make_hotpot_samples(tokenizer, n=1, seed=2, context_tokens=600, depth=0.95)[0]
    for sample in (shallow, deep):
        assert 450 <= sample.meta["context_len"] <= 650
    assert shallow.meta["actual_depth"] < 0.3 < 0.6 < deep.meta["actual_depth"]


def test_hotpot_loader_reads_json_and_jsonl_and_rejects_missing_fields(tmp_path, tokenizer):
    records = synthetic_hotpot_records(2, seed=1)
    (tmp_path / "a.json").write_text(json.dumps(records))
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    assert load_hotpot_records(tmp_path / "a.json") == records
    assert load_hotpot_records(tmp_path / "a.jsonl") == records
    broken = dict(records[0])
    del broken["supporting_facts"]
    (tmp_path / "b.json").write_text(json.dumps([broken]))
    with pytest.raises(ValueError, match="missing the field"):
        load_hotpot_records(tmp_path / "b.json")
    with pytest.raises(ValueError, match="missing the field"):
        build_hotpot_sample(tokenizer, broken)


def test_squad_metrics_known_values():
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert exact_match("the eiffel tower", "Eiffel Tower.") == 1.0
    assert token_f1("Eiffel Tower in Paris", "Eiffel Tower") == pytest.approx(2 * 0.5 * 1 / 1.5)
    assert token_f1("yes", "no") == 0.0 and token_f1("yes it is", "yes") == 0.0
    assert token_f1("yes", "yes") == 1.0
    assert rouge_l("x y z w", "x z w") == pytest.approx(2 * (3 / 4) * 1 / (3 / 4 + 1))
    assert niah_accuracy("The magic word is 1234-ab.", "1234-ab") == 1.0
    assert niah_accuracy("The magic word is 1234-a", "1234-ab") == 0.0


def test_headroom_setting_is_seeded_single_hop_with_exact_spans(tokenizer):
    from dynheads_tl.tasks import HEADROOM
    from dynheads_tl.tasks.hotpot import HOTPOT_DEMONSTRATIONS

    records = HEADROOM.records(8, seed=3)
    assert records == HEADROOM.records(8, seed=3) and records != HEADROOM.records(8, seed=4)
    assert {r["type"] for r in records} == {"single_birthplace", "single_director"}
    samples = HEADROOM.samples(tokenizer, 8, seed=3)
    for record, sample in zip(records, samples):
        assert len(record["context"]) == 2 and len(record["supporting_facts"]) == 1
        [(title, index)] = record["supporting_facts"]
        sentence = dict((t, s) for t, s in record["context"])[title][index]
        assert record["answer"] in sentence  # single hop: the one supporting sentence holds the answer
        [(start, end)] = sample.evidence_spans
        assert tokenizer.decode(sample.prompt_ids[start:end]).strip() == sentence
        prompt = tokenizer.decode(sample.prompt_ids)
        assert all(demo_answer in prompt for _, _, demo_answer in HOTPOT_DEMONSTRATIONS)
        # the evidence lies inside the real context, never in a demonstration's
        c0, c1 = sample.context_span
        assert c0 <= start < end <= c1 and prompt.index(HOTPOT_DEMONSTRATIONS[-1][2]) < len(tokenizer.decode(sample.prompt_ids[:c0]))


def test_fewer_distractors_keeps_every_gold_paragraph():
    from dynheads_tl.tasks.hotpot import with_fewer_distractors

    record = synthetic_hotpot_records(1, seed=2)[0]  # a bridge question: two gold paragraphs of ten
    cut = with_fewer_distractors(record, 3)
    gold = {t for t, _ in record["supporting_facts"]}
    assert len(cut["context"]) == 3 and gold <= {t for t, _ in cut["context"]}
    assert [p for p in cut["context"]] == [p for p in record["context"] if p in cut["context"]]  # order kept
    assert len(with_fewer_distractors(record, 1)["context"]) == 2  # gold paragraphs are never dropped


def test_placebo_sample_moves_the_evidence_into_free_context():
    from dynheads_tl.tasks.common import Sample, placebo_sample

    sample = Sample("hotpot", list(range(40)), [(10, 14), (20, 22)], ["x"], "q?", (5, 35))
    placebo = placebo_sample(sample, seed=1)
    assert placebo.prompt_ids == sample.prompt_ids and placebo.context_span == sample.context_span
    assert sorted(e - s for s, e in placebo.evidence_spans) == [2, 4]
    taken = set()
    for start, end in placebo.evidence_spans:
        assert 5 <= start < end <= 35
        positions = set(range(start, end))
        assert not positions & (set(range(10, 14)) | set(range(20, 22))) and not positions & taken
        taken |= positions
    assert placebo_sample(sample, seed=1).evidence_spans == placebo.evidence_spans
    assert len({tuple(placebo_sample(sample, seed=s).evidence_spans) for s in range(10)}) > 1
    crowded = Sample("hotpot", list(range(12)), [(2, 8)], ["x"], "q?", (2, 10))
    with pytest.raises(ValueError, match="no free room"):
        placebo_sample(crowded, seed=0)
