"""The per-step two-pass protocol (claim 2) on the embedded model."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM

import dynheads_tl
from dynheads_tl import TraceConfig, trace_generation
from dynheads_tl.protocols import ablation_experiments as experiments
from dynheads_tl.protocols.ablation_experiments import Job, run_condition, run_jobs
from dynheads_tl.protocols.ablation_metrics import compensation, compensation_table
from dynheads_tl.protocols.ablation_metrics import teacher_forced_scores
from dynheads_tl.protocols.conditions import CONDITIONS, AblationSetup, ConditionSpec, make_selector, register_condition
from dynheads_tl.protocols.selectors import (random_heads, select_dynamic, select_dynamic_nonstatic, select_fixed,
                                             select_random_k, select_random_matched, select_random_nondynamic, select_random_nonstatic,
                                             select_predicted, select_previous_step, select_static_matched,
                                             select_static_nondynamic, select_top_ranked, previous_size)
from dynheads_tl.protocols.stepwise import StepView, gold_token_ids
from dynheads_tl.protocols.two_pass import AblationTrace, two_pass_batch, two_pass_generation
from dynheads_tl.engine.trace_data import Trace
from dynheads_tl.tasks import make_niah_samples
from dynheads_tl.tasks.common import Sample
from dynheads_tl.engine.decoder import Decoder
from factories import make_trace


@pytest.fixture(scope="module")
def sample(embedded_model):
    return make_niah_samples(embedded_model.tokenizer, n=1, context_tokens=300, seed=21, max_new_tokens=30)[0]


@pytest.fixture(scope="module")
def setup(embedded_model):
    static = torch.zeros(30, 9, dtype=torch.bool)
    static[[15, 18, 20, 20], [1, 6, 5, 7]] = True
    return AblationSetup(static_mask=static, static_top20=static, k=4)


CONFIG = TraceConfig(max_new_tokens=30)


@pytest.fixture(scope="module")
def condition_run(embedded_model, sample, setup):
    """``condition_run(c)`` is ``run_condition(embedded_model, sample, c, setup, CONFIG)``, computed once per condition
    for the module: greedy decoding gives the same run every time, several tests read the same one (the dynamic run:
    four tests), and none changes it."""
    runs = {}

    def run(condition):
        if condition not in runs:
            runs[condition] = run_condition(embedded_model, sample, condition, setup, CONFIG)
        return runs[condition]

    return run


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


def test_conditions_mask_different_heads(condition_run, setup):
    masks = {c: condition_run(c).masked_heads for c in ("dynamic", "static", "random")}
    assert masks["dynamic"].any(), "the model retrieves the needle, so D_t is non-empty somewhere"
    # static and random mask exactly k heads at every step; dynamic masks D_t.
    assert (masks["static"].flatten(1).sum(1) == setup.k).all()
    assert (masks["random"].flatten(1).sum(1) == setup.k).all()
    assert not torch.equal(masks["static"][0], masks["random"][0])
    assert not torch.equal(masks["dynamic"].any(0), masks["static"][0])


def test_dynamic_mask_is_the_clean_pass_retrieval_set(condition_run):
    result = condition_run("dynamic")
    assert torch.equal(result.masked_heads, result.clean.retrieval_mask)


def test_clean_cache_policy_keeps_an_unmasked_history(condition_run, sample, embedded_reference):
    """With keep_cache='clean', every clean pass equals one eager forward over prompt + kept tokens."""
    result = condition_run("dynamic")
    ids = torch.cat([result.masked.prompt_ids, result.masked.tokens[:-1]])[None]
    with torch.no_grad():
        out = embedded_reference(ids, output_attentions=True)
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


def test_compensation_counts_new_static_heads(condition_run, setup):
    result = condition_run("dynamic")
    comp = compensation(result, setup.static_top20)
    newly = (result.masked.retrieval_mask & ~result.clean.retrieval_mask & ~result.masked_heads
             & result.masked_heads.flatten(1).any(1)[:, None, None])
    assert torch.equal(comp["new_heads"], newly.sum(0))
    assert comp["m_s"] == int((newly & setup.static_top20).flatten(1).sum(1).max())
    table = compensation_table(comp["new_heads"], setup.static_top20)
    assert list(table.columns) == ["head", "times_newly_active", "in_static_top20"]
    assert table["times_newly_active"].is_monotonic_decreasing


def test_static_matched_masks_as_many_top_static_heads_as_d_t():
    order = torch.tensor([5, 0, 3, 1, 2, 4])  # flat indices of a [2, 3] grid, best first
    retrieval = torch.zeros(2, 3, dtype=torch.bool)
    view = lambda r: StepView(0, 1, torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3), r)
    assert select_static_matched(order)(view(retrieval)) is None
    retrieval[0, 1] = retrieval[1, 1] = True
    assert select_static_matched(order)(view(retrieval)).flatten().nonzero().flatten().tolist() == [0, 5]


def test_static_matched_condition_follows_the_clean_pass_sizes(embedded_model, sample, setup):
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


# --- the size-matched controls on hand-built steps (known answers) ----------------------------------
def _view(retrieval: torch.Tensor, step: int = 0) -> StepView:
    return StepView(step, 1, torch.zeros_like(retrieval, dtype=torch.long), torch.zeros(retrieval.shape), retrieval)


def _mask(shape, *heads) -> torch.Tensor:
    mask = torch.zeros(shape, dtype=torch.bool)
    for layer, head in heads:
        mask[layer, head] = True
    return mask


def test_random_matched_draws_as_many_heads_as_d_t_seeded_by_sample_and_step():
    retrieval = _mask((6, 5), (0, 1), (2, 3), (5, 4))
    select = select_random_matched(seed=11)
    assert select(_view(torch.zeros(6, 5, dtype=torch.bool))) is None, "nothing to match: nothing masked"
    first = select(_view(retrieval, step=4))
    assert int(first.sum()) == 3 and first.shape == (6, 5)
    assert torch.equal(first, select_random_matched(seed=11)(_view(retrieval, step=4))), "same sample and step"
    draws = [select(_view(retrieval, step=t)) for t in range(8)]
    assert len({tuple(d.flatten().tolist()) for d in draws}) > 1, "a fresh draw at each step"
    other = [select_random_matched(seed=12)(_view(retrieval, step=t)) for t in range(8)]
    assert any(not torch.equal(a, b) for a, b in zip(draws, other)), "another sample draws other heads"
    bigger = _mask((6, 5), *[(layer, 0) for layer in range(6)], (1, 1), (1, 2))
    assert int(select(_view(bigger, step=4)).sum()) == 8


def test_progressive_random_masks_k_fresh_heads_at_each_step_whatever_d_t():
    retrieval = _mask((6, 5), (0, 1), (2, 3))
    select = select_random_k(4, seed=3)
    assert select_random_k(0, seed=3)(_view(retrieval)) is None, "k = 0 masks nothing"
    draws = [select(_view(retrieval if t % 2 else torch.zeros(6, 5, dtype=torch.bool), step=t)) for t in range(8)]
    assert all(int(d.sum()) == 4 for d in draws), "k heads, even where D_t is empty"
    assert len({tuple(d.flatten().tolist()) for d in draws}) > 1, "a fresh draw at each step"
    assert torch.equal(draws[5], select_random_k(4, seed=3)(_view(retrieval, step=5))), "seeded by sample and step"
    from types import SimpleNamespace

    model = SimpleNamespace(cfg=SimpleNamespace(n_layers=6, n_heads=5))
    setup = AblationSetup(static_mask=retrieval, static_top20=retrieval, k=2, seed=2)
    chosen, k = make_selector(model, "progressive_random", setup, sample_seed=5, k=4)
    assert k == 4 and torch.equal(chosen(_view(retrieval, 3)), select_random_k(4, 2 * 1_000_003 + 5)(_view(retrieval, 3)))
    with pytest.raises(ValueError, match="k >= 0"):
        make_selector(model, "progressive_random", setup)


def test_dynamic_nonstatic_and_static_nondynamic_are_the_set_differences():
    static = _mask((3, 4), (0, 0), (1, 1), (2, 2))
    retrieval = _mask((3, 4), (0, 0), (0, 3), (2, 2), (2, 3))
    assert select_dynamic_nonstatic(static)(_view(retrieval)).nonzero().tolist() == [[0, 3], [2, 3]]
    assert select_static_nondynamic(static)(_view(retrieval)).nonzero().tolist() == [[1, 1]]
    inside = _mask((3, 4), (0, 0), (1, 1))  # D_t inside S: no non-static part
    assert select_dynamic_nonstatic(static)(_view(inside)) is None
    assert select_static_nondynamic(static)(_view(inside)).nonzero().tolist() == [[2, 2]]
    covering = static | _mask((3, 4), (0, 1))  # D_t covers S: no static part left
    assert select_static_nondynamic(static)(_view(covering)) is None
    empty = torch.zeros(3, 4, dtype=torch.bool)
    assert select_dynamic_nonstatic(static)(_view(empty)) is None
    assert torch.equal(select_static_nondynamic(static)(_view(empty)), static), "empty D_t: all of S_20"


def test_random_nonstatic_and_random_nondynamic_match_the_sizes_and_avoid_their_sets():
    static = _mask((3, 4), (0, 0), (1, 1), (2, 2))
    retrieval = _mask((3, 4), (0, 0), (0, 3), (2, 3))  # D_t minus S: 2 heads; S minus D_t: 2 heads
    for step in range(6):
        outside_static = select_random_nonstatic(static, seed=7)(_view(retrieval, step))
        assert int(outside_static.sum()) == 2 and not (outside_static & static).any()
        outside_dynamic = select_random_nondynamic(static, seed=7)(_view(retrieval, step))
        assert int(outside_dynamic.sum()) == 2 and not (outside_dynamic & retrieval).any()
    draws = {tuple(select_random_nonstatic(static, seed=7)(_view(retrieval, t)).flatten().tolist()) for t in range(6)}
    assert len(draws) > 1, "a fresh draw at each step"
    assert torch.equal(select_random_nonstatic(static, seed=7)(_view(retrieval, 2)),
                       select_random_nonstatic(static, seed=7)(_view(retrieval, 2))), "seeded"
    inside = _mask((3, 4), (0, 0), (1, 1))  # D_t inside S: nothing outside to match
    assert select_random_nonstatic(static, seed=7)(_view(inside)) is None
    assert int(select_random_nondynamic(static, seed=7)(_view(inside)).sum()) == 1


def test_make_selector_builds_the_new_conditions():
    from types import SimpleNamespace

    model = SimpleNamespace(cfg=SimpleNamespace(n_layers=3, n_heads=4))
    static = _mask((3, 4), (0, 0), (1, 1), (2, 2))
    setup = AblationSetup(static_mask=static, static_top20=static, k=3, seed=2)
    retrieval = _mask((3, 4), (0, 0), (0, 3))
    for condition, expected in (("dynamic_nonstatic", [[0, 3]]), ("static_nondynamic", [[1, 1], [2, 2]])):
        select, k = make_selector(model, condition, setup)
        assert k is None and select(_view(retrieval)).nonzero().tolist() == expected
    select, k = make_selector(model, "random_matched", setup, sample_seed=5)
    assert k is None and int(select(_view(retrieval, 3)).sum()) == 2
    assert torch.equal(select(_view(retrieval, 3)), select_random_matched(2 * 1_000_003 + 5)(_view(retrieval, 3)))
    # make_selector is the registry's lookup: every entry builds, an unknown name is answered with the keys.
    ordered = replace(setup, static_order=torch.arange(12), query_order=torch.arange(12).flip(0),
                      probe=lambda hidden: torch.arange(12.0))
    for condition in CONDITIONS:
        chosen = make_selector(model, condition, ordered, k=2)[0](_view(retrieval))
        assert chosen is None or chosen.shape == (3, 4), condition
    with pytest.raises(ValueError, match=", ".join(CONDITIONS)):  # random_matched among them
        make_selector(model, "random_unmatched", setup)



# --- m_s leaves out the heads masked at the step ----------------------------------------------------
def _trace(argmax_pos: torch.Tensor, support: torch.Tensor, tokens: list[int]) -> Trace:
    return make_trace(tokens, argmax_pos, support, prompt_ids=[5, 6, 7, 8], evidence_spans=[(1, 3)], response="")


def test_m_s_never_counts_a_head_masked_at_that_step():
    """Prompt [5, 6, 7, 8] with evidence at positions 1-2; the step generates token 6 (position 1). In the
    masked pass heads (0, 0) and (0, 1) newly point at position 1 (an Eq. 1 hit), but (0, 0) was masked:
    only (0, 1) compensates. Both are static heads, so m_s = 1 (it was 2 before the fix)."""
    clean_pos = torch.zeros(1, 2, 2, dtype=torch.long)  # every head on position 0: no Eq. 1 hit
    masked_pos = clean_pos.clone()
    masked_pos[0, 0, 0] = masked_pos[0, 0, 1] = 1
    masked_heads = _mask((2, 2), (0, 0))[None]  # step 0 masks head (0, 0)
    static = torch.ones(2, 2, dtype=torch.bool)
    result = AblationTrace(_trace(clean_pos, torch.zeros(1, 2, 2), [6]), _trace(masked_pos, torch.zeros(1, 2, 2), [6]),
                           masked_heads, "dynamic")
    assert result.masked.retrieval_mask[0, 0].tolist() == [True, True]
    comp = compensation(result, static)
    assert comp["m_s"] == 1
    assert comp["new_heads"].tolist() == [[0, 1], [0, 0]]
    # Eq. 2 (HotpotQA): the same with scores above the threshold.
    support = torch.zeros(1, 2, 2)
    support[0, 0, 0] = support[0, 0, 1] = support[0, 1, 1] = 0.5
    result = AblationTrace(_trace(clean_pos, torch.zeros(1, 2, 2), [6]), _trace(clean_pos, support, [6]),
                           masked_heads, "dynamic")
    comp = compensation(result, _mask((2, 2), (0, 0), (0, 1)), kind="eq2", threshold=0.1)
    assert comp["m_s"] == 1 and comp["new_heads"].tolist() == [[0, 1], [0, 1]]
    # A step where nothing was masked never counts.
    result.masked_heads[:] = False
    assert compensation(result, static, kind="eq2", threshold=0.1)["m_s"] == 0


# --- the new conditions on the embedded model ------------------------------------------------------
def test_new_conditions_mask_what_they_say(embedded_model, sample, setup):
    jobs = [Job(sample, condition, 3) for condition in ("random_matched", "dynamic_nonstatic", "static_nondynamic")]
    random_matched, nonstatic, nondynamic = run_jobs(embedded_model, jobs, setup, CONFIG)
    for result in (random_matched, nonstatic, nondynamic):
        assert result.clean.retrieval_mask.any(), "the model retrieves the needle: D_t is non-empty somewhere"
    sizes = random_matched.clean.retrieval_mask.flatten(1).sum(1)
    assert torch.equal(random_matched.masked_heads.flatten(1).sum(1), sizes)
    assert not torch.equal(random_matched.masked_heads, random_matched.clean.retrieval_mask)
    assert torch.equal(nonstatic.masked_heads, nonstatic.clean.retrieval_mask & ~setup.static_top20)
    assert nondynamic.masked_heads.any(), "S_20 minus D_t is never empty on this model (|D_t| is about 5)"
    assert torch.equal(nondynamic.masked_heads, setup.static_top20 & ~nondynamic.clean.retrieval_mask)


def test_teacher_forcing_on_the_embedded_model_feeds_the_needle_and_eq1_fires(embedded_model, sample, setup):
    """The gold continuation is the needle sentence; Eq. 1 reads the forced token, so the dynamic mask is the
    clean pass's Eq. 1 set on the gold tokens, and it is non-empty (the UUID is copied from the needle)."""
    gold = gold_token_ids(embedded_model.tokenizer, sample)
    assert embedded_model.tokenizer.decode(gold) == sample.meta["needle_text"]
    result = run_jobs(embedded_model, [Job(sample, "dynamic", 0, teacher_forced=True)], setup, CONFIG)[0]
    assert result.masked.tokens.tolist() == gold
    assert torch.equal(result.masked_heads, result.clean.retrieval_mask) and result.masked_heads.any()
    masked_steps = result.masked_heads.flatten(1).any(1)
    assert (result.logprob_drop[~masked_steps] == 0).all()
    assert result.logprob_drop[masked_steps].mean() > 0, "masking D_t lowers the gold token's probability"


