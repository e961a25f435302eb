"""Decoding at the hardware's pace: the grouped step, the preallocated cache and shared prefixes, measured.

    python bench/bench_decoding.py                         # every part, 8 rows x ~1k tokens
    python bench/bench_decoding.py --parts decode share    # a few parts
    python bench/bench_decoding.py --rows 8 --length 1000 --steps 16 --repeats 2
    python bench/bench_decoding.py --model gemma-3-270m --parts trace --trace-rows 1 8 --length 2000

Parts (results as Markdown table rows, for docs/decoding.md):
- ``decode``: ms per decoding step of one batch of ``--rows`` NIAH prompts (one haystack, ``--length``
  context tokens, left-padded), for the grouped step, the bridge's eager step (the reference, also on the
  preallocated cache) and transformers' own SDPA decode (``DynamicCache``, the same padded keys and values);
- ``trace``: ``trace_batch`` of those prompts (traced: Eq. 1/2 reductions every step) against transformers
  ``generate`` of the same left-padded batch (untraced, SDPA, logits of the last position only), both ``--steps``
  tokens; today's path (eager attention, no shared prefixes) beside it; one row per ``--trace-rows`` batch size;
- ``share``: the share of prompt positions actually prefilled on the default NIAH splits (the calibration and
  analysis splits of seed 0 at the default settings, in the batches ``collect_traces`` forms), sharing within a
  batch only and with the prefix store across the split's batches (token arithmetic: no model run);
- ``rag``: the RAG answers of ``--runs`` default evaluation questions, every strategy, one question after another:
  each question's strategies together (their generation up to the first retrieval decoded once) and one strategy
  at a time, each with and without the prefix store (the batches of one question share its prefill);
- ``grid``: a small stand-in for a grid cell of notebook 02 (``--runs`` samples x four conditions, one batch,
  ``run_jobs``), per generation, against one plain traced generation, with the new path and with today's;
- ``cell``: a grid cell of notebook 02 as the notebook runs it (its defaults: ``runs_per_cell`` samples x every
  grid condition, generated and teacher-forced, from its calibration), decoded ``--batch-sizes`` rows at a time,
  per job against one plain traced generation (not in the default parts: it takes minutes);
- ``trace_batch``: the first ``--rows`` samples of the default NIAH analysis split traced in batches of each of
  ``--trace-batch-sizes`` (``trace_batch_size``), per sample;
- ``retention``: notebook 06's units as the notebook runs them (its default conditions, free and teacher-forced,
  on its first ``--retention-samples`` evaluation samples), with ``batch_size`` each of ``--retention-batch-sizes``,
  per sample (not in the default parts: it takes minutes);
- ``length``: the cost of a long context (``--long-tokens``, default 8000, one prompt and ``--long-rows`` prompts
  of one haystack at different depths, so they share its prefix): ``trace_batch`` (traced: Eq. 1/2 every step)
  against transformers ``generate`` (SDPA, untraced) of the same prompts, ``--steps`` tokens, and ms per decoding
  step of the grouped step against transformers' SDPA decode on the prefilled cache;
- ``length_memory``: peak resident memory of one traced generation at each of ``--memory-lengths`` context tokens,
  each in a fresh process (the model loaded first, then its resident size subtracted), beside the KV cache the
  decoder holds per row: linear in the context when no whole-prompt score matrix is kept; once per each of
  ``--prefill-chunks`` (the SDPA twin's ``PREFILL_CHUNK``; 0: the whole prompt in one call) and of ``--windows``
  (sliding layers bounded by their window, or keeping every key) and of ``--twin-attention`` (the twin's windowed
  SDPA, or transformers' stock SDPA); with the traced generation's seconds and, apart, the prefill's (a decoder
  built on the same prompt);
- ``length_share``: notebook 07's default grid (its default configuration): the share of prompt positions
  actually prefilled when the rows of one length share their haystack up to the needle, for its traces and for
  its masking runs (every condition of a sample, generated and teacher-forced, shares the sample's prompt)
  (token arithmetic: the tokenizer only);
- ``batch_memory``: peak resident memory of building one ``BatchDecoder`` over ``--memory-rows`` distinct prompts of
  ``--long-tokens`` random token ids each (no shared prefix), in a fresh process (the model loaded first, then its
  resident size subtracted), beside the batch's own cache; outside a prefix store (inside one, as the executors
  run batches, the store keeps up to its budget of the prefill caches besides). The child runs in the temporary
  folder, so the package comes from ``PYTHONPATH``: run it with another checkout there to compare versions;
- ``query``: the query-focused scores (QRHead-style, notebooks 01, 02 and 06) of the first ``--rows`` samples of the
  default NIAH calibration split of seed 0, with the context prefilled once by the SDPA twin and only the query tokens
  run through the hooked bridge (``query_focused_scores``), against one hooked pass over each whole prompt (the
  reference), per sample, with the largest difference in a score.

Every transformers baseline runs the fast twin with transformers' stock SDPA (``stock_attention``), not the windowed
attention it prefills with (``dynheads_tl.engine.windowed``).

Timings of one part are taken in one process, interleaved, minimum over ``--repeats``: compare ratios within a
run (other jobs may share the cores).
"""
from __future__ import annotations

import argparse
import time

import torch

