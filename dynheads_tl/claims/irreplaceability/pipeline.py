"""Claim 2's pipeline: calibration (static set and k), the grid of masking conditions (each run generated and
teacher-forced) and progressive masking, on the two-pass protocol (:mod:`dynheads_tl.protocols.ablation`).
"""
from __future__ import annotations

import logging
import random
from dataclasses import dataclass
import pandas as pd
import torch

from dynheads_tl.protocols.ablation import (AblationSetup, compensation_table, grid_conditions, grid_experiment,
                                           progressive_experiment)
from dynheads_tl.corpus import collect_traces, traces_with_placebo
from dynheads_tl.engine.equations import Eq2Rule
from dynheads_tl.engine.hooks import StepState, z_hook_name
from dynheads_tl.analysis.head_probe import next_step_probe
from dynheads_tl.analysis.scoring import (calibrate_chance_factor, dynamic_sets, static_eq2_scores, static_top_k,
                                          wu_static_scores)
from dynheads_tl.tasks import NiahConfig, build_niah_sample, make_hotpot_samples, make_niah_samples
from dynheads_tl.tasks.common import mix_seed
from dynheads_tl.tasks.hotpot import HotpotConfig, build_hotpot_sample, hotpot_label, synthetic_hotpot_records
from dynheads_tl.tasks.hotpot_sources import distractor_paragraphs, source_key, source_records, split_records
from dynheads_tl.engine.tracing import TraceConfig, trace_generation

from .config import GRID_MAX_OFFSET, SEEDS, IrreplaceabilityConfig
from dynheads_tl.analysis.query_focus import query_focused_scores

__all__ = ["mean_head_outputs", "calibrate", "grid_cells", "progressive_samples", "TaskAblation", "run_task"]


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
    """Static set (top-k with k = mean calibration |D_t|), static top-20, k, and the ``predicted`` condition's
    probe, from a calibration split (never the grid's samples).

    The probe is claim 3's MLP at lag k = 1 (:func:`~dynheads_tl.analysis.head_probe.next_step_probe`: hidden[n] ->
    step n + 1's Eq. 1 set for NIAH, its Eq. 2 scores for HotpotQA, as Tables 2 and 3 train them), fitted on the
    calibration traces alone, seeded by ``config.seed`` and cached with ``use_cache``; without a calibration trace of
    two steps there is none, and ``predicted`` is left out of the grid."""
    trace_config = config.trace_config(task)
    seed = SEEDS["ablation_calibration"] + config.seed
    if task == "niah":
        samples = make_niah_samples(model.tokenizer, n=config.n_calibration, context_tokens=config.niah_contexts,
                                    seed=seed, max_new_tokens=config.max_new_tokens, max_tokens=int(model.cfg.n_ctx))
        spec = dict(task="niah", split="calibration", n=config.n_calibration, contexts=config.niah_contexts, seed=seed)
    else:
        samples = make_hotpot_samples(model.tokenizer, n=config.n_calibration, seed=seed, max_tokens=int(model.cfg.n_ctx),
                                      records=split_records(config, "calibration"))
        spec = dict(task="hotpot", split="calibration", n=config.n_calibration, seed=seed,
                    **source_key(config.hotpot_source, samples))
    placebo = None
    if task == "hotpot" and config.eq2_rule == "chance":  # the factor from this split's own placebo spans
        traces, placebo = traces_with_placebo(model, samples, trace_config, spec, seed=seed, use_cache=config.use_cache,
                                              batch_size=config.trace_batch_size,
                                              desc="hotpot calibration with placebo spans")
    else:
        traces = collect_traces(model, samples, trace_config, spec, use_cache=config.use_cache,
                                batch_size=config.trace_batch_size, desc=f"{task} calibration")
    rule = Eq2Rule("fixed", config.eq2_threshold)
    if task == "niah":
        scores = wu_static_scores(traces, "NIAH calibration").scores
        sets = [dynamic_sets(t, "eq1") for t in traces]
    else:
        scores = static_eq2_scores(traces)
        if placebo is not None:
            rule = Eq2Rule("chance", calibrate_chance_factor(placebo, config.eq2_false_rate))
        sets = [dynamic_sets(t, "eq2", rule) for t in traces]
    override = config.static_override(config.model)  # static_source: the file's scores rank the static heads; k stays |D_t|'s
    if override is not None:
        scores = override
    sizes = torch.cat([s.flatten(1).sum(1) for s in sets]).float()
    k = max(int(round(float(sizes.mean()))), 1)
    mean_z = mean_head_outputs(model, samples, trace_config) if config.ablation_mode == "mean" else None

    # The second static baseline: QRHead-style query-focused scores on the same calibration prompts
    try:
        query = query_focused_scores(model, samples, use_cache=config.use_cache).mean(0)
    except ValueError as error:  # a prompt the null query cannot be placed in: the condition is left out
        logging.getLogger(__name__).warning("%s: no query-focused ranking (%s); query_matched is not run.", task, error)
        query = None
    probe = next_step_probe(traces, "classification" if task == "niah" else "regression", config.probe_config(),
                            use_cache=config.use_cache)
    if probe is None:
        logging.getLogger(__name__).warning("%s: no calibration answer has two steps, so no probe; predicted is not "
                                            "run.", task)
    return AblationSetup(static_mask=static_top_k(scores, k), static_top20=static_top_k(scores, min(20, scores.numel())),
                         k=k, kind="eq1" if task == "niah" else "eq2", threshold=rule,
                         mode=config.ablation_mode, keep_cache=config.keep_cache, mean_z=mean_z, seed=config.seed,
                         static_order=torch.argsort(scores.flatten(), descending=True, stable=True),
                         query_order=None if query is None else torch.argsort(query.flatten(), descending=True,
                                                                              stable=True),
                         probe=probe)


