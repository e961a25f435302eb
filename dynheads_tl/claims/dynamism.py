"""Claim 1 — retrieval heads are dynamic (Table 1, Fig 1, Fig 5, the long tail, robustness).

Static heads come from a calibration split; the dynamic analysis uses different samples. NIAH uses
Eq. 1 (D_t = heads whose top-1 source is the needle token being generated); HotpotQA uses Eq. 2
(D_t = heads whose share of attention on supporting facts exceeds a cutoff: by default c x chance, c calibrated
on placebo spans of the calibration split (:func:`eq2_calibration`); the paper's fixed threshold as an option).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from dynheads_tl.config import (RunSettings, Eq2Selection, NotebookConfig, StaticSource, check_int_list, check_ints,
                                check_open_unit)
from dynheads_tl.corpus import TraceSets, calibrated_eq2_rule, hotpot_traces, niah_traces
from dynheads_tl.engine.models import DEFAULT_MODEL
from dynheads_tl.analysis.scoring import (
    activation_frequency, adjacent_counts, copyable_steps, dynamic_sets, dynamism_metrics, eq2_rule_curve, head_churn_counts,
    size_aware_counts,
    size_aware_metrics, soft_sets, static_eq2_scores, static_retrieval_scores, static_top_k,
)
from dynheads_tl.analysis.statistics import bootstrap_interval, ratio_of_sums, wilson_interval
from dynheads_tl.engine.equations import Eq2Rule, head_labels
from dynheads_tl.engine.tracing import Trace
from dynheads_tl.tasks import exact_match, load_hotpot_records, niah_accuracy, token_f1

logger = logging.getLogger(__name__)

# The paper's Table 1 row for Llama-3.1-8B-Instruct (NIAH), for side-by-side display.
PAPER_TABLE1_LLAMA31_8B = {
    "jaccard_static": 0.3512, "jaccard_adjacent": 0.2793, "entropy": 3.8154,
    "heads_per_step_mean": 12.97, "heads_per_step_sd": 7.69, "ever_active": 238, "n_heads": 1024,
}


@dataclass
class DynamismConfig(StaticSource, Eq2Selection, TraceSets, RunSettings, NotebookConfig):
    """The claim 1 notebook's parameters, validated: the shared trace sets (:class:`~dynheads_tl.corpus.TraceSets`)
    plus claim 1's own. Field comments are in the notebook."""

    model: str = DEFAULT_MODEL
    static_k: int = 20
    static_sizes: list[int] = field(default_factory=lambda: [20, 50, 100])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    setting_haystacks: list[str] = field(default_factory=lambda: ["filler", "prose"])
    setting_contexts: list[int] = field(default_factory=lambda: [500, 1000])
    n_setting: int = 50
    n_setting_calibration: int = 8
    copy_thresholds: list[float] = field(default_factory=lambda: [0.1, 0.3, 0.5])
    soft_threshold: float = 0.3
    output_dir: str = "papers_figures"

    def __post_init__(self):
        super().__post_init__()
        check_ints(self, ("static_k", "n_setting", "n_setting_calibration"))
        check_open_unit(self, "soft_threshold")
        check_int_list(self, "seeds")
        check_int_list(self, "static_sizes", minimum=1)
        check_int_list(self, "setting_contexts", minimum=32)
        if (not isinstance(self.setting_haystacks, list) or not self.setting_haystacks
                or not all(isinstance(h, str) for h in self.setting_haystacks)):
            raise ValueError(f"Parameter 'setting_haystacks' must be a non-empty list of haystack specs, got {self.setting_haystacks!r}.")
        if (not isinstance(self.copy_thresholds, list) or not self.copy_thresholds
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1 for v in self.copy_thresholds)):
            raise ValueError(f"Parameter 'copy_thresholds' must be a non-empty list of values in (0, 1), got {self.copy_thresholds!r}.")
        if not any(abs(float(self.soft_threshold) - float(t)) < 1e-12 for t in self.copy_thresholds):
            raise ValueError(f"Parameter 'soft_threshold' ({self.soft_threshold!r}) must be one of copy_thresholds "
                             f"{self.copy_thresholds!r}: the verdict reads the table at that threshold.")

    @property
    def settings(self) -> list[tuple[str, int]]:
        """The (haystack, context length) settings of the soft-dynamism section."""
        return [(haystack, context) for haystack in self.setting_haystacks for context in self.setting_contexts]

    def check_inputs(self) -> None:
        """The haystack, the HotpotQA file and the NIAH length against the model's window, before any model work."""
        from dynheads_tl.config import model_context_window
        from dynheads_tl.tasks import check_context_fits, check_haystack, check_hotpot_source

        window = model_context_window(self.model)
        check_context_fits(self.context_tokens, self.max_new_tokens, window, name="context_tokens")
        check_haystack(self.haystack)
        self.check_static_source()
        for haystack in self.setting_haystacks:
            check_haystack(haystack)
        check_context_fits(self.setting_contexts, self.max_new_tokens, window, name="setting_contexts")
        # A file's calibration split is its first n_hotpot // 2 records and the analysis split the n_hotpot after
        # the first n_hotpot (see _hotpot_records), so 2 * n_hotpot usable records are needed.
        check_hotpot_source(self.hotpot_source, 2 * self.n_hotpot, skip_incomplete=self.hotpot_skip_incomplete,
                            needed_for=f"calibration {max(self.n_hotpot // 2, 1)} + analysis {self.n_hotpot}, "
                                       f"the analysis split starting at record {self.n_hotpot}")


@dataclass
class TaskResult:
    task: str
    seed: int
    calibration: list[Trace]
    analysis: list[Trace]
    static_scores: torch.Tensor
    step_sets: list[torch.Tensor]
    metrics: dict[str, float]
    quality: dict[str, float]
    eq2_rule: Eq2Rule | None = None  # HotpotQA: the rule that marked D_t

    def static_mask(self, k: int) -> torch.Tensor:
        return static_top_k(self.static_scores, min(k, self.static_scores.numel()))


