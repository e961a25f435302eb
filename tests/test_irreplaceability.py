"""Claim 2's summaries on hand-built grids with known answers: intervals and n, the computed verdicts, the
figures' labels and the index headline. No model."""
from __future__ import annotations

import matplotlib
import pandas as pd
import pytest
import torch

from dynheads_tl.analysis.statistics import Interval
from dynheads_tl.claims import irreplaceability
from dynheads_tl.claims.irreplaceability import (GRID_CONDITIONS, TaskAblation, condition_summary,
                                                 matched_controls_verdict, paired_difference, progressive_summary,
                                                 protocol_checks, summary_markdown)
from dynheads_tl.protocols.ablation import AblationSetup
from dynheads_tl.claims.irreplaceability import figures

matplotlib.use("Agg")

# Per condition: accuracy (0/1 per run), teacher-forced drop (nats per step), heads masked per step.
ACCURACY = {"none": 1, "dynamic": 0, "static": 0, "random": 1, "static_matched": 0, "random_matched": 1,
            "dynamic_nonstatic": 0, "random_nonstatic": 1, "static_nondynamic": 1, "random_nondynamic": 1,
            "query_matched": 1, "previous_step": 1, "static_previous": 1, "random_previous": 1, "predicted": 1}
DROP = {"none": 0.0, "dynamic": 1.5, "static": 1.4, "random": 0.01, "static_matched": 1.5, "random_matched": 0.05,
        "dynamic_nonstatic": 0.6, "random_nonstatic": 0.02, "static_nondynamic": 0.05, "random_nondynamic": 0.03,
        "query_matched": 0.3, "previous_step": 0.4, "static_previous": 0.4, "random_previous": 0.05, "predicted": 0.6}
HEADS = {"none": 0.0, "dynamic": 1.6, "static": 5.0, "random": 5.0, "static_matched": 1.6, "random_matched": 1.6,
         "dynamic_nonstatic": 0.4, "random_nonstatic": 0.4, "static_nondynamic": 18.8, "random_nondynamic": 18.8,
         "query_matched": 1.6, "previous_step": 1.5, "static_previous": 1.5, "random_previous": 1.5, "predicted": 1.5}


def _grid(runs_per_cell: int = 5, depths=(0.1, 0.9)) -> pd.DataFrame:
    rows = []
    for depth in depths:
        for run in range(runs_per_cell):
            for condition in GRID_CONDITIONS:
                jitter = 0.02 * run  # per-sample spread, so bootstrap intervals have width
                rows.append({"context": 500, "depth": depth, "run": run, "condition": condition,
                             "accuracy": float(ACCURACY[condition]), "rouge_l": 0.5, "m_s": 1,
                             "heads_masked_per_step": HEADS[condition], "heads_ever_masked": f"{condition}-{run}",
                             "tf_drop": 0.0 if condition == "none" else DROP[condition] + jitter,
                             "tf_drop_t1": 0.0 if condition == "none" else DROP[condition] + jitter,
                             "tf_drop_masked": None if condition == "none" else DROP[condition] + 2 * jitter,
                             "tf_steps": 38, "tf_heads_masked_per_step": HEADS[condition],
                             # the probe's runs record how much of D_t their sets held (steps t >= 1)
                             **(OVERLAP if condition == "predicted" else {})})
    return pd.DataFrame(rows)


# Per predicted run: D_t held 20 head-steps over t >= 1; the probe's 18 held 9 of them, D_{t-1} 12, the static 4,
# chance 1.5.
OVERLAP = {"tf_dt_heads_t1": 20.0, "tf_masked_heads_t1": 18.0, "tf_masked_in_dt_t1": 9.0, "tf_previous_in_dt_t1": 12.0,
           "tf_static_in_dt_t1": 4.0, "tf_chance_in_dt_t1": 1.5}


def _result(grid: pd.DataFrame) -> TaskAblation:
    static = torch.zeros(30, 9, dtype=torch.bool)
    static[17, :5] = True
    progressive = pd.DataFrame([{"sample": s, "k": k, "accuracy": float(k == 0), "m_s": 2 if k else 0,
                                 "response": "r", "unmasked_response": "r"} for s in range(5) for k in (0, 10, 20)])
    return TaskAblation("niah", AblationSetup(static_mask=static, static_top20=static, k=5), grid, progressive,
                        pd.DataFrame())


def test_paired_difference_pairs_runs_on_the_same_sample():
    grid = _grid()
    difference = paired_difference(_result(grid), "dynamic", "random_matched", "accuracy")
    assert difference.n == 10 and difference.estimate == -1.0 and difference.high == -1.0
    # Same per-sample jitter on both sides: the paired difference is exactly constant, the marginal intervals are not.
    drop = paired_difference(_result(grid), "dynamic", "static", "tf_drop")
    assert drop.estimate == pytest.approx(0.1) and drop.low == pytest.approx(0.1) and drop.high == pytest.approx(0.1)
    shuffled = grid.copy()
    shuffled.loc[shuffled["condition"] == "static", "run"] = (shuffled.loc[shuffled["condition"] == "static", "run"] + 1) % 5
    assert paired_difference(_result(shuffled), "dynamic", "static", "tf_drop").high > 0.1 + 1e-9, "pairs by sample"


