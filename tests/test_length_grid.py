"""Notebook 07 (the length x depth grid): the slope test and its BCa interval on data with a known answer, the
per-length status rules on hand-built rows, Table 1's per-length quantities on hand-built traces, and the config's
checks before any model work."""
from __future__ import annotations

import dataclasses
import json
import signal
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats

from dynheads_tl import preregistration
from dynheads_tl.claims import length_grid
from dynheads_tl.claims.length_grid import (LengthGridConfig, fig2_status, holm_family, primary_units, sample_table,
                                            slope_reading, slope_test, table1_by_length, table1_status, trend_table)
from dynheads_tl.claims.length_grid.pipeline import StaticSets, cluster_bca, prefill_share

from factories import make_trace

pytestmark = pytest.mark.unit


def _units(slope: float, noise: float, *, lengths=(1000, 2000, 4000), per_length: int = 12, seed: int = 0):
    rng = np.random.default_rng(seed)
    rows = []
    for length in lengths:
        for j in range(per_length):
            rows.append({"length": length, "layout": f"{length}|{j}",
                         "value": 0.4 + slope * np.log2(length / 1000) + noise * rng.standard_normal()})
    return pd.DataFrame(rows)


# --- the slope test ---------------------------------------------------------------------------------------------
def test_a_clear_slope_is_found_with_its_size_and_an_interval_that_excludes_zero():
    frame = _units(0.1, 0.02)
    result = slope_test(frame["value"], frame["length"], frame["layout"], n_resamples=1000)
    assert result.estimate == pytest.approx(0.1, abs=0.02)
    assert 0 < result.low < result.estimate < result.high
    assert result.p < 0.01  # its floor is set by the resamples (no draw at or below 0 of 1000)
    assert result.layouts == 36 and result.lengths == 3 and not result.degenerate
    assert slope_reading(result, result.p, sesoi=0.02) == "increases"


def test_a_flat_measure_reads_flat_within_the_sesoi_by_tost_and_noise_alone_is_undetermined():
    flat = _units(0.0, 0.01)
    result = slope_test(flat["value"], flat["length"], flat["layout"], n_resamples=1000)
    assert -0.02 < result.tost_low and result.tost_high < 0.02
    assert slope_reading(result, result.p, sesoi=0.02) == "flat within the sesoi"
    # The same wide spread at every length: the slope is exactly 0 and its interval is wide
    spread = np.random.default_rng(2).normal(0, 0.5, 6)
    noisy = pd.DataFrame([{"length": length, "layout": f"{length}|{j}", "value": value}
                          for length in (1000, 2000, 4000) for j, value in enumerate(spread)])
    result = slope_test(noisy["value"], noisy["length"], noisy["layout"], n_resamples=1000)
    assert result.estimate == pytest.approx(0.0, abs=1e-12)
    assert result.low < 0 < result.high and result.tost_high - result.tost_low > 0.04
    assert slope_reading(result, result.p, sesoi=0.02) == "undetermined"


def test_the_p_value_agrees_with_the_interval():
    # p < 0.05 exactly when the 95% BCa interval excludes 0: both come from the same corrected percentiles
    for seed in range(6):
        frame = _units(0.03, 0.08, per_length=6, seed=seed)
        result = slope_test(frame["value"], frame["length"], frame["layout"], n_resamples=1000, seed=seed)
        assert (result.p < 0.05) == (result.low > 0 or result.high < 0), seed


def test_layouts_are_resampled_whole_and_within_their_length():
    # Two samples per layout with identical values: the slope and interval equal those of one sample per layout
    frame = _units(0.05, 0.05, per_length=8)
    doubled = pd.concat([frame, frame], ignore_index=True)
    one = slope_test(frame["value"], frame["length"], frame["layout"], n_resamples=500, seed=3)
    two = slope_test(doubled["value"], doubled["length"], doubled["layout"], n_resamples=500, seed=3)
    assert two.estimate == pytest.approx(one.estimate)
    assert two.layouts == one.layouts == 24 and two.n == 48
    assert (two.low, two.high) == pytest.approx((one.low, one.high), abs=1e-9)


def test_a_length_with_one_layout_or_a_single_length_is_not_tested():
    frame = _units(0.1, 0.02, per_length=1)
    result = slope_test(frame["value"], frame["length"], frame["layout"])
    assert result.low != result.low and slope_reading(result, float("nan"), 0.02) == "not tested"
    single = _units(0.1, 0.02, lengths=(1000,))
    assert slope_test(single["value"], single["length"], single["layout"]).estimate != \
        slope_test(single["value"], single["length"], single["layout"]).estimate  # NaN: no slope with one length


def test_identical_resamples_give_a_degenerate_interval_said_as_such():
    frame = _units(0.1, 0.0)
    result = slope_test(frame["value"], frame["length"], frame["layout"], n_resamples=200)
    assert result.degenerate and result.low == result.high == pytest.approx(0.1)


def test_mismatched_inputs_are_refused_with_a_sentence():
    with pytest.raises(ValueError, match="one length and one layout per value"):
        slope_test([0.1, 0.2], [1000], ["a", "b"])


def test_bca_matches_scipy_on_a_mean_of_independent_units():
    rng = np.random.default_rng(1)
    data = rng.exponential(1.0, 40)  # skewed: BCa differs from the percentile interval
    value, low, high, degenerate = cluster_bca(len(data), np.arange(len(data)), lambda i: float(data[i].mean()),
                                               n_resamples=4000, seed=0)
    reference = stats.bootstrap((data,), np.mean, n_resamples=4000, method="BCa", random_state=0).confidence_interval
    assert value == pytest.approx(data.mean()) and not degenerate
    assert low == pytest.approx(reference.low, abs=0.05) and high == pytest.approx(reference.high, abs=0.05)


def test_holm_leaves_a_missing_primary_out_of_the_family():
    assert holm_family([0.01, float("nan"), 0.04]) == pytest.approx([0.02, float("nan"), 0.04], nan_ok=True)


def test_trend_table_reads_the_declared_primaries_and_their_sesoi_from_the_file():
    section = preregistration.lengths()
    units = {"rotation_vs_length": _units(-0.1, 0.02), "outside_vs_length": _units(0.0, 0.005)}
    table = trend_table(units, n_resamples=500)
    assert table["primary"].tolist() == [p["id"] for p in section["primaries"]]
    assert table["sesoi"].tolist() == [float(p["sesoi"]) for p in section["primaries"]]
    readings = dict(zip(table["primary"], table["reading"]))
    assert readings == {"rotation_vs_length": "decreases", "outside_vs_length": "flat within the sesoi",
                        "irreplaceability_vs_length": "not tested"}
    # Holm over the two computed: the smaller p doubled
    computed = table.dropna(subset=["p"])
    assert computed["p_holm"].min() == pytest.approx(min(1.0, 2 * computed["p"].min()))
    sentence = length_grid.trend_verdict(table, "tiny-model", "prose")
    assert "decreases with length" in sentence and "tiny-model" in sentence and "1,000, 2,000, 4,000" in sentence
    assert "not tested (the fair masking pair was not run)" in sentence
    assert "easy control" in length_grid.trend_verdict(table, "tiny-model", "filler")


# --- per-length statuses by the declared rules ------------------------------------------------------------------
def _table1_rows(adjacent, wu, query):
    return pd.DataFrame([{"metric": m, "value": (lo + hi) / 2, "low": lo, "high": hi}
                         for m, (lo, hi) in (("jaccard_adjacent", adjacent), ("share_outside_wu", wu),
                                             ("share_outside_query_focused", query))])


