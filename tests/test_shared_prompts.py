"""Rows of one batch that decode the same prompt hold one copy of its keys and values (``shared_prompts``): the
grouped step multiplies all of a prompt's rows against that copy together. Everything a decoder does must come out
as it does with a copy per row (``shared_prompts(False)``) and as the eager reference computes it: steps, the
two-pass ablation's rewind and restore, a score-replacing hook, an eager step in between, growth past the capacity
and a rewind into the prompt (which gives every row its own copy again).

Tolerances as in ``tests/test_grouped.py``: tokens, top-1 sources and Eq. 1 sets equal; floats to float32 rounding.
"""
from __future__ import annotations

import pytest
import torch

import dynheads_tl
from dynheads_tl import TraceConfig
from dynheads_tl.engine.decoder import BatchDecoder, bounded_windows, shared_prompts
from dynheads_tl.engine.grouped import attention_path
from dynheads_tl.engine.hooks import StepState, ablate_heads, restrict_attention
from dynheads_tl.engine.tracing import trace_batch
from dynheads_tl.tasks import make_niah_samples
from conftest import build_tiny_model
from test_grouped import assert_same_traces

# Engine exactness: .ci/run runs these again under every CPU kernel set torch has here (ATEN_CPU_CAPABILITY).
pytestmark = pytest.mark.exactness


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def tiny(request, tmp_path_factory):
    folder = build_tiny_model(request.param, tmp_path_factory.mktemp("tiny") / request.param)
    return dynheads_tl.load_model(str(folder), device="cpu")


# Lengths differ (left padding) and exceed the tiny Gemma's 16-token window.
A, B, C = [1] + list(range(40, 100)), [1] + list(range(30, 75)), [1] + list(range(50, 70))
ORDERS = {
    # two prompts, each decoded by rows that are not next to each other, and a third decoded once: owner by owner
    "scattered": ([A, B, A, C, A, B], [0, 1, 0, 2, 0, 1], 0),
    # each prompt's rows next to each other, as many per prompt (a grid cell): one product over every owner
    "blocks": ([A, A, B, B, C, C], [0, 0, 1, 1, 2, 2], 2),
    # one prompt for every row
    "one prompt": ([B] * 6, [0] * 6, 6),
}


@pytest.fixture(params=list(ORDERS))
def order(request):
    return ORDERS[request.param]


class _Tokens:
    """The tokens a session feeds: each step's greedy choice from its own logits, or, given ``fed``, the same tokens a
    reference session chose (teacher forcing), so that two paths are compared on one token sequence.

    Why: the tiny random models have near-ties among their 49k logits (top-2 gaps down to 2e-6 on the tiny Gemma 3,
    where the grouped and eager paths differ by 1e-6 from summing in another order). Left to choose for itself, each
    path may break such a tie its own way, and from then on the two decode different text. Which way a tie falls
    depends on the CPU's kernels (an AVX2-only machine broke one differently from an AVX-512 one), not on the engine.
    """

    def __init__(self, fed: list[torch.Tensor] | None = None):
        self.fed = fed
        self.chosen: list[torch.Tensor] = []  # the tokens fed, in order
        self.own: list[torch.Tensor] = []  # what this session's own logits would have chosen
        self.logits: list[torch.Tensor] = []  # the logits each choice was read from

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        own = logits.argmax(-1)
        token = own if self.fed is None else self.fed[len(self.chosen)]
        self.chosen.append(token)
        self.own.append(own)
        self.logits.append(logits)
        return token


def _decode(decoder: BatchDecoder, logits: torch.Tensor, steps: int, pick: _Tokens) -> list[torch.Tensor]:
    out = []
    for _ in range(steps):
        logits = decoder.step(pick(logits))
        out.append(logits)
    return out


def _session(model, prompts, share: bool, path: str = "grouped",
             fed: list[torch.Tensor] | None = None) -> tuple[BatchDecoder, list[torch.Tensor], _Tokens]:
    """Every operation a protocol performs on a decoder, in one sequence; the logits of every step and the tokens
    fed (``fed``: another session's, in the same order)."""
    pick = _Tokens(fed)
    width = max(map(len, prompts))
    heads = torch.zeros(model.cfg.n_layers, model.cfg.n_heads, dtype=torch.bool)
    heads[0, 1] = heads[1, 0] = True
    allowed = torch.ones(width + 40, dtype=torch.bool)
    allowed[width - 10: width - 4] = False  # inside the prompt and every sliding window
    with shared_prompts(share):
        decoder = BatchDecoder(model, prompts, attention=path, max_new_tokens=4)
    out = [decoder.step()]
    out += _decode(decoder, out[-1], 2, pick)
    before = decoder.n_cached  # the two-pass step: clean, rewind, ablated, restore the clean keys in some rows
    clean_input = pick(out[-1])
    out.append(decoder.step(clean_input))
    saved = decoder.last_position()
    decoder.rewind(before)
    with model.hooks(fwd_hooks=ablate_heads(heads, state=StepState())):
        out.append(decoder.step(clean_input))  # the same input again, now ablated
    decoder.replace_last_position(saved, rows=torch.tensor([True, False, True, True, False, False]))
    with model.hooks(fwd_hooks=restrict_attention(allowed, n_layers=model.cfg.n_layers)):
        out += _decode(decoder, out[-1], 2, pick)  # a hook replacing the scores
    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_hidden_states", lambda t, hook: None)]):
        out += _decode(decoder, out[-1], 1, pick)  # a hook the grouped step does not fire: this step runs eagerly
        assert decoder.last_path == "eager"
    target = decoder.cache.capacity + 2
    while decoder.n_cached < target:  # past the capacity: the buffers grow
        out += _decode(decoder, out[-1], 1, pick)
    decoder.rewind(width - 1)  # back to the prompt's end (a retraction), then on
    out += _decode(decoder, out[-1], 2, pick)
    return decoder, out, pick


