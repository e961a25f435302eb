"""Notebook 06's pipeline: the static scores and the probe trained on the setting's notebook-01 traces, the retention
conditions (strategies x budgets x granularities), and every condition's answers on new samples, free and
teacher-forced, as cached units on the retention policy (:mod:`dynheads_tl.protocols.retention`).
"""
from __future__ import annotations

import pandas as pd

from dynheads_tl.analysis.correlation import SetProbe
from dynheads_tl.analysis.head_files import scores_digest
from dynheads_tl.analysis.query_focus import query_focused_scores
from dynheads_tl.analysis.scoring import wu_static_scores
from dynheads_tl.corpus import layout_split_samples, layout_traces
from dynheads_tl.engine.models import model_identity
from dynheads_tl.executors import cached_units
from dynheads_tl.protocols.retention import (LLAMA_31_8B, fixed_scores, kv_heads_kept, kv_heads_switched, memory_table,
                                             model_kv_shape,
                                             oracle_scores, predicted_scores, random_scores, retain_batch,
                                             retention_selector)
from dynheads_tl.protocols.stepwise import gold_token_ids
from dynheads_tl.tasks import make_niah_samples
from dynheads_tl.tasks.common import WIDE_STRIDE, mix_seed, prompt_digest
from dynheads_tl.tasks.metrics import niah_accuracy

from .config import QUERY_STATIC, SEEDS, RetentionConfig

__all__ = [
    "training", "conditions", "query_training", "retention_units", "samples_per_batch",
    "evaluation_samples", "run", "memory",
]


def training(model, config: RetentionConfig):
    """(static scores [layer, head], probe: hidden -> per-head scores) from the setting's notebook-01 traces."""
    calibration, analysis = layout_traces(model, config, haystack=config.haystack, context_tokens=config.context_tokens,
                                          n_calibration=config.n_setting_calibration, n_analysis=config.n_setting,
                                          seed=config.seed, use_cache=config.use_cache,
                                          batch_size=config.trace_batch_size)
    override = config.static_override(config.model)  # static_source: the file's scores are the static strategy's ranking
    if override is None:
        static = wu_static_scores(calibration, "KV retention calibration").scores
    else:
        static = override
    probe = SetProbe.fit(calibration + analysis)
    if probe is None:
        raise ValueError("No training answer has two steps: the probe cannot be fitted.")
    return static, probe.predict


def conditions(model, config: RetentionConfig) -> list[dict]:
    """Every (strategy, granularity, budget) run, plus streaming (b = 0) and the full cache; ``b`` in query
    heads or KV heads."""
    n_q = model.cfg.n_layers * model.cfg.n_heads
    n_kv = model.cfg.n_layers * model_kv_shape(model).n_kv_heads
    out = [{"strategy": "full", "granularity": "query", "budget": 1.0, "b": n_q},
           {"strategy": "streaming", "granularity": "query", "budget": 0.0, "b": 0}]
    for granularity in config.granularities:
        units = n_q if granularity == "query" else n_kv
        for budget in config.budgets:
            b = max(1, int(round(budget * units)))
            out += [{"strategy": s, "granularity": granularity, "budget": float(budget), "b": b} for s in config.strategies]
    return out


def query_training(model, config: RetentionConfig):
    """The query-focused scores [layer, head] (:func:`~dynheads_tl.analysis.query_focus.query_focused_scores`, mean
    over samples) of the same calibration prompts as :func:`training`'s static scores, or None when the strategy is
    not run."""
    if QUERY_STATIC not in config.strategies:
        return None
    samples = layout_split_samples(model, config, haystack=config.haystack, context_tokens=config.context_tokens,
                                   n=config.n_setting_calibration, seed=config.seed)
    return query_focused_scores(model, samples, use_cache=config.use_cache).mean(0).float()