def analyse_task(task: str, calibration: list[Trace], analysis: list[Trace], config: DynamismConfig,
                 seed: int, eq2_rule: Eq2Rule | None = None) -> TaskResult:
    """One task of one seed. HotpotQA's D_t are marked by ``eq2_rule`` (which the chance rule must pass: its factor
    is calibrated by :func:`eq2_calibration`; the fixed rule defaults to the config's threshold)."""
    if task == "hotpot" and eq2_rule is None and config.eq2_rule == "chance":
        raise ValueError("eq2_rule='chance' needs the calibrated rule: pass eq2_calibration(model, config)[0].")
    eq2_rule = eq2_rule or Eq2Rule("fixed", config.eq2_threshold)
    override = config.static_override()  # static_source: a head-score file replaces the calibration's scores
    if task == "niah":
        scores = static_retrieval_scores(calibration, rouge_filter=0.5) if override is None else override
        sets = [dynamic_sets(t, "eq1") for t in analysis]
        quality = {"accuracy": float(np.mean([niah_accuracy(t.response, t.answers[0]) for t in analysis]))}
    else:
        scores = static_eq2_scores(calibration) if override is None else override
        sets = [dynamic_sets(t, "eq2", eq2_rule) for t in analysis]
        quality = {"em": float(np.mean([exact_match(t.response, t.answers[0]) for t in analysis])),
                   "f1": float(np.mean([token_f1(t.response, t.answers[0]) for t in analysis]))}
    static = static_top_k(scores, min(config.static_k, scores.numel()))
    metrics = dynamism_metrics(sets, static)
    return TaskResult(task, seed, calibration, analysis, scores, sets, metrics, quality,
                      eq2_rule if task == "hotpot" else None)


def eq2_calibration(model, config: DynamismConfig) -> tuple[Eq2Rule, pd.DataFrame]:
    """Eq. 2's selection rule for this config (:func:`~dynheads_tl.corpus.calibrated_eq2_rule` over the seeds'
    HotpotQA calibration splits) and, for the chance rule, the curve that justifies its factor
    (:func:`~dynheads_tl.analysis.scoring.eq2_rule_curve`: marked rates on real and placebo evidence, |D_t| and
    heads ever active, per factor; empty for the fixed rule)."""
    rule, real, placebo = calibrated_eq2_rule(model, TraceSets.of(config), config.seeds, rule=config.eq2_rule,
                                              threshold=config.eq2_threshold, false_rate=config.eq2_false_rate)
    if rule.kind == "fixed":
        return rule, pd.DataFrame()
    factors = sorted({*np.round(np.geomspace(1.0, 64.0, 25), 3).tolist(), float(rule.value)})
    curve = eq2_rule_curve(real, placebo, factors)
    curve["chosen"] = curve["factor"] == float(rule.value)
    fixed = dynamism_fixed_threshold_row(real, config.eq2_threshold)
    curve.attrs.update(rule=rule, false_rate=config.eq2_false_rate, fixed=fixed, fixed_threshold=config.eq2_threshold,
                       n_samples=len(real), n_steps=sum(t.n_steps for t in real))
    return rule, curve


def eq2_rule_sentence(rule: Eq2Rule, curve: pd.DataFrame) -> str:
    """The Eq. 2 selection rule in computed sentences: the factor, what it marks on real and placebo evidence, and
    the fixed threshold beside it."""
    if rule.kind == "fixed" or curve.empty:
        return f"Eq. 2 marks a head when its share exceeds the fixed threshold {rule.value:g} (not calibrated)."
    chosen = curve[curve["chosen"]].iloc[0]
    fixed, attrs = curve.attrs["fixed"], curve.attrs
    ratio = chosen["real_rate"] / chosen["placebo_rate"] if chosen["placebo_rate"] > 0 else float("nan")
    return (f"Eq. 2 marks a head when its share of attention on the supporting facts exceeds {rule.value:.2f} x chance "
            f"(chance: the facts' share of the eligible positions). The factor is the one at which heads reading "
            f"placebo spans (the facts moved to random context positions of the same sizes) are marked on "
            f"{100 * attrs['false_rate']:g}% of head-steps, over n = {attrs['n_samples']} calibration samples "
            f"({attrs['n_steps']} steps). On the real facts the rule marks {100 * chosen['real_rate']:.1f}% of "
            f"head-steps, {ratio:.1f} times its rate on placebo spans: {chosen['heads_per_step']:.1f} heads per step, {int(chosen['heads_ever_active'])} heads ever "
            f"active. The fixed threshold {attrs['fixed_threshold']:g} marks {fixed['heads_per_step']:.1f} heads per "
            f"step and {fixed['heads_ever_active']} ever active on the same samples.")


def dynamism_fixed_threshold_row(traces: list[Trace], threshold: float) -> dict[str, float]:
    """Mean |D_t| and heads ever active under the fixed threshold, for comparison beside the calibrated rule."""
    sets = [dynamic_sets(t, "eq2", threshold) for t in traces]
    return {"heads_per_step": float(torch.cat([s.flatten(1).sum(1) for s in sets]).float().mean()),
            "heads_ever_active": int(torch.stack([s.any(0) for s in sets]).any(0).sum())}


def run_claim1(model, config: DynamismConfig, eq2_rule: Eq2Rule | None = None) -> dict[str, list[TaskResult]]:
    """Every seed, both tasks. Returns {"niah": [per seed], "hotpot": [per seed]}. HotpotQA's D_t use
    ``eq2_rule`` (default: :func:`eq2_calibration`'s)."""
    eq2_rule = eq2_rule or eq2_calibration(model, config)[0]
    results: dict[str, list[TaskResult]] = {"niah": [], "hotpot": []}
    for seed in config.seeds:
        cal, ana = niah_traces(model, TraceSets.of(config), seed)
        results["niah"].append(analyse_task("niah", cal, ana, config, seed))
        cal, ana = hotpot_traces(model, TraceSets.of(config), seed)
        results["hotpot"].append(analyse_task("hotpot", cal, ana, config, seed, eq2_rule))
    if config.hotpot_source != "synthetic":  # a file or "hf": say how many incomplete records were left out
        skipped = records_skipped(config.hotpot_source, config.hotpot_skip_incomplete)
        for result in results["hotpot"]:
            result.quality["records_skipped"] = skipped
    return results


def records_skipped(source: str, skip_incomplete: bool) -> int:
    """How many records of a HotpotQA file were left out as incomplete (supporting paragraphs missing
    from their context; see :func:`dynheads_tl.tasks.load_hotpot_records`), for reporting beside results."""
    return load_hotpot_records(source, skip_incomplete=skip_incomplete).skipped