# --- teacher forcing against a plain forward (tiny random Llama) ----------------------------------
@pytest.fixture(scope="module")
def tiny_sample(tiny_llama):
    _, model = tiny_llama
    return make_niah_samples(model.tokenizer, n=1, context_tokens=120, seed=4, max_new_tokens=48, max_tokens=512)[0]


def _reference_logprobs(folder, prompt: list[int], gold: list[int], mask: torch.Tensor | None = None,
                        step: int | None = None) -> torch.Tensor:
    """log p(gold[t] | prompt + gold[:t]) from one plain transformers forward over prompt + gold (all t); or,
    with ``mask`` and ``step``, only step ``step``'s value with the masked heads' outputs zeroed at the last
    position (what the masked pass computes when the cache keeps the clean history)."""
    reference = AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager",
                                                     dtype=torch.float32).eval()
    d_head = reference.config.hidden_size // reference.config.num_attention_heads
    end = len(prompt) + (len(gold) - 1 if step is None else step)
    ids = torch.tensor(prompt + gold)[None, :end]
    handles = []
    if mask is not None:
        def patch(layer):
            def pre_hook(module, args):
                (z,) = args
                z = z.clone()
                for head in mask[layer].nonzero().flatten().tolist():
                    z[:, -1, head * d_head:(head + 1) * d_head] = 0.0
                return (z,)
            return pre_hook
        handles = [reference.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(patch(layer))
                   for layer in range(mask.shape[0])]
    try:
        with torch.no_grad():
            logits = reference(ids).logits[0, len(prompt) - 1:].log_softmax(-1)
    finally:
        for handle in handles:
            handle.remove()
    targets = torch.tensor(gold[: logits.shape[0]])
    return logits.gather(-1, targets[:, None])[:, 0]


