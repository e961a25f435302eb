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
Which heads each condition masks is :mod:`dynheads_tl.protocols.conditions`; the passes themselves are the
machinery KV retention shares (:class:`~dynheads_tl.protocols.stepwise.HeadIntervention`).

Teacher forcing (:class:`TeacherForced`, ``gold=`` in :func:`two_pass_batch`): the same two passes per
step, but the token fed to step t+1 is the gold continuation's token t
(:func:`~dynheads_tl.protocols.stepwise.gold_continuation`), not an argmax, so one early error cannot derail
the rest of the answer. Each step records the gold token's log-probability in the clean and in the masked
pass; their difference is the step's drop. Eq. 1 at step t reads the forced gold token as the generated token.

Batching: :func:`two_pass_batch` runs several (sample, selector) jobs as one left-padded batch (each
row has its own D_t and its own mask at every step); :func:`two_pass_generation` is a batch of one.
The experiments batch the runs of one grid cell, and one sample's k values (``batch_size`` rows at a
time). Batched rows agree with one-at-a-time runs to float rounding; their tokens, masks and Eq. 1
sets were identical in every test and benchmark (see :class:`dynheads_tl.engine.tracing.BatchDecoder`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from jaxtyping import Bool, Float
from torch import Tensor

from dynheads_tl.engine.equations import Eq2Rule
from dynheads_tl.engine.hooks import AblationMode, HookList, StepState, ablate_heads
from dynheads_tl.engine.tracing import Trace, TraceConfig
from dynheads_tl.protocols.stepwise import HeadIntervention, Selector, TeacherForcing, decode_jobs
from dynheads_tl.tasks.common import Sample

CachePolicy = Literal["clean", "masked"]


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


class TwoPass(HeadIntervention):
    """The per-step two-pass protocol as a step policy of :func:`~dynheads_tl.engine.tracing.decode`.

    Each step runs one clean forward over the batch; each running row's selector then sees the clean step
    (Eq. 1 or Eq. 2 set, scores) and returns the heads to mask, or None. If any row masks something, the step
    is rewound and one masked forward follows with each row's own mask (``hook_z`` of the masked heads zeroed,
    or set to ``mean_z``); masked rows keep its token, and the clean keys and values are restored
    (``keep_cache="clean"``) or the masked ones kept (``"masked"``, for the masked rows only). Rows with nothing
    to mask keep their clean token, scores and keys/values exactly (:class:`HeadIntervention`)."""

    UNCHANGED = False  # nothing masked

    def __init__(self, model, selectors: list[Selector], config: TraceConfig, *, kind: Literal["eq1", "eq2"],
                 threshold: "float | Eq2Rule", mode: AblationMode, mean_z: Tensor | None, keep_cache: CachePolicy):
        if keep_cache not in ("clean", "masked"):
            raise ValueError(f"keep_cache must be 'clean' or 'masked', got {keep_cache!r}.")
        super().__init__(model, selectors, config, kind=kind, threshold=threshold,
                         keep_intervened_cache=keep_cache == "masked")
        self.mode, self.mean_z, self.keep_cache = mode, mean_z, keep_cache

    def hooks(self, state: StepState) -> HookList:
        return ablate_heads(lambda: self.step_heads, n_layers=self.n_layers, mode=self.mode, mean_z=self.mean_z)


class TeacherForced(TeacherForcing, TwoPass):
    """The two-pass protocol with the gold continuation fed in place of the argmax (a derailment-free measure):
    :class:`~dynheads_tl.protocols.stepwise.TeacherForcing` on :class:`TwoPass`, the masked pass's gold
    log-probabilities in ``intervened_logprob``. The KV cache policy is :class:`TwoPass`'s."""


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
) -> list[AblationTrace]:
    """Greedy generation of every ``(sample, selector)`` job in one batch under the per-step two-pass
    protocol (module docstring). ``labels`` gives each job's ``(condition, k)`` for its record.

    Each step runs one clean forward over the batch; if any running row's selector masks something,
    one masked forward follows with each row's own mask (rows with nothing to mask keep their clean
    token, scores and keys/values exactly). Jobs may share a sample: its prompt is prefilled once.

    ``gold`` (one token list per job) teacher-forces the jobs instead (:class:`TeacherForced`): each row
    is fed its gold tokens and stops when they run out, whatever ``config.max_new_tokens`` and
    ``config.stop_at_eos`` say; the records carry the gold tokens' clean and masked log-probabilities.
    """
    if keep_cache not in ("clean", "masked"):
        raise ValueError(f"keep_cache must be 'clean' or 'masked', got {keep_cache!r}.")
    if kind not in ("eq1", "eq2"):
        raise ValueError(f"kind must be 'eq1' or 'eq2', got {kind!r}.")
    labels = labels or [("custom", None)] * len(jobs)
    if len(labels) != len(jobs):
        raise ValueError(f"{len(labels)} labels for {len(jobs)} jobs.")
    samples, config, policy, loop = decode_jobs(model, jobs, config, policy=TwoPass, forced=TeacherForced, gold=gold,
                                                kind=kind, threshold=threshold, mode=mode, mean_z=mean_z,
                                                keep_cache=keep_cache)
    rule = Eq2Rule.of(threshold)
    results = []
    for b, sample in enumerate(samples):
        condition, k = labels[b]
        clean, masked = policy.row_traces(model, sample, config, loop, b, second="masked", condition=condition, k=k,
                                          intervention="ablate", mode=mode, keep_cache=keep_cache, kind=kind,
                                          threshold=rule.value, eq2_rule=rule.kind)
        n_steps = len(loop.tokens[b])
        logprobs = ({} if gold is None else
                    {"clean_logprob": policy.clean_logprob[b, :n_steps].clone(),
                     "masked_logprob": policy.intervened_logprob[b, :n_steps].clone()})
        results.append(AblationTrace(clean, masked, policy.chosen_heads[b, :n_steps], condition, k, **logprobs))
    return results


def two_pass_generation(model, sample: Sample, select: Selector, config: TraceConfig | None = None, *,
                        condition: str = "custom", k: int | None = None, **protocol) -> AblationTrace:
    """:func:`two_pass_batch` for one sample (no padding: exactly the unbatched computation).
    ``protocol``: ``kind``, ``threshold``, ``mode``, ``mean_z``, ``keep_cache``."""
    return two_pass_batch(model, [(sample, select)], config, labels=[(condition, k)], **protocol)[0]