@pytest.mark.parametrize("adjacent, wu, query, expected", [
    ((0.30, 0.45), (0.01, 0.05), (0.02, 0.08), "absent in this setting"),
    ((0.30, 0.45), (0.15, 0.30), (0.20, 0.40), "reproduced"),
    ((0.30, 0.45), (0.01, 0.05), (0.20, 0.40), "weaker"),
    ((0.60, 0.70), (0.15, 0.30), (0.20, 0.40), "weaker"),
    ((0.60, 0.70), (0.01, 0.05), (0.05, 0.12), "not reproduced"),
    ((0.50, 0.60), (0.05, 0.20), (0.05, 0.20), "undetermined"),
])
def test_table1_status_follows_the_declared_rule(adjacent, wu, query, expected):
    assert table1_status(_table1_rows(adjacent, wu, query)) == expected


def _fig2_rows(none=(0.9, 0.7, 1.0), static=(0.9, 0.7, 1.0), accuracy=None, tf=None, fair=None):
    rows = [{"comparison": "accuracy_none", "value": none[0], "low": none[1], "high": none[2], "sign_p": None},
            {"comparison": "accuracy_static_matched", "value": static[0], "low": static[1], "high": static[2],
             "sign_p": None}]
    for name, spec in (("accuracy_dynamic_vs_static", accuracy), ("tf_drop_dynamic_vs_static", tf),
                       ("tf_drop_previous_vs_static", fair)):
        if spec is not None:
            rows.append({"comparison": name, "value": spec[0], "low": spec[1], "high": spec[2], "sign_p": spec[3]})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("rows, expected", [
    (_fig2_rows(none=(0.2, 0.05, 0.4)), "no headroom"),
    (_fig2_rows(accuracy=(0.4, 0.2, 0.6, 0.001)), "not reproduced"),
    (_fig2_rows(static=(0.0, 0.0, 0.1), accuracy=(0.0, 0.0, 0.0, 1.0), tf=(0.3, 0.1, 0.5, 0.001)),
     "absent in this setting"),
    (_fig2_rows(accuracy=(-0.6, -0.8, -0.4, 0.001), tf=(0.5, 0.3, 0.7, 0.001), fair=(0.3, 0.15, 0.45, 0.01)),
     "reproduced"),
    (_fig2_rows(accuracy=(-0.6, -0.8, -0.4, 0.001), tf=(0.5, 0.3, 0.7, 0.001)), "weaker"),
    (_fig2_rows(accuracy=(0.0, -0.1, 0.1, 1.0), tf=(0.5, 0.3, 0.7, 0.001), fair=(0.3, 0.15, 0.45, 0.01)),
     "weaker"),
    (_fig2_rows(accuracy=(-0.1, -0.3, 0.1, 0.5), tf=(0.05, -0.1, 0.2, 0.4)), "undetermined"),
    # a separated interval without a significant sign test is not separated
    (_fig2_rows(accuracy=(-0.6, -0.8, -0.4, 0.2), tf=(0.5, 0.3, 0.7, 0.2), fair=(0.3, 0.15, 0.45, 0.2)),
     "undetermined"),
])
def test_fig2_status_follows_the_declared_rule(rows, expected):
    assert fig2_status(rows) == expected


# --- claim 1 per length on hand-built traces ---------------------------------------------------------------------
def _trace(mask):
    """A trace whose Eq. 1 sets are ``mask`` [step, layer, head]: every generated token is the needle's token 11 at
    prompt position 1, and a head hits exactly where its top-1 source is that position."""
    mask = torch.as_tensor(mask, dtype=torch.bool)
    return make_trace([11] * mask.shape[0], argmax_pos=mask.long(), answers=["x"], response="x")


def test_table1_by_length_pools_each_length_and_counts_outside_each_static_set():
    # 2 layers x 2 heads; Wu's static top-1 is head (0, 0), the query-focused one head (1, 1)
    statics = StaticSets(wu_scores=torch.tensor([[1.0, 0.0], [0.0, 0.0]]),
                         query_scores=torch.tensor([[0.0, 0.0], [0.0, 1.0]]), k=1, wu_filter="test",
                         n_calibration=1, n_kept=1)
    short = [[[1, 0], [0, 0]], [[1, 0], [0, 0]]]  # always (0, 0): adjacent J 1, nothing outside Wu's
    rotating = [[[1, 0], [0, 0]], [[0, 0], [0, 1]]]  # (0, 0) then (1, 1): adjacent J 0, half outside each
    cells = [({"context": 100, "depth": 0.0, "run": 0, "haystack_offset": 0, "layout": "a"}, None),
             ({"context": 100, "depth": 1.0, "run": 0, "haystack_offset": 0, "layout": "b"}, None),
             ({"context": 200, "depth": 0.0, "run": 0, "haystack_offset": 0, "layout": "c"}, None),
             ({"context": 200, "depth": 1.0, "run": 0, "haystack_offset": 0, "layout": "d"}, None)]
    traces = [_trace(short), _trace(short), _trace(rotating), _trace(rotating)]
    samples = sample_table(cells, traces, statics, static_k=1)
    table = table1_by_length(samples, traces, n_resamples=100).set_index(["length", "metric"])["value"]
    assert table[(100, "jaccard_adjacent")] == 1.0 and table[(200, "jaccard_adjacent")] == 0.0
    assert table[(100, "share_outside_wu")] == 0.0 and table[(200, "share_outside_wu")] == 0.5
    assert table[(100, "share_outside_query_focused")] == 1.0 and table[(200, "share_outside_query_focused")] == 0.5
    assert table[(100, "ever_active")] == 1 and table[(200, "ever_active")] == 2
    assert table[(100, "entropy")] == 0.0 and table[(200, "entropy")] == pytest.approx(np.log(2))
    units = primary_units(samples, None)
    assert units["rotation_vs_length"].sort_values("layout")["value"].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert units["irreplaceability_vs_length"].empty


def test_primary_units_pair_the_fair_conditions_per_sample():
    keys = {"depth": 0.5, "run": 0}
    grid = pd.DataFrame([{"context": 100, "layout": "a", "condition": "previous_step", "tf_drop": 0.6, "tf_drop_t1": 0.5,
                          **keys},
                         {"context": 100, "layout": "a", "condition": "static_previous", "tf_drop": 0.3, "tf_drop_t1": 0.2,
                          **keys},
                         {"context": 100, "layout": "a", "condition": "dynamic", "tf_drop": 0.9, "tf_drop_t1": 0.8, **keys}])
    samples = pd.DataFrame([{"context": 100, "layout": "a", "adjacent_sum": 1.0, "adjacent_pairs": 2.0,
                             "inside_query_focused": 1.0, "activations": 4.0}])
    units = primary_units(samples, grid)
    assert units["irreplaceability_vs_length"]["value"].tolist() == pytest.approx([0.3])
    assert units["outside_vs_length"]["value"].tolist() == [0.75]


def test_prefill_share_counts_the_prefix_rows_of_one_length_share():
    sample = lambda ids: type("S", (), {"prompt_ids": ids})()
    cells = [({"context": 10}, sample([1, 2, 3, 4, 5])), ({"context": 10}, sample([1, 2, 3, 9, 9])),
             ({"context": 20}, sample([1, 2, 3, 4, 5]))]
    share = prefill_share(cells).set_index("length")
    # length 10: 4 + 4 positions, the second reuses 3 of its 4 (positions 0-2); length 20 shares nothing across
    assert share.loc[10, "prompt_positions"] == 8 and share.loc[10, "prefilled"] == 5
    assert share.loc[20, "prefilled"] == 4


# --- the config --------------------------------------------------------------------------------------------------
def test_a_length_past_the_models_window_fails_before_any_model_work():
    with pytest.raises(ValueError, match="lengths"):
        LengthGridConfig.from_params({"lengths": [1000, 9000]})


