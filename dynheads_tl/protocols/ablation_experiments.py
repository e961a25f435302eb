"""Claim 2's experiments as cached, batched units: a :class:`Job` is one condition on one sample (generated,
or teacher-forced on the gold continuation), run under the two-pass protocol
(:func:`~dynheads_tl.protocols.two_pass.two_pass_batch`) and summarised into one scores row and the per-head
counts of newly active heads.

Each job has a cache key (:func:`_job_keys`: the model, the prompt, the condition, k, the calibration setup, the
trace settings and :data:`_PROTOCOL_VERSION`); :func:`cached_runs` reads the jobs already cached and hands the
missing ones to the model's executor in batches. :func:`grid_experiment` (Fig 2 / Fig 6) and
:func:`progressive_experiment` (Fig 3 / Fig 7) plan their jobs, batch them per grid cell or per sample, and
assemble the rows.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from itertools import zip_longest

import pandas as pd
import torch
from torch import Tensor

from dynheads_tl.engine.equations import Eq2Rule, head_names
from dynheads_tl.engine.tracing import TraceConfig
from dynheads_tl.executors import cached_units, chunks_by_label
from dynheads_tl.protocols.ablation_metrics import (answer_scores, compensation, overlap_with_dynamic,
                                                    teacher_forced_scores)
from dynheads_tl.protocols.conditions import CONDITIONS, AblationSetup, Condition, condition_spec, make_selector
from dynheads_tl.protocols.stepwise import gold_token_ids
from dynheads_tl.protocols.two_pass import AblationTrace, two_pass_batch
from dynheads_tl.tasks.common import Sample, prompt_digest
from dynheads_tl.engine.models import model_identity
from dynheads_tl.store import result_path


@dataclass(frozen=True)
class Job:
    """One generation of an experiment: a condition on a sample (``sample_seed`` seeds the random baselines);
    ``teacher_forced`` feeds the sample's gold continuation (:func:`gold_token_ids`) instead of generating."""

    sample: Sample
    condition: str
    sample_seed: int = 0
    k: int | None = None
    teacher_forced: bool = False


def run_jobs(model, jobs: list[Job], setup: AblationSetup, config: TraceConfig) -> list[AblationTrace]:
    """Run ``jobs`` as one batch under ``setup``'s protocol (all generated, or all teacher-forced)."""
    forced = {job.teacher_forced for job in jobs}
    if len(forced) > 1:
        raise ValueError("One batch cannot mix teacher-forced and generated jobs; run them in separate batches.")
    gold = [gold_token_ids(model.tokenizer, job.sample) for job in jobs] if forced == {True} else None
    selected = [make_selector(model, job.condition, setup, sample_seed=job.sample_seed, k=job.k) for job in jobs]
    return two_pass_batch(model, [(job.sample, select) for job, (select, _) in zip(jobs, selected)], config,
                          kind=setup.kind, threshold=setup.threshold, mode=setup.mode, mean_z=setup.mean_z,
                          keep_cache=setup.keep_cache, labels=[(job.condition, k) for job, (_, k) in zip(jobs, selected)],
                          gold=gold)


def run_condition(model, sample: Sample, condition: Condition, setup: AblationSetup, config: TraceConfig,
                  *, sample_seed: int = 0, k: int | None = None) -> AblationTrace:
    """One condition on one sample (a batch of one)."""
    return run_jobs(model, [Job(sample, condition, sample_seed, k)], setup, config)[0]


def rule_key(threshold: "float | Eq2Rule"):
    """Eq. 2's rule in a cache key: a fixed threshold as the bare number it always was (older keys still match),
    a chance rule as ``["chance", factor]``."""
    rule = Eq2Rule.of(threshold)
    return rule.value if rule.kind == "fixed" else [rule.kind, rule.value]


