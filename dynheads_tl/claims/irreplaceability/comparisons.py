"""Claim 2's numbers and tests: every condition with its interval, the paired comparisons with exact sign tests and
Holm, the headroom gate, the progressive curve and the protocol's own checks.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dynheads_tl.analysis.statistics import Interval, bootstrap_interval, wilson_interval, mark_separated, n_to_resolve, paired_sign_test, ratio_of_sums, holm_testable, sign_test_min_p, sign_test_needs
from dynheads_tl.protocols.conditions import teacher_forced_measure

from .config import ALPHA, COMPARISONS, HEADROOM_FLOOR, MIN_SAMPLES_TO_COMPARE, PRIMARY
from .pipeline import TaskAblation

__all__ = [
    "DROP_METRICS", "metric_interval", "condition_summary", "paired_difference", "comparison_table", "protocol_checks",
    "progressive_summary", "progressive_table", "progressive_control_outcome", "PREDICTION_SETS", "prediction_table",
]


# The teacher-forced drops (nats per step, higher = masking hurt more): over every gold step, and over the steps
# t >= 1 (the steps on which D_{t-1} exists; teacher_forced_measure).
DROP_METRICS = ("tf_drop", "tf_drop_t1")


def metric_interval(values: pd.Series, metric: str, seed: int = 0) -> Interval:
    """The 95% interval of a per-sample metric: Wilson for a 0/1 proportion (NIAH accuracy, EM), a
    percentile bootstrap over samples otherwise (F1, ROUGE-L, log-probability drops). NaNs are left out."""
    data = pd.to_numeric(values, errors="coerce").dropna().to_numpy(dtype=float)
    if len(data) == 0:
        return Interval(float("nan"), float("nan"), float("nan"), 0)
    if metric in ("accuracy", "em"):
        return wilson_interval(int(round(data.sum())), len(data))
    return bootstrap_interval(data, seed=seed)


def condition_summary(result: TaskAblation) -> pd.DataFrame:
    """One row per masking condition: n (runs = samples), the metrics with 95% intervals
    (:func:`metric_interval`; ``*_low`` / ``*_high``), m_s and the mean heads masked per step, in free
    generation and under teacher forcing (``tf_`` columns: per-step drop of the gold token's log-probability,
    over all gold steps, over the steps t >= 1 and over the steps where something was masked, in nats)."""
    grid = result.grid
    metrics = [c for c in ("accuracy", "f1", "em", "rouge_l", "tf_drop", "tf_drop_t1", "tf_drop_masked") if c in grid]
    rows = []
    for condition, part in grid.groupby("condition", sort=False):
        row = {"condition": condition, "n": len(part), "k_static_random": result.setup.k}
        for metric in metrics:
            interval = metric_interval(part[metric], metric)
            row.update({metric: interval.estimate, f"{metric}_low": interval.low, f"{metric}_high": interval.high})
            if metric == "tf_drop_masked":
                row["n_tf_masked"] = interval.n  # samples with at least one masked step
        for column in ("m_s", "heads_masked_per_step", "tf_heads_masked_per_step", "tf_steps"):
            if column in part:
                row[column] = float(part[column].mean())
        for column in ("m_s", "heads_masked_per_step"):  # bootstrap 95% over samples
            if column in part and len(part.dropna(subset=[column])):
                interval = bootstrap_interval(part[column].dropna().to_numpy(dtype=float))
                row.update({f"{column}_low": interval.low, f"{column}_high": interval.high})
        rows.append(row)
    return pd.DataFrame(rows)


def _paired(result: "TaskAblation", a: str, b: str, metric: str) -> pd.DataFrame | None:
    """Conditions a and b side by side on ``metric``, one row per sample (grid cell and run); None when absent."""
    keys = [c for c in ("context", "depth", "run") if c in result.grid]
    if metric not in result.grid:
        return None
    side = lambda c: result.grid[result.grid["condition"] == c].set_index(keys)[metric].astype(float)
    joined = pd.concat([side(a).rename("a"), side(b).rename("b")], axis=1, join="inner").dropna()
    return None if joined.empty else joined


def paired_difference(result: "TaskAblation", a: str, b: str, metric: str, seed: int = 0) -> Interval | None:
    """Mean over samples of (condition a − condition b) on ``metric``, pairing the two conditions' runs on the same
    sample (grid cell and run), with a percentile-bootstrap 95% interval that resamples samples. Every condition
    runs on the same samples, so this interval is much narrower than the two conditions' own intervals suggest."""
    joined = _paired(result, a, b, metric)
    return None if joined is None else bootstrap_interval((joined["a"] - joined["b"]).to_numpy(), seed=seed)