import dynheads_tl
from dynheads_tl import TraceConfig, fast_twin, trace_batch, trace_generation
from dynheads_tl.engine.grouped import attention_path
from dynheads_tl.engine.decoder import BatchDecoder, prefix_plan, prefix_sharing, shared_prompts
from dynheads_tl.engine.windowed import stock_attention, stock_generate
from dynheads_tl.tasks import make_niah_samples


def best_of(runs: dict, repeats: int) -> tuple[dict[str, float], dict]:
    best, last = {name: float("inf") for name in runs}, {}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            last[name] = run()
            best[name] = min(best[name], time.perf_counter() - start)
    return best, last


def niah_batch(model, rows: int, length: int, steps: int):
    return make_niah_samples(model.tokenizer, n=rows, context_tokens=length, seed=7, max_new_tokens=steps)


def left_padded(model, samples):
    width = max(len(s.prompt_ids) for s in samples)
    pad = model.tokenizer.pad_token_id or 0
    ids = torch.full((len(samples), width), pad, dtype=torch.long)
    mask = torch.zeros((len(samples), width), dtype=torch.long)
    for b, sample in enumerate(samples):
        ids[b, width - len(sample.prompt_ids):] = torch.tensor(sample.prompt_ids)
        mask[b, width - len(sample.prompt_ids):] = 1
    return ids, mask


def part_decode(model, args) -> None:
    from transformers import DynamicCache

    samples = niah_batch(model, args.rows, args.length, args.steps)
    decoder = BatchDecoder(model, [s.prompt_ids for s in samples], max_new_tokens=args.steps)
    base, k = decoder.n_cached, args.steps
    first = decoder.pending.clone()
    twin = fast_twin(model)
    offsets = decoder.offsets

    def ours(path):
        decoder.attention = path
        decoder.rewind(base)
        tokens = first
        for _ in range(k):
            tokens = decoder.step(tokens).argmax(-1)
        assert decoder.last_path == path
        return tokens

    def transformers_decode():
        past = DynamicCache()
        for index in range(len(decoder.cache.keys)):
            past.update(*decoder.cache.padded(index, base), index)
        tokens = first
        with torch.no_grad(), stock_attention(twin):
            for step in range(k):
                end = base + step + 1
                positions = torch.arange(end)[None, :] - offsets[:, None]
                out = twin(input_ids=tokens[:, None], past_key_values=past, use_cache=True,
                           attention_mask=(positions >= 0).long(), position_ids=positions[:, -1:].clamp_min(0))
                past = out.past_key_values
                tokens = out.logits[:, -1].argmax(-1)
        return tokens

    best, last = best_of({"grouped": lambda: ours("grouped"), "eager": lambda: ours("eager"),
                          "transformers": transformers_decode}, args.repeats)
    same = bool(torch.equal(last["grouped"], last["eager"]) and torch.equal(last["grouped"], last["transformers"]))
    ms = {name: 1000 * seconds / k for name, seconds in best.items()}
    print("| rows x prompt tokens | grouped ms/step | eager (bridge) ms/step | transformers SDPA ms/step | "
          "grouped / transformers | eager / transformers |")
    print("|---|---|---|---|---|---|")
    print(f"| {args.rows} x {int(decoder.prompt_lengths.max())} | {ms['grouped']:.0f} | {ms['eager']:.0f} | "
          f"{ms['transformers']:.0f} | {ms['grouped'] / ms['transformers']:.2f} | {ms['eager'] / ms['transformers']:.2f} |"
          f"  <!-- {k} steps, same last tokens: {same} -->", flush=True)


def part_trace(model, args) -> None:
    print("| model | rows x context | steps | transformers generate s | traced s | today's path s | "
          "traced / transformers | today / transformers |")
    print("|---|---|---|---|---|---|---|---|")
    for rows in args.trace_rows or [args.rows]:
        _trace_row(model, args, rows)


def _trace_row(model, args, rows: int) -> None:
    samples = niah_batch(model, rows, args.length, args.steps)
    config = TraceConfig(max_new_tokens=args.steps, stop_at_eos=False)
    ids, mask = left_padded(model, samples)
    twin = fast_twin(model)

    def today():
        with attention_path("eager"), prefix_sharing(False):
            return trace_batch(model, samples, config)

    best, last = best_of({
        "transformers": lambda: stock_generate(twin, ids, attention_mask=mask, max_new_tokens=args.steps,
                                               min_new_tokens=args.steps, do_sample=False),
        "traced": lambda: trace_batch(model, samples, config),
        "today": today,
    }, args.repeats)
    same = sum(torch.equal(a.tokens, b.tokens) and torch.equal(a.retrieval_mask, b.retrieval_mask)
               for a, b in zip(last["traced"], last["today"]))
    hf_same = sum(a.tokens.tolist() == row[ids.shape[1]:].tolist() for a, row in zip(last["traced"], last["transformers"]))
    print(f"| {args.model} | {rows} x {args.length} | {args.steps} | {best['transformers']:.1f} | {best['traced']:.1f} | "
          f"{best['today']:.1f} | {best['traced'] / best['transformers']:.2f} | {best['today'] / best['transformers']:.2f} |"
          f"  <!-- traced = today (tokens, Eq. 1): {same}/{len(samples)}; tokens = transformers: "
          f"{hf_same}/{len(samples)} -->", flush=True)


