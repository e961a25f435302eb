"""Exploratory, beside notebook 07's rotation primary (preregistration.yaml, deviation of 2026-12-06 on the size
bound): whether a change of the adjacent-step Jaccard with length is more turnover, or only smaller sets.

Two sets of sizes a and b have a Jaccard of at most min(a, b) / max(a, b) (SCIENCE 2), and a pair of one head
and none has a Jaccard of 0 whatever the heads do. Where the answers' D_t thin out with length (beyond a sliding
window, or as retrieval fails), the raw Jaccard falls with them. The bound-normalised Jaccard (each pair of two
non-empty sets' Jaccard over its bound, pooled per layout: the scale section's measure) is 1 when a step keeps as
many of the last step's heads as the sizes allow. Per length: both, and heads per step; across lengths: the
normalised Jaccard's slope per doubling by the primaries' own test (:func:`~.trend.slope_test`, BCa over layouts
within each length, at least :data:`~.trend.MIN_LAYOUTS_PER_LENGTH` layouts per length) at the rotation primary's
smallest effect of interest. One exploratory test, uncorrected; no status reads it.
"""
from __future__ import annotations

import pandas as pd

from dynheads_tl import preregistration
from dynheads_tl.claim import Verdict, ci_text, is_true

from .pipeline import cluster_bca, layout_ratio
from .trend import MIN_LAYOUTS_PER_LENGTH, slope_reading, slope_test

__all__ = ["rotation_bound_table", "rotation_bound_verdict", "ROTATION_PRIMARY"]

ROTATION_PRIMARY = "rotation_vs_length"
_MEASURES = {"jaccard_adjacent": ("adjacent_sum", "adjacent_pairs"),
             "over_bound": ("bound_ratio_sum", "bound_pairs")}


def _rotation_sesoi() -> float:
    return next(float(p["sesoi"]) for p in preregistration.lengths()["primaries"] if p["id"] == ROTATION_PRIMARY)


def rotation_bound_table(samples: pd.DataFrame, *, n_resamples: int = 2000, seed: int = 0) -> pd.DataFrame:
    """From :func:`~.pipeline.sample_table`'s rows: per length (``length`` an int), the layouts' mean raw adjacent
    Jaccard (``jaccard_adjacent``, pairs with a non-empty union) and bound-normalised one (``over_bound``, pairs of
    two non-empty sets), each with a BCa 95% interval over layouts and its n, and the pooled heads per step
    (``heads_per_step``, every step); then one row ``length`` = "slope" for ``over_bound``: slope per doubling,
    BCa 95% interval, the 90% interval TOST reads, p (uncorrected), its reading at the rotation primary's sesoi."""
    alpha = float(preregistration.lengths()["alpha"])
    sesoi = _rotation_sesoi()
    units = {name: layout_ratio(samples, *columns) for name, columns in _MEASURES.items()}
    rows = []
    for length in sorted(int(x) for x in samples["context"].unique()):
        at = samples[samples["context"].astype(int) == length]
        steps = float(at["steps"].sum())
        for measure, frame in units.items():
            part = frame[frame["length"] == length].reset_index(drop=True)
            values = part["value"].to_numpy(float)
            if len(values):
                value, low, high, degenerate = cluster_bca(len(values), part["layout"],
                                                           lambda i: float(values[i].mean()),
                                                           n_resamples=n_resamples, seed=seed)
            else:
                value = low = high = float("nan")
                degenerate = False
            rows.append({"length": str(length), "measure": measure, "value": value, "low": low, "high": high,
                         "degenerate": degenerate, "n_layouts": len(values),
                         "heads_per_step": float(at["activations"].sum()) / steps if steps else float("nan")})
    frame = units["over_bound"]
    slope = slope_test(frame["value"].to_numpy(float), frame["length"].to_numpy(int),
                       frame["layout"].astype(str).to_numpy(), alpha=alpha, n_resamples=n_resamples, seed=seed,
                       min_layouts=MIN_LAYOUTS_PER_LENGTH)
    rows.append({"length": "slope", "measure": "over_bound", "value": slope.estimate, "low": slope.low,
                 "high": slope.high, "degenerate": slope.degenerate, "n_layouts": slope.layouts,
                 "tost_low": slope.tost_low, "tost_high": slope.tost_high, "p": slope.p, "sesoi": sesoi,
                 "n_lengths": slope.lengths, "reading": slope_reading(slope, slope.p, sesoi, alpha)})
    return pd.DataFrame(rows)


