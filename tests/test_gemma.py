"""Gemma 3 (one KV head, Q/K norms, sliding-window and global layers with their own RoPE bases) on the grouped
decoding path, against the bridge's eager path and plain transformers: a tiny random model for the mechanics, the
embedded Gemma 3 270M for one behaviour test.

Tolerances as in ``tests/test_grouped.py``: tokens, top-1 sources and Eq. 1 sets equal; floats to float32 rounding.
"""
from __future__ import annotations

import itertools

import pytest
import torch
from transformers import AttentionInterface, AutoModelForCausalLM
from transformers.integrations import sdpa_attention
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

import dynheads_tl
from dynheads_tl import TraceConfig
from dynheads_tl.engine import decoder as decoder_module
from dynheads_tl.engine.decoder import BatchDecoder, bounded_windows, prefix_sharing
from dynheads_tl.engine.grouped import _fired_hook_points, attention_path, grouped_unsupported, layer_windows
from dynheads_tl.engine.hooks import StepState, ablate_heads, restrict_attention
from dynheads_tl.engine.models import EMBEDDED_MODELS, embedded_installed, fast_twin
from dynheads_tl.engine.tracing import trace_batch, trace_generation
from dynheads_tl.engine import windowed as windowed_module
from dynheads_tl.engine.windowed import ATTENTION, stock_attention, visible_keys, windowed_sdpa
from dynheads_tl.tasks import make_niah_samples
from conftest import build_tiny_model
from test_grouped import assert_same_traces

# Engine exactness: .ci/run runs these again under every CPU kernel set torch has here (ATEN_CPU_CAPABILITY).
pytestmark = pytest.mark.exactness

WINDOW = 16  # the tiny model's sliding window (conftest.TINY_CONFIGS["gemma3"]), shorter than every prompt here


@pytest.fixture(scope="module")
def tiny_gemma_folder(tmp_path_factory):
    return build_tiny_model("gemma3", tmp_path_factory.mktemp("tiny") / "gemma3")


@pytest.fixture(scope="module")
def tiny_gemma(tiny_gemma_folder):
    return dynheads_tl.load_model(str(tiny_gemma_folder), device="cpu")


@pytest.fixture(scope="module")
def gemma_samples(tiny_gemma):
    # One haystack, needles at different depths: the prompts share a prefix and differ in length.
    return make_niah_samples(tiny_gemma.tokenizer, n=3, context_tokens=[60, 90, 75], seed=4, max_new_tokens=6)