def _setup_key(setup: AblationSetup, condition: str | None = None) -> dict:
    """The setup in a job's cache key; the query-focused ranking only in ``query_matched`` jobs and the probe's
    digest only in the jobs of a condition that needs the probe (``predicted``), so adding either leaves every
    other job's key (and its cached run) as it was."""
    needs_probe = condition is not None and setup.probe is not None and "probe" in condition_spec(condition).needs
    mean_z = None if setup.mean_z is None else float(setup.mean_z.double().sum())
    return {"static": setup.static_mask.nonzero().tolist(), "top20": setup.static_top20.nonzero().tolist(),
            "k": setup.k, "kind": setup.kind, "threshold": rule_key(setup.threshold), "mode": setup.mode,
            "keep_cache": setup.keep_cache, "seed": setup.seed, "mean_z": mean_z,
            "order": None if setup.static_order is None else setup.static_order.tolist(),
            **({} if setup.query_order is None or condition != "query_matched"
               else {"query_order": setup.query_order.tolist()}),
            **({"probe": setup.probe.digest} if needs_probe else {})}


def _summarise(result: AblationTrace, setup: AblationSetup) -> dict:
    comp = compensation(result, setup.static_top20, kind=setup.kind, threshold=setup.threshold)
    if result.teacher_forced:
        row = teacher_forced_scores(result)
        if result.condition in CONDITIONS and CONDITIONS[result.condition].overlap:
            row.update(overlap_with_dynamic(result, kind=setup.kind, threshold=setup.threshold,
                                            static_order=setup.static_order))
        return {"row": row, "new_heads": comp["new_heads"].tolist()}
    row = {**answer_scores(result.masked), "m_s": comp["m_s"], "response": result.response,
           "heads_masked_per_step": float(result.masked_heads.flatten(1).sum(1).float().mean()),
           "heads_ever_masked": head_names(result.masked_heads.any(0))}
    return {"row": row, "new_heads": comp["new_heads"].tolist()}


# Bump when the protocol's outputs change, so cached runs of an older protocol are not reused.
# 3: m_s leaves out the heads masked at the step; teacher-forced runs. 4: teacher-forced rows carry tf_drop_t1.
_PROTOCOL_VERSION = 4


_LATER_TRACE_FIELDS = ("stop_at_newline",)


def trace_key(config: TraceConfig) -> dict:
    """The trace settings' part of an ablation job's key: every TraceConfig field as it was when these keys were
    first written; a field added since enters only when it is on, so the cached grids stay valid."""
    return {name: value for name, value in asdict(config).items() if name not in _LATER_TRACE_FIELDS or value}


def _job_keys(model, jobs: list[Job], setup: AblationSetup, config: TraceConfig,
              cache_key: dict | None) -> list[dict | None]:
    """Each job's cache key (None without a ``cache_key``): the model's name and weights, the prompt, the
    condition, k, the calibration setup and the trace settings."""

    trace = trace_key(config)
    return [None if cache_key is None else
            {**cache_key, **model_identity(model),
             "prompt": prompt_digest(job.sample), "condition": job.condition,
             "k": job.k, "sample_seed": job.sample_seed, "setup": _setup_key(setup, job.condition), "trace": trace,
             "protocol": _PROTOCOL_VERSION, "teacher_forced": job.teacher_forced,
             "gold": gold_token_ids(model.tokenizer, job.sample) if job.teacher_forced else None} for job in jobs]


def count_missing(model, jobs: list[Job], setup: AblationSetup, config: TraceConfig, *,
                  cache_key: dict | None = None) -> int:
    """How many of ``jobs`` :func:`cached_runs` would have to run (all of them without a cache). Only checks
    that each entry exists: :func:`cached_runs` reads it (and recomputes one that turns out unreadable)."""

    return sum(key is None or not result_path(key).exists() for key in _job_keys(model, jobs, setup, config, cache_key))


def ablation_units(model, jobs: list[Job], setup: AblationSetup, config: TraceConfig) -> list[dict]:
    """One batch of ablation units (the executors' ``compute``): ``jobs`` run as one batch, each summarised as
    :func:`cached_runs` caches it."""
    return [_summarise(result, setup) for result in run_jobs(model, jobs, setup, config)]