def test_condition_summary_has_n_and_intervals():
    summary = condition_summary(_result(_grid())).set_index("condition")
    assert list(summary.index) == list(GRID_CONDITIONS)
    assert (summary["n"] == 10).all() and (summary["k_static_random"] == 5).all()
    # Wilson for 10/10 and 0/10 (closed form: n / (n + z^2) with z = 1.96).
    assert summary.loc["none", "accuracy_low"] == pytest.approx(10 / (10 + 1.959964 ** 2), abs=1e-4)
    assert summary.loc["dynamic", "accuracy_high"] == pytest.approx(1.959964 ** 2 / (10 + 1.959964 ** 2), abs=1e-4)
    # Drops: the mean over samples, inside its bootstrap interval; the unmasked drop is 0 with no spread.
    assert summary.loc["dynamic", "tf_drop"] == pytest.approx(1.5 + 0.02 * 2)
    assert summary.loc["dynamic", "tf_drop_low"] < summary.loc["dynamic", "tf_drop"] < summary.loc["dynamic", "tf_drop_high"]
    assert summary.loc["none", ["tf_drop", "tf_drop_low", "tf_drop_high"]].tolist() == [0.0, 0.0, 0.0]
    assert summary.loc["none", "n_tf_masked"] == 0 and summary.loc["dynamic", "n_tf_masked"] == 10
    assert summary.loc["dynamic_nonstatic", "heads_masked_per_step"] == pytest.approx(0.4)


def test_matched_controls_verdict_reads_the_intervals():
    text = matched_controls_verdict(_result(_grid()))
    (random_matched, static_matched, static_previous, random_previous, nonstatic, nonstatic_vs_all,
     nondynamic) = text.split("NIAH, ")[1:]
    # D_{t-1} against as many static / random heads, teacher-forced over the steps t >= 1.
    assert static_previous.startswith("masking D_{t-1} against masking the top-|D_{t-1}| static heads")
    assert static_previous.count("the data cannot distinguish them") == 2
    assert "teacher-forced drop of the gold token's log-probability in nats per step over the steps t ≥ 1" in random_previous
    assert "masking D_{t-1} hurts more" in random_previous
    assert "masking D_t against masking |D_t| random heads (1.6 vs 1.6 heads masked per step" in random_matched
    assert random_matched.count("masking D_t hurts more") == 2
    # D_t against the top-|D_t| static heads: equal accuracy and equal drops -> no difference claimed.
    assert static_matched.count("the data cannot distinguish them") == 2 and "hurts more" not in static_matched
    assert "(paired over n = 10 samples)" in static_matched
    assert "(0.4 vs 0.4 heads masked per step" in nonstatic and nonstatic.count("masking D_t \\ S_20 hurts more") == 2
    assert nonstatic_vs_all.count("hurts more although it masks fewer heads") == 2
    # S_20 \ D_t against as many random heads: same accuracy; a drop larger by a constant 0.02 nats.
    assert "cannot distinguish" in nondynamic and "masking S_20 \\ D_t hurts more" in nondynamic


def test_verdicts_refuse_to_compare_too_few_samples():
    text = matched_controls_verdict(_result(_grid(runs_per_cell=1)))
    assert "too few paired samples to compare" in text and "hurts more" not in text


def test_summary_markdown_states_intervals_and_no_threshold_verdicts():
    markdown = summary_markdown({"niah": _result(_grid())}, "tiny")
    assert "n = 10 runs per condition" in markdown and "none 1.00 [0.72, 1.00]" in markdown
    assert "far more" not in markdown
    assert "dynamic masking hurts more than masking the static top-5" not in markdown  # 0/10 vs 0/10
    assert "dynamic masking hurts more than masking 5 random heads" in markdown  # 0/10 vs 10/10
    assert "teacher-forced" in markdown and "Matched controls" in markdown
    assert "n = 5 samples per k" in markdown


def test_progressive_summary_and_protocol_checks():
    result = _result(_grid())
    prog = progressive_summary(result)
    assert prog["k"].tolist() == [0, 10, 20] and (prog["n"] == 5).all()
    assert prog.loc[0, "accuracy_low"] == pytest.approx(5 / (5 + 1.959964 ** 2), abs=1e-4)
    checks = protocol_checks(result)
    assert checks["ok"].all() and "drop is exactly 0" in checks["check"].iloc[-1]
    result.grid.loc[result.grid["condition"] == "none", "tf_drop"] = 1e-9
    assert not protocol_checks(result)["ok"].iloc[-1]


