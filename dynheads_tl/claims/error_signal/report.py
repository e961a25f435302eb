"""Notebook 05's report part: the computed verdict sentences, the scale of other detectors, and the index row.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from dynheads_tl import preregistration
from dynheads_tl.analysis.statistics import Interval, format_interval, n_to_resolve, sensitivity_words, tost_row
from dynheads_tl.claim import Claim, Finding, PaperItem, Primary, Status, Verdict, ci_text, is_true, sidecar
from dynheads_tl.tasks.hotpot_sources import source_label

from .config import ALPHA, GROUP_NAMES, MIN_PER_CLASS, PRIMARY, SEEDS, ErrorSignalConfig
from .pipeline import mark_primary

__all__ = ["ANCHORS", "CLAIM", "difficulty_sentences", "verdict"]


ANCHORS = {"Lookback Lens (in-domain)": (0.85, 0.91), "Lookback Lens (across tasks)": (0.82, 0.85),
           "ReDeEP (RAGTruth, 7B-13B)": (0.75, 0.82)}


def _fmt(estimate: float, low: float, high: float, signed: bool = False) -> str:
    """An estimate with its interval; "not scored" where there is none (too few of one class to train on)."""
    if estimate != estimate:
        return "not scored (too few of one class to train on)"
    return format_interval(estimate, low, high, 3, signed=signed)


def _p(value: float) -> str:
    """``= 0.012``, ``< 0.001`` or ``n/a`` (not tested), to follow "p_adj"."""
    return "n/a" if value != value else f"= {value:.3f}" if value >= 0.001 else "< 0.001"


def _compared(row) -> str:
    """One comparison in words: the verb, b's name and the numbers (interval, sign counts, adjusted p), and for a
    comparison that cannot be told apart what the design could detect."""
    name = GROUP_NAMES.get(row["b"], row["b"]).lower()
    if row["difference"] != row["difference"]:
        return f"are not compared with the {name} (not scored: too few of one class to train on)"
    numbers = (f"{_fmt(row['difference'], row['low'], row['high'], signed=True)}, layouts {int(row['a_better'])}:"
               f"{int(row['b_better'])}")
    if not row["evaluable"]:
        return f"are not tested against the {name} ({numbers}; too few wrong or right answers)"
    if not row["testable"]:
        return (f"cannot be tested against the {name} ({numbers}: too few layouts differ for a sign test to reach "
                f"{ALPHA})")
    tested = f"p {_p(row['sign_p'])}, tested alone" if row.get("primary", False) else f"p_adj {_p(row['p_adjusted'])}"
    if row["separated"]:
        verb = "beat" if row["difference"] > 0 else "fall below"
        return f"{verb} the {name} ({numbers}, {tested})"
    interval = Interval(row["difference"], row["low"], row["high"], int(row["n"]),
                        int(row["clusters"]) if "clusters" in row else None)
    sesoi = _sesoi()
    negligible = (f"; TOST at ±{sesoi:g}: negligible" if tost_row(row, sesoi) else
                  f"; not shown negligible (TOST at ±{sesoi:g})")
    return (f"cannot be told apart from the {name} ({numbers}, {tested}; "
            f"{sensitivity_words(interval, unit='layouts')}{negligible})")


def _sesoi() -> float:
    """Claim 5's smallest effect of interest (AUROC), declared in preregistration.yaml."""
    return float(preregistration.primary("error_signal")["sesoi"])


def difficulty_sentences(data: pd.DataFrame) -> list[str]:
    """Settings with fewer than :data:`MIN_PER_CLASS` wrong answers are too easy to evaluate a detector, those with
    fewer right ones too hard (SCIENCE 12): one computed sentence each."""
    lines = []
    for row in data.itertuples():
        right = int(row.n) - int(row.wrong)
        if row.wrong < MIN_PER_CLASS and right < MIN_PER_CLASS:
            lines.append(f"{row.setting} has {int(row.wrong)} wrong and {right} right answers (fewer than "
                         f"{MIN_PER_CLASS} of each): too small to evaluate an error detector on its own; its "
                         "within-setting comparisons are shown but not tested.")
        elif row.wrong < MIN_PER_CLASS:
            lines.append(f"{row.setting} has only {int(row.wrong)} wrong answers of {int(row.n)} (fewer than "
                         f"{MIN_PER_CLASS}): too easy to evaluate an error detector on its own; its within-setting "
                         "comparisons are shown but not tested.")
        elif right < MIN_PER_CLASS:
            lines.append(f"{row.setting} has only {right} right answers of {int(row.n)} (fewer than {MIN_PER_CLASS}): "
                         "too hard to evaluate an error detector on its own; its within-setting comparisons are shown "
                         "but not tested.")
    return lines


