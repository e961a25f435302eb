"""The size axis's five primaries on one model (``preregistration.yaml``, section ``scale:`` and its deviation of
2026-12-06), from what notebook 07's ``scale`` preset computed: the grid's samples (one layout each), their masking
runs and traces.

- ``outside_share_static_10pct``: per layout, the share of its Eq. 1 activations outside the query-focused static set
  (10% of the heads); BCa 95% over layouts.
- ``adjacent_jaccard_over_bound``: per layout, the mean over its adjacent step pairs (both sets non-empty) of the
  Jaccard over the largest Jaccard the two sizes allow; BCa 95% over layouts.
- ``fair_previous_step_vs_static`` / ``predicted_vs_static``: per sample, the teacher-forced drop (nats/step,
  steps t >= 1) under D_{t-1} (or the lag-1 probe's set) minus under as many top static heads; exact two-sided sign
  test over samples, BCa 95% over layouts.
- ``probe_k1_vs_step_token_prior``: the lag-1 MLP probe's F1 minus the step-and-token prior's on splits by layout;
  the corrected resampled t-test and interval.

Each row also carries the 90% interval the flat reading across sizes combines, and the model's status of the primary
by the deviation's rule (:func:`primary_status`). Beside them, descriptive rows the size figure draws next to the
paper's models: the raw adjacent-step Jaccard, heads per step, and the unmasked accuracy (the headroom rule's).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from dynheads_tl import preregistration
from dynheads_tl.analysis.probes import lead_differences, lead_probe_table
from dynheads_tl.analysis.statistics import paired_sign_test, wilson_interval

from .config import PREDICTED_CONDITION, PREVIOUS_BASELINE, PREVIOUS_CONDITION
from .pipeline import _paired, cluster_mean_bca, layout_ratio

__all__ = ["block_parameters", "size_axis_table", "primary_status", "restatus", "DESCRIPTIVE", "MASKING_PRIMARIES",
           "CLAIM_PRIMARIES", "MIN_SPLITS", "size_axis_verdict", "label"]

# What the size figure draws beside the primaries (no status): the raw adjacent-step Jaccard and heads per step
# (the paper's Table 1 gives both per model), and the unmasked accuracy the headroom rule reads.
DESCRIPTIVE = ("jaccard_adjacent", "heads_per_step", "accuracy_unmasked")
# The primaries a masking run measures: they read "no headroom" when the unmasked accuracy's upper bound is below 0.5.
MASKING_PRIMARIES = ("fair_previous_step_vs_static", "predicted_vs_static")
HEADROOM_FLOOR = 0.5
# Which primaries a claim's reading across sizes reads (the deviation of 2026-12-06, (4)).
CLAIM_PRIMARIES = {"Claim 1, dynamism": ("outside_share_static_10pct", "adjacent_jaccard_over_bound"),
                   "Claim 2, irreplaceability": ("fair_previous_step_vs_static", "predicted_vs_static"),
                   "Claim 3, predictability": ("probe_k1_vs_step_token_prior",)}
MIN_SPLITS = 5  # the probe primary's grouped splits (preregistration.yaml scale:)


def block_parameters(model) -> int:
    """Parameters of the model's transformer blocks (attention, MLP and their norms; the embedding, the output layer
    and the final norm left out, so that tying them changes nothing), each tensor counted once however many modules
    share it (the bridge wraps the Hugging Face modules). The size axis orders models by it (``scale: models``)."""
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        raise ValueError("The model has no `blocks`: the size axis counts the parameters of its transformer blocks.")
    seen, total = set(), 0
    for parameter in blocks.parameters():
        key = (parameter.data_ptr(), tuple(parameter.shape))
        if key not in seen:
            seen.add(key)
            total += parameter.numel()
    return int(total)


def _declared() -> dict[str, dict]:
    return {p["id"]: p for p in preregistration.load()["scale"]["primaries"]}


def primary_status(primary: str, row: dict, *, alpha: float, headroom: bool = True) -> str:
    """A model's status of one size-axis primary, by the deviation of 2026-12-06 ((2) and (5)): tested primaries read
    their p, the side their test found (a drop: more samples dropping more under the compared set, ``a_better`` >
    ``b_better``; the probe: its interval, from at least :data:`MIN_SPLITS` splits) and the sesoi; interval-only ones
    their 95% interval against the sesoi; the masking primaries 'no headroom' without headroom."""
    declared = _declared()[primary]
    sesoi = float(declared["sesoi"])
    estimate, low, high = (float(row.get(k, float("nan"))) for k in ("estimate", "low", "high"))
    if primary in MASKING_PRIMARIES and not headroom:
        return "no headroom"
    if not all(math.isfinite(x) for x in (estimate, low, high)):
        return "undetermined"
    if primary == "outside_share_static_10pct":
        return "supported" if low > sesoi else "not supported" if high < sesoi else "undetermined"
    if primary == "adjacent_jaccard_over_bound":
        bar = 1 - sesoi
        return "supported" if high < bar else "not supported" if low > bar else "undetermined"
    p = float(row.get("p", float("nan")))
    if primary == "probe_k1_vs_step_token_prior":
        splits = row.get("splits", float("nan"))
        if not (isinstance(splits, (int, float)) and splits >= MIN_SPLITS):  # the file asks >= 5 grouped splits
            return "undetermined"
        toward = low > 0  # the corrected resampled t: its interval and its p say the same side
    else:  # a drop: the sign test decides the side itself (more samples drop more under the compared set)
        toward = float(row.get("a_better", 0) or 0) > float(row.get("b_better", 0) or 0)
    significant = math.isfinite(p) and p < alpha and toward
    if significant:
        return "supported" if estimate >= sesoi else "weaker"
    return "not supported" if high < sesoi else "undetermined"


def restatus(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` (one model's :func:`size_axis_table`, as written or read back) with each primary's status recomputed
    under the current rule, its headroom read from the unmasked-accuracy row: a file written by older code reads as
    the file declares now (as ``rerender --results`` recomputes verdicts)."""
    table = table.copy()
    accuracy = table[table["primary"] == "accuracy_unmasked"]
    headroom = bool(len(accuracy)) and accuracy["status"].iloc[0] == "headroom"
    alpha = preregistration.alpha()
    for index, row in table[table["kind"] == "primary"].iterrows():
        table.loc[index, "status"] = primary_status(row["primary"], row.to_dict(), alpha=alpha, headroom=headroom)
    return table


