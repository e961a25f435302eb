"""Claim 2's index statuses: the rules that preregistration.yaml declares for Fig 2 / Fig 6 (masking) and Fig 3 /
Fig 7 (progressive masking), each reading every half of its item from the CSVs the notebook wrote, with its
thresholds read from the file and a computed sentence on what would settle an item that is not reproduced.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pandas as pd

from dynheads_tl.claim import Status, ci_text, is_true, sidecar
from dynheads_tl.tasks.hotpot_sources import source_label

from .comparisons import progressive_control_outcome, progressive_table
from .config import ALPHA, PRIMARY
from dynheads_tl import preregistration
from dynheads_tl.analysis.statistics import Interval, bootstrap_interval, interval_words

__all__ = ["PAPER_FIG3", "masking_rule", "compensation", "progressive_rule"]


# The paper's anchors (Fig 3): accuracy 1.0 -> 0.0 by k = 20 dynamic heads; 4.5-7 compensating
# static-top-20 heads for k >= 5.
PAPER_FIG3 = {"accuracy_at_k0": 1.0, "accuracy_at_k20": 0.0, "m_s_range_k_ge_5": (4.5, 7.0)}


def _control_conclusion(outcome: dict) -> str:
    """The control's conclusion in words (:func:`progressive_control_outcome`): where the ranked heads hurt more,
    where random heads hurt more, or why nothing could be told apart."""
    ks = lambda values: ", ".join(str(k) for k in values)
    said = []
    if outcome["specific"]:
        said.append(f"the ranked heads hurt more than as many random heads at k = {ks(outcome['specific'])}")
    if outcome["reverse"]:
        said.append(f"random heads hurt more than the ranked ones at k = {ks(outcome['reverse'])}")
    if said:
        return "; ".join(said)
    if not outcome["testable"]:
        return (f"no k could be tested: too few samples differ (an exact sign test needs at least {outcome['needs']} "
                f"differing samples to reach p < {ALPHA}; n = {outcome['n']} samples per k)")
    return (f"the ranked heads are not told apart from as many random heads at any k (this design detects a "
            f"difference of about {outcome['smallest']:.2f} at best)")


def _pair(table: pd.DataFrame, task: str, a: str, b: str, metric: str):
    """One row of ``comparisons.csv``, or None when the notebook did not write it (a condition not run)."""
    hit = table[(table["task"] == task) & (table["a"] == a) & (table["b"] == b) & (table["metric"] == metric)]
    return None if hit.empty else hit.iloc[0]


def _direction(row) -> str | None:
    """"more" when the first set's masking is separated as hurting more (a larger teacher-forced drop, a lower
    free-generation metric), "less" when separated the other way, None when not separated or absent."""
    if row is None or not is_true(row.separated):
        return None
    worse_is_higher = str(row.metric).startswith("tf_drop")  # tf_drop, tf_drop_t1: a larger drop hurts more
    return "more" if (row.difference > 0) == worse_is_higher else "less"


def _pair_text(row, name: str, digits: int = 3) -> str:
    """One comparison in the status's words: the paired difference, the sample counts, the p it was tested at;
    "tied on every sample" where no sample differs; "missing" where the notebook did not write it."""
    if row is None:
        return f"{name}: missing (the notebook wrote no such comparison)"
    counts = f"{int(row.a_worse)}:{int(row.b_worse)} samples"
    if row.a_worse + row.b_worse == 0:
        return f"{name}: tied on every one of {int(row.n)} samples"
    p = f"p = {row.p_adjusted:.3g}" if row.p_adjusted == row.p_adjusted else "cannot reach the level"
    return f"{name} {ci_text(row.difference, row.low, row.high, digits, True)} ({counts}, {p})"


def masking_rule(summary: pd.DataFrame, table: pd.DataFrame, task: str, rule: dict) -> tuple[str, dict]:
    """The declared Fig 2 / Fig 6 rule (preregistration.yaml, ``rule``: its thresholds) on the notebook's condition
    summary (indexed by condition) and ``comparisons.csv``. Returns the status and the three halves it read:

    - ``accuracy``: the free-generation metric, D_t against as many top static heads (``static_matched``);
    - ``tf``: the teacher-forced drop, D_t against as many static heads (partly expected from selection: D_t is
      chosen on the same step's clean pass);
    - ``fair``: the declared primary (:data:`~.config.PRIMARY`): the teacher-forced drop over steps t >= 1, D_{t-1}
      (``previous_step``, known before the step) against as many top static heads (``static_previous``, sized
      |D_{t-1}|); "missing" where the run has no such condition, and then the status is at most "weaker".

    In order: no headroom (the unmasked metric's upper bound < ``headroom_floor``); not reproduced (static masking
    separated as hurting more on any half); absent in this setting (static masking destroys retrieval too: its upper
    bound < ``static_destroys_ratio`` x the unmasked estimate, and accuracy does not separate D_t from static);
    reproduced (all three separated with D_t / D_{t-1} hurting more, each teacher-forced difference >= ``tf_sesoi``);
    weaker (a teacher-forced half separated that way); undetermined."""
    metric = "accuracy" if "accuracy" in summary else "f1"
    halves = {"accuracy": _pair(table, task, "dynamic", "static_matched", metric),
              "tf": _pair(table, task, "dynamic", "static_matched", "tf_drop"),
              "fair": _pair(table, task, *PRIMARY[1:])}
    if halves["accuracy"] is None:  # runs before the size-matched baseline: the paper's fixed-k static set
        halves["accuracy"] = _pair(table, task, "dynamic", "static", metric)
    unmasked = summary.loc["none"]
    static = summary.loc["static_matched"] if "static_matched" in summary.index else summary.loc["static"]
    direction = {name: _direction(row) for name, row in halves.items()}
    big = lambda name: direction[name] == "more" and halves[name].difference >= float(rule["tf_sesoi"])
    if unmasked[f"{metric}_high"] < float(rule["headroom_floor"]):
        verdict = "no headroom"
    elif "less" in direction.values():
        verdict = "not reproduced"
    elif (static[f"{metric}_high"] < float(rule["static_destroys_ratio"]) * unmasked[metric]
          and direction["accuracy"] is None):
        verdict = "absent in this setting"
    elif direction["accuracy"] == "more" and big("tf") and big("fair"):
        verdict = "reproduced"
    elif direction["tf"] == "more" or direction["fair"] == "more":
        verdict = "weaker"
    else:
        verdict = "undetermined"
    return verdict, halves


def _masking_settle(verdict: str, halves: dict, summary: pd.DataFrame, folder: Path, task: str) -> str:
    """What would settle a masking item that is not reproduced, in one computed sentence."""
    if verdict == "reproduced":
        return ""
    run = sidecar(folder, "comparisons") or sidecar(folder, f"fig{2 if task == 'niah' else 6}_{task}_masking")
    model = run.get("model", "this model")
    lengths = run.get("niah_contexts" if task == "niah" else "hotpot_contexts", [])
    where = f"{model} at {', '.join(map(str, lengths))} tokens" if lengths else model
    metric = "accuracy" if "accuracy" in summary else "f1"
    parts = []
    if verdict == "no headroom":
        parts.append(f"a model or data set on which the unmasked {metric} reaches the headroom floor "
                     f"(here {summary.loc['none', metric]:.2f} for {where}"
                     + (", on synthetic HotpotQA-format questions" if task == "hotpot" and
                        str(run.get("hotpot_source", "synthetic")) == "synthetic" else "") + ")")
    if verdict == "absent in this setting":
        static = "static_matched" if "static_matched" in summary.index else "static"
        parts.append(f"a setting where masking as many static heads leaves retrieval standing (here static "
                     f"{metric} {summary.loc[static, metric]:.2f} against unmasked {summary.loc['none', metric]:.2f} "
                     f"for {where}): a larger model or longer contexts (the confirmatory Gemma 3 and 1k-8k runs)")
    if halves["fair"] is None:
        parts.append("the fair comparison (D_(t-1), known before the step, against as many static heads), which "
                     "this run did not make")
    tf = halves["tf"]
    if tf is not None and _direction(tf) is None and tf.a_worse + tf.b_worse:
        need = tf.get("n_to_resolve") if hasattr(tf, "get") else None
        if need == need and need:
            parts.append(f"about {int(need)} samples for the teacher-forced D_t − static difference")
    return ("What would settle it: " + "; ".join(parts) + ".") if parts else ""


def _masking_status(task: str) -> Callable[[Path], Status]:
    item = "Fig 2" if task == "niah" else "Fig 6"

    def status(folder: Path) -> Status:
        """The declared rule of Fig 2 / Fig 6 (preregistration.yaml; :func:`masking_rule`) on the notebook's
        ``<task>_conditions.csv`` and ``comparisons.csv``: every half of the item, the paper's own measure (free
        generation) beside the teacher-forced drop and the fair comparison with D_{t-1}."""

        summary = pd.read_csv(folder / f"{task}_conditions.csv").set_index("condition")
        table = pd.read_csv(folder / "comparisons.csv")
        verdict, halves = masking_rule(summary, table, task, preregistration.item_rule("irreplaceability", item))
        metric = "accuracy" if "accuracy" in summary else "f1"
        cell = lambda c: (ci_text(summary.loc[c, "tf_drop"], summary.loc[c, "tf_drop_low"], summary.loc[c, "tf_drop_high"])
                          if c in summary.index else "missing")
        free = lambda c: ci_text(summary.loc[c, metric], summary.loc[c, f"{metric}_low"], summary.loc[c, f"{metric}_high"])
        source = str((sidecar(folder, "comparisons") or sidecar(folder, "fig6_hotpot_masking")).get("hotpot_source",
                                                                                                  "synthetic"))
        synthetic = task == "hotpot" and source == "synthetic"
        data = "" if task == "niah" else f"{source_label(source)} questions; "
        headline = (f"{data}{metric} D_t {free('dynamic')} vs as many static "
                    f"{free('static_matched' if 'static_matched' in summary.index else 'static')}; gold log-prob drop, "
                    f"nats/step: D_t {cell('dynamic')}, D_(t-1) {cell('previous_step')}, as many static "
                    f"{cell('static_matched')}, as many random {cell('random_matched')}; n = {int(summary['n'].min())} "
                    f"samples per condition")
        why = (f"unmasked {metric} {free('none')}; "
               + "; ".join((_pair_text(halves['accuracy'], f'{metric} D_t − static', 2),
                            _pair_text(halves['tf'], 'teacher-forced D_t − static'),
                            _pair_text(halves['fair'], 'fair D_(t-1) − static')))
               + ("" if halves["fair"] is not None else "; the fair half is missing, so the status cannot read reproduced")
               + (" (synthetic data)" if synthetic else ""))
        settle = _masking_settle(verdict, halves, summary, folder, task)
        return Status(verdict, headline, why + (f". {settle}" if settle else ""))
    return status


def compensation(frame: pd.DataFrame, *, k_min: int = 5, seed: int = 0) -> dict:
    """Compensation m_s over k >= ``k_min`` from the progressive runs' per-sample rows: each sample's mean m_s over
    those k (ranked masking), its BCa 95% interval over samples; the same for random masking; and the paired
    difference ranked − random on the samples both ran. Keys missing where the data lack them (``"m_s"`` absent:
    only means were written, no interval)."""

    if "m_s" not in frame:
        return {}
    ranking = frame["ranking"] if "ranking" in frame else pd.Series("ranked", index=frame.index)
    later = frame[frame["k"] >= k_min]
    per = lambda which: later[ranking.loc[later.index] == which].groupby("sample")["m_s"].mean()
    ranked, random = per("ranked"), per("random")
    out = {}
    if len(ranked):
        out["ranked"] = bootstrap_interval(ranked.to_numpy(dtype=float), seed=seed)
    if len(random):
        out["random"] = bootstrap_interval(random.to_numpy(dtype=float), seed=seed)
        both = ranked.to_frame("a").join(random.rename("b"), how="inner")
        if len(both):
            out["difference"] = bootstrap_interval((both["a"] - both["b"]).to_numpy(dtype=float), seed=seed)
    return out


def progressive_rule(table: pd.DataFrame, metric: str, comp: dict, rule: dict) -> tuple[str, str, str]:
    """The declared Fig 3 / Fig 7 rule (preregistration.yaml) on :func:`progressive_table` and
    :func:`compensation`. Returns (status, the curve's reading, compensation's reading):

    - curve: "present" when the largest k's interval lies below the k = 0 interval and the ranked heads beat as many
      random heads at some k (Holm over k); "drop only" when the run has no random control (the specificity half is
      missing); "not specific" otherwise when it drops; "none" when it does not;
    - compensation: "present" when the mean m_s over k >= 5 has its lower bound >= ``compensation_sesoi`` and lies
      above random masking's (paired ranked − random interval above 0); "absent" when its upper bound <
      ``compensation_sesoi``; "missing" without per-sample m_s; "undetermined" otherwise.

    Status, in order: no headroom (k = 0 upper bound < ``headroom_floor``, or the k = 0 estimate 0: a "no drop"
    reading there cannot fail, deviation of 2026-12-05); not reproduced (no drop: the largest k's
    interval at or above the k = 0 estimate; or random heads hurt significantly more and the ranked ones nowhere);
    reproduced (curve present and compensation present); weaker (a drop with compensation absent, undetermined or
    missing, or a drop whose specificity half is missing); undetermined."""
    a, b = table.iloc[0], table.iloc[-1]
    outcome = progressive_control_outcome(table)
    specific = bool(outcome and outcome["specific"])
    reverse = bool(outcome and outcome["reverse"]) and not specific
    drops = b[f"{metric}_high"] < a[f"{metric}_low"]
    curve = ("none" if not drops else "present" if specific else "drop only" if outcome is None else "not specific")
    sesoi = float(rule["compensation_sesoi"])
    ranked = comp.get("ranked")
    if ranked is None:
        compensated = "missing"
    elif ranked.low >= sesoi and "difference" in comp and comp["difference"].low > 0:
        compensated = "present"
    elif ranked.high < sesoi:
        compensated = "absent"
    else:
        compensated = "undetermined"
    if a[f"{metric}_high"] < float(rule["headroom_floor"]) or not a[metric] > 0:
        verdict = "no headroom"  # below the floor, or nothing to drop from (deviation of 2026-12-05)
    elif b[f"{metric}_low"] >= a[metric] or reverse:
        verdict = "not reproduced"
    elif curve == "present" and compensated == "present":
        verdict = "reproduced"
    elif curve in ("present", "drop only"):
        verdict = "weaker"
    else:
        verdict = "undetermined"
    return verdict, curve, compensated


def _interval_or_all(value: float, low: float, high: float, n: int, digits: int = 3, signed: bool = False) -> str:
    """An estimate with its 95% interval in words (:func:`interval_words`: "every one of the n samples at X (no
    interval: all equal)" when it is degenerate), with true minus signs; "missing" when the estimate is NaN."""
    if value != value:
        return "missing"
    return interval_words(Interval(value, low, high, n), unit=f"one of the {n} samples", digits=digits,
                          signed=signed).replace("-", "−")