def test_up_to_context_leaves_out_the_lengths_past_the_window_and_refuses_a_grid_with_none_left():
    # SmolLM2's window is 8,192 tokens: 8,000 fits with the prompt and 40 new tokens, 9,000 does not
    config = LengthGridConfig.from_params({"lengths": [1000, 9000, 8000], "up_to_context": True})
    assert config.grid_lengths() == [1000, 8000] and config.lengths_beyond_window() == [9000]
    assert config.context_lengths() == {"NIAH": [1000, 8000]} and config.context_window() == 8192
    with pytest.raises(ValueError, match=r"up_to_context, at least one length must fit .* 8,192 tokens"):
        LengthGridConfig.from_params({"lengths": [9000, 16000], "up_to_context": True})
    # the long preset: SmolLM2 stops at 8k, Gemma 3 (32,768 tokens) runs every length to 32k
    long = length_grid.CLAIM.preset("long")
    assert LengthGridConfig.from_params(long).lengths_beyond_window() == [16000, 32000]
    gemma = LengthGridConfig.from_params({**long, "model": "gemma-3-270m"})
    assert gemma.grid_lengths() == [1000, 2000, 4000, 8000, 16000, 32000] and not gemma.lengths_beyond_window()


def _masked_grid(accuracy: dict[int, list[int]]) -> pd.DataFrame:
    """A masking grid with the fair pair on every sample: unmasked accuracy as given per length, and a D_{t-1} −
    static drop that grows by 0.1 per doubling."""
    rows = []
    for length, answers in accuracy.items():
        for j, right in enumerate(answers):
            keys = {"context": length, "layout": f"{length}|{j}", "depth": 0.5, "run": j}
            drop = 0.1 * np.log2(length / 1000) + 0.01 * j
            rows += [{**keys, "condition": "none", "accuracy": right, "tf_drop": 0.0, "tf_drop_t1": 0.0},
                     {**keys, "condition": "previous_step", "accuracy": right, "tf_drop": 0.5 + drop,
                      "tf_drop_t1": 0.5 + drop},
                     {**keys, "condition": "static_previous", "accuracy": right, "tf_drop": 0.5, "tf_drop_t1": 0.5}]
    return pd.DataFrame(rows)


def test_a_length_without_headroom_leaves_the_masking_slope_and_is_said_to(tmp_path):
    grid = _masked_grid({1000: [1] * 6, 2000: [1, 1, 1, 0, 0, 0], 4000: [0] * 6, 8000: [1, 0, 0, 0, 0, 0],
                         500: [0, 0, 0]})
    headroom = length_grid.headroom_by_length(length_grid.masking_by_length(grid, n_resamples=50)).set_index("length")
    # Wilson 95% upper bounds: 6/6 and 3/6 clear 0.5, 1/6's 0.56 too; 0/6's is 0.39; 0/3's 0.56 clears the floor,
    # but no answer is right: nothing for masking to take away
    assert headroom["headroom"].to_dict() == {500: False, 1000: True, 2000: True, 4000: False, 8000: True}
    assert headroom.loc[500, "high"] > 0.5 and headroom.loc[4000, "high"] < 0.5
    assert headroom.loc[4000, "n"] == 6 and headroom.loc[8000, "high"] == pytest.approx(0.5635, abs=1e-3)
    samples = pd.DataFrame([{"context": c, "layout": f"{c}|{j}", "adjacent_sum": 1.0, "adjacent_pairs": 2.0,
                             "inside_query_focused": 1.0, "activations": 2.0} for c in (500, 1000, 2000, 4000, 8000)
                            for j in range(6)])
    units = primary_units(samples, grid, headroom.reset_index())
    drop = units["irreplaceability_vs_length"]
    assert sorted(drop.loc[drop["headroom"], "length"].unique()) == [1000, 2000, 8000]
    assert sorted(units["rotation_vs_length"]["length"].unique()) == [500, 1000, 2000, 4000, 8000]
    table = trend_table(units, n_resamples=200, lengths_run=[500, 1000, 2000, 4000, 8000],
                        beyond_window=[16000, 32000], context_window=8192).set_index("primary")
    assert table.loc["irreplaceability_vs_length", "lengths_no_headroom"] == "500 4000"
    assert table.loc["irreplaceability_vs_length", "lengths"] == "1000 2000 8000"
    assert table.loc["rotation_vs_length", "lengths_no_headroom"] == ""
    assert table.loc["rotation_vs_length", "lengths"] == "500 1000 2000 4000 8000"
    assert table.loc["irreplaceability_vs_length", "slope_per_doubling"] == pytest.approx(0.1, abs=0.01)
    assert (table["lengths_beyond_window"] == "16000 32000").all() and (table["context_window"] == 8192).all()
    # the verdict and the index's Beyond 7 row say both, read from those fields
    verdict = length_grid.trend_verdict(table.reset_index(), "m", "essays")
    assert "500, 4,000 tokens left out: no headroom" in verdict.quote("irreplaceability_vs_length")[0]
    assert verdict.quote("beyond_window") == ["The grid stops at 8,000 tokens: m's context window (8,192 tokens) "
                                              "cannot hold 16,000, 32,000 tokens with the prompt and the answer, so "
                                              "they are left out."]
    table.reset_index().to_csv(tmp_path / "length_trends.csv", index=False)
    headline = length_grid.report._trend_headline(tmp_path)
    assert "no headroom at 500, 4,000 tokens, left out" in headline and "grid stops at 8,000 tokens" in headline
    # a file read without NaNs, or without a window, still reads
    length_grid.window_sentence(pd.read_csv(tmp_path / "length_trends.csv", keep_default_na=False), "m")
    length_grid.window_sentence(table.reset_index().assign(context_window=float("nan")), "m")
    # a length the headroom table does not list (no unmasked answer scored) has no headroom and is said to
    units = primary_units(samples, grid, headroom.reset_index().query("length != 8000"))
    assert "8000" in trend_table(units, n_resamples=50).set_index("primary").loc[
        "irreplaceability_vs_length", "lengths_no_headroom"].split()
    # with no length left with headroom the masking slope is not tested, and the verdict gives that reason; with the
    # fair pair not run, that reason
    none_grid = _masked_grid({1000: [0] * 6, 2000: [0] * 6})
    none = length_grid.headroom_by_length(length_grid.masking_by_length(none_grid, n_resamples=50))
    table = trend_table(primary_units(samples, none_grid, none), n_resamples=200)
    row = table.set_index("primary").loc["irreplaceability_vs_length"]
    assert row["reading"] == "not tested" and row["n_units"] == 0 and row["lengths_no_headroom"] == "1000 2000"
    assert "(no length with headroom)" in length_grid.trend_verdict(table, "m", "essays")
    assert not length_grid.trend_verdict(table, "m", "essays").quote("beyond_window")
    unpaired = none_grid[none_grid["condition"] == "none"]
    unpaired_headroom = length_grid.headroom_by_length(length_grid.masking_by_length(unpaired, n_resamples=50))
    table = trend_table(primary_units(samples, unpaired, unpaired_headroom), n_resamples=50)
    assert table.set_index("primary").loc["irreplaceability_vs_length", "lengths_no_headroom"] == ""
    assert "(the fair masking pair was not run)" in length_grid.trend_verdict(table, "m", "essays")


@pytest.mark.parametrize("params, message", [
    ({"depths": [0.5, 1.5]}, "depths"),
    ({"lengths": [1000, 1000]}, "must not repeat"),
    ({"haystack": "wu:/tmp/x"}, "Wu et al."),
    ({"haystack": "folder:/no/such/folder"}, "does not exist"),
    ({"ablation_mode": "mean"}, "not run on the length grid"),
])
def test_bad_parameters_are_refused_with_a_sentence(params, message):
    with pytest.raises(ValueError, match=message):
        LengthGridConfig.from_params(params)


def test_the_default_and_long_presets_restate_the_declared_grid():
    declared = preregistration.lengths()
    long = length_grid.CLAIM.preset("long")
    assert long["lengths"] == declared["lengths_tokens"] and long["depths"] == declared["depths"]
    default = LengthGridConfig()
    assert set(default.lengths) <= set(declared["lengths_tokens"]) and set(default.depths) <= set(declared["depths"])
    # the grid's real prose is the essays since the real-data deviation (preregistration.yaml, issue 62)
    assert "prose (real text)" in declared["haystack"] and default.haystack == "essays"
    assert any("essays haystack" in entry["what"] for entry in preregistration.deviations())