def test_progressive_control_is_paired_per_sample_and_holm_leaves_out_the_untestable_k():
    """Known answer: at k = 10 the ranked heads fail all 8 samples that k random heads answer (sign p = 2 / 2^8);
    at k = 20 only 3 samples differ, so its sign test cannot reach 0.05 (min p 0.25) and leaves the family."""
    from scipy import stats

    rows = [{"sample": s, "k": 0, "ranking": "ranked", "accuracy": 1.0, "m_s": 0.0} for s in range(8)]
    rows += [{"sample": s, "k": k, "ranking": "ranked", "accuracy": 0.0, "m_s": 3.0} for s in range(8) for k in (10, 20)]
    rows += [{"sample": s, "k": 10, "ranking": "random", "accuracy": 1.0, "m_s": 1.0} for s in range(8)]
    rows += [{"sample": s, "k": 20, "ranking": "random", "accuracy": float(s < 3), "m_s": 1.0} for s in range(8)]
    result = _result(_grid())
    result.progressive = pd.DataFrame(rows)
    table = progressive_summary(result).set_index("k")
    assert table.loc[0, "n"] == 8 and pd.isna(table.loc[0, "sign_p"]), "k = 0 has no control: both mask nothing"
    assert table.loc[10, "sign_p"] == pytest.approx(stats.binomtest(0, 8, 0.5).pvalue) == pytest.approx(2 / 2 ** 8)
    assert table.loc[10, "p_adjusted"] == pytest.approx(2 / 2 ** 8), "the only testable k: Holm leaves it as it is"
    assert pd.isna(table.loc[20, "p_adjusted"]) and table.loc[20, "sign_p"] == pytest.approx(0.25)
    assert table.loc[10, "specific"] and not table.loc[20, "specific"]
    assert table.loc[10, "difference"] == -1.0 and table.loc[20, "difference"] == pytest.approx(-3 / 8)
    assert (table.loc[10, "ranked_worse"], table.loc[10, "random_worse"]) == (8, 0)
    assert table.loc[10, "random_m_s"] == 1.0 and table.loc[10, "m_s"] == 3.0 and table.loc[10, "random_n"] == 8
    fig = figures.progressive_figure(table.reset_index(), "accuracy", "Fig 3")
    labels = [text.get_text() for text in fig.axes[0].get_legend().get_texts()]
    assert labels == ["accuracy, ranked heads", "accuracy, random heads (size-matched)", "m_s, ranked heads",
                      "m_s, random heads (size-matched)"]
    # Runs from before the control (no ranking column) are all ranked, and the summary has no control columns.
    old = _result(_grid())
    assert "random_accuracy" not in progressive_summary(old) and "sign_p" not in progressive_summary(old)


def test_figures_show_n_and_which_panels_use_k():
    grid = _grid()
    fig = figures.condition_heatmaps(grid, "accuracy", "Fig 2 (NIAH): accuracy", k=5)
    assert fig._suptitle.get_text() == "Fig 2 (NIAH): accuracy"  # one line; the rest in the note below the panels
    note = fig._supxlabel.get_text()
    assert "n = 5 runs per cell, 10 per panel" in note and "95% interval (Wilson)" in note
    assert "fixed k = 5 heads at every step: static top-k masked, random k masked" in note
    assert "sized by D_t at each step: D_t masked, static top-|D_t| masked" in note
    assert ("sized by D_{t-1} at each step (nothing at step 0): D_{t-1} masked (known before step t), "
            "static top-|D_{t-1}| masked, random |D_{t-1}| masked, probe's top-|D_{t-1}| masked (predicted before "
            "step t)") in note
    panels = [ax.get_title() for ax in fig.axes if ax.get_visible() and ax.get_title()]
    assert len(panels) == len(GRID_CONDITIONS) == 15 and "D_t \\ S_20 masked (0.4 heads/step)" in panels
    cells = fig.axes[0].texts
    assert len(cells) == 2 and all("\n[" in text.get_text() for text in cells)  # every cell shows its interval
    prog = progressive_summary(_result(grid))
    fig = figures.progressive_figure(prog, "f1" if "f1" in prog else "accuracy", "Fig 7", ranking=figures.HOTPOT_RANKING)
    assert "Eq. 2" in fig.axes[0].get_xlabel() and "Eq. 1 hits" not in fig.axes[0].get_xlabel()
    assert "n = 5 samples per k" in fig._suptitle.get_text() and fig.axes[0].get_legend() is not None
    fig = figures.controls_figure(condition_summary(_result(grid)), "accuracy", "NIAH")
    assert "n = 10 runs per condition" in fig._suptitle.get_text() and len(fig.axes) == 2


def test_index_row_quotes_intervals_and_its_status_reads_the_exact_tests(tmp_path):
    """The claim's declared index row (Fig 2): the headline from the grid's CSV, the status from comparisons.csv."""
    from dynheads_tl.claims.irreplaceability import CLAIM, comparison_table

    item = next(i for i in CLAIM.items if i.item == "Fig 2")
    _grid().to_csv(tmp_path / "fig2_niah_masking.csv", index=False)
    text = item.headline(tmp_path)
    assert text.startswith("accuracy (Wilson 95%, n = 10 per condition): none 1.00 [0.72, 1.00], dynamic 0.00 [0.00, 0.28]")
    assert "teacher-forced gold log-prob drop" in text and "dynamic nonstatic" in text
    old = _grid().drop(columns=[c for c in _grid().columns if c.startswith("tf_")])
    old.to_csv(tmp_path / "fig2_niah_masking.csv", index=False)  # a run without teacher forcing: no drops quoted
    assert "teacher-forced" not in item.headline(tmp_path)
    condition_summary(_result(_grid())).to_csv(tmp_path / "niah_conditions.csv", index=False)
    comparison_table({"niah": _result(_grid())}).to_csv(tmp_path / "comparisons.csv", index=False)
    # D_t hurts more than |D_t| random heads on every sample, but equals the top-|D_t| static heads on both measures,
    # and masking as many static heads destroys retrieval too (0/10 against 10/10 unmasked): absent in this setting.
    result = item.status(tmp_path)
    assert result.status == "absent in this setting"
    assert "accuracy D_t − static: tied on every one of 10 samples" in result.why
    assert "fair D_(t-1) − static: tied on every one of 10 samples" in result.why and "What would settle it" in result.why
    grid = _grid()
    grid.loc[grid["condition"] == "dynamic", "tf_drop"] += 0.5
    comparison_table({"niah": _result(grid)}).to_csv(tmp_path / "comparisons.csv", index=False)
    # the teacher-forced drop now separates, but the paper's own measure ties 0/10 vs 0/10: never "reproduced"
    assert item.status(tmp_path).status == "absent in this setting"


