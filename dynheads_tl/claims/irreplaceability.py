"""Claim 2 pipeline: calibration -> static set and k -> grids (Fig 2, 6) -> progressive (Fig 3, 7).

The protocol itself (two passes per step, selectors, teacher forcing, compensation) lives in
:mod:`dynheads_tl.protocols.ablation`. Every grid run is made twice: generated freely (the paper's
accuracy / F1) and teacher-forced on the gold continuation (the per-step drop of the gold token's
log-probability, which one early error cannot derail). Summaries carry n and 95% intervals; the
verdicts are computed from the intervals (:func:`compare`).
"""
from __future__ import annotations

import logging
import math
import random
from dataclasses import dataclass, field

import pandas as pd
import torch

from dynheads_tl.protocols.ablation import AblationSetup, compensation_table, grid_experiment, progressive_experiment
from dynheads_tl.config import (RunSettings, Eq2Selection, NotebookConfig, StaticSource, check_choice, check_fraction_list, check_int_list,
                                check_ints)
from dynheads_tl.corpus import SEED_OFFSETS, TraceSettings, collect_traces, placebo_traces
from dynheads_tl.engine.equations import Eq2Rule
from dynheads_tl.engine.hooks import StepState, z_hook_name
from dynheads_tl.engine.models import DEFAULT_MODEL
from dynheads_tl.analysis.scoring import calibrate_chance_factor, dynamic_sets, static_eq2_scores, static_retrieval_scores, static_top_k
from dynheads_tl.analysis.statistics import Interval, bootstrap_interval, format_interval, wilson_interval
from dynheads_tl.tasks import NiahConfig, build_niah_sample, make_hotpot_samples, make_niah_samples
from dynheads_tl.tasks.hotpot import HotpotConfig, build_hotpot_sample, synthetic_hotpot_records
from dynheads_tl.engine.tracing import TraceConfig, trace_generation

# The paper's anchors (Fig 3): accuracy 1.0 -> 0.0 by k = 20 dynamic heads; 4.5-7 compensating
# static-top-20 heads for k >= 5.
PAPER_FIG3 = {"accuracy_at_k0": 1.0, "accuracy_at_k20": 0.0, "m_s_range_k_ge_5": (4.5, 7.0)}
# The paper's three conditions and the unmasked baseline, then our controls: the size-matched static and
# random baselines, and the parts of D_t outside / of S_20 outside D_t (see dynheads_tl.protocols.ablation).
GRID_CONDITIONS = ("none", "dynamic", "static", "random", "static_matched", "query_matched", "random_matched",
                   "dynamic_nonstatic",
                   "random_nonstatic", "static_nondynamic", "random_nondynamic")
# Conditions whose number of heads is set by D_t at each step (the others mask a fixed k, or nothing).
PER_STEP_SIZED = ("dynamic", "static_matched", "query_matched", "random_matched", "dynamic_nonstatic", "random_nonstatic",
                  "static_nondynamic", "random_nondynamic")
# A comparison needs at least this many samples per condition (the minimum per grid cell); with fewer,
# a bootstrap interval is too narrow to trust and the verdict says so instead of comparing.
MIN_SAMPLES_TO_COMPARE = 5
# NIAH grid runs start the haystack at a seeded offset below this many tokens.
GRID_MAX_OFFSET = 3000