def test_a_length_with_fewer_layouts_than_the_minimum_is_not_tested_and_says_why():
    units = {"rotation_vs_length": _units(-0.1, 0.02, per_length=length_grid.MIN_LAYOUTS_PER_LENGTH - 1)}
    table = trend_table(units, n_resamples=200)
    assert table.set_index("primary").loc["rotation_vs_length", "reading"] == "not tested"
    assert f"at least {length_grid.MIN_LAYOUTS_PER_LENGTH} layouts each" in length_grid.trend_verdict(table, "m", "prose")


# --- the pipeline on a tiny random model -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_grid(tmp_path_factory):
    import dynheads_tl
    from conftest import build_tiny_model

    folder = build_tiny_model("llama", tmp_path_factory.mktemp("tiny_length_grid") / "llama")
    model = dynheads_tl.load_model(str(folder), device="cpu")
    config = LengthGridConfig(model=str(folder), lengths=[100, 150], depths=[0.0, 0.5, 1.0], runs_per_cell=2,
                              n_calibration=2, max_new_tokens=5, use_cache=False, n_resamples=50, batch_size=16)
    return model, config


def test_the_grid_runs_end_to_end_on_a_tiny_model(tiny_grid):
    model, config = tiny_grid
    assert not length_grid.layer_kinds(model).sliding  # a Llama: full attention on every layer
    cells = length_grid.grid_samples(model, config)
    assert len(cells) == 2 * 3 * 2
    # the depths of one (length, run) share the haystack offset, so their prompts share the text up to the needle
    offsets = {(c["context"], c["run"]): set() for c, _ in cells}
    for cell, _ in cells:
        offsets[(cell["context"], cell["run"])].add(cell["haystack_offset"])
    assert all(len(found) == 1 for found in offsets.values())
    share = prefill_share(cells)
    assert (share["prefilled"] < share["prompt_positions"]).all()
    statics, calibration = length_grid.static_sets(model, config)
    assert len(calibration) == 2 and statics.wu_scores.shape == (model.cfg.n_layers, model.cfg.n_heads)
    traces = length_grid.grid_traces(model, config, cells)
    samples = sample_table(cells, traces, statics, config.static_k)
    assert samples["layout"].nunique() == len(cells)
    table1 = table1_by_length(samples, traces, n_resamples=50)
    assert sorted(table1["length"].unique()) == [100, 150] and len(table1) == 2 * 7
    names, note = length_grid.conditions()
    from dynheads_tl.protocols.conditions import CONDITIONS

    registered = "previous_step" in CONDITIONS and "static_previous" in CONDITIONS
    assert ("previous_step" in names) == ("previous_step" in CONDITIONS)
    assert ("is not made" in note) == (not registered)
    grid = length_grid.masking_grid(model, config, cells, statics, names)
    assert len(grid) == len(cells) * len(names)
    assert {"accuracy", "tf_drop", "response", "layout", "context", "depth"} <= set(grid.columns)
    # unmasked, the two-pass protocol is the plain traced generation: the same answer, no drop
    unmasked = grid[grid["condition"] == "none"].reset_index(drop=True)
    assert unmasked["response"].tolist() == [t.response for t in traces]
    assert (unmasked["tf_drop"].abs() < 1e-5).all()
    by_length = length_grid.masking_by_length(grid, n_resamples=50)
    assert set(by_length["length"]) == {100, 150}
    assert by_length.set_index(["length", "comparison"]).loc[(100, "accuracy_none"), "n"] == 6
    units = primary_units(samples, grid)
    assert set(units["rotation_vs_length"]["length"]) <= {100, 150}
    trends = trend_table(units, n_resamples=50)
    assert len(trends) == 3 and trends["n_layouts"].max() <= 12


def test_the_index_rows_read_their_csvs_and_state_n_and_an_interval(tmp_path):
    import json

    from dynheads_tl.report.status import item_status

    folder = tmp_path / "07_length_grid"
    folder.mkdir()
    table1 = pd.concat([_table1_rows((0.30, 0.45), (0.01, 0.05), (0.02, 0.08)).assign(length=1000),
                        _table1_rows((0.30, 0.45), (0.15, 0.30), (0.20, 0.40)).assign(length=2000)])
    table1.assign(n_layouts=5, n_samples=5, degenerate=False).to_csv(folder / "table1_by_length.csv", index=False)
    (folder / "table1_by_length.config.json").write_text(json.dumps({"haystack": "prose"}))
    fig2 = pd.concat([_fig2_rows(none=(0.2, 0.05, 0.4)).assign(length=1000),
                      _fig2_rows(accuracy=(-0.6, -0.8, -0.4, 0.001), tf=(0.5, 0.3, 0.7, 0.001)).assign(length=2000)])
    fig2.assign(n=5).to_csv(folder / "fig2_by_length.csv", index=False)
    trend_table({"rotation_vs_length": _units(-0.1, 0.02)}, n_resamples=200).to_csv(folder / "length_trends.csv",
                                                                                    index=False)
    table1_row = item_status(tmp_path, "Table 1 by length")
    assert table1_row.status == "reproduced"  # the longest length's
    assert "1,000 tokens: absent in this setting" in table1_row.headline and "n = 5 layouts" in table1_row.headline
    fig2_row = item_status(tmp_path, "Fig 2 by length")
    assert fig2_row.status == "weaker" and "1,000 tokens: no headroom" in fig2_row.headline
    assert "n = 5 samples" in fig2_row.headline and "[" in fig2_row.headline
    trend_row = item_status(tmp_path, "Beyond 7")
    assert trend_row.status == "supported" and "n = 36 layouts" in trend_row.headline
    assert item_status(tmp_path, "Fig 1 by length").status == "qualitative"


def test_verdicts_say_undefined_and_degenerate_values_as_such():
    rows = _table1_rows((0.30, 0.45), (0.01, 0.05), (0.02, 0.08)).assign(length=1000, n_layouts=5, n_samples=5,
                                                                           degenerate=False)
    rows.loc[rows["metric"] == "jaccard_adjacent", ["value", "low", "high"]] = float("nan")
    rows.loc[rows["metric"] == "share_outside_wu", ["value", "low", "high", "degenerate"]] = [0.0, 0.0, 0.0, True]
    text = length_grid.claim1_verdict(rows, "m", "prose")
    assert "adjacent-step Jaccard undefined (no Eq. 1 activation to pool)" in text
    assert "share outside Wu's S_20 every layout at 0.00 (degenerate)" in text
    empty = trend_table({"rotation_vs_length": pd.DataFrame(columns=["length", "layout", "value"])}, n_resamples=50)
    assert "no answer had an Eq. 1 activation" in length_grid.trend_verdict(empty, "m", "prose")


# --- exploratory: global and sliding-window layers (issue 49) -----------------------------------------------------
# A toy 3-layer model, 2 heads per layer: layers 0 and 2 slide with a 4-token window, layer 1 is global.
TOY_KINDS = length_grid.LayerKinds((4, None, 4), 2)


def _window_trace(prompt_len: int, needle_at: int, hits: list[list[tuple[int, int]]]):
    """A trace whose needle is one token (id 7) at ``needle_at``; every step generates 7, and the heads of
    ``hits[t]`` point at the needle at step t (Eq. 1 hits) while the others point at position 0."""
    prompt = list(range(100, 100 + prompt_len))
    prompt[needle_at] = 7
    argmax = torch.zeros(len(hits), 3, 2, dtype=torch.long)
    for step, heads in enumerate(hits):
        for layer, head in heads:
            argmax[step, layer, head] = needle_at
    return make_trace([7] * len(hits), argmax, prompt_ids=prompt, evidence_spans=[(needle_at, needle_at + 1)])


