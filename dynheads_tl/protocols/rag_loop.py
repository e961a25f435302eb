"""The dynamic-RAG loop (:mod:`dynheads_tl.protocols.rag_protocol` describes the protocol) as a step policy of the
engine's one decoding loop: :class:`RagPolicy`, which decodes one question under one strategy or, for several
strategies, decodes their shared generation up to the first retrieval once and then forks (:func:`rag_generate_many`).

**Teacher forcing** (``gold=``, a token list): the same policy with the gold answer's tokens fed in place of the
argmax, a measure one early error cannot derail. Every decision of the protocol is taken along the gold tokens as it
is along generated ones: RIND scores each gold sentence (its attention rows and the model's entropies at the gold
positions) when it ends and when the gold runs out (as a generation's sentence is scored when it emits its end of
sequence); a firing runs the retrieval pass from the flagged sentence's start, the strategy's heads open their
windows there, and the gold is fed again from that start with them open. Each gold token's log-probability is the
one of its last feeding (:attr:`RagResult.token_logprobs`): a token before the retraction point keeps the one it
was fed with, as a generation keeps its text before that point. The gold tokens are
:func:`~dynheads_tl.protocols.stepwise.gold_token_ids` (the two-pass protocols' gold continuation); their
:class:`~dynheads_tl.protocols.stepwise.TeacherForcing` mixin does not apply here (it forces a clean pass and a
second pass per step; this loop has one pass per step and takes text back), so the forcing is this policy's own,
on the same loop.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from jaxtyping import Int
from torch import Tensor

from dynheads_tl.engine.equations import eligible_positions, eq2_share, evidence_positions
from dynheads_tl.engine.hooks import HookList, StepState, pattern_hook_name, restrict_attention
from dynheads_tl.engine.tracing import BatchLoop, StepPolicy, Trace, TraceConfig, build_trace, decode, eos_token_ids
from dynheads_tl.protocols.rag_protocol import (STRATEGIES, HeadSelector, RagConfig, RagResult, is_content_word,
                                                rind_scores, segment_attention, sentence_start,
                                                windows_from_positions, word_starts)
from dynheads_tl.tasks.common import Sample


@dataclass
class _Branch:
    """What one strategy's generation has decided so far: what its queries see, RIND's record of its sentences and
    its retrievals. Strategies that share their generation up to a first retrieval share one (the trunk) until then."""

    visible: Tensor  # [position]: what the generated text may see
    entropies: list[float] = field(default_factory=list)
    step_rows: list[Tensor] = field(default_factory=list)
    rind_values: list[float] = field(default_factory=list)  # each evaluated sentence's largest RIND value, in order
    logprobs: list[float] = field(default_factory=list)  # each kept token's log-probability (nats) when it was fed
    opened: list[tuple[int, int]] = field(default_factory=list)
    heads_used: list[list[tuple[int, int]]] = field(default_factory=list)
    retrievals: int = 0
    segment_start: int = 0

    def copy(self) -> "_Branch":
        return _Branch(self.visible.clone(), list(self.entropies), list(self.step_rows), list(self.rind_values),
                       list(self.logprobs), list(self.opened), [list(heads) for heads in self.heads_used],
                       self.retrievals, self.segment_start)


RETRIEVING: frozenset[str] = frozenset(STRATEGIES) - {"none", "full"}


class RagPolicy(StepPolicy):
    """The in-context dynamic-RAG protocol (module docstring) as a step policy of
    :func:`~dynheads_tl.engine.tracing.decode`, for one sample and one or more strategies.

    - The twin prefills up to the end of the context; the question and instruction run through the hooked
      bridge, where :func:`~dynheads_tl.engine.hooks.restrict_attention` keeps closed context invisible.
    - :meth:`choose`: one greedy forward; keeps the step's entropy and last-layer attention row for RIND.
    - :meth:`after_step`: at a sentence end, RIND; if it fires, one retrieval pass from the retraction
      point (full context visible, recorder paused), the chosen heads open windows, and the loop retracts
      to the start of the sentence (:meth:`~dynheads_tl.engine.tracing.BatchLoop.retract`).

    **Several strategies (``selectors``, one per distinct strategy, none of them ``full``)** see the same context,
    so they generate the same tokens, and RIND scores the same sentences, until the first retrieval fires: that
    trunk is decoded once. At the first firing the trunk forks: ``none`` (if asked) goes on from where the trunk
    stands; then the retrieval pass runs once (it is the same pass for every strategy: only the heads chosen from
    it differ) and each retrieving strategy in turn opens its own windows and retracts to the same sentence start,
    from the same cache. Each strategy therefore makes the forwards it would make alone, in the same order over the
    same cached prefix (the retrieval pass shared, not repeated), and gets the same answer bit for bit (tested).
    :attr:`results` holds each strategy's finished generation, in the order of ``selectors``.

    **Teacher-forced (``gold``)**: the gold tokens are fed instead of the argmax (module docstring); the run ends when
    they run out (``max_new_tokens`` and end-of-sequence tokens do not stop it), and the last gold token ends its
    sentence as an end of sequence would.
    """

    def __init__(self, model, sample: Sample, selectors: list[HeadSelector], config: RagConfig, *,
                 gold: list[int] | None = None):
        selectors = list(selectors)
        strategies = [selector.strategy for selector in selectors]
        if not selectors:
            raise ValueError("RagPolicy needs at least one strategy.")
        if len(set(strategies)) != len(strategies):
            raise ValueError(f"Each strategy may appear once in one generation, got {strategies}.")
        if len(selectors) > 1 and "full" in strategies:
            raise ValueError("The full strategy sees the context from the start, so it shares no generation with "
                             "another strategy: answer it alone.")
        for strategy in strategies:
            if config.rind_threshold is None and strategy in RETRIEVING:
                raise ValueError(f"RagConfig.rind_threshold is None: the {strategy!r} strategy retrieves when RIND "
                                 "exceeds it, so it needs a number (dynamic_rag.calibrate_rind calibrates one).")
        if gold is not None and len(gold) == 0:
            raise ValueError("Teacher forcing needs at least one gold token.")
        self.model, self.sample, self.selectors, self.config = model, sample, selectors, config
        self.strategies = strategies
        self.gold = None if gold is None else [int(token) for token in gold]
        # steps at most: the gold's length when teacher-forced, else the generation's budget
        self.limit = config.max_new_tokens if gold is None else len(self.gold)
        self.device = next(model.parameters()).device
        self.n_layers, self.n_heads = model.cfg.n_layers, model.cfg.n_heads
        self.prompt = torch.as_tensor(sample.prompt_ids, device=self.device)
        self.P = len(self.prompt)
        self.c0, self.c1 = sample.context_span
        self.total = self.P + self.limit + 1
        visible = torch.ones(self.total, dtype=torch.bool, device=self.device)
        if strategies != ["full"]:
            visible[self.c0:self.c1] = False
        self.evidence = evidence_positions(sample.evidence_spans, self.total, self.device)
        self.stop_ids = eos_token_ids(model)
        self.rows: list[Tensor | None] | None = None  # every layer's row, during a retrieval pass only
        self.last_row: Tensor | None = None
        self.hidden: Tensor | None = None
        self.branch = _Branch(visible)  # the trunk until the fork, then the strategy being decoded
        self.allowed = visible  # what the queries see now (everything during a retrieval pass)
        self.current: int | None = None if len(selectors) > 1 else 0  # the strategy decoded (None: the shared trunk)
        self.fork: tuple[list[int], int, _Branch] | None = None  # the trunk's tokens, the cut, its state
        self.waiting: list[int] = []  # strategies still to decode after the fork
        self.retrieval: tuple[Tensor, Tensor, Tensor] | None = None  # the fork's retrieval pass (rows, Eq. 2, hidden)
        self.results: list[tuple[list[int], Trace, _Branch] | None] = [None] * len(selectors)
        self.trace_config = TraceConfig(max_new_tokens=self.limit, sink_tokens=config.sink_tokens,
                                        local_window=config.local_window, stop_at_eos=gold is None)
        self.recorded: dict[str, Tensor] = {}
        self.state: StepState | None = None

    # --- what the strategy being decoded is -------------------------------------------------------------------
    @property
    def strategy(self) -> str:
        """The strategy decoded now; ``"trunk"`` while several still share their generation."""
        return "trunk" if self.current is None else self.strategies[self.current]

    @property
    def retrieves(self) -> bool:
        return (any(s in RETRIEVING for s in self.strategies) if self.current is None
                else self.strategies[self.current] in RETRIEVING)

    # --- the step policy ----------------------------------------------------------------------------------------
    def hooks(self, state: StepState) -> HookList:
        self.state = state
        last = self.n_layers - 1

        def capture(layer: int):
            def hook(pattern, hook):
                row = pattern[0, :, -1, :].float()
                if self.rows is not None:
                    self.rows[layer] = row
                if layer == last:
                    self.last_row = row.clone()
            return hook

        def hidden_hook(resid, hook):
            self.hidden = resid[0, -1].float().cpu()

        hooks = restrict_attention(lambda _: self.allowed, n_layers=self.n_layers)
        hooks += [(pattern_hook_name(layer), capture(layer)) for layer in range(self.n_layers)]
        hooks.append(("ln_final.hook_out", hidden_hook))
        return hooks

    def fast_until(self, samples: list[Sample]) -> list[int | None]:
        if len(samples) != 1:
            raise ValueError("The RAG loop runs one sample at a time.")
        return [self.c1]

    def choose(self, loop: BatchLoop, step: int) -> Int[Tensor, "batch"]:
        logits = loop.decoder.step(loop.next_input)[0]
        probs = torch.softmax(logits.float(), -1)
        self.branch.entropies.append(float(-(probs * probs.clamp_min(1e-30).log()).sum()))
        self.branch.step_rows.append(self.last_row)
        chosen = (logits.argmax(-1).reshape(1) if self.gold is None
                  else torch.tensor([self.gold[step]], device=logits.device))
        self.branch.logprobs.append(float(torch.log_softmax(logits.float(), -1)[chosen[0]]))
        return chosen

    def _finished(self, tokens: list[int]) -> bool:
        """Whether the generation is over: an end-of-sequence token or the step budget; teacher-forced, the gold
        tokens all fed."""
        if self.gold is not None:
            return len(tokens) >= self.limit
        return tokens[-1] in self.stop_ids or len(tokens) >= self.limit

    def after_step(self, loop: BatchLoop, step: int) -> None:
        tokens, config, branch = loop.tokens[0], self.config, self.branch
        token = tokens[-1]
        text = self.model.tokenizer.decode([token])
        finished = self._finished(tokens)
        if not (finished or text.rstrip().endswith((".", "!", "?")) or "\n" in text):
            return
        segment = range(branch.segment_start, len(tokens))
        if self.strategy != "full" and len(segment):
            texts = [self.model.tokenizer.decode([t]) for t in tokens]
            # the sentence's words: end-of-sequence and whitespace-only tokens are no part of any word (DRAGIN
            # scores the generated text, which holds neither)
            kept = [j for j in segment if tokens[j] not in self.stop_ids and texts[j].strip()]
            starts = word_starts([texts[j] for j in kept])
            first = torch.nonzero(starts).flatten().tolist()
            words = ["".join(texts[kept[j]] for j in range(a, b)) for a, b in zip(first, first[1:] + [len(kept)])]
            content = torch.tensor([is_content_word(word) for word in words], dtype=torch.bool)
            local = [j - branch.segment_start for j in kept]
            attention = segment_attention(branch.step_rows, branch.segment_start, len(tokens), self.P)[:, local][:, :, local]
            scores = (rind_scores(attention, torch.tensor([branch.entropies[j] for j in kept]), starts, content)
                      if kept else torch.zeros(0))
            branch.rind_values.append(float(scores.max()) if len(scores) else 0.0)
            if (self.retrieves and branch.retrievals < config.max_retrievals and len(scores)
                    and float(scores.max()) > config.rind_threshold):
                cut = sentence_start(texts, kept[first[int(scores.argmax())]])
                if self.current is None:
                    self._fork(loop, list(tokens), cut)
                else:
                    self._open(branch, self.current, *self._retrieval_pass(loop, self.P - 1 + cut, tokens))
                    self._retract(loop, branch, cut)
                return
        branch.segment_start = len(tokens)
        if finished:
            self._finish(loop)

    # --- retrieval, retraction and the fork ---------------------------------------------------------------------
    def _retrieval_pass(self, loop: BatchLoop, position: int, tokens: list[int]) -> tuple[Tensor, Tensor, Tensor]:
        """Every layer's attention row of the query at ``position`` with the full context visible (recorder paused),
        its Eq. 2 scores [layer, head] and its final-norm hidden state; the cache is rewound to ``position`` after."""
        decoder, config = loop.decoder, self.config
        token_in = int(self.prompt[position]) if position < self.P else tokens[position - self.P]
        was_active, self.state.active = self.state.active, False  # the recorder keeps the generation's own steps
        self.allowed = torch.ones(self.total, dtype=torch.bool, device=self.device)
        self.rows = [None] * self.n_layers
        try:
            decoder.rewind(position)
            decoder.step(torch.tensor([token_in], device=self.device))
            rows = torch.stack(self.rows)  # [layer, head, key]
        finally:
            self.rows, self.allowed = None, self.branch.visible
            self.state.active = was_active
        decoder.rewind(position)
        key_len = rows.shape[-1]
        eligible = eligible_positions(torch.zeros(1, dtype=torch.long, device=self.device), key_len, key_len,
                                      config.sink_tokens, config.local_window)
        eq2 = eq2_share(rows.flatten(0, 1)[None], self.evidence[None, :key_len], eligible)[0].reshape(rows.shape[:2])
        return rows, eq2, self.hidden

    def _open(self, branch: _Branch, index: int, rows: Tensor, eq2: Tensor, hidden: Tensor) -> None:
        """Strategy ``index`` chooses its heads from a retrieval pass and opens the context windows they attend to."""
        config = self.config
        chosen = self.selectors[index](hidden, eq2.cpu())
        heads = [divmod(int(i), self.n_heads) for i in chosen]
        branch.heads_used.append(heads)
        c0, c1 = self.c0, self.c1
        mean_row = torch.stack([rows[l, h] for l, h in heads]).mean(0)[c0:c1]
        top = torch.topk(mean_row, min(config.top_k_positions, c1 - c0)).indices + c0
        for start, end in windows_from_positions(top.tolist(), cluster_gap=config.cluster_gap, window=config.window,
                                                 lo=c0, hi=c1):
            branch.visible[start:end] = True
            branch.opened.append((start, end))
        branch.retrievals += 1

    def _retract(self, loop: BatchLoop, branch: _Branch, cut: int) -> None:
        """Take back the generation from token ``cut`` on; ``branch`` resumes there."""
        loop.retract(cut)
        del branch.entropies[cut:], branch.step_rows[cut:], branch.logprobs[cut:]
        branch.segment_start = cut

    def _fork(self, loop: BatchLoop, tokens: list[int], cut: int) -> None:
        """The trunk's first retrieval fired: each strategy goes its own way from here, ``none`` first (it continues
        the trunk, whose keys and values the retrieval pass would overwrite at the retraction point)."""
        self.fork = (tokens, cut, self.branch)
        self.waiting = sorted(range(len(self.strategies)), key=lambda i: self.strategies[i] != "none")
        self._next(loop)

    def _next(self, loop: BatchLoop) -> None:
        """Start the next waiting strategy from the fork."""
        tokens, cut, trunk = self.fork
        self.current = self.waiting.pop(0)
        self.branch = branch = trunk.copy()
        self.allowed = branch.visible
        if self.strategies[self.current] not in RETRIEVING:  # goes on where the trunk stands (only right after it)
            branch.segment_start = len(tokens)
            if self._finished(tokens):
                self._finish(loop)
            return
        if self.retrieval is None:
            self.retrieval = self._retrieval_pass(loop, self.P - 1 + cut, tokens)
        self._open(branch, self.current, *self.retrieval)  # opens windows in branch.visible, what self.allowed is
        loop.tokens[0][:] = tokens  # the strategy before it generated its own; retract from the trunk's
        self._retract(loop, branch, cut)

    def _finish(self, loop: BatchLoop) -> None:
        """The strategy decoded now is done (without a fork: every strategy, as they never parted)."""
        tokens = list(loop.tokens[0])
        done = range(len(self.strategies)) if self.current is None else [self.current]
        for index in done:
            trace = build_trace(self.model, self.sample, self.trace_config, tokens, self.recorded, protocol="rag",
                                strategy=self.strategies[index])
            self.results[index] = (tokens, trace, self.branch.copy())
        if self.waiting:
            self._next(loop)

    def buffers(self, recorded: dict[str, Tensor]) -> None:
        self.recorded = recorded


def rag_generate_many(model, sample: Sample, selectors: list[HeadSelector], config: RagConfig, *,
                      sample_seed: int = 0, gold: list[int] | None = None) -> list[RagResult]:
    """One HotpotQA answer per selector (distinct strategies; ``full`` only alone) under the in-context dynamic-RAG
    protocol (module docstring), their shared generation decoded once (:class:`RagPolicy`): the same results as
    :func:`rag_generate` per selector. Each result carries its generation's
    :class:`~dynheads_tl.engine.tracing.Trace` (Eq. 1 / Eq. 2 per kept step, as the heads saw the context under
    the protocol's masks) and each kept token's log-probability. With ``gold`` (token ids), every strategy is
    teacher-forced on them (module docstring): its ``token_logprobs`` are the gold tokens' log-probabilities."""
    for selector in selectors:
        selector.new_sample(sample_seed)
    policy = RagPolicy(model, sample, selectors, config, gold=gold)
    decode(model, [sample], policy.trace_config, policy)
    if any(result is None for result in policy.results):  # every path through the loop ends in RagPolicy._finish
        raise RuntimeError(f"The RAG loop stopped before answering {policy.strategies}.")
    out = []
    for strategy, (tokens, trace, branch) in zip(policy.strategies, policy.results):
        P, visible, evidence = policy.P, branch.visible, policy.evidence
        evidence_recall = float((visible[:P] & evidence[:P]).sum()) / max(int(evidence[:P].sum()), 1)
        out.append(RagResult(trace.response, strategy, branch.retrievals, int(visible[policy.c0:policy.c1].sum()),
                             branch.opened, branch.heads_used, evidence_recall, trace, branch.rind_values,
                             branch.logprobs))
    return out


def rag_generate(model, sample: Sample, selector: HeadSelector, config: RagConfig, *, sample_seed: int = 0,
                 gold: list[int] | None = None) -> RagResult:
    """One HotpotQA answer under the in-context dynamic-RAG protocol (module docstring): :class:`RagPolicy`
    on the one decoding loop (:func:`rag_generate_many` with one selector); with ``gold``, teacher-forced."""
    return rag_generate_many(model, sample, [selector], config, sample_seed=sample_seed, gold=gold)[0]