@dataclass
class IrreplaceabilityConfig(StaticSource, Eq2Selection, TraceSettings, RunSettings, NotebookConfig):
    """The claim 2 notebook's parameters: the shared trace settings plus the grid's and the protocol's."""

    model: str = DEFAULT_MODEL
    niah_contexts: list[int] = field(default_factory=lambda: [500])
    niah_depths: list[float] = field(default_factory=lambda: [0.1, 0.9])
    hotpot_contexts: list[int] = field(default_factory=lambda: [750])
    hotpot_depths: list[float] = field(default_factory=lambda: [0.1, 0.9])
    runs_per_cell: int = 5
    n_calibration: int = 10
    progressive_k_max: int = 30
    progressive_k_step: int = 10
    n_progressive: int = 5
    progressive_context: int = 500
    ablation_mode: str = "zero"
    keep_cache: str = "clean"
    seed: int = 0
    batch_size: int = 25  # generations decoded together (the runs of one grid cell; several progressive samples' k)
    output_dir: str = "papers_figures"
    use_cache: bool = True  # reuse cached traces and ablation runs

    def __post_init__(self):
        super().__post_init__()
        check_ints(self, ("runs_per_cell", "n_calibration", "progressive_k_step", "n_progressive",
                          "progressive_context", "batch_size"))
        check_ints(self, ("progressive_k_max",), minimum=0)
        check_int_list(self, "niah_contexts", minimum=32)
        check_int_list(self, "hotpot_contexts", minimum=32)
        check_fraction_list(self, "niah_depths")
        check_fraction_list(self, "hotpot_depths")
        check_choice(self, "ablation_mode", ("zero", "mean"))
        check_choice(self, "keep_cache", ("clean", "masked"))

    def check_inputs(self) -> None:
        """Every NIAH and HotpotQA length against the model's context window, before any model work."""
        from dynheads_tl.config import model_context_window
        from dynheads_tl.tasks import check_context_fits

        n_ctx = model_context_window(self.model)
        check_context_fits(self.niah_contexts, self.max_new_tokens, n_ctx, name="niah_contexts")
        check_context_fits(self.progressive_context, self.max_new_tokens, n_ctx, name="progressive_context")
        check_context_fits(self.hotpot_contexts, self.hotpot_max_new_tokens, n_ctx, name="hotpot_contexts")
        self.check_static_source()

    @property
    def progressive_ks(self) -> list[int]:
        return list(range(0, self.progressive_k_max + 1, self.progressive_k_step))

    def trace_config(self, task: str) -> TraceConfig:
        steps = self.max_new_tokens if task == "niah" else self.hotpot_max_new_tokens
        return TraceConfig(max_new_tokens=steps, sink_tokens=self.sink_tokens, local_window=self.local_window)


def mean_head_outputs(model, samples, config: TraceConfig) -> torch.Tensor:
    """Each head's mean ``hook_z`` over all decoding steps of ``samples`` (for mean-ablation)."""
    n_layers = model.cfg.n_layers
    total = torch.zeros(n_layers, model.cfg.n_heads, model.cfg.d_head)
    count = {"n": 0}
    state = StepState()

    def make(layer):
        def hook(z, hook):
            if state.active:
                total[layer] += z[0, -1].float().cpu()
                if layer == 0:
                    count["n"] += 1
        return hook

    hooks = [(z_hook_name(layer), make(layer)) for layer in range(n_layers)]
    for sample in samples:
        trace_generation(model, sample, config, hooks=hooks, state=state, record=False)
    return total / max(count["n"], 1)


def calibrate(model, config: IrreplaceabilityConfig, task: str) -> AblationSetup:
    """Static set (top-k with k = mean calibration |D_t|), static top-20, and k, from a calibration split."""
    trace_config = config.trace_config(task)
    seed = SEED_OFFSETS["ablation_calibration"] + config.seed
    if task == "niah":
        samples = make_niah_samples(model.tokenizer, n=config.n_calibration, context_tokens=config.niah_contexts,
                                    seed=seed, max_new_tokens=config.max_new_tokens, max_tokens=int(model.cfg.n_ctx))
        spec = dict(task="niah", split="calibration", n=config.n_calibration, contexts=config.niah_contexts, seed=seed)
    else:
        samples = make_hotpot_samples(model.tokenizer, n=config.n_calibration, seed=seed, max_tokens=int(model.cfg.n_ctx))
        spec = dict(task="hotpot", split="calibration", n=config.n_calibration, seed=seed)
    traces = collect_traces(model, samples, trace_config, spec, use_cache=config.use_cache,
                            batch_size=config.trace_batch_size, desc=f"{task} calibration")
    rule = Eq2Rule("fixed", config.eq2_threshold)
    if task == "niah":
        scores = static_retrieval_scores(traces, rouge_filter=0.5)
        sets = [dynamic_sets(t, "eq1") for t in traces]
    else:
        scores = static_eq2_scores(traces)
        if config.eq2_rule == "chance":  # the factor from this split's own placebo spans
            placebo = placebo_traces(model, samples, trace_config, spec, seed=seed, use_cache=config.use_cache,
                                     batch_size=config.trace_batch_size,
                                     desc="hotpot placebo calibration")
            rule = Eq2Rule("chance", calibrate_chance_factor(placebo, config.eq2_false_rate))
        sets = [dynamic_sets(t, "eq2", rule) for t in traces]
    override = config.static_override()  # static_source: the file's scores rank the static heads; k stays |D_t|'s
    if override is not None:
        scores = override
    sizes = torch.cat([s.flatten(1).sum(1) for s in sets]).float()
    k = max(int(round(float(sizes.mean()))), 1)
    mean_z = mean_head_outputs(model, samples, trace_config) if config.ablation_mode == "mean" else None
    from dynheads_tl.analysis.query_focus import query_focused_scores

    # The second static baseline (issue #31): QRHead-style query-focused scores on the same calibration prompts
    try:
        query = query_focused_scores(model, samples, use_cache=config.use_cache).mean(0)
    except ValueError as error:  # a prompt the null query cannot be placed in: the condition is left out
        logging.getLogger(__name__).warning("%s: no query-focused ranking (%s); query_matched is not run.", task, error)
        query = None
    return AblationSetup(static_mask=static_top_k(scores, k), static_top20=static_top_k(scores, min(20, scores.numel())),
                         k=k, kind="eq1" if task == "niah" else "eq2", threshold=rule,
                         mode=config.ablation_mode, keep_cache=config.keep_cache, mean_z=mean_z, seed=config.seed,
                         static_order=torch.argsort(scores.flatten(), descending=True, stable=True),
                         query_order=None if query is None else torch.argsort(query.flatten(), descending=True,
                                                                              stable=True))


