"""The grouped-attention decoding step on a preallocated cache, against the bridge's eager path (the reference).

Tolerances: the grouped step multiplies each query group against its KV head's keys where the eager path
multiplies against repeated copies; the sums are the same but may be accumulated in another order, so floats
agree to float32 rounding (1e-5 on logits of order 10), while tokens, top-1 sources and Eq. 1 sets must be equal.
"""
from __future__ import annotations

import pytest
import torch

import dynheads_tl
from dynheads_tl import TraceConfig
from dynheads_tl.engine.grouped import (StaticKVCache, attention_path, choose_path, default_attention,
                                        grouped_unsupported, unfired_hooks)
from dynheads_tl.engine.hooks import StepState, ablate_heads, restrict_attention, retain_heads
from dynheads_tl.engine.decoder import BatchDecoder
from dynheads_tl.engine.tracing import trace_batch, trace_generation
from dynheads_tl.tasks import make_niah_samples
from conftest import build_tiny_model

# Engine exactness: .ci/run runs these again under every CPU kernel set torch has here (ATEN_CPU_CAPABILITY).
pytestmark = pytest.mark.exactness


@pytest.fixture(autouse=True)
def grouped_by_default():
    """These tests compare the grouped path with the eager one, whatever $DYNHEADS_ATTENTION says."""
    with attention_path("grouped"):
        yield


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    folder = build_tiny_model("llama", tmp_path_factory.mktemp("tiny") / "llama")
    return dynheads_tl.load_model(str(folder), device="cpu")


@pytest.fixture(scope="module")
def tiny_samples(tiny_llama):
    # Different lengths, so a batch is left-padded.
    return make_niah_samples(tiny_llama.tokenizer, n=3, context_tokens=[60, 90, 75], seed=4, max_new_tokens=6)


