"""Claim 3 pipeline: traces (shared with claim 1's cache) -> CCA curves (Fig 4, 8) -> probes (Tables 2, 3).

Every number is a mean over ``n_splits`` splits *by layout* (NIAH samples of different seeds share their depth
and only change the UUID: :func:`~dynheads_tl.analysis.correlation.layout_groups`), with the corrected
resampled t-interval; every comparison a verdict reads is a corrected resampled t-test over the same splits,
Holm-adjusted over the family the verdict reads (SCIENCE 10-12). The declared primary comparison of claim 3
(:data:`PRIMARY`): the NIAH MLP probe's F1 minus the step-aware prior's at the first lag ahead (the smallest
k ≥ 1 of ``lead_ks``), i.e. whether the hidden state predicts the next retrieval heads beyond position."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from dynheads_tl.config import RunSettings, NotebookConfig, ProbeSettings, check_choice, check_int_list, check_ints
from dynheads_tl.analysis.correlation import (LEAD_KS, MIN_PROBE_TEST_SAMPLES, ProbeConfig, cca_curve,
                                              lead_differences, lead_probe_table, over_splits, paired_over_splits,
                                              predictor_differences, probe_summary, residualised_cca)
from dynheads_tl.analysis.statistics import holm_adjust
from dynheads_tl.corpus import TraceSets, hotpot_traces, niah_traces
from dynheads_tl.engine.models import DEFAULT_MODEL

PAPER_FIG4 = [0.965, 0.931, 0.915, 0.835, 0.816, 0.805, 0.792, 0.776, 0.753, 0.742, 0.743]
PAPER_FIG8 = {0: 0.856, 10: 0.712}
PAPER_TABLE2_LLAMA31_8B = {"f1": 0.8349, "auprc": 0.9173}
PAPER_TABLE3_LLAMA31_8B = {"r2": 0.8120}
ALPHA = 0.05  # the family-wise level of every Holm-adjusted comparison here
METRIC_LABELS = {"f1": "F1", "auprc": "AUPRC", "r2": "R²"}
PRIMARY = ("niah", "f1")  # claim 3's declared primary comparison: this task and metric at the first lag ahead


@dataclass
class PredictabilityConfig(TraceSets, ProbeSettings, RunSettings, NotebookConfig):
    """The claim 3 notebook's parameters: claim 1's trace sets (its cached traces are read), the probe
    settings, and claim 3's own."""

    model: str = DEFAULT_MODEL
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    max_lag: int = 10
    probe_preset: str = "cpu"
    split_seed: int = 0
    lead_ks: list[int] = field(default_factory=lambda: list(LEAD_KS))
    n_splits: int = 5
    probe_min_test: int = MIN_PROBE_TEST_SAMPLES
    output_dir: str = "papers_figures"

    def __post_init__(self):
        super().__post_init__()
        check_ints(self, ("max_lag",), minimum=0)
        if self.max_lag > 50:
            raise ValueError(f"Parameter 'max_lag' must be at most 50, got {self.max_lag!r}.")
        check_choice(self, "probe_preset", ("cpu", "paper"))
        check_int_list(self, "seeds")
        check_int_list(self, "lead_ks", minimum=0)
        check_ints(self, ("n_splits", "probe_min_test"))
        if self.n_splits < 2:
            raise ValueError(f"Parameter 'n_splits' must be at least 2 (an interval needs two splits), got {self.n_splits!r}.")

    def check_inputs(self) -> None:
        """The haystack and the NIAH length against the model's context window, before any model work."""
        from dynheads_tl.config import model_context_window
        from dynheads_tl.tasks import check_context_fits, check_haystack, check_hotpot_source

        check_context_fits(self.context_tokens, self.max_new_tokens, model_context_window(self.model),
                           name="context_tokens")
        check_haystack(self.haystack)
        check_hotpot_source(self.hotpot_source, 2 * self.n_hotpot, skip_incomplete=self.hotpot_skip_incomplete,
                            needed_for=f"claim 1's calibration {max(self.n_hotpot // 2, 1)} + analysis {self.n_hotpot}")

    def probe_config(self) -> ProbeConfig:
        if self.probe_preset == "paper":
            return ProbeConfig.paper()
        return ProbeConfig(hidden=list(self.probe_hidden), epochs=self.probe_epochs, seed=self.split_seed)


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
    """Held-out CCA, raw and with step, tokens and depth regressed out, per lag in ``lead_ks`` and split."""
    return residualised_cca(traces, config.lead_ks, split_seeds(config))


