"""Claim 2 — dynamic retrieval heads are irreplaceable: the per-step two-pass protocol.

At every decoding step t:

1. **Clean pass.** The step runs unmasked; its attention rows give D_t (Eq. 1 for NIAH, Eq. 2 above
   a threshold for HotpotQA). Its token is discarded.
2. **Masked pass.** The same step is run again from the same cache with the selected heads'
   ``hook_z`` zeroed (or set to their mean); *its* token is kept and fed to step t+1.

KV cache across the two passes (``keep_cache``):

- ``"clean"`` (default): after the masked pass, the newest cache position's keys and values are
  replaced by the clean pass's. Masking therefore changes only which token is chosen at step t; every
  later clean pass sees an unmasked history, and each step's intervention is independent.
- ``"masked"``: the masked pass's keys and values stay in the cache, so the masking at step t also
  leaks into what later steps attend to.

Steps where the selector masks nothing skip the second pass (its result would equal the clean pass),
so k = 0 reproduces the unmasked generation exactly. The protocol's cost floor is two forwards per step.

Baselines mask, at every step, the static top-k heads or k seeded random heads (drawn once per sample),
with k the mean dynamic-set size of the calibration split. A size-matched baseline (``static_matched``,
not in the paper) masks at each step as many of the top static heads as D_t has heads, so that dynamic
and static masking remove the same number of heads at every step. Progressive masking ranks every head at
step t (Eq. 1 hits first, then by attention share on the evidence) and masks the top k.

Batching: :func:`two_pass_batch` runs several (sample, selector) jobs as one left-padded batch (each
row has its own D_t and its own mask at every step); :func:`two_pass_generation` is a batch of one.
The experiments batch the runs of one grid cell, and one sample's k values (``batch_size`` rows at a
time). Batched rows agree with one-at-a-time runs to float rounding; their tokens, masks and Eq. 1
sets were identical in every test and benchmark (see :class:`dynheads_tl.engine.tracing.BatchDecoder`).
"""
from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from typing import Callable, Literal

import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from dynheads_tl.engine.equations import eq1_mask, head_label, head_names
from dynheads_tl.engine.hooks import AblationMode, HookList, StepState, ablate_heads
from dynheads_tl.progress import progress
from dynheads_tl.engine.tracing import BatchLoop, StepPolicy, Trace, TraceConfig, build_trace, decode, new_buffers
from dynheads_tl.tasks.common import Sample, prompt_digest
from dynheads_tl.tasks.metrics import exact_match, niah_accuracy, rouge_l, token_f1

Condition = Literal["none", "dynamic", "static", "static_matched", "random", "progressive"]
CachePolicy = Literal["clean", "masked"]


@dataclass
class StepView:
    """What the clean pass of one step saw (the selector's input)."""

    step: int
    token: int
    argmax_pos: Int[Tensor, "layer head"]
    support_score: Float[Tensor, "layer head"]
    retrieval: Bool[Tensor, "layer head"]  # D_t


Selector = Callable[[StepView], Bool[Tensor, "layer head"] | None]


@dataclass
class AblationTrace:
    """A two-pass generation: the clean pass of every step, and the masked pass whose tokens were kept.

    ``masked.tokens`` is the generated answer. ``clean.tokens[t]`` is the discarded clean token.
    ``masked_heads[t]`` is what was masked at step t. On steps with nothing masked the masked record
    equals the clean one.
    """

    clean: Trace
    masked: Trace
    masked_heads: Bool[Tensor, "step layer head"]
    condition: str
    k: int | None = None

    @property
    def response(self) -> str:
        return self.masked.response


def eq1_at_step(argmax_pos: Int[Tensor, "layer head"], ids: Int[Tensor, "key"], evidence: Bool[Tensor, "key"],
                token: int) -> Bool[Tensor, "layer head"]:
    """Eq. 1 (:func:`~dynheads_tl.engine.equations.eq1_mask`) for one step and one generated token."""
    return eq1_mask(argmax_pos, ids, evidence, torch.tensor(token, device=ids.device))


