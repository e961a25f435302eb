"""Per-step head interventions on the one decoding loop: what the two-pass ablation and KV retention share.

Both protocols run, at every decoding step t, a **clean pass** (every head as the model has it; its attention
rows give D_t) and then, for the rows whose selector changes something, a **second pass** from the same cache
with each row's own head set: :class:`~dynheads_tl.protocols.two_pass.TwoPass` zeroes (or means) the selected
heads' outputs, :class:`~dynheads_tl.protocols.retention.Retain` lets only the selected heads read the whole
context. What differs is only the hooks, what a selector's None means, and which keys and values the cache
keeps; :class:`HeadIntervention` is everything else, so both policies make the same forwards in the same order.

Here too: the selectors' input (:class:`StepView`), Eq. 1 at one step, teacher forcing as a mixin on either
policy (:class:`TeacherForcing`: the gold continuation is fed instead of the argmax, and the gold token's
log-probability recorded in both passes) with the gold continuation itself (:func:`gold_continuation`), and
:func:`decode_jobs`, which checks a batch of ``(sample, selector)`` jobs and decodes it under either policy.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Literal

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from dynheads_tl.engine.equations import Eq2Rule, eq1_mask, eq2_chance
from dynheads_tl.engine.hooks import HookList, StepState
from dynheads_tl.engine.tracing import BatchLoop, StepPolicy, Trace, TraceConfig, build_trace, decode, new_buffers
from dynheads_tl.tasks.common import Sample


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
    # D_{t-1}: the previous step's set from its clean pass (None at step 0), known before this step runs; a
    # selector that must not read this step's outcome masks it (claim 2's ``previous_step``).
    previous_retrieval: Bool[Tensor, "layer head"] | None = None
    # The final-norm hidden state of the previous step's clean pass (None at step 0, and where a policy runs no
    # clean pass): the state whose logits chose token t-1, in the same pass that gave D_{t-1}; claim 2's
    # ``predicted`` condition reads a probe on it (a set known before step t).
    previous_clean_hidden: Float[Tensor, "d_model"] | None = None


# A step's view -> the row's head set at this step (heads to mask, or heads to retain), or None: leave the step as
# the clean pass ran it.
Selector = Callable[[StepView], Bool[Tensor, "layer head"] | None]


def eq1_at_step(argmax_pos: Int[Tensor, "layer head"], ids: Int[Tensor, "key"], evidence: Bool[Tensor, "key"],
                token: int) -> Bool[Tensor, "layer head"]:
    """Eq. 1 (:func:`~dynheads_tl.engine.equations.eq1_mask`) for one step and one generated token."""
    return eq1_mask(argmax_pos, ids, evidence, torch.tensor(token, device=ids.device))


class HeadIntervention(StepPolicy):
    """A clean pass, each running row's selector, then one second pass with each row's head set, as a step policy
    of :func:`~dynheads_tl.engine.tracing.decode`.

    Each step runs one clean forward over the batch, recorded into ``clean_buffers``; each running row's selector
    then sees the clean step (Eq. 1 or Eq. 2 set, scores, the previous step's kept hidden state, and the previous
    step's clean-pass set D_{t-1} and hidden state) and returns its
    head set, or None (:attr:`UNCHANGED` for every head). If any row's set changes something, the step is rewound
    and one second forward follows with each row's own set under the subclass's hooks, recorded into
    ``intervened_buffers``; changed rows keep its token, and either the clean keys and values are restored
    (``keep_intervened_cache`` False) or the second pass's kept for the changed rows. Unchanged rows keep their
    clean token, scores and keys/values exactly. ``chosen_heads[b, t]`` is row b's set at step t.

    A subclass gives :meth:`hooks` (acting on ``step_heads``, None outside the second pass), :attr:`UNCHANGED`,
    and may prepare the second pass (:meth:`prepare_intervention`)."""

    #: The head set of a row that leaves the step as the clean pass ran it (also what a selector's None stands for).
    UNCHANGED: bool = False

    def __init__(self, model, selectors: list[Selector], config: TraceConfig, *, kind: Literal["eq1", "eq2"],
                 threshold: "float | Eq2Rule", keep_intervened_cache: bool):
        batch, n_layers, n_heads = len(selectors), model.cfg.n_layers, model.cfg.n_heads
        self.selectors, self.kind, self.keep_intervened_cache = selectors, kind, keep_intervened_cache
        self.rule = Eq2Rule.of(threshold)
        self.n_layers = n_layers
        self.clean_buffers = new_buffers(model, config.max_new_tokens, batch)
        self.intervened_buffers = new_buffers(model, config.max_new_tokens, batch)
        self.active: dict[str, Tensor] = {}  # the recorder's dict: pointed at the clean or the intervened buffers
        self.step_heads: Tensor | None = None  # [batch, layer, head] during the second pass, else None
        self.chosen_heads = torch.zeros(batch, config.max_new_tokens, n_layers, n_heads, dtype=torch.bool)
        self.clean_tokens: list[list[int]] = [[] for _ in selectors]
        self.previous_retrieval: list[Tensor | None] = [None for _ in selectors]  # each row's D_{t-1}

    def hooks(self, state: StepState) -> HookList:
        raise NotImplementedError

    def prepare_intervention(self, loop: BatchLoop) -> None:
        """Called at every step after the selectors ran and before any second pass (the default does nothing)."""
        return None

    def changed_rows(self, heads: Bool[Tensor, "batch layer head"]) -> Bool[Tensor, "batch"]:
        """The rows whose head set differs from :attr:`UNCHANGED` somewhere: those that need the second pass."""
        return heads.flatten(1).any(1) if not self.UNCHANGED else ~heads.flatten(1).all(1)

    def buffers(self, recorded: dict[str, Tensor]) -> None:
        if "evidence_attention" in recorded or "context_mass" in recorded:
            raise ValueError("The per-step head interventions (two-pass ablation, KV retention) do not record "
                             "evidence attention or signals; trace with "
                             "TraceConfig(evidence_attention=False, signals=False).")
        self.active = recorded
        recorded.update(self.clean_buffers)

    def tokens(self, logits: Float[Tensor, "batch vocab"], loop: BatchLoop, step: int) -> Int[Tensor, "batch"]:
        """Each row's token at this step from one pass's logits: the argmax (:class:`TeacherForcing`: the gold token)."""
        return logits.argmax(-1)

    def observe(self, step: int, clean_logits: Float[Tensor, "batch vocab"],
                intervened_logits: Float[Tensor, "batch vocab"] | None, changed: Bool[Tensor, "batch"]) -> None:
        """Called once per step with both passes' logits (``intervened_logits`` is None when no row changed)."""
        return None

    def choose(self, loop: BatchLoop, step: int) -> Int[Tensor, "batch"]:
        decoder, clean_buffers, intervened_buffers = loop.decoder, self.clean_buffers, self.intervened_buffers
        before = decoder.n_cached
        self.active.update(clean_buffers)
        self.step_heads = None
        clean_logits = decoder.step(loop.next_input)
        chosen = self.tokens(clean_logits, loop, step)
        step_heads = torch.full((len(self.selectors), *self.chosen_heads.shape[2:]), self.UNCHANGED,
                                dtype=torch.bool, device=decoder.device)
        for b in torch.nonzero(loop.running).flatten().tolist():
            token = int(chosen[b])
            self.clean_tokens[b].append(token)
            argmax_row, support_row = clean_buffers["argmax_pos"][b, step], clean_buffers["support_score"][b, step]
            retrieval = (eq1_at_step(argmax_row, loop.ids[b], loop.evidence[b], token) if self.kind == "eq1"
                         else self._eq2_set(loop, b, support_row))
            previous = intervened_buffers["hidden"][b, step - 1] if step > 0 else None
            previous_clean = clean_buffers["hidden"][b, step - 1] if step > 0 else None
            heads = self.selectors[b](StepView(step, token, argmax_row, support_row, retrieval, previous,
                                               self.previous_retrieval[b], previous_clean))
            self.previous_retrieval[b] = retrieval
            if heads is not None:
                step_heads[b] = heads.to(decoder.device).bool()
        changed = self.changed_rows(step_heads)
        self.prepare_intervention(loop)
        intervened_logits = None
        if bool(changed.any()):
            saved = decoder.last_position()
            decoder.rewind(before)
            self.active.update(intervened_buffers)
            self.step_heads = step_heads
            intervened_logits = decoder.step(loop.next_input)
            self.step_heads = None
            chosen = torch.where(changed.to(chosen.device), self.tokens(intervened_logits, loop, step), chosen)
            decoder.replace_last_position(saved, ~changed if self.keep_intervened_cache else None)
        for name in intervened_buffers:  # unchanged rows keep their clean record exactly
            intervened_buffers[name][~changed, step] = clean_buffers[name][~changed, step]
        self.chosen_heads[:, step] = step_heads.cpu()
        self.observe(step, clean_logits, intervened_logits, changed)
        return chosen

    def _eq2_set(self, loop: BatchLoop, b: int, support_row: Tensor) -> Tensor:
        """Row ``b``'s Eq. 2 set at this step under the rule (the chance share read from the loop's own masks)."""
        if self.rule.kind == "fixed":
            return support_row > self.rule.value
        key_len = loop.state.key_len
        chance = eq2_chance(loop.masks["evidence"][b, :key_len], loop.masks["eligible"][b, :key_len])
        return self.rule.select(support_row, chance.cpu())

    def row_traces(self, model, sample: Sample, config: TraceConfig, loop: BatchLoop, b: int, *, second: str,
                   **extra) -> tuple[Trace, Trace]:
        """Row ``b``'s (clean, second-pass) records; ``second`` names the second pass in the record's config."""
        clean = build_trace(model, sample, config, self.clean_tokens[b], self.clean_buffers, row=b, **extra,
                            pass_="clean")
        kept = build_trace(model, sample, config, loop.tokens[b], self.intervened_buffers, row=b, **extra,
                           pass_=second)
        return clean, kept


class TeacherForcing:
    """Mixed in before a :class:`HeadIntervention` (``class TeacherForced(TeacherForcing, TwoPass)``): the gold
    continuation is fed in place of the argmax, a derailment-free measure.

    At step t every row is fed its gold token t, whichever pass ran: the clean pass gives D_t (Eq. 1 reads the
    gold token as the generated one), the second pass its own logits, and the gold token's log-probability is
    recorded in both (``clean_logprob``, ``intervened_logprob``: [batch, step], NaN after a row's gold ran out).
    A row stops when its gold tokens run out. On a step where the row changes nothing the second value is the
    clean one, so their difference is exactly 0 there. The KV cache policy is the policy's own."""

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
        self.intervened_logprob = torch.full((len(gold), config.max_new_tokens), float("nan"))

    def tokens(self, logits: Float[Tensor, "batch vocab"], loop: BatchLoop, step: int) -> Int[Tensor, "batch"]:
        # Rows past their gold continuation have stopped: what they are fed is never kept.
        return self.gold[:, step].to(logits.device)

    def observe(self, step: int, clean_logits: Float[Tensor, "batch vocab"],
                intervened_logits: Float[Tensor, "batch vocab"] | None, changed: Bool[Tensor, "batch"]) -> None:
        target = self.gold[:, step, None].to(clean_logits.device)
        clean = clean_logits.float().log_softmax(-1).gather(-1, target)[:, 0]
        second = clean
        if intervened_logits is not None:
            second = torch.where(changed.to(clean.device),
                                 intervened_logits.float().log_softmax(-1).gather(-1, target)[:, 0], clean)
        live = step < self.lengths
        self.clean_logprob[live, step] = clean.cpu()[live]
        self.intervened_logprob[live, step] = second.cpu()[live]

    def after_step(self, loop: BatchLoop, step: int) -> None:
        loop.done |= step + 1 >= self.lengths  # a row whose gold tokens ran out stops


def decode_jobs(model, jobs: list[tuple[Sample, Selector]], config: TraceConfig | None, *,
                policy: type[HeadIntervention], forced: type[HeadIntervention], gold: list[list[int]] | None = None,
                **protocol) -> tuple[list[Sample], TraceConfig, HeadIntervention, BatchLoop]:
    """Decode every ``(sample, selector)`` job as one left-padded batch under ``policy(model, selectors, config,
    **protocol)``, or, with ``gold`` (one token list per job), under the teacher-forced ``forced`` with each row
    fed its gold tokens until they run out, whatever ``config.max_new_tokens`` and ``config.stop_at_eos`` say.
    Jobs may share a sample: its prompt is prefilled once. Returns (samples, the config run, policy, loop)."""
    if not jobs:
        raise ValueError("No jobs to run.")
    config = config or TraceConfig()
    samples, selectors = [job[0] for job in jobs], [job[1] for job in jobs]
    if gold is None:
        chosen = policy(model, selectors, config, **protocol)
    else:
        if len(gold) != len(jobs):
            raise ValueError(f"{len(gold)} gold continuations for {len(jobs)} jobs.")
        if any(len(tokens) == 0 for tokens in gold):
            raise ValueError("A gold continuation is empty: teacher forcing needs at least one gold token per job.")
        config = replace(config, max_new_tokens=max(len(tokens) for tokens in gold), stop_at_eos=False)
        chosen = forced(model, selectors, config, gold, **protocol)
    loop, _ = decode(model, samples, config, chosen)
    return samples, config, chosen, loop


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
