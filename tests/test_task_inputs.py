"""Bad task input fails first, with a sentence that names what was wrong; good input loads unchanged.

HotpotQA files (format told by content, line numbers, encodings, incomplete records), haystack
folders, and context lengths checked against the model's window. Only the tokenizer is loaded.
"""
from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
from transformers import AutoTokenizer

from dynheads_tl.engine.models import embedded_model_dir
from dynheads_tl.tasks import (
    PROMPT_TEMPLATE_TOKENS,
    HotpotConfig,
    HotpotRecords,
    build_hotpot_sample,
    check_context_fits,
    check_haystack,
    check_hotpot_source,
    load_haystack,
    load_hotpot_records,
    make_hotpot_samples,
    make_niah_samples,
    tokenizer_max_tokens,
)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(embedded_model_dir())


def official_record(i: int, *, missing_title: bool = False, out_of_range: bool = False) -> dict:
    """A small record in the official distractor-setting schema; optionally with a supporting fact
    that is not in its context, as in the fullwiki files."""
    facts = [[f"Gold {i}", 0], [f"Bridge {i}", 1]]
    if missing_title:
        facts[1] = [f"Retrieved elsewhere {i}", 0]
    if out_of_range:
        facts[1] = [f"Bridge {i}", 7]
    return {
        "_id": f"id{i}", "question": f"Where was person {i} born?", "answer": f"Town {i}",
        "type": "bridge", "level": "easy",
        "context": [[f"Gold {i}", [f"Person {i} directed a film."]],
                    [f"Bridge {i}", [f"The director is {i}.", f"Person {i} was born in Town {i}."]],
                    [f"Other {i}", ["An unrelated sentence."]]],
        "supporting_facts": facts,
    }


def write_jsonl(path, lines: list[str]) -> None:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


# --- HotpotQA files ---------------------------------------------------------------------------
def test_json_file_holding_json_lines_loads_like_the_array(tmp_path):
    records = [official_record(i) for i in range(3)]
    (tmp_path / "array.json").write_text(json.dumps(records, indent=1), encoding="utf-8")
    write_jsonl(tmp_path / "lines.json", [json.dumps(r) for r in records])
    write_jsonl(tmp_path / "lines.jsonl", [json.dumps(r) for r in records])
    array = load_hotpot_records(tmp_path / "array.json")
    assert load_hotpot_records(tmp_path / "lines.json") == array == records
    assert load_hotpot_records(tmp_path / "lines.jsonl") == records
    assert isinstance(array, HotpotRecords) and array.skipped == 0
    assert array.source == str(tmp_path / "array.json")
    assert load_hotpot_records(tmp_path / "lines.json", limit=2) == records[:2]


def test_json_lines_keep_records_with_line_separator_characters_whole(tmp_path):
    # U+2028 is legal inside a JSON string; splitlines() would cut this record in two.
    record = official_record(0)
    record["question"] = "Where\u2028was person 0 born?"
    write_jsonl(tmp_path / "sep.jsonl", [json.dumps(record, ensure_ascii=False), json.dumps(official_record(1))])
    assert load_hotpot_records(tmp_path / "sep.jsonl")[0]["question"] == record["question"]


def test_bad_jsonl_line_is_reported_with_its_line_in_the_file(tmp_path):
    good = json.dumps(official_record(0))
    write_jsonl(tmp_path / "bad.jsonl", ["", good, "", "   ", json.dumps(official_record(1)), '{"question": "cut off', good])
    with pytest.raises(ValueError, match=r"bad\.jsonl', line 6: not valid JSON"):
        load_hotpot_records(tmp_path / "bad.jsonl")
    # The same content under a .json name is told apart by content and reported the same way.
    (tmp_path / "bad.json").write_bytes((tmp_path / "bad.jsonl").read_bytes())
    with pytest.raises(ValueError, match=r"bad\.json', line 6: not valid JSON"):
        load_hotpot_records(tmp_path / "bad.json")


def test_bad_json_array_is_reported_with_line_and_column(tmp_path):
    text = json.dumps([official_record(0), official_record(1)], indent=1)
    (tmp_path / "broken.json").write_text(text[:-40], encoding="utf-8")
    with pytest.raises(ValueError, match=r"broken\.json' is not valid JSON: .* at line \d+, column \d+"):
        load_hotpot_records(tmp_path / "broken.json")