# --- tables ----------------------------------------------------------------------------------
TABLE1_COLUMNS = ["jaccard_static", "jaccard_adjacent", "entropy", "entropy_ref_ln20",
                  "heads_per_step_mean", "heads_per_step_sd", "ever_active", "n_heads", "n_steps"]


def table1(result: TaskResult, model_label: str, include_paper: bool) -> pd.DataFrame:
    row = {"model": model_label, "task": result.task, **{k: result.metrics[k] for k in TABLE1_COLUMNS},
           **result.quality}
    rows = [row]
    if include_paper:
        rows.append({"model": "Llama-3.1-8B-Instruct (paper)", "task": "niah", **PAPER_TABLE1_LLAMA31_8B,
                     "entropy_ref_ln20": float(np.log(20))})
    return pd.DataFrame(rows)


def _table1_sample_stats(sets: torch.Tensor, static: torch.Tensor) -> dict[str, np.ndarray | float]:
    """One sample's sufficient statistics for Table 1 (sums over its steps; see dynamism_metrics)."""
    flat, static_flat = sets.flatten(1), static.flatten()
    sizes = flat.sum(1).double()
    active = sizes > 0
    inter = (flat & static_flat).sum(1).double()
    union = (flat | static_flat).sum(1).double()
    adjacent = adjacent_counts(sets)
    return {"static_sum": float((inter[active] / union[active]).sum()), "static_n": float(active.sum()),
            "adjacent_sum": adjacent["jaccard_sum"], "adjacent_n": adjacent["pairs"],
            "size_sum": float(sizes.sum()), "size_sq": float((sizes ** 2).sum()), "steps": float(len(sizes)),
            "counts": flat.double().sum(0).numpy()}


def table1_intervals(results: list[TaskResult], static_k: int = 20, *, n_resamples: int = 2000,
                     seed: int = 0) -> pd.DataFrame:
    """Table 1's metrics with 95% percentile-bootstrap intervals that resample analysis samples (each metric
    recomputed from the resampled samples' pooled steps, as Table 1 pools them). ``results`` of several seeds
    are pooled, each sample against its own seed's static top-``static_k``.

    ``ever_active`` and ``entropy`` count distinct heads, and a resample repeats some samples and drops others,
    so their bootstrap draws lean low: their intervals show the spread over samples, not an unbiased range."""
    stats = [_table1_sample_stats(sets, result.static_mask(static_k)) for result in results for sets in result.step_sets]
    if not stats:
        raise ValueError("table1_intervals needs at least one analysis sample.")
    scalar = {name: np.array([s[name] for s in stats]) for name in stats[0] if name != "counts"}
    counts = np.stack([s["counts"] for s in stats])  # [sample, head]

    def metrics(index: np.ndarray) -> dict[str, float]:
        total = lambda name: scalar[name][index].sum()
        ratio = lambda a, b: total(a) / total(b) if total(b) > 0 else float("nan")
        pooled = counts[index].sum(0)
        p = pooled[pooled > 0] / pooled.sum() if pooled.sum() > 0 else np.array([])
        mean = ratio("size_sum", "steps")
        return {"jaccard_static": ratio("static_sum", "static_n"), "jaccard_adjacent": ratio("adjacent_sum", "adjacent_n"),
                "entropy": float(-(p * np.log(p)).sum()) if len(p) else 0.0,
                "heads_per_step_mean": mean,
                "heads_per_step_sd": float(np.sqrt(max(ratio("size_sq", "steps") - mean ** 2, 0.0))),
                "ever_active": float((pooled > 0).sum())}

    everything = np.arange(len(stats))
    estimate = metrics(everything)
    rng = np.random.default_rng(seed)
    draws = [metrics(rng.integers(0, len(stats), len(stats))) for _ in range(n_resamples)]
    rows = []
    for name, value in estimate.items():
        values = np.array([d[name] for d in draws])
        values = values[~np.isnan(values)]
        low, high = (np.quantile(values, [0.025, 0.975]) if len(values) else (float("nan"), float("nan")))
        rows.append({"task": results[0].task, "metric": name, "value": value, "low": float(low), "high": float(high),
                     "n_samples": len(stats), "n_seeds": len(results)})
    return pd.DataFrame(rows)


def static_size_sweep(result: TaskResult, sizes: list[int]) -> pd.DataFrame:
    """Jaccard(D_t, static top-k) for each k (clamped to the number of heads)."""
    rows = []
    for k in sizes:
        k_eff = min(k, result.static_scores.numel())
        metrics = dynamism_metrics(result.step_sets, result.static_mask(k_eff))
        rows.append({"task": result.task, "static_k": k, "static_k_used": k_eff,
                     "jaccard_static": metrics["jaccard_static"]})
    return pd.DataFrame(rows)


def seed_robustness(results: list[TaskResult]) -> pd.DataFrame:
    """Mean ± sd over seeds of every Table 1 metric."""
    frame = pd.DataFrame([{**r.metrics, **r.quality, "seed": r.seed} for r in results])
    columns = [c for c in frame.columns if c not in ("seed", "entropy_ref_ln20", "n_heads")]
    return pd.DataFrame({
        "metric": columns,
        "mean": [frame[c].mean() for c in columns],
        "sd": [frame[c].std(ddof=1) if len(frame) > 1 else float("nan") for c in columns],
        "n_seeds": len(frame),
    })


def frequency_frame(result: TaskResult, static_k: int) -> pd.DataFrame:
    freq = activation_frequency(result.step_sets)
    static = result.static_mask(static_k)
    layers, heads = freq.shape
    return pd.DataFrame([
        {"layer": l, "head": h, "frequency": float(freq[l, h]), "static_top20": bool(static[l, h]),
         "static_score": float(result.static_scores[l, h])}
        for l in range(layers) for h in range(heads)
    ])