def _teacher_forced_curve(table: pd.DataFrame) -> str:
    """The teacher-forced half of a progressive item, from :func:`progressive_table`'s ``tf_`` columns: the ranked
    heads' gold-token log-probability drop per k (nats/step, 95% interval over samples) and, where the run has the
    size-matched random control, ranked − random per k with its Holm-adjusted sign test."""
    if "tf_drop" not in table:
        return "teacher-forced drop by k: missing (this run did not write it)"
    parts = []
    for _, row in table.iterrows():
        n = int(row["n"])
        text = f"k = {int(row['k'])} " + _interval_or_all(row["tf_drop"], row["tf_drop_low"], row["tf_drop_high"], n)
        if "tf_difference" in row and row["tf_difference"] == row["tf_difference"]:
            p = row.get("tf_p_adjusted")
            diff = _interval_or_all(row["tf_difference"], row["tf_difference_low"], row["tf_difference_high"], n,
                                    signed=True)
            text += (f" (ranked − random {diff}, {int(row['tf_ranked_worse'])}:{int(row['tf_random_worse'])} samples"
                     + (f", Holm p = {p:.3g}" if p is not None and p == p else ", not testable") + ")")
        parts.append(text)
    return ("teacher-forced drop of the ranked heads by k, nats/step (95% intervals over samples): "
            + "; ".join(parts))