def grid_cells(model, config: IrreplaceabilityConfig, task: str):
    cells, seed = [], SEED_OFFSETS["ablation_grid"] + config.seed
    contexts = config.niah_contexts if task == "niah" else config.hotpot_contexts
    depths = config.niah_depths if task == "niah" else config.hotpot_depths
    records = synthetic_hotpot_records(len(contexts) * len(depths) * config.runs_per_cell, seed=seed) if task == "hotpot" else None
    pool = [tuple(p) for r in synthetic_hotpot_records(64, seed=SEED_OFFSETS["distractor_pool"] + config.seed)
            for p in r["context"]]
    i = 0
    for context in contexts:
        for depth in depths:
            for run in range(config.runs_per_cell):
                cell = {"context": context, "depth": depth, "run": run}
                if task == "niah":
                    # The runs of a cell share the depth; each starts the haystack at its own seeded offset, so
                    # they differ in the text around the needle, not only in the UUID.
                    offset = random.Random(f"grid-offset:{seed}:{i}").randrange(GRID_MAX_OFFSET)
                    sample = build_niah_sample(model.tokenizer, NiahConfig(context_tokens=context, depth=depth,
                                               seed=seed * 100_003 + i, max_new_tokens=config.max_new_tokens,
                                               haystack_offset=offset), max_tokens=int(model.cfg.n_ctx))
                else:
                    sample = build_hotpot_sample(model.tokenizer, records[i],
                                                 HotpotConfig(context_tokens=context, depth=depth, seed=seed + i),
                                                 max_tokens=int(model.cfg.n_ctx), distractor_pool=pool)
                cells.append((cell, sample))
                i += 1
    return cells


def progressive_samples(model, config: IrreplaceabilityConfig, task: str):
    seed = SEED_OFFSETS["progressive"] + config.seed
    if task == "niah":
        return make_niah_samples(model.tokenizer, n=config.n_progressive, context_tokens=config.progressive_context,
                                 seed=seed, max_new_tokens=config.max_new_tokens, max_tokens=int(model.cfg.n_ctx))
    return make_hotpot_samples(model.tokenizer, n=config.n_progressive, seed=seed, max_tokens=int(model.cfg.n_ctx))


@dataclass
class TaskAblation:
    task: str
    setup: AblationSetup
    grid: pd.DataFrame
    progressive: pd.DataFrame
    compensation: pd.DataFrame

    @property
    def metric(self) -> str:
        return "accuracy" if self.task == "niah" else "f1"


def run_task(model, config: IrreplaceabilityConfig, task: str) -> TaskAblation:
    setup = calibrate(model, config, task)
    trace_config = config.trace_config(task)
    cache_key = {"claim": 2, "task": task} if config.use_cache else None
    conditions = [c for c in GRID_CONDITIONS if c != "query_matched" or setup.query_order is not None]
    grid = grid_experiment(model, grid_cells(model, config, task), setup, trace_config, conditions=conditions,
                           desc=f"{task} grid", cache_key=cache_key, batch_size=config.batch_size, teacher_forced=True)
    progressive, new_heads = progressive_experiment(model, progressive_samples(model, config, task), setup,
                                                    trace_config, config.progressive_ks, desc=f"{task} progressive",
                                                    cache_key=cache_key, batch_size=config.batch_size)
    return TaskAblation(task, setup, grid, progressive, compensation_table(new_heads, setup.static_top20))