def _summary(unmasked=(0.9, 0.75, 0.97), static=(0.8, 0.6, 0.9), metric="accuracy") -> pd.DataFrame:
    """A condition summary (as ``<task>_conditions.csv``): the unmasked and static metrics with their intervals."""
    rows = [{"condition": c, "n": 30, metric: v[0], f"{metric}_low": v[1], f"{metric}_high": v[2]}
            for c, v in (("none", unmasked), ("static_matched", static), ("dynamic", (0.1, 0.0, 0.2)))]
    return pd.DataFrame(rows).set_index("condition")


def _comparison(a, metric, difference, separated, a_worse=20, b_worse=5, b="static_matched"):
    return {"task": "niah", "a": a, "b": b, "metric": metric, "n": 30, "difference": difference,
            "low": difference - 0.05, "high": difference + 0.05, "a_worse": a_worse, "b_worse": b_worse,
            "p_adjusted": 0.01 if separated else 0.4, "separated": separated, "n_to_resolve": 80}


_FIG2_RULE = {"headroom_floor": 0.5, "tf_sesoi": 0.10, "static_destroys_ratio": 0.5}


def test_masking_rule_reads_every_half_on_hand_built_numbers():
    from dynheads_tl.claims.irreplaceability.rules import masking_rule

    def verdict(rows, **summary):
        return masking_rule(_summary(**summary), pd.DataFrame(rows), "niah", _FIG2_RULE)[0]

    accuracy_more = _comparison("dynamic", "accuracy", -0.6, True)
    tf_big = _comparison("dynamic", "tf_drop", 0.3, True)
    fair_big = _comparison("previous_step", "tf_drop_t1", 0.2, True, b="static_previous")
    # every half separated, D_t lower on accuracy, both teacher-forced differences >= 0.10 nats: reproduced
    assert verdict([accuracy_more, tf_big, fair_big]) == "reproduced"
    # the fair half missing (no previous_step condition): at most weaker
    assert verdict([accuracy_more, tf_big]) == "weaker"
    # the fair difference separated but below the smallest effect of interest: weaker
    assert verdict([accuracy_more, tf_big, _comparison("previous_step", "tf_drop_t1", 0.05, True, b="static_previous")]) == "weaker"
    # the paper's own measure ties (0/30 vs 0/30 would be no sample differing): not separated, so not reproduced
    tied = _comparison("dynamic", "accuracy", 0.0, False, 0, 0)
    assert verdict([tied, tf_big, fair_big]) == "weaker"
    # ... and when masking as many static heads destroys retrieval (0.1 upper bound < 0.5 x 0.9): absent
    assert verdict([tied, tf_big, fair_big], static=(0.0, 0.0, 0.11)) == "absent in this setting"
    # static separated as hurting more on any half: not reproduced
    assert verdict([accuracy_more, _comparison("dynamic", "tf_drop", -0.2, True), fair_big]) == "not reproduced"
    assert verdict([accuracy_more, tf_big, _comparison("previous_step", "tf_drop_t1", -0.2, True, b="static_previous")]) == "not reproduced"
    # no headroom: the unmasked upper bound below 0.5
    assert verdict([accuracy_more, tf_big, fair_big], unmasked=(0.2, 0.1, 0.4)) == "no headroom"
    # nothing separated, static does not destroy retrieval: undetermined
    assert verdict([tied, _comparison("dynamic", "tf_drop", 0.02, False)]) == "undetermined"



def test_defaults_fit_the_budget_and_grid_has_every_condition():
    config = irreplaceability.IrreplaceabilityConfig()
    assert config.runs_per_cell >= 5
    assert set(GRID_CONDITIONS) >= {"random_matched", "dynamic_nonstatic", "static_nondynamic", "static_matched"}
    for contexts, depths in ((config.niah_contexts, config.niah_depths), (config.hotpot_contexts, config.hotpot_depths)):
        assert len(contexts) * len(depths) * config.runs_per_cell >= 10, "samples per condition and task"


def test_query_baseline_verdict_says_whether_the_stronger_baseline_changes_the_reading():
    """Issue #31: in the hand-built grid, masking D_t and Wu's top-|D_t| hurt alike (accuracy 0 both, drops 1.5 both:
    cannot distinguish), while the query-focused top-|D_t| leaves accuracy at 1 (D_t hurts more): the conclusion
    changes."""
    from dynheads_tl.claims.irreplaceability import query_baseline_verdict

    text = query_baseline_verdict(_result(_grid()))
    assert text.startswith("NIAH, masking D_t against Wu et al.'s top-|D_t|")
    assert "the conclusion changes" in text
    assert "Wu cannot distinguish / cannot distinguish; query-focused D_t hurts more / D_t hurts more" in text
    grid = _grid()
    grid = grid[grid["condition"] != "query_matched"]
    assert query_baseline_verdict(_result(grid)) == "NIAH: the query-focused baseline was not run."