def test_non_utf8_hotpot_file_names_the_file_and_byte_offset(tmp_path):
    data = json.dumps([official_record(0)]).encode("utf-8")
    at = data.index(b"Person 0")
    (tmp_path / "latin1.json").write_bytes(data[:at] + b"\xe9" + data[at:])
    with pytest.raises(ValueError, match=rf"latin1\.json' is not valid UTF-8: byte 0xe9 at byte offset {at} "):
        load_hotpot_records(tmp_path / "latin1.json")


def test_missing_hotpot_file_names_the_path(tmp_path):
    missing = tmp_path / "nowhere.json"
    with pytest.raises(FileNotFoundError, match=rf"HotpotQA file '{re.escape(str(missing))}' does not exist"):
        load_hotpot_records(missing)


@pytest.mark.parametrize("content, message", [
    ("", "is empty"),
    ("42", "holds a JSON int"),
])
def test_hotpot_file_that_holds_no_records(tmp_path, content, message):
    (tmp_path / "odd.json").write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        load_hotpot_records(tmp_path / "odd.json")


def test_record_missing_fields_names_file_record_line_and_fields(tmp_path):
    broken = official_record(1)
    del broken["answer"], broken["supporting_facts"]
    write_jsonl(tmp_path / "fields.jsonl", [json.dumps(official_record(0)), "", json.dumps(broken)])
    with pytest.raises(ValueError, match=r"fields\.jsonl', record 2 \(line 3\) is missing the field\(s\) "
                                         r"\['answer', 'supporting_facts'\]"):
        load_hotpot_records(tmp_path / "fields.jsonl")
    (tmp_path / "fields.json").write_text(json.dumps([official_record(0), broken]), encoding="utf-8")
    with pytest.raises(ValueError, match=r"fields\.json', record 2 is missing the field\(s\)"):
        load_hotpot_records(tmp_path / "fields.json")


def test_record_with_misshapen_context_names_the_field(tmp_path):
    broken = official_record(0)
    broken["context"] = {"title": ["a"], "sentences": [["b"]]}  # the datasets layout, not the official one
    (tmp_path / "shape.json").write_text(json.dumps([broken]), encoding="utf-8")
    with pytest.raises(ValueError, match=r"record 1: field 'context' must be a list of \[title, \[sentence"):
        load_hotpot_records(tmp_path / "shape.json")


def test_incomplete_records_are_counted_and_reported_in_one_error(tmp_path):
    records = [official_record(0), official_record(1, missing_title=True), official_record(2),
               official_record(3, out_of_range=True), official_record(4)]
    write_jsonl(tmp_path / "fullwiki.jsonl", [json.dumps(r) for r in records])
    with pytest.raises(ValueError) as error:
        load_hotpot_records(tmp_path / "fullwiki.jsonl")
    message = str(error.value)
    # Record 3's out-of-range sentence index is tolerated (it occurs in the official distractor files).
    assert "1 of 5 records have supporting facts whose paragraph is not in their own context" in message
    assert "first: record 2 (line 2)" in message
    assert "fullwiki" in message and "distractor setting" in message
    assert "skip_incomplete=True (notebook parameter hotpot_skip_incomplete=True)" in message

    kept = load_hotpot_records(tmp_path / "fullwiki.jsonl", skip_incomplete=True)
    assert kept == [records[0], records[2], records[3], records[4]]
    assert kept.skipped == 1
    # With skip_incomplete, limit counts complete records.
    first_two = load_hotpot_records(tmp_path / "fullwiki.jsonl", limit=2, skip_incomplete=True)
    assert first_two == [records[0], records[2]] and first_two.skipped == 1


def test_check_hotpot_source_with_too_few_records(tmp_path):
    records = [official_record(i, missing_title=i in (2, 5)) for i in range(9)]
    (tmp_path / "small.json").write_text(json.dumps(records), encoding="utf-8")
    path = tmp_path / "small.json"
    expected = (f"HotpotQA file '{path}' has 7 usable records (2 skipped as incomplete); the splits asked "
                "for need 30 (calibration 10 + analysis 20).")
    with pytest.raises(ValueError, match=re.escape(expected)):
        check_hotpot_source(path, 30, skip_incomplete=True, needed_for="calibration 10 + analysis 20")
    with pytest.raises(ValueError, match="2 of 9 records"):
        check_hotpot_source(path, 5)
    assert check_hotpot_source(path, 7, skip_incomplete=True) == 7
    assert check_hotpot_source("synthetic", 30) == 30