def two_pass_batch(
    model,
    jobs: list[tuple[Sample, Selector]],
    config: TraceConfig | None = None,
    *,
    kind: Literal["eq1", "eq2"] = "eq1",
    threshold: float = 0.1,
    mode: AblationMode = "zero",
    mean_z: Float[Tensor, "layer head d_head"] | None = None,
    keep_cache: CachePolicy = "clean",
    labels: list[tuple[str, int | None]] | None = None,
) -> list[AblationTrace]:
    """Greedy generation of every ``(sample, selector)`` job in one batch under the per-step two-pass
    protocol (module docstring). ``labels`` gives each job's ``(condition, k)`` for its record.

    Each step runs one clean forward over the batch; if any running row's selector masks something,
    one masked forward follows with each row's own mask (rows with nothing to mask keep their clean
    token, scores and keys/values exactly). Jobs may share a sample: its prompt is prefilled once.
    """
    if keep_cache not in ("clean", "masked"):
        raise ValueError(f"keep_cache must be 'clean' or 'masked', got {keep_cache!r}.")
    if kind not in ("eq1", "eq2"):
        raise ValueError(f"kind must be 'eq1' or 'eq2', got {kind!r}.")
    if not jobs:
        raise ValueError("No jobs to run.")
    labels = labels or [("custom", None)] * len(jobs)
    if len(labels) != len(jobs):
        raise ValueError(f"{len(labels)} labels for {len(jobs)} jobs.")
    config = config or TraceConfig()
    samples, selectors = [job[0] for job in jobs], [job[1] for job in jobs]
    policy = TwoPass(model, selectors, config, kind=kind, threshold=threshold, mode=mode, mean_z=mean_z,
                     keep_cache=keep_cache)
    loop, _ = decode(model, samples, config, policy)
    results = []
    for b, sample in enumerate(samples):
        condition, k = labels[b]
        extra = {"condition": condition, "k": k, "mode": mode, "keep_cache": keep_cache, "kind": kind,
                 "threshold": threshold}
        clean = build_trace(model, sample, config, policy.clean_tokens[b], policy.clean_buffers, row=b, **extra,
                            pass_="clean")
        masked = build_trace(model, sample, config, loop.tokens[b], policy.masked_buffers, row=b, **extra,
                             pass_="masked")
        results.append(AblationTrace(clean, masked, policy.applied[b, : len(loop.tokens[b])], condition, k))
    return results