def verdict(table: pd.DataFrame, comparisons: pd.DataFrame, data: pd.DataFrame | None = None,
            per_setting: pd.DataFrame | None = None) -> Verdict:
    """Computed sentences: every group's pooled AUROC with its interval (beside what knowing only the setting
    gives); which settings are too easy or too hard to evaluate (fewer than :data:`MIN_PER_CLASS` wrong or right
    answers); the declared primary comparison; then every comparison of ``comparisons``
    (:func:`comparison_table`) pooled and within each setting: "beat" / "fall below" only where the
    Holm-adjusted sign test is below 0.05 and the paired interval excludes 0, else "cannot be told apart" with
    the difference the design could detect, or "cannot be tested" where too few layouts differ."""
    t = table.set_index("group")
    ref = t.loc["dynamic"]
    lines = [("auroc", f"On n = {int(ref['n'])} pooled answers ({int(ref['wrong'])} wrong), out-of-fold AUROC: "
             + "; ".join(f"{r['method']} {_fmt(r['auroc'], r['low'], r['high'])}" for _, r in t.iterrows()) + ".")]
    lines.append(("upper bound", "The first group uses where the true evidence lies (the needle, the supporting sentence), which a "
                 "deployed detector does not know: an answer copied from the evidence is nearly always right, so "
                 "that group is an upper bound, not a detector. The context-only group and the baselines use no "
                 "such knowledge; the answer-in-context string match is nearly the NIAH label itself."))
    if "setting" in t.index:
        lines.append(("settings", "Settings differ in error rate, so pooled AUROC partly measures which setting an answer came "
                     "from; the setting-only classifier above is that part, and the within-setting numbers below "
                     "are free of it."))
    if data is not None:
        lines += [("difficulty", sentence) for sentence in difficulty_sentences(data)]
    if comparisons.empty:
        lines.append(("comparisons", "No comparison could be made (a scope with one class only)."))
    else:
        testable = comparisons[comparisons["evaluable"] & comparisons["testable"]]
        secondary = testable[~testable["primary"]] if "primary" in testable else testable
        lines.append(("tests", f"Tests: exact sign tests over layouts; the declared primary alone at {ALPHA}, Holm over the "
                     f"{len(secondary)} testable secondary comparisons of this verdict "
                     f"({int((comparisons['evaluable'] & ~comparisons['testable']).sum())} untestable, "
                     f"{int((~comparisons['evaluable']).sum())} in scopes too easy or too hard, left out). "
                     "The pooled answers include the HotpotQA answers where the run asked for them (a setting marked "
                     "'(synthetic)' holds the project's generated questions, not the dev set)."))
        primary = comparisons[comparisons["primary"]]
        if len(primary):
            lines.append(("primary", "Primary comparison (declared): pooled, the context-only dynamic-head features "
                          + _compared(primary.iloc[0]) + "."))
        variants = (("dynamic", "the dynamic-head features that know the evidence"),
                    ("dynamic_ctx", "the context-only dynamic-head features"))
        for scope, part in comparisons.groupby("scope", sort=False):
            where = "Pooled" if scope == "pooled" else f"Within {scope} (n = {int(part['n'].iloc[0])}, " \
                                                        f"{int(part['wrong'].iloc[0])} wrong)"
            if scope != "pooled" and per_setting is not None and len(per_setting):
                p = per_setting[per_setting["setting"] == scope].set_index("group")
                cells = ", ".join(f"{g} {_fmt(p.loc[g, 'auroc'], p.loc[g, 'low'], p.loc[g, 'high'])}"
                                  for g in ("dynamic", "dynamic_ctx", "lookback", "logit", "string_match") if g in p.index)
                where += f" [AUROC {cells}]" if cells else ""
            short = "Pooled" if scope == "pooled" else f"Within {scope}"
            for key, name in variants:
                rows = part[(part["a"] == key) & ~part["primary"]]
                if len(rows):
                    lines.append((f"{scope}:{key}", f"{where}, {name} "
                                  + "; ".join(_compared(r) for _, r in rows.iterrows()) + "."))
                    where = short  # the scope's sizes and AUROCs are stated once
            added = part[part["a"] == "dynamic+logit"]
            if len(added):
                lines.append((f"{scope}:dynamic+logit", f"{where}, the evidence-knowing features added to the logit "
                              "features " + _compared(added.iloc[0]).replace("the logit (probability, entropy)",
                                                                            "the logit features alone") + "."))
    lines.append(("anchors", "For scale only (other models and data): " + "; ".join(
        f"{name} {low:.2f}-{high:.2f}" for name, (low, high) in ANCHORS.items()) + "."))
    return Verdict(*lines, declared=("auroc", "upper bound", "settings", "difficulty", "comparisons", "tests", "primary",
                                     "anchors", "pooled:dynamic", "pooled:dynamic_ctx", "pooled:dynamic+logit"))


