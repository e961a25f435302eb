"""Claim 2's report part: the paper's Fig 3 anchors, the computed verdict sentences, the notebook's summary and the
index rows.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pandas as pd

from dynheads_tl.analysis.statistics import Interval, detectable_words, format_interval
from dynheads_tl.claim import Claim, Finding, PaperItem, Primary, Verdict

from dynheads_tl.protocols.conditions import grid_conditions, teacher_forced_measure

from .config import (ALPHA, COMPARISONS, HEADROOM_FLOOR, MIN_SAMPLES_TO_COMPARE, PRIMARY, SEEDS, SELECTED_ON_OUTCOME,
                     IrreplaceabilityConfig)
from .pipeline import TaskAblation
from .readings import _declared_verdict, _reading, _resolve_text
from .comparisons import (DROP_METRICS, _condition_interval, _heads, _row, comparison_table, condition_summary, metric_interval,
                          prediction_table, progressive_control_outcome, progressive_summary, progressive_table)
from .rules import PAPER_FIG3, _control_conclusion, _masking_status, _progressive_status

__all__ = ["PAPER_FIG3", "matched_controls_verdict", "progressive_control_text", "progressive_teacher_forced_text",
           "query_baseline_verdict", "primary_verdict", "predicted_verdict", "prediction_text", "PREDICTED_LEAD",
           "PREDICTION_FILE", "summary_markdown"]




def _interval_text(interval: Interval, digits: int = 2) -> str:
    return format_interval(interval.estimate, interval.low, interval.high, digits)


def _reading_of(row, name_a: str, *, fewer: bool) -> str:
    """The computed reading of one comparison row (:func:`comparison_table`)."""
    worse_is_higher = row["metric"] in DROP_METRICS
    if row["n"] < MIN_SAMPLES_TO_COMPARE:
        return f"too few paired samples to compare (at least {MIN_SAMPLES_TO_COMPARE} needed)"
    if not row["headroom"]:
        return (f"not ranked: the unmasked run has no headroom (its interval stays below {HEADROOM_FLOOR}), so this "
                "metric cannot show a masking effect")
    test = (f"sign test {int(row['a_worse'])} vs {int(row['b_worse'])} samples, "
            + ("p" if row["primary"] else "Holm-adjusted p") + f" = {row['p_adjusted']:.3g}"
            if row["p_adjusted"] == row["p_adjusted"] else "")
    if row["a_worse"] + row["b_worse"] == 0:
        return f"the data cannot distinguish them: the two are equal on all {int(row['n'])} samples"
    if not row["testable"]:
        return (f"cannot be tested: only {int(row['a_worse'] + row['b_worse'])} samples differ, too few for a sign "
                f"test to reach {ALPHA}")
    if row["separated"]:
        hurts_more = (row["difference"] > 0) if worse_is_higher else (row["difference"] < 0)
        if hurts_more:
            return f"{name_a} hurts more" + (" although it masks fewer heads" if fewer else "") + f" ({test})"
        return f"{name_a} hurts less" + (" (it also masks fewer heads)" if fewer else "") + f" ({test})"
    return (f"the data cannot distinguish them ({test}); {detectable_words(row['half_width'], digits=3, n=int(row['n']))}"
            f"{_resolve_text(row)}"
            + (f" ({name_a} masks fewer heads, so this does not show its heads matter less)" if fewer else ""))


def _comparison_text(name_a: str, a: Interval, b: Interval, row, what: str, sizes: tuple[float, float], *,
                     digits: int = 2) -> str:
    """"<what> a [low, high] vs b [low, high], difference d [low, high] (paired, n = ..): <reading>", the reading
    from the comparison's row (:func:`comparison_table`, :func:`_reading_of`)."""
    numbers = f"{what} {_interval_text(a, digits)} vs {_interval_text(b, digits)}"
    if row is None:
        return f"{numbers}: too few paired samples to compare (at least {MIN_SAMPLES_TO_COMPARE} needed)"
    if row["n"] >= MIN_SAMPLES_TO_COMPARE:
        numbers += (f", difference {format_interval(row['difference'], row['low'], row['high'], digits)} "
                    f"(paired over n = {int(row['n'])} samples)")
    return f"{numbers}: {_reading_of(row, name_a, fewer=sizes[0] < sizes[1] - 0.05)}"