class TwoPass(StepPolicy):
    """The per-step two-pass protocol as a step policy of :func:`~dynheads_tl.engine.tracing.decode`.

    Each step runs one clean forward over the batch, recorded into ``clean_buffers``; each running row's
    selector then sees the clean step (Eq. 1 or Eq. 2 set, scores) and returns the heads to mask, or None.
    If any row masks something, the step is rewound and one masked forward follows with each row's own
    mask, recorded into ``masked_buffers``; masked rows keep its token, and the clean keys and values are
    restored (``keep_cache="clean"``) or the masked ones kept (``"masked"``, for the masked rows only).
    Rows with nothing to mask keep their clean token, scores and keys/values exactly."""

    def __init__(self, model, selectors: list[Selector], config: TraceConfig, *, kind: Literal["eq1", "eq2"],
                 threshold: float, mode: AblationMode, mean_z: Tensor | None, keep_cache: CachePolicy):
        batch, n_layers, n_heads = len(selectors), model.cfg.n_layers, model.cfg.n_heads
        self.selectors, self.kind, self.threshold, self.keep_cache = selectors, kind, threshold, keep_cache
        self.n_layers, self.mode, self.mean_z = n_layers, mode, mean_z
        self.clean_buffers = new_buffers(model, config.max_new_tokens, batch)
        self.masked_buffers = new_buffers(model, config.max_new_tokens, batch)
        self.active: dict[str, Tensor] = {}  # the recorder's dict: pointed at the clean or masked buffers
        self.ablation: dict[str, Tensor | None] = {"mask": None}
        self.applied = torch.zeros(batch, config.max_new_tokens, n_layers, n_heads, dtype=torch.bool)
        self.clean_tokens: list[list[int]] = [[] for _ in selectors]

    def hooks(self, state: StepState) -> HookList:
        return ablate_heads(lambda: self.ablation["mask"], n_layers=self.n_layers, mode=self.mode, mean_z=self.mean_z)

    def buffers(self, recorded: dict[str, Tensor]) -> None:
        self.active = recorded
        recorded.update(self.clean_buffers)

    def choose(self, loop: BatchLoop, step: int) -> Int[Tensor, "batch"]:
        decoder, clean_buffers, masked_buffers = loop.decoder, self.clean_buffers, self.masked_buffers
        before = decoder.n_cached
        self.active.update(clean_buffers)
        self.ablation["mask"] = None
        chosen = decoder.step(loop.next_input).argmax(-1)
        step_masks = torch.zeros(len(self.selectors), *self.applied.shape[2:], dtype=torch.bool, device=decoder.device)
        for b in torch.nonzero(loop.running).flatten().tolist():
            token = int(chosen[b])
            self.clean_tokens[b].append(token)
            argmax_row, support_row = clean_buffers["argmax_pos"][b, step], clean_buffers["support_score"][b, step]
            retrieval = (eq1_at_step(argmax_row, loop.ids[b], loop.evidence[b], token) if self.kind == "eq1"
                         else support_row > self.threshold)
            mask = self.selectors[b](StepView(step, token, argmax_row, support_row, retrieval))
            if mask is not None:
                step_masks[b] = mask.to(decoder.device).bool()
        masked_rows = step_masks.flatten(1).any(1)
        if bool(masked_rows.any()):
            saved = decoder.last_position()
            decoder.rewind(before)
            self.active.update(masked_buffers)
            self.ablation["mask"] = step_masks
            masked_choice = decoder.step(loop.next_input).argmax(-1)
            self.ablation["mask"] = None
            chosen = torch.where(masked_rows.to(chosen.device), masked_choice, chosen)
            decoder.replace_last_position(saved, None if self.keep_cache == "clean" else ~masked_rows)
        for name in masked_buffers:  # rows with nothing masked keep their clean record exactly
            masked_buffers[name][~masked_rows, step] = clean_buffers[name][~masked_rows, step]
        self.applied[:, step] = step_masks.cpu()
        return chosen


def two_pass_generation(model, sample: Sample, select: Selector, config: TraceConfig | None = None, *,
                        condition: str = "custom", k: int | None = None, **protocol) -> AblationTrace:
    """:func:`two_pass_batch` for one sample (no padding: exactly the unbatched computation).
    ``protocol``: ``kind``, ``threshold``, ``mode``, ``mean_z``, ``keep_cache``."""
    return two_pass_batch(model, [(sample, select)], config, labels=[(condition, k)], **protocol)[0]


# --- selectors ---------------------------------------------------------------------------------
def select_dynamic(view: StepView) -> Tensor:
    return view.retrieval


def select_fixed(mask: Bool[Tensor, "layer head"]) -> Selector:
    return lambda view: mask


def select_static_matched(static_order: Int[Tensor, "rank"]) -> Selector:
    """Size-matched static baseline: at each step, the top-|D_t| heads of the static ranking
    (``static_order``: flat head indices, best first); nothing when D_t is empty."""

    def select(view: StepView):
        n = int(view.retrieval.sum())
        if n == 0:
            return None
        mask = torch.zeros(view.retrieval.numel(), dtype=torch.bool, device=view.retrieval.device)
        mask[static_order[:n].to(mask.device)] = True
        return mask.reshape(view.retrieval.shape)

    return select


def select_top_ranked(k: int) -> Selector:
    """Progressive masking: D_t first, then by attention share on the evidence; the top k."""

    def select(view: StepView):
        if k == 0:
            return None
        rank_key = view.retrieval.float() * 2.0 + view.support_score.float()
        order = torch.argsort(rank_key.flatten(), descending=True, stable=True)[:k]
        mask = torch.zeros(rank_key.numel(), dtype=torch.bool, device=rank_key.device)
        mask[order] = True
        return mask.reshape(rank_key.shape)

    return select