class _MetaCache:
    """A stand-in for a prefilled cache of ``n`` positions (meta tensors: shapes and bytes, no memory), so the
    share part replays the decoder's prefix store without running the model."""

    def __init__(self, model, n: int):
        n_kv = getattr(model.cfg, "n_key_value_heads", None) or model.cfg.n_heads
        shape = (1, n_kv, n, model.cfg.d_head)
        layer = type("Layer", (), {"keys": torch.empty(shape, device="meta"),
                                   "values": torch.empty(shape, device="meta")})()
        self.layers = [layer] * model.cfg.n_layers


def _replay(model, batches: list[list[tuple[int, ...]]], store) -> tuple[int, int, int]:
    """Positions prefilled by :class:`BatchDecoder` for ``batches`` in order: (every row alone, distinct prompts,
    with shared prefixes), where ``store`` (a PrefixStore or None) carries prefixes across batches exactly as
    ``BatchDecoder._prefill_distinct`` does."""
    total = distinct_total = shared_total = 0
    for prompts in batches:
        total += sum(len(p) - 1 for p in prompts)
        distinct = list(dict.fromkeys(prompts))
        distinct_total += sum(len(p) - 1 for p in distinct)
        splits = [len(p) - 1 for p in distinct]
        for index, _, shared in prefix_plan(distinct, splits):
            found = store.take(model, distinct[index], splits[index], longer_than=shared) if store is not None else None
            if found is not None:
                shared = found[1]
            shared_total += splits[index] - shared
            if store is not None:
                store.add(model, distinct[index], _MetaCache(model, splits[index]), splits[index])
    return total, distinct_total, shared_total


def part_share(model, args) -> None:
    """The default NIAH splits of seed 0, in ``collect_traces``' batches: positions prefilled with sharing within
    a batch only, and with the executor's prefix store carrying prefixes across the batches of a split (one
    ``collect_traces`` call: one store, of the default budget)."""
    from dynheads_tl.corpus import TraceSets, niah_split_samples
    from dynheads_tl.engine.decoder import PrefixStore, store_budget

    sets = TraceSets()
    print("| split (seed 0, default settings) | samples | batch | prompt positions | prefilled, distinct prompts only "
          "| prefilled, shared within a batch | prefilled, shared across the split's batches | share prefilled "
          "(within / across) |")
    print("|---|---|---|---|---|---|---|---|")
    for split, n in (("calibration", sets.n_calibration), ("analysis", sets.n_analysis)):
        samples = niah_split_samples(model, sets, 0, split)
        batch = sets.trace_batch_size
        batches = [[tuple(s.prompt_ids) for s in samples[start: start + batch]] for start in range(0, n, batch)]
        total, distinct_total, within = _replay(model, batches, None)
        _, _, across = _replay(model, batches, PrefixStore(store_budget()))
        print(f"| NIAH {split} | {n} | {batch} | {total} | {distinct_total} | {within} | {across} | "
              f"{within / total:.2f} / {across / total:.2f} |", flush=True)


def part_grid(model, args) -> None:
    from dynheads_tl.protocols.ablation import AblationSetup, Job, run_jobs

    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    config = TraceConfig(max_new_tokens=args.steps, stop_at_eos=False)
    static = torch.zeros(n_layers, n_heads, dtype=torch.bool)
    static.view(-1)[torch.randperm(n_layers * n_heads, generator=torch.Generator().manual_seed(0))[:5]] = True
    setup = AblationSetup(static_mask=static, static_top20=static, k=5)
    samples = make_niah_samples(model.tokenizer, n=args.runs, context_tokens=args.length, depths=[0.5], seed=11)
    jobs = [Job(sample, condition, i) for i, sample in enumerate(samples)
            for condition in ("none", "dynamic", "static", "random")]

    def today(run):
        with attention_path("eager"), prefix_sharing(False):
            return run()

    best, last = best_of({
        "plain": lambda: trace_generation(model, samples[0], config),
        "plain_today": lambda: today(lambda: trace_generation(model, samples[0], config)),
        "grid": lambda: run_jobs(model, jobs, setup, config),
        "grid_today": lambda: today(lambda: run_jobs(model, jobs, setup, config)),
    }, args.repeats)
    same = sum(torch.equal(a.masked.tokens, b.masked.tokens) for a, b in zip(last["grid"], last["grid_today"]))
    print("| context | jobs | plain traced s (today) | grid cell s (today) | grid per generation / plain, new | "
          "today's ratio (today's grid / today's plain) |")
    print("|---|---|---|---|---|---|")
    print(f"| {args.length} | {len(jobs)} | {best['plain']:.1f} ({best['plain_today']:.1f}) | {best['grid']:.1f} "
          f"({best['grid_today']:.1f}) | {best['grid'] / len(jobs) / best['plain']:.2f} | "
          f"{best['grid_today'] / len(jobs) / best['plain_today']:.2f} |"
          f"  <!-- identical masked tokens {same}/{len(jobs)} -->", flush=True)


