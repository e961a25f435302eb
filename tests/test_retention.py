"""Per-step KV retention (notebook 06): the retained sets, the memory arithmetic, and the protocol against its
bounds on the embedded model (every head retained = the full cache exactly; none = streaming exactly)."""
from __future__ import annotations

import pytest
import pandas as pd
import torch

from dynheads_tl.claims import kv_retention
from dynheads_tl.protocols import retention as rt
from dynheads_tl.protocols.stepwise import StepView


def _view(step=0, retrieval=None, support=None, hidden=None):
    retrieval = torch.zeros(2, 4, dtype=torch.bool) if retrieval is None else retrieval
    support = torch.zeros(2, 4) if support is None else support
    return StepView(step, 0, torch.zeros(2, 4, dtype=torch.long), support, retrieval, hidden)


def test_top_retained_by_query_and_by_kv_head():
    scores = torch.tensor([[0.1, 0.9, 0.2, 0.3], [0.8, 0.0, 0.05, 0.4]])
    assert rt.top_retained(scores, 2).nonzero().tolist() == [[0, 1], [1, 0]]
    # 2 query heads per KV head: KV heads (layer, kv) best scores 0.9, 0.3, 0.8, 0.4 -> the top 1 is (0, 0)
    kv = rt.top_retained(scores, 1, granularity="kv", group=2)
    assert kv.nonzero().tolist() == [[0, 0], [0, 1]]
    assert rt.top_retained(scores, 0).sum() == 0
    counted = rt.kv_heads_kept(torch.stack([kv, rt.top_retained(scores, 2)]), group=2)
    assert counted.tolist() == [1, 2]  # a KV head counts once, whichever of its query heads is kept


def test_switching_counts_kv_heads_brought_back_at_each_step():
    """2 layers x 4 query heads, 2 per KV head. Steps: KV (0,0) kept; then (0,0) and (1,1); then (1,1) alone (nothing
    new); then (0,0) again (switched back in). A static set switches nothing."""
    steps = torch.zeros(4, 2, 4, dtype=torch.bool)
    steps[0, 0, 0] = True
    steps[1, 0, 1] = steps[1, 1, 3] = True  # the same KV head (0, 0) through another query head, and (1, 1)
    steps[2, 1, 2] = True
    steps[3, 0, 0] = True
    assert rt.kv_heads_switched(steps, group=2).tolist() == [1, 0, 1]
    assert rt.kv_heads_switched(steps[:1], group=2).numel() == 0, "one step: nothing to switch"
    assert rt.kv_heads_switched(steps[[0, 0, 0]], group=2).tolist() == [0, 0]
    shape = rt.KVShape("toy", n_layers=2, n_kv_heads=2, head_dim=4)
    # A switched-in KV head brings back keys and values of the positions beyond sinks and window: 2 x 4 x 90 x 2 bytes.
    assert shape.switch_bytes(100, sink_tokens=4, local_window=6) == 2 * 4 * 90 * 2
    assert shape.switch_bytes(8, sink_tokens=4, local_window=6) == 0


def test_oracle_puts_the_dynamic_set_first_then_eq2_share():
    retrieval = torch.zeros(2, 4, dtype=torch.bool)
    retrieval[1, 3] = True
    support = torch.tensor([[0.9, 0.1, 0.0, 0.0], [0.0, 0.0, 0.0, 0.2]])
    chosen = rt.top_retained(rt.oracle_scores(_view(retrieval=retrieval, support=support)), 2)
    assert chosen.nonzero().tolist() == [[0, 0], [1, 3]]