def _toy_grid():
    # query at step t sits at prompt_len - 1 + t; the needle's distance is that minus needle_at
    a = _window_trace(5, 3, [[(0, 0), (1, 0)], [(1, 0), (1, 1), (2, 1)]])  # distances 1, 2
    b = _window_trace(10, 2, [[(1, 1)], [(1, 0), (1, 1)]])  # distances 7, 8: beyond the window
    c = _window_trace(6, 4, [[(0, 1)], []])  # distances 1, 2
    cells = [({"context": 8, "depth": 0.5, "layout": "a"}, None), ({"context": 20, "depth": 0.0, "layout": "b"}, None),
             ({"context": 8, "depth": 1.0, "layout": "c"}, None)]
    return cells, [a, b, c]


def test_layer_kinds_read_back_and_bin_edges_follow_the_window_and_lengths():
    assert TOY_KINDS.sliding and TOY_KINDS.global_layers == [1] and TOY_KINDS.window_sizes == [4]
    assert TOY_KINDS.global_heads().tolist() == [[False, False], [True, True], [False, False]]
    assert TOY_KINDS.global_head_share == pytest.approx(1 / 3)
    assert length_grid.LayerKinds.from_table(TOY_KINDS.table()) == TOY_KINDS
    assert length_grid.distance_edges([1000, 2000], [512]) == [0, 512, 1000, 2000]
    assert not length_grid.LayerKinds((None, None), 3).sliding
    with pytest.raises(ValueError, match="positive number of tokens"):
        length_grid.LayerKinds((0, None), 2)


def test_window_steps_measure_the_needles_distance_from_each_query_row():
    cells, traces = _toy_grid()
    steps = length_grid.window_steps(cells, traces, TOY_KINDS)
    assert steps["distance"].tolist() == [1, 2, 7, 8, 1, 2]
    assert steps["global_heads"].tolist() == [1, 2, 1, 2, 0, 0]
    assert steps["sliding_heads"].tolist() == [1, 1, 0, 0, 1, 0]
    with pytest.raises(ValueError, match="layer kinds"):
        length_grid.window_steps(cells, traces, length_grid.LayerKinds((4, None), 2))


def test_window_shares_pool_each_distance_bin_and_keep_an_empty_bin():
    cells, traces = _toy_grid()
    steps = length_grid.window_steps(cells, traces, TOY_KINDS)
    shares = length_grid.window_shares(steps, TOY_KINDS, [8, 20], n_resamples=200).set_index(["bin", "measure"])
    assert list(dict.fromkeys(b for b, _ in shares.index)) == ["0–3", "4–7", "8–19", "≥20"]
    # bin 0-3 holds a's and c's steps: 3 of 6 activations in layer 1, over 4 steps
    assert shares.loc[("0–3", "share_global"), "value"] == 0.5
    assert shares.loc[("0–3", "heads_per_step"), "value"] == 1.5
    assert shares.loc[("0–3", "share_global"), "n_layouts"] == 2 and shares.loc[("0–3", "share_global"), "n_steps"] == 4
    assert not shares.loc[("0–3", "share_global"), "beyond_window"]
    low, high = shares.loc[("0–3", "share_global"), ["low", "high"]]
    assert low <= 0.5 <= high
    # beyond the window only layer 1 retrieves; one layout per bin gives no interval
    for bin_, per_step in (("4–7", 1.0), ("8–19", 2.0)):
        assert shares.loc[(bin_, "share_global"), "value"] == 1.0 and shares.loc[(bin_, "share_global"), "beyond_window"]
        assert shares.loc[(bin_, "heads_per_step"), "value"] == per_step
        assert np.isnan(shares.loc[(bin_, "share_global"), "low"])
    empty = shares.loc[("≥20", "share_global")]
    assert empty["n_samples"] == 0 and np.isnan(empty["value"])


def test_window_jaccard_restricts_d_t_to_global_and_sliding_heads():
    cells, traces = _toy_grid()
    table = length_grid.window_jaccard(cells, traces, TOY_KINDS, n_resamples=200)
    pooled = table[table["length"] == "all"].set_index("scope")
    # global: a {(1,0)} -> {(1,0),(1,1)} and b the same give J 1/2 each; c has no global pair
    assert pooled.loc["global", "jaccard_adjacent"] == pytest.approx(0.5)
    assert pooled.loc["global", "size_bound"] == pytest.approx(0.5) and pooled.loc["global", "pairs"] == 2
    assert pooled.loc["global", "heads_per_step"] == pytest.approx(1.0) and pooled.loc["global", "heads"] == 2
    # sliding: a {(0,0)} -> {(2,1)} and c {(0,1)} -> {} give J 0; their size bounds are 1 and 0
    assert pooled.loc["sliding", "jaccard_adjacent"] == 0.0 and pooled.loc["sliding", "size_bound"] == pytest.approx(0.5)
    # all heads: a 1/4, b 1/2, c 0
    assert pooled.loc["all", "jaccard_adjacent"] == pytest.approx(0.25)
    assert pooled.loc["all", "size_bound"] == pytest.approx((2 / 3 + 0.5 + 0) / 3)
    per_length = table.set_index(["scope", "length"])
    assert per_length.loc[("global", "8"), "jaccard_adjacent"] == pytest.approx(0.5)
    assert per_length.loc[("global", "20"), "n_layouts"] == 1
    paper = preregistration.item_rule("dynamism", "Table 1")["paper_range_adjacent_jaccard"]
    assert (pooled["paper_low"] == paper[0]).all() and (pooled["paper_high"] == paper[1]).all()
    assert pooled.loc["sliding", "reading"] == "below the paper's range"


@pytest.mark.parametrize("low, high, expected", [(0.6, 0.7, "above the paper's range"),
                                                 (0.1, 0.2, "below the paper's range"),
                                                 (0.3, 0.4, "within the paper's range"),
                                                 (0.2, 0.4, "overlaps the paper's range")])
def test_a_jaccard_interval_is_placed_against_the_papers_range(low, high, expected):
    from dynheads_tl.claims.length_grid.window import _reading

    assert _reading(low, high, (low + high) / 2, (0.2793, 0.5056)) == expected
    assert _reading(float("nan"), float("nan"), float("nan"), (0.2793, 0.5056)) == "undefined"
    assert _reading(float("nan"), float("nan"), 0.4, (0.2793, 0.5056)) == "no interval"  # one layout


def test_window_verdict_states_shares_the_check_and_the_jaccard_and_skips_a_model_without_sliding_layers():
    cells, traces = _toy_grid()
    steps = length_grid.window_steps(cells, traces, TOY_KINDS)
    shares = length_grid.window_shares(steps, TOY_KINDS, [8, 20], n_resamples=200)
    jaccard = length_grid.window_jaccard(cells, traces, TOY_KINDS, n_resamples=200)
    text = length_grid.window_verdict(TOY_KINDS.table(), shares, jaccard, "toy", "prose")
    assert "exploratory and descriptive, not pre-registered; preregistration.yaml, deviation of 2026-12-04" in text
    assert "the 2 heads of the 1 global layer (1; 33% of the heads)" in text and "8, 20 tokens" in text
    assert "inside the 4-token window: at 0–3 tokens from the needle 0.50" in text
    assert "(2 layouts, 2 samples, 6 activations)" in text and "(1 layout)" in text
    assert "among the global heads every layout at 0.50 (degenerate), size bound 0.50 (2 layouts, 2 step pairs)" in text
    assert "every one in global layers, as the window requires" in text
    assert "0.2793–0.5056" in text and "(descriptive, no test)" in text
    # a sliding head that retrieved beyond its window is reported, not hidden
    leaky = [traces[0], _window_trace(10, 2, [[(0, 0)], [(1, 0)]]), traces[2]]
    leaky_shares = length_grid.window_shares(length_grid.window_steps(cells, leaky, TOY_KINDS), TOY_KINDS, [8, 20],
                                             n_resamples=200)
    assert "a sliding head retrieved beyond its window" in length_grid.window_verdict(
        TOY_KINDS.table(), leaky_shares, jaccard, "toy", "prose")
    full = length_grid.LayerKinds((None,) * 30, 9)
    skipped = length_grid.window_verdict(full.table(), None, None, "smollm2-135m-instruct", "prose")
    assert skipped == ("On smollm2-135m-instruct, every one of the 30 layers attends to the whole context (no "
                       "sliding-window layer), so the global vs sliding-window analysis (exploratory) does not apply "
                       "and is skipped.")


