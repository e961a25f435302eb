"""Notebook 07's report part: the three length trend tests (the pre-registration file's ``lengths:`` primaries, read
from the file), the per-length statuses of Table 1 and Fig 2 by their claims' declared rules, the computed verdict
sentences, and the index rows.

Presets. The default grid is meant to keep the whole default report within an hour from an empty cache on a 2-core
CPU: 1k and 2k tokens x depths 0, 0.25, 0.5, 0.75, 1 x one run per cell (5 layouts per length, the fewest a length
trend is tested on); docs/notebooks.md gives its time (an estimate until measured on a quiet hour). ``long`` is the
pre-registered grid, 1k, 2k, 4k and 8k tokens, then 16k and 32k where the model's window allows (deviation of
2026-12-06) x depths 0, 0.25, 0.5, 0.75, 1 x two runs per cell; ``smoke`` is a
tiny grid for tests; ``paper`` the paper's lengths on Llama-3.1-8B.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from dynheads_tl import preregistration
from dynheads_tl.analysis.statistics import Interval, n_to_resolve
from dynheads_tl.claim import Claim, Finding, PaperItem, Status, Verdict, ci_text, is_true, sidecar

from .config import SEEDS, LengthGridConfig, haystack_label
from .pipeline import headroom_floor
from .trend import MIN_LAYOUTS_PER_LENGTH, int_list, holm_family, slope_reading, slope_test
from .scale import size_axis_section
from .window import LayerKinds, window_verdict
from .bounded import bound_finding

__all__ = ["MIN_LAYOUTS_PER_LENGTH", "HEADROOM_PRIMARIES", "declared", "trend_table", "trend_verdict",
           "window_sentence", "table1_status", "fig2_status", "table1_statuses", "fig2_statuses", "claim1_verdict",
           "claim2_verdict", "CLAIM"]


# The length primaries that read a masking drop: they keep only the lengths with headroom (deviation of 2026-12-06).
HEADROOM_PRIMARIES = ("irreplaceability_vs_length",)


def declared() -> dict:
    """The ``lengths:`` section of the pre-registration file: lengths, depths, primaries, alpha."""
    return preregistration.lengths()


def trend_table(units: dict[str, pd.DataFrame], *, n_resamples: int = 2000, seed: int = 0,
                lengths_run: list[int] | tuple = (), beyond_window: list[int] | tuple = (),
                context_window: int | None = None) -> pd.DataFrame:
    """Each declared length primary (in the file's order): its slope per doubling of the context with the BCa 95%
    interval (layouts resampled within each length), the 90% interval its TOST reads, the p-value, the Holm-adjusted
    p over the primaries that could be computed, and the reading (:func:`~.trend.slope_reading` at the declared
    sesoi). A primary without units (the fair pair not run) is reported as not run and leaves the family.

    What the grid left out, as columns (preregistration.yaml, deviation of 2026-12-06): ``lengths_no_headroom``, the
    lengths whose units a primary of :data:`HEADROOM_PRIMARIES` leaves out for want of headroom (the units'
    ``headroom`` column, :func:`~.pipeline.primary_units`); ``lengths_run``, every length the grid ran; and
    ``lengths_beyond_window`` with ``context_window``, the lengths the model's window could not hold."""
    section = declared()
    alpha = float(section["alpha"])
    rows, slopes = [], []
    for primary in section["primaries"]:
        frame = units.get(primary["id"], pd.DataFrame(columns=["length", "layout", "value"]))
        no_headroom = []
        if primary["id"] in HEADROOM_PRIMARIES and "headroom" in frame:
            kept = frame["headroom"].astype(bool)
            no_headroom = sorted(int(x) for x in set(frame.loc[~kept, "length"]))
            frame = frame[kept]
        slope = slope_test(frame["value"].to_numpy(float), frame["length"].to_numpy(int),
                           frame["layout"].astype(str).to_numpy(), alpha=alpha, n_resamples=n_resamples, seed=seed,
                           min_layouts=MIN_LAYOUTS_PER_LENGTH)
        rows.append({"primary": primary["id"], "measure": primary["measure"], "slope_per_doubling": slope.estimate,
                     "low": slope.low, "high": slope.high, "tost_low": slope.tost_low, "tost_high": slope.tost_high,
                     "p": slope.p, "sesoi": float(primary["sesoi"]), "n_units": slope.n, "n_layouts": slope.layouts,
                     "n_lengths": slope.lengths, "lengths": " ".join(str(int(x)) for x in sorted(frame["length"].unique())),
                     "degenerate": slope.degenerate,
                     "lengths_no_headroom": " ".join(map(str, no_headroom)),
                     "lengths_run": " ".join(str(int(x)) for x in lengths_run),
                     "lengths_beyond_window": " ".join(str(int(x)) for x in beyond_window),
                     "context_window": context_window})
        slopes.append(slope)
    table = pd.DataFrame(rows)
    table["p_holm"] = holm_family(table["p"].tolist())
    table["reading"] = [slope_reading(slope, p, sesoi, alpha)
                        for slope, p, sesoi in zip(slopes, table["p_holm"], table["sesoi"])]
    table["separated"] = table["reading"].isin(["increases", "decreases"])
    return table


_PHRASES = {"rotation_vs_length": "the adjacent-step Jaccard of D_t (rotation: lower means more change per step)",
            "outside_vs_length": "the share of Eq. 1 activations outside the query-focused static top-20",
            "irreplaceability_vs_length": "the teacher-forced D_{t-1} − static drop (nats/step)"}


def _setting(model: str, haystack: str, lengths, units: str) -> str:
    label = haystack_label(haystack)
    return f"{model}, NIAH on the {label} haystack at {', '.join(f'{int(x):,}' for x in lengths)} tokens, {units}"


def _resolving(row) -> str:
    """What would resolve an undetermined slope (SCIENCE 12): about how many layouts a design like this one needs to
    detect the observed slope at 80% power, from its interval."""
    need = n_to_resolve(Interval(float(row.slope_per_doubling), float(row.low), float(row.high), int(row.n_layouts),
                                 int(row.n_layouts)))
    return f"; about {need:,} layouts would resolve the observed slope" if need else ""


def _window(table: pd.DataFrame) -> int | None:
    """The ``context_window`` column's value, None where the file has none."""
    value = table["context_window"].iloc[0] if "context_window" in table and len(table) else None
    try:
        return int(float(value)) if value is not None and float(value) == float(value) else None
    except (TypeError, ValueError):
        return None


def _stops_at(table: pd.DataFrame) -> int:
    """The longest length the grid ran (``lengths_run``; a file without it: the longest with units)."""
    run = int_list(table["lengths_run"].iloc[0]) if "lengths_run" in table and len(table) else []
    return max(run or [x for value in table["lengths"] for x in int_list(value)] or [0])


def _tokens(lengths: list[int]) -> str:
    return ", ".join(f"{x:,}" for x in lengths) + " tokens"


def window_sentence(table: pd.DataFrame, model: str) -> str:
    """Where the grid stops because the model's context window ends (``up_to_context``); empty when it left nothing
    out."""
    if not len(table) or "lengths_beyond_window" not in table:
        return ""
    beyond = int_list(table["lengths_beyond_window"].iloc[0])
    if not beyond:
        return ""
    window = _window(table)
    window_text = f" ({window:,} tokens)" if window else ""
    return (f"The grid stops at {_stops_at(table):,} tokens: {model}'s context window{window_text} cannot hold "
            f"{_tokens(beyond)} with the prompt and the answer, so they are left out.")


def trend_verdict(table: pd.DataFrame, model: str, haystack: str) -> Verdict:
    """One computed sentence per length primary: what the slope per doubling is, on which model, lengths and data,
    and whether it changes with length (Holm over the primaries computed, BCa interval), is flat within its sesoi
    (TOST), or cannot be told; the lengths a masking slope leaves out for want of headroom, and those beyond the
    model's window (deviation of 2026-12-06)."""
    sentences = [("beyond_window", window_sentence(table, model))]
    for r in table.itertuples():
        what = _PHRASES.get(r.primary, r.measure)
        no_headroom = int_list(getattr(r, "lengths_no_headroom", None))
        left = (f" ({_tokens(no_headroom)} left out: no headroom, the unmasked accuracy's Wilson 95% upper bound below "
                f"{headroom_floor():g} or no right answer)") if no_headroom else ""
        if r.reading == "not tested":
            if r.n_units == 0 and r.primary in HEADROOM_PRIMARIES and no_headroom:
                reason = "no length with headroom"
            elif r.n_units == 0 and r.primary in HEADROOM_PRIMARIES:
                reason = "the fair masking pair was not run"
            elif r.n_units == 0:
                reason = "no layout has the quantity: no answer had an Eq. 1 activation"
            else:
                reason = (f"{int(r.n_layouts)} layouts with the quantity over {int(r.n_lengths)} length(s): a slope "
                          f"needs two lengths with at least {MIN_LAYOUTS_PER_LENGTH} layouts each")
            sentences.append((r.primary, f"Length trend of {what}: not tested ({reason}){left}."))
            continue
        lengths = [int(x) for x in str(r.lengths).split()]
        where = _setting(model, haystack, lengths, f"{int(r.n_layouts)} layouts ({int(r.n_units)} units)")
        numbers = (f"slope {ci_text(r.slope_per_doubling, r.low, r.high, digits=3, signed=True)} per doubling"
                   + (" (degenerate: every resample gives the same slope)" if is_true(r.degenerate) else "")
                   + f", Holm-adjusted p = {r.p_holm:.3g}, smallest effect of interest ±{r.sesoi:g}")
        reading = {"increases": f"**increases with length** ({numbers})",
                   "decreases": f"**decreases with length** ({numbers})",
                   "flat within the sesoi": (f"**flat with length within ±{r.sesoi:g}** (TOST: the 90% interval "
                                             f"[{r.tost_low:+.3f}, {r.tost_high:+.3f}] lies inside; {numbers})"),
                   "undetermined": f"**cannot be told** to change or stay flat ({numbers}{_resolving(r)})"}[r.reading]
        sentences.append((r.primary, f"On {where}, {what} {reading}{left}."))
    return Verdict(*sentences, declared=("beyond_window", "rotation_vs_length", "outside_vs_length",
                                         "irreplaceability_vs_length"))


# --- per-length statuses, by the rules the pre-registration file declares for Table 1 and Fig 2 ------------------
def table1_status(rows: pd.DataFrame, rule: dict | None = None) -> str:
    """One length's Table 1 status from its rows (``metric``, ``low``, ``high``) by claim 1's declared rule
    (``preregistration.yaml``, dynamism / Table 1): rotation as in the paper when the adjacent Jaccard's upper bound
    is at most the paper's largest value + the margin, none when its lower bound is above it; the share outside a
    static set present when its lower bound reaches the sesoi, absent when its upper bound stays below it.
    Absent in this setting when absent against both sets; reproduced: rotation and present against both; weaker:
    rotation and present against one, or no rotation as in the paper but present against both; not reproduced: no
    rotation (lower bound above) and present against neither; undetermined otherwise."""
    rule = rule or preregistration.item_rule("dynamism", "Table 1")
    at = rows.set_index("metric")
    upper = float(rule["paper_range_adjacent_jaccard"][1]) + float(rule["rotation_margin"])
    sesoi = float(rule["outside_sesoi"])
    rotation = at.loc["jaccard_adjacent", "high"] <= upper
    no_rotation = at.loc["jaccard_adjacent", "low"] > upper
    shares = [at.loc[name] for name in ("share_outside_wu", "share_outside_query_focused")]
    present = [s["low"] >= sesoi for s in shares]
    absent = [s["high"] < sesoi for s in shares]
    if all(absent):
        return "absent in this setting"
    if rotation and all(present):
        return "reproduced"
    if (rotation and sum(present) == 1) or (not rotation and all(present)):
        return "weaker"
    if no_rotation and not any(present):
        return "not reproduced"
    return "undetermined"


def _separated(row, alpha: float) -> bool:
    """An exact sign test below ``alpha`` and the interval away from 0 (a row without a test is not separated)."""
    if row is None or row.sign_p is None or pd.isna(row.sign_p):
        return False
    return float(row.sign_p) < alpha and (row.low > 0 or row.high < 0)


def fig2_status(rows: pd.DataFrame, rule: dict | None = None, alpha: float | None = None) -> str:
    """One length's Fig 2 status from its rows (``comparison``, ``value``, ``low``, ``high``, ``sign_p``) by claim
    2's declared rule (``preregistration.yaml``, irreplaceability / Fig 2), in its order: no headroom when the
    unmasked accuracy's upper bound is below the floor; not reproduced when static masking is separated as hurting
    more (accuracy, or either teacher-forced comparison); absent in this setting when static masking's accuracy
    upper bound is below the ratio x the unmasked accuracy and accuracy does not separate D_t from static;
    reproduced when accuracy is separated (D_t lower) and both teacher-forced comparisons are separated at or
    above the sesoi; weaker when a teacher-forced comparison is separated (D_t or D_{t-1} hurting more) but
    accuracy is not, or the fair comparison is not separated or missing; undetermined otherwise. Separated: exact
    sign test below alpha (each tested alone) and the BCa interval away from 0."""
    rule = rule or preregistration.item_rule("irreplaceability", "Fig 2")
    alpha = preregistration.alpha() if alpha is None else alpha
    at = {r.comparison: r for r in rows.itertuples()}
    none, static = at.get("accuracy_none"), at.get("accuracy_static_matched")
    accuracy, tf, fair = (at.get(name) for name in ("accuracy_dynamic_vs_static", "tf_drop_dynamic_vs_static",
                                                     "tf_drop_previous_vs_static"))
    sep = lambda row: _separated(row, alpha)
    if none is None or none.high < float(rule["headroom_floor"]):
        return "no headroom"
    if (sep(accuracy) and accuracy.value > 0) or (sep(tf) and tf.value < 0) or (sep(fair) and fair.value < 0):
        return "not reproduced"
    if static is not None and static.high < float(rule["static_destroys_ratio"]) * none.value and not sep(accuracy):
        return "absent in this setting"
    sesoi = float(rule["tf_sesoi"])
    accuracy_ok = sep(accuracy) and accuracy.value < 0
    tf_ok, fair_ok = (sep(row) and row.value >= sesoi for row in (tf, fair))
    if accuracy_ok and tf_ok and fair_ok:
        return "reproduced"
    if ((sep(tf) and tf.value > 0) or (sep(fair) and fair.value > 0)) and (not accuracy_ok or not fair_ok):
        return "weaker"
    return "undetermined"


def table1_statuses(table: pd.DataFrame) -> dict[int, str]:
    return {int(length): table1_status(part) for length, part in table.groupby("length", sort=True)}


def fig2_statuses(table: pd.DataFrame) -> dict[int, str]:
    return {int(length): fig2_status(part) for length, part in table.groupby("length", sort=True)}


def _value_text(row, signed: bool = False) -> str:
    """A value with its interval; "undefined" when there is no value (no Eq. 1 activation to pool), and "every
    layout at X (degenerate)" when every resample gave the same value."""
    value = float(row["value"] if isinstance(row, pd.Series) else row.value)
    low, high = (float(row["low"]), float(row["high"])) if isinstance(row, pd.Series) else (float(row.low), float(row.high))
    degenerate = is_true(row["degenerate"] if isinstance(row, pd.Series) else row.degenerate)
    if value != value:
        return "undefined (no Eq. 1 activation to pool)"
    if degenerate:
        return f"every layout at {value:{'+' if signed else ''}.2f} (degenerate)".replace("-", "−")
    return ci_text(value, low, high, signed=signed)


def _sk(table: pd.DataFrame) -> str:
    """The static sets' name with the size the table was counted with (``S_20`` in files from before the column)."""
    k = int(table["static_k"].iloc[0]) if "static_k" in table and len(table) else 20
    return f"S_{k}"


def claim1_verdict(table: pd.DataFrame, model: str, haystack: str) -> str:
    """Per length, Table 1's status by its declared rule, with the numbers it reads."""
    sk = _sk(table)
    parts = []
    for length, part in table.groupby("length", sort=True):
        at = part.set_index("metric")
        n = f"{int(at['n_layouts'].iloc[0])} layouts ({int(at['n_samples'].iloc[0])} samples)"
        numbers = "; ".join(f"{label} {_value_text(at.loc[m])}"
                            for m, label in (("jaccard_adjacent", "adjacent-step Jaccard"),
                                             ("share_outside_wu", f"share outside Wu's {sk}"),
                                             ("share_outside_query_focused", f"outside the query-focused {sk}")))
        parts.append(f"at {int(length):,} tokens ({n}): Table 1 **{table1_status(part)}** ({numbers})")
    return f"On {_setting(model, haystack, sorted(table['length'].unique()), 'by its declared rule')}: " + "; ".join(parts) + "."


def claim2_verdict(table: pd.DataFrame, model: str, haystack: str) -> str:
    """Per length, Fig 2's status by its declared rule, with the numbers it reads."""
    if table.empty:
        return "Fig 2 on the length grid: the masking runs were not made (masking=False)."
    parts = []
    for length, part in table.groupby("length", sort=True):
        at = {r.comparison: r for r in part.itertuples()}
        bits = []
        for name, label in (("accuracy_none", "unmasked accuracy"), ("accuracy_dynamic_vs_static",
                             "accuracy D_t − static"), ("tf_drop_dynamic_vs_static", "drop D_t − static"),
                            ("tf_drop_previous_vs_static", "drop D_{t-1} − static")):
            r = at.get(name)
            if r is None:
                bits.append(f"{label} not run")
                continue
            p = "" if r.sign_p is None or r.sign_p != r.sign_p else f", sign test p = {float(r.sign_p):.3g}"
            bits.append(f"{label} {_value_text(r, signed=name != 'accuracy_none')}{p}")
        n = int(at["accuracy_none"].n) if "accuracy_none" in at else 0
        parts.append(f"at {int(length):,} tokens (n = {n} samples): Fig 2 **{fig2_status(part)}** ({'; '.join(bits)})")
    return f"On {_setting(model, haystack, sorted(table['length'].unique()), 'by its declared rule')}: " + "; ".join(parts) + "."


# --- the index: notebook 07's rows, read from the files the notebook wrote -------------------------
def _longest(statuses: dict[int, str]) -> tuple[str, str]:
    longest = max(statuses)
    return statuses[longest], "; ".join(f"{length:,} tokens: {status}" for length, status in sorted(statuses.items()))


def _haystack(folder: Path) -> str:
    haystack = str(sidecar(folder, "table1_by_length").get("haystack", "?"))
    return haystack_label(haystack)


def _table1_headline(folder: Path) -> str:
    frame = pd.read_csv(folder / "table1_by_length.csv")
    parts = []
    for length, part in frame.groupby("length", sort=True):
        at = part.set_index("metric")
        parts.append(f"{int(length):,}: adjacent J {ci_text(at.loc['jaccard_adjacent', 'value'], at.loc['jaccard_adjacent', 'low'], at.loc['jaccard_adjacent', 'high'])}, "
                     f"outside Wu / QF {_sk(frame)} {at.loc['share_outside_wu', 'value']:.2f} / "
                     f"{at.loc['share_outside_query_focused', 'value']:.2f} ({int(at['n_layouts'].iloc[0])} layouts)")
    return f"{_haystack(folder)}; " + "; ".join(parts)


def _table1_row_status(folder: Path) -> Status:
    """Each length by claim 1's declared Table 1 rule (:func:`table1_status`); the row shows the longest length's
    status, with its numbers, and every length's status in its headline."""
    frame = pd.read_csv(folder / "table1_by_length.csv")
    status, each = _longest(table1_statuses(frame))
    at = frame[frame["length"] == frame["length"].max()].set_index("metric")
    numbers = "; ".join(f"{label} {ci_text(at.loc[m, 'value'], at.loc[m, 'low'], at.loc[m, 'high'])}"
                        for m, label in (("jaccard_adjacent", "adjacent J"), ("share_outside_wu", f"outside Wu's {_sk(frame)}"),
                                         ("share_outside_query_focused", f"outside the query-focused {_sk(frame)}")))
    return Status(status, f"{_haystack(folder)}, {int(frame['length'].max()):,} tokens: {numbers}; "
                          f"n = {int(at['n_layouts'].iloc[0])} layouts; by length: {each}")


def _fig2_headline(folder: Path) -> str:
    frame = pd.read_csv(folder / "fig2_by_length.csv")
    parts = []
    for length, part in frame.groupby("length", sort=True):
        at = {r.comparison: r for r in part.itertuples()}
        text = f"{int(length):,}: unmasked {at['accuracy_none'].value:.2f} (n = {int(at['accuracy_none'].n)})"
        if "tf_drop_dynamic_vs_static" in at:
            r = at["tf_drop_dynamic_vs_static"]
            text += f", drop D_t − static {ci_text(r.value, r.low, r.high, signed=True)} nats/step"
        parts.append(text)
    return f"{_haystack(folder)}; " + "; ".join(parts)


def _fig2_row_status(folder: Path) -> Status:
    """Each length by claim 2's declared Fig 2 rule (:func:`fig2_status`); the row shows the longest length's
    status, with its unmasked accuracy and teacher-forced D_t − static drop, and every length's status in its
    headline."""
    frame = pd.read_csv(folder / "fig2_by_length.csv")
    status, each = _longest(fig2_statuses(frame))
    longest = int(frame["length"].max())
    at = {r.comparison: r for r in frame[frame["length"] == longest].itertuples()}
    parts = [f"unmasked accuracy {ci_text(at['accuracy_none'].value, at['accuracy_none'].low, at['accuracy_none'].high)}"]
    if "tf_drop_dynamic_vs_static" in at:
        r = at["tf_drop_dynamic_vs_static"]
        parts.append(f"drop D_t − static {ci_text(r.value, r.low, r.high, signed=True)} nats/step")
    return Status(status, f"{_haystack(folder)}, {longest:,} tokens: {'; '.join(parts)}; "
                          f"n = {int(at['accuracy_none'].n)} samples; by length: {each}")


def _trend_headline(folder: Path) -> str:
    """Each length primary's slope (or why it was not tested), the lengths a masking slope left out for want of
    headroom, and where the grid stops because the model's window ends."""
    frame = pd.read_csv(folder / "length_trends.csv")
    parts = []
    for r in frame.itertuples():
        no_headroom = int_list(getattr(r, "lengths_no_headroom", None))
        left = f"; no headroom at {_tokens(no_headroom)}, left out" if no_headroom else ""
        parts.append(f"{r.primary}: " + (f"not tested (n = {int(r.n_layouts)} layouts{left})" if r.reading == "not tested"
                     else f"{ci_text(r.slope_per_doubling, r.low, r.high, digits=3, signed=True)}/doubling, "
                     f"Holm p = {r.p_holm:.3g} ({r.reading}; n = {int(r.n_layouts)} layouts at {r.lengths} tokens{left})"))
    beyond = int_list(frame["lengths_beyond_window"].iloc[0]) if "lengths_beyond_window" in frame and len(frame) else []
    if beyond:
        window = _window(frame)
        parts.append(f"grid stops at {_stops_at(frame):,} tokens: {_tokens(beyond)} beyond the model's "
                     + (f"{window:,}-token window" if window else "window"))
    return "; ".join(parts)


def _trend_status(folder: Path) -> Status:
    """The three pre-registered length primaries (Holm over those computed): supported (the phenomenon changes with
    length) when one reads "increases" or "decreases" with its slope at least its sesoi in size; not supported when
    every primary computed reads "flat within the sesoi" (TOST) and at least two were computed; undetermined
    otherwise."""
    frame = pd.read_csv(folder / "length_trends.csv")
    changes = frame[frame["reading"].isin(["increases", "decreases"])
                    & (frame["slope_per_doubling"].abs() >= frame["sesoi"])]
    tested = frame[frame["reading"] != "not tested"]
    if len(changes):
        status = "supported"
    elif len(tested) >= 2 and (tested["reading"] == "flat within the sesoi").all():
        status = "not supported"
    else:
        status = "undetermined"
    return Status(status, f"{_haystack(folder)}; " + _trend_headline(folder))


def _picture(folder: Path) -> Status:
    """Fig 1 per length: a picture of one answer per length, no verdict."""
    return Status("qualitative", "a picture of one answer per length")


def _trend_finding(folder: Path) -> list[str]:
    """The three length primaries' sentences (:func:`trend_verdict`), from ``length_trends.csv`` and its run config."""
    run = sidecar(folder, "length_trends")
    text = trend_verdict(pd.read_csv(folder / "length_trends.csv"), str(run.get("model", "this model")),
                         str(run.get("haystack", "prose")))
    return text.quote(*text.keys)


def _window_finding(folder: Path) -> list[str]:
    """The exploratory global vs sliding-window sentences (:func:`~.window.window_verdict`), from
    ``window_layers.csv`` and, on a model with sliding-window layers, ``window_shares.csv`` and
    ``window_jaccard.csv``: descriptive, no status."""
    run = sidecar(folder, "window_layers")
    layers = pd.read_csv(folder / "window_layers.csv")
    sliding = LayerKinds.from_table(layers).sliding
    shares = pd.read_csv(folder / "window_shares.csv") if sliding else None
    jaccard = pd.read_csv(folder / "window_jaccard.csv") if sliding else None
    text = window_verdict(layers, shares, jaccard, str(run.get("model", "this model")), str(run.get("haystack", "prose")))
    return text.quote(*text.keys)


CLAIM = Claim(
    notebook="07_length_grid",
    title="Claims 1 and 2 across length and depth",
    config=LengthGridConfig,
    presets={
        "smoke": {"lengths": [200, 400], "depths": [0.0, 1.0], "runs_per_cell": 2, "n_calibration": 2,
                  "max_new_tokens": 24, "n_resamples": 200,
                  # the size axis's code path too (the scale preset's), with a probe of the smallest size
                  "size_axis": True, "static_share": 0.1, "n_splits": 2, "probe_epochs": 5, "probe_hidden": [32]},
        # The pre-registered grid (preregistration.yaml, lengths:): 1k-32k tokens x 5 depths, 2 runs per cell. 16 rows
        # per masking batch: at 8k a SmolLM2 row keeps about 360 MiB of keys and values, so 32 rows would need 11 GiB.
        # Since the deviation of 2026-12-06: on to 16k and 32k where the model's window allows (up_to_context).
        "long": {"lengths": [1000, 2000, 4000, 8000, 16000, 32000], "up_to_context": True,
                 "depths": [0.0, 0.25, 0.5, 0.75, 1.0], "runs_per_cell": 2, "n_calibration": 8, "batch_size": 16},
        # The size axis (preregistration.yaml scale: and its deviation of 2026-12-06): one length, 5 depths x 6 runs
        # (30 layouts), static sets of 10% of the heads, the five primaries; run on every embedded model.
        "scale": {"lengths": [2000], "depths": [0.0, 0.25, 0.5, 0.75, 1.0], "runs_per_cell": 6, "n_calibration": 12,
                  "static_share": 0.1, "size_axis": True, "n_splits": 5, "batch_size": 32},
        "paper": {"model": "meta-llama/Llama-3.1-8B-Instruct", "haystack": "prose",
                  "lengths": [1000, 2000, 4000, 8000, 16000, 32000], "depths": [0.0, 0.25, 0.5, 0.75, 1.0],
                  "runs_per_cell": 5, "n_calibration": 20, "max_new_tokens": 64, "batch_size": 8},
    },
    # the committed report keeps the long grid's runs in papers_figures/long/<model>/ and the size axis's in
    # papers_figures/scale/<model>/, one folder for every model run
    committed=("long", "scale"),
    section=size_axis_section,  # the size axis across the scale report's models, in its index
    section_presets=("scale",),  # the README's answer quotes the size axis's sentences, not a column per model
    items=(
        PaperItem("Table 1 by length", "Table 1's quantities per context length on real prose (adjacent-step Jaccard, "
                  "share outside Wu's and the query-focused S_20; BCa 95% over layouts)",
                  "Table 1 at one NIAH length per model", "table1_by_length", 27, _table1_headline,
                  _table1_row_status),
        PaperItem("Fig 1 by length", "Fig 1 per context length: the 10 most variable heads over one answer",
                  "Fig 1 (one answer)", "fig1_by_length", 27.1, None, _picture),
        PaperItem("Fig 2 by length", "Fig 2 as a length x depth heatmap per masking condition (accuracy and the "
                  "teacher-forced gold log-prob drop), n per cell", "Fig 2: 5k-50k tokens x depths 0-100%, 5 runs per cell",
                  "fig2_length_accuracy", 27.2, _fig2_headline, _fig2_row_status),
        PaperItem("Beyond 7", "Does the phenomenon change with length? Three pre-registered slopes per doubling "
                  "(rotation, share outside the query-focused S_20, D_{t-1} − static drop), Holm over the three",
                  "not in the paper", "length_trends", 27.3, _trend_headline, _trend_status),
    ),
    findings=(Finding("Length grid: trends", _trend_finding,
                      "Do the phenomena change with length? The three pre-registered slopes"),
              Finding("Length grid: global and sliding-window layers (exploratory)", _window_finding,
                      "Exploratory: global and sliding-window layers (not pre-registered)"),
              Finding("Length grid: rotation against its size bound (exploratory)", bound_finding,
                      "Exploratory: rotation against its size bound (not pre-registered)")),
    seeds=SEEDS,
)