def matched_controls_verdict(result: TaskAblation, comparisons: pd.DataFrame | None = None) -> str:
    """The computed answer to the issue's two questions, with the intervals, for one task:

    1. Does masking D_t hurt more than masking as many random heads (``random_matched``), and do dynamic and
       static masking differ once sizes are matched (``dynamic`` against ``static_matched``)?
    2. Does masking D_t minus S_20 (``dynamic_nonstatic``) hurt more than masking as many random heads from
       outside S_20 (``random_nonstatic``, size-matched), and than |D_t| random heads (``random_matched``, the
       issue's comparison, which masks more heads)? And S_20 minus D_t against as many random heads from
       outside D_t (``random_nondynamic``)?

    Each is read on the free-generation metric (NIAH accuracy, Wilson interval; HotpotQA F1, bootstrap
    interval over samples) and on the teacher-forced per-step drop of the gold token's log-probability
    (bootstrap over samples), each condition with its own 95% interval, and the reading from ``comparisons``
    (:func:`comparison_table`, over every task when given; this task alone otherwise): "hurts more" only where
    the comparison is separated (exact sign test, Holm-corrected, and the paired interval away from 0); otherwise
    "cannot distinguish" with the effect the design could detect, "cannot be tested", or "not ranked" (no
    headroom)."""
    comparisons = comparison_table(result) if comparisons is None else comparisons
    metric = result.metric
    name = result.data_label
    label = "accuracy" if metric == "accuracy" else "F1"
    matched = ("random_matched", "static_matched", "static_previous", "random_previous", "random_nonstatic",
               "random_nondynamic")
    sentences = []
    for a, b, name_a, name_b in COMPARISONS:
        if b not in matched or a == "predicted":  # the probe's comparisons: predicted_verdict states them
            continue
        free_a, free_b = _condition_interval(result, a, metric), _condition_interval(result, b, metric)
        if free_a is None or free_b is None:
            continue
        free_sizes = (_heads(result, a), _heads(result, b))
        sizes = f"{free_sizes[0]:.1f} vs {free_sizes[1]:.1f} heads masked per step on average"
        parts = [_comparison_text(name_a, free_a, free_b, _row(comparisons, result.task, a, b, metric),
                                  f"free-generation {label}", free_sizes)]
        drop = teacher_forced_measure(a, b)
        tf_a, tf_b = _condition_interval(result, a, drop), _condition_interval(result, b, drop)
        if tf_a is not None and tf_b is not None:
            tf_sizes = (_heads(result, a, "tf_heads_masked_per_step"), _heads(result, b, "tf_heads_masked_per_step"))
            sizes += f"; {tf_sizes[0]:.1f} vs {tf_sizes[1]:.1f} when teacher-forced"
            steps = " over the steps t ≥ 1" if drop == "tf_drop_t1" else ""
            parts.append(_comparison_text(name_a, tf_a, tf_b, _row(comparisons, result.task, a, b, drop),
                                          "teacher-forced drop of the gold token's log-probability in nats per step"
                                          + steps, tf_sizes, digits=3))
        sentences.append(f"{name}, {name_a} against {name_b} ({sizes}): " + "; ".join(parts) + ".")
    return " ".join(sentences) if sentences else f"{name}: the matched controls were not run."