def _has_headroom(result: "TaskAblation", metric: str) -> bool:
    if metric in DROP_METRICS:
        return True
    unmasked = _condition_interval(result, "none", metric)
    return unmasked is not None and unmasked.high >= HEADROOM_FLOOR


def comparison_table(results: "dict[str, TaskAblation] | TaskAblation", *, alpha: float = ALPHA,
                     seed: int = 0) -> pd.DataFrame:
    """Every comparison of :data:`COMPARISONS` on each task, on the free-generation metric and on the teacher-forced
    drop (``tf_drop``, or ``tf_drop_t1`` over the steps t >= 1 where a side is sized by D_{t-1} and so masks nothing
    at t = 0: :func:`~dynheads_tl.protocols.conditions.teacher_forced_measure`): one row each, with the paired difference a − b (bootstrap 95% over samples, ``n`` samples, each NIAH run
    its own haystack offset and UUID), the exact two-sided sign test on the samples where the two differ
    (:func:`~dynheads_tl.analysis.statistics.paired_sign_test`; ``a_worse`` / ``b_worse``: samples where a's / b's
    masking hurt more), and:

    - ``evaluable``: at least :data:`MIN_SAMPLES_TO_COMPARE` pairs and headroom (:data:`HEADROOM_FLOOR`);
    - ``primary``: :data:`PRIMARY`, tested alone (its ``p_adjusted`` is its own ``sign_p``);
    - ``p_adjusted``: Holm over the evaluable secondary comparisons of both tasks that can reach ``alpha`` at all
      (``testable``: enough differing samples, Tarone); NaN for the untestable;
    - ``separated``: evaluable, adjusted p below ``alpha`` and the interval away from 0;
    - ``half_width`` and ``n_to_resolve``: the smallest difference the design could detect, and about how many
      samples would resolve the observed one."""

    results = {results.task: results} if isinstance(results, TaskAblation) else results
    rows = []
    for task, result in results.items():
        for measure in (result.metric, "teacher-forced"):
            for a, b, _, _ in COMPARISONS:
                metric = teacher_forced_measure(a, b) if measure == "teacher-forced" else measure
                worse_is_higher = metric in DROP_METRICS
                headroom = _has_headroom(result, metric)
                joined = _paired(result, a, b, metric)
                if joined is None:
                    continue
                test = paired_sign_test(joined["a"].to_numpy(), joined["b"].to_numpy(), seed=seed)
                diff = test.difference
                a_worse, b_worse = (test.a_better, test.b_better) if worse_is_higher else (test.b_better, test.a_better)
                rows.append({"task": task, "a": a, "b": b, "metric": metric, "n": diff.n,
                             "difference": diff.estimate, "low": diff.low, "high": diff.high,
                             "a_worse": a_worse, "b_worse": b_worse, "a_better": b_worse, "b_better": a_worse,
                             "sign_p": test.sign_p, "headroom": headroom,
                             "evaluable": diff.n >= MIN_SAMPLES_TO_COMPARE and headroom,
                             "primary": (task, a, b, metric) == PRIMARY,
                             "half_width": diff.half_width, "n_to_resolve": n_to_resolve(diff)})
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    table = mark_separated(table, alpha, family=(table["evaluable"] & ~table["primary"]).to_numpy(), testable_only=True)
    table["separated"] = table["separated"] & table["evaluable"]
    return table