def heatmap_data(result: TaskResult, tokenizer, n_heads: int = 10, sample_index: int | None = None):
    """Fig 1 / Fig 5: the ``n_heads`` heads whose per-step score varies most over one answer.

    NIAH: heads ranked by the variance of their Eq. 1 indicator over the answer's steps; the colour
    is each head's share of attention on the needle, dots mark Eq. 1 hits. HotpotQA: heads ranked by
    the variance of their Eq. 2 score, which is also the colour. The sample shown is the analysis trace with the
    most Eq. 1 hits (NIAH) or the most steps (HotpotQA), unless ``sample_index`` is given.
    """
    traces = result.analysis
    if sample_index is None:
        key = (lambda t: int(t.retrieval_mask.sum())) if result.task == "niah" else (lambda t: t.n_steps)
        sample_index = max(range(len(traces)), key=lambda i: key(traces[i]))
    trace = traces[sample_index]
    scores = trace.support_score.flatten(1)  # [step, layer*head]
    variance = scores.var(0, unbiased=False) if trace.n_steps > 1 else scores[0]
    if result.task == "niah":
        # Rank by how much the Eq. 1 indicator itself varies (a head retrieving at some steps and not
        # at others), the evidence-share variance only breaking ties.
        hits_all = trace.retrieval_mask.flatten(1).float()
        variance = hits_all.var(0, unbiased=False) + 1e-3 * variance
    top = torch.argsort(variance, descending=True, stable=True)[:n_heads]
    labels = head_labels(top.tolist(), trace.n_heads)
    tokens = [tokenizer.decode([int(t)]).replace("\n", "\\n").replace(" ", "␣") or "∅" for t in trace.tokens]
    matrix = scores[:, top].T.numpy()
    hits = trace.retrieval_mask.flatten(1)[:, top].T.numpy() if result.task == "niah" else None
    rows = []
    for r, label in enumerate(labels):
        for c, tok in enumerate(tokens):
            rows.append({"head": label, "step": c, "token": tok, "score": float(matrix[r, c]),
                         **({"eq1": bool(hits[r, c])} if hits is not None else {})})
    return matrix, hits, tokens, labels, pd.DataFrame(rows), sample_index


def size_aware_table(results: list[TaskResult], sizes: list[int]) -> pd.DataFrame:
    """Beside the paper's Jaccard, per static size k: the Jaccard bound that set sizes allow, Jaccard over
    that bound, static coverage |D_t ∩ S_k| / |D_t| and the share of activations inside / outside S_k.
    Analysis samples of every seed are pooled (each measured against its own seed's static set); 95%
    intervals are percentile bootstraps over those samples."""
    rows = []
    for k in sizes:
        per_sample = []
        for result in results:
            static = result.static_mask(k)
            per_sample += [size_aware_counts(sets, static) for sets in result.step_sets]
        for row in size_aware_metrics(per_sample):
            rows.append({"task": results[0].task, "static_k": min(k, results[0].static_scores.numel()), **row})
    return pd.DataFrame(rows)


OUTSIDE_READINGS = ("stays inside", "substantial share outside", "mostly inside", "not determined")


def outside_category(outside) -> str | None:
    """The reading of the 95% interval of the share of activations outside S_k (see :func:`size_aware_verdict`):
    one of :data:`OUTSIDE_READINGS`, or None when the share is undefined."""
    if outside["value"] != outside["value"] or outside["high"] != outside["high"]:
        return None
    if outside["high"] < 0.10:
        return "stays inside"
    if outside["low"] > 0.25:
        return "substantial share outside"
    if outside["high"] < 0.5:
        return "mostly inside"
    return "not determined"


def outside_reading(outside, k: int) -> str | None:
    return {"stays inside": f"retrieval stays inside the static top-{k}: the per-step sets rotate within it",
            "substantial share outside": f"a substantial share of retrieval happens outside the static top-{k}",
            "mostly inside": f"retrieval happens mostly, but not only, inside the static top-{k}",
            "not determined": f"these samples do not determine how much retrieval leaves the static top-{k}",
            None: None}[outside_category(outside)]


def size_aware_verdict(table: pd.DataFrame, k: int = 20, *, task_label: str | None = None) -> str:
    """One computed sentence: is the per-step set a rotation inside the static top-k, or does retrieval
    leave it? Quoted with its intervals.

    Reading, from the 95% interval of the share of activations outside S_k: upper bound below 0.10 →
    retrieval stays inside S_k (the per-step sets rotate within it); lower bound above 0.25 → a substantial
    share leaves S_k; upper bound below 0.5 → mostly inside; anything else (or an undefined share) → not
    determined by these samples."""
    part = table[table["static_k"] == k].set_index("metric")
    if part.empty:
        return f"No size-aware metrics for the static top-{k}."
    label = task_label or task_name(table)
    get = lambda m: part.loc[m]
    fmt = lambda m: f"{get(m)['value']:.3f} [{get(m)['low']:.3f}, {get(m)['high']:.3f}]"
    outside = get("share_outside_static")
    n = int(get("static_coverage")["n_samples"])
    equation = "Eq. 1" if table["task"].iloc[0] == "niah" else "Eq. 2"
    reading = outside_reading(outside, k)
    if reading is None:
        return f"{label}: the share of {equation} activations outside the static top-{k} is undefined here (no activations)."
    return (f"{label}: {fmt('share_outside_static')} of all {equation} activations fall outside the static "
            f"top-{k}; per-step coverage |D_t ∩ S_{k}| / |D_t| is {fmt('static_coverage')}; the Jaccard "
            f"{fmt('jaccard_static')} is {fmt('jaccard_over_bound')} of the largest value the set sizes allow "
            f"({fmt('jaccard_bound')}). So {reading} (95% bootstrap intervals over {n} analysis samples).")


# --- soft dynamism over settings with random layouts (beyond the paper) ---------------------------
@dataclass
class SettingResult:
    """One (haystack, context length) setting: its traces (with evidence attention), static scores and accuracy."""

    haystack: str
    context: int
    calibration: list[Trace]
    analysis: list[Trace]
    static_scores: torch.Tensor | None  # None when no calibration answer passed Wu et al.'s filter

    @property
    def label(self) -> str:
        from pathlib import Path

        name = self.haystack if not self.haystack.startswith("folder:") else f"folder:{Path(self.haystack[7:]).name}"
        return f"{name} {self.context}"

    def static_mask(self, k: int) -> torch.Tensor | None:
        if self.static_scores is None:
            return None
        return static_top_k(self.static_scores, min(k, self.static_scores.numel()))