def test_teacher_forcing_matches_a_plain_forward_and_rows_stop_with_their_gold(tiny_llama, tiny_sample):
    folder, model = tiny_llama
    gold = gold_token_ids(model.tokenizer, tiny_sample)
    mask = _mask((model.cfg.n_layers, model.cfg.n_heads), (0, 1), (1, 0), (1, 3))
    none, masked, short = two_pass_batch(
        model, [(tiny_sample, lambda view: None), (tiny_sample, select_fixed(mask)), (tiny_sample, select_fixed(mask))],
        TraceConfig(max_new_tokens=4), gold=[gold, gold, gold[:5]], labels=[("none", None), ("static", 3), ("static", 3)])
    # The forced tokens are the gold tokens, in both passes' records; each row stops when its gold runs out
    # (max_new_tokens=4 does not cut teacher forcing short).
    for result, expected in ((none, gold), (masked, gold), (short, gold[:5])):
        assert result.masked.tokens.tolist() == expected and result.clean.tokens.tolist() == expected
        assert result.teacher_forced and len(result.clean_logprob) == len(expected)
    # Nothing masked: the masked pass is the clean pass, and the drop is exactly 0.
    assert not none.masked_heads.any() and torch.equal(none.logprob_drop, torch.zeros(len(gold)))
    assert masked.masked_heads.all(0).equal(mask) and masked.masked_heads.flatten(1).any(1).all()
    # The clean log-probabilities equal one plain forward of prompt + gold, also when every step masks
    # (keep_cache="clean": the masked passes leave no trace in the history). The batch runs the bridge in
    # float32 with a SDPA prefill, the reference eager attention: 1e-4 absorbs the op order, not a wrong token.
    expected = _reference_logprobs(folder, list(tiny_sample.prompt_ids), gold)
    torch.testing.assert_close(none.clean_logprob, expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(masked.clean_logprob, expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(short.clean_logprob, expected[:5], atol=1e-4, rtol=1e-4)
    # The masked log-probability of a step: the same forward with the heads zeroed at the last position.
    for step in (0, 3):
        at_step = _reference_logprobs(folder, list(tiny_sample.prompt_ids), gold, mask=mask, step=step)[-1]
        torch.testing.assert_close(masked.masked_logprob[step], at_step, atol=1e-4, rtol=1e-4)
    assert (masked.logprob_drop.abs() > 1e-3).any(), "the mask bites on this model"


def test_teacher_forcing_validates_its_input(tiny_llama, tiny_sample):
    _, model = tiny_llama
    with pytest.raises(ValueError, match="empty"):
        two_pass_batch(model, [(tiny_sample, lambda view: None)], gold=[[]])
    with pytest.raises(ValueError, match="gold continuations"):
        two_pass_batch(model, [(tiny_sample, lambda view: None)], gold=[[1], [2]])
    static = torch.zeros(model.cfg.n_layers, model.cfg.n_heads, dtype=torch.bool)
    setup = AblationSetup(static_mask=static, static_top20=static, k=1)
    with pytest.raises(ValueError, match="mix"):
        run_jobs(model, [Job(tiny_sample, "none"), Job(tiny_sample, "none", teacher_forced=True)], setup, CONFIG)
    with pytest.raises(ValueError, match="teacher-forced"):
        _ = run_condition(model, tiny_sample, "none", setup, TraceConfig(max_new_tokens=2)).logprob_drop


def test_cached_grid_runs_teacher_forced_jobs_apart_and_joins_their_scores(monkeypatch, tmp_path, tiny_llama,
                                                                           tiny_sample):
    import pandas as pd

    monkeypatch.setenv("DYNHEADS_CACHE", str(tmp_path))
    _, model = tiny_llama
    static = _mask((model.cfg.n_layers, model.cfg.n_heads), (0, 1), (1, 2))
    setup = AblationSetup(static_mask=static, static_top20=static, k=2)
    batches = []
    original = experiments.run_jobs

    def recording(model, jobs, *args, **kwargs):
        batches.append([(job.condition, job.teacher_forced) for job in jobs])
        return original(model, jobs, *args, **kwargs)

    monkeypatch.setattr(experiments, "run_jobs", recording)
    cells = [({"context": 120, "depth": 0.5, "run": 0}, tiny_sample)]
    config = TraceConfig(max_new_tokens=3)
    grid = experiments.grid_experiment(model, cells, setup, config, conditions=["none", "static"], cache_key={"t": 1})
    assert batches == [[("none", False), ("static", False)], [("none", True), ("static", True)]]
    gold = gold_token_ids(model.tokenizer, tiny_sample)
    none, masked = grid.set_index("condition").loc["none"], grid.set_index("condition").loc["static"]
    assert none["tf_drop"] == 0 and none["tf_masked_steps"] == 0 and pd.isna(none["tf_drop_masked"])
    assert masked["tf_steps"] == masked["tf_masked_steps"] == len(gold) and masked["tf_heads_masked_per_step"] == 2
    assert none["heads_masked_per_step"] == 0 and masked["heads_masked_per_step"] == 2  # the free runs' own
    again = experiments.grid_experiment(model, cells, setup, config, conditions=["none", "static"], cache_key={"t": 1})
    assert len(batches) == 2, "everything read back from the cache"
    pd.testing.assert_frame_equal(again, grid)


def test_progressive_batches_several_samples_and_k0_is_the_unmasked_run(monkeypatch, tiny_llama):
    _, model = tiny_llama
    samples = make_niah_samples(model.tokenizer, n=3, context_tokens=100, seed=6, max_new_tokens=4, max_tokens=512)
    static = _mask((model.cfg.n_layers, model.cfg.n_heads), (0, 1), (1, 2))
    setup = AblationSetup(static_mask=static, static_top20=static, k=2)
    batches = []
    original = experiments.run_jobs
    monkeypatch.setattr(experiments, "run_jobs", lambda model, jobs, *a, **kw: batches.append(len(jobs)) or original(model, jobs, *a, **kw))
    rows, new_heads = experiments.progressive_experiment(model, samples, setup, TraceConfig(max_new_tokens=4), [0, 3],
                                                      batch_size=6, random_control=False)
    assert batches == [6, 3], "two samples' three runs share a batch, the third sample runs alone"
    assert rows["sample"].tolist() == [0, 0, 1, 1, 2, 2] and rows["k"].tolist() == [0, 3] * 3
    k0 = rows[rows["k"] == 0]
    assert (k0["response"] == k0["unmasked_response"]).all() and (k0["heads_masked_per_step"] == 0).all()
    assert (rows[rows["k"] == 3]["heads_masked_per_step"] == 3).all()
    assert new_heads.shape == static.shape

    # With the size-matched control (the default): each k > 0 also masks k random heads, drawn afresh per step.
    batches.clear()
    controlled, counted = experiments.progressive_experiment(model, samples, setup, TraceConfig(max_new_tokens=4),
                                                             [0, 3], batch_size=8)
    assert batches == [8, 4], "two samples' four runs share a batch, the third sample runs alone"
    assert controlled["ranking"].tolist() == ["ranked", "ranked", "random"] * 3
    assert controlled["k"].tolist() == [0, 3, 3] * 3
    random = controlled[controlled["ranking"] == "random"]
    assert (random["heads_masked_per_step"] == 3).all()
    ranked = controlled[(controlled["ranking"] == "ranked") & (controlled["k"] == 3)]
    assert (random["heads_ever_masked"].to_numpy() != ranked["heads_ever_masked"].to_numpy()).any()
    assert torch.equal(counted, new_heads), "new-head counts come from the ranked runs alone"


def test_online_chance_rule_marks_what_the_trace_marks_offline(tiny_llama):
    """The two-pass protocol's Eq. 2 set under the chance rule (chance read from the loop's padded masks) equals
    the offline set of the clean trace (chance from the trace alone), in a batch of two prompts of different
    lengths (left padding)."""
    from dynheads_tl.analysis.scoring import dynamic_sets
    from dynheads_tl.engine.equations import Eq2Rule
    from dynheads_tl.tasks import make_hotpot_samples

    _, model = tiny_llama
    samples = make_hotpot_samples(model.tokenizer, n=2, seed=3, max_tokens=2048)
    assert samples[0].prompt_len != samples[1].prompt_len
    rule = Eq2Rule("chance", 1.5)
    config = TraceConfig(max_new_tokens=6, sink_tokens=4, local_window=8, stop_at_eos=False)
    results = two_pass_batch(model, [(s, select_dynamic) for s in samples], config, kind="eq2", threshold=rule)
    for result in results:
        offline = dynamic_sets(result.clean, "eq2", rule)
        assert torch.equal(result.masked_heads[: len(offline)], offline)
        assert bool(offline.any())  # the check is not vacuous


def test_an_ablation_job_s_trace_key_keeps_its_fields_when_later_options_are_off():
    """Claim 2's cached grids are keyed by the trace settings; an option added to TraceConfig later (the newline stop)
    must not change the key of a run that leaves it off."""
    from dynheads_tl.engine.trace_data import TraceConfig
    from dynheads_tl.protocols.ablation_experiments import trace_key

    assert trace_key(TraceConfig(max_new_tokens=40)) == {
        "max_new_tokens": 40, "sink_tokens": 4, "local_window": 32, "prefill": "fast", "stop_at_eos": True,
        "evidence_attention": False, "signals": False}
    assert trace_key(TraceConfig(stop_at_newline=True))["stop_at_newline"] is True


# --- the fair comparison: D_{t-1}, a set known before step t ------------------------------------------
def _repeating_sample(tokens: list[int], copies: int = 30) -> Sample:
    """A prompt that repeats ``tokens`` (all of it evidence), so that on a tiny random model a head's argmax lands on
    a copy of the forced token often enough for Eq. 1 sets of a few heads at most steps."""
    prompt = [1] + tokens * copies
    return Sample("niah", prompt, [(1, len(prompt))], ["x"], "q", (1, len(prompt)))


def test_previous_step_selects_d_t_minus_1_and_nothing_at_step_0():
    previous = _mask((2, 3), (0, 2), (1, 0))
    view = lambda step, before: StepView(step, 1, torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3),
                                         _mask((2, 3), (1, 1)), previous_retrieval=before)
    assert select_previous_step(view(0, None)) is None, "no previous set at step 0"
    assert select_previous_step(view(3, torch.zeros(2, 3, dtype=torch.bool))) is None, "empty D_{t-1}"
    assert torch.equal(select_previous_step(view(3, previous)), previous), "D_{t-1}, not this step's D_t"
    order = torch.tensor([5, 0, 3, 1, 2, 4])
    static = select_static_matched(order, previous_size)
    assert static(view(0, None)) is None
    assert static(view(3, previous)).flatten().nonzero().flatten().tolist() == [0, 5], "top-|D_{t-1}| static heads"
    random = select_random_matched(9, previous_size)
    assert random(view(0, None)) is None and int(random(view(3, previous)).sum()) == 2


def test_previous_step_masks_the_clean_pass_set_of_the_step_before(tiny_llama):
    """Teacher-forced on a tiny random model: at every step t >= 1 ``previous_step`` masks exactly the clean pass's
    Eq. 1 set of step t - 1 (nothing at step 0), its static and random controls mask as many heads, and the masked
    pass ablates exactly those heads: each step's masked log-probability equals a run that masks that set at that
    step alone."""
    _, model = tiny_llama
    tokens = [400, 500, 600]
    sample, gold = _repeating_sample(tokens), tokens * 4
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    static = torch.zeros(n_layers, n_heads, dtype=torch.bool)
    setup = AblationSetup(static_mask=static, static_top20=static, k=1, static_order=torch.arange(n_layers * n_heads))
    names = ("previous_step", "static_previous", "random_previous")
    selectors = [make_selector(model, name, setup, sample_seed=3)[0] for name in names]
    previous, static_run, random_run = two_pass_batch(model, [(sample, s) for s in selectors],
                                                      TraceConfig(max_new_tokens=12), gold=[gold] * 3)
    sets = previous.clean.retrieval_mask
    assert sets.flatten(1).any(1).sum() >= 6, "Eq. 1 fires at most steps of this prompt"
    assert not previous.masked_heads[0].any() and previous.logprob_drop[0] == 0
    assert torch.equal(previous.masked_heads[1:], sets[:-1]), "step t masks the clean pass's set of step t - 1"
    for control in (static_run, random_run):
        assert torch.equal(control.clean.retrieval_mask, sets), "the clean passes are the same"
        assert torch.equal(control.masked_heads.flatten(1).sum(1), previous.masked_heads.flatten(1).sum(1))
    assert not torch.equal(static_run.masked_heads, previous.masked_heads)
    # The masked pass: at step t, the same log-probability as masking D_{t-1} at step t alone.
    step = int(torch.nonzero(previous.masked_heads.flatten(1).any(1)).flatten()[1])
    heads = sets[step - 1]
    alone = two_pass_batch(model, [(sample, lambda view: heads if view.step == step else None)],
                           TraceConfig(max_new_tokens=12), gold=[gold])[0]
    torch.testing.assert_close(previous.masked_logprob[step], alone.masked_logprob[step])
    assert (previous.logprob_drop[1:].abs() > 1e-4).any(), "the mask bites on this model"
    scores = teacher_forced_scores(previous)
    assert scores["tf_drop_t1"] == pytest.approx(float(previous.logprob_drop[1:].mean()))
    assert scores["tf_drop"] == pytest.approx(scores["tf_drop_t1"] * (len(gold) - 1) / len(gold)), "step 0 adds 0"


def test_previous_step_in_free_generation_masks_the_set_of_the_step_before(embedded_model, sample, setup):
    result = run_condition(embedded_model, sample, "previous_step", setup, CONFIG)
    assert result.clean.retrieval_mask.any()
    assert not result.masked_heads[0].any()
    assert torch.equal(result.masked_heads[1:], result.clean.retrieval_mask[:-1])


# --- the probe's predicted set: also known before step t ---------------------------------------------
def test_predicted_masks_the_probes_top_heads_from_the_previous_clean_hidden_state():
    """A known probe (its scores are the hidden state itself, reshaped to [layer, head]) on hand-built views: the
    top-|D_{t-1}| heads of the scores read on the previous step's *clean* hidden state, whatever D_t, D_{t-1}'s own
    heads or the kept pass's hidden state; nothing at step 0, for an empty D_{t-1} or without a clean state."""
    clean = torch.tensor([0.1, 0.9, 0.3, 0.8, 0.0, 0.5])  # heads (0, 1) and (1, 0) score highest, then (1, 2)
    kept = torch.tensor([0.9, 0.0, 0.8, 0.0, 0.7, 0.0])  # the masked pass's state: not what the probe reads
    seen = []

    def probe(hidden):
        seen.append(hidden)
        return hidden

    select = select_predicted(probe)
    view = lambda step, before, hidden=clean: StepView(step, 1, torch.zeros(2, 3, dtype=torch.long),
                                                      torch.zeros(2, 3), _mask((2, 3), (0, 0), (0, 2)), kept,
                                                      previous_retrieval=before, previous_clean_hidden=hidden)
    two, three = _mask((2, 3), (1, 1), (1, 2)), _mask((2, 3), (0, 0), (1, 1), (0, 2))
    assert select(view(0, None, None)) is None, "no previous step at step 0"
    assert select(view(4, torch.zeros(2, 3, dtype=torch.bool))) is None, "|D_{t-1}| = 0: nothing"
    assert select(view(4, two, None)) is None, "no clean hidden state: nothing"
    assert torch.equal(select(view(4, two)), _mask((2, 3), (0, 1), (1, 0))), "top-2 of the clean state's scores"
    assert torch.equal(select(view(4, three)), _mask((2, 3), (0, 1), (1, 0), (1, 2))), "top-3: sized by |D_{t-1}|"
    assert all(torch.equal(hidden, clean) for hidden in seen), "the probe reads only the clean state"
    # Sized like its controls: the static and random top-|D_{t-1}| mask as many heads at the same step.
    for control in (select_static_matched(torch.arange(6), previous_size), select_random_matched(5, previous_size)):
        assert int(control(view(4, three)).sum()) == int(select(view(4, three)).sum()) == 3


def test_predicted_is_declared_once_and_keyed_by_its_probe():
    """The registry: sized by D_{t-1} (a grid panel beside previous_step and its controls, read on the steps
    t >= 1), built only from a setup with a probe (refused with a sentence otherwise, and left out of such a
    setup's grid), and its jobs' cache keys carry the probe's digest while every other job's key is as before."""
    from types import SimpleNamespace

    from dynheads_tl.analysis.head_probe import HeadProbe
    from dynheads_tl.protocols.ablation_experiments import _setup_key
    from dynheads_tl.protocols.conditions import condition_titles, grid_conditions, teacher_forced_measure

    spec = CONDITIONS["predicted"]
    assert spec.sizing == "D_{t-1}" and spec.grid and spec.needs == ("probe",) and spec.overlap
    assert "predicted" in condition_titles() and "before step t" in spec.title
    assert teacher_forced_measure("predicted", "static_previous") == "tf_drop_t1"
    names = list(grid_conditions())
    assert names.index("predicted") == names.index("random_previous") + 1
    model = SimpleNamespace(cfg=SimpleNamespace(n_layers=2, n_heads=3))
    static = _mask((2, 3), (0, 0))
    bare = AblationSetup(static_mask=static, static_top20=static, k=1, static_order=torch.arange(6))
    with pytest.raises(ValueError, match="The predicted condition needs AblationSetup.probe"):
        make_selector(model, "predicted", bare)
    assert "predicted" not in grid_conditions(bare)
    network = torch.nn.Linear(6, 6)
    torch.nn.init.eye_(network.weight)
    torch.nn.init.zeros_(network.bias)
    probed = replace(bare, probe=HeadProbe(network, (2, 3)))
    assert "predicted" in grid_conditions(probed)
    select, k = make_selector(model, "predicted", probed)
    view = StepView(2, 1, torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3), static,
                    previous_retrieval=_mask((2, 3), (0, 0)), previous_clean_hidden=torch.tensor([0, 0, 0, 0, 1.0, 0]))
    assert k is None and torch.equal(select(view), _mask((2, 3), (1, 1))), "the identity probe's top head"
    assert _setup_key(probed, "predicted")["probe"] == probed.probe.digest
    for other in ("previous_step", "static_previous", "random_previous", "dynamic"):
        assert _setup_key(probed, other) == _setup_key(bare, other), "adding the probe leaves other keys as they were"


