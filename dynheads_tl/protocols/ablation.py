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
with k the mean dynamic-set size of the calibration split. Progressive masking ranks every head at step t
(Eq. 1 hits first, then by attention share on the evidence) and masks the top k.

Controls that are not in the paper, each decided at each step from that step's D_t (S_20: the static
top-20 of the calibration split):

- ``static_matched``: as many of the top static heads as D_t has heads (dynamic and static masking
  remove the same number of heads at every step);
- ``random_matched``: |D_t| random heads, drawn from a generator seeded by the sample and the step;
- ``dynamic_nonstatic``: D_t minus S_20, the part of the dynamic set that a static view misses;
- ``static_nondynamic``: the heads of S_20 that are not in D_t at that step;
- ``random_nonstatic``: as many random heads from outside S_20 as D_t minus S_20 has (the size-matched
  control of ``dynamic_nonstatic``);
- ``random_nondynamic``: as many random heads from outside D_t as S_20 minus D_t has (the size-matched
  control of ``static_nondynamic``).

Each masks nothing on a step where its set is empty (``static_nondynamic`` masks all of S_20 on a step
where D_t is empty).

Teacher forcing (:class:`TeacherForced`, ``gold=`` in :func:`two_pass_batch`): the same two passes per
step, but the token fed to step t+1 is the gold continuation's token t (:func:`gold_continuation`), not
an argmax, so one early error cannot derail the rest of the answer. Each step records the gold token's
log-probability in the clean and in the masked pass; their difference is the step's drop. Eq. 1 at step t
reads the forced gold token as the generated token.