# How well a set known before step t held the actual D_t (the ``predicted`` condition's teacher-forced rows,
# :func:`~dynheads_tl.protocols.ablation_metrics.overlap_with_dynamic`): each set's column of heads inside D_t, and
# its name. Every set has |D_{t-1}| heads at step t, so their recalls compare at equal size.
PREDICTION_SETS = (("tf_masked_in_dt_t1", "the probe's predicted set"), ("tf_previous_in_dt_t1", "D_{t-1}"),
                   ("tf_static_in_dt_t1", "the top-|D_{t-1}| static heads"),
                   ("tf_chance_in_dt_t1", "|D_{t-1}| random heads (expected)"))


def prediction_table(results: "dict[str, TaskAblation] | TaskAblation", seed: int = 0) -> pd.DataFrame:
    """How well the probe predicted D_t on the analysis samples (the grid's ``predicted`` runs, teacher-forced,
    steps t >= 1), beside the other sets of the same size known before the step: per task and set
    (:data:`PREDICTION_SETS`), ``recall`` = its heads inside D_t / the heads of D_t and ``precision`` = its heads
    inside D_t / its heads, each pooled over samples (a ratio of sums) with a BCa 95% interval that resamples samples
    (each grid sample is its own layout), and ``n`` samples, ``dt_heads`` and ``set_heads`` (the sums). Empty when no
    run recorded the overlap (runs without the ``predicted`` condition)."""

    results = {results.task: results} if isinstance(results, TaskAblation) else results
    rows = []
    for task, result in results.items():
        grid = result.grid
        part = grid[grid["condition"] == "predicted"] if "condition" in grid else grid.iloc[:0]
        if part.empty or "tf_masked_in_dt_t1" not in part:
            continue
        part = part.dropna(subset=["tf_masked_in_dt_t1", "tf_dt_heads_t1", "tf_masked_heads_t1"])
        if part.empty:
            continue
        for column, name in PREDICTION_SETS:
            if column not in part or part[column].isna().all():
                continue
            hits = part[column].to_numpy(dtype=float)
            row = {"task": task, "data": result.data_label, "set": name, "column": column, "n": len(part),
                   "dt_heads": float(part["tf_dt_heads_t1"].sum()),
                   "set_heads": float(part["tf_masked_heads_t1"].sum())}
            for metric, total in (("recall", "tf_dt_heads_t1"), ("precision", "tf_masked_heads_t1")):
                pairs = np.column_stack([hits, part[total].to_numpy(dtype=float)])
                interval = (bootstrap_interval(pairs, ratio_of_sums, seed=seed) if pairs[:, 1].sum() > 0
                            else Interval(float("nan"), float("nan"), float("nan"), len(pairs)))
                row.update({metric: interval.estimate, f"{metric}_low": interval.low, f"{metric}_high": interval.high})
            rows.append(row)
    return pd.DataFrame(rows, columns=["task", "set", "column", "n", "dt_heads", "set_heads", "recall", "recall_low",
                                       "recall_high", "precision", "precision_low", "precision_high"])


def _row(table: pd.DataFrame, task: str, a: str, b: str, metric: str):
    hit = table[(table["task"] == task) & (table["a"] == a) & (table["b"] == b) & (table["metric"] == metric)] \
        if not table.empty else table
    return None if hit.empty else hit.iloc[0]


def _condition_interval(result: TaskAblation, condition: str, metric: str) -> Interval | None:
    part = result.grid[result.grid["condition"] == condition]
    if part.empty or metric not in part:
        return None
    return metric_interval(part[metric], metric)


def _heads(result: TaskAblation, condition: str, column: str = "heads_masked_per_step") -> float:
    part = result.grid[result.grid["condition"] == condition]
    return float(part[column].mean()) if column in part and len(part) else float("nan")


