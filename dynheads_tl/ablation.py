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
with k the mean dynamic-set size of the calibration split. Progressive masking ranks every head at
step t (Eq. 1 hits first, then by attention share on the evidence) and masks the top k.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Literal

import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from .hooks import AblationMode, StepState, ablate_heads
from .tasks.common import Sample
from .tasks.metrics import exact_match, niah_accuracy, rouge_l, token_f1
from .tracing import (
    Decoder, Trace, TraceConfig, build_trace, eligible_positions, eos_token_ids, evidence_vector,
    new_buffers, reduction_hooks,
)

Condition = Literal["none", "dynamic", "static", "random", "progressive"]
CachePolicy = Literal["clean", "masked"]


@dataclass
class StepView:
    """What the clean pass of one step saw (the selector's input)."""

    step: int
    token: int
    argmax_pos: Int[Tensor, "layer head"]
    support_score: Float[Tensor, "layer head"]
    retrieval: Bool[Tensor, "layer head"]  # D_t


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

    @property
    def response(self) -> str:
        return self.masked.response


def eq1_at_step(argmax_pos: Int[Tensor, "layer head"], ids: Int[Tensor, "key"], evidence: Bool[Tensor, "key"],
                token: int) -> Bool[Tensor, "layer head"]:
    """Eq. 1 for one step: top-1 source inside the evidence span and holding the generated token."""
    return evidence[argmax_pos] & (ids[argmax_pos] == token)


def two_pass_generation(
    model,
    sample: Sample,
    select: Selector,
    config: TraceConfig | None = None,
    *,
    kind: Literal["eq1", "eq2"] = "eq1",
    threshold: float = 0.1,
    mode: AblationMode = "zero",
    mean_z: Float[Tensor, "layer head d_head"] | None = None,
    keep_cache: CachePolicy = "clean",
    condition: str = "custom",
    k: int | None = None,
) -> AblationTrace:
    """Greedy generation under the per-step two-pass protocol (module docstring)."""
    if keep_cache not in ("clean", "masked"):
        raise ValueError(f"keep_cache must be 'clean' or 'masked', got {keep_cache!r}.")
    if kind not in ("eq1", "eq2"):
        raise ValueError(f"kind must be 'eq1' or 'eq2', got {kind!r}.")
    config = config or TraceConfig()
    n_layers = model.cfg.n_layers
    prompt_len, max_steps = len(sample.prompt_ids), config.max_new_tokens
    total = prompt_len + max_steps
    device = next(model.parameters()).device
    clean_buffers, masked_buffers = new_buffers(model, max_steps), new_buffers(model, max_steps)
    active: dict[str, Tensor] = dict(clean_buffers)  # where the reduction hooks write now
    evidence = evidence_vector(sample, total, device)
    masks = {"evidence": evidence, "eligible": None}
    ablation = {"mask": None}
    state = StepState()
    hooks = reduction_hooks(state, active, masks, n_layers) + ablate_heads(
        lambda: ablation["mask"], n_layers=n_layers, mode=mode, mean_z=mean_z)
    stop_ids = eos_token_ids(model) if config.stop_at_eos else set()
    ids = torch.zeros(total, dtype=torch.long, device=device)
    ids[:prompt_len] = torch.as_tensor(sample.prompt_ids, device=device)
    kept, clean_tokens, applied = [], [], []

    state.active = False
    with model.hooks(fwd_hooks=hooks):
        decoder = Decoder(model, sample.prompt_ids, prefill=config.prefill)
        state.active = True
        next_input = None
        for step in range(max_steps):
            state.step, state.key_len = step, prompt_len + step
            masks["eligible"] = eligible_positions(total, state.key_len, config.sink_tokens, config.local_window, device)
            before = decoder.n_cached
            active.update(clean_buffers)
            ablation["mask"] = None
            clean_token = int(decoder.step(next_input).argmax())
            argmax_row, support_row = clean_buffers["argmax_pos"][step], clean_buffers["support_score"][step]
            retrieval = (eq1_at_step(argmax_row, ids, evidence, clean_token) if kind == "eq1"
                         else support_row > threshold)
            mask = select(StepView(step, clean_token, argmax_row, support_row, retrieval))
            if mask is None or not bool(mask.any()):
                token = clean_token
                for name in masked_buffers:
                    masked_buffers[name][step] = clean_buffers[name][step]
                mask = torch.zeros_like(retrieval)
            else:
                saved = decoder.last_position() if keep_cache == "clean" else None
                decoder.rewind(before)
                active.update(masked_buffers)
                ablation["mask"] = mask.to(device)
                token = int(decoder.step(next_input).argmax())
                ablation["mask"] = None
                if saved is not None:
                    decoder.replace_last_position(saved)
            clean_tokens.append(clean_token)
            kept.append(token)
            applied.append(mask.bool().cpu())
            ids[prompt_len + step] = token
            next_input = token
            if token in stop_ids:
                break
    extra = {"condition": condition, "k": k, "mode": mode, "keep_cache": keep_cache, "kind": kind,
             "threshold": threshold}
    clean = build_trace(model, sample, config, clean_tokens, clean_buffers, **extra, pass_="clean")
    masked = build_trace(model, sample, config, kept, masked_buffers, **extra, pass_="masked")
    return AblationTrace(clean, masked, torch.stack(applied), condition, k)