def residualised_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per lag and control: the mean of the held-out first canonical correlation and of the top-10 mean over
    the splits, each with its corrected resampled 95% interval, and the samples and layouts it rests on."""
    return over_splits(table, ("first", "top10_mean")) if len(table) else pd.DataFrame(
        columns=["k", "control", "first", "first_low", "first_high", "splits"])


def lead_probes(traces, task: str, config: PredictabilityConfig, desc: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Probes k steps ahead on every split by layout (raw rows; k = 0 also with the linear probe, for Tables 2
    and 3) and their differences from the base rate and the step-aware prior at the lags of ``lead_ks``, with
    intervals and p-values: F1 and AUPRC for the NIAH Eq. 1 sets, R² for HotpotQA Eq. 2 scores."""
    ks = sorted(set(config.lead_ks) | {0})
    raw = lead_probe_table(traces, task, config.probe_config(), ks=ks, split_seeds=split_seeds(config),
                           progress_desc=desc, linear_ks=[0], min_test_samples=config.probe_min_test)
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
    """Probe minus step-aware prior at every lag and metric (NIAH F1 and AUPRC, HotpotQA R²), one family: Holm
    over all of them (:func:`holm_family`); a lag where a split could not be scored (fewer than ``n_splits``)
    stays out of the family and is never separated. ``primary`` marks :data:`PRIMARY` at the first lag ahead."""
    frames = []
    for task, diffs in (("niah", niah_diffs), ("hotpot", hotpot_diffs)):
        if len(diffs):
            frames.append(pd.DataFrame({"task": task, "metric": diffs["metric"], "k": diffs["k"].astype(int),
                                        "difference": diffs["vs_step_prior"], "low": diffs["vs_step_prior_low"],
                                        "high": diffs["vs_step_prior_high"],
                                        "p": diffs["vs_step_prior_p"] if "vs_step_prior_p" in diffs else np.nan,
                                        "splits": diffs["splits"]}))
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["task", "metric", "k", "difference", "low", "high", "p", "splits"])
    table = holm_family(table, member=table["splits"] >= n_splits)
    ahead = sorted(int(k) for k in table[(table["task"] == PRIMARY[0]) & (table["metric"] == PRIMARY[1])]["k"] if k >= 1)
    table["primary"] = ((table["task"] == PRIMARY[0]) & (table["metric"] == PRIMARY[1])
                        & (table["k"] == (ahead[0] if ahead else -1)))
    return table


def residual_tests(resid: pd.DataFrame) -> pd.DataFrame:
    """Per lag: residualised held-out CCA minus its chance pairing on the same splits, Holm over the lags."""
    if resid.empty:
        return holm_family(pd.DataFrame(columns=["k", "difference", "low", "high", "p", "splits"]))
    return holm_family(paired_over_splits(resid, "held-out, residualised", "held-out, residualised, chance"))


def cca_tests(raw: pd.DataFrame) -> pd.DataFrame:
    """Per lag: held-out minus each shuffled control (random step; same step) on the same splits, one family
    (Holm over lags x controls)."""
    frames = [paired_over_splits(raw, "held-out", control) for control in ("shuffled", "shuffled, same step")]
    frames = [f for f in frames if len(f)]
    if not frames:
        return holm_family(pd.DataFrame(columns=["k", "a", "b", "difference", "low", "high", "p", "splits"]))
    return holm_family(pd.concat(frames, ignore_index=True))


def _cell(row, digits: int = 3) -> str:
    return (f"{row['difference']:+.{digits}f} [{row['low']:+.{digits}f}, {row['high']:+.{digits}f}], "
            f"p_adj {_p(row['p_adjusted'])}")


def _p(value: float) -> str:
    """``= 0.012``, ``< 0.001`` or ``n/a`` (not tested), to follow "p_adj"."""
    return "n/a" if value != value else f"= {value:.3f}" if value >= 0.001 else "< 0.001"