def _selector(model, condition: dict, static, probe, sample_seed: int, query=None):
    """The condition's selector; the random strategy's draws are seeded by ``sample_seed`` (run seed and sample);
    ``query_static`` ranks by the query-focused scores ``query``."""
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    if condition["strategy"] == QUERY_STATIC and query is None:
        raise ValueError("The query_static strategy needs the query-focused scores (query_training).")
    group = n_heads // model_kv_shape(model).n_kv_heads
    units = n_layers * n_heads if condition["granularity"] == "query" else n_layers * (n_heads // group)
    scorer = {"static": lambda: fixed_scores(static), "oracle": lambda: oracle_scores,
              "random": lambda: random_scores((n_layers, n_heads), sample_seed),
              "predicted": lambda: predicted_scores(probe, static), QUERY_STATIC: lambda: fixed_scores(query),
              "streaming": lambda: None, "full": lambda: None}[condition["strategy"]]()
    return retention_selector(scorer, condition["b"], granularity=condition["granularity"], group=group,
                              n_units=units)


def _sample_key(model, sample, config: RetentionConfig) -> dict:
    """A sample's cache key: the sample, the conditions, the training data's spec and the model (and, with
    ``static_source``, the file's scores: the key of a run without one is unchanged)."""
    key = {"kind": "kv_retention", "version": 4, "prompt": prompt_digest(sample), "conditions": conditions(model, config),
           "trace": config.trace_config("niah").key(),
           "training": {"haystack": config.haystack, "context_tokens": config.context_tokens, "seed": config.seed,
                        "n": [config.n_setting_calibration, config.n_setting]},
           **model_identity(model)}
    if config.static_source:
        key["static_source"] = scores_digest(config.static_override(config.model))
    return key


def retention_units(model, items: list[tuple], config: RetentionConfig, static, probe, query=None) -> list[list[dict]]:
    """One batch of retention units (the executors' ``compute``): every condition on each ``(sample, index)`` of
    ``items``, free and teacher-forced (no cache). The rows of all the items are decoded together, at most
    ``config.batch_size`` per batch: the conditions that need no clean pass apart from the oracle's, which needs
    one."""
    conds = conditions(model, config)
    group = model.cfg.n_heads // model_kv_shape(model).n_kv_heads
    trace_config = config.trace_config("niah")
    gold = {index: gold_token_ids(model.tokenizer, sample) for sample, index in items}
    rows: dict[int, list[dict]] = {index: [] for _, index in items}
    # Only the oracle reads the clean pass; every other condition runs one retained pass per step.
    runs = [(sample, index, c) for sample, index in items for c in conds]
    oracle = [run for run in runs if run[2]["strategy"] == "oracle"]
    others = [run for run in runs if run[2]["strategy"] != "oracle"]
    chunks = [(part[i: i + config.batch_size], part is oracle) for part in (others, oracle)
              for i in range(0, len(part), config.batch_size)]
    for chunk, needs_clean in chunks:
        jobs = [(sample, _selector(model, c, static, probe, mix_seed(config.seed, index, WIDE_STRIDE), query))
                for sample, index, c in chunk]
        free = retain_batch(model, jobs, trace_config, clean_pass=needs_clean)
        forced = retain_batch(model, jobs, trace_config, clean_pass=needs_clean, gold=[gold[index] for _, index, _ in chunk])
        for (sample, index, c), f, t in zip(chunk, free, forced):
            kept = f.retained_heads.flatten(1).sum(1).float()
            switched = kv_heads_switched(f.retained_heads, group).float()
            rows[index].append({**c, "sample": index, "accuracy": niah_accuracy(f.response, sample.answers[0]),
                                "response": f.response, "gold_logprob": float(t.retained_logprob.mean()),
                                "heads_kept": float(kept.mean()) if len(kept) else float("nan"),
                                "kv_heads_kept": float(kv_heads_kept(f.retained_heads, group).float().mean()),
                                "kv_switches_per_step": float(switched.mean()) if len(switched) else float("nan")})
    return [rows[index] for _, index in items]  # per sample: the one-pass conditions in order, then the oracle's


def samples_per_batch(model, config: RetentionConfig) -> int:
    """How many samples share a decoding batch: as many as fit their one-pass conditions in ``batch_size`` rows
    (at least one). The weights are read once per forward whatever the rows, so fuller batches cost less per row."""
    one_pass = sum(c["strategy"] != "oracle" for c in conditions(model, config))
    return max(1, config.batch_size // max(one_pass, 1))


def evaluation_samples(model, config: RetentionConfig):
    return make_niah_samples(model.tokenizer, n=config.n_samples, context_tokens=config.context_tokens,
                             seed=SEEDS["retention"] + config.seed, haystack=config.haystack,
                             random_layout=True, max_new_tokens=config.max_new_tokens, max_tokens=int(model.cfg.n_ctx))


def run(model, config: RetentionConfig) -> pd.DataFrame:
    """Every sample's rows: cached samples read back, the missing ones (one unit each: every condition of the
    sample, batched) computed by the model's executor and cached as they come back."""
    static, probe = training(model, config)
    query = query_training(model, config)
    samples = evaluation_samples(model, config)
    keys = [_sample_key(model, sample, config) if config.use_cache else None for sample in samples]
    size = samples_per_batch(model, config)
    per_sample = cached_units(model, retention_units, keys,
                              lambda missing: [missing[start: start + size] for start in range(0, len(missing), size)],
                              lambda i: (samples[i], i), args=(config, static, probe, query),
                              desc="KV retention (every condition per sample)")
    return pd.DataFrame([row for rows in per_sample for row in rows])


def memory(model, config: RetentionConfig, table: pd.DataFrame) -> pd.DataFrame:
    """Computed KV memory per sequence (GiB, bf16) for this model and Llama-3.1-8B, at the share of KV heads each
    condition actually kept whole per step (a KV head counts when any of its query heads is retained), for each
    strategy and budget run; and ``MiB_switched_per_step_at_8k`` / ``_128k``: what the condition's share of KV heads
    switched in per step (``kv_switches_per_step``, NaN for runs that did not count it) brings back per step."""
    shape = model_kv_shape(model)
    total = shape.n_layers * shape.n_kv_heads
    frames = []
    for r in table.itertuples():
        share = float(r.kv_heads_kept) / total
        for kv in (shape, LLAMA_31_8B):
            row = memory_table([kv], [share], sink_tokens=config.sink_tokens, local_window=config.local_window).iloc[0]
            # Switching traffic: this run's share of KV heads switched in per step, at the model's size.
            switched = float(getattr(r, "kv_switches_per_step", float("nan"))) / total * kv.n_layers * kv.n_kv_heads
            traffic = {f"MiB_switched_per_step_at_{tokens // 1000}k":
                       switched * kv.switch_bytes(tokens, config.sink_tokens, config.local_window) / 2**20
                       for tokens in (8_000, 128_000)}
            frames.append({"strategy": r.strategy, "granularity": r.granularity, "budget": r.budget, **row.to_dict(),
                           **traffic})
    return pd.DataFrame(frames)
