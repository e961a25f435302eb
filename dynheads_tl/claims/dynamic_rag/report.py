"""The dynamic-RAG case study's report part: the paper's Table 4, the computed verdicts (answer F1, and the
teacher-forced gold-answer log-probability as a secondary measure) and the index row.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dynheads_tl import preregistration
from dynheads_tl.analysis.statistics import (Interval, bootstrap_interval, detectable_words, format_interval,
                                             n_to_resolve, tost_row, wilson_interval)
from dynheads_tl.claim import Claim, Finding, PaperItem, Primary, Status, Verdict, ci_text, is_true, sidecar

from .config import SEEDS, RagStudyConfig
from .pipeline import _paired, _recall_per_visible, tost_bounds

__all__ = [
    "PAPER_TABLE4", "STRATEGY_NAMES", "TEACHER_FORCED_COMPARISONS", "table4", "teacher_forced_table", "rag_verdict",
    "teacher_forced_verdict", "questions_label", "SETTING_TEXT", "summary_markdown", "rind_sentence",
]


PAPER_TABLE4 = {
    "Llama-3.1-8B-Instruct": {"dynamic": (0.456, 0.5586), "static": (0.398, 0.5098), "dynamic_random": (0.272, 0.3670),
                              "fixed_random": (0.272, 0.3763), "none": (0.252, 0.3257)},
    "Llama-3.2-3B-Instruct": {"dynamic": (0.384, 0.4993), "static": (0.428, 0.5386)},
}


STRATEGY_NAMES = {"dynamic": "Dynamic (probe)", "oracle": "Oracle (actual heads)", "static": "Static",
                  "dynamic_random": "Dynamic Random", "fixed_random": "Fixed Random", "none": "w/o RAG",
                  "full": "Full context (upper bound)"}

TEACHER_FORCED_COMPARISONS = "table4_teacher_forced_comparisons"  # the teacher-forced family's CSV stem


def table4(rows: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Table 4 with n and 95% intervals: EM (Wilson), F1 and evidence recall per visible share (bootstrap over
    questions), retrievals per answer, the share of context opened, and the paper's numbers beside ours.

    Where ``rows`` hold the teacher-forced measure (``tf_logprob``, :func:`~dynheads_tl.protocols.rag.run_strategies`
    with ``teacher_forced``): ``tf_logprob`` with its bootstrap 95% interval over the ``tf_n`` questions that have a
    gold token (nats/token; higher = the gold answer more likely under the strategy's context), and what the forced
    runs opened (``tf_retrievals`` per answer, ``tf_visible_context_share``)."""
    records = []
    for strategy, part in rows.groupby("strategy", sort=False):
        n = len(part)
        em = wilson_interval(int(part["em"].sum()), n)
        f1 = bootstrap_interval(part["f1"].to_numpy(float), seed=seed)
        ratio = bootstrap_interval(part[["evidence_recall", "visible_context_tokens", "context_tokens"]].to_numpy(float),
                                   _recall_per_visible, seed=seed)
        records.append({"strategy": strategy, "method": STRATEGY_NAMES.get(strategy, strategy), "n": n,
                        "em": em.estimate, "em_low": em.low, "em_high": em.high,
                        "f1": f1.estimate, "f1_low": f1.low, "f1_high": f1.high,
                        "retrievals": float(part["retrievals"].mean()),
                        "visible_context_share": float(part["visible_context_tokens"].sum() / part["context_tokens"].sum()),
                        "evidence_recall": float(part["evidence_recall"].mean()),
                        "recall_per_visible": ratio.estimate, "recall_per_visible_low": ratio.low,
                        "recall_per_visible_high": ratio.high, **_teacher_forced_columns(part, seed)})
    summary = pd.DataFrame(records)
    for paper_model, values in PAPER_TABLE4.items():
        summary[f"paper EM/F1 {paper_model}"] = summary["strategy"].map(
            lambda s: f"{values[s][0]:.3f}/{values[s][1]:.4f}" if s in values else "–")
    return summary