def random_heads(n_layers: int, n_heads: int, k: int, seed: int) -> Bool[Tensor, "layer head"]:
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(n_layers * n_heads, generator=generator)[:k]
    mask = torch.zeros(n_layers * n_heads, dtype=torch.bool)
    mask[order] = True
    return mask.reshape(n_layers, n_heads)


# --- metrics -------------------------------------------------------------------------------------
def answer_scores(trace: Trace) -> dict[str, float]:
    gold = trace.answers[0]
    if trace.task == "niah":
        return {"accuracy": niah_accuracy(trace.response, gold),
                "rouge_l": rouge_l(trace.response, trace.meta.get("needle_text", gold))}
    return {"f1": token_f1(trace.response, gold), "em": exact_match(trace.response, gold),
            "rouge_l": rouge_l(trace.response, gold)}


def compensation(result: AblationTrace, static_mask: Bool[Tensor, "layer head"], *, kind: str = "eq1",
                 threshold: float = 0.1) -> dict[str, object]:
    """E_t = H'_t minus H_t: heads active after masking that were not active in the clean pass.

    Returns m_s for this sample (max over masked steps of |E_t ∩ static top-20|) and the per-head
    counts of E over steps (for the compensation table). Only steps where something was masked count.
    """
    if kind == "eq1":
        before, after = result.clean.retrieval_mask, result.masked.retrieval_mask
    else:
        before, after = result.clean.support_score > threshold, result.masked.support_score > threshold
    masked_steps = result.masked_heads.flatten(1).any(1)
    newly = after & ~before & masked_steps[:, None, None]
    in_static = (newly & static_mask).flatten(1).sum(1)
    return {"m_s": int(in_static.max()) if len(in_static) else 0,
            "new_heads": newly.sum(0), "steps_masked": int(masked_steps.sum())}


# --- experiments ----------------------------------------------------------------------------------
@dataclass
class AblationSetup:
    """Everything the conditions share: static set, k, protocol knobs.

    ``static_order`` (flat head indices by static score, best first) is needed by ``static_matched``."""

    static_mask: Bool[Tensor, "layer head"]
    static_top20: Bool[Tensor, "layer head"]
    k: int
    kind: Literal["eq1", "eq2"] = "eq1"
    threshold: float = 0.1
    mode: AblationMode = "zero"
    keep_cache: CachePolicy = "clean"
    mean_z: Tensor | None = None
    seed: int = 0
    static_order: Tensor | None = None


def make_selector(model, condition: Condition, setup: AblationSetup, *, sample_seed: int = 0,
                  k: int | None = None) -> tuple[Selector, int | None]:
    """The selector of one condition and the k it records (static/random: ``setup.k``; progressive: ``k``)."""
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    if condition == "none":
        return (lambda view: None), None
    if condition == "dynamic":
        return select_dynamic, None
    if condition == "static":
        return select_fixed(setup.static_mask), setup.k
    if condition == "static_matched":
        if setup.static_order is None:
            raise ValueError("The static_matched condition needs AblationSetup.static_order (the static ranking).")
        return select_static_matched(setup.static_order), None
    if condition == "random":
        return select_fixed(random_heads(n_layers, n_heads, setup.k, setup.seed * 1_000_003 + sample_seed)), setup.k
    if condition == "progressive":
        if k is None or k < 0:
            raise ValueError("Progressive masking needs k >= 0.")
        return select_top_ranked(k), k
    raise ValueError(f"Unknown condition {condition!r}; use none, dynamic, static, static_matched, random or "
                     "progressive.")


@dataclass(frozen=True)
class Job:
    """One generation of an experiment: a condition on a sample (``sample_seed`` seeds the random baseline)."""

    sample: Sample
    condition: str
    sample_seed: int = 0
    k: int | None = None


