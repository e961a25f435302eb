"""Claim 3 pipeline: traces (shared with claim 1's cache) -> CCA curves (Fig 4, 8) -> probes (Tables 2, 3)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from dynheads_tl.config import RunSettings, NotebookConfig, ProbeSettings, check_choice, check_int_list, check_ints
from dynheads_tl.analysis.correlation import (LEAD_KS, ProbeConfig, cca_curve, lead_differences, lead_probe_table,
                                              residualised_cca)
from dynheads_tl.analysis.statistics import t_interval
from dynheads_tl.corpus import TraceSets, hotpot_traces, niah_traces
from dynheads_tl.engine.models import DEFAULT_MODEL

PAPER_FIG4 = [0.965, 0.931, 0.915, 0.835, 0.816, 0.805, 0.792, 0.776, 0.753, 0.742, 0.743]
PAPER_FIG8 = {0: 0.856, 10: 0.712}
PAPER_TABLE2_LLAMA31_8B = {"f1": 0.8349, "auprc": 0.9173}
PAPER_TABLE3_LLAMA31_8B = {"r2": 0.8120}


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
    output_dir: str = "papers_figures"

    def __post_init__(self):
        super().__post_init__()
        check_ints(self, ("max_lag",), minimum=0)
        if self.max_lag > 50:
            raise ValueError(f"Parameter 'max_lag' must be at most 50, got {self.max_lag!r}.")
        check_choice(self, "probe_preset", ("cpu", "paper"))
        check_int_list(self, "seeds")
        check_int_list(self, "lead_ks", minimum=0)
        check_ints(self, ("n_splits",))
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


def cca_table(traces, config: PredictabilityConfig) -> pd.DataFrame:
    return cca_curve(traces, list(range(config.max_lag + 1)), seed=config.split_seed)


def split_seeds(config: PredictabilityConfig) -> list[int]:
    """The by-sample splits every interval of the notebook is taken over."""
    return [config.split_seed + i for i in range(config.n_splits)]


def residualised_table(traces, config: PredictabilityConfig) -> pd.DataFrame:
    """Held-out CCA, raw and with step and current token regressed out, per lag in ``lead_ks`` and split."""
    return residualised_cca(traces, config.lead_ks, split_seeds(config))


def residualised_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per lag and control: the mean of the held-out first canonical correlation and of the top-10 mean over
    the splits, each with its 95% t-interval."""
    rows = []
    for (k, control), part in table.groupby(["k", "control"], sort=True):
        first, top10 = t_interval(part["first"]), t_interval(part["top10_mean"])
        rows.append({"k": int(k), "control": control, "splits": first.n, "first": first.estimate,
                     "first_low": first.low, "first_high": first.high, "top10_mean": top10.estimate,
                     "top10_low": top10.low, "top10_high": top10.high})
    return pd.DataFrame(rows)