def _teacher_forced_columns(part: pd.DataFrame, seed: int) -> dict:
    """One strategy's teacher-forced columns of :func:`table4` (none when its rows hold no ``tf_logprob``)."""
    if "tf_logprob" not in part:
        return {}
    values = part["tf_logprob"].to_numpy(float)
    values = values[~np.isnan(values)]
    nan = float("nan")
    tf = bootstrap_interval(values, seed=seed) if len(values) else Interval(nan, nan, nan, 0)
    return {"tf_n": len(values), "tf_logprob": tf.estimate, "tf_logprob_low": tf.low, "tf_logprob_high": tf.high,
            "tf_retrievals": float(part["tf_retrievals"].mean()),
            "tf_visible_context_share": float(part["tf_visible_context_tokens"].sum() / part["context_tokens"].sum())}


def teacher_forced_table(table: pd.DataFrame) -> pd.DataFrame:
    """:func:`table4`'s teacher-forced columns per strategy, beside what the generated runs opened: the secondary
    measure's own table (n, the mean gold log-probability in nats/token with its bootstrap 95% interval)."""
    return table[["strategy", "method", "tf_n", "tf_logprob", "tf_logprob_low", "tf_logprob_high", "tf_retrievals",
                  "tf_visible_context_share", "retrievals", "visible_context_share"]]


def _fmt(estimate: float, low: float, high: float) -> str:
    return format_interval(estimate, low, high, 3)


def questions_label(hotpot_source: str) -> str:
    """What a verdict calls its questions: synthetic unless the run read a real file (SCIENCE 9)."""
    return "synthetic HotpotQA-format questions" if hotpot_source == "synthetic" else "HotpotQA questions"


def _p(p: float) -> str:
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def teacher_forced_verdict(table: pd.DataFrame, comparisons: pd.DataFrame, *,
                           data: str = "synthetic HotpotQA-format questions") -> Verdict | str:
    """The teacher-forced secondary in computed sentences (empty when the run has none): the gold answer's mean
    log-probability (nats/token) under full context and without it, and whether the context raises it at all
    (full − none separated: exact sign test alone at 0.05 and the bootstrap interval above 0); then Dynamic (probe)
    minus each other strategy (:func:`~.pipeline.teacher_forced_comparisons`: Holm over that family), in one
    sentence. A comparison reads "higher" or "lower" only where it is separated *and* the bounds leave room (else
    every comparison is "for the record", SCIENCE 7); one that cannot be told apart says what the design could
    detect (2.8 standard errors) and about how many questions would resolve the observed difference; one with too
    few differing questions for a sign test to reach 0.05 is untestable. Every sentence names n and its ``data``.
    This measure decides no status (preregistration.yaml: a secondary of the case study)."""
    if comparisons is None or comparisons.empty or "tf_logprob" not in table:
        return ""
    t = table.set_index("strategy")
    lines, room = [], False
    bounds = comparisons[comparisons["family"] == "bounds"]
    if {"full", "none"} <= set(t.index) and not bounds.empty:
        b, full, none = bounds.iloc[0], t.loc["full"], t.loc["none"]
        room = bool(b["separated"]) and float(b["tf_logprob_difference"]) > 0
        test = (f"sign test alone {_p(b['sign_p'])}" if bool(b["testable"]) else
                "untestable: too few questions differ")
        lines.append(
            f"Teacher-forced gold-answer log-probability (secondary measure, nats/token, n = {int(b['n'])} {data}): "
            f"full context {_fmt(full['tf_logprob'], full['tf_logprob_low'], full['tf_logprob_high'])}, w/o RAG "
            f"{_fmt(none['tf_logprob'], none['tf_logprob_low'], none['tf_logprob_high'])}, full − none "
            f"{format_interval(b['tf_logprob_difference'], b['low'], b['high'], 3, signed=True)} ({int(b['a_better'])} "
            f"questions higher with the context, {int(b['b_better'])} lower, {test}): "
            + ("the context raises the gold answer's probability, so the strategies can be compared on it." if room
               else "the context does not raise the gold answer's probability separably, so the comparisons below "
                    "rank nothing."))
    else:
        lines.append("Teacher-forced gold-answer log-probability (secondary measure, nats/token): the bounds (full "
                     "context and w/o RAG) were not both run, so the comparisons below rank nothing.")
    family = comparisons[comparisons["family"] == "secondary"]
    if len(family):
        parts = []
        for r in family.itertuples():
            testable = bool(r.testable)
            numbers = (f"{format_interval(r.tf_logprob_difference, r.low, r.high, 3, signed=True)}, {r.a_better} "
                       f"questions higher, {r.b_better} lower, sign test {_p(r.sign_p)}, "
                       + (f"Holm-adjusted {r.p_adjusted:.3f}" if testable else "untestable, left out of the family"))
            if not testable:
                state = "cannot be tested"
            elif not room:
                state = "for the record"
            elif r.separated:
                state = "higher" if r.tf_logprob_difference > 0 else "lower"
            else:
                need = n_to_resolve(Interval(r.tf_logprob_difference, r.low, r.high, int(r.n)))
                need = f", about {need} questions would resolve the observed one" if need and need > r.n else ""
                state = ("cannot be told apart ("
                         + detectable_words(r.half_width, what='log-probability differences', unit='questions', n=int(r.n))
                         + need + ")")
            parts.append(f"against {STRATEGY_NAMES.get(r.b, r.b)} {state}: {numbers}")
        lines.append(f"Teacher-forced, Dynamic (probe) minus each other strategy (secondary family, Holm over its "
                     f"{int(family['testable'].sum())} testable comparisons; paired over n = {int(family['n'].max())} "
                     f"{data}): " + "; ".join(parts) + ".")
    return Verdict(*(("teacher-forced", line) for line in lines), declared=("teacher-forced",))