def transformers_greedy(reference, prompt_ids, steps: int):
    """Plain transformers (eager attention): greedy tokens, then every step's attention rows from one forward over
    prompt + response, [step, layer, head, key]."""
    ids = torch.tensor(prompt_ids)[None]
    with torch.no_grad():
        for _ in range(steps):
            ids = torch.cat([ids, reference(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        tokens = ids[0, len(prompt_ids):]
        out = reference(ids[:, :-1], output_attentions=True)
    start = len(prompt_ids) - 1
    return tokens, torch.stack([a[0, :, start:, :] for a in out.attentions]).permute(2, 0, 1, 3)


def eq1(rows, trace):
    argmax = rows.argmax(-1)
    ids = torch.cat([trace.prompt_ids, trace.tokens])
    (needle_start, needle_end), = trace.evidence_spans
    return (argmax >= needle_start) & (argmax < needle_end) & (ids[argmax] == trace.tokens[:, None, None])


def test_tiny_gemma_takes_the_grouped_path(tiny_gemma):
    assert grouped_unsupported(tiny_gemma) is None
    config = tiny_gemma.original_model.config
    assert config.num_key_value_heads == 1 and config.sliding_window == WINDOW
    decoder = BatchDecoder(tiny_gemma, [[1] + list(range(40, 70))], attention="grouped")
    decoder.step()
    assert decoder.last_path == "grouped"


def test_tiny_gemma_grouped_eager_and_transformers_agree(tiny_gemma, tiny_gemma_folder, gemma_samples, monkeypatch):
    """Single prompts longer than the window, then the same prompts as one left-padded batch with shared prefixes:
    the grouped path, the eager bridge and plain transformers give the same tokens, top-1 sources and Eq. 1 sets.
    The twin's prefill of a prompt after its cached shared prefix meets the windowed cut (engine/windowed.py)."""
    reference = AutoModelForCausalLM.from_pretrained(tiny_gemma_folder, attn_implementation="eager",
                                                     dtype=torch.float32).eval()
    config = TraceConfig(max_new_tokens=6, stop_at_eos=False, local_window=8, signals=True)
    cuts, cuttable = [], windowed_module._cuttable
    monkeypatch.setattr(windowed_module, "_cuttable", lambda *args: cuts.append(cuttable(*args)) or cuts[-1])
    with attention_path("grouped"):
        grouped = [trace_generation(tiny_gemma, s, config) for s in gemma_samples]
        alone = len(cuts)
        batched = trace_batch(tiny_gemma, gemma_samples, config)
    assert any(cuts[alone:]), "the batch's prefill after its shared prefix cut a sliding layer's keys"
    # The reference keeps every key (bounded_windows(False)); the grouped runs keep a sliding layer's window only.
    with attention_path("eager"), prefix_sharing(False), bounded_windows(False):
        eager = [trace_generation(tiny_gemma, s, config) for s in gemma_samples]
    assert_same_traces(grouped, eager)
    assert_same_traces(batched, eager)
    layer_types = reference.config.layer_types
    for sample, trace in zip(gemma_samples, grouped):
        assert len(sample.prompt_ids) > 3 * WINDOW
        tokens, rows = transformers_greedy(reference, sample.prompt_ids, config.max_new_tokens)
        assert trace.tokens.tolist() == tokens.tolist()
        assert torch.equal(trace.argmax_pos, rows.argmax(-1))
        assert torch.equal(trace.retrieval_mask, eq1(rows, trace))
        # The window bites: sliding layers read only their last WINDOW keys; the global layer reaches further back.
        query_at = len(sample.prompt_ids) - 1 + torch.arange(len(trace.tokens))
        reach = query_at[:, None, None] - trace.argmax_pos  # [step, layer, head]
        for layer, kind in enumerate(layer_types):
            if kind == "sliding_attention":
                assert int(reach[:, layer].max()) < WINDOW
        assert int(reach[:, layer_types.index("full_attention")].max()) >= WINDOW
    decoder = BatchDecoder(tiny_gemma, [s.prompt_ids for s in gemma_samples])
    assert decoder.prefilled_positions < decoder.prompt_positions, "the samples share their haystack's start"


def test_every_hook_point_the_grouped_step_claims_fires_on_both_paths_of_gemma(tiny_gemma):
    """Q/K norms and the sandwich norms included: the same hook points fire on the grouped step and the eager one."""
    claimed = _fired_hook_points(tiny_gemma)
    names = [name for name, point in tiny_gemma.hook_dict.items() if id(point) in claimed]
    assert "blocks.0.attn.hook_q_normed" in names and "blocks.1.ln2_post.hook_out" in names
    fired_on = {}
    for path in ("grouped", "eager"):
        fired: set[str] = set()
        hooks = [(name, lambda tensor, hook, seen=fired: seen.add(hook.name)) for name in names]
        decoder = BatchDecoder(tiny_gemma, [[1] + list(range(40, 70)), [1, 5, 8]], attention=path)
        with tiny_gemma.hooks(fwd_hooks=hooks):
            decoder.step()
        assert decoder.last_path == path
        fired_on[path] = fired
    assert fired_on["grouped"] == fired_on["eager"]


@pytest.mark.skipif(not embedded_installed("gemma-3-270m"),
                    reason=f"the Gemma 3 270M packages are not installed ({EMBEDDED_MODELS['gemma-3-270m'].pip})")
def test_gemma_270m_grouped_equals_the_eager_bridge_within_and_beyond_the_window():
    """The real model, loaded once: a prompt inside the 512-token window and one beyond it, single and batched."""
    model = dynheads_tl.load_model("gemma-3-270m", device="cpu")
    spec = EMBEDDED_MODELS["gemma-3-270m"]
    config = model.original_model.config
    assert (config.num_hidden_layers, config.num_attention_heads, config.max_position_embeddings) == (
        spec.layers, spec.heads, spec.context_window)
    assert not getattr(model.tokenizer, "chat_template", None), "a base model: prompted as plain text"
    assert grouped_unsupported(model) is None
    samples = make_niah_samples(model.tokenizer, n=2, context_tokens=[300, 700], seed=5, max_new_tokens=8)
    assert len(samples[0].prompt_ids) < config.sliding_window < len(samples[1].prompt_ids)
    trace_config = TraceConfig(max_new_tokens=5, signals=True)  # Eq. 1 already fires within five steps (asserted below)
    with attention_path("grouped"):
        grouped = trace_batch(model, samples, trace_config)
    with attention_path("eager"), bounded_windows(False):
        eager = [trace_generation(model, s, trace_config) for s in samples]
    assert_same_traces(grouped, eager)
    assert any(t.retrieval_mask.any() for t in grouped), "Gemma copies the needle here"


def test_layer_windows_name_the_global_layer_and_no_sliding_head_retrieves_beyond_its_window(tiny_gemma,
                                                                                              gemma_samples):
    """Notebook 07's exploratory analysis on real traces: the window read where decoding masks with it, and in a
    distance bin beyond it every Eq. 1 activation lies in the global layer (the engine's mask, seen in the traces)."""
    from dynheads_tl.claims import length_grid
    from dynheads_tl.engine.grouped import layer_windows

    assert layer_windows(tiny_gemma) == [WINDOW, None, WINDOW]
    kinds = length_grid.layer_kinds(tiny_gemma)
    assert kinds.global_layers == [1] and kinds.n_heads == tiny_gemma.cfg.n_heads
    traces = trace_batch(tiny_gemma, gemma_samples, TraceConfig(max_new_tokens=6, stop_at_eos=False))
    cells = [({"context": 60, "depth": 0.5, "layout": f"l{i}"}, s) for i, s in enumerate(gemma_samples)]
    steps = length_grid.window_steps(cells, traces, kinds)
    beyond = steps[steps["distance"] >= WINDOW]
    assert len(beyond) and (beyond["sliding_heads"] == 0).all()
    shares = length_grid.window_shares(steps, kinds, [60], n_resamples=50)
    assert shares["beyond_window"].any() and set(shares["bin"]) == {"0–15", "16–59", "≥60"}
    jaccard = length_grid.window_jaccard(cells, traces, kinds, n_resamples=50)
    assert set(jaccard["scope"]) == {"global", "sliding", "all"}


def _decode(decoder, steps: int) -> list[torch.Tensor]:
    logits = [decoder.step()]
    for _ in range(steps - 1):
        logits.append(decoder.step(logits[-1].argmax(-1)))
    return logits


@pytest.mark.parametrize("path", ["grouped", "eager"])
def test_sliding_layers_keep_only_their_window_and_decode_as_if_they_kept_every_key(tiny_gemma, path):
    """A left-padded batch of prompts longer than the window: each sliding layer's buffer begins WINDOW - 1
    positions before the prompt's last token, the global layer's at 0; the logits, a two-pass step (rewind one
    position, ablate, restore the clean keys in one row), a retraction to the prompt's end and a score-replacing
    hook give what a decoder keeping every key gives."""
    prompts = [[1] + list(range(40, 100)), [1] + list(range(40, 75))]
    width = max(map(len, prompts))
    windows = layer_windows(tiny_gemma)
    heads = torch.zeros(tiny_gemma.cfg.n_layers, tiny_gemma.cfg.n_heads, dtype=torch.bool)
    heads[1, 0] = heads[2, 1] = True
    allowed = torch.ones(width + 16, dtype=torch.bool)
    allowed[width - 8: width - 4] = False  # inside every sliding window: the hook's change matters

    def run(bounded: bool) -> tuple[BatchDecoder, list[torch.Tensor]]:
        with bounded_windows(bounded):
            decoder = BatchDecoder(tiny_gemma, prompts, attention=path, max_new_tokens=8)
        out = _decode(decoder, 3)
        before = decoder.n_cached
        out.append(decoder.step(out[-1].argmax(-1)))
        saved = decoder.last_position()
        decoder.rewind(before)
        with tiny_gemma.hooks(fwd_hooks=ablate_heads(heads, state=StepState())):
            out.append(decoder.step(out[-2].argmax(-1)))
        decoder.replace_last_position(saved, rows=torch.tensor([True, False]))
        out.append(decoder.step(out[-1].argmax(-1)))
        decoder.rewind(width - 1)  # a retraction to the prompt's end, then decode again
        out += _decode(decoder, 2)
        with tiny_gemma.hooks(fwd_hooks=restrict_attention(allowed, n_layers=tiny_gemma.cfg.n_layers)):
            out.append(decoder.step(out[-1].argmax(-1)))
            out.append(decoder.step(out[-1].argmax(-1)))  # the hook still acts on the next step
        assert decoder.last_path == path
        target = decoder.cache.capacity + 2
        while decoder.n_cached < target:  # past the capacity: the buffers grow once
            out.append(decoder.step(out[-1].argmax(-1)))
        return decoder, out

    bounded, got = run(True)
    full, want = run(False)
    for got_logits, want_logits in zip(got, want):
        torch.testing.assert_close(got_logits, want_logits, atol=1e-5, rtol=1e-4)
    for index, window in enumerate(windows):
        start = 0 if window is None else width - window
        assert bounded.cache.starts[index] == start and full.cache.starts[index] == 0
        assert bounded.cache.keys[index].shape[2] == full.cache.keys[index].shape[2] - start
        torch.testing.assert_close(bounded.cache.layers[index].keys, full.cache.layers[index].keys[:, :, start:],
                                   atol=1e-5, rtol=1e-4)
    assert any(start > 0 for start in bounded.cache.starts)
    assert bounded.n_cached == full.n_cached > width - 1 + 8 + 1, "both grew past the capacity they were built with"


@pytest.mark.parametrize("path", ["grouped", "eager"])
def test_a_bounded_cache_refuses_what_would_need_a_dropped_key(tiny_gemma, path):
    """A rewind to before the prompt's end, and a hook that gives weight to a key older than the window, are
    refused with a message on both paths; a decoder built inside bounded_windows(False) rewinds anywhere."""
    prompt = [1] + list(range(40, 100))
    decoder = BatchDecoder(tiny_gemma, [prompt], attention=path)
    decoder.step()
    with pytest.raises(ValueError, match="sliding-window layer 0 keeps keys from position"):
        decoder.rewind(len(prompt) - 3)
    decoder.rewind(len(prompt) - 1)

    def unmask(scores, hook):
        return torch.zeros_like(scores)  # every position visible, the dropped ones too

    with tiny_gemma.hooks(fwd_hooks=[("blocks.0.attn.hook_attn_scores", unmask)]):
        with pytest.raises(RuntimeError, match="older than its sliding window"):
            decoder.step()
    assert decoder.last_path == path
    with bounded_windows(False):
        full = BatchDecoder(tiny_gemma, [prompt], attention="grouped")
    full.step()
    full.rewind(5)
    full.step(torch.tensor([7]))
    assert full.n_cached == 6


@pytest.mark.parametrize("chunk", [5, 23])
def test_a_prompt_prefilled_in_chunks_decodes_as_one_prefilled_at_once(tiny_gemma, gemma_samples, monkeypatch, chunk):
    """The SDPA twin prefills a long prompt PREFILL_CHUNK positions at a time (chunks shorter and longer than the
    sliding window, the last one partial): the cache equals the one-call prefill to float rounding, and single and
    batched traces (prefixes shared, the prefix copied before the chunks begin) equal the one-call traces."""
    ids = torch.tensor(gemma_samples[1].prompt_ids)
    assert len(ids) - 1 > 3 * chunk and (len(ids) - 1) % chunk, "several chunks, the last one partial"
    config = TraceConfig(max_new_tokens=6, stop_at_eos=False, local_window=8, signals=True)
    whole = BatchDecoder._prefill(tiny_gemma, ids, "fast")
    expected = [trace_generation(tiny_gemma, s, config) for s in gemma_samples]
    monkeypatch.setattr(decoder_module, "PREFILL_CHUNK", chunk)
    parts = BatchDecoder._prefill(tiny_gemma, ids, "fast")
    for layer in range(len(whole.layers)):
        assert parts.layers[layer].keys.shape == whole.layers[layer].keys.shape
        # float rounding: matrix products over chunks sum in another order (about 3e-6 of the keys' scale here)
        torch.testing.assert_close(parts.layers[layer].keys, whole.layers[layer].keys, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(parts.layers[layer].values, whole.layers[layer].values, atol=1e-4, rtol=1e-4)
    assert_same_traces([trace_generation(tiny_gemma, s, config) for s in gemma_samples], expected)
    assert_same_traces(trace_batch(tiny_gemma, gemma_samples, config), expected)


def _twin_prefill(model, ids: torch.Tensor, implementation: str | None = None):
    """The twin's chunked prefill of ``ids`` (the cache of all but the last token), the logits its last chunk gave
    and the key count SDPA met per call and layer, under ``implementation`` (None: the twin's own)."""
    twin = fast_twin(model)
    outputs, met, original, forward = [], [], twin.forward, sdpa_attention.sdpa_attention_forward

    def recording(*args, **kwargs):
        out = original(*args, **kwargs)
        outputs.append(out.logits[0, -1])
        return out

    def counting(module, query, key, *args, **kwargs):
        met.append((module.layer_idx, query.shape[2], key.shape[2]))
        return forward(module, query, key, *args, **kwargs)

    with stock_attention(twin, implementation or twin.config._attn_implementation):
        twin.forward, sdpa_attention.sdpa_attention_forward = recording, counting
        try:
            cache = BatchDecoder._prefill(model, ids, "fast")
        finally:
            del twin.forward
            sdpa_attention.sdpa_attention_forward = forward
    return cache, outputs[-1], met


def _short_by_one(module, query, key, value, attention_mask, sliding_window=None, **kwargs):
    """A deliberately wrong windowed SDPA: one key fewer than a sliding layer's earliest query sees, unchecked."""
    keep = visible_keys(query.shape[2], key.shape[2], sliding_window)
    if keep is not None and attention_mask is not None:
        key, value, attention_mask = key[:, :, 1 - keep:], value[:, :, 1 - keep:], attention_mask[..., 1 - keep:]
    return sdpa_attention.sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def test_visible_keys_of_a_sliding_layer():
    assert visible_keys(7, 100, WINDOW) == 7 + WINDOW - 1 and visible_keys(7, 7 + WINDOW, WINDOW) == 7 + WINDOW - 1
    assert visible_keys(7, 7 + WINDOW - 1, WINDOW) is None and visible_keys(7, 100, None) is None


@pytest.mark.parametrize("chunk", [5, 23])
def test_the_windowed_twin_prefills_in_chunks_as_stock_sdpa_does(tiny_gemma, monkeypatch, chunk):
    """A prompt several windows long, prefilled in chunks shorter and longer than the window: the twin's sliding
    layers meet each chunk with only the chunk + WINDOW - 1 keys its queries see, and its cache (every position of
    every layer), last logits and greedy tokens equal stock SDPA's to float rounding; cutting one key more changes
    them (the comparison bites); transformers' generate (its own sliding cache) is unchanged too."""
    monkeypatch.setattr(decoder_module, "PREFILL_CHUNK", chunk)
    ids = torch.tensor([1] + list(range(40, 140)))  # 100 cached positions: 6 windows
    twin = fast_twin(tiny_gemma)
    assert twin.config._attn_implementation == ATTENTION
    windowed, windowed_logits, met = _twin_prefill(tiny_gemma, ids)
    stock, stock_logits, _ = _twin_prefill(tiny_gemma, ids, "sdpa")
    windows = layer_windows(tiny_gemma)
    ends = list(itertools.accumulate(queries for layer, queries, _ in met if layer == 0))  # each chunk's end
    assert ends[-1] == len(ids) - 1 and len(met) == len(ends) * len(windows)
    for call, (layer, queries, keys) in enumerate(met):
        every = ends[call // len(windows)]
        assert keys == (min(every, queries + WINDOW - 1) if windows[layer] else every)
    assert max(keys for layer, _, keys in met if windows[layer]) == chunk + WINDOW - 1 < len(ids) - 1, "the cut bites"
    for got, want in zip(windowed.layers, stock.layers):
        assert got.keys.shape == want.keys.shape == (1, 1, len(ids) - 1, 16)
        # float rounding on keys of magnitude up to about 10: 0.8-1.8e-5 apart on each of torch's CPU kernel sets
        # (the scalar one the most), so 1e-5 of their scale, not 1e-5 absolute; the values and logits (magnitude
        # about 1) stay within 1e-6, and a key cut too many moves them by tenths (below)
        torch.testing.assert_close(got.keys, want.keys, atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(got.values, want.values, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(windowed_logits, stock_logits, atol=1e-5, rtol=1e-5)
    monkeypatch.setitem(AttentionInterface._global_mapping, "test_short_by_one", _short_by_one)
    monkeypatch.setitem(AttentionMaskInterface._global_mapping, "test_short_by_one", sdpa_mask)
    wrong, wrong_logits, _ = _twin_prefill(tiny_gemma, ids, "test_short_by_one")
    # one key short: the cache moves by tenths, the last logits by 10x the tolerance the windowed twin meets
    assert max(float((w.keys - s.keys).abs().max()) for w, s in zip(wrong.layers, stock.layers)) > 0.1
    assert float((wrong_logits - stock_logits).abs().max()) > 1e-4
    tokens = {}
    for implementation in (ATTENTION, "sdpa"):
        with stock_attention(twin, implementation):
            decoder = BatchDecoder(tiny_gemma, [ids.tolist()], max_new_tokens=8)
            tokens[implementation] = [int(step.argmax()) for step in _decode(decoder, 8)]
            generated = twin.generate(ids[None], max_new_tokens=6, do_sample=False)
            tokens[implementation, "generate"] = generated[0, len(ids):].tolist()
    assert tokens[ATTENTION] == tokens["sdpa"] and tokens[ATTENTION, "generate"] == tokens["sdpa", "generate"]
    assert twin.config._attn_implementation == ATTENTION


def test_the_windowed_sdpa_passes_a_mask_that_reaches_further_through_unchanged(tiny_gemma):
    """A causal mask handed to a layer that names a window (the window would drop keys it shows) and no mask at all:
    windowed_sdpa cuts nothing, bit for bit transformers' SDPA."""
    module = fast_twin(tiny_gemma).model.layers[0].self_attn
    query, key, value = torch.randn(1, 4, 3, 16), torch.randn(1, 1, 40, 16), torch.randn(1, 1, 40, 16)
    causal = torch.ones(40, 40, dtype=torch.bool).tril()[None, None, -3:]
    for mask in (causal, None):
        got, _ = windowed_sdpa(module, query, key, value, mask, sliding_window=WINDOW, scaling=0.25)
        want, _ = sdpa_attention.sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)
        assert torch.equal(got, want)
    window = causal & (torch.arange(40) > torch.arange(37, 40)[:, None] - WINDOW)
    got, _ = windowed_sdpa(module, query, key, value, window, sliding_window=WINDOW, scaling=0.25)
    want, _ = sdpa_attention.sdpa_attention_forward(module, query, key, value, window, scaling=0.25)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_a_model_without_sliding_layers_is_unchanged_bit_for_bit(tmp_path, monkeypatch):
    """Every layer global (a tiny Llama): the windowed twin's chunked prefill is stock SDPA's, keys, values and
    last logits equal bit for bit."""
    llama = dynheads_tl.load_model(str(build_tiny_model("llama", tmp_path / "llama")), device="cpu")
    monkeypatch.setattr(decoder_module, "PREFILL_CHUNK", 7)
    ids = torch.tensor([1] + list(range(40, 90)))
    windowed, windowed_logits, _ = _twin_prefill(llama, ids)
    stock, stock_logits, _ = _twin_prefill(llama, ids, "sdpa")
    assert fast_twin(llama).config._attn_implementation == ATTENTION
    assert torch.equal(windowed_logits, stock_logits)
    for got, want in zip(windowed.layers, stock.layers):
        assert torch.equal(got.keys, want.keys) and torch.equal(got.values, want.values)
