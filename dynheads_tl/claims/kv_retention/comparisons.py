"""Notebook 06's numbers and tests: each condition's accuracy and gold log-probability with intervals, predicted
against static retention at every budget (exact sign tests, Holm over both measures, untestable ones left out),
and the declared primary comparison.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dynheads_tl.analysis.statistics import (bootstrap_interval, mark_separated, n_to_resolve, paired_sign_test,
                                             wilson_interval)

__all__ = ["summary", "predicted_vs_static", "primary_comparison", "budgets_with_headroom"]


def summary(rows: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Per condition: NIAH accuracy (Wilson 95%), the mean teacher-forced log-probability of the gold tokens and
    its difference from the full cache, paired by sample (bootstrap 95%), the heads / KV heads kept per step, and
    the KV heads switched in per step (kept at a step but not at the one before: their evicted entries must be
    brought back; mean over samples, bootstrap 95%)."""
    full = rows[rows["strategy"] == "full"].set_index("sample")["gold_logprob"]
    out = []
    for (strategy, granularity, budget, b), part in rows.groupby(["strategy", "granularity", "budget", "b"], sort=False):
        acc = wilson_interval(int(part["accuracy"].sum()), len(part))
        lp = bootstrap_interval(part["gold_logprob"].to_numpy(float), seed=seed)
        gap = bootstrap_interval((part.set_index("sample")["gold_logprob"] - full).dropna().to_numpy(float), seed=seed)
        out.append({"strategy": strategy, "granularity": granularity, "budget": budget, "b": b, "n": len(part),
                    "accuracy": acc.estimate, "accuracy_low": acc.low, "accuracy_high": acc.high,
                    "gold_logprob": lp.estimate, "gold_logprob_low": lp.low, "gold_logprob_high": lp.high,
                    "vs_full": gap.estimate, "vs_full_low": gap.low, "vs_full_high": gap.high,
                    "heads_kept": float(part["heads_kept"].mean()), "kv_heads_kept": float(part["kv_heads_kept"].mean())})
        switches = part["kv_switches_per_step"].dropna().to_numpy(float) if "kv_switches_per_step" in part else []
        if len(switches):
            ci = bootstrap_interval(switches, seed=seed)
            out[-1].update({"kv_switches_per_step": ci.estimate, "kv_switches_low": ci.low, "kv_switches_high": ci.high})
    return pd.DataFrame(out)


def _pick(rows: pd.DataFrame, strategy: str, granularity: str, budget: float, column: str) -> pd.Series:
    part = rows[(rows["strategy"] == strategy) & (rows["granularity"] == granularity) & (rows["budget"] == budget)]
    return part.set_index("sample")[column].astype(float)


def predicted_vs_static(rows: pd.DataFrame, seed: int = 0, alpha: float = 0.05, *,
                        static: str = "static") -> pd.DataFrame:
    """Predicted minus static retention at every (granularity, budget), paired by sample, on two measures: the
    accuracy difference and the teacher-forced gold log-probability difference (nats per token), each with a
    bootstrap 95% interval, the samples favouring each side and an exact two-sided sign test. These are the
    claim's secondary comparisons (the primary is :func:`primary_comparison`): Holm runs over both measures at
    every budget together, leaving out the comparisons whose sign test cannot reach ``alpha`` at all (too few
    differing samples; ``testable`` / ``logprob_testable`` False, p NaN, Tarone). ``separated`` /
    ``logprob_separated`` need the adjusted p below ``alpha`` and the interval away from 0. ``half_width`` says
    the smallest accuracy difference the design could detect. ``static`` names the static strategy compared
    (``"query_static"``: the query-focused static set)."""
    out, tests = [], []
    present = rows[rows["strategy"].isin(["predicted", static])]
    if present["strategy"].nunique() < 2:
        return pd.DataFrame()
    for (granularity, budget), _ in present.groupby(["granularity", "budget"], sort=True):
        acc = pd.concat([_pick(rows, "predicted", granularity, budget, "accuracy").rename("a"),
                         _pick(rows, static, granularity, budget, "accuracy").rename("b")], axis=1, join="inner")
        lp = pd.concat([_pick(rows, "predicted", granularity, budget, "gold_logprob").rename("a"),
                        _pick(rows, static, granularity, budget, "gold_logprob").rename("b")], axis=1,
                       join="inner").dropna()
        if acc.empty:
            continue
        test = paired_sign_test(acc["a"].to_numpy(), acc["b"].to_numpy(), seed=seed)
        g = paired_sign_test(lp["a"].to_numpy(), lp["b"].to_numpy(), seed=seed) if len(lp) else None
        d = test.difference
        row = {"granularity": granularity, "budget": budget, "n": len(acc), "accuracy_difference": d.estimate,
               "low": d.low, "high": d.high, "predicted_better": test.a_better, "static_better": test.b_better,
               "sign_p": test.sign_p, "half_width": d.half_width}
        tests.append({"low": d.low, "high": d.high, "a_better": test.a_better, "b_better": test.b_better,
                      "sign_p": test.sign_p})
        if g is not None:
            row.update({"logprob_difference": g.difference.estimate, "logprob_low": g.difference.low,
                        "logprob_high": g.difference.high, "logprob_predicted_better": g.a_better,
                        "logprob_static_better": g.b_better, "logprob_sign_p": g.sign_p})
            tests.append({"low": g.difference.low, "high": g.difference.high, "a_better": g.a_better,
                          "b_better": g.b_better, "sign_p": g.sign_p})
        out.append(row)
    table = pd.DataFrame(out)
    if table.empty:
        return table
    # One family over both measures at every budget: mark it in long form, then write the results back.
    marked = mark_separated(pd.DataFrame(tests), alpha, testable_only=True)
    cursor = 0
    for i, row in enumerate(out):
        for prefix in ("",) + (("logprob_",) if "logprob_sign_p" in row else ()):
            result = marked.iloc[cursor]
            table.loc[i, f"{prefix}p_adjusted"] = result["p_adjusted"]
            table.loc[i, f"{prefix}testable"] = bool(result["testable"])
            table.loc[i, f"{prefix}separated"] = bool(result["separated"])
            cursor += 1
    return table


