"""Exploratory, beside notebook 07's rotation primary (preregistration.yaml, deviation of 2026-12-06 on the size
bound): whether a change of the adjacent-step Jaccard with length is more turnover, or only smaller sets.

Two sets of sizes a and b have a Jaccard of at most min(a, b) / max(a, b) (SCIENCE 2), and a pair of one head
and none has a Jaccard of 0 whatever the heads do. Where the answers' D_t thin out with length (beyond a sliding
window, or as retrieval fails), the raw Jaccard falls with them. The bound-normalised Jaccard (each pair of two
non-empty sets' Jaccard over its bound, pooled per layout: the scale section's measure) is 1 when a step keeps as
many of the last step's heads as the sizes allow. Per length: both, and heads per step; across lengths: the
normalised Jaccard's slope per doubling by the primaries' own test (:func:`~.trend.slope_test`, BCa over layouts
within each length, at least :data:`~.trend.MIN_LAYOUTS_PER_LENGTH` layouts per length, or no test) at the rotation
primary's smallest effect of interest. One exploratory test, uncorrected; no status reads it. The normalised measure
leaves out the pairs with an empty side, which are those that pull the raw Jaccard to 0, so each length also gives
their share of its adjacent pairs (descriptive; the second deviation of 2026-12-06 on the size bound).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from dynheads_tl import preregistration
from dynheads_tl.claim import Verdict, ci_text, is_true, sidecar

from .config import haystack_label
from .pipeline import cluster_mean_bca, layout_ratio
from .trend import MIN_LAYOUTS_PER_LENGTH, int_list, slope_reading, slope_test

__all__ = ["rotation_bound_table", "rotation_bound_verdict", "bound_finding", "ROTATION_PRIMARY"]

ROTATION_PRIMARY = "rotation_vs_length"
# per layout, the mean over layouts of (sum of numerator) / (sum of denominator) over the layout's samples: the
# raw one is the rotation primary's own unit (Table 1 by length pools the pairs instead, so its value differs)
_MEASURES = {"raw_layout_mean": ("adjacent_sum", "adjacent_pairs"),
             "over_bound_layout_mean": ("bound_ratio_sum", "bound_pairs")}
NORMALISED = "over_bound_layout_mean"


def _rotation_sesoi() -> float:
    return next(float(p["sesoi"]) for p in preregistration.lengths()["primaries"] if p["id"] == ROTATION_PRIMARY)


def rotation_bound_table(samples: pd.DataFrame, *, n_resamples: int = 2000, seed: int = 0) -> pd.DataFrame:
    """From :func:`~.pipeline.sample_table`'s rows: per length (``length`` as text), for each measure of
    :data:`_MEASURES` (the raw adjacent Jaccard over the pairs with a non-empty union, and the bound-normalised one
    over the pairs of two non-empty sets), the mean of the layouts' ratios with a BCa 95% interval over layouts and
    its n (``n_layouts``: the layouts holding such a pair); beside them the length's heads per step (a mean over
    layouts of their heads per step) with a BCa 95% interval over layouts, and ``empty_side_share``, the share of
    its adjacent pairs with an empty side (pooled; the pairs the normalised measure leaves out). Then one row
    ``length`` = "slope" for the normalised measure: slope per doubling, BCa 95% interval, the 90% interval TOST
    reads, p (uncorrected), its reading at the rotation primary's sesoi, and ``short_lengths``: the lengths with fewer than
    :data:`~.trend.MIN_LAYOUTS_PER_LENGTH` layouts, any of which leaves the slope untested."""
    alpha = float(preregistration.lengths()["alpha"])
    sesoi = _rotation_sesoi()
    units = {name: layout_ratio(samples, *columns) for name, columns in _MEASURES.items()}
    heads = layout_ratio(samples, "activations", "steps")
    rows = []
    for length in sorted(int(x) for x in samples["context"].unique()):
        at = samples[samples["context"].astype(int) == length]
        per_step = heads[heads["length"] == length].reset_index(drop=True)
        pairs = float(at["adjacent_pairs"].sum())
        h = cluster_mean_bca(per_step["value"], per_step["layout"], n_resamples=n_resamples, seed=seed)
        beside = {"heads_per_step": h[0], "heads_per_step_low": h[1], "heads_per_step_high": h[2],
                  "empty_side_share": (pairs - float(at["bound_pairs"].sum())) / pairs if pairs else float("nan"),
                  "adjacent_pairs": int(pairs)}
        for measure, frame in units.items():
            part = frame[frame["length"] == length].reset_index(drop=True)
            values = part["value"].to_numpy(float)
            value, low, high, degenerate = cluster_mean_bca(values, part["layout"], n_resamples=n_resamples, seed=seed)
            rows.append({"length": str(length), "measure": measure, "value": value, "low": low, "high": high,
                         "degenerate": degenerate, "n_layouts": len(values), **beside})
    frame = units[NORMALISED]
    counts = frame.groupby("length")["layout"].nunique()
    short = [int(x) for x in sorted(samples["context"].astype(int).unique())
             if int(counts.get(x, 0)) < MIN_LAYOUTS_PER_LENGTH]
    slope = slope_test(frame["value"].to_numpy(float), frame["length"].to_numpy(int),
                       frame["layout"].astype(str).to_numpy(), alpha=alpha, n_resamples=n_resamples, seed=seed,
                       min_layouts=MIN_LAYOUTS_PER_LENGTH)
    rows.append({"length": "slope", "measure": NORMALISED, "value": slope.estimate, "low": slope.low,
                 "high": slope.high, "degenerate": slope.degenerate, "n_layouts": slope.layouts,
                 "tost_low": slope.tost_low, "tost_high": slope.tost_high, "p": slope.p, "sesoi": sesoi,
                 "n_lengths": slope.lengths, "short_lengths": " ".join(map(str, short)),
                 "reading": slope_reading(slope, slope.p, sesoi, alpha)})
    return pd.DataFrame(rows)


def _per_length(table: pd.DataFrame, measure: str) -> pd.DataFrame:
    rows = table[(table["length"].astype(str) != "slope") & (table["measure"] == measure)].copy()
    rows["tokens"] = rows["length"].astype(int)
    return rows.sort_values("tokens")


def _signed(value: float) -> str:
    return f"{value:+.3f}".replace("-", "−")


def _end(row, label: str) -> str:
    few = (f", fewer than {MIN_LAYOUTS_PER_LENGTH}: too few to trust its interval"
           if int(row["n_layouts"]) < MIN_LAYOUTS_PER_LENGTH else "")
    return (f"{ci_text(row['value'], row['low'], row['high'], digits=2)} at {label} ({int(row['n_layouts'])} "
            f"layouts{few}; {row['heads_per_step']:.2f} heads per step, {row['empty_side_share']:.0%} of its "
            "adjacent pairs with an empty side)")


# What the normalised slope says of a raw change, per (raw reading, normalised reading): the sentence's last clause.
_TURNOVER = {"decreases": "more", "increases": "less"}


def _comparison(raw: str | None, normalised: str, sizes: str) -> str:
    if raw is None:
        return "the rotation primary was not computed"
    if raw not in _TURNOVER:
        return f"the rotation primary reads '{raw}', the normalised Jaccard '{normalised}'"
    more = _TURNOVER[raw]
    change = {"decreases": "fall", "increases": "rise"}[raw]
    if normalised == raw:
        return (f"the rotation primary's raw Jaccard {raw} with length and the normalised one {raw} too: the sets "
                f"turn over {more} with length than their sizes force")
    if normalised == "flat within the sesoi":
        return (f"the rotation primary's raw Jaccard {raw} with length while the normalised one is flat: the raw "
                f"{change} is accounted for by the sets' sizes ({sizes}), not by {more} turnover")
    if normalised in _TURNOVER:
        return (f"the rotation primary's raw Jaccard {raw} with length while the normalised one {normalised}: the "
                f"raw {change} comes from the sets' sizes ({sizes}), beyond which they turn over "
                f"{_TURNOVER[normalised]}")
    return (f"the rotation primary's raw Jaccard {raw} with length; whether that is {more} turnover or only the "
            f"sets' sizes ({sizes}) is not settled by this measure")


def rotation_bound_verdict(table: pd.DataFrame, trends: pd.DataFrame | None, model: str, haystack: str) -> Verdict:
    """One computed sentence: the bound-normalised Jaccard at the shortest and the longest length (with its n, heads
    per step and the share of pairs it leaves out), its slope per doubling and reading, and, per pair of readings
    (the rotation primary's in ``trends``, :func:`~.report.trend_table`'s table or None, and the normalised one's),
    what the normalised slope says of the raw one: the same direction is turnover beyond what the sizes force; flat
    (TOST) is the sizes alone; the other direction is the sizes, with turnover the other way; undetermined or
    untested settles nothing."""
    slope_rows = table[table["length"].astype(str) == "slope"]
    bound = _per_length(table, NORMALISED).dropna(subset=["value"])
    if not len(slope_rows) or not len(bound):
        return Verdict(("bound", "No step pair with two non-empty sets: the bound-normalised Jaccard is undefined."),
                       declared=("bound",))
    s = slope_rows.iloc[0]
    first, last = bound.iloc[0], bound.iloc[-1]
    first_at, last_at = f"{int(first['tokens']):,} tokens", f"{int(last['tokens']):,}"
    ends = f"{_end(first, first_at)} and {_end(last, last_at)}"
    reading = str(s["reading"])
    sesoi = float(s["sesoi"])
    if reading == "not tested":
        short = int_list(s.get("short_lengths"))
        why = (f"{', '.join(f'{x:,}' for x in short)} tokens hold fewer" if short else "a length holds fewer")
        trend = (f"its slope is not tested (every length needs at least {MIN_LAYOUTS_PER_LENGTH} layouts holding "
                 f"a pair of two non-empty sets; {why})")
    else:
        numbers = (f"{ci_text(s['value'], s['low'], s['high'], digits=3, signed=True)} per doubling"
                   + (" (degenerate)" if is_true(s["degenerate"]) else "") + f", p = {float(s['p']):.3g} uncorrected, "
                   f"{int(s['n_layouts'])} layouts, smallest effect of interest ±{sesoi:g}")
        trend = {"increases": f"it increases with length ({numbers})",
                 "decreases": f"it decreases with length ({numbers})",
                 "flat within the sesoi": (f"it is flat with length within ±{sesoi:g} (TOST: the 90% interval "
                                           f"[{_signed(float(s['tost_low']))}, {_signed(float(s['tost_high']))}] "
                                           f"lies inside; {numbers})"),
                 "undetermined": f"its change with length cannot be told ({numbers})"}[reading]
    raw = None
    if trends is not None and len(trends) and ROTATION_PRIMARY in set(trends["primary"]):
        raw = str(trends.set_index("primary").loc[ROTATION_PRIMARY, "reading"])
    sizes = f"{first['heads_per_step']:.2f} to {last['heads_per_step']:.2f} heads per step"
    label = haystack_label(haystack)
    lengths = ", ".join(f"{x:,}" for x in _per_length(table, NORMALISED)["tokens"])
    return Verdict(("bound", f"On {model}, NIAH on the {label} haystack at {lengths} tokens (exploratory, not "
                             "pre-registered: preregistration.yaml, deviations of 2026-12-06 on the size bound), the "
                             "adjacent-step Jaccard over its size bound (a mean over layouts of their pairs of two "
                             "non-empty sets; 1: a step keeps as many of the last step's heads as the sizes allow) is "
                             f"{ends}; {trend}; {_comparison(raw, reading, sizes)}."),
                   declared=("bound",))


def bound_finding(folder: Path) -> list[str]:
    """The exploratory size-bound sentence (:func:`~.bounded.rotation_bound_verdict`) from ``rotation_bound.csv``
    and ``length_trends.csv``; a run from before the file says so."""
    if not (folder / "rotation_bound.csv").is_file():
        return ["Not computed: this run of notebook 07 predates the rotation-against-its-size-bound analysis "
                "(preregistration.yaml, deviations of 2026-12-06 on the size bound); a new run computes it."]
    run, trends = sidecar(folder, "rotation_bound"), folder / "length_trends.csv"
    return rotation_bound_verdict(pd.read_csv(folder / "rotation_bound.csv"), pd.read_csv(trends) if trends.is_file()
                                  else None, str(run.get("model", "?")), str(run.get("haystack", "prose"))).quote("bound")