def query_baseline_verdict(result: TaskAblation, comparisons: pd.DataFrame | None = None) -> str:
    """The second static baseline's check for claim 2: does masking D_t still compare with the size-matched static
    baseline the same way when the static ranking is the query-focused one (``query_matched``, QRHead-style) instead
    of Wu et al.'s (``static_matched``)? Each comparison is read from ``comparisons`` (:func:`comparison_table`) as
    in :func:`matched_controls_verdict` (free-generation metric and teacher-forced drop); the conclusion "does not
    change" when both readings agree on both measures."""
    comparisons = comparison_table(result) if comparisons is None else comparisons
    name = result.data_label
    if result.grid[result.grid["condition"] == "query_matched"].empty:
        return f"{name}: the query-focused baseline was not run."
    metric = result.metric
    label = "accuracy" if metric == "accuracy" else "F1"
    parts, readings = [], []
    for baseline, what in (("static_matched", "Wu et al.'s top-|D_t|"), ("query_matched", "the query-focused top-|D_t|")):
        free_a, free_b = _condition_interval(result, "dynamic", metric), _condition_interval(result, baseline, metric)
        free = _row(comparisons, result.task, "dynamic", baseline, metric)
        tf = _row(comparisons, result.task, "dynamic", baseline, "tf_drop")
        readings.append((_reading(free), _reading(tf)))
        text = _comparison_text("masking D_t", free_a, free_b, free, f"free-generation {label}",
                                (_heads(result, "dynamic"), _heads(result, baseline)))
        parts.append(f"against {what}: {text}")
    same = readings[0] == readings[1]
    return (f"{name}, masking D_t " + "; ".join(parts) + ". With the query-focused static baseline the conclusion "
            + ("does not change" if same else "changes")
            + f" (free-generation / teacher-forced readings: Wu {readings[0][0]} / {readings[0][1]}; query-focused "
              f"{readings[1][0]} / {readings[1][1]}).")


def primary_verdict(comparisons: pd.DataFrame) -> Verdict:
    """Claim 2's declared primary (:data:`PRIMARY`: D_{t-1} against as many top static heads, steps t ≥ 1), then D_t
    against as many (:data:`SELECTED_ON_OUTCOME`, secondary: chosen on the step's own outcome), each in one computed
    sentence (:func:`_declared_verdict`)."""
    primary = _declared_verdict(comparisons, PRIMARY, "Primary comparison")
    # What the declared primary cannot tell (issue 60): it favours sets that persist from step to step.
    primary = primary.replace("steps t ≥ 1): ", f"steps t ≥ 1; {PERSISTENCE_NOTE}): ", 1)
    return Verdict(("primary", primary),
                   ("selected on outcome", _declared_verdict(comparisons, SELECTED_ON_OUTCOME, "Beside it, the set "
                                                             "chosen on the step's own outcome (secondary, partly "
                                                             "expected from selection alone)", judge=False)),
                   declared=("primary", "selected on outcome"))


# Beside claim 2's primary: masking D_{t-1} can only remove step t's retrieving heads that were already retrieving at
# t - 1, so the more D_t rotates (claim 1), the less it can hurt; the probe-predicted set, known before the step too,
# has no such bias.
PERSISTENCE_NOTE = ("a comparison that favours persistence: the more D_t rotates, the fewer of step t's retrieving "
                    "heads D_{t-1} holds, so rotation itself shrinks its effect; the probe-predicted set, also known "
                    "before the step, is the comparison without that bias")


# The sentences of the probe's condition start with this.
PREDICTED_LEAD = "Probe-predicted set"


def _task_label(task: str, prediction: pd.DataFrame | None = None) -> str:
    """The task's name: the ``data`` the prediction table recorded for it, else "NIAH" or "HotpotQA (synthetic)" (a
    table from before the column existed came from synthetic questions)."""
    if prediction is not None and "data" in getattr(prediction, "columns", ()):
        named = prediction.loc[prediction["task"] == task, "data"].dropna()
        if len(named):
            return str(named.iloc[0])
    return "NIAH" if task == "niah" else "HotpotQA (synthetic)"


