"""Notebook 06's report part: the computed verdict sentences, the scale of other methods, and the index row.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from dynheads_tl import preregistration
from dynheads_tl.analysis.statistics import detectable_words, format_interval, tost_row
from dynheads_tl.claim import Claim, Finding, PaperItem, Primary, Status, ci_text, is_true, Verdict, plain, sidecar

from .comparisons import budgets_with_headroom, primary_comparison
from .config import SEEDS, RetentionConfig

__all__ = ["ANCHORS", "primary_verdict", "query_baseline_verdict", "verdict"]


ANCHORS = {"DuoAttention": "NIAH intact with 25% (MHA) / 50% (GQA) of heads on full attention",
           "HeadKV": "97% of full-cache quality with 1.5% of the cache"}


def primary_verdict(primary: dict | None) -> str:
    """The primary comparison (:func:`primary_comparison`) in one computed sentence: supported when predicted
    retention keeps the gold answer more likely (separated above 0), not supported when static does (separated
    below 0), undetermined otherwise, with the smallest effect the design could detect."""
    if primary is None:
        return "Primary comparison (predicted against static retention over the KV-head budgets): not run."
    numbers = (f"predicted − static gold log-probability {_fmt(primary['difference'], primary['low'], primary['high'], True)} "
               f"nats per token, averaged over the KV-head budgets {', '.join(f'{b:.0%}' for b in primary['budgets'])}; "
               f"n = {primary['n']} samples, {primary['predicted_better']} favour predicted and "
               f"{primary['static_better']} static; sign test p = {primary['sign_p']:.3g}")
    lead = "Primary comparison (predicted against static retention over the KV-head budgets): "
    if primary["separated"]:
        word = "**supported**: predicted retention keeps the gold answer more likely" if primary["difference"] > 0 \
            else "**not supported**: static retention keeps the gold answer more likely"
        return f"{lead}{word} ({numbers})."
    need = primary["n_to_resolve"]
    need = f"; about {int(need)} samples would resolve the observed difference" if need else ""
    return (f"{lead}**undetermined**: the two cannot be told apart ({numbers}); "
            f"{detectable_words(primary['half_width'], digits=2, what='differences (nats)', n=primary['n'])}{need}.")


# The measures each (granularity, budget) comparison reads: (name, columns of difference, low, high, adjusted p,
# samples better on either side, separated, unit).
_MEASURES = (("accuracy", "accuracy_difference", "low", "high", "p_adjusted", ("predicted_better", "static_better"),
              "separated", ""),
             ("gold log-probability", "logprob_difference", "logprob_low", "logprob_high", "logprob_p_adjusted",
              ("logprob_predicted_better", "logprob_static_better"), "logprob_separated", " nats/token"))


def query_baseline_verdict(comparisons: pd.DataFrame, query_comparisons: pd.DataFrame) -> str:
    """Whether notebook 06's reading depends on its static baseline, computed: does "predicted against static
    retention" read the same at every (granularity, budget) and on each measure (accuracy, and the gold
    log-probability where the tables have it) when the static set is the query-focused one (QRHead-style) instead of
    Wu et al.'s? A reading is "beats" or "falls below" only where :func:`predicted_vs_static` marks the comparison
    separated (exact sign test, Holm-adjusted), else "cannot be told apart"; a comparison too few samples differ on
    to ever reach 0.05 says so instead of a p.
    The conclusion "does not change" when every budget and measure reads the same against both static sets."""
    if comparisons.empty or query_comparisons.empty:
        return "The query-focused static strategy was not run beside Wu et al.'s static set."

    def reading(row, difference: str, separated: str) -> str:
        if not bool(getattr(row, separated, False)):
            return "cannot be told apart from"
        return "beats" if getattr(row, difference) > 0 else "falls below"

    wu = {(r.granularity, r.budget): r for r in comparisons.itertuples()}
    parts, changed = [], []
    for r in query_comparisons.itertuples():
        key, other = (r.granularity, r.budget), wu.get((r.granularity, r.budget))
        readings = []
        for name, difference, low, high, p, better, separated, unit in _MEASURES:
            if not hasattr(r, difference):
                continue
            word = reading(r, difference, separated)
            then = reading(other, difference, separated) if other is not None else None
            against = "not run" if then is None else ("the same" if then == word else then.removesuffix(" from"))
            readings.append(f"on {name} predicted {word} the query-focused static set "
                            f"({_fmt(getattr(r, difference), getattr(r, low), getattr(r, high), True)}{unit}, "
                            f"{_p_text(getattr(r, p, float('nan')), sum(getattr(r, b, 0) for b in better))}; "
                            f"against Wu's: {against})")
            if then != word:
                changed.append(f"{key[0]} {key[1]:.0%} ({name})")
        parts.append(f"{key[0]} heads {key[1]:.0%} (n = {r.n}): " + ", ".join(readings))
    return ("With the query-focused static set as the static baseline: " + "; ".join(parts) + ". The conclusion "
            + ("does not change at any budget." if not changed else f"changes at {', '.join(changed)}."))


def _fmt(e, lo, hi, signed=False):
    return format_interval(e, lo, hi, 2, signed=signed)


def _p_text(p_adjusted: float, differing: int) -> str:
    if p_adjusted != p_adjusted:  # NaN: left out of the family
        return f"untestable: {int(differing)} samples differ, too few for a sign test to reach 0.05"
    return f"Holm-adjusted sign-test p = {p_adjusted:.2f}"


def switching_sentence(table: pd.DataFrame, memory: pd.DataFrame | None = None) -> str:
    """The per-step switching cost, computed from :func:`summary`: per strategy, the KV heads switched in per step
    (range over the budgets run, with the intervals at both ends), and, from the memory table (:func:`memory`),
    the most that moves per step on Llama-3.1-8B at 128k tokens. The simulation restores a switched-in head's
    evicted entries for free, so the accuracies do not include this cost."""
    if "kv_switches_per_step" not in table:
        return ("A per-step strategy keeps a different set of KV heads whole at every step, so it needs the evicted "
                "entries stored elsewhere (host memory, say); this run did not count the switches.")
    full = table[table["strategy"] == "full"]
    total = float(full["kv_heads_kept"].iloc[0]) if len(full) else float("nan")
    parts, most = [], 0.0
    for strategy in ("predicted", "oracle", "random", "static", "query_static"):
        part = table[(table["strategy"] == strategy)].dropna(subset=["kv_switches_per_step"]).sort_values(
            "kv_switches_per_step")
        if part.empty:
            continue
        low, high = part.iloc[0], part.iloc[-1]
        most = max(most, float(high["kv_switches_per_step"]))
        at = lambda row: (f"{_fmt(row['kv_switches_per_step'], row['kv_switches_low'], row['kv_switches_high'])} "
                          f"({row['granularity']} heads {row['budget']:.0%})")
        span = (_fmt(low["kv_switches_per_step"], low["kv_switches_low"], low["kv_switches_high"])
                if len(part) == 1 or high["kv_switches_per_step"] == low["kv_switches_per_step"] else
                f"{at(low)} to {at(high)}")
        parts.append(f"{strategy} {span}")
    if not parts:
        return ""
    share = most / total if total == total and total > 0 else float("nan")
    traffic = ""
    column = "MiB_switched_per_step_at_128k"
    if memory is not None and column in memory:
        llama = memory[memory["model"] == "Llama-3.1-8B"].dropna(subset=[column])
        if len(llama) and float(llama[column].max()) > 0:
            top = llama.sort_values(column).iloc[-1]
            traffic = (f" At the same shares on Llama-3.1-8B with 128k tokens the most is {top[column]:,.0f} MiB per "
                       f"step ({top['strategy']}, {top['granularity']} heads {top['budget']:.0%}; bf16, computed).")
    return ("Switching cost (KV heads kept whole at a step that were not at the step before, mean per step over "
            f"samples, bootstrap 95%, across the budgets run): {'; '.join(parts)}; at most {share:.1%} of the KV "
            "heads per step. Each switched-in head needs its evicted keys and values back from wherever they are "
            "stored; this simulation restores them for free, so the accuracies above do not include that cost."
            + traffic)


def verdict(table: pd.DataFrame, comparisons: pd.DataFrame, memory: pd.DataFrame | None = None) -> Verdict:
    """Computed sentences: whether the setting separates the full cache from streaming; the smallest budget at
    which each strategy reaches 95% of the full cache's accuracy (point estimates, said so); and, at each budget,
    predicted against static retention, claimed only where :func:`predicted_vs_static` marks it separated (accuracy
    and gold log-probability, Holm over both measures at every budget, untestable comparisons left out)."""
    t = table.set_index(["strategy", "granularity"])
    full, streaming = t.loc[("full", "query")], t.loc[("streaming", "query")]
    lines = [("bounds", f"Full cache accuracy {_fmt(full['accuracy'], full['accuracy_low'], full['accuracy_high'])}, streaming "
             f"only {_fmt(streaming['accuracy'], streaming['accuracy_low'], streaming['accuracy_high'])} (n = "
             f"{int(full['n'])} samples, Wilson 95%).")]
    room = bool(full["accuracy_low"] > streaming["accuracy_high"])
    if not room:
        lines.append(("headroom", "The two bounds' intervals overlap, so this setting cannot rank retention "
                                  "strategies; the comparisons below are for the record."))
    target = 0.95 * float(full["accuracy"])
    for granularity in dict.fromkeys(table["granularity"]):
        part = table[(table["granularity"] == granularity) & ~table["strategy"].isin(["full", "streaming"])]
        if part.empty or full["accuracy"] <= 0:
            continue
        reach = []
        for strategy, rows_s in part.groupby("strategy", sort=False):
            ok = rows_s[rows_s["accuracy"] >= target].sort_values("budget")
            reach.append(f"{strategy} at {ok['budget'].iloc[0]:.0%}" if len(ok) else f"{strategy} at no budget tried")
        lines.append(("budget", f"{granularity}-head budgets: the smallest budget whose accuracy reaches 95% of the "
                                "full cache's (point estimates) is " + ", ".join(reach) + "."))
    if len(comparisons):
        parts = []
        for r in comparisons.itertuples():
            word = ("accuracy for the record" if not room else
                    ("predicted beats static on accuracy" if r.accuracy_difference > 0 else
                     "static beats predicted on accuracy") if r.separated else "accuracy cannot be told apart")
            lp_word = ("" if not room or not getattr(r, "logprob_separated", False) else
                       " predicted keeps the gold answer more likely" if r.logprob_difference > 0 else
                       " static keeps the gold answer more likely")
            parts.append(f"{r.granularity} heads {r.budget:.0%}: {word} "
                         f"({_fmt(r.accuracy_difference, r.low, r.high, True)}, {r.predicted_better} samples better "
                         f"and {r.static_better} worse, {_p_text(r.p_adjusted, r.predicted_better + r.static_better)}; "
                         f"{detectable_words(r.half_width, digits=2, n=r.n)}); gold log-prob "
                         f"{_fmt(r.logprob_difference, r.logprob_low, r.logprob_high, True)} nats/token "
                         f"({_p_text(getattr(r, 'logprob_p_adjusted', float('nan')), getattr(r, 'logprob_predicted_better', 0) + getattr(r, 'logprob_static_better', 0))})"
                         + (f":{lp_word}" if lp_word else ""))
        lines.append(("comparisons", "Predicted against static retention, paired by sample: " + "; ".join(parts) + "."))
    lines.append(("switching", switching_sentence(table, memory)))
    lines.append(("anchors", "For scale (other models): " + "; ".join(f"{k}: {v}" for k, v in ANCHORS.items()) + "."))
    return Verdict(*lines, declared=("bounds", "headroom", "budget", "comparisons", "switching", "anchors"))


# --- the index: notebook 06's row, read from the files the notebook wrote -------------------------
def _retention_headline(folder: Path) -> str:
    frame = pd.read_csv(folder / "retention.csv")
    bounds = frame.set_index("strategy")
    head = (f"full cache {bounds.loc['full', 'accuracy']:.2f} [{bounds.loc['full', 'accuracy_low']:.2f}, "
            f"{bounds.loc['full', 'accuracy_high']:.2f}], streaming {bounds.loc['streaming', 'accuracy']:.2f} "
            f"[{bounds.loc['streaming', 'accuracy_low']:.2f}, {bounds.loc['streaming', 'accuracy_high']:.2f}]")
    parts = []
    for budget, part in frame[~frame["strategy"].isin(["full", "streaming"])].groupby("budget"):
        parts.append(f"{budget:.0%}: " + ", ".join(
            f"{r.strategy}{'' if r.granularity == 'query' else ' (KV)'} {r.accuracy:.2f} [{r.accuracy_low:.2f}, "
            f"{r.accuracy_high:.2f}]" for r in part.itertuples()))
    return f"n = {int(frame['n'].min())} samples; {head}; " + "; ".join(parts)


def retention_rule(full, stream, primary, *, sesoi: float, alpha: float) -> str:
    """The declared Beyond 6 rule (preregistration.yaml): no headroom unless the full cache's accuracy interval lies
    above streaming's; then the primary (``primary_comparison.csv``: predicted − static gold log-probability over the
    KV-head budgets, tested alone at ``alpha`` by its sign test, the interval away from 0): supported when separated
    positive and reaching ``sesoi``; not supported when separated negative or when TOST (both one-sided tests at
    ``alpha``: the primary's ``tost_low``–``tost_high`` interval within ±sesoi; a row without them, written before
    they were, reads its 95% interval, which is stricter) says it is negligible; undetermined otherwise, and
    undetermined when the primary is missing."""
    if full.accuracy_low <= stream.accuracy_high:
        return "no headroom"
    if primary is None:
        return "undetermined"
    separated = primary["sign_p"] < alpha and (primary["low"] > 0 or primary["high"] < 0)
    if separated and primary["difference"] >= sesoi:
        return "supported"
    if (separated and primary["difference"] < 0) or tost_row(primary, sesoi):
        return "not supported"
    return "undetermined"


def voting_primary(folder: Path, frame: pd.DataFrame, alpha: float) -> tuple[dict | None, list[float], list[float]]:
    """The primary as the status reads it: recomputed from the per-sample rows (``retention_runs.csv``) over the
    KV-head budgets with headroom only (:func:`~.comparisons.budgets_with_headroom`; SCIENCE 20, deviation of
    2026-12-05), with the interval TOST reads; the budgets kept and those left out. A run without the rows:
    ``primary_comparison.csv`` as written (every budget)."""
    runs = folder / "retention_runs.csv"
    every = sorted(float(b) for b in frame.loc[frame["granularity"] == "kv", "budget"].unique())
    if not runs.exists():
        path = folder / "primary_comparison.csv"
        return (pd.read_csv(path).iloc[0].to_dict() if path.exists() else None), every, []
    kept = budgets_with_headroom(frame)
    seed = int(sidecar(folder, "primary_comparison").get("seed", 0) or 0)
    primary = primary_comparison(pd.read_csv(runs), seed=seed, budgets=kept, alpha=alpha) if kept else None
    return primary, kept, [b for b in every if b not in kept]


def _budgets(budgets: list[float]) -> str:
    return ", ".join(f"{b:.0%}" for b in budgets)


def _retention_status(folder: Path) -> Status:
    """:func:`retention_rule` on ``retention.csv`` and the primary over the budgets with headroom
    (:func:`voting_primary`), thresholds from preregistration.yaml; the per-budget accuracy comparisons (secondary,
    Holm) are counted beside it."""
    sesoi = float(preregistration.primary("kv_retention")["sesoi"])
    alpha = preregistration.alpha()
    frame = pd.read_csv(folder / "retention.csv")
    comp = pd.read_csv(folder / "predicted_vs_static.csv")
    full = frame[frame["strategy"] == "full"].iloc[0]
    stream = frame[frame["strategy"] == "streaming"].iloc[0]
    separated = comp[comp["separated"].map(is_true)]
    primary, kept, left_out = voting_primary(folder, frame, alpha)
    verdict = retention_rule(full, stream, primary, sesoi=sesoi, alpha=alpha)
    if primary is None and left_out and not kept and verdict == "undetermined":
        verdict = "no headroom"  # the full cache separates, but no KV-head budget does
    where = (f"over the KV-head budgets with headroom ({_budgets(kept)}; left out, no strategy above streaming: "
             f"{_budgets(left_out)})" if left_out else "over the KV-head budgets")
    lead = (f"primary: predicted − static gold log-prob "
            f"{ci_text(primary['difference'], primary['low'], primary['high'], signed=True)} nats/token {where} (sign "
            f"test alone, {int(primary['predicted_better'])}:{int(primary['static_better'])} samples, p = "
            f"{primary['sign_p']:.3g}, n = {int(primary['n'])}); "
            if primary is not None else
            "primary: no KV-head budget has headroom (no strategy's accuracy lies above streaming's); " if left_out
            else "primary: missing (this run did not write primary_comparison.csv); ")
    headline = (lead + f"full cache accuracy {ci_text(full.accuracy, full.accuracy_low, full.accuracy_high)}; "
                       f"n = {int(full.n)} samples; {len(separated)} of {len(comp)} per-budget accuracy comparisons "
                       "separated (Holm)")
    why = f"smallest effect of interest {sesoi:g} nats/token"
    if verdict != "supported":
        run = sidecar(folder, "retention")
        why += (f". What would settle it: a probe whose predicted heads beat the static ones on the confirmatory "
                f"model and at longer contexts ({run.get('model', 'this model')}, {run.get('niah_setting', '?')} here, "
                f"n = {int(full.n)} samples).")
    return Status(verdict, headline, why)


def _primary_row(folder: Path) -> dict | None:
    """The primary as the status reads it (:func:`voting_primary`: over the KV-head budgets with headroom, from the
    per-sample rows), else ``primary_comparison.csv`` read back as :func:`primary_comparison` returned it; None when
    not run or when no budget has headroom."""
    retention = folder / "retention.csv"
    if retention.exists() and (folder / "retention_runs.csv").exists():
        primary, _, _ = voting_primary(folder, pd.read_csv(retention), preregistration.alpha())
        return primary
    path = folder / "primary_comparison.csv"
    if not path.exists():
        return None
    row = pd.read_csv(path).iloc[0].to_dict()
    row["budgets"] = [float(b) for b in str(row["budgets"]).split()]
    row["separated"] = is_true(row["separated"])
    for key in ("n", "predicted_better", "static_better"):
        row[key] = int(row[key])
    return row


def _primary_finding(folder: Path) -> list[str]:
    """The primary's sentence, or, where the status reads no headroom (the full cache not above streaming, or no
    KV-head budget with a strategy above streaming), that sentence: a comparison without headroom ranks nothing."""
    if not (folder / "retention.csv").exists():  # nothing to read the headroom from: the primary as written, if any
        return [plain(primary_verdict(_primary_row(folder)))]
    frame = pd.read_csv(folder / "retention.csv")
    full = frame[frame["strategy"] == "full"].iloc[0]
    stream = frame[frame["strategy"] == "streaming"].iloc[0]
    lead = "Primary comparison (predicted against static retention over the KV-head budgets): "
    bounds = (f"full cache accuracy {ci_text(full.accuracy, full.accuracy_low, full.accuracy_high)}, streaming "
              f"{ci_text(stream.accuracy, stream.accuracy_low, stream.accuracy_high)}; n = {int(full.n)} samples")
    if full.accuracy_low <= stream.accuracy_high:
        return [f"{lead}**no headroom**: the full cache's accuracy does not lie above streaming's ({bounds}), so the "
                "comparison says nothing about which heads to keep."]
    primary, kept, left_out = voting_primary(folder, frame, preregistration.alpha())
    if primary is None and left_out and not kept:
        return [f"{lead}**no headroom**: at no KV-head budget does any strategy's accuracy lie above streaming's "
                f"({bounds}; budgets {_budgets(left_out)}), so the comparison says nothing about which heads to keep."]
    sentence = [plain(primary_verdict(primary))]
    if left_out and sentence:
        sentence[0] = sentence[0].rstrip(".") + (f" (budgets {_budgets(left_out)} left out: no strategy's accuracy "
                                                 "lies above streaming's there).")
    return sentence


def _budget_finding(folder: Path) -> list[str]:
    """The smallest budget at which each strategy reaches 95% of the full cache's accuracy (:func:`verdict`)."""
    memory = folder / "kv_memory_computed.csv"
    text = verdict(pd.read_csv(folder / "retention.csv"), pd.read_csv(folder / "predicted_vs_static.csv"),
                   pd.read_csv(memory) if memory.exists() else None)
    return text.quote("budget")