def test_the_window_finding_reads_its_csvs_and_the_figure_draws(tmp_path):
    import json

    from dynheads_tl.claims.length_grid.report import _window_finding

    cells, traces = _toy_grid()
    shares = length_grid.window_shares(length_grid.window_steps(cells, traces, TOY_KINDS), TOY_KINDS, [8, 20],
                                       n_resamples=200)
    jaccard = length_grid.window_jaccard(cells, traces, TOY_KINDS, n_resamples=200)
    TOY_KINDS.table().to_csv(tmp_path / "window_layers.csv", index=False)
    (tmp_path / "window_layers.config.json").write_text(json.dumps({"model": "toy", "haystack": "prose"}))
    shares.to_csv(tmp_path / "window_shares.csv", index=False)
    jaccard.to_csv(tmp_path / "window_jaccard.csv", index=False)
    found = _window_finding(tmp_path)
    assert found == length_grid.CLAIM.findings[1].sentences(tmp_path)
    assert len(found) == 3 and found[0].startswith("On toy") and found[1].startswith("Beyond the window")
    assert found[2].startswith("The adjacent-step Jaccard")
    assert " ".join(found) == length_grid.window_verdict(TOY_KINDS.table(), shares, jaccard, "toy", "prose")
    length_grid.LayerKinds((None, None), 2).table().to_csv(tmp_path / "window_layers.csv", index=False)
    assert _window_finding(tmp_path)[0].endswith("does not apply and is skipped.")
    fig = length_grid.window_figure(shares, TOY_KINDS, "toy")
    assert len(fig.axes) == 1
    import matplotlib.pyplot as plt

    plt.close(fig)


# --- the size axis (preregistration.yaml scale:, notebook 07's scale preset) -----------------------------------
def test_the_bound_ratio_reads_nested_sets_as_one_and_disjoint_ones_as_zero():
    from dynheads_tl.analysis.scoring import bound_ratio_counts

    mask = torch.zeros(4, 1, 4, dtype=torch.bool)
    mask[0, 0, :2] = True   # {0, 1}
    mask[1, 0, :1] = True   # {0}: nested in the step before, J = 1/2 = its bound
    mask[2, 0, 2:] = True   # {2, 3}: disjoint, J = 0 below a bound of 1/2
    # step 3 empty: its pair has no bound above 0 and is left out
    assert bound_ratio_counts(mask) == {"pairs": 2.0, "ratio_sum": 1.0}


def test_the_static_share_sizes_the_static_sets_on_every_model_alike():
    config = LengthGridConfig(static_share=0.1)
    assert [config.static_size(n) for n in (270, 72, 336)] == [27, 8, 34]  # the file's static_set sentence
    assert LengthGridConfig().static_size(72) == 20 and LengthGridConfig(static_k=90).static_size(72) == 72
    with pytest.raises(ValueError, match="static_share"):
        LengthGridConfig(static_share=1.5)


_UP, _DOWN = {"a_better": 25, "b_better": 5}, {"a_better": 5, "b_better": 25}  # the sign test's own side


@pytest.mark.parametrize("primary, row, headroom, expected", [
    ("outside_share_static_10pct", {"estimate": 0.3, "low": 0.2, "high": 0.4}, True, "supported"),
    ("outside_share_static_10pct", {"estimate": 0.05, "low": 0.02, "high": 0.08}, True, "not supported"),
    ("outside_share_static_10pct", {"estimate": 0.1, "low": 0.05, "high": 0.15}, True, "undetermined"),
    ("adjacent_jaccard_over_bound", {"estimate": 0.7, "low": 0.6, "high": 0.8}, True, "supported"),
    ("adjacent_jaccard_over_bound", {"estimate": 0.98, "low": 0.96, "high": 0.99}, True, "not supported"),
    ("adjacent_jaccard_over_bound", {"estimate": 0.95, "low": 0.9, "high": 0.99}, True, "undetermined"),
    ("fair_previous_step_vs_static", {"estimate": 0.3, "low": 0.1, "high": 0.5, "p": 0.001, **_UP}, True,
     "supported"),
    ("fair_previous_step_vs_static", {"estimate": 0.1, "low": 0.05, "high": 0.2, "p": 0.001, **_UP}, True,
     "supported"),  # an estimate at the sesoi reaches it
    ("fair_previous_step_vs_static", {"estimate": 0.05, "low": 0.01, "high": 0.09, "p": 0.01, **_UP}, True, "weaker"),
    # most samples drop more under D_{t-1} while one outlier pulls the mean below 0: the test's side decides
    ("fair_previous_step_vs_static", {"estimate": -0.05, "low": -0.3, "high": 0.05, "p": 0.002, **_UP}, True,
     "weaker"),
    # the mean above the sesoi but most samples the other way: significant against the paper, never supported
    ("fair_previous_step_vs_static", {"estimate": 0.4, "low": 0.1, "high": 0.8, "p": 0.0003, **_DOWN}, True,
     "undetermined"),
    ("fair_previous_step_vs_static", {"estimate": -0.2, "low": -0.3, "high": -0.1, "p": 0.001, **_DOWN}, True,
     "not supported"),
    ("fair_previous_step_vs_static", {"estimate": 0.1, "low": -0.1, "high": 0.3, "p": 0.4, **_UP}, True,
     "undetermined"),
    ("predicted_vs_static", {"estimate": 0.3, "low": 0.1, "high": 0.5, "p": 0.001, **_UP}, False, "no headroom"),
    ("probe_k1_vs_step_token_prior", {"estimate": 0.03, "low": 0.01, "high": 0.05, "p": 0.01, "splits": 5}, True,
     "supported"),
    ("probe_k1_vs_step_token_prior", {"estimate": 0.01, "low": 0.005, "high": 0.015, "p": 0.01, "splits": 5}, True,
     "weaker"),
    ("probe_k1_vs_step_token_prior", {"estimate": 0.03, "low": 0.01, "high": 0.05, "p": 0.01, "splits": 4}, True,
     "undetermined"),  # the file asks 5 grouped splits
    ("probe_k1_vs_step_token_prior", {"estimate": 0.0, "low": -0.01, "high": 0.01, "p": 0.9, "splits": 5}, True,
     "not supported"),
    ("probe_k1_vs_step_token_prior", {"estimate": float("nan"), "low": float("nan"), "high": float("nan")}, True,
     "undetermined"),
])
def test_a_models_status_of_each_size_primary_follows_the_declared_rule(primary, row, headroom, expected):
    assert length_grid.primary_status(primary, row, alpha=0.05, headroom=headroom) == expected