Batching: :func:`two_pass_batch` runs several (sample, selector) jobs as one left-padded batch (each
row has its own D_t and its own mask at every step); :func:`two_pass_generation` is a batch of one.
The experiments batch the runs of one grid cell, and one sample's k values (``batch_size`` rows at a
time). Batched rows agree with one-at-a-time runs to float rounding; their tokens, masks and Eq. 1
sets were identical in every test and benchmark (see :class:`dynheads_tl.engine.tracing.BatchDecoder`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Callable, Literal

import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from dynheads_tl.engine.equations import Eq2Rule, eq1_mask, eq2_chance, head_label, head_names
from dynheads_tl.engine.hooks import AblationMode, HookList, StepState, ablate_heads, retain_heads
from dynheads_tl.executors import compute_missing
from dynheads_tl.engine.tracing import BatchLoop, StepPolicy, Trace, TraceConfig, build_trace, decode, new_buffers
from dynheads_tl.tasks.common import Sample, prompt_digest
from dynheads_tl.tasks.metrics import exact_match, niah_accuracy, rouge_l, token_f1

Condition = Literal["none", "dynamic", "static", "static_matched", "random", "random_matched", "dynamic_nonstatic",
                    "static_nondynamic", "random_nonstatic", "random_nondynamic", "progressive", "query_matched"]
CachePolicy = Literal["clean", "masked"]
# What the second pass does with a selector's heads: "ablate" zeroes (or means) their outputs; "retain" lets
# only them attend to every key, every other head seeing the attention sinks and the local window alone
# (:func:`~dynheads_tl.engine.hooks.retain_heads`, the KV-retention protocol of notebook 06).
Intervention = Literal["ablate", "retain"]


@dataclass
class StepView:
    """What the clean pass of one step saw (the selector's input)."""

    step: int
    token: int
    argmax_pos: Int[Tensor, "layer head"]
    support_score: Float[Tensor, "layer head"]
    retrieval: Bool[Tensor, "layer head"]  # D_t
    # The final-norm hidden state of the previous step's kept pass (None at step 0): what a predictor that must
    # not look at the current step may read (the KV-retention protocol's probe).
    previous_hidden: Float[Tensor, "d_model"] | None = None


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
    # Teacher-forced runs only: the gold token's log-probability at each step, clean and masked pass.
    clean_logprob: Float[Tensor, "step"] | None = None
    masked_logprob: Float[Tensor, "step"] | None = None

    @property
    def response(self) -> str:
        return self.masked.response

    @property
    def teacher_forced(self) -> bool:
        return self.clean_logprob is not None

    @property
    def logprob_drop(self) -> Float[Tensor, "step"]:
        """Per step, how much masking lowered the gold token's log-probability (clean minus masked; nats)."""
        if self.clean_logprob is None or self.masked_logprob is None:
            raise ValueError("Only a teacher-forced run (two_pass_batch with gold=...) has log-probability drops.")
        return self.clean_logprob - self.masked_logprob


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
    threshold: "float | Eq2Rule" = 0.1,
    mode: AblationMode = "zero",
    mean_z: Float[Tensor, "layer head d_head"] | None = None,
    keep_cache: CachePolicy = "clean",
    labels: list[tuple[str, int | None]] | None = None,
    gold: list[list[int]] | None = None,
    intervention: Intervention = "ablate",
    clean_pass: bool = True,
) -> list[AblationTrace]:
    """Greedy generation of every ``(sample, selector)`` job in one batch under the per-step two-pass
    protocol (module docstring). ``labels`` gives each job's ``(condition, k)`` for its record.

    Each step runs one clean forward over the batch; if any running row's selector masks something,
    one masked forward follows with each row's own mask (rows with nothing to mask keep their clean
    token, scores and keys/values exactly). Jobs may share a sample: its prompt is prefilled once.

    ``gold`` (one token list per job) teacher-forces the jobs instead (:class:`TeacherForced`): each row
    is fed its gold tokens and stops when they run out, whatever ``config.max_new_tokens`` and
    ``config.stop_at_eos`` say; the records carry the gold tokens' clean and masked log-probabilities.

    ``intervention="retain"`` (:class:`TwoPass`): selectors return the heads that keep the full context; the
    record's ``masked_heads`` then holds each step's retained set. ``clean_pass=False`` (retention with
    ``keep_cache="masked"`` only) skips the clean pass for selectors that do not read it: one forward per step.
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
    protocol = dict(kind=kind, threshold=threshold, mode=mode, mean_z=mean_z, keep_cache=keep_cache,
                    intervention=intervention, clean_pass=clean_pass)
    if gold is None:
        policy = TwoPass(model, selectors, config, **protocol)
    else:
        if len(gold) != len(jobs):
            raise ValueError(f"{len(gold)} gold continuations for {len(jobs)} jobs.")
        if any(len(tokens) == 0 for tokens in gold):
            raise ValueError("A gold continuation is empty: teacher forcing needs at least one gold token per job.")
        config = replace(config, max_new_tokens=max(len(tokens) for tokens in gold), stop_at_eos=False)
        policy = TeacherForced(model, selectors, config, gold, **protocol)
    loop, _ = decode(model, samples, config, policy)
    results = []
    for b, sample in enumerate(samples):
        condition, k = labels[b]
        rule = Eq2Rule.of(threshold)
        extra = {"condition": condition, "k": k, "intervention": intervention, "mode": mode,
                 "keep_cache": keep_cache, "kind": kind, "threshold": rule.value, "eq2_rule": rule.kind}
        clean = build_trace(model, sample, config, policy.clean_tokens[b], policy.clean_buffers, row=b, **extra,
                            pass_="clean")
        masked = build_trace(model, sample, config, loop.tokens[b], policy.masked_buffers, row=b, **extra,
                             pass_="masked")
        n_steps = len(loop.tokens[b])
        logprobs = ({} if gold is None else
                    {"clean_logprob": policy.clean_logprob[b, :n_steps].clone(),
                     "masked_logprob": policy.masked_logprob[b, :n_steps].clone()})
        results.append(AblationTrace(clean, masked, policy.applied[b, :n_steps], condition, k, **logprobs))
    return results


class TwoPass(StepPolicy):
    """The per-step two-pass protocol as a step policy of :func:`~dynheads_tl.engine.tracing.decode`.

    Each step runs one clean forward over the batch, recorded into ``clean_buffers``; each running row's
    selector then sees the clean step (Eq. 1 or Eq. 2 set, scores) and returns the heads to mask, or None.
    If any row masks something, the step is rewound and one masked forward follows with each row's own
    mask, recorded into ``masked_buffers``; masked rows keep its token, and the clean keys and values are
    restored (``keep_cache="clean"``) or the masked ones kept (``"masked"``, for the masked rows only).
    Rows with nothing to mask keep their clean token, scores and keys/values exactly.

    ``intervention="retain"``: a selector returns the heads that keep the full context (R_t; None: every head);
    the second pass restricts every other head to the Eq. 2 sinks and local window of ``config``
    (``sink_tokens``, ``local_window``), and runs for the rows whose R_t leaves some head out."""

    def __init__(self, model, selectors: list[Selector], config: TraceConfig, *, kind: Literal["eq1", "eq2"],
                 threshold: "float | Eq2Rule", mode: AblationMode, mean_z: Tensor | None, keep_cache: CachePolicy,
                 intervention: Intervention = "ablate", clean_pass: bool = True):
        batch, n_layers, n_heads = len(selectors), model.cfg.n_layers, model.cfg.n_heads
        if intervention not in ("ablate", "retain"):
            raise ValueError(f"intervention must be 'ablate' or 'retain', got {intervention!r}.")
        if not clean_pass and (intervention != "retain" or keep_cache != "masked"):
            raise ValueError("clean_pass=False needs intervention='retain' and keep_cache='masked'.")
        self.intervention, self.streaming, self.clean_pass = intervention, None, clean_pass
        self.selectors, self.kind, self.keep_cache = selectors, kind, keep_cache
        self.rule = Eq2Rule.of(threshold)
        self.n_layers, self.mode, self.mean_z = n_layers, mode, mean_z
        self.clean_buffers = new_buffers(model, config.max_new_tokens, batch)
        self.masked_buffers = new_buffers(model, config.max_new_tokens, batch)
        self.active: dict[str, Tensor] = {}  # the recorder's dict: pointed at the clean or masked buffers
        self.ablation: dict[str, Tensor | None] = {"mask": None}
        self.applied = torch.zeros(batch, config.max_new_tokens, n_layers, n_heads, dtype=torch.bool)
        self.clean_tokens: list[list[int]] = [[] for _ in selectors]

    def hooks(self, state: StepState) -> HookList:
        if self.intervention == "retain":
            return retain_heads(lambda: self.ablation["mask"], lambda: self.streaming, n_layers=self.n_layers)
        return ablate_heads(lambda: self.ablation["mask"], n_layers=self.n_layers, mode=self.mode, mean_z=self.mean_z)

    def buffers(self, recorded: dict[str, Tensor]) -> None:
        if "evidence_attention" in recorded or "context_mass" in recorded:
            raise ValueError("The two-pass protocol does not record evidence attention or signals; trace with "
                             "TraceConfig(evidence_attention=False, signals=False).")
        self.active = recorded
        recorded.update(self.clean_buffers)

    def tokens(self, logits: Float[Tensor, "batch vocab"], loop: BatchLoop, step: int) -> Int[Tensor, "batch"]:
        """Each row's token at this step from one pass's logits: the argmax (:class:`TeacherForced`: the gold token)."""
        return logits.argmax(-1)

    def observe(self, step: int, clean_logits: Float[Tensor, "batch vocab"],
                masked_logits: Float[Tensor, "batch vocab"] | None, masked_rows: Bool[Tensor, "batch"]) -> None:
        """Called once per step with both passes' logits (``masked_logits`` is None when no row masked anything)."""
        return None

    def choose(self, loop: BatchLoop, step: int) -> Int[Tensor, "batch"]:
        if not self.clean_pass:
            return self._retained_only(loop, step)
        decoder, clean_buffers, masked_buffers = loop.decoder, self.clean_buffers, self.masked_buffers
        before = decoder.n_cached
        self.active.update(clean_buffers)
        self.ablation["mask"] = None
        clean_logits = decoder.step(loop.next_input)
        chosen = self.tokens(clean_logits, loop, step)
        retain = self.intervention == "retain"
        step_masks = torch.full((len(self.selectors), *self.applied.shape[2:]), retain, dtype=torch.bool,
                                device=decoder.device)
        for b in torch.nonzero(loop.running).flatten().tolist():
            token = int(chosen[b])
            self.clean_tokens[b].append(token)
            argmax_row, support_row = clean_buffers["argmax_pos"][b, step], clean_buffers["support_score"][b, step]
            retrieval = (eq1_at_step(argmax_row, loop.ids[b], loop.evidence[b], token) if self.kind == "eq1"
                         else self._eq2_set(loop, b, support_row))
            previous = masked_buffers["hidden"][b, step - 1] if step > 0 else None
            mask = self.selectors[b](StepView(step, token, argmax_row, support_row, retrieval, previous))
            if mask is not None:
                step_masks[b] = mask.to(decoder.device).bool()
        masked_rows = ~step_masks.flatten(1).all(1) if retain else step_masks.flatten(1).any(1)
        if retain:  # the keys a restricted head sees at this step: sinks and local window (padding is masked anyway)
            self.streaming = ~loop.masks["eligible"]
        masked_logits = None
        if bool(masked_rows.any()):
            saved = decoder.last_position()
            decoder.rewind(before)
            self.active.update(masked_buffers)
            self.ablation["mask"] = step_masks
            masked_logits = decoder.step(loop.next_input)
            self.ablation["mask"] = None
            chosen = torch.where(masked_rows.to(chosen.device), self.tokens(masked_logits, loop, step), chosen)
            decoder.replace_last_position(saved, None if self.keep_cache == "clean" else ~masked_rows)
        for name in masked_buffers:  # rows with nothing masked keep their clean record exactly
            masked_buffers[name][~masked_rows, step] = clean_buffers[name][~masked_rows, step]
        self.applied[:, step] = step_masks.cpu()
        self.observe(step, clean_logits, masked_logits, masked_rows)
        return chosen


    def _retained_only(self, loop: BatchLoop, step: int) -> Int[Tensor, "batch"]:
        """One retained pass per step, for selectors that do not read the clean pass (``clean_pass=False``): they
        see a view with an empty D_t and zero scores, and the previous step's hidden state. Its token, keys and
        values are kept, exactly as the two-pass loop's retained pass would give them; the clean record is a copy
        of the retained one."""
        decoder, clean_buffers, masked_buffers = loop.decoder, self.clean_buffers, self.masked_buffers
        shape = self.applied.shape[2:]
        step_masks = torch.ones((len(self.selectors), *shape), dtype=torch.bool, device=decoder.device)
        empty = torch.zeros(shape, dtype=torch.bool)
        for b in torch.nonzero(loop.running).flatten().tolist():
            previous = masked_buffers["hidden"][b, step - 1] if step > 0 else None
            view = StepView(step, -1, torch.zeros(shape, dtype=torch.long), torch.zeros(shape), empty, previous)
            mask = self.selectors[b](view)
            if mask is not None:
                step_masks[b] = mask.to(decoder.device).bool()
        masked_rows = ~step_masks.flatten(1).all(1)
        self.streaming = ~loop.masks["eligible"]
        self.active.update(masked_buffers)
        self.ablation["mask"] = step_masks if bool(masked_rows.any()) else None
        logits = decoder.step(loop.next_input)
        self.ablation["mask"] = None
        chosen = self.tokens(logits, loop, step)
        for b in torch.nonzero(loop.running).flatten().tolist():
            self.clean_tokens[b].append(int(chosen[b]))
        for name in clean_buffers:
            clean_buffers[name][:, step] = masked_buffers[name][:, step]
        self.applied[:, step] = step_masks.cpu()
        self.observe(step, logits, logits, masked_rows)
        return chosen

    def _eq2_set(self, loop: BatchLoop, b: int, support_row: Tensor) -> Tensor:
        """Row ``b``'s Eq. 2 set at this step under the rule (the chance share read from the loop's own masks)."""
        if self.rule.kind == "fixed":
            return support_row > self.rule.value
        key_len = loop.state.key_len
        chance = eq2_chance(loop.masks["evidence"][b, :key_len], loop.masks["eligible"][b, :key_len])
        return self.rule.select(support_row, chance.cpu())