def rag_verdict(table: pd.DataFrame, comparisons: pd.DataFrame, *,
                data: str = "synthetic HotpotQA-format questions") -> Verdict:
    """The case study in computed sentences: the headroom between the bounds, what each strategy opens against
    chance, and which strategies differ on F1, the declared primary comparison (:data:`PRIMARY`) first. A
    difference is claimed only where ``comparison_table`` marks it separated (Holm-adjusted sign test and bootstrap
    interval); a comparison that cannot be told apart says how large a difference the design could detect, one
    that cannot reach significance at all (too few differing questions) says so; and no strategy is ranked at all
    when the bounds leave no room (full context F1 below 0.5 or not separated from w/o RAG). Every comparison
    names its ``data`` (synthetic unless the run read a real file)."""
    t = table.set_index("strategy")
    lines, room = [], False
    add = lambda key, text: lines.append((key, text))  # noqa: E731
    if {"full", "none"} <= set(t.index):
        full, none = t.loc["full"], t.loc["none"]
        bound = comparisons[(comparisons["a"] == "full") & (comparisons["b"] == "none")]
        gap = ("" if bound.empty else
               f"; full − none {_fmt(*bound.iloc[0][['f1_difference', 'low', 'high']])}")
        room = not bound.empty and bool(bound.iloc[0]["separated"]) and float(full["f1"]) >= 0.5
        add("bounds", f"Bounds: full context F1 {_fmt(full['f1'], full['f1_low'], full['f1_high'])}, w/o RAG "
                     f"{_fmt(none['f1'], none['f1_low'], none['f1_high'])} (n = {int(full['n'])}){gap}: this setting "
                     + ("leaves room for retrieval to help." if room else
                        "leaves little room for retrieval to help, so no strategy is ranked below."))
    opened = [s for s in ("dynamic", "oracle", "static", "dynamic_random", "fixed_random") if s in t.index]
    if opened:
        parts = []
        for s in opened:
            r = t.loc[s]
            parts.append(f"{r['method']} {_fmt(r['recall_per_visible'], r['recall_per_visible_low'], r['recall_per_visible_high'])}")
        add("recall", "Evidence recall per share of context opened (chance = 1): " + "; ".join(parts) + ".")
    strategies = comparisons[comparisons["a"] != "full"] if len(comparisons) else comparisons
    if len(strategies) and "primary" in strategies:
        strategies = pd.concat([strategies[strategies["primary"]], strategies[~strategies["primary"]]])
    for row in strategies.itertuples():
        name_a, name_b = STRATEGY_NAMES.get(row.a, row.a), STRATEGY_NAMES.get(row.b, row.b)
        testable = bool(getattr(row, "testable", True))
        primary = bool(getattr(row, "primary", False))
        adjusted = ("tested alone (the declared primary)" if primary else
                    f"Holm-adjusted {row.p_adjusted:.3f}" if testable else "untestable, left out of the Holm family")
        numbers = (f"F1 difference {_fmt(row.f1_difference, row.low, row.high)}, paired over n = {row.n} {data}; "
                   f"{row.a_better} questions better, {row.b_better} worse, sign test p = {row.sign_p:.3f}, {adjusted}")
        lead = "Primary comparison (declared): " if primary else ""
        # the key a finding quotes: the primary, Dynamic (probe) against another strategy, or any other pair
        key = "primary" if primary else "dynamic" if row.a == "dynamic" else "other"
        if not room:
            add(key, f"{lead}{name_a} against {name_b}, for the record ({numbers}).")
        elif row.separated:
            add(key, f"{lead}{name_a} {'beats' if row.f1_difference > 0 else 'falls below'} {name_b} ({numbers}).")
        elif not testable:
            add(key, f"{lead}{name_a} and {name_b} cannot be tested: only {row.a_better + row.b_better} questions "
                     f"differ, too few for a sign test to reach 0.05 ({numbers}).")
        else:
            need = getattr(row, "n_to_resolve", None)
            need = f"; about {int(need)} questions would resolve the observed one" if need == need and need else ""
            add(key, f"{lead}{name_a} and {name_b} cannot be told apart ({numbers}); "
                     f"{detectable_words(row.half_width, what='F1 differences', unit='questions', n=row.n)}{need}.")
    return Verdict(*lines, declared=("bounds", "recall", "primary", "dynamic", "other"))