def prediction_text(prediction: pd.DataFrame, task: str) -> str:
    """How well the probe predicted D_t on one task's analysis samples, in one computed sentence from
    :func:`~.comparisons.prediction_table`: the share of D_t's heads its set held (recall, BCa 95%) and the share of
    its heads that were in D_t (precision), beside D_{t-1}, as many top static heads and chance at the same sizes;
    empty when the run has no such rows."""
    part = prediction[prediction["task"] == task] if len(prediction) else prediction
    if part.empty or "tf_masked_in_dt_t1" not in set(part["column"]):
        return ""
    rows = part.set_index("column")
    probe = rows.loc["tf_masked_in_dt_t1"]
    share = lambda row, metric: format_interval(row[metric], row[f"{metric}_low"], row[f"{metric}_high"], 2)
    others = [f"{rows.loc[column, 'set']} {rows.loc[column, 'recall']:.2f}" for column in
              ("tf_previous_in_dt_t1", "tf_static_in_dt_t1", "tf_chance_in_dt_t1") if column in rows.index]
    return (f"{PREDICTED_LEAD} ({_task_label(task, prediction)}, how well it predicted D_t): on the n = {int(probe['n'])} "
            f"analysis samples, teacher-forced over the steps t ≥ 1, the probe's top-|D_{{t-1}}| heads held "
            f"{share(probe, 'recall')} of D_t's {int(probe['dt_heads'])} head-steps (recall) and "
            f"{share(probe, 'precision')} of its own {int(probe['set_heads'])} were in D_t (precision; BCa 95% over "
            f"samples)" + (f"; at the same sizes the recall of {', '.join(others)}" if others else "") + ".")


def predicted_verdict(comparisons: pd.DataFrame, prediction: pd.DataFrame | None = None,
                      tasks: tuple[str, ...] = ("niah", "hotpot")) -> Verdict:
    """The probe's condition (``predicted``: its top-|D_{t-1}| heads from step t-1's clean hidden state, a set known
    before step t; an exploratory secondary, preregistration.yaml's deviation of 2026-12-04) per task: masking it
    against as many top static heads and as many random heads, on the teacher-forced drop over the steps t ≥ 1 (each
    in one computed sentence without a status word: :func:`_declared_verdict`, Holm-adjusted within claim 2's
    secondaries), then how well it predicted D_t (:func:`prediction_text`). Empty for a run without the condition
    (its comparisons are not in the table), so a report from before it reads as it did."""
    sentences = []
    for task in tasks:
        for baseline in ("static_previous", "random_previous"):
            declared = (task, "predicted", baseline, teacher_forced_measure("predicted", baseline))
            if _row(comparisons, *declared) is None:
                continue
            sentences.append((f"{task}:{baseline}", _declared_verdict(
                comparisons, declared, f"{PREDICTED_LEAD}, an exploratory secondary", judge=False,
                task_label=_task_label(task, prediction))))
        if prediction is not None:
            sentences.append((f"{task}:prediction", prediction_text(prediction, task)))
    return Verdict(*sentences, declared=[f"{task}:{part}" for task in ("niah", "hotpot")
                                         for part in ("static_previous", "random_previous", "prediction")])