class TeacherForced(TwoPass):
    """The two-pass protocol with the gold continuation fed in place of the argmax (a derailment-free measure).

    At step t every row is fed its gold token t, whichever pass ran: the clean pass gives D_t (Eq. 1 reads the
    gold token as the generated one), the masked pass the masked logits, and the gold token's log-probability
    is recorded in both (``clean_logprob``, ``masked_logprob``: [batch, step], NaN after a row's gold ran out).
    A row stops when its gold tokens run out. On a step where the row masks nothing the masked value is the
    clean one, so the drop is exactly 0 there. The KV cache policy is :class:`TwoPass`'s."""

    def __init__(self, model, selectors: list[Selector], config: TraceConfig, gold: list[list[int]], **protocol):
        super().__init__(model, selectors, config, **protocol)
        if len(gold) != len(selectors):
            raise ValueError(f"{len(gold)} gold continuations for {len(selectors)} rows.")
        self.lengths = torch.tensor([len(tokens) for tokens in gold])
        if bool((self.lengths > config.max_new_tokens).any()):
            raise ValueError(f"A gold continuation has {int(self.lengths.max())} tokens, more than the "
                             f"max_new_tokens={config.max_new_tokens} steps this run has room for.")
        device = next(model.parameters()).device
        self.gold = torch.zeros(len(gold), config.max_new_tokens, dtype=torch.long, device=device)
        for b, tokens in enumerate(gold):
            self.gold[b, : len(tokens)] = torch.as_tensor(tokens, dtype=torch.long, device=device)
        self.clean_logprob = torch.full((len(gold), config.max_new_tokens), float("nan"))
        self.masked_logprob = torch.full((len(gold), config.max_new_tokens), float("nan"))

    def tokens(self, logits: Float[Tensor, "batch vocab"], loop: BatchLoop, step: int) -> Int[Tensor, "batch"]:
        # Rows past their gold continuation have stopped: what they are fed is never kept.
        return self.gold[:, step].to(logits.device)

    def observe(self, step: int, clean_logits: Float[Tensor, "batch vocab"],
                masked_logits: Float[Tensor, "batch vocab"] | None, masked_rows: Bool[Tensor, "batch"]) -> None:
        target = self.gold[:, step, None].to(clean_logits.device)
        clean = clean_logits.float().log_softmax(-1).gather(-1, target)[:, 0]
        masked = clean
        if masked_logits is not None:
            masked = torch.where(masked_rows.to(clean.device),
                                 masked_logits.float().log_softmax(-1).gather(-1, target)[:, 0], clean)
        live = step < self.lengths
        self.clean_logprob[live, step] = clean.cpu()[live]
        self.masked_logprob[live, step] = masked.cpu()[live]

    def after_step(self, loop: BatchLoop, step: int) -> None:
        loop.done |= step + 1 >= self.lengths  # a row whose gold tokens ran out stops


