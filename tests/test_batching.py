"""Batched generation (left padding, shared prefill, per-row masks) against unbatched runs."""
from __future__ import annotations

import pytest
import torch

import dynheads_tl
from dynheads_tl import TraceConfig, trace_generation
from dynheads_tl.protocols import ablation_experiments as ablation
from dynheads_tl.protocols.ablation import AblationSetup, Job, cached_runs, run_condition, run_jobs, two_pass_batch
from dynheads_tl.engine.hooks import ablate_heads
from dynheads_tl.tasks import make_niah_samples
from dynheads_tl.engine.decoder import BatchDecoder
from dynheads_tl.engine.tracing import trace_batch
from conftest import build_tiny_model


def assert_same_trace(batched, single, *, hidden_atol=1e-4):
    assert torch.equal(batched.tokens, single.tokens)
    assert torch.equal(batched.argmax_pos, single.argmax_pos)
    assert torch.equal(batched.retrieval_mask, single.retrieval_mask)
    torch.testing.assert_close(batched.support_score, single.support_score, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(batched.hidden, single.hidden, atol=hidden_atol, rtol=1e-4)
    assert batched.response == single.response


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_tiny_padded_batch_matches_single_runs(family, tmp_path):
    """Mechanics on random models: prompts of different lengths (so rows are left-padded)."""
    model = dynheads_tl.load_model(str(build_tiny_model(family, tmp_path / family)), device="cpu")
    samples = make_niah_samples(model.tokenizer, n=3, context_tokens=[60, 90, 75], seed=4, max_new_tokens=6)
    lengths = {len(s.prompt_ids) for s in samples}
    assert len(lengths) == 3, "the test needs padding"
    config = TraceConfig(max_new_tokens=6, stop_at_eos=False, local_window=8)
    batched = trace_batch(model, samples, config)
    for sample, trace in zip(samples, batched):
        assert_same_trace(trace, trace_generation(model, sample, config))
        # Source positions are in the row's own coordinates: never in another row's padding.
        assert int(trace.argmax_pos.min()) >= 0
        assert int(trace.argmax_pos.max()) < len(sample.prompt_ids) + config.max_new_tokens


def test_a_prefill_cache_lives_only_until_no_later_prompt_copies_from_it(monkeypatch, tmp_path):
    """Each distinct prompt's prefill cache is written into the batch's cache as soon as it exists and dropped once
    no later prompt copies a prefix from it: a batch of long prompts never holds every prompt's prefill at once.
    Counted at the start of every prefill (outside a prefix store, which would keep its own references); the
    decoding steps still match a decoder of each prompt alone."""
    import gc
    import weakref

    model = dynheads_tl.load_model(str(build_tiny_model("llama", tmp_path / "llama")), device="cpu")
    head = list(range(5, 45))
    # a one-token prompt (nothing to prefill) and one prompt twice (its rows share one copy of it)
    prompts = [head + [50, 51, 52], [60, 61, 62, 63, 64], head + [70, 71], list(range(80, 120)), [1],
               [60, 61, 62, 63, 64]]
    alive, made, original = [], [], BatchDecoder._prefill

    def tracking(*args, **kwargs):
        gc.collect()
        alive.append(sum(ref() is not None for ref in made))
        cache = original(*args, **kwargs)
        made.append(weakref.ref(cache))
        return cache

    monkeypatch.setattr(BatchDecoder, "_prefill", staticmethod(tracking))
    decoder = BatchDecoder(model, prompts, max_new_tokens=2)
    # lexicographic order: [1], head+50.., head+70.. (copies head from the one before), 60.., 80..; only head+50.. is
    # still alive when the next prompt is prefilled
    assert alive == [0, 0, 1, 0, 0]
    assert decoder.cache.shared and decoder.prefilled_positions < decoder.prompt_positions
    gc.collect()
    assert sum(ref() is not None for ref in made) == 0
    monkeypatch.setattr(BatchDecoder, "_prefill", staticmethod(original))
    logits = decoder.step()
    for row, prompt in enumerate(prompts):
        torch.testing.assert_close(logits[row], BatchDecoder(model, [prompt], max_new_tokens=2).step()[0],
                                   atol=1e-4, rtol=1e-4)


def test_placebo_spans_ride_on_the_real_generation(tmp_path):
    """trace_pairs: one generation records Eq. 2 on the real and on the placebo evidence; each half equals tracing
    its own samples in the same batch bit for bit, and Eq. 2 of the two halves differs (other positions)."""
    from dynheads_tl.engine.tracing import trace_pairs
    from dynheads_tl.tasks.common import placebo_sample

    model = dynheads_tl.load_model(str(build_tiny_model("llama", tmp_path / "llama")), device="cpu")
    samples = make_niah_samples(model.tokenizer, n=3, context_tokens=[150, 200, 175], seed=4, max_new_tokens=6)
    placebo = [placebo_sample(s, seed=i) for i, s in enumerate(samples)]
    config = TraceConfig(max_new_tokens=6, stop_at_eos=False, local_window=8)
    pairs = trace_pairs(model, samples, placebo, config)
    for (real, moved), alone, moved_alone in zip(pairs, trace_batch(model, samples, config),
                                                 trace_batch(model, placebo, config)):
        for got, want in ((real, alone), (moved, moved_alone)):
            assert torch.equal(got.tokens, want.tokens) and torch.equal(got.argmax_pos, want.argmax_pos)
            assert torch.equal(got.support_score, want.support_score) and torch.equal(got.hidden, want.hidden)
            assert got.evidence_spans == want.evidence_spans and got.meta == want.meta
        assert not torch.equal(real.support_score, moved.support_score)
    [(one, one_moved)] = trace_pairs(model, samples[:1], placebo[:1], config)  # a batch of one: no padding
    assert torch.equal(one_moved.support_score, trace_generation(model, placebo[0], config).support_score)
    with pytest.raises(ValueError, match="another prompt"):
        trace_pairs(model, samples[:2], placebo[1:], config)
    with pytest.raises(ValueError, match="one per sample"):
        trace_pairs(model, samples, placebo[:2], config)
    with pytest.raises(ValueError, match="signals=False"):
        trace_pairs(model, samples, placebo, TraceConfig(max_new_tokens=6, signals=True))


def test_identical_prompts_are_prefilled_once(monkeypatch, embedded_model):
    [sample] = make_niah_samples(embedded_model.tokenizer, n=1, context_tokens=200, seed=9)
    twin = dynheads_tl.engine.models.fast_twin(embedded_model)
    calls = []
    original = twin.forward

    def counting(*args, **kwargs):
        calls.append(kwargs["input_ids"].shape[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(twin, "forward", counting)  # this instance only: the bridge wraps the same class
    decoder = BatchDecoder(embedded_model, [sample.prompt_ids] * 3)
    assert calls == [1], "three identical prompts, one prefill row"
    assert all(layer.keys.shape[0] == 3 for layer in decoder.cache.layers)
    logits = decoder.step()
    assert torch.equal(logits[0], logits[1]) and torch.equal(logits[1], logits[2])


def test_per_row_ablation_and_partial_cache_restore(embedded_model):
    [sample] = make_niah_samples(embedded_model.tokenizer, n=1, context_tokens=200, seed=9)
    n_layers, n_heads = embedded_model.cfg.n_layers, embedded_model.cfg.n_heads
    mask = torch.zeros(2, n_layers, n_heads, dtype=torch.bool)
    mask[1, 5:15] = True  # row 1 only
    decoder = BatchDecoder(embedded_model, [sample.prompt_ids] * 2)
    clean = decoder.step()
    saved = decoder.last_position()
    decoder.rewind(decoder.n_cached - 1)
    with embedded_model.hooks(fwd_hooks=ablate_heads(lambda: mask, n_layers=n_layers)):
        ablated = decoder.step()
    assert torch.equal(ablated[0], clean[0])
    assert (ablated[1] - clean[1]).abs().max() > 1e-2
    masked_keys = [layer.keys[:, :, -1].clone() for layer in decoder.cache.layers]
    decoder.replace_last_position(saved, rows=torch.tensor([False, True]))
    deep = n_layers - 1  # a layer after the ablated ones: its keys differ between the two passes
    assert not torch.equal(masked_keys[deep][1], saved[deep][0][1, :, -1])
    assert torch.equal(decoder.cache.layers[deep].keys[1, :, -1], saved[deep][0][1, :, -1])
    assert torch.equal(decoder.cache.layers[deep].keys[0, :, -1], masked_keys[deep][0])


@pytest.fixture(scope="module")
def padded_samples(embedded_model):
    samples = make_niah_samples(embedded_model.tokenizer, n=2, context_tokens=[300, 340], seed=21, max_new_tokens=24)
    assert len(samples[0].prompt_ids) != len(samples[1].prompt_ids)
    return samples


@pytest.fixture(scope="module")
def setup():
    static = torch.zeros(30, 9, dtype=torch.bool)
    static[[15, 18, 20, 20], [1, 6, 5, 7]] = True
    return AblationSetup(static_mask=static, static_top20=static, k=4)


@pytest.mark.slow
def test_two_pass_batch_matches_single_runs(embedded_model, padded_samples, setup):
    config = TraceConfig(max_new_tokens=8)  # the answer's first words: D_t is masked from the first steps
    jobs = [Job(s, c, i) for i, s in enumerate(padded_samples) for c in ("none", "dynamic", "static", "random")]
    jobs += [Job(padded_samples[0], "progressive", 0, 0), Job(padded_samples[0], "progressive", 0, 10)]
    batched = run_jobs(embedded_model, jobs, setup, config)
    for job, result in zip(jobs, batched):
        single = run_condition(embedded_model, job.sample, job.condition, setup, config,
                               sample_seed=job.sample_seed, k=job.k)
        assert torch.equal(result.masked_heads, single.masked_heads), job.condition
        assert_same_trace(result.masked, single.masked)
        assert_same_trace(result.clean, single.clean)
        assert result.condition == job.condition
    assert batched[1].masked_heads.any(), "dynamic masking bites on this sample"
    # Within one batch, k = 0 gives exactly the unmasked row's tokens and sources (the hidden states of
    # two rows of one batched matmul may differ in the last bits).
    assert torch.equal(batched[-2].masked.tokens, batched[0].masked.tokens)
    assert torch.equal(batched[-2].clean.argmax_pos, batched[0].clean.argmax_pos)
    torch.testing.assert_close(batched[-2].masked.hidden, batched[0].masked.hidden, atol=1e-4, rtol=1e-4)


def test_two_pass_batch_validates_its_input(embedded_model, padded_samples):
    with pytest.raises(ValueError, match="No jobs"):
        two_pass_batch(embedded_model, [])
    with pytest.raises(ValueError, match="labels"):
        two_pass_batch(embedded_model, [(padded_samples[0], lambda view: None)], labels=[("a", 1), ("b", 2)])
    with pytest.raises(ValueError, match="empty"):
        BatchDecoder(embedded_model, [[1, 2, 3], []])


def test_cached_runs_batches_only_what_is_missing(monkeypatch, tmp_path, embedded_model, padded_samples, setup):
    monkeypatch.setenv("DYNHEADS_CACHE", str(tmp_path))
    config = TraceConfig(max_new_tokens=4)
    batches = []
    original = ablation.run_jobs

    def recording(model, jobs, *args, **kwargs):
        batches.append([(job.condition, job.sample_seed) for job in jobs])
        return original(model, jobs, *args, **kwargs)

    monkeypatch.setattr(ablation, "run_jobs", recording)
    first = [Job(padded_samples[0], "static", 0), Job(padded_samples[1], "static", 1)]
    cached_runs(embedded_model, first, setup, config, batch_size=8, cache_key={"test": 1})
    assert batches == [[("static", 0), ("static", 1)]]
    jobs = first + [Job(padded_samples[0], c, 0) for c in ("none", "dynamic", "random")]
    out = cached_runs(embedded_model, jobs, setup, config, batch_size=2, cache_key={"test": 1})
    assert batches[1:] == [[("none", 0), ("dynamic", 0)], [("random", 0)]]
    assert [row["heads_ever_masked"] for row, _ in out[:2]] == ["L15H1 L18H6 L20H5 L20H7"] * 2
    with pytest.raises(ValueError, match="batch_size"):
        cached_runs(embedded_model, jobs, setup, config, batch_size=0)


def test_teacher_forced_batch_takes_its_prompts_from_the_store(monkeypatch, embedded_model, padded_samples, setup):
    """The generated and teacher-forced batches of a group alternate, so a teacher-forced batch finds the prompts the
    generated batch before it prefilled in the prefix store, even where the store holds one prompt: one twin prefill
    per sample, not two."""
    monkeypatch.setenv("DYNHEADS_PREFIX_STORE_MB", "20")  # one 300-token SmolLM2 prompt (14 MiB), not two
    twin = dynheads_tl.engine.models.fast_twin(embedded_model)
    prefilled, original = [], twin.forward

    def counting(*args, **kwargs):
        prefilled.append(kwargs["input_ids"].shape[1])
        return original(*args, **kwargs)

    monkeypatch.setattr(twin, "forward", counting)
    jobs = [Job(sample, "none", seed, teacher_forced=forced) for seed, sample in enumerate(padded_samples)
            for forced in (False, True)]
    order = []
    original_run = ablation.run_jobs

    def recording(model, batch, *args, **kwargs):
        order.append([(job.sample_seed, job.teacher_forced) for job in batch])
        return original_run(model, batch, *args, **kwargs)

    monkeypatch.setattr(ablation, "run_jobs", recording)
    cached_runs(embedded_model, jobs, setup, TraceConfig(max_new_tokens=2), batch_size=1)
    assert order == [[(0, False)], [(0, True)], [(1, False)], [(1, True)]]
    lengths = [len(sample.prompt_ids) - 1 for sample in padded_samples]
    assert len(prefilled) == 2 and sum(prefilled) <= sum(lengths), prefilled


def test_one_token_prompt_beside_longer_ones(embedded_model):
    """A row with nothing to prefill (all padding in the cache) still decodes as if alone."""
    from dynheads_tl.engine.decoder import Decoder

    ids = embedded_model.tokenizer("The capital of France is", return_tensors="pt").input_ids[0].tolist()
    decoder = BatchDecoder(embedded_model, [ids[-1:], ids])
    logits = decoder.step()
    torch.testing.assert_close(logits[0], Decoder(embedded_model, ids[-1:]).step(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits[1], Decoder(embedded_model, ids).step(), atol=1e-4, rtol=1e-4)


def test_grid_jobs_and_their_batches():
    """The grid's plan without a model: one group per (context, depth) cell, every condition on every sample
    and then the same jobs teacher-forced; batches never mix cells nor generated with teacher-forced jobs."""
    from dynheads_tl.protocols.ablation import batch_plan, grid_jobs
    from dynheads_tl.tasks.common import Sample

    def sample(i):
        return Sample(task="niah", prompt_ids=[1, 2, i], evidence_spans=[], answers=["x"], question="q",
                      context_span=(0, 2))

    cells = [({"context": c, "depth": 0.5, "run": r}, sample(10 * c + r)) for c in (1, 2) for r in range(3)]
    planned = grid_jobs(cells, ["none", "dynamic"], teacher_forced=True)
    assert [members for members, _ in planned] == [[0, 1, 2], [3, 4, 5]]
    members, jobs = planned[1]
    assert [(j.sample_seed, j.condition) for j in jobs[:2]] == [(3, "none"), (3, "dynamic")]
    assert [j.teacher_forced for j in jobs] == [False] * 6 + [True] * 6
    assert [(j.sample_seed, j.condition) for j in jobs[6:]] == [(j.sample_seed, j.condition) for j in jobs[:6]]
    assert all(len(cell_jobs) == 6 for _, cell_jobs in grid_jobs(cells, ["none", "dynamic"], teacher_forced=False))

    everything = [job for _, cell_jobs in planned for job in cell_jobs]
    groups = [number for number, (_, cell_jobs) in enumerate(planned) for _ in cell_jobs]
    batches = batch_plan(everything, groups, 4)
    # per cell, its generated and teacher-forced batches alternate (the teacher-forced ones reuse the prompts)
    assert batches == [[0, 1, 2, 3], [6, 7, 8, 9], [4, 5], [10, 11], [12, 13, 14, 15], [18, 19, 20, 21], [16, 17],
                       [22, 23]]
    assert sorted(i for batch in batches for i in batch) == list(range(len(everything)))
    for batch in batches:
        assert len({groups[i] for i in batch}) == 1 and len({everything[i].teacher_forced for i in batch}) == 1
    assert batch_plan(everything, groups, 4, indices=[1, 7, 13]) == [[1], [7], [13]]
    assert len(batch_plan(everything, [0] * len(everything), 100)) == 2  # one group: generated, then teacher-forced