def run_jobs(model, jobs: list[Job], setup: AblationSetup, config: TraceConfig) -> list[AblationTrace]:
    """Run ``jobs`` as one batch under ``setup``'s protocol."""
    selected = [make_selector(model, job.condition, setup, sample_seed=job.sample_seed, k=job.k) for job in jobs]
    return two_pass_batch(model, [(job.sample, select) for job, (select, _) in zip(jobs, selected)], config,
                          kind=setup.kind, threshold=setup.threshold, mode=setup.mode, mean_z=setup.mean_z,
                          keep_cache=setup.keep_cache, labels=[(job.condition, k) for job, (_, k) in zip(jobs, selected)])


def run_condition(model, sample: Sample, condition: Condition, setup: AblationSetup, config: TraceConfig,
                  *, sample_seed: int = 0, k: int | None = None) -> AblationTrace:
    """One condition on one sample (a batch of one)."""
    return run_jobs(model, [Job(sample, condition, sample_seed, k)], setup, config)[0]


def _setup_key(setup: AblationSetup) -> dict:
    mean_z = None if setup.mean_z is None else float(setup.mean_z.double().sum())
    return {"static": setup.static_mask.nonzero().tolist(), "top20": setup.static_top20.nonzero().tolist(),
            "k": setup.k, "kind": setup.kind, "threshold": setup.threshold, "mode": setup.mode,
            "keep_cache": setup.keep_cache, "seed": setup.seed, "mean_z": mean_z,
            "order": None if setup.static_order is None else setup.static_order.tolist()}


def _summarise(result: AblationTrace, setup: AblationSetup) -> dict:
    comp = compensation(result, setup.static_top20, kind=setup.kind, threshold=setup.threshold)
    row = {**answer_scores(result.masked), "m_s": comp["m_s"], "response": result.response,
           "heads_masked_per_step": float(result.masked_heads.flatten(1).sum(1).float().mean()),
           "heads_ever_masked": head_names(result.masked_heads.any(0))}
    return {"row": row, "new_heads": comp["new_heads"].tolist()}


# Bump when the protocol's outputs change, so cached runs of an older protocol are not reused.
_PROTOCOL_VERSION = 2


def _job_keys(model, jobs: list[Job], setup: AblationSetup, config: TraceConfig,
              cache_key: dict | None) -> list[dict | None]:
    """Each job's cache key (None without a ``cache_key``): the model's name and weights, the prompt, the
    condition, k, the calibration setup and the trace settings."""
    from dynheads_tl.engine.models import model_fingerprint, model_name

    return [None if cache_key is None else
            {**cache_key, "model": model_name(model), "model_fingerprint": model_fingerprint(model),
             "prompt": prompt_digest(job.sample), "condition": job.condition,
             "k": job.k, "sample_seed": job.sample_seed, "setup": _setup_key(setup), "trace": asdict(config),
             "protocol": _PROTOCOL_VERSION} for job in jobs]


def count_missing(model, jobs: list[Job], setup: AblationSetup, config: TraceConfig, *,
                  cache_key: dict | None = None) -> int:
    """How many of ``jobs`` :func:`cached_runs` would have to run (all of them without a cache). Only checks
    that each entry exists: :func:`cached_runs` reads it (and recomputes one that turns out unreadable)."""
    from dynheads_tl.store import result_path

    return sum(key is None or not result_path(key).exists() for key in _job_keys(model, jobs, setup, config, cache_key))


def cached_runs(model, jobs: list[Job], setup: AblationSetup, config: TraceConfig, *, batch_size: int = 8,
                cache_key: dict | None = None) -> list[tuple[dict, Tensor]]:
    """Each job -> (scores row, per-head counts of newly active heads). Jobs already in the cache are
    read from it; the others run in batches of at most ``batch_size`` and are cached one by one."""
    from dynheads_tl.store import load_cached_json, save_cached_json

    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
    keys = _job_keys(model, jobs, setup, config, cache_key)
    outputs = [None if key is None else load_cached_json(key) for key in keys]
    todo = [i for i, out in enumerate(outputs) if out is None]
    for start in range(0, len(todo), batch_size):
        chunk = todo[start: start + batch_size]
        for i, result in zip(chunk, run_jobs(model, [jobs[i] for i in chunk], setup, config)):
            summary = _summarise(result, setup)
            outputs[i] = summary if keys[i] is None else save_cached_json(keys[i], summary)
    return [(out["row"], torch.tensor(out["new_heads"])) for out in outputs]