def run_settings(model, config: DynamismConfig) -> list[SettingResult]:
    """Trace every (haystack, context) setting of ``config.settings`` with the headline seed."""
    from dynheads_tl.corpus import layout_traces

    results = []
    for haystack, context in config.settings:
        calibration, analysis = layout_traces(
            model, config, haystack=haystack, context_tokens=context, n_calibration=config.n_setting_calibration,
            n_analysis=config.n_setting, seed=config.seeds[0], use_cache=config.use_cache,
            batch_size=config.trace_batch_size)
        try:
            override = config.static_override()  # static_source: the file's scores in every setting
            scores = static_retrieval_scores(calibration, rouge_filter=0.5) if override is None else override
        except ValueError:  # no calibration answer reproduced the needle: no static set for this setting
            logger.warning("Setting %s %s: no calibration sample passed the ROUGE filter; static metrics are NaN.",
                           haystack, context)
            scores = None
        results.append(SettingResult(haystack, context, calibration, analysis, scores))
    return results


def soft_definitions(config: DynamismConfig) -> list[tuple[str, float | None]]:
    """Eq. 1, then copy mass and evidence mass above each of ``config.copy_thresholds``."""
    return ([("eq1", None)] + [("copy", t) for t in config.copy_thresholds]
            + [("evidence", t) for t in config.copy_thresholds])


def definition_label(kind: str, threshold: float | None) -> str:
    return "Eq. 1 (argmax)" if kind == "eq1" else f"{kind} mass > {threshold:g}"


# Per-sample sums -> pooled ratios (see scoring.adjacent_counts / size_aware_counts).
SOFT_METRICS = {
    "jaccard_adjacent": ("jaccard_sum", "pairs"),   # mean J(D_t, D_t+1)
    "persistence": ("kept", "left"),                # share of a step's heads still active at the next step
    "heads_per_step": ("size_sum", "steps"),
    "ever_active_per_sample": ("ever", "one"),       # heads active at least once in a sample, mean over samples
    "static_coverage": ("coverage_sum", "active_steps"),  # |D_t ∩ S_k| / |D_t|
    "share_outside_static": ("outside", "activations"),
}


def _sample_counts(trace: Trace, kind: str, threshold: float | None, static: torch.Tensor | None) -> dict[str, float]:
    """One sample's sums for :data:`SOFT_METRICS`, over the steps whose token occurs in the needle
    (:func:`~dynheads_tl.analysis.scoring.copyable_steps`; pairs: two such steps in a row)."""
    sets = soft_sets(trace, kind, threshold if threshold is not None else 0.5)
    valid = copyable_steps(trace)
    counts = {**adjacent_counts(sets, valid), "one": 1.0}
    if static is not None:
        size = size_aware_counts(sets[valid], static)
        counts.update(coverage_sum=size["coverage_sum"], active_steps=size["steps"],
                      outside=size["activations"] - size["inside"], activations=size["activations"])
    else:
        counts.update(coverage_sum=float("nan"), active_steps=float("nan"), outside=float("nan"),
                      activations=float("nan"))
    return counts


def _pooled(per_sample: list[dict[str, float]], metric: str, seed: int = 0) -> dict[str, float]:
    """A ratio of sums pooled over samples, with a bootstrap interval over samples; samples without the metric
    (no static set in their setting) are left out, and n counts the samples used."""
    numerator, denominator = SOFT_METRICS[metric]
    values = np.array([[c[numerator], c[denominator]] for c in per_sample], dtype=float)
    values = values[~np.isnan(values).any(1)]
    if len(values) == 0:
        return {"value": float("nan"), "low": float("nan"), "high": float("nan"), "n_samples": 0}
    interval = bootstrap_interval(values, ratio_of_sums, seed=seed)
    return {"value": interval.estimate, "low": interval.low, "high": interval.high, "n_samples": interval.n}


def soft_dynamism_table(settings: list[SettingResult], config: DynamismConfig) -> pd.DataFrame:
    """Table 1's dynamism metrics for Eq. 1 and for copy / evidence mass above each threshold, per setting and
    pooled over settings ("all"), each a ratio pooled over analysis samples with a 95% bootstrap interval over
    samples. Only steps whose generated token occurs in the needle count (elsewhere Eq. 1 and copy mass are
    empty by definition). Static metrics use each setting's own static top-``static_k``; settings without one
    are left out of the pooled static metrics (``n_samples`` says how many samples each number uses)."""
    rows = []
    pooled: dict[tuple, list] = {}
    for setting in settings:
        static = setting.static_mask(config.static_k)
        for kind, threshold in soft_definitions(config):
            per_sample = [_sample_counts(t, kind, threshold, static) for t in setting.analysis]
            pooled.setdefault((kind, threshold), []).extend(per_sample)
            for metric in SOFT_METRICS:
                rows.append({"setting": setting.label, "definition": definition_label(kind, threshold), "kind": kind,
                             "threshold": threshold, "metric": metric, **_pooled(per_sample, metric)})
    for (kind, threshold), per_sample in pooled.items():
        for metric in SOFT_METRICS:
            rows.append({"setting": "all", "definition": definition_label(kind, threshold), "kind": kind,
                         "threshold": threshold, "metric": metric, **_pooled(per_sample, metric)})
    return pd.DataFrame(rows)


def setting_accuracy(settings: list[SettingResult]) -> pd.DataFrame:
    """NIAH accuracy of each setting's analysis split, with a Wilson 95% interval."""
    rows = []
    for setting in settings:
        hits = sum(niah_accuracy(t.response, t.answers[0]) >= 1.0 for t in setting.analysis)
        interval = wilson_interval(int(hits), len(setting.analysis))
        steps = torch.cat([copyable_steps(t) for t in setting.analysis]).float()
        rows.append({"setting": setting.label, "haystack": setting.haystack, "context": setting.context,
                     "accuracy": interval.estimate, "low": interval.low, "high": interval.high, "n": interval.n,
                     "static_set": setting.static_scores is not None,
                     "copyable_step_share": float(steps.mean()) if len(steps) else float("nan")})
    return pd.DataFrame(rows)


def argmax_churn(settings: list[SettingResult], config: DynamismConfig) -> pd.DataFrame:
    """Of the times a head leaves the Eq. 1 set from step t to t + 1 (t + 1 generating a token that occurs in the
    needle), the share that still puts more than τ of its attention on the needle (evidence mass) or on the token
    being copied (copy mass) at t + 1, per setting and pooled; 95% bootstrap intervals over samples."""
    rows = []
    pooled: dict[tuple, list] = {}
    for setting in settings:
        for kind in ("evidence", "copy"):
            for threshold in config.copy_thresholds:
                per_sample = []
                for trace in setting.analysis:
                    counts = head_churn_counts(trace.retrieval_mask, soft_sets(trace, kind, threshold),
                                               copyable_steps(trace))
                    per_sample.append([counts["drops_still_reading"], counts["drops"]])
                pooled.setdefault((kind, threshold), []).extend(per_sample)
                rows.append(_churn_row(setting.label, kind, threshold, per_sample))
    for (kind, threshold), per_sample in pooled.items():
        rows.append(_churn_row("all", kind, threshold, per_sample))
    return pd.DataFrame(rows)


