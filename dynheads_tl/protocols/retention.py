"""Per-step KV retention (notebook 06): only the heads of R_t read the whole context at step t.

DuoAttention, RazorAttention and HeadKV keep the full KV cache for a *static* set of heads and a short window
for every other head. If the heads that retrieve change from step to step and the hidden state predicts them,
R_t can be chosen per step. The protocol is the :class:`Retain` step policy (:func:`retain_batch`), which makes
the two-pass ablation's passes (:class:`~dynheads_tl.protocols.stepwise.HeadIntervention`) with its own hooks:

1. a clean pass with every head on the full context (it gives D_t for the oracle and is otherwise discarded);
2. a retained pass in which the heads outside R_t attend only to the first ``sink_tokens`` positions and the
   last ``local_window`` keys, with exactly zero attention elsewhere; its token, its keys and values are kept.

Strategies that do not read the clean pass skip it (``clean_pass=False``): one retained pass per step, with the
same tokens, keys and values. Teacher forcing (``gold=``) feeds the gold continuation and records the gold
token's log-probability under retention.

The prompt is prefilled with every head on the full context: retention acts on decoding, where the cache is
read. Strategies at an equal budget of b heads per step (:data:`STRATEGIES`):

- ``static``: the top b heads by Wu et al.'s retrieval score on calibration answers (the DuoAttention-style
  split), the same at every step;
- ``predicted``: the top b of a probe's scores from the hidden state of the *previous* step (of the retained
  pass: what a deployed system would have), so it never looks at step t; step 0 has no previous step and uses
  the static order;
- ``oracle``: D_t of the clean pass first, then by Eq. 2 share on the evidence (the upper bound);
- ``random``: b heads drawn per step (seeded by the sample and the step);
- ``streaming`` (b = 0) and ``full`` (every head) bound them.

GQA: heads sharing a KV head share its cache, so a KV head is kept when any of its query heads is retained;
:func:`kv_heads_kept` counts them. The KV-head-level variant (``granularity="kv"``) ranks KV heads by the best
score among their query heads and retains all query heads of the top b_kv.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, get_args

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from dynheads_tl.engine.equations import Eq2Rule
from dynheads_tl.engine.hooks import HookList, StepState, retain_heads
from dynheads_tl.engine.models import model_name
from dynheads_tl.engine.tracing import BatchLoop, Trace, TraceConfig
from dynheads_tl.protocols.stepwise import HeadIntervention, Selector, StepView, TeacherForcing, decode_jobs
from dynheads_tl.tasks.common import Sample, mix_seed

Strategy = Literal["static", "predicted", "oracle", "random", "streaming", "full"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)  # the names, from the one declaration above
Granularity = Literal["query", "kv"]
Scorer = Callable[[StepView], Tensor]  # a step's view -> one score per query head [layer, head]


def oracle_scores(view: StepView) -> Tensor:
    """D_t first (Eq. 1 of the clean pass), then by Eq. 2 share on the evidence."""
    return view.retrieval.float() * 2.0 + view.support_score.float()


def fixed_scores(scores: Tensor) -> Scorer:
    return lambda view: scores


def random_scores(shape: tuple[int, int], seed: int) -> Scorer:
    """Fresh random scores at every step, from a generator seeded by ``seed`` and the step."""
    return lambda view: torch.rand(shape, generator=torch.Generator().manual_seed(mix_seed(seed, view.step)))


def predicted_scores(probe: Callable[[Tensor], Tensor], fallback: Tensor) -> Scorer:
    """``probe(previous hidden)`` reshaped to [layer, head]; ``fallback`` (the static scores) at step 0."""
    return lambda view: fallback if view.previous_hidden is None else \
        torch.as_tensor(probe(view.previous_hidden.float().cpu()), dtype=torch.float32).reshape(fallback.shape)


def top_retained(scores: Float[Tensor, "layer head"], b: int, *, granularity: Granularity = "query",
                 group: int = 1) -> Bool[Tensor, "layer head"]:
    """The retained set: the ``b`` query heads with the highest scores (``"query"``), or every query head of the
    ``b`` KV heads whose best query head scores highest (``"kv"``; ``group`` query heads per KV head)."""
    scores = scores.float()
    n_layers, n_heads = scores.shape
    if granularity == "kv":
        per_kv = scores.reshape(n_layers, n_heads // group, group).amax(-1).flatten()
        keep = torch.zeros_like(per_kv, dtype=torch.bool)
        keep[torch.argsort(per_kv, descending=True, stable=True)[:b]] = True
        return keep.reshape(n_layers, n_heads // group, 1).expand(-1, -1, group).reshape(n_layers, n_heads)
    keep = torch.zeros(scores.numel(), dtype=torch.bool)
    keep[torch.argsort(scores.flatten(), descending=True, stable=True)[:b]] = True
    return keep.reshape(n_layers, n_heads)


def retention_selector(scorer: Scorer | None, b: int, *, granularity: Granularity = "query",
                       group: int = 1, n_units: int | None = None) -> Selector:
    """A selector for :func:`retain_batch`: R_t = :func:`top_retained` of the scorer's
    scores at every step. ``b`` is in query heads (``"query"``) or KV heads (``"kv"``); ``b`` = 0 is streaming
    (``scorer`` may be None) and ``b`` = ``n_units`` the full cache (None: nothing restricted)."""
    if n_units is not None and b >= n_units:
        return lambda view: None
    if scorer is None:
        if b:
            raise ValueError("Only b = 0 (streaming) or the full cache can do without a scorer.")
        return lambda view: torch.zeros_like(view.retrieval, dtype=torch.bool)
    return lambda view: top_retained(scorer(view), b, granularity=granularity, group=group).to(view.retrieval.device)


def kv_heads_kept(retained: Bool[Tensor, "step layer head"], group: int) -> Tensor:
    """Per step, how many KV heads some retained query head reads (a KV head is kept if any of its ``group``
    query heads is retained)."""
    steps, n_layers, n_heads = retained.shape
    return retained.reshape(steps, n_layers, n_heads // group, group).any(-1).flatten(1).sum(1)


def kv_heads_switched(retained: Bool[Tensor, "step layer head"], group: int) -> Tensor:
    """Per step from the second on, how many KV heads are kept whole at that step that were not at the step
    before: each must have its evicted entries brought back (from host memory, say) before it is read. A static
    set never switches; a per-step set pays this at every step. Empty for fewer than two steps."""
    steps, n_layers, n_heads = retained.shape
    kept = retained.reshape(steps, n_layers, n_heads // group, group).any(-1).flatten(1)
    return (kept[1:] & ~kept[:-1]).sum(1)


# --- the policy ------------------------------------------------------------------------------------------
@dataclass
class RetentionTrace:
    """A retained generation: the clean pass of every step, and the retained pass whose tokens were kept.

    ``retained.tokens`` is the generated answer; ``retained_heads[t]`` is R_t (the heads that read the whole
    context at step t). On steps where every head is retained the retained record equals the clean one; without
    a clean pass (``clean_pass=False``) the clean record is a copy of the retained one."""

    clean: Trace
    retained: Trace
    retained_heads: Bool[Tensor, "step layer head"]
    # Teacher-forced runs only: the gold token's log-probability at each step, clean and retained pass.
    clean_logprob: Float[Tensor, "step"] | None = None
    retained_logprob: Float[Tensor, "step"] | None = None

    @property
    def response(self) -> str:
        return self.retained.response

    @property
    def teacher_forced(self) -> bool:
        return self.clean_logprob is not None


class Retain(HeadIntervention):
    """Per-step KV retention as a step policy of :func:`~dynheads_tl.engine.tracing.decode`: a selector returns
    R_t, the heads that keep the whole context (None: every head); the retained pass restricts every other head
    to the Eq. 2 sinks and local window of ``config`` (``sink_tokens``, ``local_window``), runs for the rows whose
    R_t leaves some head out, and its keys and values stay in the cache.

    With ``clean_pass`` (the default) each step is the two-pass loop of
    :class:`~dynheads_tl.protocols.stepwise.HeadIntervention`, so a selector sees D_t and the clean scores; without
    it, one retained pass per step, for selectors that do not read the clean pass."""

    UNCHANGED = True  # every head retained: nothing restricted

    def __init__(self, model, selectors: list[Selector], config: TraceConfig, *, kind: Literal["eq1", "eq2"] = "eq1",
                 threshold: "float | Eq2Rule" = 0.1, clean_pass: bool = True):
        super().__init__(model, selectors, config, kind=kind, threshold=threshold, keep_intervened_cache=True)
        self.clean_pass = clean_pass
        self.streaming: Tensor | None = None  # the keys a restricted head sees at this step

    def hooks(self, state: StepState) -> HookList:
        return retain_heads(lambda: self.step_heads, lambda: self.streaming, n_layers=self.n_layers)

    def prepare_intervention(self, loop: BatchLoop) -> None:
        # The sinks and the local window of this step (padding is masked anyway).
        self.streaming = ~loop.masks["eligible"]

    def choose(self, loop: BatchLoop, step: int) -> Int[Tensor, "batch"]:
        return super().choose(loop, step) if self.clean_pass else self._retained_only(loop, step)

    def _retained_only(self, loop: BatchLoop, step: int) -> Int[Tensor, "batch"]:
        """One retained pass per step (``clean_pass=False``): the selectors see a view with an empty D_t and zero
        scores, and the previous step's hidden state. Its token, keys and values are kept, exactly as the two-pass
        loop's retained pass would give them; the clean record is a copy of the retained one."""
        decoder, clean_buffers, retained_buffers = loop.decoder, self.clean_buffers, self.intervened_buffers
        shape = self.chosen_heads.shape[2:]
        step_heads = torch.ones((len(self.selectors), *shape), dtype=torch.bool, device=decoder.device)
        empty = torch.zeros(shape, dtype=torch.bool)
        for b in torch.nonzero(loop.running).flatten().tolist():
            previous = retained_buffers["hidden"][b, step - 1] if step > 0 else None
            view = StepView(step, -1, torch.zeros(shape, dtype=torch.long), torch.zeros(shape), empty, previous)
            heads = self.selectors[b](view)
            if heads is not None:
                step_heads[b] = heads.to(decoder.device).bool()
        changed = self.changed_rows(step_heads)
        self.prepare_intervention(loop)
        self.active.update(retained_buffers)
        self.step_heads = step_heads if bool(changed.any()) else None
        logits = decoder.step(loop.next_input)
        self.step_heads = None
        chosen = self.tokens(logits, loop, step)
        for b in torch.nonzero(loop.running).flatten().tolist():
            self.clean_tokens[b].append(int(chosen[b]))
        for name in clean_buffers:
            clean_buffers[name][:, step] = retained_buffers[name][:, step]
        self.chosen_heads[:, step] = step_heads.cpu()
        self.observe(step, logits, logits, changed)
        return chosen