def lead_probes(traces, task: str, config: PredictabilityConfig, desc: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Probes k steps ahead on every split (raw rows) and their differences from the base rate and the
    step-aware prior with intervals: F1 and AUPRC for the NIAH Eq. 1 sets, R² for HotpotQA Eq. 2 scores."""
    raw = lead_probe_table(traces, task, config.probe_config(), ks=config.lead_ks, split_seeds=split_seeds(config),
                           progress_desc=desc)
    metrics = ("f1", "auprc") if task == "classification" else ("r2",)
    return raw, pd.concat([lead_differences(raw, metric) for metric in metrics], ignore_index=True)


def beyond_position_verdict(niah_diffs: pd.DataFrame, hotpot_diffs: pd.DataFrame, niah_resid: pd.DataFrame,
                            hotpot_resid: pd.DataFrame, *, n_splits: int, hotpot_name: str = "HotpotQA") -> str:
    """One computed sentence: is the hidden state predictive beyond position, at which k, and by how much?

    A lag k counts as "beyond position" when the probe's score minus the step-aware prior's has a 95%
    t-interval above zero over all ``n_splits`` by-sample splits (a lag where a split could not be scored
    does not count). k = 0 is concurrent (h_n is computed after the heads of step n attended), so only k ≥ 1
    is "ahead". The intervals are per lag, not corrected for testing several lags, and split-to-split
    spread understates the sampling error over prompts. The residualised CCA is quoted beside it."""
    def ks_above(diffs, metric):
        part = diffs[(diffs["metric"] == metric) & (diffs["splits"] >= n_splits)]
        return [int(k) for k, low in zip(part["k"], part["vs_step_prior_low"]) if low > 0]

    def describe(diffs, metric, label):
        part = diffs[diffs["metric"] == metric].set_index("k")
        cells = "; ".join(f"k = {k}: {part.loc[k, 'vs_step_prior']:+.3f} [{part.loc[k, 'vs_step_prior_low']:+.3f}, "
                          f"{part.loc[k, 'vs_step_prior_high']:+.3f}], n = {int(part.loc[k, 'splits'])}"
                          for k in part.index)
        return f"{label} probe − step-aware prior, {metric.upper()} (95% t-interval, n = splits): {cells}"

    def reach(diffs, metric, what):
        above = ks_above(diffs, metric)
        tested = sorted(int(k) for k in diffs[diffs["metric"] == metric]["k"] if k >= 1)
        ahead = [k for k in above if k >= 1]
        if ahead:
            return (f"{what} better than the step index alone at {len(ahead)} of the {len(tested)} lags k ≥ 1 "
                    f"tested (k ∈ {{{', '.join(map(str, ahead))}}})")
        if 0 in above:
            return f"{what} better than the step index alone only concurrently (k = 0), at no lag ahead"
        return f"{what} no better than the step index alone at any lag"

    def resid(summary, k=0):
        row = summary[(summary["control"] == "held-out, residualised") & (summary["k"] == k)]
        chance = summary[(summary["control"] == "held-out, residualised, chance") & (summary["k"] == k)]
        if row.empty or chance.empty:
            return "not computed"
        r, c = row.iloc[0], chance.iloc[0]
        return (f"{r['first']:.3f} [{r['first_low']:.3f}, {r['first_high']:.3f}] against a chance pairing of "
                f"{c['first']:.3f} [{c['first_low']:.3f}, {c['first_high']:.3f}]")

    return (reach(niah_diffs, "f1", "The hidden state predicts the NIAH Eq. 1 sets") + "; "
            + reach(hotpot_diffs, "r2", f"it predicts the {hotpot_name} Eq. 2 scores") + ". "
            + describe(niah_diffs, "f1", "NIAH") + ". " + describe(hotpot_diffs, "r2", hotpot_name) + ". "
            "The step-aware prior knows neither the tokens nor the prompt, so at k ≥ 1 part of a probe's gain can be "
            "the next token, which the hidden state already determines under greedy decoding. "
            f"With the step index and the tokens read at steps n and n + k regressed out of both sides, the held-out "
            f"first canonical correlation at k = 0 is {resid(niah_resid)} (NIAH) and {resid(hotpot_resid)} "
            f"({hotpot_name}).")


def with_paper_row(table: pd.DataFrame, which: str) -> pd.DataFrame:
    """Table 2 or 3 with the paper's Llama-3.1-8B-Instruct row appended, labelled as the paper's."""
    paper = PAPER_TABLE2_LLAMA31_8B if which == "table2" else PAPER_TABLE3_LLAMA31_8B
    row = {column: np.nan for column in table.columns}
    row.update({"predictor": "MLP probe, Llama-3.1-8B-Instruct (paper)", **paper})
    return pd.concat([table, pd.DataFrame([row])], ignore_index=True)


def summary_markdown(cca_niah: pd.DataFrame, cca_hotpot: pd.DataFrame, table2: pd.DataFrame,
                     table3: pd.DataFrame, model_label: str) -> str:
    def leading(frame, control, k):  # the first canonical pair's correlation
        row = frame[(frame["control"] == control) & (frame["k"] == k)]
        return float(row["first"].iloc[0]) if len(row) else float("nan")

    lines = [f"**Model:** {model_label}."]
    k_last = int(cca_niah["k"].max())
    ins0, held0, shuf0 = leading(cca_niah, "in-sample", 0), leading(cca_niah, "held-out", 0), leading(cca_niah, "shuffled", 0)
    lines.append(
        f"- **NIAH CCA** (first canonical correlation, k = 0 → {k_last}): in-sample {ins0:.3f} → "
        f"{leading(cca_niah, 'in-sample', k_last):.3f}; held-out {held0:.3f} → {leading(cca_niah, 'held-out', k_last):.3f}; "
        f"shuffled pairing {shuf0:.3f} → {leading(cca_niah, 'shuffled', k_last):.3f}. Paper (in-sample, Llama-3.1-8B): "
        f"{PAPER_FIG4[0]} → {PAPER_FIG4[min(k_last, 10)]}. "
        + ("The held-out correlation stays well above the shuffled baseline, so the hidden state carries real "
           "information about upcoming retrieval heads." if held0 > shuf0 + 0.1 else
           "The held-out correlation is not clearly above the shuffled baseline: on this model the in-sample CCA "
           "is mostly overfitting, and the paper's claim is not supported here."))
    same0 = leading(cca_niah, "shuffled, same step", 0)
    if same0 == same0:
        lines.append(
            f"- **Position control**: pairing with other samples' scores *at the same step* gives {same0:.3f} → "
            f"{leading(cca_niah, 'shuffled, same step', k_last):.3f}. "
            + ("Held-out stays above it, so the signal is more than the position in the answer."
               if held0 > same0 + 0.05 else
               "Held-out is not above it: much of the correlation is explained by the position in the answer alone."))
    lines.append(
        f"- **HotpotQA CCA** (k = 0 → {k_last}): in-sample {leading(cca_hotpot, 'in-sample', 0):.3f} → "
        f"{leading(cca_hotpot, 'in-sample', k_last):.3f}, held-out {leading(cca_hotpot, 'held-out', 0):.3f} → "
        f"{leading(cca_hotpot, 'held-out', k_last):.3f}, shuffled {leading(cca_hotpot, 'shuffled', 0):.3f} → "
        f"{leading(cca_hotpot, 'shuffled', k_last):.3f} (paper Fig 8: {PAPER_FIG8[0]} → {PAPER_FIG8[10]}).")
    t2 = table2.set_index("predictor")
    lines.append(
        f"- **Table 2 (NIAH probe)**: MLP F1 {t2.loc['MLP probe', 'f1']:.3f} / AUPRC {t2.loc['MLP probe', 'auprc']:.3f}; "
        f"linear {t2.loc['linear probe', 'f1']:.3f}; static-frequency prior {t2.loc['static-frequency prior', 'f1']:.3f} "
        f"(paper, Llama-3.1-8B: F1 {PAPER_TABLE2_LLAMA31_8B['f1']}, AUPRC {PAPER_TABLE2_LLAMA31_8B['auprc']}). "
        + ("The probe beats the prior." if t2.loc['MLP probe', 'f1'] > t2.loc['static-frequency prior', 'f1'] + 0.02
           else "The probe does not beat the static prior, so it adds nothing beyond each head's base rate here."))
    step_f1, probe_f1 = t2.loc['step-aware prior', 'f1'], t2.loc['MLP probe', 'f1']
    lines.append(
        f"- **Position control for Table 2**: a step-aware prior (each head's rate at that step index, no hidden "
        f"state) gets F1 {step_f1:.3f} / AUPRC {t2.loc['step-aware prior', 'auprc']:.3f}. "
        + ("The probe beats it, so the hidden state carries more than the position in the answer."
           if probe_f1 > step_f1 + 0.02 else
           "The probe does not beat it: what the probe predicts is largely the position in the answer."))
    t3 = table3.set_index("predictor")
    lines.append(
        f"- **Table 3 (HotpotQA probe)**: MLP R² {t3.loc['MLP probe', 'r2']:.3f}, linear {t3.loc['linear probe', 'r2']:.3f}, "
        f"prior {t3.loc['static-frequency prior', 'r2']:.3f}, step-aware prior {t3.loc['step-aware prior', 'r2']:.3f} "
        f"(paper, Llama-3.1-8B: {PAPER_TABLE3_LLAMA31_8B['r2']}).")
    return "\n".join(lines)
