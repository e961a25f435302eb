"""Case study — dynamic in-context RAG guided by predicted retrieval heads (DRAGIN-style, Table 4).

The whole HotpotQA context stays in the prompt; *visibility* is controlled by attention masks on
``hook_attn_scores`` (never by rewriting the prompt):

- The context tokens are prefilled normally (causal attention among themselves), but every query
  after the context -- the question, the instruction and all generated text -- sees no context position
  unless it has been opened by a retrieval.
- **Trigger (RIND, as DRAGIN publishes it; :func:`rind_scores`).** After each generated sentence, each token's
  influence is the maximum over the sentence's query rows of its last-layer attention, averaged over heads;
  tokens merge into words (summed attention, mean entropy); the words' attention is normalised to sum 1 over
  the sentence; a word's value is normalised attention x entropy x the sentence's word count. Stopwords
  (scikit-learn's list), numbers and punctuation score 0. If some word's value exceeds ``rind_threshold``,
  generation retracts to the start of that sentence and a retrieval runs. Every evaluated sentence's largest
  value is kept (``RagResult.rind_values``), which is what the study calibrates the threshold on
  (:func:`calibrate_rind_threshold`). Differences from DRAGIN, which scores a whole generated chunk after
  re-running it alone: (1) its maximum runs over every query row of the chunk (here: the sentence's rows, since
  the decision is taken when the sentence ends); (2) a sentence's last token gets its own row there (here it has
  none yet; it is usually the full stop, which scores 0 anyway); (3) DRAGIN's optional word filter keeps the
  words spaCy tags NOUN, ADJ, VERB, PROPN or NUM, while this one drops stopwords, numbers and words with inner
  punctuation ("Jean-Luc"). The rows here are the generation's own, with the question and instruction in view;
  end-of-sequence and whitespace-only tokens are left out of the sentence's words.
- **Retrieval.** One extra pass of the retraction point's query row with the full context visible gives
  every head's attention over the context and the final-norm hidden state. A strategy picks 5 heads;
  their attention rows are averaged, the top-k context positions taken, positions closer than
  ``cluster_gap`` merged into clusters, a window of ``window`` tokens centred on each cluster opened, and
  the windows merged into the visible mask. Generation then resumes from the retraction point.

Strategies: ``dynamic`` (a probe predicts each head's Eq. 2 score from the hidden state; top 5),
``oracle`` (the 5 heads with the highest actual Eq. 2 score on the supporting facts in the retrieval
pass -- the ceiling the probe aims for), ``static`` (the calibration split's top-5 Eq. 2 heads),
``dynamic_random`` (5 random heads per retrieval), ``fixed_random`` (5 random heads per sample),
``none`` (w/o RAG: context never visible) and ``full`` (no masking at all: the upper bound).

The loop is :class:`RagPolicy` on the engine's one decoding loop
(:func:`~dynheads_tl.engine.tracing.decode`), so every answer also comes with its :class:`Trace`.

Simplification of the in-context variant: keys and values of the question tokens are computed once,
without the context; opened windows are seen by the generated text only.
"""
from __future__ import annotations

import string
from dataclasses import dataclass, field, fields
from typing import Callable, Literal

import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS
from torch import Tensor

from dynheads_tl.config import Eq2Settings, chain_post_init, check_ints
from dynheads_tl.engine.equations import eligible_positions, eq2_share, evidence_positions
from dynheads_tl.engine.hooks import HookList, StepState, pattern_hook_name, restrict_attention
from dynheads_tl.engine.tracing import BatchLoop, StepPolicy, Trace, TraceConfig, build_trace, decode, eos_token_ids
from dynheads_tl.executors import compute_missing
from dynheads_tl.tasks.common import Sample
from dynheads_tl.tasks.metrics import exact_match, token_f1
from dynheads_tl.tasks.common import WIDE_STRIDE, mix_seed

Strategy = Literal["dynamic", "oracle", "static", "dynamic_random", "fixed_random", "none", "full"]
STRATEGIES: tuple[str, ...] = ("dynamic", "oracle", "static", "dynamic_random", "fixed_random", "none", "full")

