"""CCA and probes on synthetic data with known answers."""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch

from factories import make_trace
from dynheads_tl.analysis.correlation import (
    ProbeConfig, asymmetric_loss, best_f1_threshold, cca_curve, cca_held_out, classification_metrics,
    lagged_pairs, probe_table, shuffle_across_samples, split_by_sample, train_probe,
)

N_LAYERS, N_HEADS, D_MODEL = 3, 4, 16


def synthetic_traces(n_samples=40, steps=20, planted=True, lag=0, seed=0):
    """Traces whose scores at step n + lag are a linear function of the hidden state at step n
    (``planted``), or independent noise. The Eq. 1 pattern is planted too: head (l, h) retrieves
    when its score exceeds 0.5."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(D_MODEL, N_LAYERS * N_HEADS))
    traces = []
    for _ in range(n_samples):
        hidden = rng.normal(size=(steps, D_MODEL))
        if planted:
            scores = np.zeros((steps, N_LAYERS * N_HEADS))
            scores[lag:] = 1 / (1 + np.exp(-(hidden[: steps - lag] @ w) / 3))
            scores[:lag] = rng.uniform(size=(lag, N_LAYERS * N_HEADS))
        else:
            scores = rng.uniform(size=(steps, N_LAYERS * N_HEADS))
        retrieving = torch.tensor(scores > 0.5).reshape(steps, N_LAYERS, N_HEADS)
        # Evidence span [0, 2) holds token 5; position 3 holds token 9 (outside the span).
        argmax = torch.where(retrieving, torch.tensor(0), torch.tensor(3))
        traces.append(make_trace(
            torch.full((steps,), 5), argmax,
            torch.tensor(scores, dtype=torch.float32).reshape(steps, N_LAYERS, N_HEADS),
            hidden=torch.tensor(hidden, dtype=torch.float32), prompt_ids=[5, 5, 7, 9], evidence_spans=[(0, 2)]))
    return traces


def test_lagged_pairs_drop_pairs_past_the_end():
    traces = synthetic_traces(n_samples=3, steps=5)
    x, y, groups = lagged_pairs(traces, 2)
    assert x.shape == (9, D_MODEL) and y.shape == (9, N_LAYERS * N_HEADS)
    np.testing.assert_allclose(x[:3], traces[0].hidden[:3].numpy(), rtol=1e-6)
    np.testing.assert_allclose(y[:3], traces[0].support_score[2:5].flatten(1).numpy(), rtol=1e-6)
    assert groups.tolist() == [0] * 3 + [1] * 3 + [2] * 3
    with pytest.raises(ValueError, match="longer than"):
        lagged_pairs(traces, 5)


def test_split_by_sample_is_disjoint_and_complete():
    parts = split_by_sample(20, [0.7, 0.2, 0.1], seed=1)
    assert [len(p) for p in parts] == [14, 4, 2]
    assert sorted(np.concatenate(parts).tolist()) == list(range(20))
    with pytest.raises(ValueError):
        split_by_sample(10, [0.5, 0.2])


def test_planted_linear_relation_gives_cca_near_one_held_out():
    traces = synthetic_traces(planted=True)
    x, y, groups = lagged_pairs(traces, 0)
    train, test = split_by_sample(len(traces), [0.7, 0.3], seed=0)
    summary = cca_held_out(x, y, groups, train, test)
    assert summary["leading"] > 0.95


def test_independent_data_gives_cca_near_zero_held_out():
    traces = synthetic_traces(planted=False)
    x, y, groups = lagged_pairs(traces, 0)
    train, test = split_by_sample(len(traces), [0.7, 0.3], seed=0)
    summary = cca_held_out(x, y, groups, train, test)
    assert summary["leading"] < 0.3


def test_cca_curve_finds_the_planted_lag_and_controls_stay_low():
    traces = synthetic_traces(planted=True, lag=3)
    curve = cca_curve(traces, ks=[0, 3])
    held = curve[curve["control"] == "held-out"].set_index("k")["leading"]
    assert held[3] > 0.95 and held[0] < 0.5
    shuffled = curve[curve["control"] == "shuffled"].set_index("k")["leading"]
    assert shuffled[3] < held[3] - 0.3
    assert set(curve["control"]) == {"in-sample", "held-out", "shuffled", "shuffled, same step",
                                     "permuted within sample"}
    within = curve[curve["control"] == "permuted within sample"].set_index("k")["leading"]
    assert within[3] < held[3] - 0.3, "a per-step relation does not survive permuting the steps"


def test_the_within_sample_permutation_keeps_the_sample_and_moves_every_step():
    from dynheads_tl.analysis.layouts import permute_within_samples

    y = np.arange(9)[:, None].astype(float)
    groups = np.array([0, 0, 0, 1, 1, 1, 2, 2, 2])
    for seed in range(5):
        permuted = permute_within_samples(y, groups, seed=seed)[:, 0]
        for g in range(3):
            rows = np.flatnonzero(groups == g)
            assert sorted(permuted[rows].tolist()) == y[rows, 0].tolist(), "each sample keeps its own scores"
            assert not np.any(permuted[rows] == y[rows, 0]), "no step keeps its own"
    assert permute_within_samples(y[:1], groups[:1]).tolist() == [[0.0]], "a one-step sample is left as it is"


def test_the_within_sample_permutation_tells_sample_identity_from_step_prediction():
    """Hidden states and scores that depend on the sample only (the same all along an answer): held-out CCA is high
    and the controls drawing donors from other layouts stay low, so they would call it prediction; permuting the
    steps within each sample keeps all of it, and the gap to that control is about 0, as it should be."""
    rng = np.random.default_rng(3)
    w = rng.normal(size=(D_MODEL, N_LAYERS * N_HEADS))
    traces = []
    for _ in range(40):
        latent = rng.normal(size=D_MODEL)
        hidden = latent + 0.05 * rng.normal(size=(6, D_MODEL))
        scores = np.tile(1 / (1 + np.exp(-(latent @ w) / 3)), (6, 1))
        retrieving = torch.tensor(scores > 0.5).reshape(6, N_LAYERS, N_HEADS)
        argmax = torch.where(retrieving, torch.tensor(0), torch.tensor(3))
        traces.append(make_trace(torch.full((6,), 5), argmax,
                                 torch.tensor(scores, dtype=torch.float32).reshape(6, N_LAYERS, N_HEADS),
                                 hidden=torch.tensor(hidden, dtype=torch.float32), prompt_ids=[5, 5, 7, 9],
                                 evidence_spans=[(0, 2)]))
    curve = cca_curve(traces, ks=[1], split_seeds=[0, 1, 2])
    mean = curve.groupby("control")["leading"].mean()
    assert mean["held-out"] > 0.9 and mean["shuffled"] < mean["held-out"] - 0.3
    assert abs(mean["permuted within sample"] - mean["held-out"]) < 0.05


def test_shuffle_pairs_rows_with_other_samples():
    y = np.arange(6)[:, None].astype(float)
    groups = np.array([0, 0, 0, 1, 1, 1])
    shuffled = shuffle_across_samples(y, groups, seed=0)
    assert (shuffled[:3] >= 3).all() and (shuffled[3:] < 3).all()
    same = shuffle_across_samples(y, groups, seed=0, same_step=True)
    assert same[:, 0].tolist() == [3, 4, 5, 0, 1, 2]  # the other sample, same step index


def test_probe_learns_a_planted_rule():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(8, 5))
    x = rng.normal(size=(1500, 8))
    y = (x @ w > 0.8).astype(float)
    config = ProbeConfig(hidden=[64], epochs=40, lr=3e-3)
    model = train_probe(x[:1000], y[:1000], x[1000:1250], y[1000:1250], task="classification", config=config)
    with torch.no_grad():
        val = torch.sigmoid(model(torch.tensor(x[1000:1250], dtype=torch.float32))).numpy()
        test = torch.sigmoid(model(torch.tensor(x[1250:], dtype=torch.float32))).numpy()
    metrics = classification_metrics(y[1250:], test, best_f1_threshold(y[1000:1250], val))
    assert metrics["f1"] > 0.9 and metrics["auprc"] > 0.95


def test_probe_table_beats_the_prior_on_planted_traces():
    traces = synthetic_traces(n_samples=40, planted=True)
    config = ProbeConfig(hidden=[64], epochs=30, lr=3e-3)
    table = probe_table(traces, "classification", config).set_index("predictor")
    assert table.loc["MLP probe", "f1"] > 0.85
    assert table.loc["MLP probe", "f1"] > table.loc["static-frequency prior", "f1"] + 0.2
    reg = probe_table(traces, "regression", config).set_index("predictor")
    assert reg.loc["linear probe", "r2"] > 0.8 and reg.loc["MLP probe", "r2"] > 0.8
    assert abs(reg.loc["static-frequency prior", "r2"]) < 0.1


def test_step_aware_prior_captures_position_only_signal():
    """Heads whose activity depends only on the step index: the step-aware prior is perfect, the
    overall base rate is not."""
    traces = synthetic_traces(n_samples=30, planted=False)
    for trace in traces:
        by_step = torch.zeros(trace.n_steps, N_LAYERS, N_HEADS, dtype=torch.bool)
        by_step[::2, 0, 0] = True  # head (0, 0) retrieves at even steps
        by_step[1::3, 2, 1] = True  # head (2, 1) at steps 1, 4, 7, ...
        trace.argmax_pos = torch.where(by_step, torch.tensor(0), torch.tensor(3))
    table = probe_table(traces, "classification", ProbeConfig(hidden=[8], epochs=2)).set_index("predictor")
    assert table.loc["step-aware prior", "f1"] == pytest.approx(1.0)
    assert table.loc["static-frequency prior", "f1"] < 0.8


def test_step_rates_fall_back_for_unseen_steps():
    from dynheads_tl.analysis.correlation import step_rates

    y = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    predict = step_rates(y, np.array([0, 1, 0]), fallback=np.array([0.25, 0.75]))
    assert np.allclose(predict(np.array([0, 1, 5])), [[1.0, 0.5], [0.0, 1.0], [0.25, 0.75]])


def test_asymmetric_loss_prefers_correct_predictions():
    targets = torch.tensor([[1.0, 0.0, 0.0]])
    good, bad = torch.tensor([[4.0, -4.0, -4.0]]), torch.tensor([[-4.0, 4.0, 4.0]])
    assert asymmetric_loss(good, targets) < asymmetric_loss(bad, targets)
    # Clipping: a confidently right negative (p < clip) costs nothing.
    assert float(asymmetric_loss(torch.tensor([[-6.0]]), torch.tensor([[0.0]]))) == pytest.approx(0.0, abs=1e-6)


def test_probe_trains_even_with_gradients_switched_off_globally():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(200, 4))
    y = x[:, :2] * 2.0
    with torch.no_grad():
        model = train_probe(x[:150], y[:150], x[150:], y[150:], task="regression",
                            config=ProbeConfig(hidden=[16], epochs=30, lr=1e-2))
    with torch.no_grad():
        pred = model(torch.tensor(x[150:], dtype=torch.float32)).numpy()
    assert np.mean((pred - y[150:]) ** 2) < 0.1 * np.var(y)


# --- claim 3 beyond position ----------------------------------------------------------------------
def positional_traces(n_samples=40, steps=12, hidden_signal=False, seed=0):
    """Hidden states and scores that both depend on the step index (a strong shared position effect) and on
    the current token; with ``hidden_signal`` the scores also carry a linear function of a per-step latent
    that is in the hidden state, independent of step and token."""
    rng = np.random.default_rng(seed)
    step_x = rng.normal(size=(steps, D_MODEL)) * 3
    step_y = rng.normal(size=(steps, N_LAYERS * N_HEADS)) * 3
    token_x = rng.normal(size=(4, D_MODEL))
    token_y = rng.normal(size=(4, N_LAYERS * N_HEADS))
    w = rng.normal(size=(D_MODEL, N_LAYERS * N_HEADS))
    traces = []
    for _ in range(n_samples):
        tokens = rng.integers(0, 4, size=steps)
        prompt = np.array([1, 2, int(rng.integers(0, 4))])
        inputs = np.concatenate([prompt[-1:], tokens[:-1]])  # the token each step reads
        latent = rng.normal(size=(steps, D_MODEL))
        hidden = step_x + token_x[inputs] + latent
        scores = step_y + token_y[inputs] + rng.normal(size=(steps, N_LAYERS * N_HEADS))
        if hidden_signal:
            scores = scores + latent @ w
        traces.append(make_trace(
            torch.tensor(tokens), None, torch.tensor(scores, dtype=torch.float32).reshape(steps, N_LAYERS, N_HEADS),
            hidden=torch.tensor(hidden, dtype=torch.float32), layers=N_LAYERS, heads=N_HEADS,
            prompt_ids=torch.tensor(prompt), evidence_spans=[(0, 1)]))
    return traces


def _mean_first(table, control):
    return float(table[table["control"] == control]["first"].mean())


def test_residualising_removes_a_position_and_token_only_signal():
    from dynheads_tl.analysis.correlation import residualised_cca

    table = residualised_cca(positional_traces(hidden_signal=False), [0], [0, 1, 2])
    assert _mean_first(table, "held-out") > 0.9  # raw CCA sees the shared position/token effect ...
    resid, chance = _mean_first(table, "held-out, residualised"), _mean_first(table, "held-out, residualised, chance")
    assert resid < 0.35 and chance < 0.35  # ... which residualisation removes: both at chance level


def test_residualising_keeps_a_hidden_state_signal():
    from dynheads_tl.analysis.correlation import residualised_cca

    table = residualised_cca(positional_traces(hidden_signal=True), [0], [0, 1, 2])
    assert _mean_first(table, "held-out, residualised") > 0.8
    assert _mean_first(table, "held-out, residualised, chance") < 0.35


def test_k_ahead_pairs_and_covariates_line_up_at_the_ends_of_sequences():
    from dynheads_tl.analysis.correlation import pair_covariates

    traces = positional_traces(n_samples=3, steps=4)
    traces[1] = positional_traces(n_samples=1, steps=2, seed=5)[0]  # shorter than k + 1: no pairs
    x, y, groups = lagged_pairs(traces, 2)
    traces[2].meta = {"actual_depth": 0.75}
    steps, tokens, target_tokens, generated, depths = pair_covariates(traces, 2)
    assert generated.tolist() == traces[0].tokens[2:].tolist() + traces[2].tokens[2:].tolist()
    assert groups.tolist() == [0, 0, 2, 2] and steps.tolist() == [0, 1, 0, 1]
    assert depths.tolist() == [0.0, 0.0, 0.75, 0.75]  # a trace without a recipe counts as depth 0
    # The target step n + 2 reads the token generated at n + 1.
    assert target_tokens[0] == int(traces[0].tokens[1]) and target_tokens[3] == int(traces[2].tokens[2])
    # Pair (sample 2, n = 1): hidden of step 1 with the scores of step 3, the last step.
    np.testing.assert_allclose(x[3], traces[2].hidden[1].numpy(), rtol=1e-6)
    np.testing.assert_allclose(y[3], traces[2].support_score[3].flatten().numpy(), rtol=1e-6)
    # Step 0 reads the last prompt token; step 1 reads the token generated at step 0.
    assert tokens[0] == int(traces[0].prompt_ids[-1]) and tokens[1] == int(traces[0].tokens[0])
    with pytest.raises(ValueError, match="longer than"):
        pair_covariates(traces, 4)


def test_lead_probes_report_differences_with_intervals_over_splits():
    from dynheads_tl.analysis.correlation import lead_differences, lead_probe_table

    traces = synthetic_traces(n_samples=40, steps=20, lag=2)
    config = ProbeConfig(hidden=[64], epochs=30, lr=3e-3)
    raw = lead_probe_table(traces, "regression", config, ks=[0, 2], split_seeds=[0, 1, 2])
    assert set(raw["k"]) == {0, 2} and set(raw["split_seed"]) == {0, 1, 2}
    assert set(raw["predictor"]) == {"MLP probe", "static-frequency prior", "step-aware prior", "step-and-token prior"}
    diffs = lead_differences(raw, "r2").set_index("k")
    assert (diffs["splits"] == 3).all()
    # The planted relation is 2 steps ahead: the probe beats the step-aware prior there, with the interval above 0.
    assert diffs.loc[2, "vs_step_prior_low"] > 0
    assert diffs.loc[2, "vs_step_prior"] > diffs.loc[0, "vs_step_prior"]


def test_closed_form_cca_matches_the_iterative_one():
    from sklearn.cross_decomposition import CCA

    from dynheads_tl.analysis.correlation import LinearCCA, _canonical_correlations

    rng = np.random.default_rng(3)
    x = rng.normal(size=(400, 6))
    y = np.c_[x[:, :2] @ rng.normal(size=(2, 3)) + 0.5 * rng.normal(size=(400, 3)), rng.normal(size=(400, 2))]
    ours = LinearCCA(3).fit(x, y)
    theirs = CCA(n_components=3, max_iter=5000, tol=1e-10).fit(x, y)
    np.testing.assert_allclose(_canonical_correlations(*ours.transform(x, y)), ours.correlations, atol=1e-8)
    np.testing.assert_allclose(ours.correlations, _canonical_correlations(*theirs.transform(x, y)), atol=1e-3)


def test_intervals_on_known_cases():
    from dynheads_tl.analysis.statistics import bootstrap_interval, t_interval, wilson_interval

    t = t_interval([1.0, 2.0, 3.0])
    assert t.estimate == 2.0 and t.n == 3
    assert t.high - 2.0 == pytest.approx(4.302653 * 1.0 / np.sqrt(3), rel=1e-5)  # t_{0.975, 2} * sd / sqrt(n)
    w = wilson_interval(0, 10)
    assert w.low == pytest.approx(0.0, abs=1e-12) and w.high == pytest.approx(0.2775, abs=1e-4)
    assert wilson_interval(5, 10).low == pytest.approx(0.2366, abs=1e-4)
    b = bootstrap_interval(np.ones(20))
    assert b.low == b.high == 1.0
    assert t_interval([float("nan")]).n == 0
    one = t_interval([0.4, float("nan")])  # one value: no interval, never a zero-width one
    assert one.estimate == 0.4 and one.n == 1 and one.low != one.low and not one.excludes_zero()
    ratio = lambda v: v[:, 0].sum() / v[:, 1].sum() if v[:, 1].sum() else float("nan")
    sparse = bootstrap_interval(np.array([[1.0, 2.0], [0.0, 0.0], [0.0, 0.0]]), ratio)
    assert sparse.estimate == 0.5 and sparse.low == sparse.high == 0.5  # draws with no denominator left out


def leaky_token_traces(n_samples=60, steps=10, vocabulary=200, seed=0):
    """No hidden-state signal at all: hidden states depend on step and the token read at n, scores on step
    and the token read at n + 1 (which greedy decoding makes the token generated at n). Many tokens are rare."""
    rng = np.random.default_rng(seed)
    token_x = rng.normal(size=(vocabulary, D_MODEL)) * 2
    token_y = rng.normal(size=(vocabulary, N_LAYERS * N_HEADS)) * 2
    step_x, step_y = rng.normal(size=(steps, D_MODEL)), rng.normal(size=(steps, N_LAYERS * N_HEADS))
    probabilities = 1 / np.arange(1, vocabulary + 1)
    probabilities /= probabilities.sum()
    traces = []
    for _ in range(n_samples):
        tokens = rng.choice(vocabulary, size=steps, p=probabilities)
        prompt = np.array([1, int(rng.choice(vocabulary, p=probabilities))])
        inputs = np.concatenate([prompt[-1:], tokens[:-1]])
        hidden = step_x + token_x[inputs] + rng.normal(size=(steps, D_MODEL))
        scores = step_y + token_y[tokens] + rng.normal(size=(steps, N_LAYERS * N_HEADS))  # reads the next input
        traces.append(make_trace(
            torch.tensor(tokens), None, torch.tensor(scores, dtype=torch.float32).reshape(steps, N_LAYERS, N_HEADS),
            hidden=torch.tensor(hidden, dtype=torch.float32), layers=N_LAYERS, heads=N_HEADS,
            prompt_ids=torch.tensor(prompt), evidence_spans=[(0, 1)]))
    return traces


def test_residualising_also_removes_the_target_steps_token_and_rare_tokens():
    from dynheads_tl.analysis.correlation import residualised_cca

    # At k = 0 the scores of step n depend on the token read at n + 1 (= generated at n); at k = 1 on the
    # token read by the target step itself. Both are regressed out, and rare tokens cannot leak through.
    table = residualised_cca(leaky_token_traces(), [0, 1], [0, 1, 2])
    resid = table[table["control"] == "held-out, residualised"].groupby("k")["first"].mean()
    assert resid[1] < 0.35, "the target step's own token leaked through the residualisation"
    assert (table["test_rows_dropped"] > 0).any()  # held-out rows with unfamiliar tokens are left out


def test_held_out_correlations_are_signed():
    from dynheads_tl.analysis.correlation import held_out_correlations

    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 3))
    y = x[:, :1] + 0.1 * rng.normal(size=(300, 1))
    flipped = held_out_correlations(x[:200], y[:200], x[200:], -y[200:], y_variance=0.999)
    assert flipped[0] < -0.9


def test_the_verdict_never_counts_a_lag_without_all_splits():
    from dynheads_tl.claims.correlation import beyond_position_verdict, lag_tests

    def diffs(metric, rows):
        return pd.DataFrame([{"k": k, "metric": metric, "splits": n, "probe": 0.5, "vs_base_rate": 0.1,
                              "vs_base_rate_low": 0.05, "vs_base_rate_high": 0.15, "vs_step_prior": d,
                              "vs_step_prior_low": lo, "vs_step_prior_high": hi, "vs_step_prior_p": p}
                             for k, n, d, lo, hi, p in rows])

    nan = float("nan")
    niah = diffs("f1", [(0, 5, 0.05, 0.02, 0.08, 0.001), (1, 5, 0.01, -0.02, 0.04, 0.4), (10, 1, 0.09, nan, nan, nan)])
    hotpot = diffs("r2", [(0, 5, -0.1, -0.2, 0.0, 0.05), (1, 3, 0.2, 0.1, 0.3, 0.001)])
    tests = lag_tests(niah, hotpot, n_splits=5).set_index(["task", "k"])
    # the primary (NIAH F1 at k = 1) alone: its own 0.4; Holm over the two secondary lags with all 5 splits:
    # 0.001 * 2, 0.05 * 1
    assert tests.loc[("niah", 0), "p_adjusted"] == pytest.approx(0.002)
    assert tests.loc[("hotpot", 0), "p_adjusted"] == pytest.approx(0.05)
    assert tests.loc[("niah", 1), "p_adjusted"] == pytest.approx(0.4)
    assert np.isnan(tests.loc[("hotpot", 1), "p_adjusted"]) and not tests.loc[("hotpot", 1), "separated"]
    assert tests.loc[("niah", 1), "primary"] and tests["primary"].sum() == 1
    empty = pd.DataFrame()
    text = beyond_position_verdict(niah, hotpot, empty, empty, n_splits=5, hotpot_name="HotpotQA (synthetic)")
    assert "NIAH Eq. 1 sets better than the step index alone only concurrently (k = 0)" in text
    assert "HotpotQA (synthetic) Eq. 2 scores no better than the step index alone at any lag" in text
    assert "n = 1" in text  # the lag with one split is shown with its n, not counted
    # The primary comparison cannot be told apart, and the sentence says what the design detects with 80% power:
    # 2.8 standard errors of a half-width 0.03 (one standard error 0.03 / 1.96), ±0.043, not the half-width itself
    assert "at k = 1 the NIAH probe's F1 is cannot be told apart from" not in text
    assert "cannot be told apart from the step-aware prior's" in text and "±0.043 with 80% power" in text
    assert "tested alone at 0.05" in text


def test_claim3_tables_over_splits_state_n_and_layouts(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNHEADS_CACHE", str(tmp_path))  # lead_probes caches its probes: never in the user's cache
    from dynheads_tl.claims.correlation import (PredictabilityConfig, cca_table, lead_probes,
                                                   probe_table_over_splits, summary_markdown)

    traces = clustered_traces(n_layouts=12, per_layout=3, steps=10)
    config = PredictabilityConfig(max_lag=1, lead_ks=[0, 1], n_splits=3, probe_epochs=3, probe_hidden=[8])
    raw, summary = cca_table(traces, config)
    assert set(summary["splits"]) == {3} and set(summary["n_clusters"]) == {12}
    lead_raw, lead = lead_probes(traces, "classification", config, None)
    assert set(lead_raw[lead_raw["k"] == 0]["predictor"]) == {"MLP probe", "linear probe", "static-frequency prior",
                                                             "step-aware prior", "step-and-token prior"}
    assert "linear probe" not in set(lead_raw[lead_raw["k"] == 1]["predictor"])
    table, tests = probe_table_over_splits(lead_raw, "classification")
    assert (table["splits"] == 3).all() and (table["n_clusters"] == 12).all() and (table["test_samples"] == 12).all()
    assert (table["f1_low"] <= table["f1"]).all() and len(tests) == 4 and tests["p_adjusted"].notna().all()
    reg_raw, _ = lead_probes(traces, "regression", config, None)
    table3, tests3 = probe_table_over_splits(reg_raw, "regression")
    assert {"mse_low", "r2_high"} <= set(table3.columns) and set(tests3["b"]) == {
        "linear probe", "static-frequency prior", "step-aware prior", "step-and-token prior"}
    text = summary_markdown(raw, raw, table, tests, table3, tests3, "test model", min_test=20)
    assert "n = 36 samples in 12 layouts" in text and "fewer than the 20 asked for" in text


def test_paired_comparisons_and_interval_text_on_known_cases():
    from dynheads_tl.analysis.statistics import format_interval, mark_separated, paired_sign_test

    assert format_interval(0.75, 0.4712, 0.9105) == "0.75 [0.47, 0.91]"
    assert format_interval(-0.0259, -0.0864, 0.043, signed=True) == "-0.03 [-0.09, +0.04]"
    assert format_interval(0.2, 0.1, 0.37, 3) == "0.200 [0.100, 0.370]"
    # 4 wins, 1 loss, 25 ties: the sign test sees 5 differing samples, p = 2 * (1 + 5) / 32 = 0.375
    test = paired_sign_test([1.0] * 4 + [0.0] + [0.5] * 25, [0.0] * 4 + [1.0] + [0.5] * 25)
    assert (test.a_better, test.b_better) == (4, 1) and test.sign_p == pytest.approx(0.375)
    assert test.difference.n == 30 and test.difference.estimate == pytest.approx(0.1)
    assert paired_sign_test([0.5, 0.5], [0.5, 0.5]).sign_p == 1.0  # nothing differs
    with pytest.raises(ValueError, match="same shape"):
        paired_sign_test([1.0, 0.0], [1.0])
    # Holm within the family only; separated needs the adjusted p below alpha and the interval away from 0
    table = pd.DataFrame({"sign_p": [0.001, 0.02, 0.02, 0.001], "low": [0.1, 0.1, -0.1, 0.2], "high": [0.5, 0.5, 0.3, 0.6]})
    marked = mark_separated(table, 0.05, family=[False, True, True, True])
    assert marked["p_adjusted"].tolist() == pytest.approx([0.001, 0.04, 0.04, 0.003])
    assert marked["separated"].tolist() == [True, True, False, True]


# --- independent units: layouts, grouped splits, depth ---------------------------------------------
def niah_meta(depth, seed, offset=0):
    return {"haystack": "filler", "context_tokens": 300, "depth": depth, "haystack_offset": offset, "seed": seed,
            "actual_depth": depth}


def test_niah_samples_that_differ_only_in_the_uuid_share_a_layout():
    from dynheads_tl.analysis.correlation import layout_groups

    traces = synthetic_traces(n_samples=5, steps=3)
    for trace, (depth, seed, offset) in zip(traces, [(0.25, 1, 0), (0.25, 2, 0), (0.75, 1, 0), (0.25, 3, 7)]):
        trace.meta = niah_meta(depth, seed, offset)
    labels = layout_groups(traces)
    assert labels[0] == labels[1]  # another seed (UUID), the same depth and offset
    assert len({labels[0], labels[2], labels[3], labels[4]}) == 4  # another depth, another offset, no recipe
    hotpot = synthetic_traces(n_samples=2, steps=3)
    for trace in hotpot:
        trace.task, trace.meta = "hotpot", {"id": "q1", "context_tokens": None, "depth": None}
    assert len(set(layout_groups(hotpot))) == 1  # the same question in two seeds (a file's records recur)


def clustered_traces(n_layouts=12, per_layout=3, steps=8):
    traces = synthetic_traces(n_samples=n_layouts * per_layout, steps=steps)
    for i, trace in enumerate(traces):
        trace.meta = niah_meta(round((i // per_layout + 0.5) / n_layouts, 4), seed=i % per_layout)
    return traces


def test_every_cca_and_probe_split_keeps_each_layout_on_one_side():
    from dynheads_tl.analysis.correlation import layout_groups, layout_split, probe_splits

    traces = clustered_traces()
    labels = layout_groups(traces)
    for seed in range(5):
        train, test = layout_split(labels, seed, 0.3)
        assert not set(labels[train]) & set(labels[test]) and len(train) + len(test) == len(traces)
        parts = probe_splits(labels, seed)
        sides = [set(labels[p].tolist()) for p in parts]
        assert all(not (a & b) for i, a in enumerate(sides) for b in sides[i + 1:])
        assert sorted(np.concatenate(parts).tolist()) == list(range(len(traces)))
        # 36 samples: 10% would be 4, so the test part grows to the 20 samples asked for, capped at a third of
        # the 12 layouts (4 layouts = 12 samples)
        assert len(parts[2]) == 12
    with pytest.raises(ValueError, match="at least 3 layouts"):
        probe_splits(np.array(["a", "a", "b"]), 0)


def test_probe_test_parts_reach_20_samples_where_the_data_allow():
    from dynheads_tl.analysis.correlation import probe_splits

    labels = np.repeat(np.arange(30), 3)  # claim 3's 90 NIAH traces: 30 layouts x 3 UUIDs
    train, val, test = probe_splits(labels, 0)
    assert len(test) >= 20 and len(test) % 3 == 0  # 7 layouts = 21 samples
    assert len(val) == 18 and len(train) == 90 - 18 - len(test)  # validation: 20% of the layouts


def test_cca_controls_are_out_of_sample_and_summarised_over_splits():
    from dynheads_tl.analysis.correlation import over_splits, paired_over_splits

    traces = clustered_traces()
    curve = cca_curve(traces, ks=[0], split_seeds=[0, 1, 2])
    assert set(curve["split_seed"]) == {0, 1, 2} and (curve["n_clusters"] == 12).all()
    summary = over_splits(curve).set_index("control")
    assert (summary["splits"] == 3).all() and (summary["n_samples"] == 36).all()
    assert summary.loc["held-out", "first"] > 0.9  # planted relation
    assert summary.loc["shuffled, same step", "first"] < 0.5  # fitted and scored on unrelated pairs
    assert (summary["first_low"] <= summary["first"]).all() and (summary["first"] <= summary["first_high"]).all()
    gap = paired_over_splits(curve, "held-out", "shuffled, same step").iloc[0]
    assert gap["low"] > 0 and gap["p"] < 0.05 and gap["splits"] == 3


def test_the_shuffled_control_never_pairs_a_row_with_its_own_layout():
    y = np.arange(6)[:, None].astype(float)
    groups = np.array([0, 0, 1, 1, 2, 2])  # three samples of two steps; samples 0 and 1 share a layout
    clusters = np.array(["a", "a", "a", "a", "b", "b"])
    for seed in range(5):
        shuffled = shuffle_across_samples(y, groups, seed=seed, same_step=True, clusters=clusters)
        assert shuffled[:4, 0].tolist() == [4, 5, 4, 5] and set(shuffled[4:, 0].tolist()) <= {0, 1, 2, 3}


def test_residualising_removes_a_depth_only_signal():
    """Hidden states and scores that share only the needle's depth (a smooth function of it), nothing per step:
    raw held-out CCA sees it, and regressing depth out removes it."""
    from dynheads_tl.analysis.correlation import residualised_cca

    rng = np.random.default_rng(4)
    traces = positional_traces(n_samples=60, steps=6)
    direction_x, direction_y = rng.normal(size=D_MODEL) * 4, rng.normal(size=N_LAYERS * N_HEADS) * 4
    for i, trace in enumerate(traces):
        depth = (i // 2 + 0.5) / 30  # 30 layouts x 2 needles
        trace.meta = niah_meta(round(depth, 4), seed=i % 2)
        trace.hidden = torch.tensor(rng.normal(size=(6, D_MODEL)) + depth * direction_x, dtype=torch.float32)
        trace.support_score = torch.tensor(rng.normal(size=(6, N_LAYERS * N_HEADS)) + depth * direction_y,
                                           dtype=torch.float32).reshape(6, N_LAYERS, N_HEADS)
    table = residualised_cca(traces, [0], [0, 1, 2])
    assert _mean_first(table, "held-out") > 0.5
    assert _mean_first(table, "held-out, residualised") < 0.35


# --- the token generated at n + k: residualised out, and known to the prior ------------------------------------
def generated_token_traces(n_samples=40, steps=12, k=1, seed=0, vocabulary=(10, 11, 12, 13)):
    """Traces whose scores at step n + k and Eq. 1 set at that step are a function of the token generated at n + k
    only, and whose hidden state at n encodes that token (h_n "knows the next token" and nothing else): a prompt of
    the vocabulary's tokens, all evidence; head (0, j) points at token j's position at every step, so it is an
    Eq. 1 head exactly when token j is generated; the other heads point at the BOS position outside the evidence."""
    rng = np.random.default_rng(seed)
    embed = rng.normal(size=(len(vocabulary), D_MODEL)) * 2
    effect = rng.normal(size=(len(vocabulary), N_LAYERS * N_HEADS)) * 2
    prompt = [1, *vocabulary]
    argmax = torch.zeros(steps, N_LAYERS, N_HEADS, dtype=torch.long)
    argmax[:, 0, : len(vocabulary)] = torch.arange(1, len(vocabulary) + 1)
    traces = []
    for _ in range(n_samples):
        index = rng.integers(0, len(vocabulary), size=steps)
        ahead = np.concatenate([index[k:], rng.integers(0, len(vocabulary), size=k)])  # the token generated at n + k
        hidden = embed[ahead] + 0.3 * rng.normal(size=(steps, D_MODEL))
        scores = effect[index] + 0.3 * rng.normal(size=(steps, N_LAYERS * N_HEADS))
        traces.append(make_trace(torch.tensor([vocabulary[i] for i in index]), argmax,
                                 torch.tensor(scores, dtype=torch.float32).reshape(steps, N_LAYERS, N_HEADS),
                                 hidden=torch.tensor(hidden, dtype=torch.float32), layers=N_LAYERS, heads=N_HEADS,
                                 prompt_ids=torch.tensor(prompt), evidence_spans=[(1, len(prompt))]))
    return traces


def test_pair_covariates_give_the_token_generated_at_n_plus_k():
    from dynheads_tl.analysis.correlation import pair_covariates

    traces = generated_token_traces(n_samples=2, steps=5, k=2)
    covariates = pair_covariates(traces, 2)
    assert covariates.generated_tokens.tolist() == traces[0].tokens[2:].tolist() + traces[1].tokens[2:].tolist()
    assert covariates.target_tokens[:3].tolist() == traces[0].tokens[1:4].tolist()  # read at n + 2: generated at n + 1


def test_residualising_the_generated_token_removes_a_gain_that_is_the_next_token_only():
    """The scores at n + 1 depend on the token generated at n + 1 alone, which h_n encodes: with the tokens read
    only regressed out the held-out CCA stays far above chance; with the generated token regressed out too the
    gain goes to about 0, and the share removed is about all of it."""
    from dynheads_tl.analysis.correlation import generated_token_share, residualised_cca

    table = residualised_cca(generated_token_traces(), [1], [0, 1, 2])
    assert _mean_first(table, "held-out, residualised (tokens read only)") > 0.8
    assert abs(_mean_first(table, "held-out, residualised") - _mean_first(table, "held-out, residualised, chance")) < 0.2
    share = generated_token_share(table).set_index("k").loc[1]
    assert share["gain_read_only"] > 0.5 and abs(share["gain_with_generated"]) < 0.2
    assert share["removed_low"] > 0.3 and 0.7 < share["share_removed"] < 1.3 and share["splits"] == 3
    from dynheads_tl.claims.correlation import generated_token_sentence

    text = generated_token_sentence(table, "NIAH")
    assert text.startswith("NIAH, how much of the residualised held-out CCA's gain") and "k = 1: gain over chance +" in text
    assert "n = 3 splits by layout" in text


def test_the_step_and_token_prior_knows_the_generated_token():
    """Eq. 1 sets at n + 1 that are a function of the token generated at n + 1 only: the step-and-token prior
    predicts them (F1 about 1), the step-aware prior cannot, and the probe (h_n encodes that token) gains nothing
    over the prior that knows it."""
    traces = generated_token_traces(n_samples=45)
    table = probe_table(traces, "classification", ProbeConfig(hidden=[32], epochs=30, lr=3e-3), k=1,
                        linear_probe=False).set_index("predictor")
    assert table.loc["step-and-token prior", "f1"] > 0.95
    assert table.loc["step-aware prior", "f1"] < 0.7
    assert table.loc["MLP probe", "f1"] - table.loc["step-and-token prior", "f1"] < 0.05
    from dynheads_tl.analysis.correlation import lead_differences, lead_probe_table

    lead = lead_probe_table(traces, "classification", ProbeConfig(hidden=[8], epochs=2), ks=[1], split_seeds=[0, 1])
    differences = lead_differences(lead, "f1").set_index("k").loc[1]
    assert "vs_token_prior" in differences and differences["vs_token_prior"] < differences["vs_step_prior"]
    from dynheads_tl.claims.correlation import lag_tests

    tests = lag_tests(lead_differences(lead, "f1"), pd.DataFrame(), n_splits=2)
    assert (tests["baseline"] == "step-and-token prior").all()
    assert tests.loc[0, "difference"] == pytest.approx(differences["vs_token_prior"])


def test_lead_probes_are_cached_units_keyed_by_their_pairs(tmp_path, monkeypatch):
    """With ``cache``, a second call trains no probe and returns the same rows (every column, every dtype); traces
    that differ in one target compute their own; without ``cache`` nothing is written. The progress line counts the
    units computed, not those read back."""
    from dynheads_tl.analysis import probes
    from dynheads_tl.analysis.correlation import lead_probe_table

    monkeypatch.setenv("DYNHEADS_CACHE", str(tmp_path))
    log = tmp_path / "progress.log"
    monkeypatch.setenv("DYNHEADS_PROGRESS", "file")
    monkeypatch.setenv("DYNHEADS_PROGRESS_FILE", str(log))
    traces = synthetic_traces(n_samples=24, steps=12, lag=1)
    config = ProbeConfig(hidden=[8], epochs=2)
    run = lambda traces, cache=True: lead_probe_table(traces, "regression", config, ks=[0, 1, 30], split_seeds=[0, 1],
                                                      linear_ks=[0], cache=cache, progress_desc="probes")
    lines = lambda: log.read_text().splitlines() if log.exists() else []
    first = run(traces)
    assert set(first["k"]) == {0, 1}  # k = 30: no pairs, no rows (and that, too, is read back)
    assert len(list((tmp_path / "results").glob("*.json"))) == 6
    assert lines()[0] == "probes: 6 to compute" and lines()[-1].startswith("probes: 6/6 done in ")
    log.unlink()
    trained = []
    real = probes.probe_table
    monkeypatch.setattr(probes, "probe_table", lambda *a, **kw: trained.append(kw["k"]) or real(*a, **kw))
    pd.testing.assert_frame_equal(run(traces), first)
    assert trained == [] and lines() == []  # everything read back: nothing to report
    changed = list(traces)
    changed[0] = dataclasses.replace(traces[0], support_score=traces[0].support_score + 1.0)
    run(changed)
    assert sorted(set(trained)) == [0, 1] and len(trained) == 4
    assert lines()[0] == "probes: 4 to compute"  # k = 30's two units have the same (empty) pairs: read back
    empty = tmp_path / "none"
    monkeypatch.setenv("DYNHEADS_CACHE", str(empty))
    run(traces, cache=False)
    assert not empty.exists()


# --- the declared status rules of claim 3's index rows, on hand-built numbers ------------------------------------
_CCA_RULE = {"cca_sesoi": 0.05, "synthetic_cap": "weaker", "headroom_f1_floor": 0.3, "eq2_placebo_ratio_floor": 2.0}


def _cca_tests(differences, p=0.001):
    """Held-out minus the same-step shuffle at k = 0, 1, ...: each difference with a ±0.02 interval and raw p."""
    return pd.DataFrame([{"k": k, "a": "held-out", "b": "shuffled, same step", "difference": d, "low": d - 0.02,
                          "high": d + 0.02, "p": p if abs(d) > 0.02 else 0.5, "splits": 5}
                         for k, d in enumerate(differences)])


def _curve(values):
    return pd.DataFrame([{"k": k, "first": v, "first_low": v - 0.01, "first_high": v + 0.01, "splits": 5}
                         for k, v in enumerate(values)])


def test_cca_rule_lets_only_lags_ahead_decide_predicts():
    from dynheads_tl.claims.correlation.rules import cca_rule

    falling, flat = _curve([0.95, 0.9, 0.8, 0.7]), _curve([0.95, 0.9, 0.9, 0.9])
    verdict = lambda diffs, curve=falling, p=0.001: cca_rule(_cca_tests(diffs, p), curve, _CCA_RULE, alpha=0.05)[0]
    assert verdict([0.3, 0.2, 0.2, 0.1]) == "reproduced"  # above at every k >= 1, and the curve falls
    assert verdict([0.3, 0.2, 0.2, 0.1], flat) == "weaker"  # ... without the decline
    assert verdict([0.3, 0.2, 0.0, 0.0]) == "weaker"  # above at some lag ahead
    # above at k = 0 only: concurrent, nothing ahead (the SmolLM2 run's Fig 4)
    assert verdict([0.03, 0.0, 0.0, 0.0]) == "absent in this setting"
    assert verdict([0.0, 0.0, 0.0, 0.0]) == "not reproduced"  # k = 1 interval [-0.02, 0.02] below 0.05
    assert verdict([0.0, 0.04, 0.0, 0.0], p=0.5) == "undetermined"  # k = 1 interval reaches 0.06: cannot say
    assert verdict([-0.3, -0.2, -0.2, -0.2]) == "not reproduced"  # the shuffle above at every lag
    # the decline half missing: at most weaker
    assert verdict([0.3, 0.2, 0.2, 0.1], None) == "weaker"


def test_cca_rule_gates_fig8_on_headroom_and_synthetic_data():
    from dynheads_tl.claims.correlation.rules import cca_rule

    tests, curve = _cca_tests([0.3, 0.2, 0.2, 0.1]), _curve([0.95, 0.9, 0.8, 0.7])
    run = lambda **kw: cca_rule(tests, curve, _CCA_RULE, alpha=0.05, **kw)[0]
    assert run(headroom={"f1": 0.6, "eq2_ratio": 3.0}) == "reproduced"
    assert run(headroom={"f1": 0.14, "eq2_ratio": 3.0}) == "no headroom"  # the model does not solve the task
    assert run(headroom={"f1": 0.6, "eq2_ratio": 1.47}) == "no headroom"  # Eq. 2 barely above placebo spans
    assert run(headroom={"f1": 0.6, "eq2_ratio": 3.0}, synthetic=True) == "weaker"  # synthetic: at most weaker
    assert run(headroom={}) == "weaker"  # the headroom data missing: never silently reproduced


def _lead_rows(differences, p=0.001, prefix="vs_step_prior", ks=(0, 1, 2, 3)):
    return pd.DataFrame([{"k": k, "metric": "f1", "splits": 5, prefix: d, f"{prefix}_low": d - 0.005,
                          f"{prefix}_high": d + 0.005, f"{prefix}_p": p if abs(d) > 0.005 else 0.6}
                         for k, d in zip(ks, differences)])


_TABLE2_RULE = {"paper_range": {"f1": [0.8038, 0.8566]}}


def test_probe_rule_reads_the_primary_lag_and_the_paper_range():
    from dynheads_tl.claims.correlation.rules import probe_rule

    verdict = lambda rows, ours=0.83: probe_rule(rows, ours, "f1", _TABLE2_RULE, sesoi=0.02, alpha=0.05)[0]
    token = lambda diffs, **kw: _lead_rows(diffs, prefix="vs_step_token_prior", **kw)
    assert verdict(token([0.06, 0.03, 0.0, 0.0])) == "reproduced"
    assert verdict(token([0.06, 0.03, 0.0, 0.0]), ours=0.60) == "weaker"  # F1 more than 0.05 below the range
    assert verdict(token([0.06, 0.0, 0.0, 0.0])) == "weaker"  # beats the prior at k = 0 only: concurrent
    assert verdict(token([0.0, 0.0, 0.0, 0.0])) == "not reproduced"  # k = 1 interval below the sesoi 0.02
    assert verdict(token([0.0, 0.02, 0.0, 0.0], p=0.5)) == "undetermined"
    # against the step-aware prior only (the declared step-and-token prior missing): at most weaker
    assert verdict(_lead_rows([0.06, 0.03, 0.0, 0.0])) == "weaker"
    # Table 3: R² at or below 0 is not reproduced whatever the lags say
    assert probe_rule(token([0.06, 0.03, 0.0, 0.0]), -0.6, "r2", {"paper_range": {"r2": [0.72, 0.81]}},
                      sesoi=0.02, alpha=0.05)[0] == "not reproduced"


def test_lead_rule_supports_on_the_primary_alone_and_tost_for_not_supported():
    from dynheads_tl.claims.correlation.rules import lead_rule

    verdict = lambda rows: lead_rule(rows, sesoi=0.02, alpha=0.05)[0]
    token = lambda diffs, **kw: _lead_rows(diffs, prefix="vs_step_token_prior", **kw)
    assert verdict(token([0.06, 0.03, 0.0, 0.0])) == "supported"
    # the primary separated but below the smallest effect of interest, another lag ahead above: partly supported
    assert verdict(token([0.06, 0.012, 0.03, 0.0])) == "partly supported"
    assert verdict(token([0.06, 0.0, 0.0, 0.0])) == "not supported"  # k = 1 within ±0.02 (TOST on its interval)
    assert verdict(token([0.06, 0.018, 0.0, 0.0], p=0.5)) == "undetermined"  # [0.013, 0.023]: reaches the margin
    # the primary separated but below the smallest effect of interest and no other lag ahead: the declared rule
    # names no status for it, so undetermined (not partly supported)
    assert verdict(token([0.06, 0.018, 0.0, 0.0])) == "undetermined"
    assert verdict(_lead_rows([0.06, 0.03, 0.0, 0.0])) == "partly supported"  # the step-aware prior only


def test_residualised_rule_reads_k1_and_needs_the_generated_token():
    from dynheads_tl.claims.correlation.rules import residualised_rule

    def frame(value, chance, control="held-out, residualised"):
        rows = []
        for k in (0, 1):
            rows += [{"k": k, "control": control, "first": value, "first_low": value - 0.1, "first_high": value + 0.1},
                     {"k": k, "control": f"{control}, chance", "first": chance, "first_low": chance - 0.1,
                      "first_high": chance + 0.1}]
        return pd.DataFrame(rows)

    generated = "held-out, residualised with the generated token"
    assert residualised_rule(frame(0.5, 0.0, generated))[0] == "supported"
    # overlapping intervals cannot be told apart: undetermined (deviation of 2026-12-05), not "not supported"
    assert residualised_rule(frame(0.15, 0.0, generated))[0] == "undetermined"
    assert residualised_rule(frame(0.0, 0.0, generated), sesoi=0.2)[0] == "not supported"  # upper bound < chance + sesoi
    assert residualised_rule(frame(0.5, 0.0))[0] == "partly supported"  # generated token not regressed out
    assert residualised_rule(frame(0.5, 0.0))[1]["k"] == 1
    # a run that also writes the tokens-read-only control regressed the generated token out of the main one
    from dynheads_tl.analysis.cca import READ_TOKENS_ONLY

    both = pd.concat([frame(0.5, 0.0), frame(0.9, 0.0, READ_TOKENS_ONLY)], ignore_index=True)
    assert residualised_rule(both)[0] == "supported" and residualised_rule(both)[1]["generated"]


def test_the_primary_lag_is_tested_alone_and_the_other_lags_holm_corrected():
    from dynheads_tl.claims.correlation.pipeline import lag_tests

    rows = lambda ps: pd.DataFrame([{"k": k, "metric": "f1", "vs_step_prior": 0.03, "vs_step_prior_low": 0.01,
                                     "vs_step_prior_high": 0.05, "vs_step_prior_p": p, "splits": 5}
                                    for k, p in zip((0, 1, 2, 3), ps)])
    table = lag_tests(rows([0.01, 0.03, 0.02, 0.04]), pd.DataFrame(), n_splits=5).set_index("k")
    # k = 1 is the primary: its own p 0.03, separated at 0.05; inside Holm over four it would be 0.06 or more
    assert table.loc[1, "primary"] and table.loc[1, "p_adjusted"] == pytest.approx(0.03) and table.loc[1, "separated"]
    # the three secondaries: Holm over 0.01, 0.02, 0.04 -> 0.03, 0.04, 0.04
    assert table.loc[[0, 2, 3], "p_adjusted"].tolist() == pytest.approx([0.03, 0.04, 0.04])


# --- claim 3's lag-1 probe as claim 2's predictor of the next step's heads -----------------------------------
def _lag_one_traces(n: int = 12, steps: int = 6, heads: int = 4) -> list:
    """Traces whose hidden state at step n names (one-hot) the head whose Eq. 2 score is high at step n + 1: a
    known answer for a lag-1 regression probe."""
    rng = np.random.default_rng(0)
    traces = []
    for _ in range(n):
        chosen = rng.integers(0, heads, steps)
        hidden = torch.nn.functional.one_hot(torch.as_tensor(chosen), heads).float()
        support = torch.zeros(steps, 1, heads)
        support[1:, 0] = 0.1 + 0.8 * hidden[:-1]  # step n + 1's scores follow hidden[n]
        traces.append(make_trace([5] * steps, support_score=support, hidden=hidden, layers=1, heads=heads))
    return traces


def test_next_step_probe_learns_the_lag_one_head_and_is_cached(tmp_path, monkeypatch):
    """On traces where hidden[n] names step n + 1's head, the lag-1 probe ranks that head first; trained twice it
    has the same weights (seeded), the second time read back from the cache; a single-step calibration gives none."""
    from dynheads_tl.analysis.head_probe import next_step_probe
    from dynheads_tl.analysis.probes import ProbeConfig

    monkeypatch.setenv("DYNHEADS_CACHE", str(tmp_path))
    traces = _lag_one_traces()
    config = ProbeConfig(hidden=[16], epochs=80, batch_size=16, lr=1e-2, seed=1)
    probe = next_step_probe(traces, "regression", config)
    for head in range(4):
        scores = probe(torch.nn.functional.one_hot(torch.tensor(head), 4).float())
        assert scores.shape == (1, 4) and int(scores.flatten().argmax()) == head
    assert len(list((tmp_path / "probes").glob("*.pt"))) == 1
    again = next_step_probe(traces, "regression", config)  # read back
    assert again.digest == probe.digest
    fresh = next_step_probe(traces, "regression", config, use_cache=False)
    assert fresh.digest == probe.digest, "deterministic under its seed"
    other = next_step_probe(traces, "regression", ProbeConfig(hidden=[16], epochs=80, batch_size=16, lr=1e-2, seed=2))
    assert other.digest != probe.digest and len(list((tmp_path / "probes").glob("*.pt"))) == 2
    for cached in (tmp_path / "probes").glob("*.pt"):
        cached.write_bytes(b"truncated")
    healed = next_step_probe(traces, "regression", config)  # an unreadable entry is set aside and retrained
    assert healed.digest == probe.digest and len(list((tmp_path / "probes").glob("*.pt.corrupt"))) == 1
    assert next_step_probe([make_trace([5])], "classification", config) is None, "no pair to learn from"
    with pytest.raises(ValueError, match="task must be 'classification' or 'regression'"):
        next_step_probe(traces, "ranking", config)