def two_pass_generation(model, sample: Sample, select: Selector, config: TraceConfig | None = None, *,
                        condition: str = "custom", k: int | None = None, **protocol) -> AblationTrace:
    """:func:`two_pass_batch` for one sample (no padding: exactly the unbatched computation).
    ``protocol``: ``kind``, ``threshold``, ``mode``, ``mean_z``, ``keep_cache``, ``intervention``."""
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


def select_random_matched(seed: int) -> Selector:
    """Size-matched random control: at each step, |D_t| heads drawn uniformly from all heads (they may overlap
    D_t) by a generator seeded with ``seed`` (one per sample) and the step; nothing when D_t is empty."""
    return select_random_sized(seed, lambda view: int(view.retrieval.sum()),
                               lambda view: torch.ones(view.retrieval.shape, dtype=torch.bool))


def select_dynamic_nonstatic(static_top20: Bool[Tensor, "layer head"]) -> Selector:
    """D_t minus the static top-20: the dynamic heads a static view misses; nothing when that is empty."""

    def select(view: StepView):
        mask = view.retrieval & ~static_top20.to(view.retrieval.device)
        return mask if bool(mask.any()) else None

    return select


def select_static_nondynamic(static_top20: Bool[Tensor, "layer head"]) -> Selector:
    """The static top-20 heads that are not in D_t at this step; nothing when D_t covers all of them."""

    def select(view: StepView):
        mask = static_top20.to(view.retrieval.device) & ~view.retrieval
        return mask if bool(mask.any()) else None

    return select