def part_rag(model, args) -> None:
    """Notebook 04's answers of ``--runs`` default evaluation questions, every strategy, question by question as
    ``rag.run_units`` orders them: each question's strategies answered together (their generation up to the first
    retrieval decoded once, ``rag.rag_generate_many``) and one strategy at a time (the path before), each with the
    executor's prefix store (a question's later batches copy its prefill) and without it."""
    from dynheads_tl.claims.dynamic_rag.config import RagStudyConfig
    from dynheads_tl.claims.dynamic_rag.pipeline import evaluation_samples
    from dynheads_tl.engine.decoder import shared_prefill
    from dynheads_tl.protocols.rag import STRATEGIES, rag_units, run_units

    study = RagStudyConfig()
    config = study.rag_config(rind_threshold=1.0)
    samples = evaluation_samples(model, study)[: args.runs]
    generator = torch.Generator().manual_seed(0)
    static = torch.rand(model.cfg.n_layers, model.cfg.n_heads, generator=generator)
    weights = torch.randn(model.cfg.d_model, model.cfg.n_layers * model.cfg.n_heads, generator=generator)
    probe = lambda hidden: (hidden @ weights).reshape(model.cfg.n_layers, model.cfg.n_heads)
    units = [(strategy, index, sample) for strategy in STRATEGIES for index, sample in enumerate(samples)]
    in_order = sorted(range(len(units)), key=lambda i: (units[i][1], i))  # question by question, as run_units

    def together():
        return run_units(model, units, config, static_scores=static, probe=probe)

    def alone():
        results = [None] * len(units)
        with shared_prefill():  # as an executor runs a call's batches
            for i in in_order:
                results[i] = rag_units(model, [units[i]], config, static, probe)[0]
        return results

    def without_store(run):
        def unshared():
            with prefix_sharing(False):
                return run()
        return unshared

    best, last = best_of({"together": together, "alone": alone, "together_no_store": without_store(together),
                          "alone_no_store": without_store(alone)}, args.repeats)
    answer = lambda r: (r["response"], r["retrievals"], r["visible_context_tokens"], r["evidence_recall"])
    same = sum(len({answer(runs[i]) for runs in last.values()}) == 1 for i in range(len(units)))
    exact = sum(a == b for a, b in zip(last["together_no_store"], last["alone_no_store"]))
    drift = max((abs(x - y) for a, b in zip(last["together"], last["together_no_store"])
                 for x, y in zip(a["rind_values"], b["rind_values"])), default=0.0)
    retrieved = sum(result["retrievals"] for result in last["together"])
    print("| questions x strategies | together s | one at a time s | together, no prefix store s | "
          "one at a time, no prefix store s | together / one at a time |")
    print("|---|---|---|---|---|---|")
    print(f"| {len(samples)} x {len(STRATEGIES)} | {best['together']:.1f} | {best['alone']:.1f} | "
          f"{best['together_no_store']:.1f} | {best['alone_no_store']:.1f} | {best['together'] / best['alone']:.2f} |"
          f"  <!-- identical answers in all four {same}/{len(units)}; together = one at a time in every field without "
          f"the store {exact}/{len(units)}; largest RIND value difference with / without the store {drift:.1e}; "
          f"{retrieved} retrievals -->", flush=True)


def part_cell(model, args) -> None:
    """One grid cell of notebook 02 as the notebook runs it: its default configuration's first NIAH cell (first
    context length and depth, ``runs_per_cell`` samples, every grid condition, generated and teacher-forced) from its
    own calibration (read from the cache, or traced there: a user cache, never the repository), decoded in the
    batches ``cached_runs`` forms at each of ``--batch-sizes``, against one plain traced generation of the cell's
    first sample. The batch sizes' generated tokens are compared row by row. The largest batch size runs once more
    with a copy of the prompt's keys and values per row (``shared_prompts(False)``), against one copy per prompt."""
    from dynheads_tl.claims.irreplaceability.config import IrreplaceabilityConfig
    from dynheads_tl.claims.irreplaceability.pipeline import calibrate, grid_cells
    from dynheads_tl.protocols.ablation import batch_plan, grid_conditions, grid_jobs, run_jobs

    config = IrreplaceabilityConfig() if args.cell_runs is None else IrreplaceabilityConfig(runs_per_cell=args.cell_runs)
    setup = calibrate(model, config, "niah")
    trace_config = config.trace_config("niah")
    conditions = list(grid_conditions(setup))  # as notebook 02 runs them
    cells = grid_cells(model, config, "niah")
    members, jobs = grid_jobs(cells, conditions, teacher_forced=True)[0]
    sample = cells[members[0]][1]
    plans = {size: batch_plan(jobs, [0] * len(jobs), size) for size in args.batch_sizes}
    runs = {"plain": lambda: trace_generation(model, sample, trace_config)}
    for size, plan in plans.items():
        runs[size] = lambda plan=plan: [trace for chunk in plan
                                        for trace in run_jobs(model, [jobs[i] for i in chunk], setup, trace_config)]

    def own_copies(run):  # every row its own copy of its prompt's keys and values (before shared prompts)
        def unshared():
            with shared_prompts(False):
                return run()
        return unshared

    largest = max(args.batch_sizes)
    runs["copies"] = own_copies(runs[largest])
    best, last = best_of(runs, args.repeats)
    first = args.batch_sizes[0]
    print(f"NIAH cell: context {cells[members[0]][0]['context']}, depth {cells[members[0]][0]['depth']}, "
          f"{len(members)} samples x {len(conditions)} conditions, generated and teacher-forced = {len(jobs)} jobs, "
          f"{trace_config.max_new_tokens} steps at most; plain traced generation {best['plain']:.1f} s "
          f"({len(last['plain'].tokens)} tokens)")
    print("| batch_size | batches | cell s | per job s | per job / one plain generation | "
          f"tokens equal to batch_size {first} |")
    print("|---|---|---|---|---|---|")
    for size in args.batch_sizes:
        same = sum(torch.equal(a.masked.tokens, b.masked.tokens) for a, b in zip(last[size], last[first]))
        print(f"| {size} | {len(plans[size])} | {best[size]:.1f} | {best[size] / len(jobs):.2f} | "
              f"{best[size] / len(jobs) / best['plain']:.2f} | {same}/{len(jobs)} |", flush=True)
    same = sum(torch.equal(a.masked.tokens, b.masked.tokens) for a, b in zip(last["copies"], last[first]))
    print(f"| {largest}, a copy of the prompt per row | {len(plans[largest])} | {best['copies']:.1f} | "
          f"{best['copies'] / len(jobs):.2f} | {best['copies'] / len(jobs) / best['plain']:.2f} | {same}/{len(jobs)} |"
          f"  <!-- one copy per prompt / a copy per row: {best[largest] / best['copies']:.2f} -->", flush=True)