def _row(primary: str, value: float, low: float, high: float, low90: float, high90: float, *, n: int, units: str,
         test: str, p: float | None = None, **extra) -> dict:
    return {"primary": primary, "estimate": value, "low": low, "high": high, "low90": low90, "high90": high90,
            "n": int(n), "units": units, "test": test, "p": np.nan if p is None else float(p), **extra}


def _layout_mean(values: pd.DataFrame, primary: str, *, n_resamples: int, seed: int) -> dict:
    """The mean of one value per layout with its BCa 95% and 90% intervals over layouts."""
    v = values["value"].to_numpy(float)
    if not len(v):  # no layout has the quantity (no activation, no pair of non-empty sets)
        return _row(primary, np.nan, np.nan, np.nan, np.nan, np.nan, n=0, units="layouts",
                    test="BCa bootstrap 95% interval over layouts")
    value, low, high, _ = cluster_mean_bca(v, values["layout"], n_resamples=n_resamples, seed=seed)
    _, low90, high90, _ = cluster_mean_bca(v, values["layout"], n_resamples=n_resamples, seed=seed, confidence=0.90)
    return _row(primary, value, low, high, low90, high90, n=values["layout"].nunique(), units="layouts",
                test="BCa bootstrap 95% interval over layouts")


def _drop(grid: pd.DataFrame, condition: str, primary: str, *, n_resamples: int, seed: int) -> dict:
    pairs = _paired(grid, condition, PREVIOUS_BASELINE, "tf_drop_t1").reset_index(drop=True) \
        if len(grid) and condition in set(grid["condition"]) else pd.DataFrame()
    test = "exact two-sided sign test over samples; BCa bootstrap 95% interval over layouts"
    if not len(pairs):
        return _row(primary, np.nan, np.nan, np.nan, np.nan, np.nan, n=0, units="samples", test=test)
    diff = (pairs["a"] - pairs["b"]).to_numpy(float)
    value, low, high, _ = cluster_mean_bca(diff, pairs["layout"], n_resamples=n_resamples, seed=seed)
    _, low90, high90, _ = cluster_mean_bca(diff, pairs["layout"], n_resamples=n_resamples, seed=seed,
                                           confidence=0.90)
    sign = paired_sign_test(pairs["a"], pairs["b"], seed=seed)
    return _row(primary, value, low, high, low90, high90, n=len(diff), units="samples", test=test, p=sign.sign_p,
                a_better=sign.a_better, b_better=sign.b_better)