def _primary(folder: Path) -> dict | None:
    row = _primary_row(folder)
    if row is None:
        return None
    budgets = ", ".join(f"{b:.0%}" for b in row["budgets"])
    return {"estimate": float(row["difference"]), "low": float(row["low"]), "high": float(row["high"]),
            "n": row["n"], "units": "samples", "test": "exact two-sided sign test over samples; 95% bootstrap interval",
            "p": float(row["sign_p"]), "p_adjusted": None,
            "computed": f"gold log-probability per token, predicted − static retention, averaged over the budgets with "
                        f"headroom {budgets}"}


CLAIM = Claim(
    notebook="06_kv_retention",
    title="Beyond: per-step KV retention",
    config=RetentionConfig,
    presets={
        # 01's smoke setting (prose 300), two samples, two budgets, every strategy
        "smoke": {"niah_setting": "prose:300", "n_setting": 3, "n_setting_calibration": 2,
                  "max_new_tokens": 32, "n_samples": 2, "budgets": [0.05, 0.25]},
        # SCIENCE 12's power: 30 samples per compared condition, and budgets counted in single query heads too
        # (the default keeps KV-head budgets only, what a KV cache can drop, to fit the report in an hour)
        "thorough": {"n_samples": 30, "granularities": ["query", "kv"]},
        # one long setting: 01's `long` soft-dynamism answers train the probe, 30 new answers on 4,000 tokens of
        # the essays; 24 rows per batch (at 4k a SmolLM2 row keeps about 180 MiB of keys and values)
        "long": {"niah_setting": "essays:4000", "batch_size": 24},
        "paper": {"model": "meta-llama/Llama-3.1-8B-Instruct", "niah_setting": "filler:20000", "n_setting": 100,
                  "n_setting_calibration": 20, "n_samples": 100, "max_new_tokens": 64,
                  "budgets": [0.01, 0.02, 0.05, 0.1, 0.25, 0.5], "granularities": ["query", "kv"], "batch_size": 4},
    },
    committed=("long",),  # the committed report keeps the long setting's runs in papers_figures/long/<model>/
    items=(
        PaperItem("Beyond 6", "Per-step KV retention: NIAH accuracy when only R_t keeps the full cache, static vs "
                  "predicted vs oracle vs random at equal budgets (Wilson 95%)",
                  "not in the paper; for scale, on other models: " + "; ".join(f"{k} {v}" for k, v in ANCHORS.items()),
                  "retention", 26, _retention_headline, _retention_status),
    ),
    findings=(Finding("Beyond 6, per-step KV retention", _primary_finding, "Verdict, computed from the intervals"),
              Finding("Beyond 6, per-step KV retention", _budget_finding, "Verdict, computed from the intervals")),
    primary=Primary("predicted_vs_static_retention", _primary, item="Beyond 6"),
    seeds=SEEDS,
)