def metric_interval(values: pd.Series, metric: str, seed: int = 0) -> Interval:
    """The 95% interval of a per-sample metric: Wilson for a 0/1 proportion (NIAH accuracy, EM), a
    percentile bootstrap over samples otherwise (F1, ROUGE-L, log-probability drops). NaNs are left out."""
    data = pd.to_numeric(values, errors="coerce").dropna().to_numpy(dtype=float)
    if len(data) == 0:
        return Interval(float("nan"), float("nan"), float("nan"), 0)
    if metric in ("accuracy", "em"):
        return wilson_interval(int(round(data.sum())), len(data))
    return bootstrap_interval(data, seed=seed)


def condition_summary(result: TaskAblation) -> pd.DataFrame:
    """One row per masking condition: n (runs = samples), the metrics with 95% intervals
    (:func:`metric_interval`; ``*_low`` / ``*_high``), m_s and the mean heads masked per step, in free
    generation and under teacher forcing (``tf_`` columns: per-step drop of the gold token's log-probability,
    over all gold steps and over the steps where something was masked, in nats)."""
    grid = result.grid
    metrics = [c for c in ("accuracy", "f1", "em", "rouge_l", "tf_drop", "tf_drop_masked") if c in grid]
    rows = []
    for condition, part in grid.groupby("condition", sort=False):
        row = {"condition": condition, "n": len(part), "k_static_random": result.setup.k}
        for metric in metrics:
            interval = metric_interval(part[metric], metric)
            row.update({metric: interval.estimate, f"{metric}_low": interval.low, f"{metric}_high": interval.high})
            if metric == "tf_drop_masked":
                row["n_tf_masked"] = interval.n  # samples with at least one masked step
        for column in ("m_s", "heads_masked_per_step", "tf_heads_masked_per_step", "tf_steps"):
            if column in part:
                row[column] = float(part[column].mean())
        for column in ("m_s", "heads_masked_per_step"):  # bootstrap 95% over samples
            if column in part and len(part.dropna(subset=[column])):
                interval = bootstrap_interval(part[column].dropna().to_numpy(dtype=float))
                row.update({f"{column}_low": interval.low, f"{column}_high": interval.high})
        rows.append(row)
    return pd.DataFrame(rows)


def _interval_text(interval: Interval, digits: int = 2) -> str:
    return format_interval(interval.estimate, interval.low, interval.high, digits)


def paired_difference(result: "TaskAblation", a: str, b: str, metric: str, seed: int = 0) -> Interval | None:
    """Mean over samples of (condition a − condition b) on ``metric``, pairing the two conditions' runs on the same
    sample (grid cell and run), with a percentile-bootstrap 95% interval that resamples samples. Every condition
    runs on the same samples, so this interval is much narrower than the two conditions' own intervals suggest."""
    keys = [c for c in ("context", "depth", "run") if c in result.grid]
    if metric not in result.grid:
        return None
    side = lambda c: result.grid[result.grid["condition"] == c].set_index(keys)[metric].astype(float)
    joined = pd.concat([side(a).rename("a"), side(b).rename("b")], axis=1, join="inner").dropna()
    if joined.empty:
        return None
    return bootstrap_interval((joined["a"] - joined["b"]).to_numpy(), seed=seed)


def _comparison_text(name_a: str, a: Interval, b: Interval, difference: Interval | None, what: str,
                     sizes: tuple[float, float], *, higher_is_worse: bool, digits: int = 2) -> str:
    """"<what> a [low, high] vs b [low, high], difference d [low, high] (paired, n = ..): <reading>". The reading
    comes from the paired difference's 95% interval: a hurts more only when it excludes 0 on the worse side; with
    fewer than :data:`MIN_SAMPLES_TO_COMPARE` pairs, no reading. When a masks fewer heads than b, it says so."""
    numbers = f"{what} {_interval_text(a, digits)} vs {_interval_text(b, digits)}"
    if difference is None or difference.n < MIN_SAMPLES_TO_COMPARE or math.isnan(difference.low):
        return f"{numbers}: too few paired samples to compare (at least {MIN_SAMPLES_TO_COMPARE} needed)"
    numbers += f", difference {_interval_text(difference, digits)} (paired over n = {difference.n} samples)"
    worse = difference.low > 0 if higher_is_worse else difference.high < 0
    better = difference.high < 0 if higher_is_worse else difference.low > 0
    fewer = sizes[0] < sizes[1] - 0.05
    if worse:
        reading = f"{name_a} hurts more" + (" although it masks fewer heads" if fewer else "")
    elif better:
        reading = f"{name_a} hurts less" + (" (it also masks fewer heads)" if fewer else "")
    else:
        reading = ("the interval of the difference contains 0, so the data cannot distinguish them"
                   + (f" ({name_a} masks fewer heads, so this does not show its heads matter less)" if fewer else ""))
    return f"{numbers}: {reading}"