def budgets_with_headroom(table: pd.DataFrame) -> list[float]:
    """The KV-head budgets of ``summary``'s table (``retention.csv``) at which some retained strategy has headroom:
    its accuracy interval lies above streaming's (the bound with nothing but sinks and the local window). At a budget
    where every strategy's interval reaches down to streaming's, no strategy retrieves better than keeping nothing,
    so the budget says nothing about which heads to keep (SCIENCE 20; preregistration.yaml, deviation of
    2026-12-05)."""
    stream = table[table["strategy"] == "streaming"]
    if stream.empty:
        return sorted(table.loc[table["granularity"] == "kv", "budget"].unique().tolist())
    floor = float(stream.iloc[0]["accuracy_high"])
    kv = table[(table["granularity"] == "kv") & ~table["strategy"].isin(["full", "streaming"])]
    return sorted(float(b) for b, part in kv.groupby("budget") if bool((part["accuracy_low"] > floor).any()))


def primary_comparison(rows: pd.DataFrame, seed: int = 0, *, static: str = "static",
                       budgets: list[float] | None = None, alpha: float = 0.05) -> dict | None:
    """Claim 6's declared primary comparison (SCIENCE 11), fixed before the data: does retaining the predicted heads
    keep the gold answer more likely than retaining the static heads, over the KV-head budgets (the ones that save
    memory)? Per sample, the mean over those budgets of predicted − static teacher-forced gold log-probability (nats
    per token); its bootstrap 95% interval over samples and the exact two-sided sign test over samples, tested alone
    at ``alpha``; ``tost_low``/``tost_high``, the 1 - 2 ``alpha`` interval that TOST reads (both one-sided tests at
    alpha). ``budgets``: only these KV-head budgets (:func:`budgets_with_headroom`; None: every one run). None when
    the KV-head budgets were not run, or none is left."""
    part = rows[(rows["granularity"] == "kv") & rows["strategy"].isin(["predicted", static])]
    if budgets is not None:
        part = part[part["budget"].round(6).isin([round(float(b), 6) for b in budgets])]
    if part["strategy"].nunique() < 2:
        return None
    wide = part.pivot_table(index=["sample", "budget"], columns="strategy", values="gold_logprob").dropna()
    if wide.empty:
        return None
    per_sample = (wide["predicted"] - wide[static]).groupby(level="sample").mean()
    test = paired_sign_test(per_sample.to_numpy(), np.zeros(len(per_sample)), seed=seed)
    d = test.difference
    tost = bootstrap_interval(per_sample.to_numpy(), confidence=1 - 2 * alpha, seed=seed)
    return {"n": len(per_sample), "budgets": sorted(part["budget"].unique().tolist()), "difference": d.estimate,
            "low": d.low, "high": d.high, "predicted_better": test.a_better, "static_better": test.b_better,
            "sign_p": test.sign_p, "half_width": d.half_width, "n_to_resolve": n_to_resolve(d),
            "separated": test.sign_p < alpha and (d.low > 0 or d.high < 0), "tost_low": tost.low,
            "tost_high": tost.high}