def test_check_hotpot_source_hf_without_datasets(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "datasets" else real(name, *a))
    with pytest.raises(ImportError, match="pip install datasets"):
        check_hotpot_source("hf", 10)


def test_make_hotpot_samples_refuses_fewer_records_than_asked(tokenizer):
    records = HotpotRecords([official_record(0), official_record(1)], source="two.json")
    with pytest.raises(ValueError, match=r"asked for n=3 samples but was given only 2 record\(s\) from 'two\.json'"):
        make_hotpot_samples(tokenizer, n=3, records=records)


def test_hotpot_context_longer_than_the_model_fails_before_tokenizing(tokenizer):
    with pytest.raises(ValueError, match=r"HotpotQA context_tokens=9000 .* maximum context of 8,192 tokens"):
        build_hotpot_sample(tokenizer, official_record(0), HotpotConfig(context_tokens=9000))


def test_hotpot_context_short_of_distractors_fails(tokenizer):
    with pytest.raises(ValueError, match="distractor pool hold only .* short of context_tokens=2000"):
        build_hotpot_sample(tokenizer, official_record(0), HotpotConfig(context_tokens=2000))


# --- haystacks --------------------------------------------------------------------------------
def test_haystack_folder_that_does_not_exist(tmp_path):
    missing = tmp_path / "essays"
    for check in (lambda spec: check_haystack(spec), lambda spec: load_haystack(spec)):
        with pytest.raises(ValueError, match=rf"Haystack folder '{re.escape(str(missing))}' does not exist\."):
            check(f"folder:{missing}")


def test_haystack_folder_without_txt_files(tmp_path):
    (tmp_path / "notes.md").write_text("Some text.", encoding="utf-8")
    with pytest.raises(ValueError, match="holds no .txt files"):
        check_haystack(f"folder:{tmp_path}")