def random_heads_from(pool: Bool[Tensor, "layer head"], n: int, seed: int) -> Bool[Tensor, "layer head"]:
    """``n`` heads drawn uniformly from the heads of ``pool`` (at most all of them), seeded by ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    candidates = torch.nonzero(pool.flatten().cpu()).flatten()
    chosen = candidates[torch.randperm(len(candidates), generator=generator)[: min(n, len(candidates))]]
    mask = torch.zeros(pool.numel(), dtype=torch.bool)
    mask[chosen] = True
    return mask.reshape(pool.shape)


def select_random_sized(seed: int, size: Callable[[StepView], int], pool: Callable[[StepView], Tensor]) -> Selector:
    """A random control sized per step: ``size(view)`` heads drawn from ``pool(view)`` with a generator seeded by
    ``seed`` (one per sample) and the step; nothing when the size is 0."""

    def select(view: StepView):
        n = size(view)
        if n == 0:
            return None
        return random_heads_from(pool(view), n, seed * 100_003 + view.step).to(view.retrieval.device)

    return select


def select_random_nonstatic(static_top20: Bool[Tensor, "layer head"], seed: int) -> Selector:
    """The size-matched control of ``dynamic_nonstatic``: |D_t minus S_20| random heads from outside S_20."""
    static = static_top20.bool()
    return select_random_sized(seed, lambda view: int((view.retrieval & ~static.to(view.retrieval.device)).sum()),
                               lambda view: ~static)


def select_random_nondynamic(static_top20: Bool[Tensor, "layer head"], seed: int) -> Selector:
    """The size-matched control of ``static_nondynamic``: |S_20 minus D_t| random heads from outside D_t."""
    static = static_top20.bool()
    return select_random_sized(seed, lambda view: int((static.to(view.retrieval.device) & ~view.retrieval).sum()),
                               lambda view: ~view.retrieval.cpu())


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
    """``k`` heads drawn without replacement from all ``n_layers`` x ``n_heads`` by a generator seeded with ``seed``."""
    return random_heads_from(torch.ones(n_layers, n_heads, dtype=torch.bool), k, seed)


# --- metrics -------------------------------------------------------------------------------------
def answer_scores(trace: Trace) -> dict[str, float]:
    gold = trace.answers[0]
    if trace.task == "niah":
        return {"accuracy": niah_accuracy(trace.response, gold),
                "rouge_l": rouge_l(trace.response, trace.meta.get("needle_text", gold))}
    return {"f1": token_f1(trace.response, gold), "em": exact_match(trace.response, gold),
            "rouge_l": rouge_l(trace.response, gold)}


def gold_continuation(sample: Sample) -> str:
    """The text a correct answer reproduces, which teacher forcing feeds token by token.

    NIAH: the needle sentence itself (``meta["needle_text"]``, "The magic word is <uuid>."). The embedded
    model's correct answers are that sentence (the unmasked responses of the committed grid read "The magic
    word is <uuid>."), and its tokens after the first lie in the needle span, so Eq. 1 fires on them as in
    free generation; the bare UUID would be a continuation the model does not produce. HotpotQA: the gold
    answer string (Eq. 2 does not read the generated token)."""
    if sample.task == "niah":
        return str(sample.meta.get("needle_text", sample.answers[0]))
    return sample.answers[0]


def gold_token_ids(tokenizer, sample: Sample) -> list[int]:
    """:func:`gold_continuation` as the tokenizer encodes it, without special tokens."""
    return list(tokenizer(gold_continuation(sample), add_special_tokens=False)["input_ids"])


def compensation(result: AblationTrace, static_mask: Bool[Tensor, "layer head"], *, kind: str = "eq1",
                 threshold: "float | Eq2Rule" = 0.1) -> dict[str, object]:
    """E_t = H'_t minus H_t minus M_t: heads active after masking that were not active in the clean pass
    and were not masked themselves at step t (M_t). A masked head's attention pattern is still computed (only
    its output is ablated), so without the last term it could count as compensating for its own removal.

    Returns m_s for this sample (max over masked steps of |E_t ∩ static top-20|) and the per-head
    counts of E over steps (for the compensation table). Only steps where something was masked count.
    """
    if kind == "eq1":
        before, after = result.clean.retrieval_mask, result.masked.retrieval_mask
    else:
        before, after = result.clean.eq2_sets(threshold), result.masked.eq2_sets(threshold)
    masked_steps = result.masked_heads.flatten(1).any(1)
    newly = after & ~before & ~result.masked_heads & masked_steps[:, None, None]
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
    threshold: "float | Eq2Rule" = 0.1  # Eq. 2's selection rule (a number: the fixed threshold)
    mode: AblationMode = "zero"
    keep_cache: CachePolicy = "clean"
    mean_z: Tensor | None = None
    seed: int = 0
    static_order: Tensor | None = None
    # A second static ranking (QRHead-style query-focused scores, issue #31), needed by ``query_matched``.
    query_order: Tensor | None = None


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
    if condition == "query_matched":  # the size-matched design with the query-focused ranking
        if setup.query_order is None:
            raise ValueError("The query_matched condition needs AblationSetup.query_order (the query-focused ranking).")
        return select_static_matched(setup.query_order), None
    if condition == "random":
        return select_fixed(random_heads(n_layers, n_heads, setup.k, setup.seed * 1_000_003 + sample_seed)), setup.k
    if condition == "random_matched":
        return select_random_matched(setup.seed * 1_000_003 + sample_seed), None
    if condition == "dynamic_nonstatic":
        return select_dynamic_nonstatic(setup.static_top20), None
    if condition == "static_nondynamic":
        return select_static_nondynamic(setup.static_top20), None
    if condition == "random_nonstatic":
        return select_random_nonstatic(setup.static_top20, setup.seed * 1_000_003 + sample_seed), None
    if condition == "random_nondynamic":
        return select_random_nondynamic(setup.static_top20, setup.seed * 1_000_003 + sample_seed), None
    if condition == "progressive":
        if k is None or k < 0:
            raise ValueError("Progressive masking needs k >= 0.")
        return select_top_ranked(k), k
    raise ValueError(f"Unknown condition {condition!r}; use none, dynamic, static, static_matched, random, "
                     "random_matched, dynamic_nonstatic, static_nondynamic, random_nonstatic, random_nondynamic or "
                     "progressive.")


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
    """The setup in a job's cache key; the query-focused ranking only in ``query_matched`` jobs, so adding it leaves
    every other job's key (and its cached run) as it was."""
    mean_z = None if setup.mean_z is None else float(setup.mean_z.double().sum())
    return {"static": setup.static_mask.nonzero().tolist(), "top20": setup.static_top20.nonzero().tolist(),
            "k": setup.k, "kind": setup.kind, "threshold": rule_key(setup.threshold), "mode": setup.mode,
            "keep_cache": setup.keep_cache, "seed": setup.seed, "mean_z": mean_z,
            "order": None if setup.static_order is None else setup.static_order.tolist(),
            **({} if setup.query_order is None or condition != "query_matched"
               else {"query_order": setup.query_order.tolist()})}