# Two paths' logits differ by float rounding (about 1e-6 here); a greedy choice may differ only where the top two
# logits are closer than a few times that.
TIE = 1e-4


def assert_choices_agree_but_at_ties(session: _Tokens, reference: _Tokens) -> None:
    """Where ``session``'s own greedy choice differs from the tokens it was fed (``reference``'s), the reference's
    top two logits were within :data:`TIE`: a tie within float precision, not a different computation."""
    for own, fed, logits in zip(session.own, reference.chosen, reference.logits):
        differ = own != fed
        if bool(differ.any()):
            top = logits[differ].float().topk(2, dim=-1).values
            gap = (top[..., 0] - top[..., 1]).abs()
            assert bool((gap < TIE).all()), f"greedy choices differ where the top-2 gap is {gap.tolist()}"


def test_rows_of_one_prompt_share_one_copy_and_decode_as_if_each_held_its_own(tiny, order):
    prompts, owners, per_owner = order
    eager, reference, tokens = _session(tiny, prompts, True, "eager")  # the reference chooses the tokens
    shared, got, shared_tokens = _session(tiny, prompts, True, fed=tokens.chosen)
    own, want, own_tokens = _session(tiny, prompts, False, fed=tokens.chosen)
    assert shared.cache.shared and not own.cache.shared and not eager.cache.shared
    assert shared.cache.owners == owners and shared.cache.per_owner == per_owner
    assert shared.cache.nbytes < own.cache.nbytes
    assert len(got) == len(want) == len(reference)
    for got_logits, own_logits, eager_logits in zip(got, want, reference):
        torch.testing.assert_close(got_logits, own_logits, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(got_logits, eager_logits, atol=1e-5, rtol=1e-4)
    for index in range(len(shared.cache.keys)):  # every row's keys, the prompt's included
        torch.testing.assert_close(shared.cache.held(index)[0], own.cache.held(index)[0], atol=1e-5, rtol=1e-4)
    assert_choices_agree_but_at_ties(shared_tokens, tokens)
    assert_choices_agree_but_at_ties(own_tokens, tokens)


def test_a_rewind_into_the_prompt_gives_every_row_its_own_copy(tiny, order):
    """Only a decoder that keeps every key can go back into its prompt; the next step then writes prompt positions
    row by row, so the cache stops sharing first, and decodes as a decoder that never shared."""
    def run(share: bool, fed: list[torch.Tensor] | None = None) -> tuple[BatchDecoder, list[torch.Tensor], _Tokens]:
        pick = _Tokens(fed)
        with bounded_windows(False), shared_prompts(share):
            decoder = BatchDecoder(tiny, order[0], max_new_tokens=4)
        out = [decoder.step()]
        out += _decode(decoder, out[-1], 2, pick)
        decoder.rewind(decoder.n_cached - 6)
        out.append(decoder.step(torch.tensor([5, 6, 7, 8, 9, 10])))
        out += _decode(decoder, out[-1], 2, pick)
        return decoder, out, pick

    own, want, tokens = run(False)
    shared, got, shared_tokens = run(True, tokens.chosen)
    assert_choices_agree_but_at_ties(shared_tokens, tokens)
    assert not shared.cache.shared, "the rewind into the prompt unshared the cache"
    for got_logits, own_logits in zip(got, want):
        torch.testing.assert_close(got_logits, own_logits, atol=1e-5, rtol=1e-4)


def test_traces_of_repeated_samples_equal_the_eager_reference(tiny):
    samples = make_niah_samples(tiny.tokenizer, n=2, context_tokens=[60, 75], seed=4, max_new_tokens=6)
    batch = [samples[0], samples[1], samples[0], samples[0], samples[1]]
    config = TraceConfig(max_new_tokens=6, stop_at_eos=False, local_window=8, evidence_attention=True, signals=True)
    with attention_path("grouped"):
        grouped = trace_batch(tiny, batch, config)
    with attention_path("eager"):
        eager = trace_batch(tiny, batch, config)
    assert_same_traces(grouped, eager)
    for first, again in ((0, 2), (0, 3), (1, 4)):  # the rows of one prompt trace alike
        assert torch.equal(grouped[first].tokens, grouped[again].tokens)
        assert torch.equal(grouped[first].argmax_pos, grouped[again].argmax_pos)