def _condition_interval(result: TaskAblation, condition: str, metric: str) -> Interval | None:
    part = result.grid[result.grid["condition"] == condition]
    if part.empty or metric not in part:
        return None
    return metric_interval(part[metric], metric)


def _heads(result: TaskAblation, condition: str, column: str = "heads_masked_per_step") -> float:
    part = result.grid[result.grid["condition"] == condition]
    return float(part[column].mean()) if column in part and len(part) else float("nan")


def matched_controls_verdict(result: TaskAblation) -> str:
    """The computed answer to the issue's two questions, with the intervals, for one task:

    1. Does masking D_t hurt more than masking as many random heads (``random_matched``), and do dynamic and
       static masking differ once sizes are matched (``dynamic`` against ``static_matched``)?
    2. Does masking D_t minus S_20 (``dynamic_nonstatic``) hurt more than masking as many random heads from
       outside S_20 (``random_nonstatic``, size-matched), and than |D_t| random heads (``random_matched``, the
       issue's comparison, which masks more heads)? And S_20 minus D_t against as many random heads from
       outside D_t (``random_nondynamic``)?

    Each is read on the free-generation metric (NIAH accuracy, Wilson interval; HotpotQA F1, bootstrap
    interval over samples) and on the teacher-forced per-step drop of the gold token's log-probability
    (bootstrap over samples), each condition with its own 95% interval, and the reading from the paired
    difference (:func:`paired_difference`): "hurts more" only when its 95% interval excludes 0, otherwise "cannot
    distinguish", with the numbers."""
    metric = result.metric
    name = "NIAH" if result.task == "niah" else "HotpotQA (synthetic)"
    label = "accuracy" if metric == "accuracy" else "F1"
    pairs = [("dynamic", "random_matched", "masking D_t", "masking |D_t| random heads"),
             ("dynamic", "static_matched", "masking D_t", "masking the top-|D_t| static heads"),
             ("dynamic_nonstatic", "random_nonstatic", "masking D_t \\ S_20",
              "masking as many random heads from outside S_20"),
             ("dynamic_nonstatic", "random_matched", "masking D_t \\ S_20", "masking |D_t| random heads"),
             ("static_nondynamic", "random_nondynamic", "masking S_20 \\ D_t",
              "masking as many random heads from outside D_t")]
    sentences = []
    for a, b, name_a, name_b in pairs:
        free_a, free_b = _condition_interval(result, a, metric), _condition_interval(result, b, metric)
        if free_a is None or free_b is None:
            continue
        free_sizes = (_heads(result, a), _heads(result, b))
        sizes = f"{free_sizes[0]:.1f} vs {free_sizes[1]:.1f} heads masked per step on average"
        parts = [_comparison_text(name_a, free_a, free_b, paired_difference(result, a, b, metric),
                                  f"free-generation {label}", free_sizes, higher_is_worse=False)]
        tf_a, tf_b = _condition_interval(result, a, "tf_drop"), _condition_interval(result, b, "tf_drop")
        if tf_a is not None and tf_b is not None:
            tf_sizes = (_heads(result, a, "tf_heads_masked_per_step"), _heads(result, b, "tf_heads_masked_per_step"))
            sizes += f"; {tf_sizes[0]:.1f} vs {tf_sizes[1]:.1f} when teacher-forced"
            parts.append(_comparison_text(name_a, tf_a, tf_b, paired_difference(result, a, b, "tf_drop"),
                                          "teacher-forced drop of the gold token's log-probability in nats per step",
                                          tf_sizes, higher_is_worse=True, digits=3))
        sentences.append(f"{name}, {name_a} against {name_b} ({sizes}): " + "; ".join(parts) + ".")
    return " ".join(sentences) if sentences else f"{name}: the matched controls were not run."


