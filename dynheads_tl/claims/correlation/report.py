"""Claim 3's report part: the paper's Fig 4 / Fig 8 / Table 2 / Table 3 numbers, the computed sentences and the
index rows.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from dynheads_tl.claim import Claim, Finding, PaperItem, Primary, Verdict, sidecar
from dynheads_tl.tasks.hotpot import hotpot_label
from dynheads_tl.analysis.correlation import MIN_PROBE_TEST_SAMPLES, over_splits
from dynheads_tl.analysis.statistics import format_interval, Interval, detectable_effect

from .config import ALPHA, METRIC_LABELS, PredictabilityConfig
from .pipeline import cca_tests, generated_token_table, lag_tests, residual_tests, residualised_summary, within_sample_tests
from .rules import _cca_status, _lead, _lead_status, _probe_status, _residualised_status

__all__ = [
    "PAPER_FIG4", "PAPER_FIG8", "PAPER_TABLE2_LLAMA31_8B", "PAPER_TABLE3_LLAMA31_8B", "beyond_position_verdict",
    "generated_token_sentence",
    "with_paper_row", "cca_sentence", "probe_sentence", "summary_markdown",
]


PAPER_FIG4 = [0.965, 0.931, 0.915, 0.835, 0.816, 0.805, 0.792, 0.776, 0.753, 0.742, 0.743]


PAPER_FIG8 = {0: 0.856, 10: 0.712}


PAPER_TABLE2_LLAMA31_8B = {"f1": 0.8349, "auprc": 0.9173}


PAPER_TABLE3_LLAMA31_8B = {"r2": 0.8120}


def _cell(row, digits: int = 3) -> str:
    return (f"{row['difference']:+.{digits}f} [{row['low']:+.{digits}f}, {row['high']:+.{digits}f}], "
            f"p_adj {_p(row['p_adjusted'])}")


def _p(value: float) -> str:
    """``= 0.012``, ``< 0.001`` or ``n/a`` (not tested), to follow "p_adj"."""
    return "n/a" if value != value else f"= {value:.3f}" if value >= 0.001 else "< 0.001"


def _detectable(rows: pd.DataFrame) -> str:
    """What the design could see where comparisons cannot be told apart: the range of the effects it detects with
    80% power (2.8 standard errors, from the intervals' half-widths; :func:`detectable_effect`)."""

    widths = rows["half_width"].dropna()
    if widths.empty:
        return "no interval (too few splits)"
    power = lambda w: detectable_effect(Interval(0.0, -float(w), float(w), 0))
    low, high = power(widths.min()), power(widths.max())
    span = f"about ±{low:.3f}" if abs(high - low) < 5e-4 else f"about ±{low:.3f} to ±{high:.3f}"
    return span + " with 80% power"


def beyond_position_verdict(niah_diffs: pd.DataFrame, hotpot_diffs: pd.DataFrame, niah_resid: pd.DataFrame,
                            hotpot_resid: pd.DataFrame, *, n_splits: int, hotpot_name: str = "HotpotQA") -> Verdict:
    """Computed sentences: is the hidden state predictive beyond position, at which k, and by how much?

    ``niah_diffs`` / ``hotpot_diffs``: :func:`lead_probes`' differences; ``niah_resid`` / ``hotpot_resid``: the
    per-split rows of :func:`residualised_table`. A lag k counts as "beyond position" when the probe's score
    minus the step-aware prior's is *separated*: its corrected resampled t-test, Holm-adjusted over every lag
    and metric (:func:`lag_tests`), is below 0.05 and its 95% interval excludes 0, over all ``n_splits`` splits
    by layout (a lag where a split could not be scored does not count). k = 0 is concurrent (h_n is computed
    after the heads of step n attended), so only k ≥ 1 is "ahead". The declared primary comparison is stated
    first; every "cannot be told apart" says how large a difference the design could have seen (the
    intervals' half-widths). The residualised CCA against its chance pairing is quoted beside it, Holm over lags."""
    tests = lag_tests(niah_diffs, hotpot_diffs, n_splits=n_splits)
    family = int(tests["p_adjusted"].notna().sum())
    baseline = tests["baseline"].iloc[0] if len(tests) else "step-aware prior"
    knows_tokens = baseline == "step-and-token prior"
    alone = "the step index and the tokens alone" if knows_tokens else "the step index alone"

    def reach(task, metric, what):
        part = tests[(tests["task"] == task) & (tests["metric"] == metric)]
        better = part[part["separated"] & (part["difference"] > 0)]
        worse = part[part["separated"] & (part["difference"] < 0)]
        ahead = sorted(int(k) for k in better["k"] if k >= 1)
        tested = sorted(int(k) for k in part["k"] if k >= 1)
        if ahead:
            text = (f"{what} better than {alone} at {len(ahead)} of the {len(tested)} lags k ≥ 1 "
                    f"tested (k ∈ {{{', '.join(map(str, ahead))}}})")
        elif 0 in set(better["k"].astype(int)):
            text = f"{what} better than {alone} only concurrently (k = 0), at no lag ahead"
        else:
            text = f"{what} no better than {alone} at any lag"
        if len(worse):
            text += f", worse at k ∈ {{{', '.join(str(int(k)) for k in worse['k'])}}}"
        undecided = part[~part["separated"]]
        if len(undecided):
            text += (f"; where it cannot be told apart the design could detect differences of "
                     f"{_detectable(undecided)} in {METRIC_LABELS.get(metric, metric.upper())}")
        return text

    def describe(task, metric, label):
        part = tests[(tests["task"] == task) & (tests["metric"] == metric)].sort_values("k")
        cells = "; ".join(f"k = {int(r['k'])}: {_cell(r)}, n = {int(r['splits'])} splits" for _, r in part.iterrows())
        return f"{label} probe − {baseline}, {METRIC_LABELS.get(metric, metric.upper())} (corrected resampled 95% interval): {cells}"

    def primary():
        row = tests[tests["primary"]]
        if row.empty:
            return "No lag ahead was tested, so the declared primary comparison could not be made.", ""
        r = row.iloc[0]
        word = ("is better than" if r["difference"] > 0 else "is worse than") if r["separated"] else "cannot be told apart from"
        tail = "" if r["separated"] else f"; the design could detect differences of {_detectable(row)}"
        stand_in = ("" if baseline != "step-aware prior" else " The declared prior also knows the tokens read and the "
                    "token generated at n + k; the step-aware prior stands in for it here.")
        return (f"Primary comparison (declared): at k = {int(r['k'])} the NIAH probe's F1 {word} the {baseline}'s, "
                f"{_cell(r).replace('p_adj', 'p')} (tested alone at {ALPHA}; the other {family - 1} lag × metric "
                f"comparisons are Holm-corrected among themselves{tail})."), stand_in

    def resid(raw, name):
        if raw is None or len(raw) == 0:
            return f"not computed ({name})"
        summary = residualised_summary(raw)
        comparisons = residual_tests(raw)
        row = summary[(summary["control"] == "held-out, residualised") & (summary["k"] == summary["k"].min())]
        chance = summary[(summary["control"] == "held-out, residualised, chance") & (summary["k"] == summary["k"].min())]
        if row.empty or chance.empty:
            return f"not computed ({name})"
        r, c = row.iloc[0], chance.iloc[0]
        above = sorted(int(k) for k in comparisons[comparisons["separated"] & (comparisons["difference"] > 0)]["k"])
        lags = ", ".join(map(str, above)) if above else "none"
        undecided = comparisons[~comparisons["separated"]]
        detect = f"; elsewhere the design could detect {_detectable(undecided)}" if len(undecided) else ""
        return (f"{r['first']:.3f} [{r['first_low']:.3f}, {r['first_high']:.3f}] at k = {int(r['k'])} against a chance "
                f"pairing of {c['first']:.3f} [{c['first_low']:.3f}, {c['first_high']:.3f}] ({name}, "
                f"n = {int(r['n_samples'])} samples in {int(r['n_clusters'])} layouts; above chance at lags {{{lags}}} "
                f"of {len(comparisons)}, Holm over lags{detect})")

    stated, stand_in = primary()
    return Verdict(
        ("primary", stated), ("stand-in", stand_in),
        ("reach", reach("niah", "f1", "The hidden state predicts the NIAH Eq. 1 sets") + "; "
         + reach("hotpot", "r2", f"it predicts the {hotpot_name} Eq. 2 scores") + "."),
        ("intervals", describe("niah", "f1", "NIAH") + ". " + describe("niah", "auprc", "NIAH") + ". "
         + describe("hotpot", "r2", hotpot_name) + "."),
        ("prior", "The step-and-token prior knows the step index, the tokens read at steps n and n + k and the token "
                  "generated at n + k (which Eq. 1 at that step is defined against), so a probe's gain over it is not "
                  "the next token." if knows_tokens else
                  "The step-aware prior knows neither the tokens nor the prompt, so at k ≥ 1 part of a probe's gain can "
                  "be the next token, which the hidden state already determines under greedy decoding."),
        ("residualised", f"With the step index, the tokens read at steps n and n + k, the token generated at n + k and "
                         f"the evidence depth regressed out of both sides, the held-out first canonical correlation is "
                         f"{resid(niah_resid, 'NIAH')} and {resid(hotpot_resid, hotpot_name)}."),
        ("generated token", generated_token_sentence(niah_resid, "NIAH") + " "
         + generated_token_sentence(hotpot_resid, hotpot_name)),
        declared=("primary", "stand-in", "reach", "intervals", "prior", "residualised", "generated token"))


def generated_token_sentence(raw: pd.DataFrame | None, name: str) -> str:
    """How much of each lag's residualised gain over chance the token generated at n + k explains, in one computed
    sentence (:func:`~dynheads_tl.claims.correlation.pipeline.generated_token_table` of the per-split rows of
    :func:`residualised_table`): per lag the gain with the tokens read only, the gain once the generated token is
    regressed out too, and the part removed with its corrected resampled 95% interval over splits."""
    table = generated_token_table(raw) if raw is not None and len(raw) else pd.DataFrame()
    if table.empty:
        return f"{name}: the residualisation without the generated token was not computed."
    cells = []
    for r in table.itertuples():
        share = f", {r.share_removed:.0%} of it" if r.share_removed == r.share_removed else ""
        cells.append(f"k = {r.k}: gain over chance {r.gain_read_only:+.3f} with the tokens read only, "
                     f"{r.gain_with_generated:+.3f} once the generated token is regressed out too (removed "
                     f"{format_interval(r.removed, r.removed_low, r.removed_high, 3, signed=True)}{share})")
    return (f"{name}, how much of the residualised held-out CCA's gain over its chance pairing the token generated "
            f"at n + k explains (first canonical correlation, n = {int(table['splits'].min())} splits by layout): "
            + "; ".join(cells) + ".")


def with_paper_row(table: pd.DataFrame, which: str) -> pd.DataFrame:
    """Table 2 or 3 with the paper's Llama-3.1-8B-Instruct row appended, labelled as the paper's."""
    paper = PAPER_TABLE2_LLAMA31_8B if which == "table2" else PAPER_TABLE3_LLAMA31_8B
    row = {column: np.nan for column in table.columns}
    row.update({"predictor": "MLP probe, Llama-3.1-8B-Instruct (paper)", **paper})
    return pd.concat([table, pd.DataFrame([row])], ignore_index=True)


def _mean_cell(frame: pd.DataFrame, control: str, k: int) -> str:
    row = frame[(frame["control"] == control) & (frame["k"] == k)]
    if row.empty:
        return "n/a"
    r = row.iloc[0]
    return f"{r['first']:.3f} [{r['first_low']:.3f}, {r['first_high']:.3f}]"


def cca_sentence(raw: pd.DataFrame, label: str, paper: str) -> str:
    """Fig 4 / Fig 8 in words: the means over splits at the first and last lag, and at how many lags the held-out
    correlation is above each shuffled control (corrected resampled t-tests, Holm over lags x controls)."""
    if raw.empty:
        return f"- **{label} CCA**: not computed (too few samples)."
    summary, tests = over_splits(raw), cca_tests(raw)
    k0, k1 = int(summary["k"].min()), int(summary["k"].max())
    sizes = summary.iloc[0]
    parts = []
    for control, name in (("shuffled", "the shuffled pairing"), ("shuffled, same step", "the same-step shuffle")):
        part = tests[tests["b"] == control]
        above = part[part["separated"] & (part["difference"] > 0)]
        undecided = part[~part["separated"]]
        text = f"above {name} at {len(above)} of {len(part)} lags"
        if len(undecided):
            text += f" (elsewhere the design could detect {_detectable(undecided)})"
        parts.append(text)
    within = within_sample_tests(raw)
    if len(within):
        ahead = within[within["k"] >= 1]
        above = ahead[ahead["separated"] & (ahead["difference"] > 0)]
        undecided = ahead[~ahead["separated"]]
        one = within[within["k"] == 1]
        at_one = f"; at k = 1 held-out − permuted {_cell(one.iloc[0])}" if len(one) else ""
        detect = (f"; it cannot be told apart at {len(undecided)} (the design could detect {_detectable(undecided)})"
                  if len(undecided) else "")
        parts_within = (f" Against the within-sample step permutation (each sample's own scores in another step order; "
                        f"exploratory, Holm over its {len(within)} lags): held-out is above it at {len(above)} of the "
                        f"{len(ahead)} lags k ≥ 1{at_one}{detect}. Above it means step-specific information within a "
                        "sample, position included (the same-step shuffle is the control for position).")
    else:
        parts_within = ""
    return (f"- **{label} CCA** (first canonical correlation, mean of {int(sizes['splits'])} splits by layout, "
            f"n = {int(sizes['n_samples'])} samples in {int(sizes['n_clusters'])} layouts, about "
            f"{sizes['test_clusters']:.0f} held-out layouts per split; k = {k0} → {k1}): in-sample "
            f"{_mean_cell(summary, 'in-sample', k0)} → {_mean_cell(summary, 'in-sample', k1)}; held-out "
            f"{_mean_cell(summary, 'held-out', k0)} → {_mean_cell(summary, 'held-out', k1)}; shuffled "
            f"{_mean_cell(summary, 'shuffled', k0)} → {_mean_cell(summary, 'shuffled', k1)}; same-step shuffle "
            f"{_mean_cell(summary, 'shuffled, same step', k0)} → {_mean_cell(summary, 'shuffled, same step', k1)}. "
            f"Paper (in-sample, Llama-3.1-8B): {paper}. Held-out is " + " and ".join(parts)
            + f" (Holm over the {len(tests)} comparisons)." + parts_within)


def probe_sentence(table: pd.DataFrame, comparisons: pd.DataFrame, label: str, metric: str, paper: str,
                   min_test: int = MIN_PROBE_TEST_SAMPLES) -> str:
    """Table 2 / Table 3 in words: the MLP probe's headline metric (mean over splits, interval, n, layouts) and
    whether it beats, falls below or cannot be told apart from each other predictor (Holm over the table)."""
    if table.empty:
        return f"- **{label}**: not computed (too few samples)."
    t = table.set_index("predictor")
    mlp = t.loc["MLP probe"]
    words = []
    for _, r in comparisons.iterrows():
        word = ("beats" if r["difference"] > 0 else "falls below") if r["separated"] else "cannot be told apart from"
        detect = "" if r["separated"] else f", detectable {_detectable(pd.DataFrame([r]))}"
        words.append(f"{word} the {r['b']} ({_cell(r)}{detect})")
    small = (f" — fewer than the {min_test} asked for: the data do not allow more (the test part is capped at a "
             "third of the layouts)" if mlp["test_samples"] < min_test else "")
    return (f"- **{label}** (mean of {int(mlp['splits'])} splits by layout, {mlp['test_samples']:.0f} test samples in "
            f"{mlp['test_clusters']:.0f} layouts per split{small}; n = {int(mlp['n_samples'])} samples in "
            f"{int(mlp['n_clusters'])} layouts): MLP {METRIC_LABELS.get(metric, metric.upper())} {mlp[metric]:.3f} "
            f"[{mlp[f'{metric}_low']:.3f}, {mlp[f'{metric}_high']:.3f}] (paper, Llama-3.1-8B: {paper}). The MLP probe "
            + "; ".join(words) + f" (Holm over the {len(comparisons)} comparisons of the table).")


def summary_markdown(cca_niah: pd.DataFrame, cca_hotpot: pd.DataFrame, table2: pd.DataFrame, comparisons2: pd.DataFrame,
                     table3: pd.DataFrame, comparisons3: pd.DataFrame, model_label: str,
                     hotpot_name: str = "HotpotQA", min_test: int = MIN_PROBE_TEST_SAMPLES) -> str:
    """Our numbers beside the paper's, every comparison in words computed from its test (``cca_*``: the per-split
    rows of :func:`cca_table`; ``table2`` / ``table3`` and their comparisons: :func:`probe_table_over_splits`)."""
    k_last = int(cca_niah["k"].max()) if len(cca_niah) else 0
    lines = [f"**Model:** {model_label}.",
             cca_sentence(cca_niah, "NIAH", f"{PAPER_FIG4[0]} → {PAPER_FIG4[min(k_last, 10)]}"),
             cca_sentence(cca_hotpot, hotpot_name, f"{PAPER_FIG8[0]} → {PAPER_FIG8[10]} (k = 0 → 10)"),
             probe_sentence(table2, comparisons2, "Table 2 (NIAH probe)", "f1",
                            f"F1 {PAPER_TABLE2_LLAMA31_8B['f1']}, AUPRC {PAPER_TABLE2_LLAMA31_8B['auprc']}", min_test),
             probe_sentence(table3, comparisons3, f"Table 3 ({hotpot_name} probe)", "r2",
                            f"R² {PAPER_TABLE3_LLAMA31_8B['r2']}", min_test)]
    return "\n".join(lines)


# --- the index: claim 3's rows, read from the files the notebook wrote ---------------------------
def _cca_headline(stem: str) -> Callable[[Path], str]:
    def headline(folder: Path) -> str:
        frame = pd.read_csv(folder / f"{stem}.csv")
        value = "first" if "first" in frame else "leading"  # the first canonical pair (older runs: the largest)
        parts = []
        for control in ("in-sample", "held-out", "shuffled", "shuffled, same step"):
            series = frame[frame["control"] == control].set_index("k")[value]
            if len(series):
                parts.append(f"{control} " + " ".join(f"{v:.3f}" for v in series.sort_index()))
        held = frame[frame["control"] == "held-out"].set_index("k")[value]
        same = frame[frame["control"] == "shuffled, same step"].set_index("k")[value]
        beaten = [int(k) for k in held.index if k in same.index and same[k] >= held[k]]
        return (f"first canonical correlation at k = {int(frame['k'].min())}..{int(frame['k'].max())}: "
                + "; ".join(parts)
                + (f"; the same-step shuffle reaches held-out at k = {', '.join(map(str, beaten))}" if beaten else ""))
    return headline


def _probe_headline(stem: str, task: str) -> Callable[[Path], str]:
    def headline(folder: Path) -> str:
        r = pd.read_csv(folder / f"{stem}.csv").set_index("predictor").loc["MLP probe"]
        if task == "niah":
            return f"MLP F1 {r.f1:.4f}, P {r.precision:.4f}, R {r.recall:.4f}, AUPRC {r.auprc:.4f}"
        return f"MLP MSE {r.mse:.4f}, MAE {r.mae:.4f}, R² {r.r2:.4f}"
    return headline


def _residualised_headline(folder: Path) -> str:
    frame = pd.read_csv(folder / "fig4_niah_cca_residualised.csv")
    first = lambda control: frame[frame["control"] == control].set_index("k")
    resid, chance = first("held-out, residualised"), first("held-out, residualised, chance")
    return "; ".join(f"k={k}: {r['first']:.3f} [{r.first_low:.3f}, {r.first_high:.3f}] vs chance "
                     f"{chance.loc[k, 'first']:.3f}" for k, r in resid.iterrows() if k in chance.index) + \
        f" (first canonical correlation, {int(resid['splits'].min())} splits)"


def _lead_headline(folder: Path) -> str:
    parts = []
    for task, metric in (("niah", "f1"), ("hotpot", "r2")):
        parts.append(f"{task} {metric.upper()}: " + ", ".join(
            f"k={r.k} {r.vs_step_prior:+.3f} [{r.vs_step_prior_low:+.3f}, {r.vs_step_prior_high:+.3f}]"
            for r in _lead(folder, task, metric).itertuples()))
    return "; ".join(parts)


def _lead_by_task(folder: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    lead = pd.read_csv(folder / "lead_probes.csv")
    part = lambda task: lead[lead["task"] == task].drop(columns="task").reset_index(drop=True)
    return part("niah"), part("hotpot")


def _beyond_position_finding(folder: Path) -> list[str]:
    """The declared primary comparison and the reach of the hidden state ahead, the first two sentences of
    :func:`beyond_position_verdict` (the residualised CCA it also quotes is not among them)."""
    config = sidecar(folder, "lead_probes")
    niah, hotpot = _lead_by_task(folder)
    empty = pd.DataFrame()
    verdict = beyond_position_verdict(niah, hotpot, empty, empty, n_splits=int(config.get("n_splits", 5)),
                                      hotpot_name=hotpot_label(str(config.get("hotpot_source", "synthetic"))))
    return verdict.quote("primary", "stand-in", "reach")


def _primary(folder: Path) -> dict | None:
    """The row :func:`lag_tests` marks primary, recomputed from ``lead_probes.csv`` under today's convention (the
    primary tested alone): NIAH MLP-probe F1 minus the prior's (step-and-token where written) at the first lag
    ahead."""
    niah, hotpot = _lead_by_task(folder)
    tests = lag_tests(niah, hotpot, n_splits=int(sidecar(folder, "lead_probes").get("n_splits", 5)))
    row = tests[tests["primary"]]
    if row.empty:
        return None
    r = row.iloc[0]
    return {"estimate": float(r["difference"]), "low": float(r["low"]), "high": float(r["high"]),
            "n": int(r["splits"]), "units": "splits (grouped by layout)",
            "test": "corrected resampled t-test over splits, tested alone at alpha (the other lags Holm among themselves)",
            "p": float(r["p"]), "p_adjusted": float(r["p_adjusted"]),
            "computed": f"{r['task']} MLP-probe {r['metric']} at k = {int(r['k'])} minus the "
                        f"{r['baseline'] if 'baseline' in r and isinstance(r['baseline'], str) else 'step-aware prior'}"}


_bare = lambda x: f"{x:.3f}".lstrip("0")  # the paper's style: .965
CLAIM = Claim(
    notebook="03_correlation",
    title="Claim 3: predictability",
    config=PredictabilityConfig,
    presets={
        "smoke": {"hotpot_source": "synthetic", "n_calibration": 2, "n_analysis": 4, "context_tokens": 300, "max_new_tokens": 32, "n_hotpot": 4,
                  "hotpot_max_new_tokens": 8, "seeds": [0, 1], "max_lag": 2, "probe_epochs": 5, "probe_hidden": [32],
                  "lead_ks": [0, 2], "n_splits": 2},
        # claim 3 at one long setting: 01's `long` NIAH splits (4,000 tokens of the essays), the same seeds
        "long": {"context_tokens": 4000, "haystack": "essays"},
        "paper": {"model": "meta-llama/Llama-3.1-8B-Instruct", "n_calibration": 100, "n_analysis": 100,
                  "context_tokens": 20000, "max_new_tokens": 64, "n_hotpot": 100, "seeds": [0, 1, 2],
                  "probe_preset": "paper"},
    },
    committed=("long",),  # the committed report keeps the long setting's runs in papers_figures/long/<model>/
    items=(
        PaperItem("Fig 4", "NIAH CCA vs lag k",
                  f"leading correlation {_bare(PAPER_FIG4[0])} (k = 0) → {_bare(PAPER_FIG4[10])} (k = 10)",
                  "fig4_niah_cca", 5, _cca_headline("fig4_niah_cca"), _cca_status("fig4_niah_cca")),
        PaperItem("Fig 8", "HotpotQA CCA vs lag k", f"{_bare(PAPER_FIG8[0])} → {_bare(PAPER_FIG8[10])}",
                  "fig8_hotpot_cca", 9, _cca_headline("fig8_hotpot_cca"), _cca_status("fig8_hotpot_cca"), hotpot=True),
        PaperItem("Table 2", "NIAH probe F1 / P / R / AUPRC",
                  f"F1 .8038–.8566 (Llama-3.1-8B {PAPER_TABLE2_LLAMA31_8B['f1']:.4f}, AUPRC "
                  f"{PAPER_TABLE2_LLAMA31_8B['auprc']:.4f})".replace(" 0.", " ."),
                  "table2_niah_probe", 10, _probe_headline("table2_niah_probe", "niah"),
                  _probe_status("table2_niah_probe", "niah")),
        PaperItem("Table 3", "HotpotQA probe MSE / MAE / R²",
                  f"R² .7200–.8120 (Llama-3.1-8B {PAPER_TABLE3_LLAMA31_8B['r2']:.4f})".replace(" 0.", " ."),
                  "table3_hotpot_probe", 11, _probe_headline("table3_hotpot_probe", "hotpot"),
                  _probe_status("table3_hotpot_probe", "hotpot"), hotpot=True),
        PaperItem("Beyond 3a", "NIAH held-out CCA with step and current token regressed out (mean of splits, 95% CI)",
                  "not in the paper", "fig4_niah_cca_residualised", 23, _residualised_headline, _residualised_status),
        PaperItem("Beyond 3b", "Probes k steps ahead minus the step-aware prior (NIAH F1, HotpotQA R²; 95% CI over "
                  "splits)", "not in the paper (probes at k = 0 only)", "lead_probes", 24, _lead_headline,
                  _lead_status, hotpot=True),
    ),
    findings=(Finding("Claim 3, predictability", _beyond_position_finding,
                      "Verdict: is the hidden state predictive beyond position?"),),
    # The id of what PRIMARY computes: the step-aware prior knows the step only; the pre-registered one also knows
    # the tokens (tests/test_preregistration.py marks this claim as not yet computing it).
    primary=Primary("probe_k1_vs_step_token_prior", _primary, item="Table 2"),
)