# --- selectors ---------------------------------------------------------------------------------
def select_dynamic(view: StepView) -> Tensor:
    return view.retrieval


def select_fixed(mask: Bool[Tensor, "layer head"]) -> Selector:
    return lambda view: mask


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
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(n_layers * n_heads, generator=generator)[:k]
    mask = torch.zeros(n_layers * n_heads, dtype=torch.bool)
    mask[order] = True
    return mask.reshape(n_layers, n_heads)


# --- metrics -------------------------------------------------------------------------------------
def answer_scores(trace: Trace) -> dict[str, float]:
    gold = trace.answers[0]
    if trace.task == "niah":
        return {"accuracy": niah_accuracy(trace.response, gold),
                "rouge_l": rouge_l(trace.response, trace.meta.get("needle_text", gold))}
    return {"f1": token_f1(trace.response, gold), "em": exact_match(trace.response, gold),
            "rouge_l": rouge_l(trace.response, gold)}


def compensation(result: AblationTrace, static_mask: Bool[Tensor, "layer head"], *, kind: str = "eq1",
                 threshold: float = 0.1) -> dict[str, object]:
    """E_t = H'_t minus H_t: heads active after masking that were not active in the clean pass.

    Returns m_s for this sample (max over masked steps of |E_t ∩ static top-20|) and the per-head
    counts of E over steps (for the compensation table). Only steps where something was masked count.
    """
    if kind == "eq1":
        before, after = result.clean.retrieval_mask, result.masked.retrieval_mask
    else:
        before, after = result.clean.support_score > threshold, result.masked.support_score > threshold
    masked_steps = result.masked_heads.flatten(1).any(1)
    newly = after & ~before & masked_steps[:, None, None]
    in_static = (newly & static_mask).flatten(1).sum(1)
    return {"m_s": int(in_static.max()) if len(in_static) else 0,
            "new_heads": newly.sum(0), "steps_masked": int(masked_steps.sum())}


# --- experiments ----------------------------------------------------------------------------------
@dataclass
class AblationSetup:
    """Everything the conditions share: static set, k, protocol knobs."""

    static_mask: Bool[Tensor, "layer head"]
    static_top20: Bool[Tensor, "layer head"]
    k: int
    kind: Literal["eq1", "eq2"] = "eq1"
    threshold: float = 0.1
    mode: AblationMode = "zero"
    keep_cache: CachePolicy = "clean"
    mean_z: Tensor | None = None
    seed: int = 0