def _paper_comparison(result: TaskAblation, comparisons: pd.DataFrame | None = None) -> str:
    """The paper's reading (dynamic hurts more than static top-k and random k), read from ``comparisons``
    (:func:`comparison_table`: exact sign test, Holm-corrected, and the paired interval)."""
    comparisons = comparison_table(result) if comparisons is None else comparisons
    metric, k = result.metric, result.setup.k
    label = "accuracy" if metric == "accuracy" else "F1"
    texts = []
    for other, name in (("static", f"the static top-{k}"), ("random", f"{k} random heads")):
        row = _row(comparisons, result.task, "dynamic", other, metric)
        if row is None:
            continue
        numbers = f"dynamic − {other} {format_interval(row['difference'], row['low'], row['high'])}"
        reading = _reading(row)
        if reading == "too few samples":
            texts.append(f"too few samples to compare dynamic masking with masking {name}")
        elif reading == "no headroom":
            texts.append(f"dynamic masking and masking {name} are not ranked: the unmasked {label} has no headroom "
                         f"({numbers})")
        elif reading == "cannot be tested":
            texts.append(f"dynamic masking and masking {name} cannot be tested: too few samples differ ({numbers})")
        elif reading == "D_t hurts more":
            texts.append(f"dynamic masking hurts more than masking {name} ({numbers}, Holm-adjusted sign-test "
                         f"p = {row['p_adjusted']:.3g})")
        elif reading == "D_t hurts less":
            texts.append(f"dynamic masking hurts less than masking {name} ({numbers}, Holm-adjusted sign-test "
                         f"p = {row['p_adjusted']:.3g})")
        elif row["a_worse"] + row["b_worse"] == 0:
            texts.append(f"dynamic masking and masking {name} are equal on all {int(row['n'])} samples ({numbers})")
        else:
            texts.append(f"dynamic masking and masking {name} cannot be told apart ({numbers}; the design could "
                         f"detect about ±{2.8 / 1.96 * row['half_width']:.2f} with 80% power{_resolve_text(row)})")
    sizes = f"D_t held {_heads(result, 'dynamic'):.1f} heads per step on average against k = {k}"
    return ("; ".join(texts) + f" ({label}; paired differences over the same samples, 95% bootstrap intervals, "
            f"exact sign tests; {sizes}, so these comparisons are not size-matched).") if texts else ""


def summary_markdown(results: dict[str, TaskAblation], model_label: str,
                     comparisons: pd.DataFrame | None = None) -> str:
    """The notebook's closing summary: the primary comparison first (:func:`primary_verdict`), then every number
    with n and its 95% interval, every reading computed from ``comparisons`` (:func:`comparison_table` over all
    tasks: exact sign tests, Holm over the secondary comparisons)."""
    comparisons = comparison_table(results) if comparisons is None else comparisons
    lines = [f"**Model:** {model_label}. Masking is {results['niah'].setup.mode}-ablation of `hook_z`; "
             f"the KV cache keeps the {results['niah'].setup.keep_cache} pass of each step. Intervals are 95% "
             "(Wilson for accuracy, bootstrap over samples otherwise); a difference between two conditions is "
             "claimed only where an exact sign test on the paired samples (Holm over every secondary comparison of "
             "both tasks; the primary alone) is below 0.05 and the paired 95% bootstrap interval excludes 0; a "
             f"free-generation ranking needs the unmasked interval to reach {HEADROOM_FLOOR}.",
             f"- {primary_verdict(comparisons)}"]
    predicted = predicted_verdict(comparisons, prediction_table(results))
    if predicted:
        lines.append(f"- {predicted}")
    for task, result in results.items():
        summary = condition_summary(result).set_index("condition")
        metric = result.metric
        name = "NIAH accuracy" if task == "niah" else f"{result.data_label} F1"
        cells = ", ".join(
            f"{condition.replace('_', ' ')} {summary.loc[condition, metric]:.2f} "
            f"[{summary.loc[condition, f'{metric}_low']:.2f}, {summary.loc[condition, f'{metric}_high']:.2f}]"
            for condition in summary.index)
        n = int(summary["n"].min())
        lines.append(f"- **{name}** (free generation, n = {n} runs per condition): {cells}. "
                     + _paper_comparison(result, comparisons))
        if "tf_drop" in summary:
            drops = ", ".join(
                f"{condition.replace('_', ' ')} {summary.loc[condition, 'tf_drop']:.3f} "
                f"[{summary.loc[condition, 'tf_drop_low']:.3f}, {summary.loc[condition, 'tf_drop_high']:.3f}]"
                for condition in summary.index)
            lines.append(f"- **{name.split()[0]} teacher-forced** (per-step drop of the gold token's log-probability, "
                         f"nats, mean over the gold continuation's steps, n = {n} samples per condition): {drops}.")
        lines.append(f"- **Matched controls ({name.split()[0]})**: {matched_controls_verdict(result, comparisons)}")
        prog = progressive_summary(result)
        first, last = prog.iloc[0], prog.iloc[-1]
        interval = lambda row: f"{float(row[metric]):.2f} [{float(row[f'{metric}_low']):.2f}, {float(row[f'{metric}_high']):.2f}]"
        at20 = prog[prog["k"] == 20]
        at20_text = f", {interval(at20.iloc[0])} at k = 20" if len(at20) and int(last["k"]) != 20 else ""
        later = prog[prog["k"] >= 5]
        m_s_text = (f"; compensation m_s (heads masked at the step left out) for k ≥ 5 ranges "
                    f"{later['m_s'].min():.1f}–{later['m_s'].max():.1f} static-top-20 heads") if len(later) else ""
        control = progressive_control_text(prog, metric)
        forced = progressive_teacher_forced_text(prog)
        lines.append(f"- **Progressive masking ({name})** (n = {int(prog['n'].min())} samples per k): "
                     f"{interval(first)} at k = 0{at20_text}, {interval(last)} at k = {int(last['k'])}{m_s_text}"
                     + (" (paper, NIAH on Llama-3.1-8B: 1.0 → 0.0 by k = 20; 4.5–7 compensating heads)." if task == "niah" else ".")
                     + (f" {control}" if control else "") + (f" {forced}" if forced else ""))
    return "\n".join(lines)