def _reading(difference: Interval | None, higher_is_worse: bool) -> str:
    if difference is None or difference.n < MIN_SAMPLES_TO_COMPARE or math.isnan(difference.low):
        return "too few samples"
    if (difference.low > 0) if higher_is_worse else (difference.high < 0):
        return "D_t hurts more"
    if (difference.high < 0) if higher_is_worse else (difference.low > 0):
        return "D_t hurts less"
    return "cannot distinguish"


def query_baseline_verdict(result: TaskAblation) -> str:
    """The computed answer to issue #31 for claim 2: does masking D_t still compare with the size-matched static
    baseline the same way when the static ranking is the query-focused one (``query_matched``, QRHead-style) instead
    of Wu et al.'s (``static_matched``)? Each comparison is read from its paired difference's 95% interval as in
    :func:`matched_controls_verdict` (free-generation metric and teacher-forced drop); the conclusion "does not
    change" when both readings agree on both measures."""
    name = "NIAH" if result.task == "niah" else "HotpotQA (synthetic)"
    if result.grid[result.grid["condition"] == "query_matched"].empty:
        return f"{name}: the query-focused baseline was not run."
    metric = result.metric
    label = "accuracy" if metric == "accuracy" else "F1"
    parts, readings = [], []
    for baseline, what in (("static_matched", "Wu et al.'s top-|D_t|"), ("query_matched", "the query-focused top-|D_t|")):
        free_a, free_b = _condition_interval(result, "dynamic", metric), _condition_interval(result, baseline, metric)
        free = paired_difference(result, "dynamic", baseline, metric)
        tf = paired_difference(result, "dynamic", baseline, "tf_drop")
        readings.append((_reading(free, False), _reading(tf, True)))
        text = _comparison_text("masking D_t", free_a, free_b, free, f"free-generation {label}",
                                (_heads(result, "dynamic"), _heads(result, baseline)), higher_is_worse=False)
        parts.append(f"against {what}: {text}")
    same = readings[0] == readings[1]
    return (f"{name}, masking D_t " + "; ".join(parts) + ". With the query-focused static baseline the conclusion "
            + ("does not change" if same else "changes")
            + f" (free-generation / teacher-forced readings: Wu {readings[0][0]} / {readings[0][1]}; query-focused "
              f"{readings[1][0]} / {readings[1][1]}).")


def protocol_checks(result: TaskAblation) -> pd.DataFrame:
    """Sanity checks of the protocol on this run's own outputs (shown in the notebook, tested):
    k = 0 must reproduce the unmasked generation, and the three conditions must mask different heads."""
    prog = result.progressive
    k0 = prog[prog["k"] == 0]
    same = int((k0["response"] == k0["unmasked_response"]).sum())
    masked = result.grid.pivot_table(index=[c for c in ("context", "depth", "run") if c in result.grid],
                                     columns="condition", values="heads_ever_masked", aggfunc="first").fillna("")
    differ = int(((masked["dynamic"] != masked["static"]) & (masked["static"] != masked["random"])
                  & (masked["dynamic"] != masked["random"])).sum())
    rows = [
        {"check": "progressive k = 0 gives the unmasked response", "passed": f"{same}/{len(k0)}",
         "ok": same == len(k0)},
        {"check": "grid runs where dynamic, static and random mask different heads", "passed": f"{differ}/{len(masked)}",
         "ok": differ == len(masked)},
    ]
    if "tf_drop" in result.grid:
        unmasked = result.grid[result.grid["condition"] == "none"]["tf_drop"]
        exact = int((unmasked == 0).sum())
        rows.append({"check": "teacher-forced, nothing masked: the drop is exactly 0", "passed": f"{exact}/{len(unmasked)}",
                     "ok": exact == len(unmasked)})
    return pd.DataFrame(rows)


def progressive_summary(result: TaskAblation) -> pd.DataFrame:
    """Per k: n (samples), the metric with its 95% interval (:func:`metric_interval`) and mean m_s."""
    rows = []
    for k, part in result.progressive.groupby("k"):
        interval = metric_interval(part[result.metric], result.metric)
        rows.append({"k": int(k), "n": len(part), result.metric: interval.estimate,
                     f"{result.metric}_low": interval.low, f"{result.metric}_high": interval.high,
                     "m_s": float(part["m_s"].mean())})
    return pd.DataFrame(rows)


