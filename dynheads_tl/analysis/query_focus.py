"""Query-focused head scores in the style of QRHead (Zhang et al., EMNLP 2025, ``princeton-pli/QRHead``).

Intuition: Wu et al.'s score asks which heads *copy* the needle while the answer is generated; QRHead asks which
heads, reading the *query*, attend to the gold document, before any answer exists. For each head:

1. run the prompt once; average the attention rows of the query tokens (the query and every token after it) into one
   weight per context token;
2. run it again with the query replaced by a null query ("N/A"); the tokens before the query are the same, so the
   two weight vectors align position by position; their difference is the *calibrated* weight (it removes what a
   head attends to whatever is asked);
3. over the gold document's tokens, drop those whose calibrated weight lies below the mean minus two standard
   deviations (within the document) and sum the rest: the head's score on this sample;
4. the head's score is its mean over samples.

For NIAH the gold document is the needle span; the query is the question and the instruction and template tokens
after it. All layers and heads are computed at once (the hooks reduce each pattern to the query rows' mean before the
next layer runs). The real and the null prompt share every token before the query, so :func:`query_focused_scores`
prefills that context once with the SDPA twin
(:func:`~dynheads_tl.engine.decoder.prefill_context`), as the tracing loop prefills a prompt, and runs
only each prompt's query tokens through the hooked bridge, against the cached keys and values: the same rows as one
hooked pass over the whole prompt, to float rounding (3e-7 in fp32; ``prefix=None`` in :func:`query_attention` is
that whole pass, the reference). Hooks a caller attaches to the bridge therefore act on the query tokens only. This
module is the score only; claims 1, 2 and 6 read it.
"""
from __future__ import annotations

from typing import Sequence

import torch
from jaxtyping import Float
from torch import Tensor
from dynheads_tl.engine.decoder import prefill_context
from dynheads_tl.engine.sharing import cache_prefix, prefix_store
from dynheads_tl.engine.hooks import pattern_hook_name
from dynheads_tl.engine.models import model_identity
from dynheads_tl.progress import progress
from dynheads_tl.store import load_cached_json, save_cached_json
from dynheads_tl.tasks.common import prompt_digest

NULL_QUERY = "N/A"


def query_attention(model, prompt_ids: Sequence[int], query_start: int, *,
                    prefix=None) -> Float[Tensor, "layer head pos"]:
    """Every head's attention from the query tokens (positions ``query_start`` to the end), averaged over those
    rows, on every prompt position, from TransformerLens ``hook_pattern``.

    ``prefix``: the KV cache of ``prompt_ids[:query_start]`` (:func:`~dynheads_tl.engine.decoder.prefill_context`); only the query tokens run
    through the hooked bridge, against it (``prefix`` itself is left as it was). Without it, the whole prompt runs
    through the hooked bridge in one pass (the reference)."""

    n_layers = model.cfg.n_layers
    if not 0 < query_start < len(prompt_ids):
        raise ValueError(f"query_start must lie inside the prompt (1..{len(prompt_ids) - 1}), got {query_start}.")
    if prefix is not None and prefix.get_seq_length() != query_start:
        raise ValueError(f"The prefix cache holds {prefix.get_seq_length()} positions; the query starts at "
                         f"{query_start}.")
    rows: list[Tensor | None] = [None] * n_layers
    first_row = 0 if prefix is not None else query_start  # the pattern's rows are the tokens run

    def make(layer: int):
        def hook(pattern: Float[Tensor, "batch head query key"], hook):
            rows[layer] = pattern[0, :, first_row:, :].float().mean(1).cpu()
        return hook

    run = list(prompt_ids) if prefix is None else list(prompt_ids)[query_start:]
    ids = torch.tensor([run], device=model.cfg.device)
    extra = {} if prefix is None else {"past_key_values": cache_prefix(prefix)}
    with torch.no_grad():
        model.run_with_hooks(ids, fwd_hooks=[(pattern_hook_name(layer), make(layer)) for layer in range(n_layers)],
                             return_type=None, **extra)
    out = torch.stack(rows)
    if out.shape[-1] != len(prompt_ids):
        raise RuntimeError(f"The attention rows cover {out.shape[-1]} positions for a prompt of {len(prompt_ids)}.")
    return out