def protocol_checks(result: TaskAblation) -> pd.DataFrame:
    """Sanity checks of the protocol on this run's own outputs (shown in the notebook, tested):
    k = 0 must reproduce the unmasked generation, and the three conditions must mask different heads."""
    prog = result.progressive
    k0 = prog[prog["k"] == 0]
    same = int((k0["response"] == k0["unmasked_response"]).sum())
    masked = result.grid.pivot_table(index=[c for c in ("context", "depth", "run") if c in result.grid],
                                     columns="condition", values="heads_ever_masked", aggfunc="first").fillna("")
    differ = int(((masked["dynamic"] != masked["static"]) & (masked["static"] != masked["random"])
                  & (masked["dynamic"] != masked["random"])).sum())
    rows = [
        {"check": "progressive k = 0 gives the unmasked response", "passed": f"{same}/{len(k0)}",
         "ok": same == len(k0)},
        {"check": "grid runs where dynamic, static and random mask different heads", "passed": f"{differ}/{len(masked)}",
         "ok": differ == len(masked)},
    ]
    if "tf_drop" in result.grid:
        unmasked = result.grid[result.grid["condition"] == "none"]["tf_drop"]
        exact = int((unmasked == 0).sum())
        rows.append({"check": "teacher-forced, nothing masked: the drop is exactly 0", "passed": f"{exact}/{len(unmasked)}",
                     "ok": exact == len(unmasked)})
    return pd.DataFrame(rows)


def _rankings(progressive: pd.DataFrame) -> pd.Series:
    """Which rows are the paper's ranked masking and which its random control (runs from before the control are
    all ranked)."""
    return progressive["ranking"] if "ranking" in progressive else pd.Series("ranked", index=progressive.index)


def progressive_summary(result: TaskAblation, *, alpha: float = ALPHA, seed: int = 0) -> pd.DataFrame:
    """:func:`progressive_table` of a task's progressive runs."""
    return progressive_table(result.progressive, result.metric, alpha=alpha, seed=seed)


def progressive_table(prog: pd.DataFrame, metric: str, *, alpha: float = ALPHA, seed: int = 0) -> pd.DataFrame:
    """The progressive runs (one row per sample, k and ranking, as the notebook's CSV holds them), per k: n (samples), the metric with its 95% interval (:func:`metric_interval`) and m_s (mean, bootstrap 95%
    over samples) of the ranked masking; where the run has the size-matched control (k random heads per step),
    the same for it (``random_`` columns) and the paired comparison on each sample: ``difference`` ranked − random
    (bootstrap 95%), ``ranked_worse`` / ``random_worse`` (samples where that masking scored lower), the exact sign
    test ``sign_p``, ``p_adjusted`` (Holm over the k values whose sign test can reach ``alpha``; NaN for the
    others, :func:`~dynheads_tl.analysis.statistics.holm_testable`) and ``specific``: the ranked heads hurt more
    than random ones (adjusted p below ``alpha``, interval below 0). Where the runs were also teacher-forced, the
    gold token's log-probability drop per k joins them (:func:`_progressive_drops`: ``tf_`` columns)."""

    ranking = _rankings(prog)
    ranked, random = prog[ranking == "ranked"], prog[ranking == "random"]

    def summary(part: pd.DataFrame, prefix: str = "") -> dict:
        interval = metric_interval(part[metric], metric, seed=seed)
        m_s = bootstrap_interval(part["m_s"].to_numpy(dtype=float), seed=seed)
        return {f"{prefix}n": len(part), f"{prefix}{metric}": interval.estimate, f"{prefix}{metric}_low": interval.low,
                f"{prefix}{metric}_high": interval.high, f"{prefix}m_s": m_s.estimate,
                f"{prefix}m_s_low": m_s.low, f"{prefix}m_s_high": m_s.high}

    rows = []
    for k, part in ranked.groupby("k"):
        row = {"k": int(k), **summary(part)}
        control = random[random["k"] == k]
        if len(control):
            row.update(summary(control, "random_"))
            joined = part.set_index("sample")[metric].rename("ranked").to_frame().join(
                control.set_index("sample")[metric].rename("random"), how="inner").astype(float).dropna()
            test = paired_sign_test(joined["ranked"].to_numpy(), joined["random"].to_numpy(), seed=seed)
            row.update({"difference": test.difference.estimate, "difference_low": test.difference.low,
                        "difference_high": test.difference.high, "difference_half_width": test.difference.half_width,
                        "ranked_worse": test.b_better, "random_worse": test.a_better, "sign_p": test.sign_p})
        rows.append(row)
    table = pd.DataFrame(rows)
    if "tf_drop" in prog:
        table = table.merge(_progressive_drops(ranked, random, alpha=alpha, seed=seed), on="k", how="left")
    if "sign_p" in table:
        tested = table["sign_p"].notna().to_numpy()
        adjusted = holm_testable(table.loc[tested, "sign_p"].tolist(),
                                 [sign_test_min_p(int(a + b)) for a, b in
                                  zip(table.loc[tested, "ranked_worse"], table.loc[tested, "random_worse"])], alpha)
        table["p_adjusted"] = float("nan")
        table.loc[tested, "p_adjusted"] = adjusted
        table["specific"] = (table["p_adjusted"] < alpha) & (table["difference_high"] < 0)
        table["reverse"] = (table["p_adjusted"] < alpha) & (table["difference_low"] > 0)  # random hurts more
    return table