def teacher_forced_scores(result: AblationTrace) -> dict[str, float | int | None]:
    """One teacher-forced run in numbers (log-probabilities in nats, ``tf_`` for teacher-forced):
    ``tf_drop`` the mean per-step drop of the gold token's log-probability over all gold steps,
    ``tf_drop_masked`` the same over the steps where something was masked (None when none was),
    ``tf_steps`` / ``tf_masked_steps`` how many steps of each, the mean clean and masked log-probabilities,
    and the mean number of heads masked per step."""
    drop = result.logprob_drop
    masked_steps = result.masked_heads.flatten(1).any(1)
    return {"tf_drop": float(drop.mean()),
            "tf_drop_masked": float(drop[masked_steps].mean()) if bool(masked_steps.any()) else None,
            "tf_steps": int(len(drop)), "tf_masked_steps": int(masked_steps.sum()),
            "tf_clean_logprob": float(result.clean_logprob.mean()),
            "tf_masked_logprob": float(result.masked_logprob.mean()),
            "tf_heads_masked_per_step": float(result.masked_heads.flatten(1).sum(1).float().mean())}


def _summarise(result: AblationTrace, setup: AblationSetup) -> dict:
    comp = compensation(result, setup.static_top20, kind=setup.kind, threshold=setup.threshold)
    if result.teacher_forced:
        return {"row": teacher_forced_scores(result), "new_heads": comp["new_heads"].tolist()}
    row = {**answer_scores(result.masked), "m_s": comp["m_s"], "response": result.response,
           "heads_masked_per_step": float(result.masked_heads.flatten(1).sum(1).float().mean()),
           "heads_ever_masked": head_names(result.masked_heads.any(0))}
    return {"row": row, "new_heads": comp["new_heads"].tolist()}