SETTING_TEXT = {"multihop": "synthetic multi-hop HotpotQA-format questions (bridge and comparison, 10 paragraphs)",
                "headroom": "synthetic single-hop HotpotQA-format questions (the gold paragraph and one distractor, "
                            "two worked examples before the question)"}


def summary_markdown(table: pd.DataFrame, config: RagStudyConfig) -> str:
    """What was run, and per strategy EM / F1 with intervals and what it opened (numbers only; the verdict is
    :func:`rag_verdict`)."""
    data = SETTING_TEXT[config.rag_setting] if config.hotpot_source == "synthetic" else \
        f"HotpotQA records from {config.hotpot_source!r} ({config.rag_setting} setting)"
    lines = [f"**Model:** {config.model}; {data}; n = {int(table['n'].min())} evaluation questions per strategy."]
    for r in table.itertuples():
        opened = ("" if r.strategy in ("none", "full") else
                  f", {r.retrievals:.2f} retrievals/answer, {100 * r.visible_context_share:.0f}% of the context opened, "
                  f"{100 * r.evidence_recall:.0f}% of supporting-fact tokens opened")
        forced = (f", teacher-forced gold log-probability {_fmt(r.tf_logprob, r.tf_logprob_low, r.tf_logprob_high)} "
                  f"nats/token" if "tf_logprob" in table else "")
        lines.append(f"- **{r.method}**: EM {_fmt(r.em, r.em_low, r.em_high)}, F1 {_fmt(r.f1, r.f1_low, r.f1_high)}"
                     f"{forced}{opened}.")
    paper = PAPER_TABLE4["Llama-3.1-8B-Instruct"]
    lines.append(f"- Paper (Llama-3.1-8B): Dynamic {paper['dynamic'][0]:.3f}/{paper['dynamic'][1]:.4f} against Static "
                 f"{paper['static'][0]:.3f}/{paper['static'][1]:.4f}; Llama-3.2-3B reverses the order.")
    return "\n".join(lines)


def rind_sentence(table: pd.DataFrame, threshold: float) -> str:
    """The RIND threshold in one computed sentence: given, or calibrated and how it splits the calibration answers."""
    if table.empty:
        return f"RIND threshold {threshold:.3f} (given as a parameter, not calibrated)."
    wrong, right = table[table["wrong"]], table[~table["wrong"]]
    fire = lambda part: f"{int((part['rind_max'] > threshold).sum())} of {len(part)}"
    return (f"RIND threshold {threshold:.3f}, calibrated on n = {len(table)} questions answered without retrieval: it "
            f"fires on {fire(wrong)} wrong answers and {fire(right)} right ones (F1 < 0.5 counts as wrong)."
            + (" Every calibration answer is wrong without the context, so the threshold sits below every positive "
               "value: retrieval fires whenever RIND flags any content word." if right.empty else ""))