def grid_cells(model, config: IrreplaceabilityConfig, task: str):
    cells, seed = [], SEEDS["ablation_grid"] + config.seed
    contexts = config.niah_contexts if task == "niah" else config.hotpot_contexts
    depths = config.niah_depths if task == "niah" else config.hotpot_depths
    records, pool = None, []
    if task == "hotpot":
        records = split_records(config, "grid")
        if records is None:
            records = synthetic_hotpot_records(len(contexts) * len(depths) * config.runs_per_cell, seed=seed)
            pool = [tuple(p) for r in synthetic_hotpot_records(64, seed=SEEDS["distractor_pool"] + config.seed)
                    for p in r["context"]]
        else:  # the source's other paragraphs; never a question's own gold ones (build_hotpot_sample)
            pool = distractor_paragraphs(source_records(config.hotpot_source,
                                                        skip_incomplete=config.hotpot_skip_incomplete))
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
                                               seed=mix_seed(seed, i), max_new_tokens=config.max_new_tokens,
                                               haystack_offset=offset), max_tokens=int(model.cfg.n_ctx))
                else:
                    sample = build_hotpot_sample(model.tokenizer, records[i],
                                                 HotpotConfig(context_tokens=context, depth=depth, seed=seed + i),
                                                 max_tokens=int(model.cfg.n_ctx), distractor_pool=pool,
                                                 exclusive=config.hotpot_source != "synthetic")
                cells.append((cell, sample))
                i += 1
    return cells


def progressive_samples(model, config: IrreplaceabilityConfig, task: str):
    seed = SEEDS["progressive"] + config.seed
    if task == "niah":
        return make_niah_samples(model.tokenizer, n=config.n_progressive, context_tokens=config.progressive_context,
                                 seed=seed, max_new_tokens=config.max_new_tokens, max_tokens=int(model.cfg.n_ctx))
    return make_hotpot_samples(model.tokenizer, n=config.n_progressive, seed=seed, max_tokens=int(model.cfg.n_ctx),
                               records=split_records(config, "progressive"))


@dataclass
class TaskAblation:
    task: str
    setup: AblationSetup
    grid: pd.DataFrame
    progressive: pd.DataFrame
    compensation: pd.DataFrame
    hotpot_source: str = "synthetic"

    @property
    def metric(self) -> str:
        return "accuracy" if self.task == "niah" else "f1"

    @property
    def data_label(self) -> str:
        """The task's name in every sentence: "NIAH", "HotpotQA", or "HotpotQA (synthetic)"."""
        return "NIAH" if self.task == "niah" else hotpot_label(self.hotpot_source)


def run_task(model, config: IrreplaceabilityConfig, task: str) -> TaskAblation:
    setup = calibrate(model, config, task)
    trace_config = config.trace_config(task)
    cache_key = {"claim": 2, "task": task} if config.use_cache else None
    conditions = list(grid_conditions(setup))  # the registered grid conditions this setup can build
    grid = grid_experiment(model, grid_cells(model, config, task), setup, trace_config, conditions=conditions,
                           desc=f"{task} grid", cache_key=cache_key, batch_size=config.batch_size, teacher_forced=True)
    progressive, new_heads = progressive_experiment(model, progressive_samples(model, config, task), setup,
                                                    trace_config, config.progressive_ks, desc=f"{task} progressive",
                                                    cache_key=cache_key, batch_size=config.batch_size,
                                                    teacher_forced=True)
    return TaskAblation(task, setup, grid, progressive, compensation_table(new_heads, setup.static_top20),
                        hotpot_source=config.hotpot_source)