def part_trace_batch(model, args) -> None:
    """The default NIAH analysis split of seed 0 (its first ``--rows`` samples, the default
    settings) traced in ``collect_traces``' batches of each of ``--trace-batch-sizes`` (no cache), per sample; the
    batch sizes' tokens are compared sample by sample."""
    from dynheads_tl.corpus import TraceSets, niah_split_samples

    sets = TraceSets(n_analysis=args.rows)
    samples = niah_split_samples(model, sets, 0, "analysis")
    config = sets.trace_config("niah")
    runs = {size: (lambda size=size: [trace for start in range(0, len(samples), size)
                                      for trace in trace_batch(model, samples[start: start + size], config)])
            for size in args.trace_batch_sizes}
    best, last = best_of(runs, args.repeats)
    first = args.trace_batch_sizes[0]
    print(f"| samples (NIAH analysis split, seed 0, {sets.context_tokens} tokens, {config.max_new_tokens} steps) | "
          f"trace_batch_size | s | s per sample | tokens equal to trace_batch_size {first} |")
    print("|---|---|---|---|---|")
    for size in args.trace_batch_sizes:
        same = sum(torch.equal(a.tokens, b.tokens) for a, b in zip(last[size], last[first]))
        print(f"| {len(samples)} | {size} | {best[size]:.1f} | {best[size] / len(samples):.2f} | {same}/{len(samples)} |",
              flush=True)


def part_retention(model, args) -> None:
    """Notebook 06's retention units with its default configuration: the first ``--retention-samples`` evaluation
    samples, every condition free and teacher-forced, in the chunks ``kv_retention.run`` forms (``samples_per_batch``)
    at each ``batch_size`` of ``--retention-batch-sizes``, per sample. The static ranking and the probes are trained as
    the notebook trains them (from the cache when it holds the training traces: point ``DYNHEADS_CACHE`` at a report's
    cache, never the repository). Rows are compared across batch sizes: responses exactly, gold log-probabilities to
    1e-4."""
    from dynheads_tl.claims.kv_retention.config import RetentionConfig
    from dynheads_tl.claims.kv_retention.pipeline import (evaluation_samples, query_training, retention_units,
                                                          samples_per_batch, training)

    base = RetentionConfig(n_samples=args.retention_samples)
    static, probe = training(model, base)
    query = query_training(model, base)
    samples = evaluation_samples(model, base)
    items = [(sample, index) for index, sample in enumerate(samples)]
    runs, sizes = {}, {}
    for size in args.retention_batch_sizes:
        config = RetentionConfig(n_samples=args.retention_samples, batch_size=size)
        per = samples_per_batch(model, config)
        sizes[size] = per
        runs[size] = lambda config=config, per=per: [row for start in range(0, len(items), per)
                                                     for rows in retention_units(model, items[start: start + per], config,
                                                                                 static, probe, query)
                                                     for row in rows]
    best, last = best_of(runs, args.repeats)
    first = args.retention_batch_sizes[0]
    n_rows = len(last[first])

    def equal(a: dict, b: dict) -> bool:
        return a["response"] == b["response"] and abs(a["gold_logprob"] - b["gold_logprob"]) < 1e-4

    print(f"| samples (notebook 06 defaults) | conditions per sample | batch_size | samples per batch | s | s per sample | "
          f"rows equal to batch_size {first} |")
    print("|---|---|---|---|---|---|---|")
    for size in args.retention_batch_sizes:
        same = sum(equal(a, b) for a, b in zip(last[size], last[first]))
        print(f"| {len(samples)} | {n_rows // len(samples)} | {size} | {sizes[size]} | {best[size]:.1f} | "
              f"{best[size] / len(samples):.1f} | {same}/{n_rows} |", flush=True)
    for size in args.retention_batch_sizes[1:]:
        for a, b in zip(last[size], last[first]):
            if not equal(a, b):
                print(f"  batch_size {size} vs {first}: sample {a['sample']}, {a['strategy']} {a['granularity']} "
                      f"{a['budget']}: responses {a['response']!r} / {b['response']!r}, gold log-prob "
                      f"{a['gold_logprob']:.6f} / {b['gold_logprob']:.6f}", flush=True)


