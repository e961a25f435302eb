"""CCA and probes on synthetic data with known answers."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from dynheads_tl import Trace
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
        traces.append(Trace(
            tokens=torch.full((steps,), 5), argmax_pos=argmax,
            support_score=torch.tensor(scores, dtype=torch.float32).reshape(steps, N_LAYERS, N_HEADS),
            hidden=torch.tensor(hidden, dtype=torch.float32), prompt_ids=torch.tensor([5, 5, 7, 9]),
            evidence_spans=[(0, 2)], task="niah", answers=["x"], response="x"))
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
    assert set(curve["control"]) == {"in-sample", "held-out", "shuffled", "shuffled, same step"}


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