def test_selectors_streaming_full_random_and_predicted():
    view = _view(step=3)
    assert rt.retention_selector(None, 0)(view).sum() == 0  # streaming: nothing retained
    assert rt.retention_selector(rt.fixed_scores(torch.rand(2, 4)), 8, n_units=8)(view) is None  # full cache
    with pytest.raises(ValueError, match="scorer"):
        rt.retention_selector(None, 3)
    draw = rt.random_scores((2, 4), seed=5)
    assert torch.equal(draw(view), draw(_view(step=3))) and not torch.equal(draw(view), draw(_view(step=4)))
    static = torch.arange(8.0).reshape(2, 4)
    probe = lambda hidden: hidden.sum() * torch.tensor([1.0, 0, 0, 0, 0, 0, 0, 2.0])
    predicted = rt.predicted_scores(probe, static)
    assert torch.equal(predicted(_view()), static)  # step 0: no previous step, the static order
    assert predicted(_view(step=1, hidden=torch.ones(3))).flatten().tolist() == [3, 0, 0, 0, 0, 0, 0, 6]


def test_memory_arithmetic():
    llama = rt.LLAMA_31_8B
    assert llama.full_bytes(8000) == 2 * 32 * 8 * 128 * 8000 * 2
    assert llama.retained_bytes(8000, 1.0, 4, 32) == llama.full_bytes(8000)
    assert llama.retained_bytes(8000, 0.0, 4, 32) == llama.full_bytes(36)
    table = rt.memory_table([llama], [0.0, 0.5, 1.0], sink_tokens=4, local_window=32)
    assert table["GiB_at_128k"].is_monotonic_increasing
    assert table.loc[2, "GiB_at_8k"] == pytest.approx(llama.full_bytes(8000) / 2**30)


def test_config_rejects_bad_parameters():
    for bad, match in (({"budgets": [0.0]}, "budgets"), ({"strategies": ["full"]}, "strategies"),
                       ({"granularities": ["layer"]}, "granularities"),
                       ({"niah_setting": "filler"}, "must read 'haystack:context_tokens'")):
        with pytest.raises(ValueError, match=match):
            kv_retention.RetentionConfig(**bad)


def _streaming_reference(model, sample, config):
    """A plain greedy generation with every head restricted to the sinks and the local window at every step."""
    from dynheads_tl.engine.hooks import restrict_attention
    from dynheads_tl.engine.tracing import trace_generation

    def visible(state):
        allowed = torch.zeros(state.key_len, dtype=torch.bool)
        allowed[: config.sink_tokens] = True
        allowed[max(state.key_len - config.local_window, 0):] = True
        return allowed

    from dynheads_tl.engine.hooks import StepState

    state = StepState()
    return trace_generation(model, sample, config, state=state,
                            hooks=restrict_attention(lambda _: visible(state), n_layers=model.cfg.n_layers))


def test_every_head_retained_is_the_full_cache_and_none_is_streaming(embedded_model):
    from dynheads_tl.engine.tracing import TraceConfig, trace_generation
    from dynheads_tl.tasks import make_niah_samples

    sample = make_niah_samples(embedded_model.tokenizer, n=1, context_tokens=300, seed=21, max_new_tokens=12)[0]
    config = TraceConfig(max_new_tokens=12)
    shape = (embedded_model.cfg.n_layers, embedded_model.cfg.n_heads)
    plain = trace_generation(embedded_model, sample, config)
    # An explicit all-heads set (not the selector's shortcut): the retained pass runs nothing restricted.
    every = rt.retain_generation(embedded_model, sample, lambda view: torch.ones(shape, dtype=torch.bool), config)
    assert every.retained.tokens.tolist() == plain.tokens.tolist()
    torch.testing.assert_close(every.retained.hidden, plain.hidden, atol=0, rtol=0)
    none = rt.retain_generation(embedded_model, sample, rt.retention_selector(None, 0), config)
    reference = _streaming_reference(embedded_model, sample, config)
    assert none.retained.tokens.tolist() == reference.tokens.tolist()
    torch.testing.assert_close(none.retained.hidden, reference.hidden, atol=1e-5, rtol=1e-5)
    assert none.retained.tokens.tolist() != plain.tokens.tolist()  # the needle is out of every head's reach
    assert int(none.retained_heads.sum()) == 0 and bool(every.retained_heads.all())


