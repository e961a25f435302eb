"""The per-step two-pass protocol (claim 2) on the embedded model."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

import dynheads_tl
from dynheads_tl import TraceConfig, trace_generation
from dynheads_tl.protocols.ablation import (
    AblationSetup, compensation, compensation_table, random_heads, run_condition, select_top_ranked,
    two_pass_generation, StepView,
)
from dynheads_tl.tasks import make_niah_samples
from dynheads_tl.engine.tracing import Decoder


@pytest.fixture(scope="module")
def sample(embedded_model):
    return make_niah_samples(embedded_model.tokenizer, n=1, context_tokens=300, seed=21, max_new_tokens=30)[0]


@pytest.fixture(scope="module")
def setup(embedded_model):
    static = torch.zeros(30, 9, dtype=torch.bool)
    static[[15, 18, 20, 20], [1, 6, 5, 7]] = True
    return AblationSetup(static_mask=static, static_top20=static, k=4)


CONFIG = TraceConfig(max_new_tokens=30)


def test_rewind_then_step_reproduces_logits(embedded_model, sample):
    decoder = Decoder(embedded_model, sample.prompt_ids)
    first = decoder.step()
    n = decoder.n_cached
    decoder.rewind(n - 1)
    again = decoder.step()
    assert torch.equal(first, again) and decoder.n_cached == n
    with pytest.raises(ValueError, match="rewind forward"):
        decoder.rewind(n + 5)


def test_k0_equals_unmasked_generation_exactly(embedded_model, sample, setup):
    plain = trace_generation(embedded_model, sample, CONFIG)
    k0 = run_condition(embedded_model, sample, "progressive", setup, CONFIG, k=0)
    none = run_condition(embedded_model, sample, "none", setup, CONFIG)
    for result in (k0, none):
        assert torch.equal(result.masked.tokens, plain.tokens)
        assert torch.equal(result.clean.argmax_pos, plain.argmax_pos)
        assert not result.masked_heads.any()


def test_conditions_mask_different_heads(embedded_model, sample, setup):
    masks = {c: run_condition(embedded_model, sample, c, setup, CONFIG).masked_heads
             for c in ("dynamic", "static", "random")}
    assert masks["dynamic"].any(), "the model retrieves the needle, so D_t is non-empty somewhere"
    # static and random mask exactly k heads at every step; dynamic masks D_t.
    assert (masks["static"].flatten(1).sum(1) == setup.k).all()
    assert (masks["random"].flatten(1).sum(1) == setup.k).all()
    assert not torch.equal(masks["static"][0], masks["random"][0])
    assert not torch.equal(masks["dynamic"].any(0), masks["static"][0])


def test_dynamic_mask_is_the_clean_pass_retrieval_set(embedded_model, sample, setup):
    result = run_condition(embedded_model, sample, "dynamic", setup, CONFIG)
    assert torch.equal(result.masked_heads, result.clean.retrieval_mask)


def test_clean_cache_policy_keeps_an_unmasked_history(embedded_model, sample, setup):
    """With keep_cache='clean', every clean pass equals one eager forward over prompt + kept tokens."""
    result = run_condition(embedded_model, sample, "dynamic", setup, CONFIG)
    reference = AutoModelForCausalLM.from_pretrained(str(dynheads_tl.embedded_model_dir()),
                                                     attn_implementation="eager").eval()
    ids = torch.cat([result.masked.prompt_ids, result.masked.tokens[:-1]])[None]
    out = reference(ids, output_attentions=True)
    start = len(sample.prompt_ids) - 1
    rows = torch.stack([a[0, :, start:, :] for a in out.attentions]).permute(2, 0, 1, 3)
    assert torch.equal(result.clean.argmax_pos, rows.argmax(-1))
    clean_tokens = out.logits[0, start:].argmax(-1)
    assert torch.equal(result.clean.tokens, clean_tokens)


def test_masked_cache_policy_differs_when_masking_bites(embedded_model, sample, setup):
    everything = lambda view: torch.ones(30, 9, dtype=torch.bool) if view.step == 2 else None
    clean = two_pass_generation(embedded_model, sample, everything, TraceConfig(max_new_tokens=5, stop_at_eos=False))
    leaky = two_pass_generation(embedded_model, sample, everything, TraceConfig(max_new_tokens=5, stop_at_eos=False),
                                keep_cache="masked")
    assert torch.equal(clean.masked.tokens[:3], leaky.masked.tokens[:3])
    # Step 3's clean pass reads step 2's keys/values: clean vs masked history.
    assert not torch.equal(clean.clean.hidden[3], leaky.clean.hidden[3])
    with pytest.raises(ValueError, match="keep_cache"):
        two_pass_generation(embedded_model, sample, everything, CONFIG, keep_cache="both")


def test_progressive_ranking_puts_retrieval_heads_first():
    retrieval = torch.zeros(2, 3, dtype=torch.bool)
    retrieval[1, 2] = True
    support = torch.tensor([[0.9, 0.1, 0.0], [0.2, 0.3, 0.05]])
    view = StepView(0, 5, torch.zeros(2, 3, dtype=torch.long), support, retrieval)
    assert select_top_ranked(0)(view) is None
    assert select_top_ranked(1)(view).nonzero().tolist() == [[1, 2]]
    assert select_top_ranked(3)(view).nonzero().tolist() == [[0, 0], [1, 1], [1, 2]]


def test_random_heads_are_seeded():
    assert torch.equal(random_heads(30, 9, 6, seed=3), random_heads(30, 9, 6, seed=3))
    assert not torch.equal(random_heads(30, 9, 6, seed=3), random_heads(30, 9, 6, seed=4))
    assert int(random_heads(30, 9, 6, seed=3).sum()) == 6


def test_compensation_counts_new_static_heads(embedded_model, sample, setup):
    result = run_condition(embedded_model, sample, "dynamic", setup, CONFIG)
    comp = compensation(result, setup.static_top20)
    newly = result.masked.retrieval_mask & ~result.clean.retrieval_mask & result.masked_heads.flatten(1).any(1)[:, None, None]
    assert torch.equal(comp["new_heads"], newly.sum(0))
    assert comp["m_s"] == int((newly & setup.static_top20).flatten(1).sum(1).max())
    table = compensation_table(comp["new_heads"], setup.static_top20)
    assert list(table.columns) == ["head", "times_newly_active", "in_static_top20"]
    assert table["times_newly_active"].is_monotonic_decreasing


def test_static_matched_masks_as_many_top_static_heads_as_d_t():
    from dynheads_tl.protocols.ablation import select_static_matched

    order = torch.tensor([5, 0, 3, 1, 2, 4])  # flat indices of a [2, 3] grid, best first
    retrieval = torch.zeros(2, 3, dtype=torch.bool)
    view = lambda r: StepView(0, 1, torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3), r)
    assert select_static_matched(order)(view(retrieval)) is None
    retrieval[0, 1] = retrieval[1, 1] = True
    assert select_static_matched(order)(view(retrieval)).flatten().nonzero().flatten().tolist() == [0, 5]


def test_static_matched_condition_follows_the_clean_pass_sizes(embedded_model, sample, setup):
    from dataclasses import replace

    with pytest.raises(ValueError, match="static_order"):
        run_condition(embedded_model, sample, "static_matched", setup, CONFIG)
    ranked = replace(setup, static_order=torch.randperm(270, generator=torch.Generator().manual_seed(1)))
    result = run_condition(embedded_model, sample, "static_matched", ranked, CONFIG)
    sizes = result.masked_heads.flatten(1).sum(1)
    assert torch.equal(sizes, result.clean.retrieval_mask.flatten(1).sum(1))
    assert sizes.any()
    top = torch.zeros(270, dtype=torch.bool)
    top[ranked.static_order[: int(sizes.max())]] = True
    assert not (result.masked_heads.flatten(1) & ~top).any(), "only the top static heads are masked"


# --- mean ablation against a hand-written patch (tiny random Llama) -------------------------------
@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from conftest import build_tiny_model

    folder = build_tiny_model("llama", tmp_path_factory.mktemp("tiny_ablation") / "llama")
    return folder, dynheads_tl.load_model(str(folder), device="cpu")


def test_mean_ablation_writes_a_random_mean_into_the_chosen_heads(tiny_llama):
    """``ablate_heads(mode="mean")`` equals replacing, in a plain transformers forward, the chosen heads'
    slice of the o_proj input (the concatenated per-head z) at the last position by a random mean."""
    from dynheads_tl.engine.hooks import ablate_heads

    folder, model = tiny_llama
    n_layers, n_heads, d_head = model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head
    ids = torch.randint(10, 1000, (1, 12), generator=torch.Generator().manual_seed(3))
    mask = torch.zeros(n_layers, n_heads, dtype=torch.bool)
    mask[0, 1] = mask[1, 0] = mask[1, 3] = True
    # Same scale as a real z (unit-ish); nonzero, so mean and zero ablation must part ways.
    mean_z = torch.randn(n_layers, n_heads, d_head, generator=torch.Generator().manual_seed(4))

    with torch.no_grad():
        clean = model(ids)[0, -1]
        with model.hooks(fwd_hooks=ablate_heads(mask, mode="mean", mean_z=mean_z)):
            mean_ablated = model(ids)[0, -1]
        with model.hooks(fwd_hooks=ablate_heads(mask, mode="zero")):
            zero_ablated = model(ids)[0, -1]

    reference = AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager",
                                                     dtype=torch.float32).eval()

    def patch(layer):
        def pre_hook(module, args):
            (z,) = args  # [batch, pos, head * d_head]
            z = z.clone()
            for head in mask[layer].nonzero().flatten().tolist():
                z[:, -1, head * d_head:(head + 1) * d_head] = mean_z[layer, head]
            return (z,)
        return pre_hook

    handles = [reference.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(patch(layer))
               for layer in range(n_layers)]
    try:
        with torch.no_grad():
            expected = reference(ids).logits[0, -1]
    finally:
        for handle in handles:
            handle.remove()

    # Bridge and plain transformers run the same float32 eager kernels in a different op order;
    # 1e-4 absorbs that reordering (logits are O(1) on this random model) but not a wrong head.
    torch.testing.assert_close(mean_ablated, expected, atol=1e-4, rtol=1e-4)
    assert (mean_ablated - clean).abs().max() > 1e-2, "the patch must bite on this model"
    assert (mean_ablated - zero_ablated).abs().max() > 1e-2, "a nonzero mean is not zero ablation"