# --- the index: the case study's row, read from the files the notebook wrote ----------------------
def _table4_headline(folder: Path) -> str:
    frame = pd.read_csv(folder / "table4_rag.csv")
    if "f1_low" not in frame:  # runs made before the intervals
        return "; ".join(f"{r.strategy} {r.em:.3f}/{r.f1:.3f}" for r in frame.itertuples())
    parts = [f"{r.strategy} EM {r.em:.2f} [{r.em_low:.2f}, {r.em_high:.2f}], F1 {r.f1:.2f} [{r.f1_low:.2f}, "
             f"{r.f1_high:.2f}]" + ("" if r.strategy in ("none", "full") else
                                    f", recall/opened {r.recall_per_visible:.2f}") for r in frame.itertuples()]
    setting = sidecar(folder, "table4_rag").get("rag_setting", "multihop")
    return (f"{setting} setting, n = {int(frame['n'].min())} questions: " + "; ".join(parts)
            + " (EM Wilson, F1 bootstrap 95%; recall/opened: chance = 1)")


def _alone(row, alpha: float) -> str | None:
    """A primary read from its row, tested alone at ``alpha`` (its own sign-test p, the interval away from 0):
    "positive", "negative" or None (not separated). Rows written before the raw p was kept use ``p_adjusted``."""
    p = row["sign_p"] if "sign_p" in row and row["sign_p"] == row["sign_p"] else row["p_adjusted"]
    if not (p < alpha):
        return None
    return "positive" if row["low"] > 0 else "negative" if row["high"] < 0 else None


def table4_rule(bounds, primary, rule_sesoi: float, alpha: float) -> str:
    """The declared Table 4 rule (preregistration.yaml): no headroom unless full context separates above w/o RAG
    (the bounds, tested alone); reproduced when the primary (Dynamic − Static F1, tested alone at ``alpha``) is
    separated positive and its estimate reaches ``rule_sesoi``; not reproduced when separated negative, or when TOST
    (both one-sided tests at ``alpha``: the primary's ``tost_low``–``tost_high`` interval within ±sesoi; a row
    without them reads its 95% interval, which is stricter) says the difference is negligible; undetermined
    otherwise."""
    if bounds is None or _alone(bounds, alpha) != "positive":
        return "no headroom"
    direction = _alone(primary, alpha)
    if direction == "positive" and primary["f1_difference"] >= rule_sesoi:
        return "reproduced"
    if direction == "negative" or tost_row(primary, rule_sesoi):
        return "not reproduced"
    return "undetermined"


def _table4_status(folder: Path) -> Status:
    """:func:`table4_rule` on ``table4_comparisons.csv``, thresholds from preregistration.yaml; the data named
    synthetic unless the run names a real file; the teacher-forced half named missing when the run has none."""
    declared = preregistration.primary("dynamic_rag")
    sesoi, alpha = float(declared["sesoi"]), preregistration.alpha()
    table = pd.read_csv(folder / "table4_rag.csv").set_index("strategy")
    comp = pd.read_csv(folder / "table4_comparisons.csv")
    pair = lambda a, b: (lambda hit: None if hit.empty else hit.iloc[0])(comp[(comp["a"] == a) & (comp["b"] == b)])
    bounds, ds = pair("full", "none"), pair("dynamic", "static")
    if ds is not None and "tost_low" not in ds and (folder / "rag_runs.csv").exists():
        # a file written before the TOST interval was: recompute it from the per-question rows (deviation of 2026-12-05)
        joined = _paired(pd.read_csv(folder / "rag_runs.csv"), "dynamic", "static")
        if joined is not None:
            seed = int(sidecar(folder, "table4_comparisons").get("seed", 0) or 0)
            ds = ds.copy()
            ds["tost_low"], ds["tost_high"] = tost_bounds(joined, seed=seed, alpha=alpha)
    verdict = table4_rule(bounds, ds, sesoi, alpha)
    run = sidecar(folder, "table4_rag")
    synthetic = str(run.get("hotpot_source", "synthetic")) == "synthetic"
    f1 = lambda s: ci_text(table.loc[s, "f1"], table.loc[s, "f1_low"], table.loc[s, "f1_high"])
    p = ds["sign_p"] if "sign_p" in ds else ds["p_adjusted"]
    headline = (f"{'synthetic ' if synthetic else ''}F1 dynamic {f1('dynamic')} vs static {f1('static')}, paired "
                f"{ci_text(ds.f1_difference, ds.low, ds.high, signed=True)} (primary, sign test alone p = {p:.2g}); "
                f"n = {int(ds.n)} questions")
    why = (f"full − none {ci_text(bounds.f1_difference, bounds.low, bounds.high, signed=True)}; "
           if bounds is not None else "full − none: missing; ")
    why += (f"smallest effect of interest {sesoi:g} F1; "
            + (f"teacher-forced gold log-probability (secondary, nats/token, n = {int(table['tf_n'].min())} questions): "
               + ", ".join(f"{s} {ci_text(table.loc[s, 'tf_logprob'], table.loc[s, 'tf_logprob_low'], table.loc[s, 'tf_logprob_high'])}"
                           for s in table.index) if "tf_logprob" in table
               else "teacher-forced gold log-probability: missing (this run did not write it)")
            + ("; synthetic HotpotQA-format questions" if synthetic else ""))
    if verdict != "reproduced":
        need = n_to_resolve(Interval(ds.f1_difference, ds.low, ds.high, int(ds.n)))
        why += (". What would settle it: " + (f"about {need} questions for the observed difference, " if need else "")
                + f"real HotpotQA questions{' (these are synthetic)' if synthetic else ''} and the confirmatory model "
                  f"({run.get('model', 'this model')} here).")
    return Status(verdict, headline, why)