def _progressive_status(stem: str) -> Callable[[Path], Status]:
    item = "Fig 3" if "niah" in stem else "Fig 7"

    def status(folder: Path) -> Status:
        """The declared rule of Fig 3 / Fig 7 (preregistration.yaml; :func:`progressive_rule`) on the per-sample
        progressive runs (``<stem>.csv``): the curve with its size-matched random control, and compensation m_s
        against the pre-registered smallest effect and against random masking's m_s. The teacher-forced drop by k
        is quoted where the run wrote it, and named missing otherwise."""

        rule = preregistration.item_rule("irreplaceability", item)
        frame = pd.read_csv(folder / f"{stem}.csv")
        metric = "accuracy" if "accuracy" in frame else "f1"
        table = progressive_table(frame, metric)
        comp = compensation(frame)
        verdict, curve, compensated = progressive_rule(table, metric, comp, rule)
        a, b = table.iloc[0], table.iloc[-1]
        outcome = progressive_control_outcome(table)
        source = str(sidecar(folder, stem).get("hotpot_source", "synthetic"))
        synthetic = "niah" not in stem and source == "synthetic"
        data = "" if "niah" in stem else f"{source_label(source)} questions; "
        detail = (f"{data}{metric} k = {int(a['k'])}: {ci_text(a[metric], a[f'{metric}_low'], a[f'{metric}_high'])} → "
                  f"k = {int(b['k'])}: {ci_text(b[metric], b[f'{metric}_low'], b[f'{metric}_high'])}; "
                  f"n = {int(table['n'].min())} samples per k")
        if outcome is not None:
            detail += f"; size-matched random k: {_control_conclusion(outcome)}"
        paper = PAPER_FIG3["m_s_range_k_ge_5"]
        if "ranked" in comp:
            r = comp["ranked"]
            detail += (f"; compensation m_s over k ≥ 5 {ci_text(r.estimate, r.low, r.high)} heads"
                       + (f" vs random {ci_text(comp['random'].estimate, comp['random'].low, comp['random'].high)}"
                          if "random" in comp else "")
                       + f" (paper {paper[0]:g}–{paper[1]:g}; smallest effect of interest {rule['compensation_sesoi']:g})")
        tf = _teacher_forced_curve(table)
        why = (f"curve {curve}; compensation {compensated}"
               + (" (only means were written: its interval is missing)" if compensated == "missing" else "")
               + f"; {tf}" + (" (synthetic data)" if synthetic else ""))
        if verdict != "reproduced":
            run = sidecar(folder, stem)
            length = run.get("progressive_context", "?") if "niah" in stem else ", ".join(map(str, run.get("hotpot_contexts", ["?"])))
            where = f"{run.get('model', 'this model')} at {length} tokens"
            settle = {"no headroom": f"a model or data set where the k = 0 {metric} clears {rule['headroom_floor']:g} "
                                     f"(here {a[metric]:.2f}, {where})",
                      "weaker": f"compensation: here m_s over k ≥ 5 is {comp['ranked'].estimate:.2f} heads for {where} "
                                f"against the paper's {paper[0]:g}–{paper[1]:g} on Llama-3.1-8B; a larger model and "
                                "longer contexts (the confirmatory runs) would show whether heads take over"
                      if "ranked" in comp else "compensation m_s per sample, which this run did not write"}
            text = settle.get(verdict, f"more samples than the {int(table['n'].min())} per k, or a model with more "
                                       "retrieval heads to remove")
            why += f". What would settle it: {text}."
        return Status(verdict, detail, why)
    return status