@dataclass
class RagConfig(Eq2Settings):
    """Knobs of the case study (defaults documented in the module docstring)."""

    n_heads: int = 5
    top_k_positions: int = 4
    cluster_gap: int = 8
    window: int = 12
    # None: the study calibrates it (dynamic_rag.calibrate_rind); a strategy that retrieves needs a number (1.0 is
    # the value of a word with its sentence's average attention and 1 nat of entropy).
    rind_threshold: float | None = None
    max_retrievals: int = 1
    max_new_tokens: int = 24
    seed: int = 0

    def __post_init__(self):
        check_ints(self, ("n_heads", "top_k_positions", "window", "max_new_tokens"))
        check_ints(self, ("cluster_gap", "max_retrievals", "seed"), minimum=0)
        if self.rind_threshold is not None and (not isinstance(self.rind_threshold, (int, float))
                                                or isinstance(self.rind_threshold, bool) or self.rind_threshold < 0):
            raise ValueError(f"Parameter 'rind_threshold' must be a number >= 0 (or None: calibrated), got {self.rind_threshold!r}.")
        chain_post_init(self, RagConfig)


# --- pieces with known answers (unit-tested) ------------------------------------------------------
def is_content_word(text: str) -> bool:
    """A word that RIND may flag: alphabetic once surrounding punctuation is stripped, and not in scikit-learn's
    English stopword list."""
    word = text.strip().strip(string.punctuation).lower()
    return word.isalpha() and word not in ENGLISH_STOP_WORDS


def word_starts(texts: list[str]) -> Bool[Tensor, "token"]:
    """Which tokens begin a word, as DRAGIN merges tokens: the first token, and every token whose text begins
    with whitespace (its space marker) or follows a newline."""
    starts = [i == 0 or text[:1].isspace() or texts[i - 1].endswith("\n") for i, text in enumerate(texts)]
    return torch.tensor(starts, dtype=torch.bool)


def rind_scores(attention: Float[Tensor, "head query key"], entropies: Float[Tensor, "key"],
                starts: Bool[Tensor, "key"], content: Bool[Tensor, "word"]) -> Float[Tensor, "word"]:
    """DRAGIN's RIND (Su et al. 2024, ``AttnWeightRAG``) for the words of one generated sentence.

    - ``attention[h, q, j]``: last-layer attention of the sentence's query token q to its token j (zero where q
      cannot see j). Each token's influence is the maximum over query rows, averaged over heads.
    - Tokens merge into words at ``starts`` (:func:`word_starts`): a word's attention is the sum over its tokens,
      its entropy the mean of their ``entropies``.
    - The words' attention is normalised to sum 1 over the sentence, and each word's value is
      normalised attention x entropy x the number of words in the sentence.
    - Words that are not ``content`` (stopwords, punctuation, numbers: :func:`is_content_word`) score 0.

    A retrieval fires when some word's value exceeds the threshold. Returns one value per word.
    """
    influence = attention.max(dim=1).values.mean(0)  # [key]
    word_of = torch.cumsum(starts.long(), 0) - 1
    n_words = int(word_of[-1]) + 1 if len(word_of) else 0
    if len(content) != n_words:
        raise ValueError(f"{len(content)} content flags for {n_words} words.")
    attn = torch.zeros(n_words).index_add_(0, word_of, influence.float())
    entropy = torch.zeros(n_words).index_add_(0, word_of, entropies.float())
    entropy = entropy / torch.bincount(word_of, minlength=n_words).clamp_min(1)
    total = attn.sum()
    normalised = attn / total if float(total) > 0 else attn
    return normalised * entropy * n_words * content.float()


def calibrate_rind_threshold(scores: list[float], wrong: list[bool]) -> float:
    """The RIND threshold that best separates answers that need retrieval from those that do not.

    ``scores``: each calibration answer's largest RIND value, generated without retrieval (the context hidden,
    as every strategy generates before its first retrieval); ``wrong``: whether that answer is wrong. The
    threshold maximises Youden's J (firing rate on wrong answers minus firing rate on right ones) over the
    midpoints between observed scores; among equal J the highest threshold (fewest retrievals) wins. With no
    right answer, J is the firing rate on wrong answers, so the threshold fires on all of them."""
    if len(scores) != len(wrong) or not scores:
        raise ValueError(f"calibrate_rind_threshold needs one label per score and at least one, got "
                         f"{len(scores)} scores and {len(wrong)} labels.")
    values = sorted(set(float(v) for v in scores))
    candidates = [values[0] / 2] + [(a + b) / 2 for a, b in zip(values, values[1:])] + [values[-1] + 1.0]
    n_wrong, n_right = sum(wrong), len(wrong) - sum(wrong)
    best, best_j = candidates[-1], -float("inf")
    for threshold in candidates:
        fire_wrong = sum(v > threshold for v, w in zip(scores, wrong) if w) / max(n_wrong, 1)
        fire_right = sum(v > threshold for v, w in zip(scores, wrong) if not w) / n_right if n_right else 0.0
        j = fire_wrong - fire_right
        if j >= best_j - 1e-12:
            best, best_j = threshold, j
    return float(best)


