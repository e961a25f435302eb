"""Claim 1's pipeline: static heads from a calibration split, per-step sets on different samples, Table 1's metrics with
intervals over layouts, the size-aware overlap, head-score files and the query-focused static set.

NIAH uses Eq. 1 (D_t = heads whose top-1 source is the needle token being generated); HotpotQA uses Eq. 2 (D_t =
heads whose share of attention on supporting facts exceeds a cutoff: by default c x chance, c calibrated on placebo
spans of the calibration split (:func:`eq2_calibration`); the paper's fixed threshold as an option).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from dynheads_tl.analysis.correlation import layout_groups
from dynheads_tl.analysis.head_files import provenance, provenance_path, write_head_scores
from dynheads_tl.analysis.query_focus import query_focused_scores
from dynheads_tl.analysis.scoring import (activation_frequency, adjacent_counts, dynamic_sets, dynamism_metrics,
                                          eq2_placebo_ratio, eq2_rule_curve, size_aware_counts, size_aware_metrics,
                                          static_eq2_scores,
                                          static_top_k, wu_static_per_sample, wu_static_scores)
from dynheads_tl.analysis.statistics import wilson_interval
from dynheads_tl.analysis.stability import source_overlap, split_half_curve, stability_verdict
from dynheads_tl.corpus import TraceSets, calibrated_eq2_rule, hotpot_traces, niah_split_samples, niah_traces
from dynheads_tl.engine.equations import Eq2Rule, head_labels
from dynheads_tl.engine.tracing import Trace
from dynheads_tl.tasks import exact_match, load_hotpot_records, niah_accuracy, token_f1
from dynheads_tl.tasks.wu_detect import is_wu_spec

from .config import DynamismConfig

__all__ = [
    "TaskResult", "analyse_task", "niah_headroom", "eq2_calibration", "dynamism_fixed_threshold_row", "run_claim1",
    "records_skipped", "TABLE1_COLUMNS", "table1_intervals", "static_size_sweep", "seed_robustness",
    "frequency_frame", "heatmap_data", "size_aware_table", "write_head_files", "static_stability",
    "query_focused_tables",
]


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
    static_filter: str = ""  # NIAH: the filter Wu et al.'s scores used (WU_FILTER, or WU_UNFILTERED when none passed)
    n_passed: int | None = None  # NIAH: how many calibration answers passed Wu et al.'s filter

    def static_mask(self, k: int) -> torch.Tensor:
        return static_top_k(self.static_scores, min(k, self.static_scores.numel()))


def analyse_task(task: str, calibration: list[Trace], analysis: list[Trace], config: DynamismConfig,
                 seed: int, eq2_rule: Eq2Rule | None = None) -> TaskResult:
    """One task of one seed. HotpotQA's D_t are marked by ``eq2_rule`` (which the chance rule must pass: its factor
    is calibrated by :func:`eq2_calibration`; the fixed rule defaults to the config's threshold)."""
    if task == "hotpot" and eq2_rule is None and config.eq2_rule == "chance":
        raise ValueError("eq2_rule='chance' needs the calibrated rule: pass eq2_calibration(model, config)[0].")
    eq2_rule = eq2_rule or Eq2Rule("fixed", config.eq2_threshold)
    override = config.static_override(config.model)  # static_source: a head-score file replaces the calibration's scores
    static_filter, n_passed = "", None
    if task == "niah":
        if override is None:
            wu = wu_static_scores(calibration, f"NIAH calibration, seed {seed}")
            scores, static_filter, n_passed = wu.scores, wu.filter, wu.n_passed
        else:
            scores, static_filter = override, f"static_source {config.static_source}"
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
                      eq2_rule if task == "hotpot" else None, static_filter, n_passed)


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
    # the chosen cutoff's real / placebo ratio with its BCa interval over questions (the real-data deviation's (3))
    ratio = eq2_placebo_ratio(real, placebo, float(rule.value), seed=config.seeds[0])
    curve["ratio"] = np.where(curve["chosen"], ratio.estimate, np.nan)
    curve["ratio_low"] = np.where(curve["chosen"], ratio.low, np.nan)
    curve["ratio_high"] = np.where(curve["chosen"], ratio.high, np.nan)
    curve["n_questions"] = np.where(curve["chosen"], len(real), np.nan)
    fixed = dynamism_fixed_threshold_row(real, config.eq2_threshold)
    curve.attrs.update(rule=rule, false_rate=config.eq2_false_rate, fixed=fixed, fixed_threshold=config.eq2_threshold,
                       n_samples=len(real), n_steps=sum(t.n_steps for t in real))
    return rule, curve


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