def _churn_row(label: str, kind: str, threshold: float, per_sample: list[list[float]]) -> dict:
    values = np.array(per_sample, dtype=float)
    interval = bootstrap_interval(values, ratio_of_sums)
    return {"setting": label, "still_reading": definition_label(kind, threshold), "kind": kind, "threshold": threshold,
            "drops": int(values[:, 1].sum()), "share": interval.estimate, "low": interval.low, "high": interval.high,
            "n_samples": interval.n}


def _soft_reading(eq1: pd.Series, readers: pd.Series) -> str:
    """Which reading the adjacent-step Jaccard intervals of the Eq. 1 set and the reading set support."""
    if any(x != x for x in (eq1["low"], readers["low"], eq1["high"], readers["high"])):
        return "undefined"
    if readers["low"] > eq1["high"]:
        return "argmax" if readers["low"] >= 0.7 else "both"
    if readers["high"] < eq1["low"]:
        return "readers"
    return "undetermined"


SOFT_READINGS = {
    "argmax": ("mostly only the argmax winner changes: the heads that read the needle stay largely the same from "
               "step to step (the reading set's interval lies above 0.7), while the Eq. 1 set changes"),
    "both": "both change: the set of heads reading the needle changes from step to step, but less than the Eq. 1 set",
    "readers": "the set of heads reading the needle changes more from step to step than the Eq. 1 set",
    "undetermined": "these samples cannot tell whether the set of heads reading the needle changes less than the Eq. 1 set",
    "undefined": "the adjacent-step Jaccard is undefined in these samples",
}


def soft_verdict(table: pd.DataFrame, churn: pd.DataFrame, threshold: float) -> str:
    """One computed sentence: does the set of heads that read the needle change from step to step, or only
    which of them wins the argmax? Pooled over settings ("all").

    The reading set (heads with evidence mass above ``threshold``) and the Eq. 1 set are compared on the 95%
    bootstrap intervals of their adjacent-step Jaccard: the reading set's interval wholly above the Eq. 1 set's,
    with its lower bound at least 0.7 → the readers are stable and mostly the argmax winner changes; wholly above
    but lower → both change, the readers less; wholly below → the readers change more; overlapping → not
    determined. The same reading is computed at every evidence-mass threshold in the table, and the sentence says
    whether it holds at all of them. Set sizes are stated, since a Jaccard between larger sets is larger by chance."""
    pooled = table[(table["setting"] == "all") & (table["metric"] == "jaccard_adjacent")]
    at = lambda part, kind, t: part[(part["kind"] == kind) & np.isclose(part["threshold"].astype(float), t)]
    eq1_rows = pooled[pooled["kind"] == "eq1"]
    readers, copy = at(pooled, "evidence", threshold), at(pooled, "copy", threshold)
    still = at(churn[churn["setting"] == "all"], "evidence", threshold) if not churn.empty else churn
    if eq1_rows.empty or readers.empty or copy.empty or still.empty:
        return f"No soft-dynamism results at threshold {threshold:g}."
    eq1, readers, copy, still = eq1_rows.iloc[0], readers.iloc[0], copy.iloc[0], still.iloc[0]
    fmt = lambda r, key="value": f"{r[key]:.2f} [{r['low']:.2f}, {r['high']:.2f}]"
    reading = _soft_reading(eq1, readers)
    if reading == "undefined":
        return "The adjacent-step Jaccard is undefined in these samples (too few steps whose token is in the needle)."
    others = {}
    for row in pooled[pooled["kind"] == "evidence"].itertuples():
        others[float(row.threshold)] = _soft_reading(eq1, pd.Series(row._asdict()))
    agree = all(r == reading for r in others.values())
    thresholds = ", ".join(f"{t:g}" for t in sorted(others))
    robustness = (f" The same reading holds at every evidence-mass threshold tested ({thresholds})." if agree else
                  " At other thresholds the reading differs: " + "; ".join(
                      f"> {t:g}: {SOFT_READINGS[r].split(':')[0]}" for t, r in sorted(others.items()) if r != reading) + ".")
    sizes = table[(table["setting"] == "all") & (table["metric"] == "heads_per_step")]
    small, large = at(sizes, "evidence", threshold), sizes[sizes["kind"] == "eq1"]
    size_text = ""
    if not small.empty and not large.empty:
        eq1_size, reader_size = large["value"].iloc[0], small["value"].iloc[0]
        favoured = "the reading set" if reader_size > eq1_size else "the Eq. 1 set"
        size_text = (f" The sets differ in size ({eq1_size:.1f} vs {reader_size:.1f} heads per step), and a Jaccard "
                     f"between larger sets is larger by chance alone, so the comparison favours {favoured}.")
    return (f"Pooled over {int(readers['n_samples'])} analysis samples, on steps whose token occurs in the needle: "
            f"adjacent-step Jaccard is {fmt(eq1)} for the Eq. 1 set, {fmt(readers)} for the heads with evidence mass "
            f"> {threshold:g} and {fmt(copy)} for copy mass > {threshold:g}; of {int(still['drops'])} exits from the "
            f"Eq. 1 set, {fmt(still, 'share')} still had evidence mass > {threshold:g} at the next step. So "
            f"{SOFT_READINGS[reading]} (95% bootstrap intervals over samples).{robustness}{size_text}")


def task_name(table: pd.DataFrame) -> str:
    return "NIAH" if table["task"].iloc[0] == "niah" else "HotpotQA"


def _fmt(x: float, digits: int = 3) -> str:
    return "nan" if x != x else f"{x:.{digits}f}"