def progressive_control_text(table: pd.DataFrame, metric: str) -> str:
    """The size-matched control of progressive masking in one sentence, from :func:`progressive_table`: at each k
    the paired difference ranked − random with its sign test and Holm-adjusted p (or why it cannot be tested), and
    m_s beside the random baseline's; empty when the run has no control."""
    outcome = progressive_control_outcome(table)
    if outcome is None:
        return ""
    parts = []
    for _, row in table.dropna(subset=["sign_p"]).iterrows():
        tested = (f"Holm p = {row['p_adjusted']:.3g}" if row["p_adjusted"] == row["p_adjusted"] else
                  f"cannot reach p < {ALPHA} with {int(row['ranked_worse'] + row['random_worse'])} differing samples")
        parts.append(f"k = {int(row['k'])}: random {format_interval(row[f'random_{metric}'], row[f'random_{metric}_low'], row[f'random_{metric}_high'])}, "
                     f"ranked − random {format_interval(row['difference'], row['difference_low'], row['difference_high'], signed=True)} "
                     f"({int(row['ranked_worse'])} vs {int(row['random_worse'])} samples worse, sign p = {row['sign_p']:.3g}, "
                     f"{tested}; m_s {row['m_s']:.1f} [{row['m_s_low']:.1f}, {row['m_s_high']:.1f}] vs random "
                     f"{row['random_m_s']:.1f} [{row['random_m_s_low']:.1f}, {row['random_m_s_high']:.1f}])")
    return f"Size-matched control (k random heads per step, n = {outcome['n']} samples per k): " \
           + "; ".join(parts) + f". So {_control_conclusion(outcome)}."


def progressive_teacher_forced_text(table: pd.DataFrame) -> str:
    """Progressive masking's teacher-forced drop per k (:func:`progressive_table`'s ``tf_`` columns: ranked, random
    and their paired difference with the sign test, Holm over k) in one sentence; empty without teacher forcing."""
    if "tf_drop" not in table or not table["tf_drop"].notna().any():
        return ""
    parts = []
    for _, row in table.iterrows():
        text = f"k = {int(row['k'])}: {format_interval(row['tf_drop'], row['tf_drop_low'], row['tf_drop_high'], 3)}"
        if "tf_sign_p" in table and row["tf_sign_p"] == row["tf_sign_p"]:
            tested = (f"Holm p = {row['tf_p_adjusted']:.3g}" if row["tf_p_adjusted"] == row["tf_p_adjusted"] else
                      f"cannot reach p < {ALPHA} with {int(row['tf_ranked_worse'] + row['tf_random_worse'])} "
                      "differing samples")
            text += (f" vs random {format_interval(row['random_tf_drop'], row['random_tf_drop_low'], row['random_tf_drop_high'], 3)}, "
                     f"ranked − random {format_interval(row['tf_difference'], row['tf_difference_low'], row['tf_difference_high'], 3, signed=True)} "
                     f"({int(row['tf_ranked_worse'])} vs {int(row['tf_random_worse'])} samples with the larger drop, {tested})")
        parts.append(text)
    return ("Teacher-forced (the gold token's log-probability drop, nats per step, bootstrap 95% over samples): "
            + "; ".join(parts) + ".")


