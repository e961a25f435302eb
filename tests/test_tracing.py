"""The retrieval engine against an independent computation, plus hook mechanics."""
from __future__ import annotations

import pytest
import torch

import dynheads_tl
from dynheads_tl import Trace, TraceConfig, trace_generation
from dynheads_tl.engine.hooks import StepState, ablate_heads, restrict_attention
from dynheads_tl.tasks import make_hotpot_samples, make_niah_samples
from dynheads_tl.engine.decoder import Decoder
from dynheads_tl.engine.recorder import build_trace
from dynheads_tl.engine.tracing import Greedy, decode


@pytest.fixture(scope="module")
def niah_samples(embedded_model):
    return make_niah_samples(embedded_model.tokenizer, n=2, context_tokens=400, seed=11, max_new_tokens=40)


def independent_rows(reference, trace: Trace, *, logits: bool = False):
    """Every step's attention row from ONE eager transformers forward over prompt + response; with ``logits``, also
    that forward's logits at every step's query row."""
    ids = torch.cat([trace.prompt_ids, trace.tokens[:-1]])[None]
    with torch.no_grad():
        out = reference(ids, output_attentions=True)
    start = len(trace.prompt_ids) - 1
    # [step, layer, head, key]
    rows = torch.stack([a[0, :, start:, :] for a in out.attentions]).permute(2, 0, 1, 3)
    return (rows, out.logits[0, start:]) if logits else rows


def independent_eq1(rows, trace: Trace):
    argmax = rows.argmax(-1)  # [step, layer, head]
    ids = torch.cat([trace.prompt_ids, trace.tokens])
    (needle_start, needle_end), = trace.evidence_spans
    in_needle = (argmax >= needle_start) & (argmax < needle_end)
    return in_needle & (ids[argmax] == trace.tokens[:, None, None])


@pytest.fixture(scope="module")
def eager_niah(embedded_reference, niah_samples):
    """The independent side of the NIAH parity test, computed once for both prefill modes: per sample, eager
    transformers' greedy tokens and, for those tokens, every step's attention rows and final-norm hidden states."""
    computed = []
    for sample in niah_samples:
        prompt = torch.tensor(sample.prompt_ids)
        tokens = embedded_reference.generate(prompt[None], max_new_tokens=40, do_sample=False)[0, len(prompt):]
        ids = torch.cat([prompt, tokens[:-1]])[None]
        with torch.no_grad():
            out = embedded_reference(ids, output_attentions=True, output_hidden_states=True)
        start = len(prompt) - 1
        rows = torch.stack([a[0, :, start:, :] for a in out.attentions]).permute(2, 0, 1, 3)  # [step, layer, head, key]
        computed.append((tokens, rows, out.hidden_states[-1][0, start:]))
    return computed