class RetainForced(TeacherForcing, Retain):
    """Retention with the gold continuation fed in place of the argmax
    (:class:`~dynheads_tl.protocols.stepwise.TeacherForcing` on :class:`Retain`): the retained pass's gold
    log-probabilities in ``intervened_logprob`` (without a clean pass, the clean ones are the same)."""


def retain_batch(model, jobs: list[tuple[Sample, Selector]], config: TraceConfig | None = None, *,
                 clean_pass: bool = True, gold: list[list[int]] | None = None, kind: Literal["eq1", "eq2"] = "eq1",
                 threshold: "float | Eq2Rule" = 0.1) -> list[RetentionTrace]:
    """Greedy generation of every ``(sample, selector)`` job in one batch under per-step KV retention
    (:class:`Retain`; selectors such as :func:`retention_selector` return R_t). Jobs may share a sample: its prompt
    is prefilled once. ``clean_pass=False`` runs one forward per step, for selectors that do not read the clean
    pass (every strategy but the oracle). ``gold`` (one token list per job) teacher-forces the jobs
    (:class:`RetainForced`): each row is fed its gold tokens and stops when they run out, and the records carry
    the gold tokens' clean and retained log-probabilities. ``kind`` and ``threshold``: how the clean pass's D_t
    is read (Eq. 1, or Eq. 2 under the rule)."""
    if kind not in ("eq1", "eq2"):
        raise ValueError(f"kind must be 'eq1' or 'eq2', got {kind!r}.")
    samples, config, policy, loop = decode_jobs(model, jobs, config, policy=Retain, forced=RetainForced, gold=gold,
                                                kind=kind, threshold=threshold, clean_pass=clean_pass)
    rule = Eq2Rule.of(threshold)
    results = []
    for b, sample in enumerate(samples):
        clean, retained = policy.row_traces(model, sample, config, loop, b, second="retained", intervention="retain",
                                            clean_pass=clean_pass, kind=kind, threshold=rule.value,
                                            eq2_rule=rule.kind)
        n_steps = len(loop.tokens[b])
        logprobs = ({} if gold is None else
                    {"clean_logprob": policy.clean_logprob[b, :n_steps].clone(),
                     "retained_logprob": policy.intervened_logprob[b, :n_steps].clone()})
        results.append(RetentionTrace(clean, retained, policy.chosen_heads[b, :n_steps], **logprobs))
    return results