def batch_plan(jobs: list[Job], groups: list, batch_size: int, indices: list[int] | None = None) -> list[list[int]]:
    """The batches :func:`cached_runs` decodes ``jobs[indices]`` in (default: every job): by group (one label per
    job, in order of first appearance), generated and teacher-forced jobs apart, at most ``batch_size`` each.

    Within a group the generated and the teacher-forced batches alternate (the first of each, then the second of
    each, ...). Where a group's two parts list the same samples in the same order (:func:`grid_jobs`'s cells, the
    length grid's), a teacher-forced batch then follows the generated batch that prefilled its prompts and finds
    them in the prefix store (:func:`~dynheads_tl.engine.decoder.shared_prefill`), where its budget holds one
    batch's prompts, instead of prefilling them again (on one worker: a Ray actor keeps its own store, and another
    actor may take the teacher-forced batch). Only the order changed: each batch holds the jobs it held when every
    generated batch of a group came first."""
    indices = list(range(len(jobs))) if indices is None else list(indices)
    parts = chunks_by_label(indices, [(group, bool(job.teacher_forced)) for group, job in zip(groups, jobs)], batch_size)
    return [chunk for group in dict.fromkeys(groups[i] for i in indices)
            for pair in zip_longest(parts.get((group, False), []), parts.get((group, True), []))
            for chunk in pair if chunk]