def _rows(wins_at: dict[float, int], n: int = 12):
    import pandas as pd

    out = []
    for sample in range(n):
        out += [{"strategy": "full", "granularity": "query", "budget": 1.0, "b": 270, "sample": sample,
                 "accuracy": 1.0, "gold_logprob": -0.1, "heads_kept": 270.0, "kv_heads_kept": 90.0},
                {"strategy": "streaming", "granularity": "query", "budget": 0.0, "b": 0, "sample": sample,
                 "accuracy": 0.0, "gold_logprob": -3.0, "heads_kept": 0.0, "kv_heads_kept": 0.0}]
        for budget, wins in wins_at.items():
            for strategy, acc in (("predicted", float(sample < wins)), ("static", 0.0)):
                out.append({"strategy": strategy, "granularity": "query", "budget": budget, "b": 27, "sample": sample,
                            "accuracy": acc, "gold_logprob": -1.0 + acc, "heads_kept": 27.0, "kv_heads_kept": 20.0})
    return pd.DataFrame(out)


def test_predicted_beats_static_only_when_the_sign_test_agrees():
    rows = _rows({0.1: 4, 0.5: 11})
    table = kv_retention.summary(rows)
    comparisons = kv_retention.predicted_vs_static(rows).set_index("budget")
    # 4 wins, no loss: the bootstrap interval excludes 0, but no sign test on 4 differing samples can reach 0.05
    # (its smallest p is 0.125), so the comparison leaves the Holm family (Tarone) and is never separated.
    assert comparisons.loc[0.1, "low"] > 0 and not comparisons.loc[0.1, "separated"]
    assert not comparisons.loc[0.1, "testable"] and comparisons.loc[0.1, "p_adjusted"] != comparisons.loc[0.1, "p_adjusted"]
    # The family is the testable rest: accuracy at 50% (11 wins) and the log-probabilities at 50% (11 wins; the
    # 10% log-probabilities differ on 4 samples only, so they leave too). Holm over two equal p-values doubles them.
    from scipy import stats
    p11 = stats.binomtest(11, 11, 0.5).pvalue
    assert comparisons.loc[0.5, "p_adjusted"] == pytest.approx(2 * p11)
    assert comparisons.loc[0.5, "logprob_p_adjusted"] == pytest.approx(2 * p11)
    assert comparisons.loc[0.5, "separated"] and comparisons.loc[0.5, "logprob_separated"]
    text = kv_retention.verdict(table, kv_retention.predicted_vs_static(rows))
    assert "query heads 10%: accuracy cannot be told apart" in text
    assert "untestable: 4 samples differ" in text
    assert "query heads 50%: predicted beats static on accuracy" in text
    assert "predicted keeps the gold answer more likely" in text
    assert "reaches 95% of the full cache's (point estimates) is predicted at no budget tried" in text


def test_the_verdict_states_the_switching_cost_the_simulation_does_not_charge():
    from types import SimpleNamespace

    rows = _rows({0.1: 4, 0.5: 11})
    rows["kv_switches_per_step"] = 0.0
    rows.loc[rows["strategy"] == "predicted", "kv_switches_per_step"] = 9.0  # 10% of the 90 KV heads per step
    table = kv_retention.summary(rows)
    predicted = table[table["strategy"] == "predicted"]
    assert (predicted["kv_switches_per_step"] == 9.0).all() and (predicted["kv_switches_low"] == 9.0).all()
    config = SimpleNamespace(sink_tokens=4, local_window=28)
    model = SimpleNamespace(cfg=SimpleNamespace(n_layers=30, n_heads=9, n_key_value_heads=3, d_head=64,
                                                model_name="toy-90-kv-heads"))
    memory = kv_retention.memory(model, config, table)
    llama = memory[memory["model"] == "Llama-3.1-8B"].set_index(["strategy", "budget"])
    # Llama-3.1-8B: 10% of its 32 x 8 KV heads, each bringing back 2 x 128 x (128000 - 32) bf16 values.
    expected = 0.1 * 256 * 2 * 128 * (128_000 - 32) * 2 / 2**20
    assert llama.loc[("predicted", 0.5), "MiB_switched_per_step_at_128k"] == pytest.approx(expected)
    assert llama.loc[("static", 0.5), "MiB_switched_per_step_at_128k"] == 0
    text = kv_retention.verdict(table, kv_retention.predicted_vs_static(rows), memory)
    assert "predicted 9.00 [9.00, 9.00]" in text and "static 0.00 [0.00, 0.00]" in text
    assert "at most 10.0% of the KV heads per step" in text and f"the most is {expected:,.0f} MiB" in text
    assert "restores them for free" in text
    assert "did not count the switches" in kv_retention.verdict(kv_retention.summary(_rows({0.1: 4})),
                                                                   pd.DataFrame())