# --- the index: claim 2's rows, read from the files the notebook wrote ---------------------------


def _masking_headline(stem: str) -> Callable[[Path], str]:
    def headline(folder: Path) -> str:
        """Per condition the free-generation metric (Wilson 95% for accuracy, bootstrap 95% over samples for F1) and
        the teacher-forced drop of the gold token's log-probability (nats per step, bootstrap 95%), with n."""
        frame = pd.read_csv(folder / f"{stem}.csv")
        metric = "accuracy" if "accuracy" in frame else "f1"
        conditions = [c for c in grid_conditions() if c in set(frame["condition"])]
        free, drops = [], []
        for condition in conditions:
            part = frame[frame["condition"] == condition]
            a = metric_interval(part[metric], metric)
            free.append(f"{condition.replace('_', ' ')} {a.estimate:.2f} [{a.low:.2f}, {a.high:.2f}]")
            if "tf_drop" in part:
                d = metric_interval(part["tf_drop"], "tf_drop")
                drops.append(f"{condition.replace('_', ' ')} {d.estimate:.2f} [{d.low:.2f}, {d.high:.2f}]")
        n = int(frame.groupby("condition").size().min())
        text = f"{metric} ({'Wilson' if metric == 'accuracy' else 'bootstrap'} 95%, n = {n} per condition): " + ", ".join(free)
        return text + ("; teacher-forced gold log-prob drop, nats/step (bootstrap 95%): " + ", ".join(drops) if drops else "")
    return headline


def _progressive_headline(stem: str) -> Callable[[Path], str]:
    def headline(folder: Path) -> str:
        frame = pd.read_csv(folder / f"{stem}.csv")
        metric = "accuracy" if "accuracy" in frame else "f1"
        table = progressive_table(frame, metric)
        cell = lambda row, prefix="": (f"{row[f'{prefix}{metric}']:.2f} [{row[f'{prefix}{metric}_low']:.2f}, "
                                       f"{row[f'{prefix}{metric}_high']:.2f}], m_s {row[f'{prefix}m_s']:.1f}")
        controlled = f"random_{metric}" in table
        parts = [f"k={int(row['k'])}: {cell(row)}"
                 + (f" (random k: {cell(row, 'random_')})" if controlled and pd.notna(row[f"random_{metric}"]) else "")
                 for _, row in table.iterrows()]
        return "; ".join(parts) + (f" ({metric}, {'Wilson' if metric == 'accuracy' else 'bootstrap'} 95%, "
                                   f"n = {int(table['n'].min())} samples per k)")
    return headline


def _primary(folder: Path) -> dict | None:
    """:data:`PRIMARY`'s row of ``comparisons.csv``: the paired difference, its interval, n and the sign test."""
    row = _row(pd.read_csv(folder / "comparisons.csv"), *PRIMARY)
    if row is None:
        return None
    task, a, b, metric = PRIMARY
    return {"estimate": float(row["difference"]), "low": float(row["low"]), "high": float(row["high"]),
            "n": int(row["n"]), "units": "samples", "test": "exact two-sided sign test over samples; 95% bootstrap "
            "interval", "p": float(row["sign_p"]), "p_adjusted": float(row["p_adjusted"]),
            "computed": f"{task}: {a} − {b}, {metric} (nats/step)"}


# The notebook's table of how well the probe predicted D_t (prediction_table), which the finding reads.
PREDICTION_FILE = "predicted_set_overlap"


