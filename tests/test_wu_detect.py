"""Wu et al.'s detection data as a NIAH source (issue #31): the fixture under tests/data/wu_detect (text written for
this project, in Wu's haystack_for_detect layout), the span rule and the newline stop against hand computations,
validation before model work, and the acceptance check: the suite's Wu scores equal an independent plain-transformers
implementation of Wu's detection loop on the same prompts."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from factories import make_trace
from dynheads_tl.tasks import check_haystack, make_niah_samples
from dynheads_tl.tasks.wu_detect import (WU_DECODE_STEPS, load_wu_detection, newline_stop, truncate_at_newline,
                                         wu_needle_span)

FIXTURE = Path(__file__).parent / "data" / "wu_detect"
SPEC = f"wu:{FIXTURE}"


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from dynheads_tl.engine.models import embedded_model_dir

    return AutoTokenizer.from_pretrained(embedded_model_dir())


def test_span_rule_on_hand_built_ids():
    # needle ids {1, 2, 3, 4}: the window at 1 holds {1, 2, 3} (3/4 = 0.75), the one at 5 all four.
    assert wu_needle_span([5, 1, 2, 3, 9, 1, 2, 3, 4], [1, 2, 3, 4]) == (5, 9)
    # The rule asks for MORE than 90%: 9 of 10 distinct ids is not enough, 10 of 10 is; the first such window wins.
    needle = list(range(10, 20))
    assert wu_needle_span([0] + needle[:9] + [0], needle) is None
    assert wu_needle_span(needle + needle, needle) == (0, 10)
    # The window has the needle's token count, duplicates included (distinct ids are what is compared)
    assert wu_needle_span([7, 1, 1, 2, 8], [1, 1, 2]) == (1, 4)
    assert wu_needle_span([1, 2, 3], []) is None


def test_span_rule_finds_the_needle_the_character_offsets_find(tokenizer):
    """On the fixture, real_needle tokenized alone differs from its tokens in context (no leading space), yet the
    span rule's window is exactly the tokens that the prompt's character offsets put under real_needle."""
    samples = make_niah_samples(tokenizer, n=4, context_tokens=300, seed=0, haystack=SPEC)
    for sample in samples:
        rendered = tokenizer.decode(sample.prompt_ids)
        start = rendered.index(sample.answers[0])
        encoded = tokenizer(rendered, add_special_tokens=False, return_offsets_mapping=True)
        assert list(encoded["input_ids"]) == sample.prompt_ids
        covering = [i for i, (s, e) in enumerate(encoded["offset_mapping"])
                    if e > s and s < start + len(sample.answers[0]) and e > start]
        assert sample.evidence_spans == [(covering[0], covering[-1] + 1)]
        assert sample.meta["prompt_kind"] == "chat"  # the embedded model has a chat template
    # Needles cycle, depths are stratified, and two seeds give different prompts
    assert [s.meta["needle_index"] for s in samples] == [0, 1, 0, 1]
    assert [int(s.meta["depth"] * 4) for s in samples] == [0, 1, 2, 3]
    other = make_niah_samples(tokenizer, n=4, context_tokens=300, seed=1, haystack=SPEC)
    assert all(a.prompt_ids != b.prompt_ids for a, b in zip(samples, other))


def test_base_and_chat_prompts_are_wus(tokenizer):
    chat = make_niah_samples(tokenizer, n=1, context_tokens=300, seed=0, haystack=f"wu-chat:{FIXTURE}")[0]
    base = make_niah_samples(tokenizer, n=1, context_tokens=300, seed=0, haystack=f"wu-base:{FIXTURE}")[0]
    question = "Based on the content of the book, Question: What is the secret ingredient in grandmother's soup?\nAnswer:"
    chat_text, base_text = tokenizer.decode(chat.prompt_ids), tokenizer.decode(base.prompt_ids)
    assert f"</book>\n{question}<|im_end|>\n<|im_start|>assistant\n" in chat_text and "<book>" in chat_text
    assert base_text.endswith(question) and "<book>" not in base_text and "<|im_start|>" not in base_text
    # The same context in both: its token count is context_tokens minus Wu's rounding at the "." boundary
    assert abs((chat.context_span[1] - chat.context_span[0]) - 300) <= 5


def test_newline_stop_and_truncation_by_hand(tokenizer):
    ids = tokenizer("yes it is\nand more", add_special_tokens=False)["input_ids"]
    pieces = tokenizer.convert_ids_to_tokens(ids)
    newline = pieces.index("Ċ")  # the byte-level BPE newline token, Wu's '<0x0A>'
    assert newline_stop(tokenizer, ids) == newline + 1
    assert newline_stop(tokenizer, ids[:newline]) == newline
    steps = len(ids)
    trace = make_trace(ids, torch.arange(steps * 2).reshape(steps, 1, 2), torch.rand(steps, 1, 2),
                       hidden=torch.rand(steps, 4), prompt_ids=torch.arange(5), evidence_spans=[(1, 3)], answers=["yes"],
                       response=tokenizer.decode(ids), token_logprob=torch.rand(steps))
    cut = truncate_at_newline(trace, tokenizer)
    assert cut.n_steps == newline + 1 and cut.response == "yes it is\n"
    assert torch.equal(cut.argmax_pos, trace.argmax_pos[:newline + 1])
    assert torch.equal(cut.token_logprob, trace.token_logprob[:newline + 1])
    assert torch.equal(cut.prompt_ids, trace.prompt_ids)


def test_the_loop_stops_a_row_after_its_first_newline_token(tokenizer):
    """``TraceConfig(stop_at_newline=True)`` (Wu's decode): the newline ids are every id whose text holds a newline,
    the option is part of the cache key only when on, and Wu's trace config turns it on."""
    from dynheads_tl.engine.trace_data import TraceConfig
    from dynheads_tl.engine.tracing import newline_token_ids
    from dynheads_tl.tasks.wu_detect import wu_trace_config

    ids = newline_token_ids(tokenizer)
    assert tokenizer.convert_tokens_to_ids("Ċ") in ids and tokenizer.convert_tokens_to_ids("ĊĊ") in ids
    assert all("\n" in tokenizer.decode([i]) for i in ids)
    plain = tokenizer("yes it is", add_special_tokens=False)["input_ids"]
    assert not set(plain) & ids
    assert "stop_at_newline" not in TraceConfig().key() and TraceConfig(stop_at_newline=True).key()["stop_at_newline"]
    wu = wu_trace_config(TraceConfig(max_new_tokens=8))
    assert (wu.max_new_tokens, wu.stop_at_eos, wu.stop_at_newline) == (WU_DECODE_STEPS, False, True)
    with pytest.raises(ValueError, match="stop_at_newline"):
        TraceConfig(stop_at_newline="yes")


def _copy_fixture(tmp_path) -> Path:
    target = tmp_path / "wu"
    shutil.copytree(FIXTURE, target)
    return target


@pytest.mark.parametrize("damage, message", [
    (lambda root: (root / "needles.jsonl").unlink(), "has no needles.jsonl"),
    (lambda root: shutil.rmtree(root / "part2"), r"part2.*missing or holds no .txt"),
    (lambda root: (root / "needles.jsonl").write_text('{"needle": "x", "question": "q"}\n'), "real_needle"),
    (lambda root: (root / "needles.jsonl").write_text('{"needle": "a b", "question": "q", "real_needle": "c"}\n'),
     "not part of its needle"),
    (lambda root: (root / "needles.jsonl").write_text("not json\n"), "is not JSON"),
])
def test_a_damaged_detection_folder_is_refused_before_any_model_work(tmp_path, damage, message):
    from dynheads_tl.claims.dynamism import DynamismConfig

    root = _copy_fixture(tmp_path)
    damage(root)
    load_wu_detection.cache_clear()
    with pytest.raises(ValueError, match=message):
        check_haystack(f"wu:{root}")
    with pytest.raises(ValueError, match=message):
        DynamismConfig.from_params({"haystack": f"wu:{root}"})
    with pytest.raises(ValueError, match="names no folder"):
        check_haystack("wu:")


def wu_reference_loop(hf_model, tokenizer, prompt_ids: list[int], real_needle: str, decode_len: int = WU_DECODE_STEPS):
    """Wu et al.'s detection loop written again on plain transformers (eager attention, output_attentions=True),
    independently of the suite's engine: prefill all but the last prompt token, then feed one token per step; at
    each step every head whose top-1 attended position lies in the needle span and holds the token just generated
    adds 1 / span length; stop after a newline token; no EOS stop. Returns (scores [layer, head], response, tokens)."""
    config = hf_model.config
    needle_ids = tokenizer(real_needle, add_special_tokens=False)["input_ids"]
    start, end = -1, -1
    for i in range(len(prompt_ids)):
        window = set(prompt_ids[i:i + len(needle_ids)])
        if len(window & set(needle_ids)) / len(set(needle_ids)) > 0.9:
            start, end = i, i + len(needle_ids)
            break
    scores = torch.zeros(config.num_hidden_layers, config.num_attention_heads, dtype=torch.float64)
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        past = hf_model(input_ids=ids[:, :-1], use_cache=True).past_key_values
        token, output = ids[0, -1], []
        for _ in range(decode_len):
            out = hf_model(input_ids=token.view(1, 1), past_key_values=past, use_cache=True, output_attentions=True)
            past, token = out.past_key_values, out.logits[0, -1].argmax()
            output.append(int(token))
            for layer, attention in enumerate(out.attentions):
                for head in range(config.num_attention_heads):
                    top = int(attention[0, head, -1].topk(1).indices[0])
                    if start <= top < end and int(token) == prompt_ids[top]:
                        scores[layer, head] += 1 / (end - start)
            if "\n" in tokenizer.decode([int(token)]):
                break
    return scores, tokenizer.decode(output, skip_special_tokens=True).strip(), output


def test_wu_protocol_through_the_suite_equals_an_independent_transformers_loop(embedded_model, embedded_reference,
                                                                               tmp_path, monkeypatch):
    """Acceptance (#31): two fixture samples at 300 context tokens, Wu's 50-step decode with its newline stop, on the
    embedded model in float32 on the CPU. The suite's per-sample Wu scores, generated tokens, ROUGE filter decisions
    and static score equal the reference loop's (to float rounding: the scores are sums of 1 / span length)."""
    from rouge_score.rouge_scorer import RougeScorer

    from dynheads_tl.analysis.head_files import read_head_scores, write_head_scores
    from dynheads_tl.analysis.scoring import static_retrieval_per_sample
    from dynheads_tl.corpus import collect_traces
    from dynheads_tl.engine.tracing import TraceConfig

    monkeypatch.setenv("DYNHEADS_CACHE", str(tmp_path / "cache"))
    tokenizer = embedded_model.tokenizer
    samples = make_niah_samples(tokenizer, n=2, context_tokens=300, seed=0, haystack=SPEC)
    traces = collect_traces(embedded_model, samples, TraceConfig(max_new_tokens=8), {"test": "wu"}, batch_size=2)
    assert all(t.config.get("max_new_tokens") == WU_DECODE_STEPS and t.config.get("stop_at_eos") is False
               and t.config.get("stop_at_newline") is True
               for t in traces)  # Wu's decode replaces the caller's 8 steps and EOS stop, and stops at a newline
    # The loop itself stopped at the newline (TraceConfig.stop_at_newline): nothing was left for the cut to remove.
    assert all("wu_newline_stop" not in t.meta for t in traces)
    hf = embedded_reference
    scorer = RougeScorer(["rouge1"], use_stemmer=True)
    kept_reference = []
    for sample, trace in zip(samples, traces):
        reference, response, tokens = wu_reference_loop(hf, tokenizer, sample.prompt_ids, sample.answers[0])
        assert trace.tokens.tolist() == tokens
        assert trace.response.strip() == response
        span = sample.evidence_spans[0][1] - sample.evidence_spans[0][0]
        ours = trace.retrieval_mask.double().sum(0) / span
        torch.testing.assert_close(ours, reference, rtol=0, atol=1e-9)
        if scorer.score(sample.answers[0], response)["rouge1"].recall * 100 > 50:  # Wu's filter, as Wu writes it
            kept_reference.append(reference)
    if not kept_reference:
        pytest.skip("the embedded model reproduced no fixture needle; the filter comparison has nothing to compare")
    ours_kept = static_retrieval_per_sample(traces, rouge_filter=0.5).double()
    torch.testing.assert_close(ours_kept, torch.stack(kept_reference), rtol=0, atol=1e-6)
    # ... and the head_score file the suite writes reads back as the reference's mean
    path = write_head_scores(tmp_path / "smollm2.json", ours_kept, {"n": len(kept_reference)})
    torch.testing.assert_close(read_head_scores(path, (30, 9)), torch.stack(kept_reference).mean(0),
                               rtol=0, atol=1e-6)
    assert json.loads(path.read_text())["0-0"] == ours_kept[:, 0, 0].tolist()