def _paper_comparison(result: TaskAblation) -> str:
    """The paper's reading (dynamic hurts more than static top-k and random k), tested with intervals."""
    metric, k = result.metric, result.setup.k
    label = "accuracy" if metric == "accuracy" else "F1"
    texts = []
    for other, name in (("static", f"the static top-{k}"), ("random", f"{k} random heads")):
        difference = paired_difference(result, "dynamic", other, metric)
        if difference is None:
            continue
        numbers = f"dynamic − {other} {_interval_text(difference)}"
        if difference.n < MIN_SAMPLES_TO_COMPARE or math.isnan(difference.low):
            texts.append(f"too few samples to compare dynamic masking with masking {name}")
        elif difference.high < 0:
            texts.append(f"dynamic masking hurts more than masking {name} ({numbers})")
        elif difference.low > 0:
            texts.append(f"dynamic masking hurts less than masking {name} ({numbers})")
        else:
            texts.append(f"dynamic masking and masking {name} cannot be told apart ({numbers})")
    sizes = f"D_t held {_heads(result, 'dynamic'):.1f} heads per step on average against k = {k}"
    return ("; ".join(texts) + f" ({label}; paired differences over the same samples with 95% bootstrap intervals; "
            f"{sizes}, so these comparisons are not size-matched).") if texts else ""


def summary_markdown(results: dict[str, TaskAblation], model_label: str) -> str:
    """The notebook's closing summary: every number with n and its 95% interval, every reading computed
    from the paired differences (:func:`paired_difference`, :func:`matched_controls_verdict`)."""
    lines = [f"**Model:** {model_label}. Masking is {results['niah'].setup.mode}-ablation of `hook_z`; "
             f"the KV cache keeps the {results['niah'].setup.keep_cache} pass of each step. Intervals are 95% "
             "(Wilson for accuracy, bootstrap over samples otherwise); a difference between two conditions is "
             "claimed only where the 95% bootstrap interval of their paired difference (same samples) excludes 0."]
    for task, result in results.items():
        summary = condition_summary(result).set_index("condition")
        metric = result.metric
        name = "NIAH accuracy" if task == "niah" else "HotpotQA (synthetic) F1"
        cells = ", ".join(
            f"{condition.replace('_', ' ')} {summary.loc[condition, metric]:.2f} "
            f"[{summary.loc[condition, f'{metric}_low']:.2f}, {summary.loc[condition, f'{metric}_high']:.2f}]"
            for condition in summary.index)
        n = int(summary["n"].min())
        lines.append(f"- **{name}** (free generation, n = {n} runs per condition): {cells}. "
                     + _paper_comparison(result))
        if "tf_drop" in summary:
            drops = ", ".join(
                f"{condition.replace('_', ' ')} {summary.loc[condition, 'tf_drop']:.3f} "
                f"[{summary.loc[condition, 'tf_drop_low']:.3f}, {summary.loc[condition, 'tf_drop_high']:.3f}]"
                for condition in summary.index)
            lines.append(f"- **{name.split()[0]} teacher-forced** (per-step drop of the gold token's log-probability, "
                         f"nats, mean over the gold continuation's steps, n = {n} samples per condition): {drops}.")
        lines.append(f"- **Matched controls ({name.split()[0]})**: {matched_controls_verdict(result)}")
        prog = progressive_summary(result)
        first, last = prog.iloc[0], prog.iloc[-1]
        interval = lambda row: f"{float(row[metric]):.2f} [{float(row[f'{metric}_low']):.2f}, {float(row[f'{metric}_high']):.2f}]"
        at20 = prog[prog["k"] == 20]
        at20_text = f", {interval(at20.iloc[0])} at k = 20" if len(at20) and int(last["k"]) != 20 else ""
        later = prog[prog["k"] >= 5]
        m_s_text = (f"; compensation m_s (heads masked at the step left out) for k ≥ 5 ranges "
                    f"{later['m_s'].min():.1f}–{later['m_s'].max():.1f} static-top-20 heads") if len(later) else ""
        lines.append(f"- **Progressive masking ({name})** (n = {int(prog['n'].min())} samples per k): "
                     f"{interval(first)} at k = 0{at20_text}, {interval(last)} at k = {int(last['k'])}{m_s_text}"
                     + (" (paper, NIAH on Llama-3.1-8B: 1.0 → 0.0 by k = 20; 4.5–7 compensating heads)." if task == "niah" else "."))
    return "\n".join(lines)