def calibrated_document_score(real: Float[Tensor, "layer head pos"], null: Float[Tensor, "layer head pos"],
                              spans: Sequence[tuple[int, int]]) -> Float[Tensor, "layer head"]:
    """Steps 2-3: (real - null) on each gold span's tokens (half-open spans, positions shared by both prompts),
    tokens below mean - 2 sd (per head, within the span; sample sd) dropped, the rest summed, spans added."""
    total = torch.zeros(real.shape[:2], dtype=torch.float64)
    for start, end in spans:
        if not 0 <= start < end <= min(real.shape[-1], null.shape[-1]):
            raise ValueError(f"The gold span {(start, end)} does not lie inside the shared prompt prefix.")
        calibrated = (real[..., start:end] - null[..., start:end]).double()
        threshold = calibrated.mean(-1, keepdim=True) - 2 * calibrated.std(-1, keepdim=True).nan_to_num(0.0)
        total += (calibrated * (calibrated > threshold)).sum(-1)
    return total


def null_query_prompt(tokenizer, prompt_ids: Sequence[int], question: str,
                      null_query: str = NULL_QUERY) -> tuple[list[int], list[int], int]:
    """(real ids, null ids, query start) for a prompt that contains ``question`` once after its context: the text is
    the decoded prompt, the null prompt replaces the question's last occurrence by ``null_query``, and the query
    starts at the first token of the question (which both prompts must share the ids before)."""
    text = tokenizer.decode(list(prompt_ids))
    at = text.rfind(question)
    if at < 0 or not question:
        raise ValueError("The question does not occur in the decoded prompt; the null query cannot replace it.")
    null_text = text[:at] + null_query + text[at + len(question):]
    real = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    null = tokenizer(null_text, add_special_tokens=False)["input_ids"]
    if list(real["input_ids"]) != list(prompt_ids):
        raise ValueError("The decoded prompt does not tokenize back to the same ids; the query span cannot be placed.")
    start = next(i for i, (s, e) in enumerate(real["offset_mapping"]) if e > at)
    if list(null[:start]) != list(prompt_ids[:start]):
        raise ValueError("The real and null prompts differ before the query; their context positions do not align.")
    return list(prompt_ids), list(null), start


def query_focused_scores(model, samples, null_query: str = NULL_QUERY, *, use_cache: bool = False,
                         desc: str = "query-focused scores") -> Float[Tensor, "sample layer head"]:
    """Per-sample query-focused scores (steps 1-3) of NIAH / HotpotQA ``samples`` (their evidence spans are the gold
    documents); the static score is their mean over samples (step 4). With ``use_cache``, each sample's scores are
    cached under its prompt digest, the null query and the model's name and fingerprint; cached samples are read
    first, and progress (``desc``) counts the samples computed (a 32k-token prompt's context prefill takes minutes)."""

    with prefix_store() as store:  # the samples' contexts share their prefixes (a NIAH haystack up to the needle)
        return _scores(model, samples, null_query, use_cache, store, desc)


def _scores(model, samples, null_query: str, use_cache: bool, store, desc: str) -> Float[Tensor, "sample layer head"]:
    keys = [{"kind": "query_focused", "version": 1, "prompt": prompt_digest(sample), "null_query": null_query,
             **model_identity(model)} for sample in samples]
    cached = [load_cached_json(key) if use_cache else None for key in keys]
    out: list = [None if found is None else torch.tensor(found, dtype=torch.float64) for found in cached]
    missing = [i for i, found in enumerate(out) if found is None]
    label = f"{desc} ({len(samples) - len(missing)} of {len(samples)} cached)" if use_cache else desc
    first: dict[str, int] = {}  # a prompt given twice is computed once (its key is the prompt's digest)
    repeats = {i: first.setdefault(keys[i]["prompt"], i) for i in missing}
    for i in progress(list(first.values()), desc=label):
        sample = samples[i]
        real_ids, null_ids, start = null_query_prompt(model.tokenizer, sample.prompt_ids, sample.question, null_query)
        context = prefill_context(model, real_ids[:start], store)  # both prompts share it (null_query_prompt checks)
        real = query_attention(model, real_ids, start, prefix=context)
        null = query_attention(model, null_ids, start, prefix=context)
        out[i] = calibrated_document_score(real, null, sample.evidence_spans)
        if use_cache:
            save_cached_json(keys[i], out[i].tolist())
    for i, computed in repeats.items():
        out[i] = out[computed]
    if not out:
        raise ValueError("query_focused_scores needs at least one sample.")
    return torch.stack(out)