def _detectable(rows: pd.DataFrame) -> str:
    """What the design could see where comparisons cannot be told apart: the range of their half-widths."""
    widths = rows["half_width"].dropna()
    if widths.empty:
        return "no interval (too few splits)"
    low, high = float(widths.min()), float(widths.max())
    return f"about ±{low:.3f}" if abs(high - low) < 5e-4 else f"about ±{low:.3f} to ±{high:.3f}"


def beyond_position_verdict(niah_diffs: pd.DataFrame, hotpot_diffs: pd.DataFrame, niah_resid: pd.DataFrame,
                            hotpot_resid: pd.DataFrame, *, n_splits: int, hotpot_name: str = "HotpotQA") -> str:
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

    def reach(task, metric, what):
        part = tests[(tests["task"] == task) & (tests["metric"] == metric)]
        better = part[part["separated"] & (part["difference"] > 0)]
        worse = part[part["separated"] & (part["difference"] < 0)]
        ahead = sorted(int(k) for k in better["k"] if k >= 1)
        tested = sorted(int(k) for k in part["k"] if k >= 1)
        if ahead:
            text = (f"{what} better than the step index alone at {len(ahead)} of the {len(tested)} lags k ≥ 1 "
                    f"tested (k ∈ {{{', '.join(map(str, ahead))}}})")
        elif 0 in set(better["k"].astype(int)):
            text = f"{what} better than the step index alone only concurrently (k = 0), at no lag ahead"
        else:
            text = f"{what} no better than the step index alone at any lag"
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
        return f"{label} probe − step-aware prior, {METRIC_LABELS.get(metric, metric.upper())} (corrected resampled 95% interval): {cells}"

    def primary():
        row = tests[tests["primary"]]
        if row.empty:
            return "No lag ahead was tested, so the declared primary comparison could not be made. "
        r = row.iloc[0]
        word = ("is better than" if r["difference"] > 0 else "is worse than") if r["separated"] else "cannot be told apart from"
        tail = "" if r["separated"] else f"; the design could detect differences of about ±{r['half_width']:.3f}"
        return (f"Primary comparison (declared): at k = {int(r['k'])} the NIAH probe's F1 {word} the step-aware "
                f"prior's, {_cell(r)} (Holm over the {family} lag × metric comparisons{tail}). ")

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

    return (primary()
            + reach("niah", "f1", "The hidden state predicts the NIAH Eq. 1 sets") + "; "
            + reach("hotpot", "r2", f"it predicts the {hotpot_name} Eq. 2 scores") + ". "
            + describe("niah", "f1", "NIAH") + ". " + describe("niah", "auprc", "NIAH") + ". "
            + describe("hotpot", "r2", hotpot_name) + ". "
            "The step-aware prior knows neither the tokens nor the prompt, so at k ≥ 1 part of a probe's gain can be "
            "the next token, which the hidden state already determines under greedy decoding. "
            f"With the step index, the tokens read at steps n and n + k and the evidence depth regressed out of both "
            f"sides, the held-out first canonical correlation is {resid(niah_resid, 'NIAH')} and "
            f"{resid(hotpot_resid, hotpot_name)}.")


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
    return (f"- **{label} CCA** (first canonical correlation, mean of {int(sizes['splits'])} splits by layout, "
            f"n = {int(sizes['n_samples'])} samples in {int(sizes['n_clusters'])} layouts, about "
            f"{sizes['test_clusters']:.0f} held-out layouts per split; k = {k0} → {k1}): in-sample "
            f"{_mean_cell(summary, 'in-sample', k0)} → {_mean_cell(summary, 'in-sample', k1)}; held-out "
            f"{_mean_cell(summary, 'held-out', k0)} → {_mean_cell(summary, 'held-out', k1)}; shuffled "
            f"{_mean_cell(summary, 'shuffled', k0)} → {_mean_cell(summary, 'shuffled', k1)}; same-step shuffle "
            f"{_mean_cell(summary, 'shuffled, same step', k0)} → {_mean_cell(summary, 'shuffled, same step', k1)}. "
            f"Paper (in-sample, Llama-3.1-8B): {paper}. Held-out is " + " and ".join(parts)
            + f" (Holm over the {len(tests)} comparisons).")


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
        detect = "" if r["separated"] else f", detectable ±{r['half_width']:.3f}"
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