def _finding_sentences(folder: Path) -> list[str]:
    """The README's sentences of claim 2, from the files the notebook wrote: the primary and D_t beside it, then
    (in a run with the probe's condition) the probe's NIAH sentences: its two comparisons and how well it predicted
    D_t."""
    comparisons = pd.read_csv(folder / "comparisons.csv")
    overlap = folder / f"{PREDICTION_FILE}.csv"
    prediction = pd.read_csv(overlap) if overlap.exists() else None
    return (primary_verdict(comparisons).quote("primary", "selected on outcome")
            + predicted_verdict(comparisons, prediction, tasks=("niah",)).quote(
                "niah:static_previous", "niah:random_previous", "niah:prediction"))


CLAIM = Claim(
    notebook="02_irreplaceability",
    title="Claim 2: irreplaceability",
    config=IrreplaceabilityConfig,
    presets={
        "smoke": {"hotpot_source": "synthetic", "niah_contexts": [300], "niah_depths": [0.5], "hotpot_contexts": [250], "hotpot_depths": [0.5],
                  "runs_per_cell": 1, "n_calibration": 2, "max_new_tokens": 32, "hotpot_max_new_tokens": 8,
                  "progressive_k_max": 10, "progressive_k_step": 5, "n_progressive": 1, "progressive_context": 300},
        "paper": {"model": "meta-llama/Llama-3.1-8B-Instruct", "niah_contexts": [5000, 10000, 20000, 30000, 40000, 50000],
                  "niah_depths": [0.0, 0.25, 0.5, 0.75, 1.0], "hotpot_contexts": [250, 1000, 2000, 3000, 3750],
                  "hotpot_depths": [0.05, 0.25, 0.5, 0.75, 0.95], "runs_per_cell": 5, "n_calibration": 100,
                  "max_new_tokens": 64, "progressive_k_max": 70, "progressive_k_step": 5, "n_progressive": 20,
                  "progressive_context": 20000,
                  # KV cache of Llama-3.1-8B at 50k tokens: ~6.4 GB per row in bf16; the calibration traces cycle
                  # through the contexts, so a batch is padded to the widest of them
                  "batch_size": 4, "trace_batch_size": 4},
    },
    items=(
        PaperItem("Fig 2", "NIAH accuracy heatmaps under dynamic / static / random masking (ours beside them: "
                  "size-matched controls and a teacher-forced drop of the gold token's log-probability)",
                  "dynamic masking destroys retrieval; static and random barely matter", "fig2_niah_masking", 3,
                  _masking_headline("fig2_niah_masking"), _masking_status("niah")),
        PaperItem("Fig 3", "NIAH progressive masking",
                  f"accuracy {PAPER_FIG3['accuracy_at_k0']:.1f} → {PAPER_FIG3['accuracy_at_k20']:.1f} by k = 20; "
                  f"{PAPER_FIG3['m_s_range_k_ge_5'][0]:g}–{PAPER_FIG3['m_s_range_k_ge_5'][1]:g} compensating static "
                  "heads for k ≥ 5", "fig3_niah_progressive", 4, _progressive_headline("fig3_niah_progressive"),
                  _progressive_status("fig3_niah_progressive")),
        PaperItem("Fig 6", "HotpotQA F1 heatmaps under masking (ours beside them: as in Fig 2)", "as Fig 2",
                  "fig6_hotpot_masking", 7, _masking_headline("fig6_hotpot_masking"), _masking_status("hotpot"),
                  hotpot=True),
        PaperItem("Fig 7", "HotpotQA progressive masking (heads ranked by Eq. 2)", "as Fig 3",
                  "fig7_hotpot_progressive", 8, _progressive_headline("fig7_hotpot_progressive"),
                  _progressive_status("fig7_hotpot_progressive"), hotpot=True),
    ),
    findings=(Finding("Claim 2, irreplaceability", _finding_sentences, "Every comparison, tested"),),
    # The id of what PRIMARY computes (D_t against as many top static heads); the pre-registered primary is the fair
    # D_{t-1} comparison, so tests/test_preregistration.py marks this claim as not yet computing it.
    primary=Primary("fair_previous_step_vs_static", _primary, item="Fig 2"),
    seeds=SEEDS,
)