def test_primary_comparison_averages_the_kv_budgets_per_sample_and_is_tested_alone():
    rows = _rows({0.1: 4, 0.5: 11})
    assert kv_retention.primary_comparison(rows) is None  # no KV-head budgets in these rows
    assert "not run" in kv_retention.primary_verdict(None)
    rows.loc[rows["granularity"] == "query", "granularity"] = "kv"
    primary = kv_retention.primary_comparison(rows)
    # Per sample: mean over the two budgets of (predicted − static): 1.0 for samples 0-3, 0.5 for 4-10, 0 for 11.
    assert primary["n"] == 12 and primary["difference"] == pytest.approx((4 * 1.0 + 7 * 0.5) / 12)
    assert (primary["predicted_better"], primary["static_better"]) == (11, 0)
    assert primary["separated"] and "**supported**" in kv_retention.primary_verdict(primary)


def test_retention_config_needs_a_visible_key():
    with pytest.raises(ValueError, match="sink_tokens \\+ local_window"):
        kv_retention.RetentionConfig(sink_tokens=0, local_window=0)


def test_one_pass_equals_the_two_pass_retained_pass_batched_and_alone(embedded_model):
    """Retention without a clean pass gives the two-pass loop's retained pass; two samples of different lengths
    with different retained sets, left-padded in one batch, give what each gives alone; the probe's view holds
    the previous step's hidden state of the kept pass."""
    from dynheads_tl.engine.tracing import TraceConfig
    from dynheads_tl.protocols.two_pass import two_pass_batch
    from dynheads_tl.tasks import make_niah_samples

    samples = make_niah_samples(embedded_model.tokenizer, n=2, context_tokens=[300, 380], seed=23, random_layout=True,
                                max_new_tokens=10)
    config = TraceConfig(max_new_tokens=10)
    shape = (embedded_model.cfg.n_layers, embedded_model.cfg.n_heads)
    seen = []

    def probe(hidden):
        seen.append(hidden.clone())
        return torch.arange(shape[0] * shape[1], dtype=torch.float32)  # a fixed order: the last 40 heads

    selectors = [rt.retention_selector(rt.fixed_scores(torch.rand(shape, generator=torch.Generator().manual_seed(1))), 40),
                 rt.retention_selector(rt.predicted_scores(probe, torch.zeros(shape)), 40)]
    batched = rt.retain_batch(embedded_model, list(zip(samples, selectors)), config, clean_pass=False)
    seen_batched = list(seen)
    for b, (sample, select) in enumerate(zip(samples, selectors)):
        seen.clear()
        one = rt.retain_batch(embedded_model, [(sample, select)], config, clean_pass=False)[0]
        seen_one = list(seen)
        two = rt.retain_batch(embedded_model, [(sample, select)], config)[0]
        assert one.retained.tokens.tolist() == two.retained.tokens.tolist() == batched[b].retained.tokens.tolist()
        torch.testing.assert_close(one.retained.hidden, two.retained.hidden, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(one.retained.hidden, batched[b].retained.hidden, atol=1e-4, rtol=1e-4)
        assert torch.equal(one.retained_heads, two.retained_heads)
        if b == 1:  # the probe read the kept pass's hidden state of step t - 1 at step t
            assert len(seen_one) == one.retained.n_steps - 1
            for t, hidden in enumerate(seen_one, start=1):
                torch.testing.assert_close(hidden, one.retained.hidden[t - 1], atol=0, rtol=0)
    assert len(seen_batched) == batched[1].retained.n_steps - 1  # row 0's selector never calls the probe
    with pytest.raises(TypeError, match="clean_pass"):  # only retention may skip the clean pass
        two_pass_batch(embedded_model, [(samples[0], selectors[0])], config, clean_pass=False)


def test_samples_decoded_together_give_what_each_gives_alone(embedded_model):
    """Notebook 06 decodes several samples' conditions in one batch (:func:`kv_retention.samples_per_batch`): the
    responses and accuracies are those of each sample run alone, and the log-probabilities agree to rounding."""
    import numpy as np

    config = kv_retention.RetentionConfig(niah_setting="filler:200", max_new_tokens=12, n_samples=2,
                                          budgets=[0.25], strategies=["static", "predicted"], granularities=["query"], batch_size=8,
                                          use_cache=False)
    samples = kv_retention.evaluation_samples(embedded_model, config)
    generator = torch.Generator().manual_seed(0)
    static = torch.rand(embedded_model.cfg.n_layers, embedded_model.cfg.n_heads, generator=generator)
    weights = np.random.default_rng(0).normal(size=(embedded_model.cfg.d_model, static.numel()))
    probe = lambda hidden: hidden.float().cpu().numpy() @ weights
    assert kv_retention.samples_per_batch(embedded_model, config) == 2  # 4 one-pass conditions, 8 rows
    together = kv_retention.retention_units(embedded_model, [(s, i) for i, s in enumerate(samples)], config, static, probe)
    assert len(samples[0].prompt_ids) != len(samples[1].prompt_ids)  # so the batch is left-padded
    # The second sample: its rows sat behind the first one's in the batch, left-padded to the longer prompt.
    [alone] = kv_retention.retention_units(embedded_model, [(samples[1], 1)], config, static, probe)
    assert [(r["strategy"], r["budget"]) for r in alone] == [(r["strategy"], r["budget"]) for r in together[1]]
    assert [r["response"] for r in alone] == [r["response"] for r in together[1]]
    assert [r["accuracy"] for r in alone] == [r["accuracy"] for r in together[1]]
    np.testing.assert_allclose([r["gold_logprob"] for r in alone], [r["gold_logprob"] for r in together[1]], atol=1e-4)
    assert len(together[0]) == len(alone) == 4


@pytest.mark.parametrize("full_low, difference, low, high, sign_p, status", [
    (0.2, 0.1, 0.05, 0.15, 0.001, "no headroom"),  # full cache's interval reaches streaming's
    (0.6, 0.1, 0.05, 0.15, 0.001, "supported"),
    (0.6, 0.03, 0.01, 0.04, 0.001, "not supported"),  # separated but within ±0.05: TOST negligible
    (0.6, -0.06, -0.08, -0.04, 0.0003, "not supported"),  # the SmolLM2 run
    (0.6, 0.1, -0.02, 0.2, 0.2, "undetermined")])
def test_beyond6_rule_on_hand_built_numbers(full_low, difference, low, high, sign_p, status):
    import pandas as pd

    from dynheads_tl.claims.kv_retention.report import retention_rule

    full = pd.Series({"accuracy_low": full_low})
    stream = pd.Series({"accuracy_high": 0.3})
    primary = pd.Series({"difference": difference, "low": low, "high": high, "sign_p": sign_p})
    assert retention_rule(full, stream, primary, sesoi=0.05, alpha=0.05) == status
    assert retention_rule(full, stream, None, sesoi=0.05, alpha=0.05) in ("no headroom", "undetermined")