def summary_markdown(results: dict[str, list[TaskResult]], sweep: pd.DataFrame, model_label: str) -> str:
    """The closing paragraph: our numbers beside the paper's, stated plainly, from the results."""
    niah = results["niah"][0]
    m, paper = niah.metrics, PAPER_TABLE1_LLAMA31_8B
    lines = [f"**Model:** {model_label} ({m['n_heads']} heads). **NIAH accuracy** on the analysis split: "
             f"{_fmt(niah.quality['accuracy'], 2)}."]
    lines.append(
        f"- **Jaccard with the static top-20**: {_fmt(m['jaccard_static'])} (paper, Llama-3.1-8B: "
        f"{paper['jaccard_static']}). A low Jaccard can come from small sets alone (|D_t| < 20); the size-aware "
        f"section says whether retrieval actually leaves the static set.")
    lines.append(
        f"- **Adjacent-step Jaccard**: {_fmt(m['jaccard_adjacent'])} (paper {paper['jaccard_adjacent']}). "
        + ("Consecutive steps share few heads: the set changes from token to token."
           if m["jaccard_adjacent"] < 0.3 else
           "Consecutive steps share roughly half of their heads: the set changes substantially from token to "
           "token, though less than in the paper." if m["jaccard_adjacent"] < 0.6 else
           "Consecutive steps share most heads here: the set is more stable than the paper reports."))
    lines.append(
        f"- **Entropy**: {_fmt(m['entropy'])} nats (paper {paper['entropy']}; a uniform top-20 gives ln 20 = 2.996). "
        + ("Activations spread over more heads than a fixed top-20 would allow."
           if m["entropy"] > np.log(20) else "Activations are more concentrated than a uniform top-20."))
    lines.append(
        f"- **Heads per step**: {_fmt(m['heads_per_step_mean'], 2)} ± {_fmt(m['heads_per_step_sd'], 2)}; "
        f"**ever active**: {m['ever_active']} of {m['n_heads']} "
        f"({100 * m['ever_active'] / m['n_heads']:.0f}%; paper {paper['ever_active']} of {paper['n_heads']}, 23%).")
    niah_sweep = sweep[sweep["task"] == "niah"].sort_values("static_k")
    values = niah_sweep["jaccard_static"].tolist()
    decreasing = all(b <= a + 1e-12 for a, b in zip(values, values[1:]))
    lines.append(
        "- **Wider static sets**: Jaccard " + ", ".join(
            f"top-{k}: {_fmt(v)}" for k, v in zip(niah_sweep["static_k_used"], values))
        + (". Widening the static set lowers the overlap, as the paper reports, but with |D_t| below k this is "
           "expected from set sizes alone (see the size bound in the size-aware section)." if decreasing else
           ". Unlike the paper, widening the static set does not monotonically lower the overlap here."))
    hot = results["hotpot"][0]
    rule = (hot.eq2_rule or Eq2Rule()).label()
    synthetic = all(str(t.meta.get("id", "")).startswith("synthetic-") for t in hot.analysis)
    lines.append(
        f"- **{'Synthetic ' if synthetic else ''}HotpotQA ({rule}; first seed, intervals in the interval table)**: Jaccard with static top-20 {_fmt(hot.metrics['jaccard_static'])}, "
        f"adjacent {_fmt(hot.metrics['jaccard_adjacent'])}, entropy {_fmt(hot.metrics['entropy'])}, "
        f"{_fmt(hot.metrics['heads_per_step_mean'], 2)} heads/step, F1 {_fmt(hot.quality['f1'], 2)}. "
        "The paper reports no HotpotQA Table 1 numbers to compare against.")
    if len(results["niah"]) > 1:
        jac = [r.metrics["jaccard_static"] for r in results["niah"]]
        lines.append(f"- **Across {len(jac)} seeds**, NIAH Jaccard with the static top-20 is "
                     f"{_fmt(float(np.mean(jac)))} ± {_fmt(float(np.std(jac, ddof=1)))}.")
    return "\n".join(lines)


# --- head-score files out (issue #31) ---------------------------------------------------------------
def _file_stem(model_label: str) -> str:
    from pathlib import Path

    return Path(str(model_label).rstrip("/")).name.replace(" ", "_") or "model"


def write_head_files(model, config: DynamismConfig, results: dict[str, list[TaskResult]], out_dir: str) -> pd.DataFrame:
    """The NIAH static scores (Wu et al.'s score, one entry per calibration sample the ROUGE filter keeps, every
    seed pooled) and the per-head dynamic frequencies (per analysis sample, the share of its steps at which the
    head is in the Eq. 1 set D_t) in Wu et al.'s ``head_score`` JSON format, each beside its provenance file
    (:func:`dynheads_tl.analysis.head_files.provenance`). The static file is the suite's own calibration even
    when ``static_source`` names a file. Returns one row per file written (path, what, n, head count)."""
    from pathlib import Path

    from dynheads_tl.analysis.head_files import provenance, provenance_path, write_head_scores
    from dynheads_tl.analysis.scoring import static_retrieval_per_sample

    niah = results["niah"]
    folder, stem = Path(out_dir) / "head_scores", _file_stem(config.model)
    calibration = [t for r in niah for t in r.calibration]
    analysis = [t for r in niah for t in r.analysis]
    static = static_retrieval_per_sample(calibration, rouge_filter=0.5)
    frequency = [t.retrieval_mask.float().mean(0) if t.n_steps else torch.zeros(t.n_layers, t.n_heads) for t in analysis]
    from dynheads_tl.tasks.wu_detect import is_wu_spec

    prompt_format = (f"Wu et al.'s detection protocol on {config.haystack!r} (prompt kind: "
                     f"{calibration[0].meta.get('prompt_kind', '?') if calibration else '?'}; 50-step decode, newline "
                     f"stop, span rule > 0.9), {config.context_tokens} context tokens, stratified depths"
                     if is_wu_spec(config.haystack) else
                     "suite NIAH: the paper's system prompt and user template (App. A.1) in the model's chat template; "
                     f"UUID needle; haystack {config.haystack!r}, {config.context_tokens} context tokens, evenly "
                     "spread depths")
    common = dict(prompt_format=prompt_format,
                  seeds=config.seeds, trace=config.trace_config("niah").key(), static_source=config.static_source)
    files = [
        (folder / f"{stem}_static_wu.json", static,
         provenance(model, score="Wu et al. retrieval score (per kept calibration sample)", n=len(calibration),
                    n_kept=len(static), filter="rouge-score ROUGE-1 recall of the answer > 0.5 (Wu et al.)",
                    split="calibration", **common)),
        (folder / f"{stem}_dynamic_frequency.json", frequency,
         provenance(model, score="Eq. 1 activation frequency (per analysis sample: share of its steps with the head "
                                 "in D_t)", n=len(analysis), n_kept=len(analysis), filter="none", split="analysis",
                    **common)),
    ]
    rows = []
    for path, scores, info in files:
        write_head_scores(path, scores, info)
        rows.append({"file": str(path), "provenance": str(provenance_path(path)), "score": info["score"],
                     "n_samples": info["n_kept"], "layers": info["layers"], "heads": info["heads"]})
    return pd.DataFrame(rows)