# Bump when the protocol's outputs change, so cached runs of an older protocol are not reused.
# 3: m_s leaves out the heads masked at the step; teacher-forced runs.
_PROTOCOL_VERSION = 3


def _job_keys(model, jobs: list[Job], setup: AblationSetup, config: TraceConfig,
              cache_key: dict | None) -> list[dict | None]:
    """Each job's cache key (None without a ``cache_key``): the model's name and weights, the prompt, the
    condition, k, the calibration setup and the trace settings."""
    from dynheads_tl.engine.models import model_fingerprint, model_name

    return [None if cache_key is None else
            {**cache_key, "model": model_name(model), "model_fingerprint": model_fingerprint(model),
             "prompt": prompt_digest(job.sample), "condition": job.condition,
             "k": job.k, "sample_seed": job.sample_seed, "setup": _setup_key(setup, job.condition), "trace": asdict(config),
             "protocol": _PROTOCOL_VERSION, "teacher_forced": job.teacher_forced,
             "gold": gold_token_ids(model.tokenizer, job.sample) if job.teacher_forced else None} for job in jobs]


def count_missing(model, jobs: list[Job], setup: AblationSetup, config: TraceConfig, *,
                  cache_key: dict | None = None) -> int:
    """How many of ``jobs`` :func:`cached_runs` would have to run (all of them without a cache). Only checks
    that each entry exists: :func:`cached_runs` reads it (and recomputes one that turns out unreadable)."""
    from dynheads_tl.store import result_path

    return sum(key is None or not result_path(key).exists() for key in _job_keys(model, jobs, setup, config, cache_key))


def ablation_units(model, jobs: list[Job], setup: AblationSetup, config: TraceConfig) -> list[dict]:
    """One batch of ablation units (the executors' ``compute``): ``jobs`` run as one batch, each summarised as
    :func:`cached_runs` caches it."""
    return [_summarise(result, setup) for result in run_jobs(model, jobs, setup, config)]