def test_comparison_table_tests_every_pair_with_holm_and_a_declared_primary():
    """Issue #32: every paired comparison gets an exact sign test (scipy's binomial test on the differing samples),
    Holm runs over the secondary comparisons that can reach 0.05 (untestable ones leave the family), the primary is
    tested alone, and a free-generation ranking needs headroom."""
    from scipy import stats

    from dynheads_tl.analysis.statistics import holm_adjust
    from dynheads_tl.claims.irreplaceability import PRIMARY, comparison_table, primary_verdict

    table = comparison_table({"niah": _result(_grid())})
    row = table[(table["a"] == "dynamic") & (table["b"] == "random_matched") & (table["metric"] == "accuracy")].iloc[0]
    # 0/10 against 10/10: D_t's masking is worse on all 10 samples.
    assert (row["a_worse"], row["b_worse"]) == (10, 0)
    assert row["sign_p"] == pytest.approx(stats.binomtest(10, 10, 0.5).pvalue)
    family = table[table["evaluable"] & ~table["primary"] & table["testable"]]
    assert family["p_adjusted"].tolist() == pytest.approx(holm_adjust(family["sign_p"].tolist()))
    untestable = table[~table["testable"]]
    assert len(untestable) and untestable["p_adjusted"].isna().all() and not untestable["separated"].any()
    primary = table[table["primary"]].iloc[0]
    assert tuple(primary[["task", "a", "b", "metric"]]) == PRIMARY
    assert primary["p_adjusted"] == primary["sign_p"] or primary["p_adjusted"] != primary["p_adjusted"]
    assert row["separated"] and "D_t hurts more" not in primary_verdict(table).split(":")[0]
    # Identical drops on every sample (dynamic vs static_matched): no difference claimed.
    assert "**undetermined**" in primary_verdict(table)

    # No headroom: with the unmasked accuracy at 0, accuracy comparisons are not ranked, drops still are.
    grid = _grid()
    grid.loc[grid["condition"] == "none", "accuracy"] = 0.0
    flat = comparison_table({"niah": _result(grid)})
    accuracy_rows = flat[flat["metric"] == "accuracy"]
    assert not accuracy_rows["headroom"].any() and not accuracy_rows["separated"].any()
    assert flat[flat["metric"] == "tf_drop"]["headroom"].all()
    assert "not ranked: the unmasked run has no headroom" in matched_controls_verdict(_result(grid), flat)


def test_primary_verdict_reads_the_fair_comparison_and_gives_d_t_beside_it():
    """The primary is D_{t-1} against as many top static heads over the steps t >= 1 (``tf_drop_t1``); D_t against
    as many static heads follows as a secondary. Moving only D_t's drops leaves the primary's reading as it was."""
    from dynheads_tl.claims.irreplaceability import PRIMARY, comparison_table, primary_verdict

    assert PRIMARY == ("niah", "previous_step", "static_previous", "tf_drop_t1")
    grid = _grid()
    previous = grid["condition"] == "previous_step"
    grid.loc[previous, "tf_drop_t1"] = grid.loc[previous, "tf_drop_t1"] + 0.5  # D_{t-1} hurts more on every sample
    text = primary_verdict(comparison_table({"niah": _result(grid)}))
    primary, secondary = text.split(" Beside it, ")
    from dynheads_tl.claims.irreplaceability.report import PERSISTENCE_NOTE

    assert primary.startswith("Primary comparison (NIAH, masking D_{t-1} against masking the top-|D_{t-1}| static "
                              f"heads, teacher-forced, steps t ≥ 1; {PERSISTENCE_NOTE}): **reproduced**")
    assert "favours persistence" in PERSISTENCE_NOTE and "probe-predicted set" in PERSISTENCE_NOTE
    assert "D_{t-1} hurt more on 10, the top-|D_{t-1}| static heads on 0" in primary and "sign test p = 0.00195" in primary
    # D_t and static tie on every sample; a secondary states its reading without a status word
    assert "(secondary, partly expected from selection alone)" in secondary and "the two cannot be told apart" in secondary
    assert "**" not in secondary
    grid.loc[previous, "tf_drop_t1"] = grid.loc[previous, "tf_drop_t1"] - 1.0  # now the static heads hurt more
    assert primary_verdict(comparison_table({"niah": _result(grid)})).split(" Beside it, ")[0].count("**not reproduced**") == 1
    dynamic = grid["condition"] == "dynamic"
    grid.loc[dynamic, "tf_drop"] = grid.loc[dynamic, "tf_drop"] + 0.5
    text = primary_verdict(comparison_table({"niah": _result(grid)}))
    assert "**not reproduced**" in text.split(" Beside it, ")[0] and "): D_t hurts more (" in text.split(" Beside it, ")[1]


def test_previous_step_comparisons_are_read_on_the_steps_after_the_first():
    """Where a side is sized by D_{t-1} (nothing masked at t = 0), the teacher-forced row is ``tf_drop_t1``; the
    other comparisons stay on ``tf_drop``. A drop confined to step 0 (in tf_drop, not in tf_drop_t1) moves only the
    D_t rows."""
    from dynheads_tl.claims.irreplaceability import comparison_table

    grid = _grid()
    table = comparison_table({"niah": _result(grid)})
    measures = {(r.a, r.b): r.metric for r in table[table["metric"] != "accuracy"].itertuples()}
    assert measures[("previous_step", "static_previous")] == "tf_drop_t1"
    assert measures[("previous_step", "random_previous")] == "tf_drop_t1"
    assert measures[("dynamic", "static_matched")] == "tf_drop"
    row = table[(table["a"] == "previous_step") & (table["b"] == "random_previous")
                & (table["metric"] == "tf_drop_t1")].iloc[0]
    assert row["difference"] == pytest.approx(0.35) and (row["a_worse"], row["b_worse"]) == (10, 0)
    grid.loc[grid["condition"] == "random_previous", "tf_drop"] = 9.0  # step 0 would dominate, but is not read
    again = comparison_table({"niah": _result(grid)})
    assert again.set_index(["a", "b", "metric"]).loc[("previous_step", "random_previous", "tf_drop_t1"),
                                                      "difference"] == pytest.approx(0.35)


