"""THE decoding loop: :func:`decode` runs greedy steps over a left-padded batch under a :class:`StepPolicy`.

Why it is fast
--------------
Eq. 1 and Eq. 2 only need the query row of each decoding step, and step 0's row is the last prompt
token. So the prompt minus its last token is prefilled by the SDPA "fast twin" (no attention
patterns are ever materialised), and only one query row per step runs through the hooked bridge,
reusing the twin's KV cache. The hooks reduce each [head, 1, key] pattern row to what the paper
needs (top-1 source position, Eq. 2 score) before the next layer runs. Memory grows linearly in T.

The single loop
---------------
:class:`~dynheads_tl.engine.decoder.BatchDecoder` owns the KV cache of one or more left-padded sequences and
runs one step at a time with whatever hooks are attached; :class:`BatchLoop` adds the per-row masks and stopping.
:func:`decode` is the one loop: a :class:`StepPolicy` decides each step (:class:`Greedy` for
:func:`trace_batch` / :func:`trace_generation`; the two-pass ablation and the RAG loop are policies in
``dynheads_tl.protocols``). The reduction hooks, the policy's hooks and any caller hooks (ablation,
attention restriction) are attached once around the whole generation.

The parts live beside it: the decoder in :mod:`dynheads_tl.engine.decoder`, the recorder's buffers and hooks in
:mod:`dynheads_tl.engine.recorder`, the :class:`Trace` and its files in :mod:`dynheads_tl.engine.trace_data`.
The names the protocols and claims take from here (``Trace``, ``TraceConfig``, ``BatchDecoder``,
``build_trace``, ``new_buffers``) are the ones this loop itself uses.
"""
from __future__ import annotations

import weakref
from typing import Any, Sequence

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from dynheads_tl.engine.decoder import BatchDecoder
from dynheads_tl.engine.equations import eligible_positions, evidence_positions
from dynheads_tl.engine.hooks import HookList, StepState
from dynheads_tl.engine.models import declared_stop_ids
from dynheads_tl.engine.recorder import build_trace, max_evidence, new_buffers, record_token_signals, reduction_hooks
from dynheads_tl.engine.trace_data import Trace, TraceConfig
from dynheads_tl.tasks.common import Sample


def eos_token_ids(model) -> set[int]:
    """The ids that end a generation: the tokenizer's, config's and generation config's EOS, plus an embedded
    model's declared stop tokens (:attr:`dynheads_tl.engine.models.EmbeddedModel.stop_tokens`)."""
    ids = declared_stop_ids(model)
    for source in (getattr(model, "tokenizer", None), getattr(getattr(model, "original_model", None), "config", None),
                   getattr(getattr(model, "original_model", None), "generation_config", None)):
        value = getattr(source, "eos_token_id", None)
        if value is None:
            continue
        ids.update(value if isinstance(value, (list, tuple)) else [value])
    return ids


_NEWLINE_IDS: "weakref.WeakKeyDictionary[Any, tuple[int, frozenset[int]]]" = weakref.WeakKeyDictionary()


def newline_token_ids(tokenizer) -> frozenset[int]:
    """The ids whose decoded text holds a newline (a byte-level vocabulary's ``Ċ`` tokens, Llama 2's ``<0x0A>``, ...),
    found by decoding every id; kept per tokenizer (and found again when its vocabulary grows)."""
    size = len(tokenizer)
    known = _NEWLINE_IDS.get(tokenizer)
    if known is None or known[0] != size:
        texts = tokenizer.batch_decode([[i] for i in range(size)])
        known = (size, frozenset(i for i, text in enumerate(texts) if "\n" in text))
        _NEWLINE_IDS[tokenizer] = known
    return known[1]