def windows_from_positions(positions: list[int], *, cluster_gap: int, window: int, lo: int, hi: int) -> list[tuple[int, int]]:
    """Cluster sorted positions (gap <= ``cluster_gap`` joins), centre a ``window``-token span on each
    cluster, clip to [lo, hi) and merge overlaps. Returns half-open spans."""
    if not positions:
        return []
    positions = sorted(positions)
    clusters = [[positions[0]]]
    for p in positions[1:]:
        if p - clusters[-1][-1] <= cluster_gap:
            clusters[-1].append(p)
        else:
            clusters.append([p])
    spans = []
    for cluster in clusters:
        centre = (cluster[0] + cluster[-1]) // 2
        start = max(lo, min(cluster[0], centre - window // 2))
        end = min(hi, max(cluster[-1] + 1, start + window))
        spans.append((start, end))
    merged = [spans[0]]
    for start, end in spans[1:]:
        if start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def sentence_start(texts: list[str], index: int) -> int:
    """Index of the first token of the sentence containing token ``index``."""
    for i in range(index - 1, -1, -1):
        if texts[i].rstrip().endswith((".", "!", "?")) or "\n" in texts[i]:
            return i + 1
    return 0


# --- the generation loop --------------------------------------------------------------------------
@dataclass
class RagResult:
    response: str
    strategy: str
    retrievals: int
    visible_context_tokens: int
    opened: list[tuple[int, int]] = field(default_factory=list)
    heads_used: list[list[tuple[int, int]]] = field(default_factory=list)
    evidence_recall: float = 0.0  # share of supporting-fact tokens made visible
    trace: Trace | None = None  # the generation as the loop recorded it
    rind_values: list[float] = field(default_factory=list)  # each evaluated sentence's largest RIND value


class HeadSelector:
    """Picks the heads whose attention drives a retrieval, per strategy."""

    def __init__(self, strategy: Strategy, model, config: RagConfig, *, static_scores: Tensor | None = None,
                 probe: Callable[[Tensor], Tensor] | None = None):
        if strategy not in STRATEGIES:
            raise ValueError(f"Unknown strategy {strategy!r}; strategies are {list(STRATEGIES)}.")
        if strategy == "static" and static_scores is None:
            raise ValueError("The static strategy needs static_scores [layer, head].")
        if strategy == "dynamic" and probe is None:
            raise ValueError("The dynamic strategy needs a probe (hidden state -> per-head scores).")
        self.strategy, self.config, self.probe = strategy, config, probe
        self.shape = (model.cfg.n_layers, model.cfg.n_heads)
        self.static_scores = static_scores
        self.generator = torch.Generator().manual_seed(config.seed)
        self.fixed: Tensor | None = None

    def new_sample(self, sample_seed: int) -> None:
        self.generator = torch.Generator().manual_seed(mix_seed(self.config.seed, sample_seed, WIDE_STRIDE))
        self.fixed = self._random()

    def _random(self) -> Tensor:
        return torch.randperm(self.shape[0] * self.shape[1], generator=self.generator)[: self.config.n_heads]

    def __call__(self, hidden: Tensor, eq2_scores: Tensor) -> Tensor:
        """Flat indices (layer * n_heads + head) of the chosen heads."""
        k = self.config.n_heads
        if self.strategy == "dynamic":
            return torch.topk(self.probe(hidden).flatten(), k).indices
        if self.strategy == "oracle":
            return torch.topk(eq2_scores.flatten(), k).indices
        if self.strategy == "static":
            return torch.topk(self.static_scores.flatten(), k).indices
        if self.strategy == "dynamic_random":
            return self._random()
        return self.fixed


def segment_attention(step_rows: list[Tensor], start: int, end: int, prompt_len: int) -> Tensor:
    """[head, query i, key j] last-layer attention among generated tokens start..end-1.

    ``step_rows[i]`` is the last-layer attention row of the step that generated token i (its query is
    the input at position prompt_len - 1 + i); token j sits at position prompt_len + j, so row i sees
    token j only for j < i.
    """
    n = end - start
    heads = step_rows[start].shape[0]
    out = torch.zeros(heads, n, n)
    for a, i in enumerate(range(start, end)):
        row = step_rows[i]
        for b, j in enumerate(range(start, i)):
            out[:, a, b] = row[:, prompt_len + j].cpu()
    return out


class RagPolicy(StepPolicy):
    """The in-context dynamic-RAG protocol (module docstring) as a step policy of
    :func:`~dynheads_tl.engine.tracing.decode`, for one sample.

    - The twin prefills up to the end of the context; the question and instruction run through the hooked
      bridge, where :func:`~dynheads_tl.engine.hooks.restrict_attention` keeps closed context invisible.
    - :meth:`choose`: one greedy forward; keeps the step's entropy and last-layer attention row for RIND.
    - :meth:`after_step`: at a sentence end, RIND; if it fires, one retrieval pass from the retraction
      point (full context visible, recorder paused), the chosen heads open windows, and the loop retracts
      to the start of the sentence (:meth:`~dynheads_tl.engine.tracing.BatchLoop.retract`).
    """

    def __init__(self, model, sample: Sample, selector: HeadSelector, config: RagConfig):
        if config.rind_threshold is None and selector.strategy not in ("none", "full"):
            raise ValueError(f"RagConfig.rind_threshold is None: the {selector.strategy!r} strategy retrieves when RIND "
                             "exceeds it, so it needs a number (dynamic_rag.calibrate_rind calibrates one).")
        self.model, self.sample, self.selector, self.config = model, sample, selector, config
        self.strategy = selector.strategy
        self.device = next(model.parameters()).device
        self.n_layers, self.n_heads = model.cfg.n_layers, model.cfg.n_heads
        self.prompt = torch.as_tensor(sample.prompt_ids, device=self.device)
        self.P = len(self.prompt)
        self.c0, self.c1 = sample.context_span
        self.total = self.P + config.max_new_tokens + 1
        self.visible = torch.ones(self.total, dtype=torch.bool, device=self.device)
        if self.strategy != "full":
            self.visible[self.c0:self.c1] = False
        self.allowed = self.visible  # what the queries see now (everything during a retrieval pass)
        self.evidence = evidence_positions(sample.evidence_spans, self.total, self.device)
        self.stop_ids = eos_token_ids(model)
        self.rows: list[Tensor | None] | None = None  # every layer's row, during a retrieval pass only
        self.last_row: Tensor | None = None
        self.hidden: Tensor | None = None
        self.entropies: list[float] = []
        self.step_rows: list[Tensor] = []
        self.opened: list[tuple[int, int]] = []
        self.heads_used: list[list[tuple[int, int]]] = []
        self.retrievals = 0
        self.rind_values: list[float] = []  # each evaluated sentence's largest RIND value, in order
        self.segment_start = 0
        self.state: StepState | None = None

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
        self.entropies.append(float(-(probs * probs.clamp_min(1e-30).log()).sum()))
        self.step_rows.append(self.last_row)
        return logits.argmax(-1).reshape(1)

    def after_step(self, loop: BatchLoop, step: int) -> None:
        tokens, config = loop.tokens[0], self.config
        token = tokens[-1]
        text = self.model.tokenizer.decode([token])
        finished = token in self.stop_ids or len(tokens) >= config.max_new_tokens
        if not (finished or text.rstrip().endswith((".", "!", "?")) or "\n" in text):
            return
        segment = range(self.segment_start, len(tokens))
        if self.strategy != "full" and len(segment):
            texts = [self.model.tokenizer.decode([t]) for t in tokens]
            # the sentence's words: end-of-sequence and whitespace-only tokens are no part of any word (DRAGIN
            # scores the generated text, which holds neither)
            kept = [j for j in segment if tokens[j] not in self.stop_ids and texts[j].strip()]
            starts = word_starts([texts[j] for j in kept])
            first = torch.nonzero(starts).flatten().tolist()
            words = ["".join(texts[kept[j]] for j in range(a, b)) for a, b in zip(first, first[1:] + [len(kept)])]
            content = torch.tensor([is_content_word(word) for word in words], dtype=torch.bool)
            local = [j - self.segment_start for j in kept]
            attention = segment_attention(self.step_rows, self.segment_start, len(tokens), self.P)[:, local][:, :, local]
            scores = (rind_scores(attention, torch.tensor([self.entropies[j] for j in kept]), starts, content)
                      if kept else torch.zeros(0))
            self.rind_values.append(float(scores.max()) if len(scores) else 0.0)
            if (self.strategy != "none" and self.retrievals < config.max_retrievals and len(scores)
                    and float(scores.max()) > config.rind_threshold):
                cut = sentence_start(texts, kept[first[int(scores.argmax())]])
                self.retrieve(loop, self.P - 1 + cut, tokens)
                loop.retract(cut)
                del self.entropies[cut:], self.step_rows[cut:]
                self.segment_start = cut
                return
        self.segment_start = len(tokens)

    def retrieve(self, loop: BatchLoop, position: int, tokens: list[int]) -> None:
        """Open the context windows that the chosen heads attend to from the query at ``position``."""
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
            self.rows, self.allowed = None, self.visible
            self.state.active = was_active
        decoder.rewind(position)
        key_len = rows.shape[-1]
        eligible = eligible_positions(torch.zeros(1, dtype=torch.long, device=self.device), key_len, key_len,
                                      config.sink_tokens, config.local_window)
        eq2 = eq2_share(rows.flatten(0, 1)[None], self.evidence[None, :key_len], eligible)[0].reshape(rows.shape[:2])
        chosen = self.selector(self.hidden, eq2.cpu())
        heads = [divmod(int(i), self.n_heads) for i in chosen]
        self.heads_used.append(heads)
        c0, c1 = self.c0, self.c1
        mean_row = torch.stack([rows[l, h] for l, h in heads]).mean(0)[c0:c1]
        top = torch.topk(mean_row, min(config.top_k_positions, c1 - c0)).indices + c0
        for start, end in windows_from_positions(top.tolist(), cluster_gap=config.cluster_gap, window=config.window,
                                                 lo=c0, hi=c1):
            self.visible[start:end] = True
            self.opened.append((start, end))
        self.retrievals += 1


def rag_generate(model, sample: Sample, selector: HeadSelector, config: RagConfig, *, sample_seed: int = 0) -> RagResult:
    """One HotpotQA answer under the in-context dynamic-RAG protocol (module docstring): :class:`RagPolicy`
    on the one decoding loop. The result carries the generation's :class:`~dynheads_tl.engine.tracing.Trace`
    (Eq. 1 / Eq. 2 per kept step, as the heads saw the context under the protocol's masks)."""
    selector.new_sample(sample_seed)
    policy = RagPolicy(model, sample, selector, config)
    trace_config = TraceConfig(max_new_tokens=config.max_new_tokens, sink_tokens=config.sink_tokens,
                               local_window=config.local_window, stop_at_eos=True)
    loop, buffers = decode(model, [sample], trace_config, policy)
    trace = build_trace(model, sample, trace_config, loop.tokens[0], buffers, protocol="rag", strategy=policy.strategy)
    P, visible, evidence = policy.P, policy.visible, policy.evidence
    evidence_recall = float((visible[:P] & evidence[:P]).sum()) / max(int(evidence[:P].sum()), 1)
    return RagResult(trace.response, policy.strategy, policy.retrievals, int(visible[policy.c0:policy.c1].sum()),
                     policy.opened, policy.heads_used, evidence_recall, trace, policy.rind_values)


def rag_units(model, units: list[tuple[str, int, Sample]], config: RagConfig, static_scores: Tensor | None = None,
              probe=None) -> list[dict]:
    """One batch of RAG units (the executors' ``compute``): each ``(strategy, sample index, sample)`` answered
    under the protocol, with a fresh selector seeded by the index (as :meth:`HeadSelector.new_sample` does for a
    reused one). Returns what the tables read from each :class:`RagResult` (not its trace)."""
    out = []
    for strategy, index, sample in units:
        selector = HeadSelector(strategy, model, config, static_scores=static_scores, probe=probe)
        result = rag_generate(model, sample, selector, config, sample_seed=index)
        out.append({"response": result.response, "retrievals": result.retrievals,
                    "visible_context_tokens": result.visible_context_tokens,
                    "evidence_recall": result.evidence_recall, "rind_values": list(result.rind_values)})
    return out


# Bump when the protocol's answers change for the same settings (a fix to RIND, the windows or the selector), so
# answers cached by an older version are never read back.
RAG_PROTOCOL_VERSION = 1


def answer_keys(model, units: list[tuple[str, int, Sample]], config: RagConfig, cache_key: dict,
                static_scores: Tensor | None = None) -> list[dict]:
    """The cache key of each unit's answer: ``cache_key`` (the caller's name for the run; it must name the probe,
    if there is one, under ``"probe"``) + the unit (strategy, index, prompt digest, context span) + every knob of
    the protocol and its version + the model (name and fingerprint). The static scores' digest enters only the
    static strategy's keys and the probe's name only the dynamic strategy's: no other strategy reads them."""
    from dataclasses import asdict

    from dynheads_tl.engine.models import model_fingerprint, model_name
    from dynheads_tl.store import tensor_digest
    from dynheads_tl.tasks.common import prompt_digest

    shared = {k: v for k, v in cache_key.items() if k != "probe"}
    base = {**shared, "unit": "rag_answer", "protocol_version": RAG_PROTOCOL_VERSION, "rag": asdict(config),
            "model": model_name(model), "model_fingerprint": model_fingerprint(model)}
    reads = {"static": {"static_scores": None if static_scores is None else tensor_digest(static_scores)},
             "dynamic": {"probe": cache_key.get("probe")}}
    return [{**base, **reads.get(strategy, {}), "strategy": strategy, "index": index, "prompt": prompt_digest(sample),
             "context_span": list(sample.context_span)} for strategy, index, sample in units]


def run_units(model, units: list[tuple[str, int, Sample]], config: RagConfig, *, static_scores: Tensor | None = None,
              probe=None, desc: str = "RAG answers", cache_key: dict | None = None) -> list[dict]:
    """:func:`rag_units` for every unit, one answer per batch, through the current executor; results in order.

    With ``cache_key`` (a dict naming the run, see :func:`answer_keys`), answers already cached are read back and
    the others cached as they come back, so a rerun only answers what is missing; a ``probe`` is an opaque
    callable, so the key must then name it under ``"probe"`` (e.g. a digest of its weights). Without
    ``cache_key`` every answer is computed."""
    from dynheads_tl.store import load_cached_json, save_cached_json

    if cache_key is not None and probe is not None and "probe" not in cache_key:
        raise ValueError("cache_key must name the probe under 'probe' (a digest of its weights): otherwise answers "
                         "of another probe would be read back.")
    keys = None if cache_key is None else answer_keys(model, units, config, cache_key, static_scores)
    results: list[dict | None] = [None] * len(units) if keys is None else [load_cached_json(key) for key in keys]
    # Question by question (every strategy of one question in a row), so each answer after the first copies the
    # question's prefill from the executor's prefix store (engine.decoder.shared_prefill) instead of redoing it.
    missing = sorted(([i] for i, result in enumerate(results) if result is None), key=lambda c: (units[c[0]][1], c[0]))
    for i, result in compute_missing(model, rag_units, missing, lambda i: units[i],
                                     args=(config, static_scores, probe), desc=desc):
        results[i] = result if keys is None else save_cached_json(keys[i], result)
    return results


def run_strategies(model, samples: list[Sample], strategies: list[str], config: RagConfig, *,
                   static_scores: Tensor | None = None, probe=None, cache_key: dict | None = None) -> pd.DataFrame:
    """Every strategy on every sample; one row per (sample, strategy). ``cache_key``: see :func:`run_units`."""
    for strategy in strategies:  # checks each strategy's inputs before any answer runs
        HeadSelector(strategy, model, config, static_scores=static_scores, probe=probe)
    units = [(strategy, index, sample) for strategy in strategies for index, sample in enumerate(samples)]
    results = run_units(model, units, config, static_scores=static_scores, probe=probe, cache_key=cache_key,
                        desc=f"RAG ({len(strategies)} strategies x {len(samples)} questions)")
    rows = []
    for (strategy, index, sample), result in zip(units, results):
        gold = sample.answers[0]
        rows.append({"sample": index, "strategy": strategy, "em": exact_match(result["response"], gold),
                     "f1": token_f1(result["response"], gold), "retrievals": result["retrievals"],
                     "visible_context_tokens": result["visible_context_tokens"],
                     "context_tokens": sample.context_span[1] - sample.context_span[0],
                     "evidence_recall": result["evidence_recall"], "response": result["response"], "gold": gold})
    return pd.DataFrame(rows)