def grid_experiment(model, cells: list[tuple[dict, Sample]], setup: AblationSetup, config: TraceConfig,
                    conditions: list[str] = ("none", "dynamic", "static", "random"), desc: str = "grid",
                    cache_key: dict | None = None, batch_size: int = 8) -> pd.DataFrame:
    """Fig 2 / Fig 6: every condition on every (cell, sample); one row per run.

    The runs of one grid cell (every sample and condition at one context length and depth) are
    batched together, ``batch_size`` rows at a time."""
    groups: dict[tuple, list[int]] = {}
    for index, (cell, _) in enumerate(cells):
        groups.setdefault((cell.get("context"), cell.get("depth")), []).append(index)
    rows: list[dict | None] = [None] * (len(cells) * len(conditions))
    group_jobs = [(members, [Job(cells[i][1], condition, sample_seed=i) for i in members for condition in conditions])
                  for members in groups.values()]
    # Cells read back from the cache first; progress is shown only for the cells that run.
    todo = [count_missing(model, jobs, setup, config, cache_key=cache_key) > 0 for _, jobs in group_jobs]
    ready = [group for group, run in zip(group_jobs, todo) if not run]
    running = [group for group, run in zip(group_jobs, todo) if run]
    for members, jobs in itertools.chain(ready, progress(running, desc=f"{desc}: grid cells")):
        where = [i * len(conditions) + c for i in members for c in range(len(conditions))]
        for slot, job, (row, _) in zip(where, jobs, cached_runs(model, jobs, setup, config, batch_size=batch_size,
                                                                cache_key=cache_key)):
            rows[slot] = {**cells[slot // len(conditions)][0], "condition": job.condition, **row}
    return pd.DataFrame(rows)


def progressive_experiment(model, samples: list[Sample], setup: AblationSetup, config: TraceConfig,
                           ks: list[int], desc: str = "progressive", cache_key: dict | None = None,
                           batch_size: int = 8):
    """Fig 3 / Fig 7: mask the top-k ranked heads at each step, for each k. Returns (rows, new-head counts).

    Each sample's runs (every k, plus its unmasked generation for reference) form one batch; every row
    carries the unmasked response, so the k = 0 row can be checked against it."""
    rows = []
    new_heads = torch.zeros_like(setup.static_top20, dtype=torch.long)
    sample_jobs = [[Job(sample, "none", index)] + [Job(sample, "progressive", index, k) for k in ks]
                   for index, sample in enumerate(samples)]
    todo = [i for i, jobs in enumerate(sample_jobs) if count_missing(model, jobs, setup, config, cache_key=cache_key)]
    results = {}
    for index in itertools.chain([i for i in range(len(samples)) if i not in todo],
                                 progress(todo, desc=f"{desc}: samples")):
        results[index] = cached_runs(model, sample_jobs[index], setup, config, batch_size=batch_size,
                                     cache_key=cache_key)
    for index in range(len(samples)):
        (reference, _), *runs = results[index]
        for k, (row, counts) in zip(ks, runs):
            new_heads += counts.long()
            rows.append({"sample": index, "k": k, **row, "unmasked_response": reference["response"]})
    return pd.DataFrame(rows), new_heads


def compensation_table(new_heads: Tensor, static_top20: Tensor, n_rows: int = 15) -> pd.DataFrame:
    """Which heads take over after masking, how often, and whether they are static heads."""
    flat = new_heads.flatten()
    order = torch.argsort(flat, descending=True, stable=True)
    n_heads = new_heads.shape[1]
    rows = []
    for index in order[:n_rows]:
        count = int(flat[index])
        if count == 0:
            break
        layer, head = divmod(int(index), n_heads)
        rows.append({"head": head_label(layer, head), "times_newly_active": count,
                     "in_static_top20": bool(static_top20[layer, head])})
    return pd.DataFrame(rows, columns=["head", "times_newly_active", "in_static_top20"])