def niah_headroom(results: list[TaskResult]) -> pd.DataFrame:
    """Headroom first (SCIENCE 7): per NIAH seed, how many analysis answers hold the exact UUID (the paper's
    accuracy; the first seed's with its Wilson 95% interval, its samples being distinct layouts; later seeds change
    only the UUID of the same layouts, so they are not pooled into one interval) and how many calibration answers
    passed Wu et al.'s ROUGE filter, with the filter the seed's static scores used."""
    rows = []
    for i, result in enumerate(results):
        correct = int(sum(niah_accuracy(t.response, t.answers[0]) for t in result.analysis))
        n = len(result.analysis)
        interval = wilson_interval(correct, n) if i == 0 and n else None
        rows.append({"seed": result.seed, "correct": correct, "n_analysis": n, "accuracy": correct / n if n else np.nan,
                     "low": interval.low if interval else np.nan, "high": interval.high if interval else np.nan,
                     "n_calibration": len(result.calibration),
                     "n_passed": result.n_passed if result.n_passed is not None else np.nan,
                     "static_filter": result.static_filter})
    return pd.DataFrame(rows)


# --- tables ----------------------------------------------------------------------------------
TABLE1_COLUMNS = ["jaccard_static", "jaccard_adjacent", "entropy", "entropy_ref_ln20",
                  "heads_per_step_mean", "heads_per_step_sd", "ever_active", "n_heads", "n_steps"]


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
    """Table 1's metrics with 95% percentile-bootstrap intervals that resample whole layouts (SCIENCE 10): NIAH
    samples of different seeds share their depth and haystack offset and change only the UUID, so the siblings of
    one layout are resampled together (:func:`~dynheads_tl.analysis.correlation.layout_groups`; ``n_layouts``),
    each metric recomputed from the resampled samples' pooled steps, as Table 1 pools them. ``results`` of several
    seeds are pooled, each sample against its own seed's static top-``static_k``.

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

    labels = layout_groups([trace for result in results for trace in result.analysis])
    if len(labels) != len(stats):  # step sets without their traces: each sample its own cluster
        labels = np.arange(len(stats)).astype(str)
    members = [np.flatnonzero(labels == label) for label in dict.fromkeys(labels.tolist())]
    everything = np.arange(len(stats))
    estimate = metrics(everything)
    rng = np.random.default_rng(seed)
    draws = [metrics(np.concatenate([members[j] for j in rng.integers(0, len(members), len(members))]))
             for _ in range(n_resamples)]
    rows = []
    for name, value in estimate.items():
        values = np.array([d[name] for d in draws])
        values = values[~np.isnan(values)]
        low, high = (np.quantile(values, [0.025, 0.975]) if len(values) else (float("nan"), float("nan")))
        rows.append({"task": results[0].task, "metric": name, "value": value, "low": float(low), "high": float(high),
                     "n_samples": len(stats), "n_layouts": len(members), "n_seeds": len(results)})
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
    intervals are percentile bootstraps that resample whole layouts (the seeds' siblings of one depth and offset
    together, :func:`~dynheads_tl.analysis.correlation.layout_groups`)."""
    labels = layout_groups([trace for result in results for trace in result.analysis])
    rows = []
    for k in sizes:
        per_sample = []
        for result in results:
            static = result.static_mask(k)
            per_sample += [size_aware_counts(sets, static) for sets in result.step_sets]
        clusters = labels if len(labels) == len(per_sample) else None
        for row in size_aware_metrics(per_sample, clusters=clusters):
            rows.append({"task": results[0].task, "static_k": min(k, results[0].static_scores.numel()), **row})
    return pd.DataFrame(rows)


# --- head-score files out (Wu et al.'s format) ------------------------------------------------------
def _file_stem(model_label: str) -> str:
    return Path(str(model_label).rstrip("/")).name.replace(" ", "_") or "model"


