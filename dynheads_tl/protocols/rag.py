"""Case study — dynamic in-context RAG guided by predicted retrieval heads (DRAGIN-style, Table 4).

The whole HotpotQA context stays in the prompt; *visibility* is controlled by attention masks on
``hook_attn_scores`` (never by rewriting the prompt):

- The context tokens are prefilled normally (causal attention among themselves), but every query
  after the context -- the question, the instruction and all generated text -- sees no context position
  unless it has been opened by a retrieval.
- **Trigger (RIND, as in DRAGIN).** After each generated sentence, every content-word token j of the
  sentence gets s_j = (mean over heads of the max over later query rows of last-layer attention to j)
  x (entropy of the distribution that produced j). Stopwords (scikit-learn's list) and non-alphabetic
  tokens score 0. If max_j s_j exceeds ``rind_threshold``, generation retracts to the start of that
  sentence and a retrieval runs.
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

Simplification of the in-context variant: keys and values of the question tokens are computed once,
without the context; opened windows are seen by the generated text only.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Callable, Literal

import pandas as pd
import torch
from jaxtyping import Bool, Float
from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS
from torch import Tensor

from dynheads_tl.engine.equations import eligible_positions, eq2_share, evidence_positions
from dynheads_tl.engine.hooks import pattern_hook_name, restrict_attention
from dynheads_tl.engine.models import fast_twin
from dynheads_tl.progress import progress
from dynheads_tl.tasks.common import Sample
from dynheads_tl.tasks.metrics import exact_match, token_f1
from dynheads_tl.engine.tracing import eos_token_ids

Strategy = Literal["dynamic", "oracle", "static", "dynamic_random", "fixed_random", "none", "full"]
STRATEGIES: tuple[str, ...] = ("dynamic", "oracle", "static", "dynamic_random", "fixed_random", "none", "full")

@dataclass
class RagConfig:
    """Knobs of the case study (defaults documented in the module docstring)."""

    n_heads: int = 5
    top_k_positions: int = 8
    cluster_gap: int = 8
    window: int = 24
    rind_threshold: float = 0.5
    max_retrievals: int = 2
    max_new_tokens: int = 16
    sink_tokens: int = 4
    local_window: int = 32
    seed: int = 0

    def __post_init__(self):
        for name in ("n_heads", "top_k_positions", "window", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}.")
        if self.cluster_gap < 0 or self.max_retrievals < 0 or self.rind_threshold < 0:
            raise ValueError("cluster_gap, max_retrievals and rind_threshold must be >= 0.")


# --- pieces with known answers (unit-tested) ------------------------------------------------------
def is_content_word(text: str) -> bool:
    word = text.strip().lower()
    return word.isalpha() and word not in ENGLISH_STOP_WORDS


def rind_scores(attention: Float[Tensor, "head query key"], entropies: Float[Tensor, "key"],
                content: Bool[Tensor, "key"]) -> Float[Tensor, "key"]:
    """DRAGIN's RIND for the tokens of one new segment.

    ``attention[h, i, j]``: last-layer attention of segment row i to segment token j (causal: zero for
    j > i). s_j = mean_h max_{i > j} attention[h, i, j] x entropy_j, zero for non-content tokens.
    The last token has no later row and scores 0.
    """
    n = attention.shape[-1]
    later = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1).T  # [query i, key j]: i > j
    masked = attention.masked_fill(~later, 0.0)
    influence = masked.max(dim=1).values.mean(0)  # max over query rows, mean over heads -> [key]
    return influence * entropies * content.float()


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
        self.generator = torch.Generator().manual_seed(self.config.seed * 1_000_003 + sample_seed)
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


def rag_generate(model, sample: Sample, selector: HeadSelector, config: RagConfig, *, sample_seed: int = 0) -> RagResult:
    """One HotpotQA answer under the in-context dynamic-RAG protocol (module docstring)."""
    from transformers import DynamicCache

    strategy = selector.strategy
    selector.new_sample(sample_seed)
    device = next(model.parameters()).device
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    prompt = torch.tensor(sample.prompt_ids, device=device)
    P = len(prompt)
    c0, c1 = sample.context_span
    total = P + config.max_new_tokens + 1
    visible = torch.ones(total, dtype=torch.bool, device=device)
    if strategy != "full":
        visible[c0:c1] = False
    evidence = evidence_positions(sample.evidence_spans, total, device)

    holder = {"allowed": visible, "rows": None, "hidden": None, "last_row": None}

    def capture(layer):
        def hook(pattern, hook):
            row = pattern[0, :, -1, :].float()
            if holder["rows"] is not None:
                holder["rows"][layer] = row
            if layer == n_layers - 1:
                holder["last_row"] = row.clone()
        return hook

    def hidden_hook(resid, hook):
        holder["hidden"] = resid[0, -1].float().cpu()

    hooks = restrict_attention(lambda state: holder["allowed"], n_layers=n_layers)
    hooks += [(pattern_hook_name(layer), capture(layer)) for layer in range(n_layers)]
    hooks.append(("ln_final.hook_out", hidden_hook))
    stop_ids = eos_token_ids(model)
    tokens: list[int] = []
    entropies: list[float] = []
    step_rows: list[Tensor] = []
    opened: list[tuple[int, int]] = []
    heads_used: list[list[tuple[int, int]]] = []
    retrievals = 0
    cache = DynamicCache()
    n_cached = 0

    def forward(ids: Tensor) -> Tensor:
        nonlocal cache, n_cached
        logits, cache = model(ids[None], return_type="logits_and_cache", past_key_values=cache)
        n_cached += ids.shape[0]
        return logits[0, -1]

    def rewind(n: int) -> None:
        nonlocal n_cached
        if n_cached > n:
            cache.crop(-(n_cached - n))
            n_cached = n

    def ids_at(position: int) -> int:
        return int(prompt[position]) if position < P else tokens[position - P]

    def retrieve(position: int) -> None:
        """Open the context windows that the chosen heads attend to from the query at ``position``."""
        nonlocal retrievals
        holder["allowed"] = torch.ones(total, dtype=torch.bool, device=device)
        holder["rows"] = [None] * n_layers
        rewind(position)
        forward(torch.tensor([ids_at(position)], device=device))
        rows = torch.stack(holder["rows"])  # [layer, head, key]
        holder["rows"], holder["allowed"] = None, visible
        rewind(position)
        key_len = rows.shape[-1]
        eligible = eligible_positions(torch.zeros(1, dtype=torch.long, device=device), key_len, key_len,
                                      config.sink_tokens, config.local_window)
        eq2 = eq2_share(rows.flatten(0, 1)[None], evidence[None, :key_len], eligible)[0].reshape(rows.shape[:2])
        chosen = selector(holder["hidden"], eq2.cpu())
        heads = [divmod(int(i), n_heads) for i in chosen]
        heads_used.append(heads)
        mean_row = torch.stack([rows[l, h] for l, h in heads]).mean(0)[c0:c1]
        top = torch.topk(mean_row, min(config.top_k_positions, c1 - c0)).indices + c0
        for s_, e_ in windows_from_positions(top.tolist(), cluster_gap=config.cluster_gap, window=config.window,
                                             lo=c0, hi=c1):
            visible[s_:e_] = True
            opened.append((s_, e_))
        retrievals += 1

    with torch.no_grad():
        # The context and everything before it: ordinary causal attention, prefilled by the fast twin.
        cache = fast_twin(model)(input_ids=prompt[None, :c1], past_key_values=cache, use_cache=True).past_key_values
        n_cached = c1
        with model.hooks(fwd_hooks=hooks):
            if P - 1 > c1:  # question and instruction: no context visible (unless strategy == "full")
                forward(prompt[c1:P - 1])
            segment_start = 0
            while len(tokens) < config.max_new_tokens:
                position = P - 1 + len(tokens)
                rewind(position)
                logits = forward(torch.tensor([ids_at(position)], device=device))
                probs = torch.softmax(logits.float(), -1)
                entropies.append(float(-(probs * probs.clamp_min(1e-30).log()).sum()))
                step_rows.append(holder["last_row"])
                token = int(logits.argmax())
                tokens.append(token)
                text = model.tokenizer.decode([token])
                finished = token in stop_ids or len(tokens) >= config.max_new_tokens
                if not (finished or text.rstrip().endswith((".", "!", "?")) or "\n" in text):
                    continue
                if strategy not in ("none", "full") and retrievals < config.max_retrievals:
                    segment = range(segment_start, len(tokens))
                    texts = [model.tokenizer.decode([t]) for t in tokens]
                    content = torch.tensor([is_content_word(texts[j]) and tokens[j] not in stop_ids for j in segment])
                    scores = rind_scores(segment_attention(step_rows, segment_start, len(tokens), P),
                                         torch.tensor([entropies[j] for j in segment]), content)
                    if len(scores) and float(scores.max()) > config.rind_threshold:
                        flagged = segment_start + int(scores.argmax())
                        cut = sentence_start(texts, flagged)
                        retrieve(P - 1 + cut)
                        del tokens[cut:], entropies[cut:], step_rows[cut:]
                        segment_start = cut
                        continue
                if token in stop_ids:
                    break
                segment_start = len(tokens)
    response = model.tokenizer.decode(tokens, skip_special_tokens=True)
    evidence_recall = float((visible[:P] & evidence[:P]).sum()) / max(int(evidence[:P].sum()), 1)
    return RagResult(response, strategy, retrievals, int(visible[c0:c1].sum()), opened, heads_used, evidence_recall)


def run_strategies(model, samples: list[Sample], strategies: list[str], config: RagConfig, *,
                   static_scores: Tensor | None = None, probe=None) -> pd.DataFrame:
    """Every strategy on every sample; one row per (sample, strategy)."""
    rows = []
    for strategy in strategies:
        selector = HeadSelector(strategy, model, config, static_scores=static_scores, probe=probe)
        for index, sample in enumerate(progress(samples, desc=f"RAG {strategy}")):
            result = rag_generate(model, sample, selector, config, sample_seed=index)
            gold = sample.answers[0]
            rows.append({"sample": index, "strategy": strategy, "em": exact_match(result.response, gold),
                         "f1": token_f1(result.response, gold), "retrievals": result.retrievals,
                         "visible_context_tokens": result.visible_context_tokens,
                         "context_tokens": sample.context_span[1] - sample.context_span[0],
                         "evidence_recall": result.evidence_recall, "response": result.response, "gold": gold})
    return pd.DataFrame(rows)