def _progressive_drops(ranked: pd.DataFrame, random: pd.DataFrame, *, alpha: float, seed: int) -> pd.DataFrame:
    """The teacher-forced measure of progressive masking, per k: the gold token's log-probability drop (nats per
    step, bootstrap 95% over samples) of the ranked masking (``tf_drop``) and of k random heads (``random_tf_drop``),
    and their paired difference ranked − random (``tf_difference``, bootstrap 95%; ``tf_ranked_worse`` /
    ``tf_random_worse``: samples where that masking's drop is larger; the exact sign test ``tf_sign_p`` and
    ``tf_p_adjusted``, Holm over the k values whose sign test can reach ``alpha``)."""

    rows = []
    for k, part in ranked.groupby("k"):
        drop = metric_interval(part["tf_drop"], "tf_drop", seed=seed)
        row = {"k": int(k), "tf_drop": drop.estimate, "tf_drop_low": drop.low, "tf_drop_high": drop.high}
        control = random[random["k"] == k]
        if len(control) and "tf_drop" in control and control["tf_drop"].notna().any():
            other = metric_interval(control["tf_drop"], "tf_drop", seed=seed)
            joined = part.set_index("sample")["tf_drop"].rename("ranked").to_frame().join(
                control.set_index("sample")["tf_drop"].rename("random"), how="inner").astype(float).dropna()
            test = paired_sign_test(joined["ranked"].to_numpy(), joined["random"].to_numpy(), seed=seed)
            row.update({"random_tf_drop": other.estimate, "random_tf_drop_low": other.low,
                        "random_tf_drop_high": other.high, "tf_difference": test.difference.estimate,
                        "tf_difference_low": test.difference.low, "tf_difference_high": test.difference.high,
                        "tf_ranked_worse": test.a_better, "tf_random_worse": test.b_better, "tf_sign_p": test.sign_p})
        rows.append(row)
    table = pd.DataFrame(rows)
    if "tf_sign_p" in table:
        tested = table["tf_sign_p"].notna().to_numpy()
        table["tf_p_adjusted"] = float("nan")
        table.loc[tested, "tf_p_adjusted"] = holm_testable(
            table.loc[tested, "tf_sign_p"].tolist(),
            [sign_test_min_p(int(a + b)) for a, b in zip(table.loc[tested, "tf_ranked_worse"],
                                                           table.loc[tested, "tf_random_worse"])], alpha)
    return table


def progressive_control_outcome(table: pd.DataFrame) -> dict | None:
    """What :func:`progressive_table`'s control comparisons decide, for the verdict sentence and the index status:
    the k values where the ranked heads hurt more (``specific``) and where random heads hurt more (``reverse``),
    whether any k was testable at all, and the smallest half-width among the testable ones (about the smallest
    difference the design could detect). None when the run has no control."""

    if "sign_p" not in table or not table["sign_p"].notna().any():
        return None
    compared = table.dropna(subset=["sign_p"])
    testable = compared[compared["p_adjusted"].notna()]
    flag = lambda column: [int(k) for k in compared.loc[compared[column].fillna(False).astype(bool), "k"]]
    return {"specific": flag("specific"), "reverse": flag("reverse"), "testable": [int(k) for k in testable["k"]],
            "n": int(compared["random_n"].min()), "needs": sign_test_needs(ALPHA),
            "smallest": float(testable["difference_half_width"].min()) if len(testable) else float("nan")}