def _probe(traces, config) -> dict:
    primary = "probe_k1_vs_step_token_prior"
    test = f"corrected resampled t-test (Nadeau and Bengio 2003) over {config.n_splits} splits by layout"
    raw = lead_probe_table(traces, "classification", config.probe_config(), ks=[1],
                           split_seeds=[config.seed + i for i in range(config.n_splits)], cache=config.use_cache)
    diffs = lead_differences(raw, "f1") if len(raw) else pd.DataFrame()
    if diffs.empty or "vs_token_prior" not in diffs:
        return _row(primary, np.nan, np.nan, np.nan, np.nan, np.nan, n=0, units="layouts", test=test)
    r = diffs.iloc[0]
    value, low, high = float(r["vs_token_prior"]), float(r["vs_token_prior_low"]), float(r["vs_token_prior_high"])
    # the 90% interval: the 95% one narrowed by the ratio of the t quantiles (the file's TOST convention)
    df = max(int(r["splits"]) - 1, 1)
    shrink = stats.t.ppf(0.95, df) / stats.t.ppf(0.975, df)
    half = (high - low) / 2 * shrink
    return _row(primary, value, low, high, value - half, value + half, n=int(r["n_clusters"]), units="layouts",
                test=test, p=float(r["vs_token_prior_p"]), splits=int(r["splits"]))