# --- static-set stability (issue #31) -----------------------------------------------------------------------
def static_stability(results: list[TaskResult], k: int = 20, *, n_resamples: int = 200,
                     seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """How much the NIAH static set S_k moves with its calibration: the split-half curve over calibration sizes on
    every seed's kept calibration samples pooled (:func:`~dynheads_tl.analysis.stability.split_half_curve`), the
    overlap of S_k between each pair of seeds' calibration splits with bootstrap intervals
    (:func:`~dynheads_tl.analysis.stability.source_overlap`), and the computed sentence. The calibration splits of
    different seeds share their depths and haystack (only the UUID changes), so both understate how much S_k would
    move across prompts of other layouts."""
    from itertools import combinations

    from dynheads_tl.analysis.scoring import static_retrieval_per_sample
    from dynheads_tl.analysis.stability import source_overlap, split_half_curve, stability_verdict

    per_seed = {}
    for result in results:
        try:
            per_seed[result.seed] = static_retrieval_per_sample(result.calibration, rouge_filter=0.5)
        except ValueError:  # no kept calibration sample for this seed
            continue
    if not per_seed:
        raise ValueError("No seed has a calibration sample that passes Wu et al.'s filter: S_k has no stability to measure.")
    pooled = torch.cat(list(per_seed.values()))
    k = min(k, pooled[0].numel())
    curve = split_half_curve(pooled, k, n_resamples=n_resamples, seed=seed) if len(pooled) >= 2 else pd.DataFrame()
    pairs = pd.DataFrame([{"seed_a": a, "seed_b": b, **source_overlap(per_seed[a], per_seed[b], k, seed=seed)}
                          for a, b in combinations(sorted(per_seed), 2)])
    verdict = (stability_verdict(curve, pairs) if len(curve) else
               f"Only {len(pooled)} calibration sample passed the filter: no split-half curve.")
    return curve, pairs, verdict


# --- a second static baseline: QRHead-style query-focused scores (issue #31) ---------------------------------
def query_focused_comparison(model, config: DynamismConfig, results: list[TaskResult]) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """NIAH D_t against two static sets: Wu et al.'s (the claim's own) and the query-focused one
    (:func:`~dynheads_tl.analysis.query_focus.query_focused_scores` on the same calibration prompts of each seed).

    Returns (the size-aware table of :func:`size_aware_table` for each baseline and static size, with a
    ``baseline`` column; the overlap of the two static sets per seed, :func:`~dynheads_tl.analysis.stability.source_overlap`
    with bootstrap intervals over calibration samples; the computed sentence of :func:`query_focused_verdict`)."""
    from dataclasses import replace

    from dynheads_tl.analysis.query_focus import query_focused_scores
    from dynheads_tl.analysis.scoring import static_retrieval_per_sample
    from dynheads_tl.analysis.stability import source_overlap
    from dynheads_tl.corpus import niah_split_samples

    sets = TraceSets.of(config)
    query_results, overlaps = [], []
    for result in results:
        per_sample = query_focused_scores(model, niah_split_samples(model, sets, result.seed), use_cache=config.use_cache)
        query_results.append(replace(result, static_scores=per_sample.mean(0).float()))
        try:
            wu = static_retrieval_per_sample(result.calibration, rouge_filter=0.5)
        except ValueError:
            continue
        k = min(config.static_k, per_sample[0].numel())
        overlaps.append({"seed": result.seed, **source_overlap(wu, per_sample, k, seed=result.seed)})
    table = pd.concat([size_aware_table(results, config.static_sizes).assign(baseline="wu"),
                       size_aware_table(query_results, config.static_sizes).assign(baseline="query_focused")],
                      ignore_index=True)
    overlap = pd.DataFrame(overlaps)
    return table, overlap, query_focused_verdict(table, overlap, config.static_k)


def query_focused_verdict(table: pd.DataFrame, overlap: pd.DataFrame, k: int = 20) -> str:
    """One computed sentence: does claim 1's reading (the share of Eq. 1 activations outside S_k, read as in
    :func:`size_aware_verdict`) change when S_k is the query-focused top-k instead of Wu et al.'s? Quoted with both
    shares' 95% intervals and the overlap of the two static sets. "Changes" means the two intervals fall in different
    reading categories; "does not change" means the same category."""
    rows = {}
    for baseline in ("wu", "query_focused"):
        part = table[(table["baseline"] == baseline) & (table["static_k"] == k)].set_index("metric")
        if part.empty:
            return f"No size-aware metrics for the static top-{k} of both baselines."
        rows[baseline] = part.loc["share_outside_static"]
    categories = {b: outside_category(r) for b, r in rows.items()}
    fmt = lambda r: f"{r['value']:.3f} [{r['low']:.3f}, {r['high']:.3f}]"
    n = int(rows["wu"]["n_samples"])
    shared = (f" The two static top-{k} sets share {overlap['overlap'].mean():.2f} of their heads (mean over "
              f"{len(overlap)} seed(s); 95% bootstrap intervals over calibration samples from {overlap['low'].min():.2f} "
              f"to {overlap['high'].max():.2f}; Spearman {overlap['spearman'].mean():.2f})." if len(overlap) else "")
    if None in categories.values():
        return f"The share of activations outside one of the static sets is undefined (no activations).{shared}"
    same = categories["wu"] == categories["query_focused"]
    return (f"With the query-focused static top-{k} (QRHead-style) instead of Wu et al.'s, the share of Eq. 1 "
            f"activations outside the static set is {fmt(rows['query_focused'])} against {fmt(rows['wu'])} "
            f"({n} analysis samples, 95% bootstrap intervals): the conclusion "
            + ("does not change (both read: " + categories["wu"] + ")." if same else
               f"changes (Wu: {categories['wu']}; query-focused: {categories['query_focused']}).") + shared)