def test_predicted_masks_at_each_step_what_the_probe_reads_in_the_clean_pass_before_it(tiny_llama):
    """Teacher-forced on a tiny random model with a fixed random linear probe: at every step t >= 1 the masked set
    is the probe's top-|D_{t-1}| heads on the clean pass's hidden state of step t - 1 (the recorded clean trace's
    ``hidden[t - 1]``), as many heads as ``previous_step`` masks, nothing at step 0; and the overlap the run records
    (:func:`overlap_with_dynamic`) counts those sets against the clean pass's D_t."""
    from dynheads_tl.analysis.head_probe import HeadProbe
    from dynheads_tl.protocols.ablation_experiments import _summarise
    from dynheads_tl.protocols.selectors import top_scored

    _, model = tiny_llama
    tokens = [400, 500, 600]
    sample, gold = _repeating_sample(tokens), tokens * 4
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    torch.manual_seed(3)
    probe = HeadProbe(torch.nn.Linear(model.cfg.d_model, n_layers * n_heads), (n_layers, n_heads))
    static = torch.zeros(n_layers, n_heads, dtype=torch.bool)
    setup = AblationSetup(static_mask=static, static_top20=static, k=1,
                          static_order=torch.arange(n_layers * n_heads), probe=probe)
    selectors = [make_selector(model, name, setup, sample_seed=3)[0] for name in ("predicted", "previous_step")]
    predicted, previous = two_pass_batch(model, [(sample, s) for s in selectors], TraceConfig(max_new_tokens=12),
                                         gold=[gold] * 2, labels=[("predicted", None), ("previous_step", None)])
    sets = predicted.clean.retrieval_mask
    assert sets.flatten(1).any(1).sum() >= 6, "Eq. 1 fires at most steps of this prompt"
    assert not predicted.masked_heads[0].any() and predicted.logprob_drop[0] == 0
    for step in range(1, len(gold)):
        expected = top_scored(probe(predicted.clean.hidden[step - 1]), int(sets[step - 1].sum()))
        assert torch.equal(predicted.masked_heads[step], expected), f"step {step}"
    assert torch.equal(predicted.masked_heads.flatten(1).sum(1), previous.masked_heads.flatten(1).sum(1))
    assert not torch.equal(predicted.masked_heads, previous.masked_heads), "the probe's set is not D_{t-1}"
    row = _summarise(predicted, setup)["row"]
    masked, current = predicted.masked_heads[1:], sets[1:]
    assert row["tf_masked_in_dt_t1"] == float((masked & current).sum())
    assert row["tf_previous_in_dt_t1"] == float((sets[:-1] & current).sum())
    assert row["tf_dt_heads_t1"] == float(current.sum()) and row["tf_masked_heads_t1"] == float(sets[:-1].sum())
    sizes, flat = sets[:-1].flatten(1).sum(1), current.flatten(1)
    static_hits = sum(int(flat[t, : int(sizes[t])].sum()) for t in range(len(flat)))  # static order: flat index
    assert row["tf_static_in_dt_t1"] == float(static_hits)
    assert row["tf_chance_in_dt_t1"] == pytest.approx(float((sizes * flat.sum(1)).sum()) / (n_layers * n_heads))
    assert "tf_masked_in_dt_t1" not in _summarise(previous, setup)["row"], "only the probe's runs record it"