def test_the_probes_set_is_an_exploratory_secondary_with_its_prediction_quality(tmp_path):
    """``predicted`` against static_previous and random_previous: read on the steps t >= 1, secondary (in the Holm
    family, never the primary), stated without a status word; how well it predicted D_t pooled over samples beside
    D_{t-1}, static and chance; the README's finding quotes the NIAH sentences when the notebook wrote them and is
    unchanged for a run from before the condition; no Fig 2 status reads it."""
    from dynheads_tl.claims.irreplaceability import (CLAIM, PREDICTED_LEAD, PREDICTION_FILE, comparison_table,
                                                     predicted_verdict, prediction_table, primary_verdict)
    from dynheads_tl.claims.irreplaceability.rules import masking_rule

    grid = _grid()
    table = comparison_table({"niah": _result(grid)})
    rows = table[table["a"] == "predicted"].set_index(["b", "metric"])
    assert set(rows.index) == {("static_previous", "tf_drop_t1"), ("random_previous", "tf_drop_t1"),
                               ("static_previous", "accuracy"), ("random_previous", "accuracy")}
    static = rows.loc[("static_previous", "tf_drop_t1")]
    assert static["difference"] == pytest.approx(0.2) and (static["a_worse"], static["b_worse"]) == (10, 0)
    assert not rows["primary"].any() and static["p_adjusted"] > static["sign_p"], "Holm within the secondaries"
    prediction = prediction_table({"niah": _result(grid)}).set_index("column")
    assert prediction.loc["tf_masked_in_dt_t1", "recall"] == pytest.approx(9 / 20)
    assert prediction.loc["tf_masked_in_dt_t1", "precision"] == pytest.approx(9 / 18)
    assert prediction.loc["tf_previous_in_dt_t1", "recall"] == pytest.approx(12 / 20)
    assert prediction.loc["tf_chance_in_dt_t1", "recall"] == pytest.approx(1.5 / 20)
    assert (prediction["n"] == 10).all() and (prediction["dt_heads"] == 200).all()
    text = predicted_verdict(table, prediction_table({"niah": _result(grid)}))
    assert text.startswith(f"{PREDICTED_LEAD}, an exploratory secondary (NIAH, masking the probe's predicted set against "
                           "masking the top-|D_{t-1}| static heads, teacher-forced, steps t ≥ 1): the probe's predicted "
                           "set hurts more (")
    assert "**" not in text and "0.45" in text and "of D_t's 200 head-steps (recall)" in text
    assert "D_{t-1} 0.60" in text and "|D_{t-1}| random heads (expected) 0.07" in text
    # The finding: the primary and D_t beside it, then the probe's NIAH sentences (two comparisons, the prediction)
    folder = tmp_path / "02_irreplaceability"
    folder.mkdir()
    table.to_csv(folder / "comparisons.csv", index=False)
    before = CLAIM.findings[0].sentences(folder)  # the overlap file not written: the comparisons alone
    prediction_table({"niah": _result(grid)}).to_csv(folder / f"{PREDICTION_FILE}.csv", index=False)
    sentences = CLAIM.findings[0].sentences(folder)
    assert [s.split(" (")[0] for s in sentences[:2]] == ["Primary comparison",
                                                         "Beside it, the set chosen on the step's own outcome"]
    assert len(sentences) == 5 and all(s.startswith(PREDICTED_LEAD) for s in sentences[2:])
    assert sentences[:4] == before and "held 0.45" in sentences[-1]
    old = table[table["a"] != "predicted"]
    assert predicted_verdict(old) == ""
    old.to_csv(folder / "comparisons.csv", index=False)  # a report from before the condition: neither file has it
    (folder / f"{PREDICTION_FILE}.csv").unlink()
    assert CLAIM.findings[0].sentences(folder) == sentences_of(primary_verdict(old))
    # Fig 2's rule reads the same three halves with or without the probe's rows
    summary = condition_summary(_result(grid)).set_index("condition")
    rule = {"headroom_floor": 0.5, "tf_sesoi": 0.05, "static_destroys_ratio": 0.5}
    assert masking_rule(summary, table, "niah", rule)[0] == masking_rule(summary, old, "niah", rule)[0]


def sentences_of(text) -> list[str]:
    """The primary's and D_t's parts of claim 2's verdict, as its finding quotes them (by key)."""
    return text.quote("primary", "selected on outcome")


