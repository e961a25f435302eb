"""Claim 3's pipeline: CCA between hidden states and head scores k steps apart, the residualised and shuffled
controls (and how much of each lag's residualised gain the generated token explains), probes k steps ahead against
a step-aware prior and a prior that also knows the tokens, and the families of tests over them.

Every number is a mean over ``n_splits`` splits *by layout* (NIAH samples of different seeds share their depth
and only change the UUID: :func:`~dynheads_tl.analysis.correlation.layout_groups`), with the corrected resampled
t-interval over splits.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dynheads_tl.analysis.correlation import (cca_curve, generated_token_share, lead_differences, lead_probe_table,
                                              over_splits, paired_over_splits, predictor_differences, probe_summary,
                                              residualised_cca, WITHIN_SAMPLE)
from dynheads_tl.analysis.statistics import holm_adjust
from dynheads_tl.corpus import TraceSets, hotpot_traces, niah_traces

from .config import ALPHA, PRIMARY, PredictabilityConfig

__all__ = [
    "gather_traces", "split_seeds", "cca_table", "residualised_table", "residualised_summary", "generated_token_table",
    "lead_probes",
    "probe_table_over_splits", "holm_family", "lag_tests", "residual_tests", "cca_tests",
]


def gather_traces(model, config: PredictabilityConfig):
    """All NIAH and HotpotQA traces of every seed (calibration and analysis splits pooled)."""
    claim1 = TraceSets.of(config)  # claim 1's splits for the same values: its cached traces are reused
    niah, hotpot = [], []
    for seed in config.seeds:
        cal, ana = niah_traces(model, claim1, seed)
        niah += cal + ana
        cal, ana = hotpot_traces(model, claim1, seed)
        hotpot += cal + ana
    return niah, hotpot


def split_seeds(config: PredictabilityConfig) -> list[int]:
    """The splits by layout every interval of the notebook is taken over (one seed each)."""
    return [config.split_seed + i for i in range(config.n_splits)]


def cca_table(traces, config: PredictabilityConfig) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Fig 4 / Fig 8 on every split by layout: (one row per lag, split and control; the means over the splits
    with corrected resampled 95% intervals, n and the number of layouts)."""
    raw = cca_curve(traces, list(range(config.max_lag + 1)), split_seeds(config))
    return raw, over_splits(raw)


def residualised_table(traces, config: PredictabilityConfig) -> pd.DataFrame:
    """Held-out CCA, raw and with step, tokens (read at n and n + k, generated at n + k) and depth regressed out,
    and with the tokens read only, per lag in ``lead_ks`` and split."""
    return residualised_cca(traces, config.lead_ks, split_seeds(config))