# --- the index: notebook 05's row, read from the files the notebook wrote -------------------------
def _auroc_headline(folder: Path) -> str:
    frame = pd.read_csv(folder / "auroc.csv")
    parts = [f"{r.method} " + ("not scored" if r.auroc != r.auroc else f"{r.auroc:.2f} [{r.low:.2f}, {r.high:.2f}]")
             for r in frame.itertuples()]
    diff = lambda r, key: (f"vs {r.group} not scored" if getattr(r, key + "_minus") != getattr(r, key + "_minus") else
                           f"vs {r.group} {getattr(r, key + '_minus'):+.2f} [{getattr(r, key + '_minus_low'):+.2f}, "
                           f"{getattr(r, key + '_minus_high'):+.2f}]")
    rows = [r for r in frame.itertuples() if r.group in ("lookback", "logit")]
    text = (f"n = {int(frame['n'].iloc[0])} pooled answers ({int(frame['wrong'].iloc[0])} wrong): " + "; ".join(parts)
            + "; evidence-knowing features " + ", ".join(diff(r, "dynamic") for r in rows))
    if "dynamic_ctx_minus" in frame:
        text += "; context-only features " + ", ".join(diff(r, "dynamic_ctx") for r in rows)
    return text + " (paired)"


def error_rule(row, *, sesoi: float, alpha: float, min_per_class: int) -> str:
    """The declared Beyond 5 rule (preregistration.yaml) on the primary's row of ``auroc_comparisons.csv`` (pooled,
    the declared a − b): no headroom with fewer than ``min_per_class`` wrong or right answers; supported when the
    primary, tested alone at ``alpha`` (its own sign-test p over layouts, the interval away from 0), is separated
    positive and reaches ``sesoi``; not supported when separated negative or when TOST (both one-sided tests at
    ``alpha``: the row's 90% ``tost_low``–``tost_high`` within ±sesoi; a row written before those were, whose
    per-answer scores the results files do not hold, reads its 95% interval, which is stricter: deviation of
    2026-12-05) says it is negligible; undetermined otherwise."""
    if row["wrong"] < min_per_class or row["right"] < min_per_class:
        return "no headroom"
    separated = row["sign_p"] < alpha and (row["low"] > 0 or row["high"] < 0)
    if separated and row["difference"] >= sesoi:
        return "supported"
    if (separated and row["difference"] < 0) or tost_row(row, sesoi):
        return "not supported"
    return "undetermined"


def _auroc_status(folder: Path) -> Status:
    """:func:`error_rule` on the declared primary (:data:`~.config.PRIMARY`, read from preregistration.yaml)."""
    scope, a, b = PRIMARY
    sesoi = float(preregistration.primary("error_signal")["sesoi"])
    comp = pd.read_csv(folder / "auroc_comparisons.csv")
    row = comp[(comp["scope"] == scope) & (comp["a"] == a) & (comp["b"] == b)].iloc[0]
    verdict = error_rule(row, sesoi=sesoi, alpha=preregistration.alpha(), min_per_class=MIN_PER_CLASS)
    frame = pd.read_csv(folder / "auroc.csv").set_index("group")
    run = sidecar(folder, "auroc")
    hotpot = source_label(str(run.get("hotpot_source", "synthetic")))
    data = (f"NIAH and {hotpot} answers pooled" if int(run.get("n_hotpot", 1) or 0) > 0 else "NIAH answers pooled")
    cell = lambda g: (("not scored" if frame.loc[g, "auroc"] != frame.loc[g, "auroc"] else
                       ci_text(frame.loc[g, "auroc"], frame.loc[g, "low"], frame.loc[g, "high"]))
                      if g in frame.index else "missing")
    paired = ("not scored (too few of one class to train on)" if row.difference != row.difference else
              f"{ci_text(row.difference, row.low, row.high, signed=True)} (sign test over layouts alone, "
              f"{int(row.a_better)}:{int(row.b_better)}, p = {row.sign_p:.2g})")
    headline = (f"primary: AUROC {GROUP_NAMES.get(a, a).lower()} {cell(a)} vs {GROUP_NAMES.get(b, b).lower()} {cell(b)}, "
                f"paired {paired}; n = {int(row.n)} answers ({int(row.wrong)} wrong) in {int(row.clusters)} layouts, "
                f"{data}")
    why = f"smallest effect of interest {sesoi:g} AUROC; TOST within it: " + (
        "yes" if verdict == "not supported" and not (row["high"] < 0) else "no")
    if verdict != "supported":
        need = n_to_resolve(Interval(row.difference, row.low, row.high, int(row.n), int(row.clusters)))
        short = [what for what, count in (("wrong", row["wrong"]), ("right", row["right"])) if count < MIN_PER_CLASS]
        more = f"more {' and '.join(short)} answers" if short else "more answers"
        no_real = int(run.get("n_hotpot", 1) or 0) == 0 or str(run.get("hotpot_source", "synthetic")) == "synthetic"
        real = " and real HotpotQA" if no_real else ""
        why += (". What would settle it: " + (f"about {need} layouts for the observed difference, or " if need else "")
                + f"a setting with {more}{real}, on the confirmatory model.")
    return Status(verdict, headline, why)