def test_progressive_status_needs_the_drop_to_be_specific_when_the_run_has_the_control(tmp_path):
    from dynheads_tl.claims.irreplaceability.report import _progressive_status

    def status(random_accuracy, with_control=True):
        rows = [{"sample": s, "k": 0, "ranking": "ranked", "accuracy": 1.0, "m_s": 0.0} for s in range(10)]
        rows += [{"sample": s, "k": 20, "ranking": "ranked", "accuracy": 0.0, "m_s": 3.0} for s in range(10)]
        rows += [{"sample": s, "k": 20, "ranking": "random", "accuracy": random_accuracy, "m_s": 1.0}
                 for s in range(10)]
        frame = pd.DataFrame(rows)
        if not with_control:
            frame = frame[frame["ranking"] == "ranked"].drop(columns="ranking")
        frame.to_csv(tmp_path / "fig3_niah_progressive.csv", index=False)
        return _progressive_status("fig3_niah_progressive")(tmp_path)

    # the curve drops and is specific; m_s 3.0 heads per sample at k = 20, above the smallest effect of interest
    # (1.0) and above random masking's 1.0 on every sample: compensation present, reproduced
    assert status(1.0).status == "reproduced" and "the ranked heads hurt more" in status(1.0).headline
    matched = status(0.0)  # k random heads destroy retrieval as well: nothing differs, nothing can be tested
    assert matched.status == "undetermined" and "no k could be tested" in matched.headline
    assert "at least 6 differing samples" in matched.headline and "n = 10 samples per k" in matched.headline
    # older runs without the control: the drop alone cannot show specificity, so at most weaker
    assert status(0.0, with_control=False).status == "weaker"


def test_progressive_rule_reads_the_curve_and_compensation(tmp_path):
    """Hand-built progressive runs: the same curve with compensation present, absent and undetermined."""
    from dynheads_tl.claims.irreplaceability.report import _progressive_status

    def status(m_s, random_m_s=1.0, spread=0.0):
        rows = [{"sample": s, "k": 0, "ranking": "ranked", "accuracy": 1.0, "m_s": 0.0} for s in range(10)]
        rows += [{"sample": s, "k": k, "ranking": "ranked", "accuracy": 0.0, "m_s": m_s + spread * (s - 4.5)}
                 for s in range(10) for k in (10, 20)]
        rows += [{"sample": s, "k": k, "ranking": "random", "accuracy": 1.0, "m_s": random_m_s}
                 for s in range(10) for k in (10, 20)]
        pd.DataFrame(rows).to_csv(tmp_path / "fig3_niah_progressive.csv", index=False)
        return _progressive_status("fig3_niah_progressive")(tmp_path)

    assert status(3.0).status == "reproduced"
    # the paper's curve, but m_s 0.1 heads (< 1.0, as the SmolLM2 run's 0.10): compensation absent, weaker
    weak = status(0.1, random_m_s=2.0)
    assert weak.status == "weaker" and "compensation absent" in weak.why and "What would settle it" in weak.why
    # m_s above the smallest effect but not above random masking's: compensation undetermined, weaker
    assert status(1.5, random_m_s=2.0).status == "weaker"
    assert "compensation undetermined" in status(1.5, random_m_s=2.0).why
    # the teacher-forced drop by k is named missing when the run did not write it
    assert "teacher-forced drop by k: missing" in weak.why


def test_progressive_status_quotes_the_teacher_forced_drop_of_the_ranked_heads_beside_random(tmp_path):
    """Hand-built teacher-forced drops: ranked 2.0 nats/step at k = 20 on every sample, random 0.5. The status quotes
    the ranked drop (not the mean of ranked and random rows, which would read 1.25), ranked − random +1.5 on 10:0
    samples with its Holm-adjusted sign test, and each interval whose samples are all equal as degenerate."""
    from dynheads_tl.claims.irreplaceability.report import _progressive_status

    rows = [{"sample": s, "k": 0, "ranking": "ranked", "accuracy": 1.0, "m_s": 0.0, "tf_drop": 0.0} for s in range(10)]
    rows += [{"sample": s, "k": 20, "ranking": "ranked", "accuracy": 0.0, "m_s": 3.0, "tf_drop": 2.0} for s in range(10)]
    rows += [{"sample": s, "k": 20, "ranking": "random", "accuracy": 1.0, "m_s": 1.0, "tf_drop": 0.5}
             for s in range(10)]
    pd.DataFrame(rows).to_csv(tmp_path / "fig3_niah_progressive.csv", index=False)
    why = _progressive_status("fig3_niah_progressive")(tmp_path).why
    assert "teacher-forced drop of the ranked heads by k" in why
    assert "k = 0 every one of the 10 samples at 0.000 (no interval: all equal)" in why
    assert "k = 20 every one of the 10 samples at 2.000 (no interval: all equal)" in why and "1.250" not in why
    assert "ranked − random every one of the 10 samples at +1.500 (no interval: all equal), 10:0 samples, Holm p = 0.00195" in why