@pytest.mark.slow
@pytest.mark.parametrize("prefill", ["fast", "hooked"])
def test_eq1_matches_eager_transformers(embedded_model, eager_niah, niah_samples, prefill):
    config = TraceConfig(max_new_tokens=40, prefill=prefill)
    for sample, (hf_tokens, rows, hidden) in zip(niah_samples, eager_niah):
        trace = trace_generation(embedded_model, sample, config)
        assert trace.tokens.tolist() == hf_tokens.tolist()
        # (the rows were computed for hf_tokens, which the line above shows are the trace's tokens)
        assert torch.equal(trace.argmax_pos, rows.argmax(-1))
        assert torch.equal(trace.retrieval_mask, independent_eq1(rows, trace))
        assert trace.retrieval_mask.any(), "the embedded model should copy the needle here"
        # Final-norm hidden state of each step's query row.
        torch.testing.assert_close(trace.hidden, hidden, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_eq2_matches_eager_transformers(embedded_model, embedded_reference):
    [sample] = make_hotpot_samples(embedded_model.tokenizer, n=1, seed=3)
    config = TraceConfig(max_new_tokens=8, sink_tokens=4, local_window=32)
    trace = trace_generation(embedded_model, sample, config)
    rows = independent_rows(embedded_reference, trace)
    expected = torch.zeros_like(trace.support_score)
    for t in range(trace.n_steps):
        key_len = len(sample.prompt_ids) + t
        eligible = torch.ones(key_len, dtype=torch.bool)
        eligible[:4] = False
        eligible[key_len - 32:] = False
        evidence = torch.zeros(key_len, dtype=torch.bool)
        for s, e in sample.evidence_spans:
            evidence[s:e] = True
        row = rows[t, :, :, :key_len]
        expected[t] = (row * (evidence & eligible)).sum(-1) / (row * eligible).sum(-1)
    torch.testing.assert_close(trace.support_score, expected, atol=1e-5, rtol=1e-4)
    assert (trace.support_score >= 0).all() and (trace.support_score <= 1 + 1e-6).all()


@pytest.mark.slow
def test_evidence_attention_matches_eager_transformers_batched_and_alone(embedded_model, embedded_reference):
    """Each head's recorded weight on each evidence position equals the eager attention row there, for a
    sample traced alone and for the same sample left-padded in a batch with a longer one."""
    samples = make_niah_samples(embedded_model.tokenizer, n=2, context_tokens=[300, 420], seed=5,
                                random_layout=True, max_new_tokens=12)
    config = TraceConfig(max_new_tokens=12, evidence_attention=True)
    alone = trace_generation(embedded_model, samples[0], config)
    batched = dynheads_tl.engine.tracing.trace_batch(embedded_model, samples, config)
    for trace in (alone, batched[0], batched[1]):
        rows = independent_rows(embedded_reference, trace)  # [step, layer, head, key]
        where = trace.evidence_mask.nonzero().flatten()
        expected = rows[..., where]
        assert trace.evidence_attention.shape == expected.shape
        torch.testing.assert_close(trace.evidence_attention.float(), expected, atol=2e-3, rtol=1e-2)  # float16
        assert expected.sum(-1).max() > 0.5, "some head should read the needle"
    assert alone.tokens.tolist() == batched[0].tokens.tolist()
    # Each trace of a batch owns its tensors (a view would save the whole batch's buffer with every trace).
    for name in ("argmax_pos", "support_score", "hidden", "evidence_attention"):
        tensor = getattr(batched[0], name)
        assert tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size(), name
    # A trace recorded without it has none, and its config key is unchanged by the option's existence.
    assert trace_generation(embedded_model, samples[0], TraceConfig(max_new_tokens=2)).evidence_attention is None
    assert "evidence_attention" not in TraceConfig().key() and TraceConfig(evidence_attention=True).key()["evidence_attention"]


def test_trace_roundtrip(embedded_model, niah_samples, tmp_path):
    trace = trace_generation(embedded_model, niah_samples[0], TraceConfig(max_new_tokens=6))
    path = trace.save(tmp_path / "t.pt")
    loaded = Trace.load(path)
    for name in ("tokens", "argmax_pos", "support_score", "hidden", "prompt_ids"):
        assert torch.equal(getattr(trace, name), getattr(loaded, name))
    assert loaded.evidence_spans == trace.evidence_spans and loaded.config == trace.config
    assert loaded.config["model"] == "smollm2-135m-instruct"
    assert not list(tmp_path.glob("*.tmp"))


def test_untraced_loop_generates_the_same_tokens(embedded_model, niah_samples):
    config = TraceConfig(max_new_tokens=10)
    traced = trace_generation(embedded_model, niah_samples[1], config)
    plain = trace_generation(embedded_model, niah_samples[1], config, record=False)
    assert torch.equal(traced.tokens, plain.tokens)


def test_zero_ablation_changes_logits_and_empty_mask_does_not(embedded_model, niah_samples):
    sample = niah_samples[0]
    n_layers, n_heads = embedded_model.cfg.n_layers, embedded_model.cfg.n_heads

    def first_logits(hooks):
        with embedded_model.hooks(fwd_hooks=hooks):
            return Decoder(embedded_model, sample.prompt_ids).step()

    clean = first_logits([])
    none = first_logits(ablate_heads(torch.zeros(n_layers, n_heads, dtype=torch.bool)))
    assert torch.equal(clean, none)
    mask = torch.zeros(n_layers, n_heads, dtype=torch.bool)
    mask[10:20] = True
    ablated = first_logits(ablate_heads(mask))
    assert (ablated - clean).abs().max() > 1e-2
    means = torch.zeros(n_layers, n_heads, embedded_model.cfg.d_head)
    assert torch.allclose(first_logits(ablate_heads(mask, mode="mean", mean_z=means)), ablated)


def test_ablation_only_at_chosen_steps(embedded_model, niah_samples):
    sample = niah_samples[0]
    n_layers, n_heads = embedded_model.cfg.n_layers, embedded_model.cfg.n_heads
    per_step = torch.zeros(6, n_layers, n_heads, dtype=torch.bool)
    per_step[3, :, :] = True  # ablate every head, but only at step 3
    config = TraceConfig(max_new_tokens=6, stop_at_eos=False)
    clean = trace_generation(embedded_model, sample, config)
    state = StepState()
    ablated = trace_generation(embedded_model, sample, config, hooks=ablate_heads(per_step, state=state), state=state)
    assert torch.equal(clean.tokens[:3], ablated.tokens[:3])
    assert torch.equal(clean.argmax_pos[:3], ablated.argmax_pos[:3])
    assert not torch.equal(clean.hidden[3], ablated.hidden[3])


def test_restricted_attention_is_exactly_zero_under_kv_cache(embedded_model, niah_samples):
    sample = niah_samples[0]
    n_layers = embedded_model.cfg.n_layers
    allowed = torch.ones(len(sample.prompt_ids), dtype=torch.bool)
    start, end = sample.context_span
    allowed[start:end] = False
    rows = []

    def grab(pattern, hook):
        rows.append(pattern[0, :, -1, :].clone())

    hooks = restrict_attention(allowed, n_layers=n_layers) + [("blocks.5.attn.hook_pattern", grab)]
    with embedded_model.hooks(fwd_hooks=hooks):
        decoder = Decoder(embedded_model, sample.prompt_ids, prefill="hooked")
        logits = decoder.step()
        decoder.step(int(logits.argmax()))
    # rows[0] is the hooked prefill (all rows; we kept the last); then two decoding steps.
    for row in rows:
        assert float(row[:, start:end].abs().max()) == 0.0
        torch.testing.assert_close(row.sum(-1), torch.ones(row.shape[0]), atol=1e-5, rtol=0)
    assert rows[-1].shape[-1] == len(sample.prompt_ids) + 1


# --- the loop's extension points: retraction and a partly hooked prefill ---------------------------
class RetractOnce(Greedy):
    """Greedy decoding that, after step ``at``, takes back every token from ``to`` on, once."""

    def __init__(self, at: int, to: int):
        self.at, self.to, self.calls, self.retracted = at, to, 0, False

    def choose(self, loop, step):
        self.calls += 1
        return super().choose(loop, step)

    def after_step(self, loop, step):
        if step == self.at and not self.retracted:
            self.retracted = True
            loop.retract(self.to)


def test_a_retracting_policy_resumes_exactly_where_it_retracted(embedded_model, niah_samples):
    config = TraceConfig(max_new_tokens=8, stop_at_eos=False)
    sample = niah_samples[0]
    plain = trace_generation(embedded_model, sample, config)
    policy = RetractOnce(at=4, to=1)
    loop, buffers = decode(embedded_model, [sample], config, policy)
    retraced = build_trace(embedded_model, sample, config, loop.tokens[0], buffers)
    assert policy.calls == 8 + 4  # steps 1..4 ran twice
    assert torch.equal(retraced.tokens, plain.tokens)
    assert torch.equal(retraced.argmax_pos, plain.argmax_pos)
    torch.testing.assert_close(retraced.support_score, plain.support_score, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="retract to 9"):
        decode(embedded_model, [sample], config, RetractOnce(at=2, to=9))


def test_fast_until_runs_the_prompt_tail_through_the_hooked_bridge(embedded_model, niah_samples):
    class TailThroughBridge(Greedy):
        def fast_until(self, samples):
            return [len(s.prompt_ids) - 20 for s in samples]

    sample = niah_samples[1]
    config = TraceConfig(max_new_tokens=6)
    queries = []
    hook = ("blocks.0.attn.hook_pattern", lambda pattern, hook: queries.append(pattern.shape[2]))
    loop, buffers = decode(embedded_model, [sample], config, TailThroughBridge(), hooks=[hook])
    split = build_trace(embedded_model, sample, config, loop.tokens[0], buffers)
    plain = trace_generation(embedded_model, sample, config)
    assert queries[0] == 19  # the prompt's last 20 tokens minus the one step 0 decodes
    assert all(q == 1 for q in queries[1:])
    assert torch.equal(split.tokens, plain.tokens)
    torch.testing.assert_close(split.support_score, plain.support_score, rtol=0, atol=1e-4)


@pytest.mark.slow
def test_signals_match_eager_transformers_batched_and_alone(embedded_model, embedded_reference):
    """TraceConfig(signals=True): each head's mass on the evidence, the context span and the generated tokens,
    and the kept token's log-probability and entropy, equal an eager forward, alone and left-padded in a batch;
    the tokens are those of a trace without signals."""
    samples = make_niah_samples(embedded_model.tokenizer, n=2, context_tokens=[300, 420], seed=7,
                                random_layout=True, max_new_tokens=10)
    config = TraceConfig(max_new_tokens=10, signals=True)
    alone = trace_generation(embedded_model, samples[0], config)
    batched = dynheads_tl.engine.tracing.trace_batch(embedded_model, samples, config)
    plain = trace_generation(embedded_model, samples[0], TraceConfig(max_new_tokens=10))
    assert alone.tokens.tolist() == plain.tokens.tolist() == batched[0].tokens.tolist()
    assert plain.context_mass is None and "signals" not in TraceConfig().key()
    for trace, sample in ((alone, samples[0]), (batched[0], samples[0]), (batched[1], samples[1])):
        rows, logits = independent_rows(embedded_reference, trace, logits=True)  # [step, layer, head, key]
        n_prompt = len(trace.prompt_ids)
        context = torch.zeros(rows.shape[-1], dtype=torch.bool)
        context[sample.context_span[0]: sample.context_span[1]] = True
        torch.testing.assert_close(trace.evidence_mass, rows[..., trace.evidence_mask.nonzero().flatten()].sum(-1),
                                   atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(trace.context_mass, rows[..., context].sum(-1), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(trace.generated_mass, rows[..., n_prompt:].sum(-1), atol=1e-4, rtol=1e-4)
        assert (trace.generated_mass[0] == 0).all()  # step 0 reads the prompt only
        log_p = torch.log_softmax(logits, -1)
        torch.testing.assert_close(trace.token_logprob, log_p.gather(-1, trace.tokens[:, None])[:, 0],
                                   atol=1e-3, rtol=1e-3)
        torch.testing.assert_close(trace.token_entropy, -(log_p.exp() * log_p).sum(-1), atol=1e-3, rtol=1e-3)


def test_retained_heads_read_everything_and_the_others_only_sinks_and_window(embedded_model, niah_samples):
    """retain_heads: a head outside the retained set gets exactly zero attention outside the sinks and the local
    window while the retained heads' rows are untouched; retaining every head is the full cache exactly, and
    retaining none is the streaming restriction of every head exactly."""
    from dynheads_tl.engine.hooks import retain_heads

    sample = niah_samples[0]
    n_layers, n_heads = embedded_model.cfg.n_layers, embedded_model.cfg.n_heads
    n_keys = len(sample.prompt_ids) + 4
    streaming = torch.zeros(n_keys, dtype=torch.bool)
    streaming[:4] = True
    streaming[len(sample.prompt_ids) - 16:] = True  # the last 16 prompt positions and the generated ones
    keep = torch.zeros(n_layers, n_heads, dtype=torch.bool)
    keep[:5] = True  # layers 0-4 whole, so layer 5's step-0 input is the full cache's
    keep[5, 2] = keep[12, 0] = True

    def run(retained, extra=()):
        rows = []
        grab = lambda pattern, hook: rows.append(pattern[0, :, -1, :].clone())
        hooks = list(extra) + [("blocks.5.attn.hook_pattern", grab)]
        if retained is not None:
            hooks = retain_heads(lambda: retained, lambda: streaming, n_layers=n_layers) + hooks
        with embedded_model.hooks(fwd_hooks=hooks):
            decoder = Decoder(embedded_model, sample.prompt_ids)
            logits = [decoder.step()]
            logits.append(decoder.step(int(logits[0].argmax())))
        return torch.stack(logits), rows

    full_logits, full_rows = run(None)
    logits, rows = run(keep)
    for row, full in zip(rows, full_rows):
        outside = ~streaming[: row.shape[-1]]
        others = [h for h in range(n_heads) if h != 2]
        assert float(row[others][:, outside].abs().max()) == 0.0  # layer 5's other heads are restricted
        assert float(row[2, outside].sum()) > 0.01  # the retained head still reads the context
        torch.testing.assert_close(row.sum(-1), torch.ones(n_heads), atol=1e-5, rtol=0)
    assert torch.equal(rows[0][2], full_rows[0][2])  # step 0: a retained head's row is the full cache's
    every = torch.ones(n_layers, n_heads, dtype=torch.bool)
    assert torch.equal(run(every)[0], full_logits)
    none_logits, _ = run(torch.zeros(n_layers, n_heads, dtype=torch.bool))
    streaming_only, _ = run(None, restrict_attention(streaming, n_layers=n_layers))
    torch.testing.assert_close(none_logits, streaming_only, atol=0, rtol=0)