class BatchLoop:
    """The bookkeeping of one greedy generation over a batch of samples: the decoder, the masks the
    reduction hooks read, each row's tokens so far and which rows have stopped.

    Shared by :func:`trace_batch` and the two-pass ablation loop. Build it inside
    ``model.hooks(...)`` (it prefills with ``state.active`` False, then sets it True). Rows that
    stop early keep being computed with their last token until every row has stopped; nothing of
    theirs is recorded after the stop.
    """

    def __init__(self, model, samples: list[Sample], config: TraceConfig, state: StepState,
                 masks: dict[str, Tensor], *, fast_until: Sequence[int | None] | None = None):
        if not samples:
            raise ValueError("No samples to generate from.")
        self.samples, self.config, self.state = samples, config, state
        state.active = False
        self.decoder = BatchDecoder(model, [s.prompt_ids for s in samples], prefill=config.prefill,
                                    fast_until=fast_until, max_new_tokens=config.max_new_tokens)
        state.active = True
        device, offsets = self.decoder.device, self.decoder.offsets.tolist()
        self.width = self.decoder.n_cached + 1  # the longest prompt
        longest = self.width + config.max_new_tokens  # key positions, padded or in the longest row's own
        # Each row's prompt + generated ids and evidence, in its own coordinates (for Eq. 1) ...
        self.ids = torch.zeros(len(samples), longest, dtype=torch.long, device=device)
        self.evidence = torch.stack([evidence_positions(s.evidence_spans, longest, device) for s in samples])
        for b, sample in enumerate(samples):
            self.ids[b, : len(sample.prompt_ids)] = torch.as_tensor(sample.prompt_ids, device=device)
        # ... and the evidence in padded coordinates (for the reduction hooks).
        padded_evidence = self.padded(self.evidence)
        masks.update(evidence=padded_evidence, eligible=None, offsets=self.decoder.offsets)
        # The evidence positions of each row (padded coordinates), for recording evidence attention.
        positions = [torch.nonzero(padded_evidence[b]).flatten() for b in range(len(samples))]
        width = max([len(p) for p in positions] + [1])
        masks["evidence_index"] = torch.zeros(len(samples), width, dtype=torch.long, device=device)
        masks["evidence_valid"] = torch.zeros(len(samples), width, dtype=torch.float32, device=device)
        for b, where in enumerate(positions):
            masks["evidence_index"][b, : len(where)] = where
            masks["evidence_valid"][b, : len(where)] = 1.0
        if config.signals:  # the context span and the first generated position, in padded coordinates
            masks["context"] = torch.zeros(len(samples), longest, dtype=torch.float32, device=device)
            for b, sample in enumerate(samples):
                start, end = sample.context_span
                masks["context"][b, offsets[b] + start: offsets[b] + end] = 1.0
            masks["first_generated"] = self.width
        self.masks = masks
        self.stop_ids = eos_token_ids(model) if config.stop_at_eos else set()
        if config.stop_at_newline:
            self.stop_ids = self.stop_ids | newline_token_ids(model.tokenizer)
        self.tokens: list[list[int]] = [[] for _ in samples]
        self.done = torch.zeros(len(samples), dtype=torch.bool)
        self.next_input: Tensor | None = None
        self.step = 0  # the next decoding step to run

    def padded(self, evidence: Bool[Tensor, "batch key"]) -> Bool[Tensor, "batch key"]:
        """Per-row positions given in each row's own coordinates (``[batch, key]``, as :attr:`evidence`), moved
        to the batch's left-padded coordinates (the reduction hooks')."""
        out = torch.zeros_like(evidence)
        longest = evidence.shape[1]
        for b, offset in enumerate(self.decoder.offsets.tolist()):
            out[b, offset:] = evidence[b, : longest - offset]
        return out

    def prepare(self, step: int) -> None:
        """Point the hooks at decoding step ``step``."""
        self.state.step = step
        self.state.key_len = self.width + step
        self.masks["eligible"] = eligible_positions(self.decoder.offsets, self.masks["evidence"].shape[1],
                                               self.state.key_len, self.config.sink_tokens, self.config.local_window)

    def commit(self, step: int, chosen: Int[Tensor, "batch"]) -> bool:
        """Keep ``chosen`` as step ``step``'s tokens of the running rows; True once every row has stopped."""
        for b in torch.nonzero(~self.done).flatten().tolist():
            token = int(chosen[b])
            self.tokens[b].append(token)
            self.ids[b, int(self.decoder.prompt_lengths[b]) + step] = token
            if token in self.stop_ids:
                self.done[b] = True
        self.next_input = chosen
        self.step = step + 1
        return self.finished

    @property
    def finished(self) -> bool:
        return bool(self.done.all())

    def retract(self, n_tokens: int) -> None:
        """Forget every generated token from index ``n_tokens`` on, so that decoding resumes at step
        ``n_tokens`` (a protocol that takes back text, like the RAG loop's retraction). Batches of one only.

        The decoder is rewound to the query of step ``n_tokens`` and the row runs again; the recorder's
        buffers of the forgotten steps are overwritten as those steps are decoded again."""
        if self.decoder.batch != 1:
            raise ValueError("Retraction is supported for a batch of one sample only.")
        tokens = self.tokens[0]
        if not 0 <= n_tokens <= len(tokens):
            raise ValueError(f"Cannot retract to {n_tokens} tokens: {len(tokens)} were generated.")
        del tokens[n_tokens:]
        prompt_length = int(self.decoder.prompt_lengths[0])
        self.decoder.rewind(prompt_length - 1 + n_tokens)
        last = tokens[-1] if tokens else int(self.samples[0].prompt_ids[-1])
        self.next_input = torch.tensor([last], device=self.decoder.device)
        self.done[0] = False
        self.step = n_tokens

    @property
    def running(self) -> Bool[Tensor, "batch"]:
        return ~self.done


