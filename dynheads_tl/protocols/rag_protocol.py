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

The loop is :class:`~dynheads_tl.protocols.rag_loop.RagPolicy` on the engine's one decoding loop
(:func:`~dynheads_tl.engine.tracing.decode`), so every answer also comes with its :class:`Trace`.

Simplification of the in-context variant: keys and values of the question tokens are computed once,
without the context; opened windows are seen by the generated text only.
"""
from __future__ import annotations

import string
from dataclasses import dataclass, field
from typing import Callable, Literal, get_args

import torch
from jaxtyping import Bool, Float
from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS
from torch import Tensor

from dynheads_tl.config import Eq2Settings
from dynheads_tl.engine.tracing import Trace
from dynheads_tl.params import Part, compose, integer, optional, param
from dynheads_tl.tasks.common import WIDE_STRIDE, mix_seed

Strategy = Literal["dynamic", "oracle", "static", "dynamic_random", "fixed_random", "none", "full"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)  # the names, in Table 4's order, from the one declaration above

def _rind_threshold(name: str, value) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
        raise ValueError(f"Parameter {name!r} must be a number >= 0 (or None: calibrated), got {value!r}.")


@compose(Eq2Settings)
class RagConfig(Part):
    """Knobs of the case study (defaults documented in the module docstring)."""

    n_heads: int = param(5, "heads whose attention drives a retrieval", integer())
    top_k_positions: int = param(4, "context positions taken from the averaged attention", integer())
    cluster_gap: int = param(8, "positions closer than this join one cluster", integer(0))
    window: int = param(12, "tokens opened around each cluster (the headroom contexts hold about 60 tokens)", integer())
    # None: the study calibrates it (dynamic_rag.calibrate_rind); a strategy that retrieves needs a number (1.0 is
    # the value of a word with its sentence's average attention and 1 nat of entropy).
    rind_threshold: float | None = param(None, "RIND value above which a retrieval fires; None: calibrated on the "
                                               "RIND split", optional(_rind_threshold))
    max_retrievals: int = param(1, "retrievals per answer at most", integer(0))
    max_new_tokens: int = param(24, "decoding steps (room for a short answer after a retraction)", integer())
    seed: int = param(0, "seeds evaluation questions and random heads", integer(0))


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
    # each kept token's log-probability (nats) when it was last fed: the generated tokens', or teacher-forced
    # (rag_generate(..., gold=...)) the gold tokens'
    token_logprobs: list[float] = field(default_factory=list)


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