def assert_same_traces(grouped, eager):
    for g, e in zip(grouped, eager):
        assert torch.equal(g.tokens, e.tokens)
        assert torch.equal(g.argmax_pos, e.argmax_pos)
        assert torch.equal(g.retrieval_mask, e.retrieval_mask)
        torch.testing.assert_close(g.support_score, e.support_score, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(g.hidden, e.hidden, atol=1e-4, rtol=1e-4)
        for name in ("evidence_attention", "evidence_mass", "context_mass", "generated_mass", "token_logprob"):
            if getattr(e, name) is not None:
                torch.testing.assert_close(getattr(g, name).float(), getattr(e, name).float(), atol=2e-3, rtol=1e-3)


def test_the_embedded_and_tiny_llama_models_take_the_grouped_path(embedded_model, tiny_llama):
    assert grouped_unsupported(embedded_model) is None
    assert grouped_unsupported(tiny_llama) is None
    assert default_attention() == "grouped"
    decoder = BatchDecoder(tiny_llama, [[1, 5, 7, 9]])
    decoder.step()
    assert decoder.last_path == "grouped"


@pytest.mark.parametrize("batched", [True, False])
def test_tiny_grouped_traces_equal_the_eager_reference(tiny_llama, tiny_samples, batched):
    config = TraceConfig(max_new_tokens=6, stop_at_eos=False, local_window=8, evidence_attention=True, signals=True)
    run = (lambda: trace_batch(tiny_llama, tiny_samples, config)) if batched else (
        lambda: [trace_generation(tiny_llama, s, config) for s in tiny_samples])
    grouped = run()
    with attention_path("eager"):
        eager = run()
    assert_same_traces(grouped, eager)


def test_hook_pattern_scores_and_z_are_what_the_eager_path_shows(tiny_llama, tiny_samples):
    """A reader of hook_pattern / hook_attn_scores / hook_z gets the same tensor (shape, head order, values)."""
    prompts = [s.prompt_ids for s in tiny_samples]
    names = ["blocks.1.attn.hook_pattern", "blocks.0.attn.hook_attn_scores", "blocks.1.attn.hook_z"]
    seen = {}

    def capture(path, name):
        def hook(tensor, hook):
            seen.setdefault(path, {})[name] = tensor.detach().clone()
        return hook

    for path in ("grouped", "eager"):
        decoder = BatchDecoder(tiny_llama, prompts, attention=path)
        with tiny_llama.hooks(fwd_hooks=[(name, capture(path, name)) for name in names]):
            decoder.step()
        assert decoder.last_path == path
    for name in names:
        grouped, eager = seen["grouped"][name], seen["eager"][name]
        assert grouped.shape == eager.shape, name
        finite = torch.isfinite(eager) & (eager > torch.finfo(eager.dtype).min / 2)
        torch.testing.assert_close(grouped[finite], eager[finite], atol=1e-5, rtol=1e-4)
        assert torch.equal(finite, torch.isfinite(grouped) & (grouped > torch.finfo(grouped.dtype).min / 2))


@pytest.mark.parametrize("kind", ["ablate", "restrict", "retain"])
def test_ablation_and_attention_restrictions_act_alike_on_both_paths(tiny_llama, tiny_samples, kind):
    n_layers, n_heads = tiny_llama.cfg.n_layers, tiny_llama.cfg.n_heads
    width = max(len(s.prompt_ids) for s in tiny_samples)
    state = StepState()
    heads = torch.zeros(n_layers, n_heads, dtype=torch.bool)
    heads[0, 1] = heads[1, 3] = True
    if kind == "ablate":
        hooks = ablate_heads(heads, state=state)
    elif kind == "restrict":
        allowed = torch.ones(width + 10, dtype=torch.bool)
        allowed[10:40] = False
        hooks = restrict_attention(allowed, n_layers=n_layers, state=state)
    else:
        streaming = torch.zeros(width + 10, dtype=torch.bool)
        streaming[:4] = True
        streaming[width - 8:] = True
        hooks = retain_heads(lambda: ~heads, lambda: streaming, n_layers=n_layers)
    config = TraceConfig(max_new_tokens=5, stop_at_eos=False, local_window=8)
    plain = trace_batch(tiny_llama, tiny_samples, config)
    grouped = trace_batch(tiny_llama, tiny_samples, config, hooks=hooks, state=state)
    with attention_path("eager"):
        eager = trace_batch(tiny_llama, tiny_samples, config, hooks=hooks, state=state)
    assert_same_traces(grouped, eager)
    assert any(not torch.allclose(p.hidden, g.hidden) for p, g in zip(plain, grouped)), "the hooks must bite"


def test_a_hook_the_grouped_step_does_not_fire_sends_the_step_down_the_eager_path(tiny_llama):
    decoder = BatchDecoder(tiny_llama, [[1, 5, 7, 9], [1, 5, 8]])
    assert unfired_hooks(tiny_llama) == []
    with tiny_llama.hooks(fwd_hooks=[("blocks.0.attn.hook_hidden_states", lambda t, hook: None)]):
        assert unfired_hooks(tiny_llama) == ["blocks.0.attn.hook_hidden_states"]
        decoder.step()
        assert decoder.last_path == "eager"
    decoder.step()
    assert decoder.last_path == "grouped"


def test_a_bridge_switch_turned_on_after_loading_is_honoured(tiny_llama):
    """Per-head results (hook_result) are computed by the eager path only: with the switch on, steps run there
    and the hook fires."""
    calls = []
    decoder = BatchDecoder(tiny_llama, [[1, 5, 7, 9], [1, 5, 8]])
    tiny_llama.set_use_attn_result(True)
    try:
        assert "use_attn_result" in grouped_unsupported(tiny_llama)
        with tiny_llama.hooks(fwd_hooks=[("blocks.1.attn.hook_result", lambda t, hook: calls.append(t.shape))]):
            decoder.step()
    finally:
        tiny_llama.set_use_attn_result(False)
    assert decoder.last_path == "eager" and calls
    assert grouped_unsupported(tiny_llama) is None
    assert choose_path(tiny_llama, "grouped") == "grouped"


def test_qwen2_biases_take_the_grouped_path_and_match_the_reference(tmp_path):
    model = dynheads_tl.load_model(str(build_tiny_model("qwen2", tmp_path / "qwen2")), device="cpu")
    assert grouped_unsupported(model) is None
    samples = make_niah_samples(model.tokenizer, n=2, context_tokens=[60, 80], seed=3, max_new_tokens=5)
    config = TraceConfig(max_new_tokens=5, stop_at_eos=False, local_window=8)
    grouped = trace_batch(model, samples, config)
    with attention_path("eager"):
        eager = trace_batch(model, samples, config)
    assert_same_traces(grouped, eager)


def test_an_architecture_the_step_does_not_reproduce_decodes_eagerly(tmp_path):
    model = dynheads_tl.load_model(str(build_tiny_model("qwen3", tmp_path / "qwen3")), device="cpu")
    assert grouped_unsupported(model) is not None  # Qwen3 normalises queries and keys per head
    decoder = BatchDecoder(model, [[1, 5, 7, 9]])
    decoder.step()
    assert decoder.last_path == "eager"


def test_the_cache_is_written_in_place_and_grows_only_past_its_capacity(tiny_llama):
    decoder = BatchDecoder(tiny_llama, [[1, 5, 7, 9, 11], [1, 5, 8]], max_new_tokens=2)
    assert isinstance(decoder.cache, StaticKVCache)
    capacity, pointer = decoder.cache.capacity, decoder.cache.keys[1].data_ptr()
    logits = [decoder.step()]
    logits.append(decoder.step(logits[-1].argmax(-1)))
    assert decoder.cache.keys[1].data_ptr() == pointer, "no reallocation within the capacity"
    while decoder.n_cached < capacity + 3:  # past the capacity: the buffers are reallocated once, contents kept
        logits.append(decoder.step(logits[-1].argmax(-1)))
    assert decoder.cache.capacity >= capacity + 3
    # The grown cache holds what a fresh eager decoder computes for the same tokens.
    reference = BatchDecoder(tiny_llama, [[1, 5, 7, 9, 11], [1, 5, 8]], attention="eager")
    expected = [reference.step()]
    for _ in range(len(logits) - 1):
        expected.append(reference.step(expected[-1].argmax(-1)))
    for got, want in zip(logits, expected):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    for got, want in zip(decoder.cache.layers, reference.cache.layers):
        torch.testing.assert_close(got.keys, want.keys, atol=1e-5, rtol=1e-4)


def test_rewind_then_restore_writes_over_the_same_storage(tiny_llama):
    """The two-pass protocol's restore of the clean pass, and a retraction, on the preallocated cache."""
    decoder = BatchDecoder(tiny_llama, [[1, 5, 7, 9, 11], [1, 5, 8]])
    before = decoder.n_cached
    clean = decoder.step()
    saved = decoder.last_position()
    decoder.rewind(before)
    state = StepState()
    heads = torch.ones(tiny_llama.cfg.n_layers, tiny_llama.cfg.n_heads, dtype=torch.bool)
    with tiny_llama.hooks(fwd_hooks=ablate_heads(heads, state=state)):
        masked = decoder.step()
    assert not torch.allclose(clean, masked)
    masked_keys = decoder.cache.layers[1].keys[:, :, -1].clone()
    decoder.replace_last_position(saved, rows=torch.tensor([True, False]))
    assert torch.equal(decoder.cache.layers[1].keys[0, :, -1], saved[1][0][0, :, -1])
    assert torch.equal(decoder.cache.layers[1].keys[1, :, -1], masked_keys[1])
    with pytest.raises(ValueError, match="rewind forward"):
        decoder.rewind(decoder.n_cached + 1)


@pytest.mark.parametrize("batched", [True, False])
def test_embedded_grouped_traces_equal_the_eager_reference(embedded_model, batched):
    samples = make_niah_samples(embedded_model.tokenizer, n=2, context_tokens=[160, 220], seed=5, max_new_tokens=10)
    config = TraceConfig(max_new_tokens=10, signals=True)
    run = (lambda: trace_batch(embedded_model, samples, config)) if batched else (
        lambda: [trace_generation(embedded_model, s, config) for s in samples])
    grouped = run()
    with attention_path("eager"):
        eager = run()
    assert_same_traces(grouped, eager)
    assert any(t.retrieval_mask.any() for t in grouped), "the embedded model copies the needle here"


def test_prompts_sharing_a_prefix_prefill_it_once(monkeypatch, tiny_llama):
    """Three prompts: B extends A's first 6 tokens, C shares nothing but the first token with either."""
    from dynheads_tl.engine.models import fast_twin

    prefix = [1, 40, 41, 42, 43, 44]
    prompts = [prefix + [50, 51, 52, 53], prefix + [60, 61, 62], [1, 70, 71, 72, 73]]
    twin = fast_twin(tiny_llama)
    calls, original = [], twin.forward

    def counting(*args, **kwargs):
        calls.append(kwargs["input_ids"].shape[1])
        return original(*args, **kwargs)

    monkeypatch.setattr(twin, "forward", counting)
    shared = BatchDecoder(tiny_llama, prompts)
    # Sorted by ids: A (9 positions), B reuses 6 of its 8, C reuses 1 of its 4.
    assert sorted(calls) == sorted([9, 8 - 6, 4 - 1])
    assert shared.prefilled_positions == 9 + 2 + 3 and shared.prompt_positions == 9 + 8 + 4
    calls.clear()
    alone = BatchDecoder(tiny_llama, prompts, share_prefixes=False)
    assert sorted(calls) == [4, 8, 9] and alone.prefilled_positions == alone.prompt_positions
    for got, want in zip(shared.cache.layers, alone.cache.layers):
        torch.testing.assert_close(got.keys, want.keys, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(got.values, want.values, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(shared.step(), alone.step(), atol=1e-5, rtol=1e-4)


def test_only_twin_prefilled_positions_are_shared(tiny_llama):
    """A prompt tail run through the hooked bridge (fast_until) is never copied into another prompt."""
    prefix = [1, 40, 41, 42, 43, 44, 45, 46]
    prompts = [prefix + [50, 51], prefix + [60, 61]]
    decoder = BatchDecoder(tiny_llama, prompts, fast_until=[3, 5])
    assert decoder.prefilled_positions == 9 + 9 - 3  # shared: min(fast_until) positions
    reference = BatchDecoder(tiny_llama, prompts, fast_until=[3, 5], share_prefixes=False)
    torch.testing.assert_close(decoder.step(), reference.step(), atol=1e-5, rtol=1e-4)


def test_embedded_niah_batch_with_shared_prefixes_equals_todays_path(embedded_model):
    """Samples of one haystack share it up to their needles: shared prefill + grouped attention against the
    eager path without sharing (the computation before either existed)."""
    from dynheads_tl.engine.decoder import prefix_sharing

    samples = make_niah_samples(embedded_model.tokenizer, n=3, context_tokens=240, seed=7, max_new_tokens=10)
    config = TraceConfig(max_new_tokens=10)
    fast = trace_batch(embedded_model, samples, config)
    with attention_path("eager"), prefix_sharing(False):
        today = trace_batch(embedded_model, samples, config)
    assert_same_traces(fast, today)
    decoder = BatchDecoder(embedded_model, [s.prompt_ids for s in samples])
    assert decoder.prefilled_positions < 0.8 * decoder.prompt_positions, "the needles sit after a shared haystack"


def test_every_hook_point_the_grouped_step_claims_fires_on_both_paths(tiny_llama):
    """The hook points the grouped step says it fires (all but the ones that send a step down the eager path) do
    fire there, each of them, and the same ones fire on the eager reference."""
    from dynheads_tl.engine.grouped import _fired_hook_points

    claimed = _fired_hook_points(tiny_llama)
    names = [name for name, point in tiny_llama.hook_dict.items() if id(point) in claimed]
    assert any(name.endswith("attn.hook_pattern") for name in names)
    fired_on = {}
    for path in ("grouped", "eager"):
        fired: set[str] = set()
        hooks = [(name, lambda tensor, hook, seen=fired: seen.add(hook.name)) for name in names]
        decoder = BatchDecoder(tiny_llama, [[1, 5, 7, 9], [1, 5, 8]], attention=path)
        with tiny_llama.hooks(fwd_hooks=hooks):
            decoder.step()
        assert decoder.last_path == path
        fired_on[path] = fired
    assert len(fired_on["grouped"]) > 50
    assert fired_on["grouped"] == fired_on["eager"]
    # Aliased names (hook_z is o.hook_in) share one hook point; a point claimed but fired under none of its names
    # on either path (the rotary embedding's, which a decode step does not run through its hook) stays silent on
    # both, so no hook runs on one path and not on the other.
    silent = {name for name in names if id(tiny_llama.hook_dict[name]) not in
              {id(tiny_llama.hook_dict[fired]) for fired in fired_on["grouped"]}}
    assert silent <= {"rotary_emb.hook_out", "hook_pos_embed"}, silent


def test_a_sliding_window_stated_only_in_the_config_is_not_taken_for_full_attention():
    """Mistral states its window only as ``config.sliding_window`` (no use_sliding_window, no layer_types)."""
    from types import SimpleNamespace

    from transformers import MistralConfig

    from dynheads_tl.engine.grouped import _architecture_problem

    fake = SimpleNamespace(original_model=SimpleNamespace(model=SimpleNamespace(layers=[]), config=MistralConfig()))
    assert _architecture_problem(fake) == "the model uses sliding-window attention"


def test_later_decoders_copy_a_prefix_from_the_store_of_their_block(monkeypatch, tiny_llama):
    """Inside shared_prefill a second decoder (another batch) copies the prefix an earlier one prefilled; outside
    the block, or with prefix_sharing(False), nothing is copied; the keys, values and logits match no sharing."""
    from dynheads_tl.engine.decoder import prefix_sharing, shared_prefill
    from dynheads_tl.engine.models import fast_twin

    first, second = [1, 80, 81, 82, 83, 84, 85, 86, 87], [1, 80, 81, 82, 83, 84, 90, 91]
    twin = fast_twin(tiny_llama)
    calls, original = [], twin.forward

    def counting(*args, **kwargs):
        calls.append(kwargs["input_ids"].shape[1])
        return original(*args, **kwargs)

    monkeypatch.setattr(twin, "forward", counting)
    with shared_prefill() as store:
        BatchDecoder(tiny_llama, [first])
        reused = BatchDecoder(tiny_llama, [second])
    assert calls == [8, 7 - 6], "the second prompt ran only what follows the 6 shared tokens"
    assert reused.stored_positions == 6 and reused.prefilled_positions == 1
    assert store.hits == 1 and store.reused_positions == 6
    calls.clear()
    alone = BatchDecoder(tiny_llama, [second])  # no block open: nothing kept from before
    assert calls == [7] and alone.stored_positions == 0
    with shared_prefill(), prefix_sharing(False):
        BatchDecoder(tiny_llama, [first])
        off = BatchDecoder(tiny_llama, [second])
    assert off.stored_positions == 0 and off.prefilled_positions == 7
    for got, want in zip(reused.cache.layers, alone.cache.layers):
        torch.testing.assert_close(got.keys, want.keys, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(got.values, want.values, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(reused.step(), alone.step(), atol=1e-5, rtol=1e-4)


def test_the_prefix_store_keeps_the_recently_used_within_its_budget(tiny_llama):
    """Entries leave least recently used first once the byte budget is passed; one larger than the budget is never
    kept; a lookup finds the longest shared prefix and refreshes that entry."""
    from dynheads_tl.engine.decoder import PrefixStore

    def prefilled(ids):
        return BatchDecoder._prefill(tiny_llama, torch.tensor(ids), "fast")

    a, b, c = [1, 10, 11, 12, 13], [1, 10, 20, 21, 22], [1, 30, 31, 32, 33]
    size = PrefixStore._size(prefilled(a))
    store = PrefixStore(2 * size)
    for ids in (a, b):
        store.add(tiny_llama, ids, prefilled(ids), 4)
    assert store.longest(tiny_llama, [1, 10, 11, 12, 99], 5)[1] == 4  # a's four positions; a is now the newest
    assert store.longest(tiny_llama, [2, 10], 2) is None
    store.add(tiny_llama, c, prefilled(c), 4)  # over budget: b, the least recently used, leaves
    kept = [list(key[1]) for key in store.entries]
    assert kept == [a[:4], c[:4]] and store.bytes == 2 * size
    assert store.longest(tiny_llama, [1, 10, 20, 21], 4)[1] == 2, "b left: only a's first two positions match"
    tiny = PrefixStore(size - 1)
    tiny.add(tiny_llama, a, prefilled(a), 4)
    assert not tiny.entries and tiny.bytes == 0


def test_a_store_entry_too_large_for_the_budget_keeps_only_the_window_on_sliding_layers(tmp_path, monkeypatch):
    """On a model with sliding layers (the tiny Gemma 3: window 16 on layers 0 and 2), an entry whose full keys and
    values exceed the budget is kept as a WindowedPrefix: its sliding layers hold the last 15 positions, the global
    one all of them. The same prompt in a later decoder then copies all of it, and decodes as if nothing were shared;
    a prompt sharing only part of it prefills on its own; bounded_windows(False) keeps no such entry."""
    from dynheads_tl.engine.decoder import PrefixStore, bounded_windows, prefix_sharing, shared_prefill
    from dynheads_tl.engine.models import fast_twin
    from dynheads_tl.engine import decoder as decoder_module
    from dynheads_tl.engine.sharing import WindowedPrefix

    gemma = dynheads_tl.load_model(str(build_tiny_model("gemma3", tmp_path / "gemma3")), device="cpu")
    prompt = [1] + list(range(40, 100))  # 61 tokens: 60 cached positions, beyond the 16-token window
    full = PrefixStore._size(BatchDecoder._prefill(gemma, torch.tensor(prompt), "fast"))
    store = PrefixStore(full // 2)  # a full entry does not fit; a windowed one (15 + 60 + 15 of 3 x 60) does
    with shared_prefill(store):
        BatchDecoder(gemma, [prompt])
        [(entry, size)] = store.entries.values()
        assert isinstance(entry, WindowedPrefix) and entry.n == 60 and entry.starts == [45, 0, 45]
        assert size == full * (15 + 60 + 15) // (3 * 60)
        twin = fast_twin(gemma)
        calls, original = [], twin.forward
        monkeypatch.setattr(twin, "forward",
                            lambda *a, **k: calls.append(k["input_ids"].shape[1]) or original(*a, **k))
        again = BatchDecoder(gemma, [prompt])
        assert again.stored_positions == 60 and again.prefilled_positions == 0 and calls == []
        partly = BatchDecoder(gemma, [prompt[:30] + [7, 8, 9]])
    assert partly.stored_positions == 0 and calls == [32], "a shorter shared prefix needs keys the entry dropped"
    monkeypatch.undo()
    with prefix_sharing(False):
        alone = BatchDecoder(gemma, [prompt])
    for got, want in zip(again.cache.layers, alone.cache.layers):
        torch.testing.assert_close(got.keys, want.keys, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(got.values, want.values, atol=1e-5, rtol=1e-4)
    for _ in range(3):  # the window's edge moves past the zeros the entry left: every step as without sharing
        torch.testing.assert_close(again.step(), alone.step(), atol=1e-5, rtol=1e-4)
    with bounded_windows(False), shared_prefill(PrefixStore(full // 2)) as unbounded:
        BatchDecoder(gemma, [prompt])
    assert not unbounded.entries
    # a decoder that keeps every key (and could rewind into the dropped positions) never takes a windowed entry
    with shared_prefill(store), bounded_windows(False):
        keeping = BatchDecoder(gemma, [prompt])
    assert keeping.stored_positions == 0
    # a longer prompt beginning with the whole entry: the twin prefills the rest against the rebuilt cache, in
    # chunks of 4, and every step decodes as without sharing
    longer = prompt + list(range(110, 130))
    monkeypatch.setattr(decoder_module, "PREFILL_CHUNK", 4)
    with shared_prefill(PrefixStore(full // 2)):  # the budget holds one windowed entry: the prompt's alone
        BatchDecoder(gemma, [prompt])
        continued = BatchDecoder(gemma, [longer])
    with prefix_sharing(False):
        fresh = BatchDecoder(gemma, [longer])
    assert continued.stored_positions == 60 and continued.prefilled_positions == 20
    for _ in range(3):
        torch.testing.assert_close(continued.step(), fresh.step(), atol=1e-5, rtol=1e-4)


def test_the_local_executor_shares_prefixes_across_its_batches(tiny_llama):
    from dynheads_tl.executors import LocalExecutor

    def compute(model, batch):
        return [BatchDecoder(model, [ids]).stored_positions for ids in batch]

    batches = [[[1, 50, 51, 52, 53, 54]], [[1, 50, 51, 52, 60]], [[2, 70, 71]]]
    got = [results for _, results in LocalExecutor().map(tiny_llama, compute, batches)]
    assert got == [[0], [4], [0]], "the second prompt's four cached positions all come from the first"