def _per_length(table: pd.DataFrame, measure: str) -> pd.DataFrame:
    rows = table[(table["length"].astype(str) != "slope") & (table["measure"] == measure)].copy()
    rows["tokens"] = rows["length"].astype(int)
    return rows.sort_values("tokens")


def rotation_bound_verdict(table: pd.DataFrame, trends: pd.DataFrame | None, model: str, haystack: str) -> Verdict:
    """One computed sentence: the bound-normalised Jaccard at the shortest and the longest length (heads per step
    beside it), its slope per doubling and reading, and what it says of the rotation primary's reading
    (``trends``: :func:`~.report.trend_table`'s table, or None): a raw fall (or rise) that the normalised Jaccard
    repeats in its direction is turnover beyond what the set sizes force; one it does not repeat is not shown to be
    more than the sets' sizes changing."""
    slope_rows = table[table["length"].astype(str) == "slope"]
    bound = _per_length(table, "over_bound").dropna(subset=["value"])
    if not len(slope_rows) or not len(bound):
        return Verdict(("bound", "No step pair with two non-empty sets: the bound-normalised Jaccard is undefined."),
                       declared=("bound",))
    s = slope_rows.iloc[0]
    first, last = bound.iloc[0], bound.iloc[-1]
    ends = (f"{ci_text(first['value'], first['low'], first['high'], digits=2)} at {first['tokens']:,} tokens "
            f"({first['heads_per_step']:.2f} heads per step, {int(first['n_layouts'])} layouts) and "
            f"{ci_text(last['value'], last['low'], last['high'], digits=2)} at {last['tokens']:,} "
            f"({last['heads_per_step']:.2f} heads per step, {int(last['n_layouts'])} layouts)")
    reading = str(s["reading"])
    if reading == "not tested":
        trend = (f"its slope is not tested (a slope needs two lengths with at least {MIN_LAYOUTS_PER_LENGTH} "
                 "layouts that hold a pair of two non-empty sets)")
    else:
        numbers = (f"{ci_text(s['value'], s['low'], s['high'], digits=3, signed=True)} per doubling"
                   + (" (degenerate)" if is_true(s["degenerate"]) else "") + f", p = {float(s['p']):.3g} uncorrected, "
                   f"{int(s['n_layouts'])} layouts, smallest effect of interest ±{float(s['sesoi']):g}")
        trend = {"increases": f"it increases with length ({numbers})",
                 "decreases": f"it decreases with length ({numbers})",
                 "flat within the sesoi": (f"it is flat with length within ±{float(s['sesoi']):g} (TOST: the 90% "
                                           f"interval [{float(s['tost_low']):+.3f}, {float(s['tost_high']):+.3f}] "
                                           f"lies inside; {numbers})"),
                 "undetermined": f"its change with length cannot be told ({numbers})"}[reading]
    raw = None
    if trends is not None and len(trends) and ROTATION_PRIMARY in set(trends["primary"]):
        raw = str(trends.set_index("primary").loc[ROTATION_PRIMARY, "reading"])
    if raw in ("increases", "decreases"):
        if reading == raw:
            said = (f"the rotation primary's raw Jaccard {raw} too, and the normalised one repeats it: turnover "
                    "beyond what the sets' sizes force")
        else:
            said = (f"the rotation primary's raw Jaccard {raw} with length, but the normalised one does not: that "
                    "change is not shown to be more than the sets' sizes changing (fewer heads per step bound the "
                    "Jaccard lower), so it is not read as more rotation")
    elif raw is not None:
        said = f"the rotation primary's raw Jaccard reads '{raw}'"
    else:
        said = "the rotation primary was not computed"
    lengths = ", ".join(f"{x:,}" for x in bound["tokens"])
    return Verdict(("bound", f"On {model}, NIAH on the {haystack} haystack at {lengths} tokens (exploratory, not "
                             "pre-registered: preregistration.yaml, deviation of 2026-12-06 on the size bound), the "
                             "adjacent-step Jaccard over its size bound (pairs of two non-empty sets; 1: a step keeps "
                             f"as many of the last step's heads as the sizes allow) is {ends}; {trend}; {said}."),
                   declared=("bound",))
