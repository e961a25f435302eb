"""Notebook 07's pipeline: the grid's samples, their traces, the two static sets, claim 1's quantities per length,
claim 2's masking runs per cell, and the per-unit values the three length primaries regress on log2(length).

Samples. Cell (length L, depth d, run r) is one NIAH sample on the grid's haystack: L context tokens, the needle at
depth d, the haystack starting at an offset drawn once per (L, r) from the run's seed, so the depths of one run at
one length read the same text up to their needle (their prompts share that prefix, prefilled once). A layout
(SCIENCE 10) is (haystack, L, d, offset): with ``runs_per_cell`` 1 every sample is its own layout.

Static sets. One calibration split of ``n_calibration`` samples at random layouts, cycling over the grid's lengths,
with seeds of its own (never an analysis prompt): Wu et al.'s retrieval score (its ROUGE filter; when no sample
passes, unfiltered, and the table says so) and the query-focused (QRHead-style) score on the same prompts. Both
static top-``static_k`` sets are the same at every length, so a slope against length is the analysis samples'
alone.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from dynheads_tl import preregistration
from dynheads_tl.analysis.head_probe import next_step_probe
from dynheads_tl.analysis.scoring import adjacent_counts, bound_ratio_counts, static_top_k, wu_static_scores
from dynheads_tl.analysis.statistics import bootstrap_interval, paired_sign_test, wilson_interval
from dynheads_tl.corpus import collect_traces
from dynheads_tl.engine.equations import head_labels
from dynheads_tl.engine.trace_data import Trace
from dynheads_tl.tasks import NiahConfig, build_niah_sample, make_niah_samples
from dynheads_tl.tasks.common import Sample, mix_seed
from dynheads_tl.tasks.metrics import niah_accuracy

from .config import GRID_CONDITIONS, PREDICTED_CONDITION, PREVIOUS_BASELINE, PREVIOUS_CONDITION, SEEDS, LengthGridConfig
from dynheads_tl.analysis.query_focus import query_focused_scores
from dynheads_tl.protocols.conditions import CONDITIONS
from dynheads_tl.protocols.ablation import AblationSetup, Job, cached_runs

__all__ = ["grid_samples", "calibration_samples", "grid_traces", "StaticSets", "static_sets", "sample_table",
           "table1_by_length", "heatmap_data", "conditions", "calibration_probe", "masking_grid", "masking_by_length",
           "layout_ratio", "headroom_floor", "headroom_by_length", "primary_units", "cluster_bca", "prefill_share"]


def _offset(config: LengthGridConfig, length: int, run: int) -> int:
    return random.Random(f"length-grid-offset:{SEEDS['length_grid'] + config.seed}:{length}:{run}").randrange(
        config.max_offset)


def grid_samples(model, config: LengthGridConfig) -> list[tuple[dict, Sample]]:
    """Every cell's samples as (cell, sample), by length, then run, then depth (so the rows sharing a haystack
    prefix sit together); a cell is ``{"context", "depth", "run", "haystack_offset", "layout"}``."""
    out, index = [], 0
    for length in config.grid_lengths():
        for run in range(config.runs_per_cell):
            offset = _offset(config, length, run)
            for depth in config.depths:
                sample = build_niah_sample(model.tokenizer, NiahConfig(
                    context_tokens=int(length), depth=float(depth), haystack=config.haystack,
                    seed=mix_seed(SEEDS["length_grid"] + config.seed, index), max_new_tokens=config.max_new_tokens,
                    haystack_offset=offset), max_tokens=int(model.cfg.n_ctx))
                cell = {"context": int(length), "depth": float(depth), "run": run, "haystack_offset": offset,
                        "layout": f"{config.haystack}|{length}|{depth}|{offset}"}
                out.append((cell, sample))
                index += 1
    return out


def calibration_samples(model, config: LengthGridConfig) -> list[Sample]:
    """The static sets' calibration split: random depths and offsets, lengths cycling over the grid's."""
    return make_niah_samples(model.tokenizer, n=config.n_calibration, context_tokens=config.grid_lengths(),
                             seed=SEEDS["length_calibration"] + config.seed, haystack=config.haystack,
                             random_layout=True, max_offset=config.max_offset, max_new_tokens=config.max_new_tokens,
                             max_tokens=int(model.cfg.n_ctx))


def grid_traces(model, config: LengthGridConfig, cells: list[tuple[dict, Sample]]) -> list[Trace]:
    """Each grid sample traced (Eq. 1 sets at every step), cached per sample; one call per length, and a batch holds
    the rows of one haystack layout (one run's depths, which share the haystack up to their needles; two runs start
    the haystack at different offsets and share nothing but the instruction). A batch is the unit an interrupted run
    loses and the rows whose keys and values are held at once: at 32k on Qwen2.5-Coder-0.5B one 5-row batch of
    about half an hour, not all 10 rows of the length."""
    traces: list[Trace] = []
    for length in config.grid_lengths():
        members = [(cell, sample) for cell, sample in cells if cell["context"] == length]
        spec = {"task": "niah", "split": "length_grid", "haystack": config.haystack, "context_tokens": int(length),
                "seed": SEEDS["length_grid"] + config.seed}
        traces += collect_traces(model, [sample for _, sample in members], config.trace_config("niah"), spec,
                                 use_cache=config.use_cache, batch_size=config.trace_batch_size,
                                 groups=[cell["run"] for cell, _ in members],
                                 desc=f"length grid {config.haystack} {length}")
    return traces


@dataclass
class StaticSets:
    """The two static rankings of the calibration split and what they rest on."""

    wu_scores: torch.Tensor
    query_scores: torch.Tensor
    k: int  # mean |D_t| of the calibration answers (the fixed k of claim 2's static condition)
    wu_filter: str  # "ROUGE-1 recall > 0.5 (Wu et al.)", or "none (no calibration answer passed the filter)"
    n_calibration: int
    n_kept: int

    def top(self, which: str, k: int) -> torch.Tensor:
        scores = self.wu_scores if which == "wu" else self.query_scores
        return static_top_k(scores, min(k, scores.numel()))

    def table(self, static_k: int) -> pd.DataFrame:
        wu, query = self.top("wu", static_k), self.top("query_focused", static_k)
        labels = lambda mask: " ".join(head_labels(mask.flatten().nonzero().flatten().tolist(), mask.shape[1]))
        return pd.DataFrame([{"static_set": "wu", "heads": labels(wu), "filter": self.wu_filter,
                              "n_calibration": self.n_calibration, "n_kept": self.n_kept},
                             {"static_set": "query_focused", "heads": labels(query), "filter": "none",
                              "n_calibration": self.n_calibration, "n_kept": self.n_calibration},
                             {"static_set": "overlap", "heads": labels(wu & query), "filter": "",
                              "n_calibration": self.n_calibration, "n_kept": int((wu & query).sum())}])


def static_sets(model, config: LengthGridConfig) -> tuple[StaticSets, list[Trace]]:
    """The static rankings from the calibration split (traced, and its query-focused scores) and its traces."""

    samples = calibration_samples(model, config)
    spec = {"task": "niah", "split": "length_calibration", "haystack": config.haystack,
            "lengths": config.grid_lengths(), "seed": SEEDS["length_calibration"] + config.seed}
    traces = collect_traces(model, samples, config.trace_config("niah"), spec, use_cache=config.use_cache,
                            batch_size=config.trace_batch_size, desc="length grid calibration")
    wu = wu_static_scores(traces, "length grid calibration")
    query = query_focused_scores(model, samples, use_cache=config.use_cache,
                                 desc="length grid calibration: query-focused scores").mean(0).float()
    sizes = torch.cat([t.retrieval_mask.flatten(1).sum(1) for t in traces]).float()
    k = max(int(round(float(sizes.mean()))), 1) if len(sizes) else 1
    return StaticSets(wu.scores.float(), query, k, wu.filter, len(traces), wu.n_kept), traces


def calibration_probe(calibration: list[Trace], config: LengthGridConfig):
    """The size axis's lag-1 probe (claim 3's MLP: hidden[n] -> step n + 1's Eq. 1 set), trained on the static
    sets' calibration traces alone (never a grid sample), seeded and cached; None when no calibration answer has two
    steps."""
    return next_step_probe(calibration, "classification", config.probe_config(), use_cache=config.use_cache)


# --- claim 1 per length -----------------------------------------------------------------------------------------
def sample_table(cells: list[tuple[dict, Sample]], traces: list[Trace], statics: StaticSets,
                 static_k: int) -> pd.DataFrame:
    """One row per grid sample: its cell, accuracy, and the sums Table 1's quantities pool (steps, activations,
    adjacent-step pairs and their Jaccard sum, the pairs of two non-empty sets and the sum of their Jaccard over its
    size bound, activations inside each static top-``static_k``, Jaccard with Wu's
    S_k summed over steps with a non-empty D_t, |D_t|^2)."""
    if len(cells) != len(traces):
        raise ValueError(f"{len(cells)} grid cells but {len(traces)} traces.")
    wu, query = statics.top("wu", static_k).flatten(), statics.top("query_focused", static_k).flatten()
    rows = []
    for (cell, _), trace in zip(cells, traces):
        flat = trace.retrieval_mask.flatten(1)
        sizes = flat.sum(1).double()
        active = sizes > 0
        union = (flat | wu).sum(1).double()
        adjacent = adjacent_counts(trace.retrieval_mask)
        bounded = bound_ratio_counts(trace.retrieval_mask)
        rows.append({**cell, "accuracy": niah_accuracy(trace.response, trace.answers[0]), "steps": int(len(sizes)),
                     "activations": float(sizes.sum()), "size_sq": float((sizes ** 2).sum()),
                     "adjacent_sum": adjacent["jaccard_sum"], "adjacent_pairs": adjacent["pairs"],
                     "bound_ratio_sum": bounded["ratio_sum"], "bound_pairs": bounded["pairs"],
                     "inside_wu": float((flat & wu).sum()), "inside_query_focused": float((flat & query).sum()),
                     "jaccard_static_sum": float(((flat & wu).sum(1).double()[active] / union[active]).sum()),
                     "active_steps": float(active.sum())})
    return pd.DataFrame(rows)


def cluster_bca(n: int, clusters, statistic, *, n_resamples: int = 2000, seed: int = 0,
                confidence: float = 0.95) -> tuple[float, float, float, bool]:
    """(estimate, low, high, degenerate) of ``statistic(indices)`` over ``n`` units: the package's bootstrap interval
    (:func:`~dynheads_tl.analysis.statistics.bootstrap_interval`: BCa with its stated rules for degenerate and
    one-tailed draws) resampling whole ``clusters`` (one label per unit); NaN bounds with fewer than two clusters.
    ``degenerate`` when every resample gives the same value (the interval is then that value, said as such)."""
    labels = np.asarray(clusters).astype(str)
    estimate = float(statistic(np.arange(n)))
    if len(set(labels.tolist())) < 2:
        return estimate, float("nan"), float("nan"), False
    interval = bootstrap_interval(np.arange(n), lambda index: statistic(index.astype(int)), clusters=labels,
                                  n_resamples=n_resamples, seed=seed, confidence=confidence)
    return interval.estimate, interval.low, interval.high, interval.method == "degenerate"


def cluster_mean_bca(values, clusters, *, n_resamples: int = 2000, seed: int = 0,
                     confidence: float = 0.95) -> tuple[float, float, float, bool]:
    """:func:`cluster_bca` of the mean of ``values`` (one per unit, ``clusters`` their labels); all NaN and not
    degenerate when there are no values."""
    values = np.asarray(values, dtype=float)
    if not len(values):
        return float("nan"), float("nan"), float("nan"), False
    return cluster_bca(len(values), clusters, lambda index: float(values[index].mean()), n_resamples=n_resamples,
                       seed=seed, confidence=confidence)


def _ratio(frame: pd.DataFrame, numerator: str, denominator: str):
    num, den = frame[numerator].to_numpy(float), frame[denominator].to_numpy(float)
    return lambda index: float(num[index].sum() / den[index].sum()) if den[index].sum() > 0 else float("nan")


def table1_by_length(samples: pd.DataFrame, traces: list[Trace], *, n_resamples: int = 2000,
                     seed: int = 0, static_k: int = 20) -> pd.DataFrame:
    """Per length, Table 1's quantities pooled over that length's samples (adjacent-step Jaccard, Jaccard with Wu's
    S_20, entropy of the pooled activations, heads per step, heads ever active) and the share of activations
    outside each static top-20 (Wu's and the query-focused; ``static_k``, the size ``sample_table`` counted with,
    is recorded in every row), each with a BCa 95% interval over layouts. ``entropy``
    and ``ever_active`` count distinct heads: a resample that repeats some samples leans low, so their intervals
    show the spread over layouts."""
    rows = []
    for length, part in samples.groupby("context", sort=True):
        index = part.index.to_numpy()
        counts = np.stack([traces[i].retrieval_mask.flatten(1).double().sum(0).numpy() for i in index])

        def entropy(idx, counts=counts):
            pooled = counts[idx].sum(0)
            if pooled.sum() == 0:
                return 0.0
            p = pooled[pooled > 0] / pooled.sum()
            return float(-(p * np.log(p)).sum())

        local = part.reset_index(drop=True)
        outside = lambda column: (lambda idx, f=_ratio(local, column, "activations"): 1 - f(idx))
        metrics = {"jaccard_adjacent": _ratio(local, "adjacent_sum", "adjacent_pairs"),
                   "jaccard_static_wu": _ratio(local, "jaccard_static_sum", "active_steps"),
                   "entropy": entropy,
                   "heads_per_step": _ratio(local, "activations", "steps"),
                   "ever_active": lambda idx, counts=counts: float((counts[idx].sum(0) > 0).sum()),
                   "share_outside_wu": outside("inside_wu"),
                   "share_outside_query_focused": outside("inside_query_focused")}
        for name, statistic in metrics.items():
            value, low, high, degenerate = cluster_bca(len(local), local["layout"], statistic,
                                                       n_resamples=n_resamples, seed=seed)
            rows.append({"length": int(length), "metric": name, "value": value, "low": low, "high": high,
                         "degenerate": degenerate, "n_samples": len(local), "n_layouts": local["layout"].nunique(),
                         "accuracy": float(local["accuracy"].mean()), "static_k": int(static_k)})
    return pd.DataFrame(rows)


def heatmap_data(trace: Trace, tokenizer, n_heads: int = 10):
    """Fig 1 for one answer: the ``n_heads`` heads whose Eq. 1 indicator varies most over the answer's steps (the
    attention share on the needle breaks ties), as (matrix [head, step] of that share, Eq. 1 hits, token labels,
    head labels)."""
    scores = trace.support_score.flatten(1)
    hits = trace.retrieval_mask.flatten(1).float()
    variance = hits.var(0, unbiased=False) + 1e-3 * scores.var(0, unbiased=False) if trace.n_steps > 1 else scores[0]
    top = torch.argsort(variance, descending=True, stable=True)[:n_heads]
    tokens = [tokenizer.decode([int(t)]).replace("\n", "\\n").replace(" ", "␣") or "∅" for t in trace.tokens]
    return (scores[:, top].T.numpy(), hits[:, top].T.numpy().astype(bool), tokens,
            head_labels(top.tolist(), trace.n_heads))


# --- claim 2 per cell -------------------------------------------------------------------------------------------
def conditions(predicted: bool = False) -> tuple[list[str], str]:
    """The masking conditions the grid runs (claim 2's, plus D_{t-1} and its size-matched static control, each when
    the condition registry has it, looked up by name; with ``predicted``, the lag-1 probe's set too, which the size
    axis reads) and a note saying which of the fair pair were found."""

    fair = [name for name in (PREVIOUS_CONDITION, PREVIOUS_BASELINE) if name in CONDITIONS]
    names = list(GRID_CONDITIONS) + fair
    if predicted:
        if PREDICTED_CONDITION not in CONDITIONS:
            raise ValueError(f"The size axis needs the {PREDICTED_CONDITION!r} condition, which the condition registry "
                             "of this installation does not have.")
        names.append(PREDICTED_CONDITION)
    if len(fair) == 2:
        return names, (f"The fair comparison runs: {PREVIOUS_CONDITION} (D_{{t-1}}) against {PREVIOUS_BASELINE}"
                       + (f", and {PREDICTED_CONDITION} (the lag-1 probe's set) beside them." if predicted else "."))
    missing = [name for name in (PREVIOUS_CONDITION, PREVIOUS_BASELINE) if name not in CONDITIONS]
    return names, (f"The fair comparison (D_{{t-1}} against as many static heads) is not made: the condition "
                   f"registry has no {' or '.join(missing)} on this installation"
                   + (f" ({fair[0]} runs on its own)." if fair else "."))


def masking_grid(model, config: LengthGridConfig, cells: list[tuple[dict, Sample]], statics: StaticSets,
                 names: list[str], probe=None) -> pd.DataFrame:
    """Every condition on every grid sample, generated and teacher-forced (claim 2's two-pass protocol), cached per
    run; one row per (sample, condition) with the teacher-forced columns (``tf_*``) beside the generated ones. The
    runs of one length are decoded together (``batch_size`` rows at a time, generated and teacher-forced apart):
    they share the haystack up to their needles, and a cell of one sample would make batches of a few rows."""

    wu = statics.wu_scores
    if PREDICTED_CONDITION in names and probe is None:
        raise ValueError(f"The {PREDICTED_CONDITION!r} condition needs the lag-1 probe (calibration_probe).")
    size = config.static_size(wu.numel())
    setup = AblationSetup(static_mask=statics.top("wu", statics.k), static_top20=statics.top("wu", size),
                          k=statics.k, kind="eq1", mode=config.ablation_mode, seed=config.seed,
                          static_order=torch.argsort(wu.flatten(), descending=True, stable=True), probe=probe)
    cache_key = {"claim": "length_grid", "haystack": config.haystack} if config.use_cache else None
    plan = [(i, name, forced) for i in range(len(cells)) for forced in (False, True) for name in names]
    jobs = [Job(cells[i][1], name, sample_seed=i, teacher_forced=forced) for i, name, forced in plan]
    groups = [cells[i][0]["context"] for i, _, _ in plan]
    outputs = cached_runs(model, jobs, setup, config.trace_config("niah"), batch_size=config.batch_size,
                          cache_key=cache_key, groups=groups, desc="length grid masking")
    found = {(i, name, forced): row for (i, name, forced), (row, _) in zip(plan, outputs)}
    return pd.DataFrame([{**cells[i][0], "condition": name, **found[(i, name, False)], **found[(i, name, True)]}
                         for i in range(len(cells)) for name in names])


def _paired(grid: pd.DataFrame, a: str, b: str, metric: str) -> pd.DataFrame:
    """Per sample (its layout and length), ``metric`` under condition a and b."""
    keys = ["context", "depth", "run", "layout"]
    left = grid[grid["condition"] == a][keys + [metric]].rename(columns={metric: "a"})
    right = grid[grid["condition"] == b][keys + [metric]].rename(columns={metric: "b"})
    return left.merge(right, on=keys).dropna(subset=["a", "b"])


# (name, a, b, metric): the per-length comparisons Fig 2's rule reads
COMPARISONS = (("accuracy_dynamic_vs_static", "dynamic", "static_matched", "accuracy"),
               ("tf_drop_dynamic_vs_static", "dynamic", "static_matched", "tf_drop"),
               # D_{t-1} masks nothing at step 0: read on the steps t >= 1, as claim 2's primary is
               ("tf_drop_previous_vs_static", PREVIOUS_CONDITION, PREVIOUS_BASELINE, "tf_drop_t1"))


def masking_by_length(grid: pd.DataFrame, *, n_resamples: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per length, what Fig 2's rule reads: the unmasked and static accuracies (Wilson 95%) and each comparison of
    :data:`COMPARISONS` (a − b per sample, BCa 95% over layouts, exact two-sided sign test over the samples that
    differ; teacher-forced drops in nats/step); a comparison whose conditions were not run is left out."""

    rows = []
    for length in sorted(grid["context"].unique()):
        at = grid[grid["context"] == length]
        for condition in ("none", "static_matched", "dynamic"):
            values = at[at["condition"] == condition]["accuracy"].dropna()
            if len(values):
                ci = wilson_interval(int(values.sum()), len(values))
                rows.append({"length": int(length), "comparison": f"accuracy_{condition}", "value": ci.estimate,
                             "low": ci.low, "high": ci.high, "n": ci.n, "n_layouts": at["layout"].nunique(),
                             "a_better": None, "b_better": None, "sign_p": None, "degenerate": False})
        for name, a, b, metric in COMPARISONS:
            pairs = _paired(at, a, b, metric).reset_index(drop=True)
            if not len(pairs):
                continue
            diff = (pairs["a"] - pairs["b"]).to_numpy(float)
            value, low, high, degenerate = cluster_mean_bca(diff, pairs["layout"], n_resamples=n_resamples, seed=seed)
            test = paired_sign_test(pairs["a"], pairs["b"], seed=seed)
            rows.append({"length": int(length), "comparison": name, "value": value, "low": low, "high": high,
                         "n": len(diff), "n_layouts": pairs["layout"].nunique(), "a_better": test.a_better,
                         "b_better": test.b_better, "sign_p": test.sign_p, "degenerate": degenerate})
    return pd.DataFrame(rows)


# --- the three length primaries: one value per unit -----------------------------------------------------------
def layout_ratio(samples: pd.DataFrame, numerator: str, denominator: str, *,
                 complement: bool = False) -> pd.DataFrame:
    """Per layout, ``(length, layout, value)``: the sum of :func:`sample_table`'s ``numerator`` over the layout's
    samples divided by the sum of its ``denominator`` (1 minus that with ``complement``); a layout whose denominator
    sums to 0 has no value and no row."""
    by_layout = samples.groupby(["context", "layout"], sort=False).sum(numeric_only=True).reset_index()
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = by_layout[numerator] / by_layout[denominator].where(by_layout[denominator] > 0)
    return pd.DataFrame({"length": by_layout["context"].astype(int), "layout": by_layout["layout"],
                         "value": (1 - ratio if complement else ratio).astype(float)}).dropna(subset=["value"])


def headroom_floor() -> float:
    """The unmasked accuracy a length needs to have headroom: Fig 2's declared headroom_floor."""
    return float(preregistration.item_rule("irreplaceability", "Fig 2")["headroom_floor"])


def headroom_by_length(by_length: pd.DataFrame | None, floor: float | None = None) -> pd.DataFrame:
    """Per length of the masking runs, the unmasked accuracy with its Wilson 95% interval, as
    :func:`masking_by_length` computed it for Fig 2's rule (its ``accuracy_none`` rows), and whether the length has
    headroom (preregistration.yaml, deviation of 2026-12-06): its upper bound reaches ``floor`` (default
    :func:`headroom_floor`) and its estimate is above 0. Empty without masking runs."""
    floor = headroom_floor() if floor is None else floor
    columns = ["length", "accuracy", "low", "high", "n", "headroom"]
    if by_length is None or not len(by_length):
        return pd.DataFrame(columns=columns)
    none = by_length[by_length["comparison"] == "accuracy_none"].sort_values("length")
    return pd.DataFrame({"length": none["length"].astype(int), "accuracy": none["value"], "low": none["low"],
                         "high": none["high"], "n": none["n"].astype(int),
                         "headroom": (none["high"] >= floor) & (none["value"] > 0)},
                        columns=columns).reset_index(drop=True)


def primary_units(samples: pd.DataFrame, grid: pd.DataFrame | None,
                  headroom: pd.DataFrame | None = None) -> dict[str, pd.DataFrame]:
    """Per primary of the ``lengths:`` section, its units ``(length, layout, value)``: the adjacent-step Jaccard of
    each layout (its samples' pairs pooled), the share of each layout's activations outside the query-focused
    static top-20, and each sample's teacher-forced D_{t-1} − static drop (nats/step; empty when the fair pair was
    not run). The drop's units carry ``headroom``: whether their length has headroom by ``headroom``
    (:func:`headroom_by_length`; a length it does not list has none; every length when it is None), which
    :func:`~.report.trend_table` reads to leave the others out. A layout without the quantity (no adjacent pair,
    no activation) has no unit."""
    out = {"rotation_vs_length": layout_ratio(samples, "adjacent_sum", "adjacent_pairs"),
           "outside_vs_length": layout_ratio(samples, "inside_query_focused", "activations", complement=True)}
    pairs = (_paired(grid, PREVIOUS_CONDITION, PREVIOUS_BASELINE, "tf_drop_t1")
             if grid is not None and len(grid) and "tf_drop_t1" in grid else None)
    if pairs is not None and len(pairs):
        kept = None if headroom is None else set(headroom.loc[headroom["headroom"].astype(bool), "length"].astype(int))
        lengths = pairs["context"].astype(int)
        out["irreplaceability_vs_length"] = pd.DataFrame({
            "length": lengths, "layout": pairs["layout"], "value": (pairs["a"] - pairs["b"]).astype(float),
            "headroom": True if kept is None else lengths.isin(kept)})
    else:
        out["irreplaceability_vs_length"] = pd.DataFrame(columns=["length", "layout", "value", "headroom"])
    return out


def prefill_share(cells: list[tuple[dict, Sample]]) -> pd.DataFrame:
    """Token arithmetic, no model run: per length, the prompt positions of the grid's samples, and how many of them
    a prefill must compute when the rows of one length share their common prefixes (the prompts in order, each
    against the longest prefix it shares with any earlier prompt of the same length)."""
    rows = []
    for length in dict.fromkeys(cell["context"] for cell, _ in cells):
        prompts = [list(sample.prompt_ids) for cell, sample in cells if cell["context"] == length]
        total = sum(len(p) - 1 for p in prompts)
        computed = 0
        for i, prompt in enumerate(prompts):
            shared = 0
            for earlier in prompts[:i]:
                n = 0
                limit = min(len(prompt), len(earlier)) - 1
                while n < limit and prompt[n] == earlier[n]:
                    n += 1
                shared = max(shared, n)
            computed += len(prompt) - 1 - shared
        rows.append({"length": int(length), "samples": len(prompts), "prompt_positions": total,
                     "prefilled": computed, "share_prefilled": computed / total if total else float("nan")})
    return pd.DataFrame(rows)