def cached_runs(model, jobs: list[Job], setup: AblationSetup, config: TraceConfig, *, batch_size: int = 8,
                cache_key: dict | None = None, groups: list | None = None,
                desc: str = "ablation runs") -> list[tuple[dict, Tensor]]:
    """Each job -> (scores row, per-head counts of newly active heads). Jobs already in the cache are
    read from it; the others go to the current executor (:mod:`dynheads_tl.executors`) in batches of at most
    ``batch_size`` and are cached one by one as their batch comes back. ``groups`` (one label per job) keeps
    jobs of different groups (grid cells, say) in different batches; within a group, generated and
    teacher-forced jobs run apart. A teacher-forced job's row is :func:`teacher_forced_scores`."""
    from dynheads_tl.store import load_cached_json, save_cached_json

    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
    groups = [None] * len(jobs) if groups is None else list(groups)
    if len(groups) != len(jobs):
        raise ValueError(f"{len(groups)} group labels for {len(jobs)} jobs.")
    keys = _job_keys(model, jobs, setup, config, cache_key)
    outputs = [None if key is None else load_cached_json(key) for key in keys]
    missing = [i for i, out in enumerate(outputs) if out is None]
    chunks = []
    for group in dict.fromkeys(groups[i] for i in missing):
        members = [i for i in missing if groups[i] == group]
        for part in ([i for i in members if not jobs[i].teacher_forced], [i for i in members if jobs[i].teacher_forced]):
            chunks += [part[start: start + batch_size] for start in range(0, len(part), batch_size)]
    for i, summary in compute_missing(model, ablation_units, chunks, lambda i: jobs[i], args=(setup, config), desc=desc):
        outputs[i] = summary if keys[i] is None else save_cached_json(keys[i], summary)
    return [(out["row"], torch.tensor(out["new_heads"])) for out in outputs]


def grid_experiment(model, cells: list[tuple[dict, Sample]], setup: AblationSetup, config: TraceConfig,
                    conditions: list[str] = ("none", "dynamic", "static", "random"), desc: str = "grid",
                    cache_key: dict | None = None, batch_size: int = 8, teacher_forced: bool = True) -> pd.DataFrame:
    """Fig 2 / Fig 6: every condition on every (cell, sample); one row per run.

    With ``teacher_forced`` each run is also teacher-forced on the sample's gold continuation under the
    same condition, and its :func:`teacher_forced_scores` (the ``tf_`` columns) join the run's row.
    The runs of one grid cell (every sample and condition at one context length and depth) are
    batched together, ``batch_size`` rows at a time (generated and teacher-forced runs apart)."""
    groups: dict[tuple, list[int]] = {}
    for index, (cell, _) in enumerate(cells):
        groups.setdefault((cell.get("context"), cell.get("depth")), []).append(index)
    rows: list[dict | None] = [None] * (len(cells) * len(conditions))
    group_jobs = []
    for members in groups.values():
        jobs = [Job(cells[i][1], condition, sample_seed=i) for i in members for condition in conditions]
        group_jobs.append((members, jobs + ([replace(job, teacher_forced=True) for job in jobs] if teacher_forced else [])))
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
                           batch_size: int = 8):
    """Fig 3 / Fig 7: mask the top-k ranked heads at each step, for each k. Returns (rows, new-head counts).

    Each sample's runs (every k, plus its unmasked generation for reference) are batched together, and
    as many samples' runs as fit in ``batch_size`` rows share a batch; every row carries the unmasked
    response, so the k = 0 row can be checked against it."""
    rows = []
    new_heads = torch.zeros_like(setup.static_top20, dtype=torch.long)
    sample_jobs = [[Job(sample, "none", index)] + [Job(sample, "progressive", index, k) for k in ks]
                   for index, sample in enumerate(samples)]
    todo = [i for i, jobs in enumerate(sample_jobs) if count_missing(model, jobs, setup, config, cache_key=cache_key)]
    per_group = max(1, batch_size // (len(ks) + 1))
    # Samples with missing runs share batches, per_group samples at a time; every sample's runs go to the executor
    # at once.
    group_of = {index: ("ready", index) for index in range(len(samples))}
    for start in range(0, len(todo), per_group):
        group_of.update({index: ("todo", start) for index in todo[start: start + per_group]})
    jobs = [job for index in range(len(samples)) for job in sample_jobs[index]]
    labels = [group_of[index] for index in range(len(samples)) for _ in sample_jobs[index]]
    outputs = cached_runs(model, jobs, setup, config, batch_size=batch_size, cache_key=cache_key, groups=labels,
                          desc=f"{desc}: runs")
    results = {index: outputs[index * (len(ks) + 1): (index + 1) * (len(ks) + 1)] for index in range(len(samples))}
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