def generated_token_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per lag, how much of the residualised held-out CCA's gain over chance the token generated at n + k explains
    (:func:`~dynheads_tl.analysis.correlation.generated_token_share` of :func:`residualised_table`'s rows)."""
    return generated_token_share(table)


def residualised_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per lag and control: the mean of the held-out first canonical correlation and of the top-10 mean over
    the splits, each with its corrected resampled 95% interval, and the samples and layouts it rests on."""
    return over_splits(table, ("first", "top10_mean")) if len(table) else pd.DataFrame(
        columns=["k", "control", "first", "first_low", "first_high", "splits"])


def lead_probes(traces, task: str, config: PredictabilityConfig, desc: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Probes k steps ahead on every split by layout (raw rows; k = 0 also with the linear probe, for Tables 2
    and 3) and their differences from the base rate and the step-aware prior at the lags of ``lead_ks``, with
    intervals and p-values: F1 and AUPRC for the NIAH Eq. 1 sets, R² for HotpotQA Eq. 2 scores. Each split's probes
    are cached units, as the traces they read are: a run from the cache trains none."""
    ks = sorted(set(config.lead_ks) | {0})
    raw = lead_probe_table(traces, task, config.probe_config(), ks=ks, split_seeds=split_seeds(config),
                           progress_desc=desc, linear_ks=[0], min_test_samples=config.probe_min_test, cache=True)
    metrics = ("f1", "auprc") if task == "classification" else ("r2",)
    lagged = raw[raw["k"].isin(config.lead_ks)]
    return raw, pd.concat([lead_differences(lagged, metric) for metric in metrics], ignore_index=True)


def probe_table_over_splits(raw: pd.DataFrame, task: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Table 2 (``classification``) or 3 (``regression``) at k = 0: every predictor's metrics as means over the
    splits by layout with intervals, n and layouts (:func:`~dynheads_tl.analysis.correlation.probe_summary`); and
    the MLP probe against each other predictor in the table's headline metric (F1, R²), Holm over those."""
    metric = "f1" if task == "classification" else "r2"
    return probe_summary(raw, task, k=0), holm_family(predictor_differences(raw, metric, k=0))


# --- tests and their families -------------------------------------------------------------------------
def holm_family(rows: pd.DataFrame, p: str = "p", *, low: str = "low", high: str = "high",
                member: pd.Series | None = None) -> pd.DataFrame:
    """Add ``p_adjusted`` (Holm over the rows with a p-value, or over ``member`` rows), ``separated`` (adjusted p
    below :data:`ALPHA` and the 95% interval away from 0) and ``half_width`` (about the smallest difference the
    design could tell from 0, SCIENCE 12) to a table of comparisons. Returns a copy."""
    rows = rows.copy()
    if rows.empty:
        return rows.assign(p_adjusted=[], separated=[], half_width=[])
    inside = rows[p].notna() if member is None else (member & rows[p].notna())
    rows["p_adjusted"] = np.nan
    if inside.any():
        rows.loc[inside, "p_adjusted"] = holm_adjust(rows.loc[inside, p].tolist())
    rows["separated"] = (rows["p_adjusted"] < ALPHA) & ((rows[low] > 0) | (rows[high] < 0))
    rows["half_width"] = (rows[high] - rows[low]) / 2
    return rows


def lag_tests(niah_diffs: pd.DataFrame, hotpot_diffs: pd.DataFrame, *, n_splits: int) -> pd.DataFrame:
    """Probe minus the step-and-token prior (``baseline``: the step-aware prior for tables without it) at every lag
    and metric (NIAH F1 and AUPRC, HotpotQA R²). ``primary`` marks :data:`PRIMARY` at the first lag ahead: it is
    tested alone at :data:`ALPHA` (its ``p_adjusted`` is its own p); the rest are one secondary family, Holm over all
    of them (:func:`holm_family`). A lag where a split could not be scored (fewer than ``n_splits``) stays out of
    every test and is never separated."""
    frames = []
    for task, diffs in (("niah", niah_diffs), ("hotpot", hotpot_diffs)):
        if len(diffs):
            # The prior that knows the step and the tokens (read at n and n + k, generated at n + k:
            # preregistration.yaml's claim 3 primary); tables without it fall back to the step-aware prior.
            name, baseline = (("vs_token_prior", "step-and-token prior") if "vs_token_prior" in diffs
                              else ("vs_step_prior", "step-aware prior"))
            frames.append(pd.DataFrame({"task": task, "metric": diffs["metric"], "k": diffs["k"].astype(int),
                                        "baseline": baseline,
                                        "difference": diffs[name], "low": diffs[f"{name}_low"],
                                        "high": diffs[f"{name}_high"],
                                        "p": diffs[f"{name}_p"] if f"{name}_p" in diffs else np.nan,
                                        "splits": diffs["splits"]}))
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["task", "metric", "k", "baseline", "difference", "low", "high", "p", "splits"])
    ahead = sorted(int(k) for k in table[(table["task"] == PRIMARY[0]) & (table["metric"] == PRIMARY[1])]["k"] if k >= 1)
    primary = ((table["task"] == PRIMARY[0]) & (table["metric"] == PRIMARY[1])
               & (table["k"] == (ahead[0] if ahead else -1)))
    complete = table["splits"] >= n_splits
    table = holm_family(table, member=complete & ~primary)
    alone = primary & complete & table["p"].notna()  # the primary is tested alone at ALPHA, outside the family
    table.loc[alone, "p_adjusted"] = table.loc[alone, "p"]
    table["separated"] = (table["p_adjusted"] < ALPHA) & ((table["low"] > 0) | (table["high"] < 0))
    table["primary"] = primary
    return table


def residual_tests(resid: pd.DataFrame) -> pd.DataFrame:
    """Per lag: residualised held-out CCA minus its chance pairing on the same splits, Holm over the lags."""
    if resid.empty:
        return holm_family(pd.DataFrame(columns=["k", "difference", "low", "high", "p", "splits"]))
    return holm_family(paired_over_splits(resid, "held-out, residualised", "held-out, residualised, chance"))


def within_sample_tests(raw: pd.DataFrame) -> pd.DataFrame:
    """Per lag: held-out minus the within-sample step permutation (:data:`WITHIN_SAMPLE`) on the same splits, a
    family of its own (Holm over lags), so that adding it changes nothing the status rules read (:func:`cca_tests`).
    Exploratory: it tells predicting the step within a sample from recognising the sample."""
    frame = paired_over_splits(raw, "held-out", WITHIN_SAMPLE) if WITHIN_SAMPLE in set(raw.get("control", [])) \
        else pd.DataFrame()
    if frame.empty:
        return holm_family(pd.DataFrame(columns=["k", "a", "b", "difference", "low", "high", "p", "splits"]))
    return holm_family(frame)


def cca_tests(raw: pd.DataFrame) -> pd.DataFrame:
    """Per lag: held-out minus each shuffled control (random step; same step) on the same splits, one family
    (Holm over lags x controls)."""
    frames = [paired_over_splits(raw, "held-out", control) for control in ("shuffled", "shuffled, same step")]
    frames = [f for f in frames if len(f)]
    if not frames:
        return holm_family(pd.DataFrame(columns=["k", "a", "b", "difference", "low", "high", "p", "splits"]))
    return holm_family(pd.concat(frames, ignore_index=True))