def part_query(model, args) -> None:
    """Query-focused scores: the context prefilled once per real / null pair against a hooked pass over each whole
    prompt (no cache), per sample, and the largest difference between the two paths' scores."""
    from dynheads_tl.analysis.query_focus import (calibrated_document_score, null_query_prompt, query_attention,
                                                  query_focused_scores)
    from dynheads_tl.corpus import TraceSets, niah_split_samples

    samples = niah_split_samples(model, TraceSets(), 0)[: args.rows]

    def whole_prompts():
        out = []
        for sample in samples:
            real_ids, null_ids, start = null_query_prompt(model.tokenizer, sample.prompt_ids, sample.question)
            out.append(calibrated_document_score(query_attention(model, real_ids, start),
                                                 query_attention(model, null_ids, start), sample.evidence_spans))
        return torch.stack(out)

    best, last = best_of({"whole": whole_prompts, "prefilled": lambda: query_focused_scores(model, samples)},
                         args.repeats)
    difference = float((last["whole"] - last["prefilled"]).abs().max())
    print("| samples (NIAH calibration split, seed 0) | prompt tokens (mean) | whole prompts s per sample | "
          "prefilled context s per sample | prefilled / whole | largest score difference |")
    print("|---|---|---|---|---|---|")
    tokens = sum(len(sample.prompt_ids) for sample in samples) / len(samples)
    print(f"| {len(samples)} | {tokens:.0f} | {best['whole'] / len(samples):.2f} | {best['prefilled'] / len(samples):.2f} | "
          f"{best['prefilled'] / best['whole']:.2f} | {difference:.1e} |", flush=True)


def part_length(model, args) -> None:
    """Traced generation and decoding at ``--long-tokens``: one prompt and ``--long-rows`` prompts (one haystack,
    depths spread, so they share its prefix up to the first needle), against transformers on the same prompts."""
    from transformers import DynamicCache

    length, steps = args.long_tokens, args.steps
    config = TraceConfig(max_new_tokens=steps, stop_at_eos=False)
    twin = fast_twin(model)
    print(f"| rows x context | steps | transformers generate s | traced s | traced / transformers | "
          f"tokens equal |")
    print("|---|---|---|---|---|---|")
    for rows in args.long_rows:
        samples = make_niah_samples(model.tokenizer, n=rows, context_tokens=length, seed=7, max_new_tokens=steps,
                                    haystack=args.haystack, max_tokens=int(model.cfg.n_ctx))
        ids, mask = left_padded(model, samples)
        best, last = best_of({
            "transformers": lambda: stock_generate(twin, ids, attention_mask=mask, max_new_tokens=steps,
                                                   min_new_tokens=steps, do_sample=False),
            "traced": lambda: trace_batch(model, samples, config),
        }, args.repeats)
        same = sum(a.tokens.tolist() == row[ids.shape[1]:].tolist() for a, row in zip(last["traced"], last["transformers"]))
        print(f"| {rows} x {int(ids.shape[1])} | {steps} | {best['transformers']:.1f} | {best['traced']:.1f} | "
              f"{best['traced'] / best['transformers']:.2f} | {same}/{rows} |", flush=True)
    # Decoding alone, on one prefilled prompt: the grouped step against transformers' SDPA decode
    sample = make_niah_samples(model.tokenizer, n=1, context_tokens=length, seed=7, max_new_tokens=steps,
                               haystack=args.haystack, max_tokens=int(model.cfg.n_ctx))[0]
    decoder = BatchDecoder(model, [sample.prompt_ids], max_new_tokens=steps)
    base, first = decoder.n_cached, decoder.pending.clone()

    def ours():
        decoder.rewind(base)
        tokens = first
        for _ in range(steps):
            tokens = decoder.step(tokens).argmax(-1)
        return tokens

    def theirs():
        past = DynamicCache()
        for index in range(len(decoder.cache.keys)):
            past.update(*(t.clone() for t in decoder.cache.padded(index, base)), index)
        tokens = first
        with torch.no_grad(), stock_attention(twin):
            for step in range(steps):
                out = twin(input_ids=tokens[:, None], past_key_values=past, use_cache=True,
                           position_ids=torch.tensor([[base + step]]))
                past, tokens = out.past_key_values, out.logits[:, -1].argmax(-1)
        return tokens

    best, last = best_of({"grouped": ours, "transformers": theirs}, args.repeats)
    print(f"\n| prompt tokens | grouped ms/step | transformers SDPA ms/step | ratio | same last token |")
    print("|---|---|---|---|---|")
    print(f"| {base + 1} | {1000 * best['grouped'] / steps:.0f} | {1000 * best['transformers'] / steps:.0f} | "
          f"{best['grouped'] / best['transformers']:.2f} | {bool(torch.equal(last['grouped'], last['transformers']))} |",
          flush=True)