def _comparisons(folder: Path) -> pd.DataFrame:
    """``auroc_comparisons.csv`` with its primary and adjusted p-values marked by the declaration in the code
    (:func:`~.pipeline.mark_primary`: the primary alone, the secondaries Holm among themselves)."""
    table = pd.read_csv(folder / "auroc_comparisons.csv")
    if "testable" in table:
        table["testable"] = table["testable"].map(is_true)
    return mark_primary(table)


def _verdict_finding(folder: Path) -> list[str]:
    """The pooled context-only comparisons of :func:`verdict`, the declared primary first."""
    text = verdict(pd.read_csv(folder / "auroc.csv"), _comparisons(folder),
                   pd.read_csv(folder / "answers.csv"), pd.read_csv(folder / "auroc_per_setting.csv"))
    return text.quote("primary", "pooled:dynamic_ctx", limit=2)


def _primary(folder: Path) -> dict | None:
    """The row of ``auroc_comparisons.csv`` marked primary: pooled AUROC difference over layouts."""
    table = _comparisons(folder)
    row = table[table["primary"]]
    if row.empty:
        return None
    r = row.iloc[0]
    return {"estimate": float(r["difference"]), "low": float(r["low"]), "high": float(r["high"]),
            "n": int(r["clusters"]), "units": "layouts", "n_answers": int(r["n"]),
            "test": "exact two-sided sign test over layouts; 95% cluster-bootstrap interval", "p": float(r["sign_p"]),
            "p_adjusted": float(r["p_adjusted"]), "computed": f"{r['scope']} AUROC, {r['a']} − {r['b']}"}


CLAIM = Claim(
    notebook="05_error_signal",
    title="Beyond: is the answer wrong?",
    config=ErrorSignalConfig,
    presets={
        # the same NIAH setting as 01's smoke run (its cache), short answers; 2 folds need 2 wrong answers
        "smoke": {"hotpot_source": "synthetic", "n_squad": 3, "niah_settings": ["prose:300"], "n_setting": 3,
                  "n_setting_calibration": 2, "max_new_tokens": 32,
                  "n_hotpot": 8, "hotpot_max_new_tokens": 8, "n_folds": 2},
        # one long setting: 01's `long` soft-dynamism answers (4,000 tokens of the essays) with the HotpotQA ones
        "long": {"niah_settings": ["essays:4000"]},
        "paper": {"model": "meta-llama/Llama-3.1-8B-Instruct", "niah_settings": ["prose:5000", "prose:20000"],
                  "n_setting": 100, "n_setting_calibration": 20, "max_new_tokens": 64, "n_hotpot": 200,
                  "hotpot_setting": "multihop"},
    },
    committed=("long",),  # the committed report keeps the long setting's runs in papers_figures/long/<model>/
    items=(
        PaperItem("Beyond 5", "Is the answer wrong? Dynamic-head features against a Lookback-style ratio and the "
                  "logits (out-of-fold AUROC, 95% bootstrap CI)",
                  "not in the paper; for scale, on other models and data: Lookback Lens AUROC .85–.91 in-domain, "
                  ".82–.85 across tasks; ReDeEP .75–.82", "auroc", 25, _auroc_headline, _auroc_status, hotpot=True),
    ),
    findings=(Finding("Beyond 5, is the answer wrong?", _verdict_finding, "Verdict, computed from the tests"),),
    # The id of what PRIMARY computes (against the string match); the pre-registered primary is against the Lookback
    # ratio (tests/test_preregistration.py marks this claim as not yet computing it).
    primary=Primary("dynamic_ctx_vs_lookback", _primary, item="Beyond 5"),
    seeds=SEEDS,
)