# --- one declaration per condition ---------------------------------------------------------------
def test_a_condition_without_a_title_or_with_a_taken_name_is_refused():
    build = lambda model, setup, sample_seed, k: ((lambda view: None), None)
    with pytest.raises(ValueError, match="Condition 'untitled' has no title: every condition needs one"):
        ConditionSpec("untitled", build, "", "D_t")
    with pytest.raises(ValueError, match="sizing 'sometimes'"):
        ConditionSpec("odd", build, "odd masked", "sometimes")
    with pytest.raises(ValueError, match="already registered"):
        register_condition(ConditionSpec("dynamic", build, "again", "D_t"))
    with pytest.raises(ValueError, match="AblationSetup does not have"):
        ConditionSpec("needy", build, "needy masked", "D_t", needs=("oracle",))


def test_a_condition_added_through_its_spec_alone_reaches_the_grid_the_runs_and_the_figures(request, tiny_llama,
                                                                                           tiny_sample):
    """One ConditionSpec (here: the first half of D_t by flat index) and nothing else: it joins the grid's order,
    builds its selector, runs in the grid experiment, and gets its panel and row, titled, in both figures; a grid
    row whose condition no spec declares is refused by the figures with a sentence."""
    import matplotlib
    import pandas as pd

    from dynheads_tl.protocols import conditions
    from dynheads_tl.report import figures

    matplotlib.use("Agg")

    def half(view):
        heads = torch.nonzero(view.retrieval.flatten()).flatten()
        if len(heads) < 2:
            return None
        mask = torch.zeros(view.retrieval.numel(), dtype=torch.bool)
        mask[heads[: len(heads) // 2]] = True
        return mask.reshape(view.retrieval.shape)

    spec = ConditionSpec("half_dynamic", lambda model, setup, sample_seed, k: (half, None), "half of D_t masked", "part")
    conditions.register_condition(spec)
    request.addfinalizer(lambda: conditions.CONDITIONS.pop(spec.name))  # the registry as it was for later tests
    assert conditions.grid_conditions()[-1] == "half_dynamic"
    assert conditions.condition_titles()["half_dynamic"] == "half of D_t masked"
    _, model = tiny_llama
    static = _mask((model.cfg.n_layers, model.cfg.n_heads), (0, 1))
    setup = AblationSetup(static_mask=static, static_top20=static, k=1)
    assert "half_dynamic" in conditions.grid_conditions(setup)
    assert "static_matched" not in conditions.grid_conditions(setup), "a condition whose setup field is missing"
    cells = [({"context": 120, "depth": 0.5, "run": run}, tiny_sample) for run in range(2)]
    grid = experiments.grid_experiment(model, cells, setup, TraceConfig(max_new_tokens=3),
                                       conditions=["none", "half_dynamic"], teacher_forced=False)
    assert grid["condition"].tolist() == ["none", "half_dynamic"] * 2
    from dynheads_tl.claims.irreplaceability.figures import condition_heatmaps, controls_figure

    fig = condition_heatmaps(grid, "accuracy", "grid", k=1)
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible() and ax.get_title()]
    assert titles[0] == "unmasked" and titles[1].startswith("half of D_t masked")
    assert "sized by D_t at each step: half of D_t masked" in fig._supxlabel.get_text()
    summary = pd.DataFrame({"condition": ["none", "half_dynamic"], "accuracy": [1.0, 0.5], "accuracy_low": [0.5, 0.1],
                            "accuracy_high": [1.0, 0.9], "n": [2, 2]})
    fig = controls_figure(summary, "accuracy", "controls")
    assert {label.get_text() for label in fig.axes[0].get_yticklabels()} == {"half of D_t masked", "unmasked"}
    with pytest.raises(ValueError, match="No condition spec declares 'quarter_dynamic'"):
        controls_figure(summary.replace("half_dynamic", "quarter_dynamic"), "accuracy", "controls")


def test_progressive_runs_are_teacher_forced_too(monkeypatch, tiny_llama):
    """With ``teacher_forced`` every (k, ranking) run is also teacher-forced on the gold continuation, apart from the
    generated runs, and its drop joins the row: 0 exactly at k = 0 (nothing masked), and k heads masked per step."""
    _, model = tiny_llama
    samples = make_niah_samples(model.tokenizer, n=2, context_tokens=100, seed=6, max_new_tokens=4, max_tokens=512)
    static = _mask((model.cfg.n_layers, model.cfg.n_heads), (0, 1), (1, 2))
    setup = AblationSetup(static_mask=static, static_top20=static, k=2)
    batches = []
    original = experiments.run_jobs
    monkeypatch.setattr(experiments, "run_jobs", lambda model, jobs, *a, **kw: batches.append(
        {job.teacher_forced for job in jobs}) or original(model, jobs, *a, **kw))
    rows, _ = experiments.progressive_experiment(model, samples, setup, TraceConfig(max_new_tokens=4), [0, 3],
                                                 batch_size=8, teacher_forced=True)
    assert all(len(kinds) == 1 for kinds in batches) and {True} in batches and {False} in batches
    assert rows["ranking"].tolist() == ["ranked", "ranked", "random"] * 2
    assert (rows[rows["k"] == 0]["tf_drop"] == 0).all() and (rows[rows["k"] == 0]["tf_masked_steps"] == 0).all()
    masked = rows[rows["k"] == 3]
    assert (masked["tf_heads_masked_per_step"] == 3).all() and masked["tf_drop"].notna().all()
    assert (masked["tf_steps"] == [len(gold_token_ids(model.tokenizer, s)) for s in samples for _ in (0, 1)]).all()