class StepPolicy:
    """What the decoding loop does at each step, between preparing the hooks and keeping the tokens.

    :func:`decode` owns the KV cache, the per-row masks, stopping and the recorder's buffers; a policy
    decides how each step's tokens are chosen (one greedy forward, or a clean pass, a selection and a
    masked pass, ...), may add hooks of its own, may ask for part of the prompt to run through the hooked
    bridge, and may take back generated text after a step. Protocols are policies: :class:`Greedy` here,
    :class:`dynheads_tl.protocols.ablation.TwoPass` for the per-step ablation and
    :class:`dynheads_tl.protocols.rag.RagPolicy` for the dynamic-RAG loop. The defaults do nothing."""

    def hooks(self, state: StepState) -> HookList:
        """Hooks of this policy, attached beside the recorder's for the whole generation (prefill included)."""
        return []

    def buffers(self, recorded: dict[str, Tensor]) -> None:
        """Called once with the dict the recorder writes into (a policy may swap its tensors per pass)."""
        return None

    def fast_until(self, samples: list[Sample]) -> list[int | None] | None:
        """Per sample, how many prompt tokens the SDPA twin prefills (None: all but the last). The rest of
        the prompt runs through the hooked bridge, under this policy's hooks."""
        return None

    def choose(self, loop: "BatchLoop", step: int) -> Int[Tensor, "batch"]:
        """Run this step's forward pass(es) through ``loop.decoder`` and return each row's token."""
        raise NotImplementedError

    def after_step(self, loop: "BatchLoop", step: int) -> None:
        """Called after step ``step``'s tokens are kept; may call :meth:`BatchLoop.retract`."""
        return None


class Greedy(StepPolicy):
    """One forward per step; keep its argmax (plain greedy decoding)."""

    def choose(self, loop: "BatchLoop", step: int) -> Int[Tensor, "batch"]:
        return loop.decoder.step(loop.next_input).argmax(-1)


def decode(
    model,
    samples: list[Sample],
    config: TraceConfig,
    policy: StepPolicy,
    *,
    hooks: HookList | None = None,
    state: StepState | None = None,
    record: bool = True,
    placebo: list[Sample] | None = None,
) -> tuple["BatchLoop", dict[str, Tensor]]:
    """THE decoding loop: greedy steps over a left-padded batch of ``samples`` under ``policy``.

    Builds the recorder's per-step buffers (:func:`new_buffers`) and its reduction hooks
    (:func:`reduction_hooks`; ``record=False`` leaves them out, for the untraced baseline), attaches them
    with the policy's hooks and ``hooks``, prefills, then at every step points the hooks at the step
    (:meth:`BatchLoop.prepare`), lets the policy choose the tokens, keeps them (:meth:`BatchLoop.commit`)
    and gives the policy its say after the step (:meth:`StepPolicy.after_step`, which may retract), until
    every row has stopped or ``max_new_tokens`` steps are kept. Returns the loop (tokens, masks, decoder)
    and the recorded buffers.

    ``placebo``: the same prompts with other evidence spans, one per sample; the recorder also keeps Eq. 2's
    share on their evidence (``buffers["placebo_support_score"]``), from the very attention rows it reduces for
    the real evidence, so one generation serves both (:func:`trace_pairs`).
    """
    check_context_length(model, samples, config.max_new_tokens)
    if placebo is not None:
        check_placebo(samples, placebo, config)
    state = state or StepState()
    buffers = new_buffers(model, config.max_new_tokens, batch=len(samples),
                          evidence_width=max_evidence(samples) if config.evidence_attention else 0,
                          signals=config.signals and record, placebo=placebo is not None and record)
    policy.buffers(buffers)
    masks: dict[str, Tensor] = {}
    all_hooks = ((reduction_hooks(state, buffers, masks, model.cfg.n_layers) if record else [])
                 + list(policy.hooks(state)) + list(hooks or []))
    with model.hooks(fwd_hooks=all_hooks):
        loop = BatchLoop(model, samples, config, state, masks, fast_until=policy.fast_until(samples))
        if placebo is not None:  # before the first step: the prefill records nothing
            masks["placebo_evidence"] = loop.padded(torch.stack(
                [evidence_positions(s.evidence_spans, loop.evidence.shape[1], loop.decoder.device) for s in placebo]))
        while loop.step < config.max_new_tokens:
            step = loop.step
            loop.prepare(step)
            chosen = policy.choose(loop, step)
            if "token_logprob" in buffers:  # the distribution of the decoder's last forward, the kept token's
                record_token_signals(buffers, step, loop.decoder.last_logits, chosen)
            loop.commit(step, chosen)
            policy.after_step(loop, step)
            if loop.finished:
                break
    return loop, buffers