def size_axis_table(samples: pd.DataFrame, grid: pd.DataFrame, traces, config, *, model_name: str, parameters: int,
                    n_heads: int, static_size: int) -> pd.DataFrame:
    """One row per size-axis primary (in the file's order), then the descriptive rows (:data:`DESCRIPTIVE`), for one
    model: estimate, 95% and 90% intervals, n and its unit, the test and p, the sesoi and the paper's direction, and
    the model's status (:func:`primary_status`); every row names the model, its block parameters, its heads and the
    static sets' size."""
    alpha = preregistration.alpha()
    r, seed = config.n_resamples, config.seed
    unmasked = grid[grid["condition"] == "none"]["accuracy"].dropna() if len(grid) else samples["accuracy"]
    if len(unmasked):
        ci = wilson_interval(int(unmasked.sum()), len(unmasked))
        accuracy = (ci.estimate, ci.low, ci.high, ci.n)
    else:  # nothing answered unmasked: no headroom can be shown
        accuracy = (np.nan, np.nan, np.nan, 0)
    headroom = bool(accuracy[2] >= HEADROOM_FLOOR)
    rows = {"outside_share_static_10pct": _layout_mean(layout_ratio(samples, "inside_query_focused", "activations",
                                                                   complement=True),
                                                       "outside_share_static_10pct", n_resamples=r, seed=seed),
            "adjacent_jaccard_over_bound": _layout_mean(layout_ratio(samples, "bound_ratio_sum", "bound_pairs"),
                                                        "adjacent_jaccard_over_bound", n_resamples=r, seed=seed),
            "fair_previous_step_vs_static": _drop(grid, PREVIOUS_CONDITION, "fair_previous_step_vs_static",
                                                  n_resamples=r, seed=seed),
            "predicted_vs_static": _drop(grid, PREDICTED_CONDITION, "predicted_vs_static", n_resamples=r, seed=seed),
            "probe_k1_vs_step_token_prior": _probe(traces, config)}
    out = []
    for primary, declared in _declared().items():
        row = rows[primary]
        row.update(sesoi=float(declared["sesoi"]), direction=str(declared["paper_direction"]).split(" ")[0],
                   status=primary_status(primary, row, alpha=alpha, headroom=headroom), kind="primary")
        out.append(row)
    descriptive = {"jaccard_adjacent": _layout_mean(layout_ratio(samples, "adjacent_sum", "adjacent_pairs"),
                                                    "jaccard_adjacent", n_resamples=r, seed=seed),
                   "heads_per_step": _layout_mean(layout_ratio(samples, "activations", "steps"), "heads_per_step",
                                                  n_resamples=r, seed=seed)}
    for row in descriptive.values():
        out.append({**row, "kind": "descriptive", "status": ""})
    out.append(_row("accuracy_unmasked", *accuracy[:3], np.nan, np.nan, n=accuracy[3], units="samples",
                    test="Wilson 95% interval", kind="descriptive", status="headroom" if headroom else "no headroom"))
    table = pd.DataFrame(out)
    return table.assign(model=model_name, parameters=int(parameters), n_heads=int(n_heads),
                        static_size=int(static_size))


_LABELS = {"outside_share_static_10pct": "share outside the query-focused static 10%",
           "adjacent_jaccard_over_bound": "adjacent-step Jaccard over its size bound",
           "fair_previous_step_vs_static": "teacher-forced drop, D_{t-1} − static (nats/step)",
           "predicted_vs_static": "teacher-forced drop, probe-predicted set − static (nats/step)",
           "probe_k1_vs_step_token_prior": "probe F1 at k = 1 − step-and-token prior",
           "jaccard_adjacent": "adjacent-step Jaccard", "heads_per_step": "heads per step",
           "accuracy_unmasked": "unmasked accuracy"}


def label(primary: str) -> str:
    return _LABELS.get(primary, primary)


def _signed(x: float) -> str:
    return f"{x:+.3f}".replace("-", "−") if math.isfinite(x) else "n/a"


def size_axis_verdict(table: pd.DataFrame) -> str:
    """One sentence per primary for one model, computed from :func:`size_axis_table`'s rows."""
    if table.empty:
        return "The size axis was not computed (size_axis=False)."
    first = table.iloc[0]
    parts = []
    for row in table[table["kind"] == "primary"].itertuples():
        p = "" if not math.isfinite(row.p) else f", p = {row.p:.3g}"
        value = (f"{_signed(row.estimate)} [{_signed(row.low)}, {_signed(row.high)}]" if math.isfinite(row.estimate)
                 else "not computed")
        parts.append(f"{label(row.primary)} {value} (n = {row.n} {row.units}{p}): **{row.status}**")
    accuracy = table[table["primary"] == "accuracy_unmasked"].iloc[0]
    return (f"Size axis on {first['model']} ({int(first['parameters']) / 1e6:.0f}M block parameters, static sets of "
            f"{int(first['static_size'])} of {int(first['n_heads'])} heads; unmasked accuracy {accuracy['estimate']:.2f} "
            f"[{accuracy['low']:.2f}, {accuracy['high']:.2f}], n = {int(accuracy['n'])}: {accuracy['status']}): "
            + "; ".join(parts) + ".")