def test_haystack_folder_of_empty_files(tmp_path):
    (tmp_path / "a.txt").write_text("", encoding="utf-8")
    (tmp_path / "b.txt").write_text("  \n\t \n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"has 2 \.txt file\(s\), but all are empty or whitespace"):
        check_haystack(f"folder:{tmp_path}")
    with pytest.raises(ValueError, match="all are empty or whitespace"):
        load_haystack(f"folder:{tmp_path}")


def test_haystack_file_that_is_not_utf8(tmp_path):
    (tmp_path / "a.txt").write_text("Plain text. ", encoding="utf-8")
    (tmp_path / "b.txt").write_bytes(b"Caf\xe9 society.")
    with pytest.raises(ValueError, match=r"Haystack file '.*b\.txt' is not valid UTF-8: byte 0xe9 at byte offset 3"):
        check_haystack(f"folder:{tmp_path}")


@pytest.mark.parametrize("spec, message", [
    ("folder:", "names no folder"),
    ("novels", "Unknown haystack 'novels'"),
    (None, "must be a string"),
])
def test_bad_haystack_spec(spec, message):
    with pytest.raises(ValueError, match=message):
        check_haystack(spec)


def test_check_haystack_counts_distinct_text(tmp_path):
    (tmp_path / "a.txt").write_text("One sentence.\n\nTwo  sentences.", encoding="utf-8")
    assert check_haystack(f"folder:{tmp_path}") == len("One sentence. Two sentences.")
    assert check_haystack("filler") > 0 and check_haystack("prose") > 10_000
    with pytest.raises(ValueError, match="28 characters of distinct text; 1,000 are required"):
        check_haystack(f"folder:{tmp_path}", min_chars=1000)


def test_niah_context_that_collapses_fails(tokenizer, monkeypatch):
    import dynheads_tl.tasks.niah as niah

    # A haystack of whitespace (what an empty folder once gave): the context would be the needle alone.
    monkeypatch.setattr(niah, "load_haystack", lambda source, min_chars=0: " " * max(min_chars, 5000))
    with pytest.raises(ValueError, match=r"has \d+ tokens, clearly fewer than the \d+ planned for context_tokens=200"):
        make_niah_samples(tokenizer, n=1, context_tokens=200, haystack="folder:/whitespace-only")


def test_long_context_reloads_a_longer_haystack_with_the_same_start(tokenizer):
    from dynheads_tl.tasks.niah import _haystack_for

    short_text, short_offsets = _haystack_for(tokenizer, "filler", 1000)
    long_text, long_offsets = _haystack_for(tokenizer, "filler", len(short_offsets) + 500)
    assert len(long_offsets) >= len(short_offsets) + 500
    assert long_text.startswith(short_text) and long_offsets[:1000] == short_offsets[:1000]


# --- context length ---------------------------------------------------------------------------
def test_check_context_fits_states_the_models_limit():
    expected = (f"context_tokens=100000 plus about {PROMPT_TEMPLATE_TOKENS} prompt-template tokens and "
                f"max_new_tokens=40 exceeds the model's context window of 8,192 tokens; use at most "
                f"{8192 - PROMPT_TEMPLATE_TOKENS - 40:,}.")
    with pytest.raises(ValueError, match=re.escape(expected)):
        check_context_fits(100000, 40, 8192)
    with pytest.raises(ValueError, match=r"niah_contexts \(largest 9000\) plus about 60 prompt-template"):
        check_context_fits([1000, 9000], 24, 8192, name="niah_contexts", template_tokens=60)
    assert check_context_fits(8092, 40, 8192, template_tokens=60) == 8092
    assert check_context_fits(None, 16, 8192) == 8192 - PROMPT_TEMPLATE_TOKENS - 16


@pytest.mark.parametrize("args, message", [
    ((0, 40, 8192), "context_tokens must hold positive integers"),
    ((1000, -1, 8192), "max_new_tokens must be an integer >= 0"),
    ((1000, 40, "8192"), "n_ctx must be an integer >= 1"),
    ((100, 600, 512), "max_new_tokens=600 alone leaves no room"),
])
def test_check_context_fits_rejects_bad_numbers(args, message):
    with pytest.raises(ValueError, match=message):
        check_context_fits(*args)


def test_tokenizer_limit_fallback(tokenizer, monkeypatch):
    # The embedded tokenizer reports transformers' 1e30 sentinel; its folder's config.json has 8,192.
    assert tokenizer.model_max_length >= 10**7
    assert tokenizer_max_tokens(tokenizer) == 8192
    # The README call without max_tokens: stated against the model's window, not the haystack.
    with pytest.raises(ValueError, match=r"context_tokens=100000 with max_new_tokens=24 exceeds the model's "
                                         r"maximum context of 8,192 tokens even before the prompt template"):
        make_niah_samples(tokenizer, n=1, context_tokens=100_000, seed=0)
    # Close to the limit the estimate passes, and the exact prompt count catches it.
    with pytest.raises(ValueError, match="exceeds the model's maximum context of 8192 tokens"):
        make_niah_samples(tokenizer, n=1, context_tokens=8150, seed=0)
    # A real model_max_length wins over config.json.
    monkeypatch.setattr(tokenizer, "model_max_length", 512)
    assert tokenizer_max_tokens(tokenizer) == 512
    with pytest.raises(ValueError, match="maximum context of 512 tokens"):
        make_niah_samples(tokenizer, n=1, context_tokens=600, seed=0)
    # An explicit max_tokens wins over both.
    assert len(make_niah_samples(tokenizer, n=1, context_tokens=600, seed=0, max_tokens=2048)) == 1
    # Nothing known: no limit (and no reading of a config.json in the working directory).
    assert tokenizer_max_tokens(SimpleNamespace(model_max_length=int(1e30), name_or_path="")) is None


def test_claim_1_reports_how_many_records_were_skipped(tmp_path):
    from dynheads_tl.claims.dynamism import records_skipped

    records = [official_record(0), official_record(1, missing_title=True), official_record(2)]
    (tmp_path / "mixed.json").write_text(json.dumps(records), encoding="utf-8")
    assert records_skipped(str(tmp_path / "mixed.json"), True) == 1
    with pytest.raises(ValueError, match="1 of 3 records"):
        records_skipped(str(tmp_path / "mixed.json"), False)