_MEMORY_CHILD = """
import json, sys, time, torch
import dynheads_tl
from dynheads_tl import TraceConfig, trace_generation
from dynheads_tl.engine import decoder as decoder_module
from dynheads_tl.engine.decoder import BatchDecoder
from dynheads_tl.engine.grouped import layer_windows
from dynheads_tl.engine.sharing import bounded_windows
from dynheads_tl.engine.windowed import ATTENTION, stock_attention
from dynheads_tl.tasks import make_niah_samples
length, steps, haystack, name, chunk = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
bounded, attention = sys.argv[6] == "1", sys.argv[7]
decoder_module.PREFILL_CHUNK = chunk or 1 << 30
model = dynheads_tl.load_model(name, device="cpu")
twin = dynheads_tl.fast_twin(model)
sample = make_niah_samples(model.tokenizer, n=1, context_tokens=length, seed=7, max_new_tokens=steps,
                           haystack=haystack, max_tokens=int(model.cfg.n_ctx))[0]
def status_mib(field):  # VmRSS (now) or VmHWM (peak since the last reset), from /proc
    line = next(l for l in open("/proc/self/status") if l.startswith(field + ":"))
    return int(line.split()[1]) / 1024
loaded = status_mib("VmRSS")
open("/proc/self/clear_refs", "w").write("5")  # reset the peak to the current resident size
with bounded_windows(bounded), stock_attention(twin, ATTENTION if attention == "windowed" else "sdpa"):
    begin = time.perf_counter()
    trace = trace_generation(model, sample, TraceConfig(max_new_tokens=steps, stop_at_eos=False))
    traced = time.perf_counter() - begin
    peak = status_mib("VmHWM")
    begin = time.perf_counter()
    decoder = BatchDecoder(model, [sample.prompt_ids], max_new_tokens=steps)  # the prompt prefilled, nothing decoded
    prefill = time.perf_counter() - begin
kv = decoder.cache.nbytes / 2**20
stored = sum(v.numel() * v.element_size() for v in vars(trace).values() if isinstance(v, torch.Tensor)) / 2**20
print(json.dumps({"prompt": len(sample.prompt_ids), "loaded": loaded, "peak": peak, "kv": kv, "trace": stored,
                  "traced_s": traced, "prefill_s": prefill,
                  "sliding": any(window is not None for window in layer_windows(model))}))
"""