def test_the_size_axis_runs_end_to_end_on_a_tiny_model(tiny_grid):
    model, base = tiny_grid
    config = dataclasses.replace(base, lengths=[120], depths=[0.0, 0.5, 1.0], runs_per_cell=2, n_calibration=3,
                                 static_share=0.25, size_axis=True, n_splits=2, probe_epochs=3, probe_hidden=[8])
    cells = length_grid.grid_samples(model, config)
    statics, calibration = length_grid.static_sets(model, config)
    k = config.static_size(model.cfg.n_layers * model.cfg.n_heads)
    assert k == 2  # a quarter of the tiny model's 2 x 4 heads
    traces = length_grid.grid_traces(model, config, cells)
    samples = sample_table(cells, traces, statics, k)
    assert (samples["bound_pairs"] <= samples["adjacent_pairs"]).all()
    probe = length_grid.calibration_probe(calibration, config)
    names, note = length_grid.conditions(predicted=probe is not None)
    assert ("predicted" in names) == (probe is not None)
    grid = length_grid.masking_grid(model, config, cells, statics, names, probe=probe)
    table = length_grid.size_axis_table(samples, grid, traces, config, model_name="tiny",
                                        parameters=length_grid.block_parameters(model), n_heads=8, static_size=k)
    primaries = table[table["kind"] == "primary"]
    assert primaries["primary"].tolist() == ["outside_share_static_10pct", "adjacent_jaccard_over_bound",
                                             "fair_previous_step_vs_static", "predicted_vs_static",
                                             "probe_k1_vs_step_token_prior"]
    assert set(table["status"]) <= {"supported", "weaker", "not supported", "undetermined", "no headroom",
                                    "headroom", ""}
    fair = primaries.set_index("primary").loc["fair_previous_step_vs_static"]
    assert fair["n"] == len(cells) and fair["units"] == "samples"
    outside = primaries.set_index("primary").loc["outside_share_static_10pct"]
    expected = 1 - samples["inside_query_focused"] / samples["activations"]  # each sample its own layout
    # a random tiny model may copy nothing (no Eq. 1 activation: no share); the numbers are checked on hand-built
    # rows below, this run checks the mechanics
    assert outside["estimate"] == pytest.approx(expected.dropna().mean(), nan_ok=True)
    # 2 layers of q, o (64 x 64), k, v (64 x 32), a gated MLP (3 x 64 x 128) and two norms (64 each)
    assert table["parameters"].iloc[0] == 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64)
    assert "Size axis on tiny" in length_grid.size_axis_verdict(table)


def test_the_size_axis_table_computes_each_primary_from_its_units():
    layouts = [f"essays|2000|{d}|{o}" for d, o in [(0.0, 1), (0.5, 2), (1.0, 3), (0.0, 4)]]
    samples = pd.DataFrame({"layout": layouts, "accuracy": [1.0, 1.0, 0.0, 1.0], "context": 2000,
                            "depth": [0.0, 0.5, 1.0, 0.0], "run": [0, 0, 0, 1],
                            "activations": [10.0, 20.0, 0.0, 10.0], "inside_query_focused": [8.0, 10.0, 0.0, 10.0],
                            "bound_ratio_sum": [3.0, 1.0, 0.0, 2.0], "bound_pairs": [4.0, 2.0, 0.0, 2.0],
                            "adjacent_sum": [1.0, 1.0, 0.0, 1.0], "adjacent_pairs": [2.0, 4.0, 0.0, 1.0],
                            "steps": [5.0, 5.0, 5.0, 5.0]})
    rows = []
    for i, layout in enumerate(layouts):
        cell = {"context": 2000, "depth": samples["depth"][i], "run": samples["run"][i], "layout": layout}
        for condition, drop in (("none", 0.0), ("previous_step", 0.5 + 0.1 * i), ("static_previous", 0.1),
                                ("predicted", 0.1 - 0.05 * i)):
            rows.append({**cell, "condition": condition, "accuracy": samples["accuracy"][i], "tf_drop_t1": drop})
    grid = pd.DataFrame(rows)
    config = LengthGridConfig(n_resamples=200, n_splits=2, use_cache=False)  # never into the user's cache
    table = length_grid.size_axis_table(samples, grid, [], config, model_name="toy", parameters=10**6, n_heads=40,
                                        static_size=4).set_index("primary")
    # the layout without activations or bounded pairs has no unit: three layouts, their per-layout means
    assert table.loc["outside_share_static_10pct", "estimate"] == pytest.approx((0.2 + 0.5 + 0.0) / 3)
    assert table.loc["outside_share_static_10pct", "n"] == 3
    assert table.loc["adjacent_jaccard_over_bound", "estimate"] == pytest.approx((0.75 + 0.5 + 1.0) / 3)
    fair = table.loc["fair_previous_step_vs_static"]
    assert fair["estimate"] == pytest.approx(np.mean([0.4, 0.5, 0.6, 0.7])) and fair["n"] == 4
    assert fair["p"] == pytest.approx(0.125)  # 4 of 4 samples one way, exact two-sided sign test
    assert fair["status"] == "undetermined"  # 4 samples cannot reach p < 0.05
    predicted = table.loc["predicted_vs_static"]
    assert predicted["estimate"] == pytest.approx(np.mean([0.0, -0.05, -0.1, -0.15]))
    assert np.isnan(table.loc["probe_k1_vs_step_token_prior", "estimate"])  # no traces: not computed
    assert table.loc["probe_k1_vs_step_token_prior", "status"] == "undetermined"
    assert table.loc["accuracy_unmasked", "estimate"] == pytest.approx(0.75)
    assert table.loc["heads_per_step", "estimate"] == pytest.approx((2 + 4 + 0 + 2) / 4)
    for primary in ("outside_share_static_10pct", "fair_previous_step_vs_static"):
        row = table.loc[primary]
        assert row["low"] <= row["low90"] <= row["estimate"] <= row["high90"] <= row["high"]
    assert set(table["model"]) == {"toy"} and set(table["static_size"]) == {4}


# --- an interrupted long run resumes (issue #64) -----------------------------------------------------------------
RESUME_RUN = """
import json, os, time
from pathlib import Path

import dynheads_tl
from dynheads_tl import executors
from dynheads_tl.claims import length_grid
from dynheads_tl.claims.length_grid import LengthGridConfig
from dynheads_tl.engine import decoder


def grid_run(folder, out, delay):
    \"\"\"Notebook 07's grid on the tiny model in ``folder`` (from $DYNHEADS_CACHE's cache), a 200-token prompt in
    chunks as a 32k prompt is in chunks of 4096; ``delay`` seconds of pause after each masking run is cached (the
    killed run is killed in one). Writes what was cached before the first masking run, how many masking runs this
    run computed, and the grid.\"\"\"
    folder, out = Path(folder), Path(out)
    out.mkdir(exist_ok=True)
    saved, real, chunk = [], executors.save_cached_json, decoder.PREFILL_CHUNK

    def slow(key, result, **kwargs):
        saved.append(1)
        real(key, result, **kwargs)
        time.sleep(delay)
        return result

    executors.save_cached_json, decoder.PREFILL_CHUNK = slow, 32
    try:
        model = dynheads_tl.load_model(str(folder), device="cpu")
        config = LengthGridConfig(model=str(folder), lengths=[120], depths=[0.5], runs_per_cell=1,
                                  n_calibration=2, max_new_tokens=4, n_resamples=50, batch_size=1)
        cells = length_grid.grid_samples(model, config)
        statics, _ = length_grid.static_sets(model, config)
        length_grid.grid_traces(model, config, cells)
        names, _ = length_grid.conditions()
        cached = sorted(p.name for p in (Path(os.environ["DYNHEADS_CACHE"]) / "results").glob("*.json"))
        (out / "masking.tmp").write_text(json.dumps(cached))  # atomically: the test polls for it
        (out / "masking.tmp").rename(out / "masking.started")
        grid = length_grid.masking_grid(model, config, cells, statics, names)
    finally:
        executors.save_cached_json, decoder.PREFILL_CHUNK = real, chunk
    (out / "computed.json").write_text(json.dumps(len(saved)))
    listed = [c for c in grid.columns if grid[c].map(lambda v: isinstance(v, (list, dict))).any()]
    grid.drop(columns=listed).to_csv(out / "grid.csv", index=False)
"""