def cached_runs(model, jobs: list[Job], setup: AblationSetup, config: TraceConfig, *, batch_size: int = 8,
                cache_key: dict | None = None, groups: list | None = None,
                desc: str = "ablation runs") -> list[tuple[dict, Tensor]]:
    """Each job -> (scores row, per-head counts of newly active heads). Jobs already in the cache are
    read from it; the others go to the model's executor (:mod:`dynheads_tl.executors`) in batches of at most
    ``batch_size`` and are cached one by one as their batch comes back. ``groups`` (one label per job) keeps
    jobs of different groups (grid cells, say) in different batches; within a group, generated and
    teacher-forced jobs run apart. A teacher-forced job's row is :func:`teacher_forced_scores`."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
    groups = [None] * len(jobs) if groups is None else list(groups)
    if len(groups) != len(jobs):
        raise ValueError(f"{len(groups)} group labels for {len(jobs)} jobs.")
    outputs = cached_units(model, ablation_units, _job_keys(model, jobs, setup, config, cache_key),
                           lambda missing: batch_plan(jobs, groups, batch_size, missing), lambda i: jobs[i],
                           args=(setup, config), desc=desc)
    return [(out["row"], torch.tensor(out["new_heads"])) for out in outputs]


def grid_jobs(cells: list[tuple[dict, Sample]], conditions, teacher_forced: bool = True) -> list[tuple[list[int], list[Job]]]:
    """:func:`grid_experiment`'s jobs, per grid cell (the samples of one context length and depth): the indices of
    the cell's samples in ``cells`` and its jobs, every condition on every sample, then (with ``teacher_forced``)
    the same jobs teacher-forced."""
    groups: dict[tuple, list[int]] = {}
    for index, (cell, _) in enumerate(cells):
        groups.setdefault((cell.get("context"), cell.get("depth")), []).append(index)
    planned = []
    for members in groups.values():
        jobs = [Job(cells[i][1], condition, sample_seed=i) for i in members for condition in conditions]
        planned.append((members, jobs + ([replace(job, teacher_forced=True) for job in jobs] if teacher_forced else [])))
    return planned


def grid_experiment(model, cells: list[tuple[dict, Sample]], setup: AblationSetup, config: TraceConfig,
                    conditions: list[str] = ("none", "dynamic", "static", "random"), desc: str = "grid",
                    cache_key: dict | None = None, batch_size: int = 8, teacher_forced: bool = True) -> pd.DataFrame:
    """Fig 2 / Fig 6: every condition on every (cell, sample); one row per run.

    With ``teacher_forced`` each run is also teacher-forced on the sample's gold continuation under the
    same condition, and its :func:`teacher_forced_scores` (the ``tf_`` columns) join the run's row.
    The runs of one grid cell (every sample and condition at one context length and depth) are
    batched together, ``batch_size`` rows at a time (generated and teacher-forced runs apart)."""
    rows: list[dict | None] = [None] * (len(cells) * len(conditions))
    group_jobs = grid_jobs(cells, conditions, teacher_forced)
    # Every missing run of every cell goes to the executor at once (batched per cell), then rows are assembled.
    jobs = [job for _, cell_jobs in group_jobs for job in cell_jobs]
    labels = [number for number, (_, cell_jobs) in enumerate(group_jobs) for _ in cell_jobs]
    outputs = cached_runs(model, jobs, setup, config, batch_size=batch_size, cache_key=cache_key, groups=labels,
                          desc=f"{desc}: grid runs")
    start = 0
    for members, cell_jobs in group_jobs:
        cell_outputs, start = outputs[start: start + len(cell_jobs)], start + len(cell_jobs)
        n_runs = len(members) * len(conditions)
        where = [i * len(conditions) + c for i in members for c in range(len(conditions))]
        for position, (slot, job) in enumerate(zip(where, cell_jobs)):
            forced = cell_outputs[n_runs + position][0] if teacher_forced else {}
            rows[slot] = {**cells[slot // len(conditions)][0], "condition": job.condition, **cell_outputs[position][0],
                          **forced}
    return pd.DataFrame(rows)


def progressive_experiment(model, samples: list[Sample], setup: AblationSetup, config: TraceConfig,
                           ks: list[int], desc: str = "progressive", cache_key: dict | None = None,
                           batch_size: int = 8, random_control: bool = True, teacher_forced: bool = False):
    """Fig 3 / Fig 7: mask the top-k ranked heads at each step, for each k. Returns (rows, new-head counts).

    With ``random_control`` each k > 0 also runs its size-matched control, k random heads drawn afresh at each
    step (``progressive_random``); rows say which in ``ranking`` ("ranked" or "random"), and the new-head counts
    come from the ranked runs alone. Each sample's runs (every k, its controls, and its unmasked generation for
    reference) are batched together, and as many samples' runs as fit in ``batch_size`` rows share a batch; every
    row carries the unmasked response, so the k = 0 row can be checked against it. With ``teacher_forced`` every
    (k, ranking) run is also teacher-forced on the sample's gold continuation, and its
    :func:`teacher_forced_scores` (the ``tf_`` columns: the gold token's log-probability drop per step) join its row;
    generated and teacher-forced runs batch apart."""
    rows = []
    new_heads = torch.zeros_like(setup.static_top20, dtype=torch.long)
    plan = [("ranked", "progressive", k) for k in ks]
    plan += [("random", "progressive_random", k) for k in ks if random_control and k > 0]

    def jobs_of(index: int, sample: Sample) -> list[Job]:
        runs = [Job(sample, condition, index, k) for _, condition, k in plan]
        return [Job(sample, "none", index)] + runs + ([replace(job, teacher_forced=True) for job in runs]
                                                      if teacher_forced else [])

    sample_jobs = [jobs_of(index, sample) for index, sample in enumerate(samples)]
    todo = [i for i, jobs in enumerate(sample_jobs) if count_missing(model, jobs, setup, config, cache_key=cache_key)]
    per_group = max(1, batch_size // (len(plan) + 1))
    # Samples with missing runs share batches, per_group samples at a time; every sample's runs go to the executor
    # at once.
    group_of = {index: ("ready", index) for index in range(len(samples))}
    for start in range(0, len(todo), per_group):
        group_of.update({index: ("todo", start) for index in todo[start: start + per_group]})
    jobs = [job for index in range(len(samples)) for job in sample_jobs[index]]
    labels = [group_of[index] for index in range(len(samples)) for _ in sample_jobs[index]]
    outputs = cached_runs(model, jobs, setup, config, batch_size=batch_size, cache_key=cache_key, groups=labels,
                          desc=f"{desc}: runs")
    start = 0
    for index in range(len(samples)):
        size = len(sample_jobs[index])
        (reference, _), *runs = outputs[start: start + size]
        start += size
        generated, forced = runs[: len(plan)], runs[len(plan):]
        for position, ((ranking, _, k), (row, counts)) in enumerate(zip(plan, generated)):
            if ranking == "ranked":
                new_heads += counts.long()
            tf = forced[position][0] if teacher_forced else {}
            rows.append({"sample": index, "k": k, "ranking": ranking, **row, **tf,
                         "unmasked_response": reference["response"]})
    return pd.DataFrame(rows), new_heads