def part_length_memory(model, args) -> None:
    """Peak resident memory of one traced generation per context length, each in a fresh process, minus the
    resident size once the model is loaded; the decoder's preallocated KV cache per row; the trace's tensors; for
    each prefill chunk size (0: one call over the whole prompt)."""
    import json
    import subprocess
    import sys

    print("| twin attention | sliding layers keep | prefill chunk | context tokens | prompt tokens | "
          "peak above the loaded model MiB | KV cache per row MiB | trace tensors MiB | peak per 1k prompt tokens MiB | "
          "traced generation s | prefill s | prefill ms per prompt token |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for length in args.memory_lengths:  # the lengths outermost: each length's rows in one stretch of the machine's load
        for attention in args.twin_attention:
            for bounded in args.windows:
                for chunk in args.prefill_chunks:
                    out = subprocess.run([sys.executable, "-c", _MEMORY_CHILD, str(length), str(args.steps),
                                          args.haystack, args.model, str(chunk), "1" if bounded == "window" else "0",
                                          attention], capture_output=True, text=True, check=True)
                    row = json.loads(out.stdout.strip().splitlines()[-1])
                    above = row["peak"] - row["loaded"]
                    keeps = (("its window" if bounded == "window" else "every key") if row["sliding"]
                             else "(no sliding layer)")
                    print(f"| {attention} | {keeps} | {chunk or 'whole prompt'} | {length} | {row['prompt']} | {above:.0f} | "
                          f"{row['kv']:.1f} | {row['trace']:.2f} | {1000 * above / row['prompt']:.0f} | "
                          f"{row['traced_s']:.1f} | {row['prefill_s']:.1f} | "
                          f"{1000 * row['prefill_s'] / row['prompt']:.2f} |", flush=True)


def part_length_share(model, args) -> None:
    """Notebook 07's default grid: prompt positions prefilled with and without shared prefixes, for the traces
    (one per sample) and the masking runs (each condition, generated and teacher-forced, on the sample's prompt)."""
    from dynheads_tl.claims.length_grid import LengthGridConfig, conditions, grid_samples, prefill_share

    config = LengthGridConfig()
    cells = grid_samples(model, config)
    share = prefill_share(cells)
    rows_per_sample = 1 + 2 * len(conditions()[0])  # its trace, and every condition generated and teacher-forced
    print(f"notebook 07 default grid: {config.haystack}, lengths {config.lengths}, depths {config.depths}, "
          f"{config.runs_per_cell} run(s) per cell; {rows_per_sample} prompt rows per sample")
    print("| length | samples | prompt positions, every row | prefilled, shared within a length | share prefilled |")
    print("|---|---|---|---|---|")
    for r in share.itertuples():
        every = r.prompt_positions * rows_per_sample
        print(f"| {r.length} | {r.samples} | {every} | {r.prefilled} | {r.prefilled / every:.3f} |", flush=True)
    total = share["prompt_positions"].sum() * rows_per_sample
    print(f"| all | {share['samples'].sum()} | {total} | {share['prefilled'].sum()} | "
          f"{share['prefilled'].sum() / total:.3f} |")


_BATCH_MEMORY_CHILD = """
import json, resource, sys, time, torch
import dynheads_tl
from dynheads_tl.engine.decoder import BatchDecoder
rows, length, name = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
torch.set_num_threads(1)
model = dynheads_tl.load_model(name)
BatchDecoder(model, [[11, 12, 13]], max_new_tokens=1)  # pages the weights in before the baseline is read
loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
generator = torch.Generator().manual_seed(0)
vocab = min(int(model.cfg.d_vocab), 20000)
prompts = [[100 + row] + torch.randint(200, vocab, (length - 1,), generator=generator).tolist() for row in range(rows)]
start = time.perf_counter()
decoder = BatchDecoder(model, prompts, max_new_tokens=1)
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
own = sum(t.numel() * t.element_size() for t in decoder.cache.keys + decoder.cache.values) / 2**20
print(json.dumps({"loaded": loaded, "peak": peak, "own": own, "seconds": seconds,
                  "package": dynheads_tl.__file__}))
"""


def part_batch_memory(model, args) -> None:
    """Peak resident memory of one BatchDecoder over ``--memory-rows`` distinct long prompts (the prefill of a
    batch, as a trace batch of the length grid does it), in a fresh process."""
    import json
    import subprocess
    import sys
    import tempfile

    del model  # the child loads its own
    # in the temporary folder: `python -c` puts the working folder first on sys.path, which would shadow PYTHONPATH
    out = subprocess.run([sys.executable, "-c", _BATCH_MEMORY_CHILD, str(args.memory_rows), str(args.long_tokens),
                          args.model], capture_output=True, text=True, cwd=tempfile.gettempdir())
    if out.returncode != 0:
        raise RuntimeError(f"The batch_memory child failed:\n{out.stderr}")
    row = json.loads(out.stdout.strip().splitlines()[-1])
    above = row["peak"] - row["loaded"]
    print("| package | rows x prompt tokens | peak above the loaded model MiB | the batch's cache MiB | "
          "peak above the batch's cache MiB | build s |")
    print("|---|---|---|---|---|---|")
    print(f"| {row['package']} | {args.memory_rows} x {args.long_tokens} | {above:.0f} | {row['own']:.0f} | "
          f"{above - row['own']:.0f} | {row['seconds']:.1f} |", flush=True)


PARTS = {"decode": part_decode, "trace": part_trace, "share": part_share, "grid": part_grid, "rag": part_rag,
         "cell": part_cell, "trace_batch": part_trace_batch, "retention": part_retention,
         "query": part_query, "length": part_length, "length_memory": part_length_memory,
         "length_share": part_length_share, "batch_memory": part_batch_memory}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", choices=sorted(PARTS), default=["share", "decode", "trace", "grid"])
    parser.add_argument("--model", default=dynheads_tl.DEFAULT_MODEL,
                        help="the model (an embedded name such as gemma-3-270m, or any name load_model takes)")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--trace-rows", type=int, nargs="+", default=None,
                        help="the trace part's batch sizes, each timed in this run (default: --rows)")
    parser.add_argument("--length", type=int, default=1000, help="NIAH context tokens")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--runs", type=int, default=2, help="samples per grid cell")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--cell-runs", type=int, default=None,
                        help="samples in the notebook 02 cell (default: the notebook's runs_per_cell)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[25, 110],
                        help="the cell's batch sizes to time (notebook 02's batch_size)")
    parser.add_argument("--trace-batch-sizes", type=int, nargs="+", default=[8, 24],
                        help="trace_batch sizes to time (collect_traces' batch_size)")
    parser.add_argument("--retention-samples", type=int, default=6, help="notebook 06 evaluation samples")
    parser.add_argument("--retention-batch-sizes", type=int, nargs="+", default=[64, 108],
                        help="notebook 06 batch sizes to time (its batch_size)")
    parser.add_argument("--long-tokens", type=int, default=8000, help="context tokens of the length part")
    parser.add_argument("--long-rows", type=int, nargs="+", default=[1, 3],
                        help="prompts traced together in the length part (one haystack, depths spread)")
    parser.add_argument("--memory-rows", type=int, default=6, help="distinct prompts of the batch_memory part")
    parser.add_argument("--memory-lengths", type=int, nargs="+", default=[1000, 2000, 4000, 8000],
                        help="context tokens of the length_memory part")
    parser.add_argument("--prefill-chunks", type=int, nargs="+", default=[4096],
                        help="the length_memory part's prefill chunk sizes (PREFILL_CHUNK; 0: the whole prompt)")
    parser.add_argument("--windows", nargs="+", choices=["window", "all"], default=["window"],
                        help="the length_memory part's sliding-layer caches: bounded by the window (the default "
                             "path) and/or keeping all keys (all: bounded_windows(False), as before the bound)")
    parser.add_argument("--twin-attention", nargs="+", choices=["windowed", "stock"], default=["windowed"],
                        help="the length_memory part's twin attention: the windowed SDPA it prefills with "
                             "(engine/windowed.py) and/or transformers' stock SDPA (every key on every layer)")
    parser.add_argument("--haystack", default="prose", help="haystack of the length parts")
    args = parser.parse_args()
    model = dynheads_tl.load_model(args.model, device="cpu")
    print(f"torch threads: {torch.get_num_threads()}\n")
    for part in args.parts:
        PARTS[part](model, args)
        print()


if __name__ == "__main__":
    main()