def write_head_files(model, config: DynamismConfig, results: dict[str, list[TaskResult]], out_dir: str) -> pd.DataFrame:
    """The NIAH static scores (Wu et al.'s score, one entry per calibration sample each seed's static set averages:
    those the ROUGE filter keeps, or every sample of a seed none of whose answers passes; every seed pooled) and
    the per-head dynamic frequencies (per analysis sample, the share of its steps at which the head is in the Eq. 1
    set D_t) in Wu et al.'s ``head_score`` JSON format, each beside its provenance file
    (:func:`dynheads_tl.analysis.head_files.provenance`). The static file is the suite's own calibration even
    when ``static_source`` names a file. Returns one row per file written (path, what, n, head count)."""
    niah = results["niah"]
    folder, stem = Path(out_dir) / "head_scores", _file_stem(config.model)
    calibration = [t for r in niah for t in r.calibration]
    analysis = [t for r in niah for t in r.analysis]
    per_seed = {r.seed: wu_static_per_sample(r.calibration) for r in niah}  # each seed under its own filter
    static = torch.cat([terms for terms, _ in per_seed.values()])
    unfiltered = [seed for seed, (_, wu) in per_seed.items() if not wu.filtered]
    wu_filter = "rouge-score ROUGE-1 recall of the answer > 0.5 (Wu et al.)" + (
        f"; none on seed(s) {', '.join(map(str, unfiltered))}, where no calibration answer passed it" if unfiltered else "")
    frequency = [t.retrieval_mask.float().mean(0) if t.n_steps else torch.zeros(t.n_layers, t.n_heads) for t in analysis]
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
                    n_kept=len(static), filter=wu_filter,
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


# --- static-set stability across seeds ----------------------------------------------------------------------
def static_stability(results: list[TaskResult], k: int = 20, *, n_resamples: int = 200, seed: int = 0,
                     check_calibration: bool = True) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """How much the NIAH static set S_k moves with its calibration: the split-half curve over calibration sizes on
    every seed's kept calibration samples pooled (each seed under its own filter, :func:`wu_static_per_sample`;
    :func:`~dynheads_tl.analysis.stability.split_half_curve`), the
    overlap of S_k between each pair of seeds' calibration splits with bootstrap intervals
    (:func:`~dynheads_tl.analysis.stability.source_overlap`), and the computed sentence. The calibration splits of
    different seeds share their depths and haystack (only the UUID changes), so both understate how much S_k would
    move across prompts of other layouts. With ``check_calibration`` (off when the run's static set comes from a
    file, ``static_source``), the samples this run's S_k rests on (per seed, those its filter keeps; the fewest of
    any seed) are checked against the size at which the curve settles."""
    scored = {result.seed: wu_static_per_sample(result.calibration) for result in results}
    per_seed = {s: terms for s, (terms, _) in scored.items()}  # each seed's terms under its own filter
    unfiltered = [s for s, (_, wu) in scored.items() if not wu.filtered]
    note = (f" Seed{'s' if len(unfiltered) > 1 else ''} {', '.join(map(str, unfiltered))}: no calibration answer "
            "passed Wu et al.'s ROUGE filter, so their terms are unfiltered (every calibration sample)."
            if unfiltered else "")
    pooled = torch.cat(list(per_seed.values()))
    k = min(k, pooled[0].numel())
    curve = split_half_curve(pooled, k, n_resamples=n_resamples, seed=seed) if len(pooled) >= 2 else pd.DataFrame()
    pairs = pd.DataFrame([{"seed_a": a, "seed_b": b, **source_overlap(per_seed[a], per_seed[b], k, seed=seed)}
                          for a, b in combinations(sorted(per_seed), 2)])
    kept = min(len(scores) for scores in per_seed.values()) if check_calibration else None
    verdict = (stability_verdict(curve, pairs, calibration_size=kept) if len(curve) else
               f"Only {len(pooled)} calibration sample: no split-half curve.")
    return curve, pairs, verdict + note


# --- a second static baseline: QRHead-style query-focused scores ------------------------------------------
def query_focused_tables(model, config: DynamismConfig, results: list[TaskResult]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """NIAH D_t against two static sets: Wu et al.'s (the claim's own) and the query-focused one
    (:func:`~dynheads_tl.analysis.query_focus.query_focused_scores` on the same calibration prompts of each seed).

    Returns (the size-aware table of :func:`size_aware_table` for each baseline and static size, with a
    ``baseline`` column; the overlap of the two static sets per seed, :func:`~dynheads_tl.analysis.stability.source_overlap`
    with bootstrap intervals over calibration samples)."""
    sets = TraceSets.of(config)
    query_results, overlaps = [], []
    for result in results:
        per_sample = query_focused_scores(model, niah_split_samples(model, sets, result.seed), use_cache=config.use_cache)
        query_results.append(replace(result, static_scores=per_sample.mean(0).float()))
        wu, _ = wu_static_per_sample(result.calibration)  # the terms the seed's own static set averages
        k = min(config.static_k, per_sample[0].numel())
        overlaps.append({"seed": result.seed, **source_overlap(wu, per_sample, k, seed=result.seed)})
    table = pd.concat([size_aware_table(results, config.sweep_sizes).assign(baseline="wu"),
                       size_aware_table(query_results, config.sweep_sizes).assign(baseline="query_focused")],
                      ignore_index=True)
    return table, pd.DataFrame(overlaps)