def retain_generation(model, sample: Sample, select: Selector, config: TraceConfig | None = None,
                      **protocol) -> RetentionTrace:
    """:func:`retain_batch` for one sample (no padding: exactly the unbatched computation). ``protocol``:
    ``clean_pass``, ``kind``, ``threshold``."""
    return retain_batch(model, [(sample, select)], config, **protocol)[0]


# --- memory ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KVShape:
    """What a model's KV cache size depends on (from its config)."""

    name: str
    n_layers: int
    n_kv_heads: int
    head_dim: int
    bytes_per_value: int = 2  # bf16 / fp16

    def full_bytes(self, tokens: int) -> int:
        """Keys and values of every layer and KV head for ``tokens`` positions."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * tokens * self.bytes_per_value

    def switch_bytes(self, tokens: int, sink_tokens: int, local_window: int) -> int:
        """What one KV head of one layer brings back when it is switched in: the keys and values of the positions
        a short-window head does not hold."""
        return 2 * self.head_dim * max(0, tokens - sink_tokens - local_window) * self.bytes_per_value

    def retained_bytes(self, tokens: int, kept_share: float, sink_tokens: int, local_window: int) -> float:
        """A ``kept_share`` of the KV heads holds every position; the others the sinks and the window only."""
        short = min(tokens, sink_tokens + local_window)
        return kept_share * self.full_bytes(tokens) + (1 - kept_share) * self.full_bytes(short)


# Llama-3.1-8B: 32 layers, 8 KV heads of dimension 128 (its config.json).
LLAMA_31_8B = KVShape("Llama-3.1-8B", 32, 8, 128)


def model_kv_shape(model) -> KVShape:
    """The KV shape of a loaded model (named as :func:`~dynheads_tl.engine.models.model_name` names it)."""
    cfg = model.cfg
    n_kv = int(getattr(cfg, "n_key_value_heads", None) or cfg.n_heads)
    return KVShape(model_name(model), int(cfg.n_layers), n_kv, int(cfg.d_head))


def memory_table(shapes: list[KVShape], shares: list[float], *, sink_tokens: int, local_window: int,
                 lengths: tuple[int, ...] = (8_000, 50_000, 128_000)) -> pd.DataFrame:
    """Computed (not measured) KV-cache memory in GiB per sequence, for each model, share of KV heads kept and
    context length; ``full`` is the whole cache, ``streaming`` keeps no head whole."""
    rows = []
    for shape in shapes:
        for share in shares:
            row = {"model": shape.name, "kv_heads_kept_share": share, "kv_heads_kept": share * shape.n_layers * shape.n_kv_heads}
            for tokens in lengths:
                row[f"GiB_at_{tokens // 1000}k"] = shape.retained_bytes(tokens, share, sink_tokens, local_window) / 2**30
            rows.append(row)
    return pd.DataFrame(rows)