def test_an_interrupted_long_grid_resumes_without_recomputing_finished_cells(tmp_path, monkeypatch):
    """Issue #64: a killed run of notebook 07's grid (Gemma 3's shape: sliding layers with a window shorter than
    the prompts, prefilled in chunks as at 32k) restarts at the first masking run it had not cached: the finished
    runs' files are not rewritten, the rest are computed once, and the grid equals an uninterrupted run's. The
    killed run has a process of its own (SIGKILL); the resumed and the uninterrupted runs run in the test's."""
    from conftest import build_tiny_model, run_script_here, start_script

    folder = build_tiny_model("gemma3", tmp_path / "gemma3")
    cache, first = tmp_path / "cache", tmp_path / "first"
    process = start_script(RESUME_RUN, "grid_run", cache, folder, first, 1.0)
    results = cache / "results"
    deadline = time.time() + 240
    while time.time() < deadline and not (first / "masking.started").exists():
        time.sleep(0.05)
    assert (first / "masking.started").exists(), "the run never reached the masking grid"
    before = set(json.loads((first / "masking.started").read_text()))
    while time.time() < deadline and len({p.name for p in results.glob("*.json")} - before) < 3:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    finished = {p: p.stat().st_mtime_ns for p in [*results.glob("*.json"), *(cache / "traces").glob("*.pt")]}
    masked = len({p.name for p in results.glob("*.json")} - before)  # masking runs cached before the kill
    assert masked >= 3 and not (first / "grid.csv").exists(), "killed inside the masking grid"

    resumed, fresh = tmp_path / "resumed", tmp_path / "fresh"
    run_script_here(RESUME_RUN, "grid_run", cache, monkeypatch, folder, resumed, 0.0)
    assert all(p.stat().st_mtime_ns == t for p, t in finished.items()), "a finished run was recomputed"
    run_script_here(RESUME_RUN, "grid_run", tmp_path / "fresh_cache", monkeypatch, folder, fresh, 0.0)
    total = json.loads((fresh / "computed.json").read_text())
    # the resumed run computed exactly the masking runs the killed one had not cached
    assert json.loads((resumed / "computed.json").read_text()) == total - masked > 0
    pd.testing.assert_frame_equal(pd.read_csv(resumed / "grid.csv"), pd.read_csv(fresh / "grid.csv"))
    assert not list(results.glob("*.tmp*")), "no half-written file is left under a final name"


def _bounded_samples(raw: dict[int, float], bound: dict[int, float], per_length: int = 6,
                     spread: float = 0.01) -> pd.DataFrame:
    """One sample per layout, per_length layouts per length: layout i's adjacent Jaccard is ``raw[length]`` and its
    bound-normalised Jaccard ``bound[length]``, each plus spread * (i - 3) (so their mean over 6 layouts is 0.5 *
    spread below), over 2 + i pairs (so a pooled ratio would differ from the mean of the layouts' ratios); 2 heads
    per step at the first length, 1 after; one pair in four of a layout has an empty side."""
    rows = []
    for n, length in enumerate(raw):
        for i in range(per_length):
            wobble, pairs = spread * (i - 3), 4.0 * (2 + i)
            rows.append({"context": length, "layout": f"essays|{length}|{i}", "steps": 10.0,
                         "activations": 20.0 if n == 0 else 10.0,
                         "adjacent_sum": pairs * (raw[length] + wobble), "adjacent_pairs": pairs,
                         "bound_ratio_sum": 0.75 * pairs * (bound[length] + wobble), "bound_pairs": 0.75 * pairs})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("raw_reading, bound, spread, reading, said", [
    ("decreases", {1000: 0.95, 2000: 0.95, 4000: 0.95}, 0.01, "flat within the sesoi",
     "is flat: the raw fall is accounted for by the sets' sizes (2.00 to 1.00 heads per step), not by more turnover"),
    ("decreases", {1000: 0.9, 2000: 0.6, 4000: 0.3}, 0.01, "decreases",
     "the normalised one decreases too: the sets turn over more with length than their sizes force"),
    ("increases", {1000: 0.3, 2000: 0.6, 4000: 0.9}, 0.01, "increases",
     "the normalised one increases too: the sets turn over less with length than their sizes force"),
    ("decreases", {1000: 0.3, 2000: 0.6, 4000: 0.9}, 0.01, "increases",
     "while the normalised one increases: the raw fall comes from the sets' sizes (2.00 to 1.00 heads per step), "
     "beyond which they turn over less"),
    ("decreases", {1000: 0.5, 2000: 0.5, 4000: 0.55}, 0.3, "undetermined",
     "whether that is more turnover or only the sets' sizes (2.00 to 1.00 heads per step) is not settled"),
    ("flat within the sesoi", {1000: 0.9, 2000: 0.6, 4000: 0.3}, 0.01, "decreases",
     "the rotation primary reads 'flat within the sesoi', the normalised Jaccard 'decreases'"),
])
def test_the_size_bound_tells_shrinking_sets_from_rotation(raw_reading, bound, spread, reading, said):
    samples = _bounded_samples({1000: 0.8, 2000: 0.5, 4000: 0.2}, bound, spread=spread)
    table = length_grid.rotation_bound_table(samples, n_resamples=400)
    per = table[table["length"] != "slope"].set_index(["length", "measure"])
    # the mean of the layouts' ratios (the rotation primary's units), not the pairs pooled
    assert per.loc[("2000", "raw_layout_mean"), "value"] == pytest.approx(0.5 - 0.5 * spread)
    assert per.loc[("1000", "over_bound_layout_mean"), "value"] == pytest.approx(bound[1000] - 0.5 * spread)
    assert (per["low"] <= per["value"]).all() and (per["value"] <= per["high"]).all()
    assert per.loc[("1000", "over_bound_layout_mean"), "n_layouts"] == 6
    assert per.loc[("1000", "raw_layout_mean"), "heads_per_step"] == 2.0
    assert per.loc[("4000", "raw_layout_mean"), "heads_per_step"] == 1.0
    assert per.loc[("4000", "raw_layout_mean"), "empty_side_share"] == pytest.approx(0.25)
    slope = table[table["length"] == "slope"].iloc[0]
    assert slope["reading"] == reading and slope["n_layouts"] == 18 and slope["short_lengths"] == ""
    assert slope["low"] <= slope["value"] <= slope["high"]
    assert slope["value"] == pytest.approx((bound[4000] - bound[1000]) / 2, abs=0.02 if spread > 0.1 else 1e-9)
    trends = pd.DataFrame({"primary": ["rotation_vs_length"], "reading": [raw_reading]})
    text = length_grid.rotation_bound_verdict(table, trends, "toy", "essays")
    assert said in text, text
    assert f"it {reading} with length" in text if reading in ("increases", "decreases") else True
    assert "18 layouts" in text and "±0.02" in text and "25% of its adjacent pairs with an empty side" in text
    # without the primary's table the sentence says so rather than guessing
    assert "was not computed" in length_grid.rotation_bound_verdict(table, None, "toy", "essays")


def test_a_length_with_too_few_layouts_leaves_the_normalised_slope_untested_and_is_named():
    samples = _bounded_samples({1000: 0.8, 2000: 0.5, 4000: 0.2}, {1000: 0.9, 2000: 0.6, 4000: 0.3})
    samples = samples[~((samples["context"] == 4000) & (samples["layout"].str.endswith(("|3", "|4", "|5"))))]
    table = length_grid.rotation_bound_table(samples, n_resamples=200)
    slope = table[table["length"] == "slope"].iloc[0]
    assert slope["reading"] == "not tested" and slope["short_lengths"] == "4000"
    trends = pd.DataFrame({"primary": ["rotation_vs_length"], "reading": ["decreases"]})
    text = length_grid.rotation_bound_verdict(table, trends, "toy", "filler")
    assert "its slope is not tested" in text and "4,000 tokens hold fewer" in text
    assert "(3 layouts, fewer than 5: too few to trust its interval" in text and "is not settled" in text
    assert "filler (the easy control)" in text


def test_the_size_bound_sentence_says_when_no_pair_has_two_sets():
    samples = _bounded_samples({1000: 0.5, 2000: 0.5}, {1000: 0.5, 2000: 0.5}).assign(bound_pairs=0.0)
    table = length_grid.rotation_bound_table(samples, n_resamples=50)
    assert "undefined" in length_grid.rotation_bound_verdict(table, None, "toy", "essays")


def test_a_run_from_before_the_size_bound_analysis_says_it_was_not_computed(tmp_path):
    [said] = length_grid.bound_finding(tmp_path)
    assert said.startswith("Not computed: this run of notebook 07 predates")