def run_condition(model, sample: Sample, condition: Condition, setup: AblationSetup, config: TraceConfig,
                  *, sample_seed: int = 0, k: int | None = None) -> AblationTrace:
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    if condition == "none":
        select = lambda view: None
    elif condition == "dynamic":
        select = select_dynamic
    elif condition == "static":
        select = select_fixed(setup.static_mask)
    elif condition == "random":
        select = select_fixed(random_heads(n_layers, n_heads, setup.k, setup.seed * 1_000_003 + sample_seed))
    elif condition == "progressive":
        if k is None or k < 0:
            raise ValueError("Progressive masking needs k >= 0.")
        select = select_top_ranked(k)
    else:
        raise ValueError(f"Unknown condition {condition!r}; use none, dynamic, static, random or progressive.")
    return two_pass_generation(model, sample, select, config, kind=setup.kind, threshold=setup.threshold,
                               mode=setup.mode, mean_z=setup.mean_z, keep_cache=setup.keep_cache,
                               condition=condition, k=setup.k if condition in ("static", "random") else k)


def _setup_key(setup: AblationSetup) -> dict:
    mean_z = None if setup.mean_z is None else float(setup.mean_z.double().sum())
    return {"static": setup.static_mask.nonzero().tolist(), "top20": setup.static_top20.nonzero().tolist(),
            "k": setup.k, "kind": setup.kind, "threshold": setup.threshold, "mode": setup.mode,
            "keep_cache": setup.keep_cache, "seed": setup.seed, "mean_z": mean_z}


def _cached_run(model, sample, condition, setup, config, *, sample_seed, k=None, cache_key=None):
    """One condition on one sample -> (scores row, per-head counts of newly active heads), cached."""
    from .dynamism import prompt_digest
    from .models import model_name
    from .store import cached_json

    def compute():
        result = run_condition(model, sample, condition, setup, config, sample_seed=sample_seed, k=k)
        comp = compensation(result, setup.static_top20, kind=setup.kind, threshold=setup.threshold)
        row = {**answer_scores(result.masked), "m_s": comp["m_s"], "response": result.response,
               "heads_masked_per_step": float(result.masked_heads.flatten(1).sum(1).float().mean())}
        return {"row": row, "new_heads": comp["new_heads"].tolist()}

    if cache_key is None:
        out = compute()
    else:
        key = {**cache_key, "model": model_name(model), "prompt": prompt_digest(sample), "condition": condition,
               "k": k, "sample_seed": sample_seed, "setup": _setup_key(setup), "trace": asdict(config)}
        out = cached_json(key, compute)
    return out["row"], torch.tensor(out["new_heads"])


def grid_experiment(model, cells: list[tuple[dict, Sample]], setup: AblationSetup, config: TraceConfig,
                    conditions: list[str] = ("none", "dynamic", "static", "random"), desc: str = "grid",
                    cache_key: dict | None = None) -> pd.DataFrame:
    """Fig 2 / Fig 6: every condition on every (cell, sample); one row per run."""
    rows = []
    for index, (cell, sample) in enumerate(tqdm(cells, desc=desc, leave=False)):
        for condition in conditions:
            row, _ = _cached_run(model, sample, condition, setup, config, sample_seed=index, cache_key=cache_key)
            rows.append({**cell, "condition": condition, **row})
    return pd.DataFrame(rows)


def progressive_experiment(model, samples: list[Sample], setup: AblationSetup, config: TraceConfig,
                           ks: list[int], desc: str = "progressive", cache_key: dict | None = None):
    """Fig 3 / Fig 7: mask the top-k ranked heads at each step, for each k. Returns (rows, new-head counts)."""
    rows = []
    new_heads = torch.zeros_like(setup.static_top20, dtype=torch.long)
    for index, sample in enumerate(tqdm(samples, desc=desc, leave=False)):
        for k in ks:
            row, counts = _cached_run(model, sample, "progressive", setup, config, sample_seed=index, k=k,
                                      cache_key=cache_key)
            new_heads += counts.long()
            rows.append({"sample": index, "k": k, **row})
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
        rows.append({"head": f"L{layer}H{head}", "times_newly_active": count,
                     "in_static_top20": bool(static_top20[layer, head])})
    return pd.DataFrame(rows, columns=["head", "times_newly_active", "in_static_top20"])