_L = PAPER_TABLE4["Llama-3.1-8B-Instruct"]
def _rag_finding(folder: Path) -> list[str]:
    """The parts of :func:`rag_verdict` that compare Dynamic (probe) with another strategy, the primary first;
    then, where the run wrote it, the teacher-forced secondary (:func:`teacher_forced_verdict`, both sentences)."""
    table = pd.read_csv(folder / "table4_rag.csv")
    data = questions_label(str(sidecar(folder, "table4_rag").get("hotpot_source", "synthetic")))
    verdict = rag_verdict(table, pd.read_csv(folder / "table4_comparisons.csv"), data=data)
    chosen = verdict.quote("primary", "dynamic", limit=3)
    forced = folder / f"{TEACHER_FORCED_COMPARISONS}.csv"
    if forced.exists():
        secondary = teacher_forced_verdict(table, pd.read_csv(forced), data=data)
        chosen += secondary.quote("teacher-forced") if isinstance(secondary, Verdict) else []
    return chosen


def _primary(folder: Path) -> dict | None:
    """The row of ``table4_comparisons.csv`` marked primary: Dynamic minus Static answer F1 over questions."""
    table = pd.read_csv(folder / "table4_comparisons.csv")
    row = table[table["primary"].map(is_true)]
    if row.empty:
        return None
    r = row.iloc[0]
    return {"estimate": float(r["f1_difference"]), "low": float(r["low"]), "high": float(r["high"]),
            "n": int(r["n"]), "units": "questions", "test": "exact two-sided sign test over questions; 95% bootstrap "
            "interval", "p": float(r["sign_p"]), "p_adjusted": float(r["p_adjusted"]),
            "computed": f"answer F1, {r['a']} − {r['b']}"}


CLAIM = Claim(
    notebook="04_dynamic_rag",
    title="Case study: dynamic RAG",
    config=RagStudyConfig,
    presets={
        "smoke": {"hotpot_source": "synthetic", "n_samples": 2, "n_rind_calibration": 3, "strategies": ["dynamic", "static", "none", "full"],
                  "max_new_tokens": 8, "train_seeds": [0, 1], "n_hotpot_train": 4, "probe_hidden": [32],
                  "probe_epochs": 5},
        # the paper's multi-hop setting, with windows sized for 10-paragraph contexts
        "paper": {"model": "meta-llama/Llama-3.1-8B-Instruct", "rag_setting": "multihop", "n_samples": 500,
                  "n_rind_calibration": 100, "n_hotpot_train": 100, "window": 24, "top_k_positions": 8,
                  "max_retrievals": 2, "max_new_tokens": 64, "probe_hidden": [8192, 4096, 4096], "probe_epochs": 100},
    },
    items=(
        PaperItem("Table 4", "Dynamic RAG EM / F1",
                  "Llama-3.1-8B " + ", ".join(f"{name} {_L[key][0]:.3f}/{_L[key][1]:.4f}".replace(" 0.", " .")
                                              .replace("/0.", "/.")
                                              for name, key in (("Dynamic", "dynamic"), ("Static", "static"),
                                                                ("w/o RAG", "none"))),
                  "table4_rag", 12, _table4_headline, _table4_status, hotpot=True),
    ),
    findings=(Finding("Case study, dynamic RAG", _rag_finding, "Verdict, computed from the tests"),),
    primary=Primary("dynamic_vs_static_f1", _primary, item="Table 4"),
    seeds=SEEDS,
)