def test_progressive_control_holm_over_two_testable_k_and_the_reverse_direction():
    """Two testable k: at k = 10 the ranked heads fail 8 of 8 samples random heads answer (p = 2/2^8), at k = 20
    random heads fail 7 of 7 that the ranked heads answer (p = 2/2^7, the reverse). Holm: the smaller p times 2,
    the larger times 1 (but never below the first)."""
    rows = [{"sample": s, "k": 0, "ranking": "ranked", "accuracy": 1.0, "m_s": 0.0} for s in range(8)]
    rows += [{"sample": s, "k": 10, "ranking": "ranked", "accuracy": 0.0, "m_s": 2.0} for s in range(8)]
    rows += [{"sample": s, "k": 10, "ranking": "random", "accuracy": 1.0, "m_s": 1.0} for s in range(8)]
    rows += [{"sample": s, "k": 20, "ranking": "ranked", "accuracy": float(s < 7), "m_s": 2.0} for s in range(8)]
    rows += [{"sample": s, "k": 20, "ranking": "random", "accuracy": 0.0, "m_s": 1.0} for s in range(8)]
    result = _result(_grid())
    result.progressive = pd.DataFrame(rows)
    table = progressive_summary(result).set_index("k")
    assert table.loc[10, "p_adjusted"] == pytest.approx(2 * 2 / 2 ** 8)
    assert table.loc[20, "p_adjusted"] == pytest.approx(max(2 * 2 / 2 ** 8, 2 / 2 ** 7))
    assert table.loc[10, "specific"] and not table.loc[10, "reverse"]
    assert table.loc[20, "reverse"] and not table.loc[20, "specific"]
    from dynheads_tl.claims.irreplaceability.report import progressive_control_text

    text = progressive_control_text(table.reset_index(), "accuracy")
    assert "the ranked heads hurt more than as many random heads at k = 10" in text
    assert "random heads hurt more than the ranked ones at k = 20" in text
    assert "n = 8 samples per k" in text and "Holm p = 0.0156" in text
    # Every sample tied at every k: nothing is testable, and the sentence says so instead of a 0.00 "detectable" size.
    tied = pd.DataFrame([{**row, "accuracy": 1.0} for row in rows])
    result.progressive = tied
    text = progressive_control_text(progressive_summary(result), "accuracy")
    assert "no k could be tested" in text and "0.00 at best" not in text


def test_progressive_status_is_not_reproduced_when_random_heads_hurt_more(tmp_path):
    from dynheads_tl.claims.irreplaceability.report import _progressive_status

    rows = [{"sample": s, "k": 0, "ranking": "ranked", "accuracy": 1.0, "m_s": 0.0} for s in range(20)]
    rows += [{"sample": s, "k": 20, "ranking": "ranked", "accuracy": float(s < 8), "m_s": 3.0} for s in range(20)]
    rows += [{"sample": s, "k": 20, "ranking": "random", "accuracy": 0.0, "m_s": 1.0} for s in range(20)]
    pd.DataFrame(rows).to_csv(tmp_path / "fig3_niah_progressive.csv", index=False)
    result = _progressive_status("fig3_niah_progressive")(tmp_path)
    # Accuracy drops (1.00 -> 0.40), but k random heads drop it further on 8 samples and never less: not the claim.
    assert result.status == "not reproduced" and "random heads hurt more than the ranked ones at k = 20" in result.headline


def test_progressive_table_carries_the_teacher_forced_drop_per_k():
    """Teacher-forced progressive runs (Fig 3 / Fig 7's measure that one early error cannot derail): at k = 10 the
    ranked heads' drop exceeds k random heads' on all 8 samples (sign p = 2 / 2^8), at k = 20 on 6 of 8 (p = 0.289,
    Holm: the larger of 2 x 0.0078 and 0.289); k = 0 masks nothing (drop 0, no control)."""
    from dynheads_tl.claims.irreplaceability.report import progressive_teacher_forced_text

    rows = [{"sample": s, "k": 0, "ranking": "ranked", "accuracy": 1.0, "m_s": 0.0, "tf_drop": 0.0} for s in range(8)]
    rows += [{"sample": s, "k": 10, "ranking": "ranked", "accuracy": 0.0, "m_s": 2.0, "tf_drop": 1.0 + 0.1 * s}
             for s in range(8)]
    rows += [{"sample": s, "k": 10, "ranking": "random", "accuracy": 1.0, "m_s": 1.0, "tf_drop": 0.2} for s in range(8)]
    rows += [{"sample": s, "k": 20, "ranking": "ranked", "accuracy": 0.0, "m_s": 2.0, "tf_drop": 0.5 if s < 6 else 0.1}
             for s in range(8)]
    rows += [{"sample": s, "k": 20, "ranking": "random", "accuracy": 1.0, "m_s": 1.0, "tf_drop": 0.3} for s in range(8)]
    result = _result(_grid())
    result.progressive = pd.DataFrame(rows)
    table = progressive_summary(result).set_index("k")
    assert table.loc[0, "tf_drop"] == 0.0 and pd.isna(table.loc[0, "tf_sign_p"])
    assert table.loc[10, "tf_drop"] == pytest.approx(1.35) and table.loc[10, "random_tf_drop"] == pytest.approx(0.2)
    assert (table.loc[10, "tf_ranked_worse"], table.loc[10, "tf_random_worse"]) == (8, 0)
    assert table.loc[10, "tf_difference"] == pytest.approx(1.15)
    assert table.loc[10, "tf_sign_p"] == pytest.approx(2 / 2 ** 8)
    assert (table.loc[20, "tf_ranked_worse"], table.loc[20, "tf_random_worse"]) == (6, 2)
    assert table.loc[20, "tf_p_adjusted"] == pytest.approx(max(2 * 2 / 2 ** 8, table.loc[20, "tf_sign_p"]))
    text = progressive_teacher_forced_text(table.reset_index())
    assert text.startswith("Teacher-forced (the gold token's log-probability drop") and "k = 0: 0.000 [0.000, 0.000]" in text
    assert "8 vs 0 samples with the larger drop, Holm p = 0.0156" in text  # 2 x 2 / 2^8
    assert "Teacher-forced" in summary_markdown({"niah": result}, "tiny")
    assert progressive_teacher_forced_text(progressive_summary(_result(_grid()))) == "", "runs without teacher forcing"