def trace_batch(
    model,
    samples: list[Sample],
    config: TraceConfig | None = None,
    *,
    hooks: HookList | None = None,
    state: StepState | None = None,
    record: bool = True,
) -> list[Trace]:
    """Greedy-decode every sample of ``samples`` in one batch and record, at every step and for every
    layer and head at once: the top-1 source position (-> Eq. 1), the Eq. 2 evidence score, the
    final-norm hidden state (``ln_final.hook_out``) and the generated token. One :class:`Trace` per sample.

    ``hooks`` (e.g. from :func:`dynheads_tl.engine.hooks.ablate_heads`) are attached beside the reduction
    hooks; pass the same ``state`` to both so per-step hooks see the current step.
    ``record=False`` runs the same loop without the reduction hooks (the untraced baseline).
    See :class:`BatchDecoder` for how batched rows compare with unbatched runs.
    """
    config = config or TraceConfig()
    loop, buffers = decode(model, samples, config, Greedy(), hooks=hooks, state=state, record=record)
    return [build_trace(model, sample, config, loop.tokens[b], buffers, row=b) for b, sample in enumerate(samples)]


def trace_pairs(model, samples: list[Sample], placebo: list[Sample],
                config: TraceConfig | None = None) -> list[tuple[Trace, Trace]]:
    """:func:`trace_batch` of ``samples`` that also records Eq. 2 on ``placebo``'s evidence (the same prompts,
    other spans): per sample, (its trace, the placebo's trace). Both come from one generation, so each equals
    what :func:`trace_batch` gives for its own samples in the same batch, bit for bit: the attention rows are the
    same, only the evidence each share is taken over differs. Half the work of tracing the two apart."""
    config = config or TraceConfig()
    loop, buffers = decode(model, samples, config, Greedy(), placebo=placebo)
    swapped = {**buffers, "support_score": buffers["placebo_support_score"]}
    return [(build_trace(model, sample, config, loop.tokens[b], buffers, row=b),
             build_trace(model, placebo[b], config, loop.tokens[b], swapped, row=b))
            for b, sample in enumerate(samples)]


def check_placebo(samples: Sequence[Sample], placebo: Sequence[Sample], config: TraceConfig) -> None:
    """Refuse placebo samples that are not ``samples`` with other evidence (one each, the same prompt ids), or a
    config whose other recordings (evidence attention, signals) would describe only the real evidence."""
    if len(placebo) != len(samples):
        raise ValueError(f"{len(placebo)} placebo samples for {len(samples)} samples: pass one per sample.")
    for index, (sample, other) in enumerate(zip(samples, placebo)):
        if list(other.prompt_ids) != list(sample.prompt_ids):
            raise ValueError(f"Placebo sample {index} has another prompt than sample {index}: a placebo only moves "
                             "the evidence spans of the same prompt.")
    if config.evidence_attention or config.signals:
        raise ValueError("Placebo spans are recorded for Eq. 2's share only: trace with evidence_attention=False "
                         "and signals=False, or trace the placebo samples on their own.")


def check_context_length(model, samples: Sequence[Sample], max_new_tokens: int) -> None:
    """Refuse, before any model work, a sample whose prompt plus ``max_new_tokens`` does not fit in the
    model's context (``model.cfg.n_ctx``).

    Why: past its context a RoPE model still runs, on positions it never saw in training, and returns
    plausible-looking but meaningless attention patterns; nothing downstream would notice.
    """
    limit = getattr(model.cfg, "n_ctx", None)
    if not limit:
        return
    for index, sample in enumerate(samples):
        prompt_tokens = len(sample.prompt_ids)
        if prompt_tokens + max_new_tokens > limit:
            raise ValueError(
                f"Sample {index} ({sample.task}) needs room for {prompt_tokens + max_new_tokens} tokens "
                f"({prompt_tokens} prompt tokens + max_new_tokens={max_new_tokens}), more than the model's "
                f"context of n_ctx={limit} tokens; use shorter prompts or fewer new tokens."
            )


def trace_generation(
    model,
    sample: Sample,
    config: TraceConfig | None = None,
    *,
    hooks: HookList | None = None,
    state: StepState | None = None,
    record: bool = True,
) -> Trace:
    """:func:`trace_batch` for one sample (no padding: exactly the unbatched computation)."""
    return trace_batch(model, [sample], config, hooks=hooks, state=state, record=record)[0]
