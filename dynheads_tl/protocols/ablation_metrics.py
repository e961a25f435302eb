"""What one two-pass run (:class:`~dynheads_tl.protocols.two_pass.AblationTrace`) amounts to, in numbers: the
answer's scores, compensation (which heads become active once others are masked), and a teacher-forced run's
log-probability drops; plus the compensation table over many runs.
"""
from __future__ import annotations

import pandas as pd
import torch
from jaxtyping import Bool
from torch import Tensor

from dynheads_tl.engine.equations import Eq2Rule, head_label
from dynheads_tl.engine.tracing import Trace
from dynheads_tl.protocols.two_pass import AblationTrace
from dynheads_tl.tasks.metrics import exact_match, niah_accuracy, rouge_l, token_f1


def answer_scores(trace: Trace) -> dict[str, float]:
    gold = trace.answers[0]
    if trace.task == "niah":
        return {"accuracy": niah_accuracy(trace.response, gold),
                "rouge_l": rouge_l(trace.response, trace.meta.get("needle_text", gold))}
    return {"f1": token_f1(trace.response, gold), "em": exact_match(trace.response, gold),
            "rouge_l": rouge_l(trace.response, gold)}


def compensation(result: AblationTrace, static_mask: Bool[Tensor, "layer head"], *, kind: str = "eq1",
                 threshold: "float | Eq2Rule" = 0.1) -> dict[str, object]:
    """E_t = H'_t minus H_t minus M_t: heads active after masking that were not active in the clean pass
    and were not masked themselves at step t (M_t). A masked head's attention pattern is still computed (only
    its output is ablated), so without the last term it could count as compensating for its own removal.

    Returns m_s for this sample (max over masked steps of |E_t ∩ static top-20|) and the per-head
    counts of E over steps (for the compensation table). Only steps where something was masked count.
    """
    if kind == "eq1":
        before, after = result.clean.retrieval_mask, result.masked.retrieval_mask
    else:
        before, after = result.clean.eq2_sets(threshold), result.masked.eq2_sets(threshold)
    masked_steps = result.masked_heads.flatten(1).any(1)
    newly = after & ~before & ~result.masked_heads & masked_steps[:, None, None]
    in_static = (newly & static_mask).flatten(1).sum(1)
    return {"m_s": int(in_static.max()) if len(in_static) else 0,
            "new_heads": newly.sum(0), "steps_masked": int(masked_steps.sum())}


def teacher_forced_scores(result: AblationTrace) -> dict[str, float | int | None]:
    """One teacher-forced run in numbers (log-probabilities in nats, ``tf_`` for teacher-forced):
    ``tf_drop`` the mean per-step drop of the gold token's log-probability over all gold steps,
    ``tf_drop_masked`` the same over the steps where something was masked (None when none was),
    ``tf_drop_t1`` the same over the steps t >= 1 (None for a one-step continuation: the steps on which a set known
    before the step, D_{t-1}, exists, so a comparison with such a condition covers the same steps on both sides),
    ``tf_steps`` / ``tf_masked_steps`` how many steps of each, the mean clean and masked log-probabilities,
    and the mean number of heads masked per step."""
    drop = result.logprob_drop
    masked_steps = result.masked_heads.flatten(1).any(1)
    return {"tf_drop": float(drop.mean()),
            "tf_drop_masked": float(drop[masked_steps].mean()) if bool(masked_steps.any()) else None,
            "tf_drop_t1": float(drop[1:].mean()) if len(drop) > 1 else None,
            "tf_steps": int(len(drop)), "tf_masked_steps": int(masked_steps.sum()),
            "tf_clean_logprob": float(result.clean_logprob.mean()),
            "tf_masked_logprob": float(result.masked_logprob.mean()),
            "tf_heads_masked_per_step": float(result.masked_heads.flatten(1).sum(1).float().mean())}


def overlap_with_dynamic(result: AblationTrace, *, kind: str = "eq1", threshold: "float | Eq2Rule" = 0.1,
                         static_order: Tensor | None = None) -> dict[str, float]:
    """How much of the actual D_t a run's masked sets M_t held, summed over the steps t >= 1 (the steps on which a
    set known before the step exists), with D_t from the run's clean passes (Eq. 1, or Eq. 2 under ``threshold``):
    ``tf_dt_heads_t1`` = sum |D_t|, ``tf_masked_heads_t1`` = sum |M_t|, ``tf_masked_in_dt_t1`` = sum |M_t ∩ D_t|,
    and, for reference at the same sizes (|D_{t-1}| heads at step t), ``tf_previous_in_dt_t1`` = sum
    |D_{t-1} ∩ D_t| (the previous step's set itself), ``tf_static_in_dt_t1`` = sum |top-|D_{t-1}| static ∩ D_t|
    (with ``static_order``) and ``tf_chance_in_dt_t1`` = sum |D_{t-1}| |D_t| / heads (what as many uniformly random
    heads hold on average). Recall of D_t is a ``*_in_dt_t1`` sum over ``tf_dt_heads_t1``; precision over
    ``tf_masked_heads_t1``. Under teacher forcing with the clean cache every condition's clean passes are the same,
    so these sums are the same sets every condition of the sample saw."""
    sets = result.clean.retrieval_mask if kind == "eq1" else result.clean.eq2_sets(threshold)
    sets, masked = sets.bool(), result.masked_heads.bool()
    if len(sets) < 2:
        return {name: 0.0 for name in ("tf_dt_heads_t1", "tf_masked_heads_t1", "tf_masked_in_dt_t1",
                                       "tf_previous_in_dt_t1", "tf_static_in_dt_t1", "tf_chance_in_dt_t1")}
    current, previous = sets[1:], sets[:-1]
    sizes = previous.flatten(1).sum(1)
    n_heads = current[0].numel()
    row = {"tf_dt_heads_t1": float(current.sum()), "tf_masked_heads_t1": float(masked[1:].sum()),
           "tf_masked_in_dt_t1": float((masked[1:] & current).sum()),
           "tf_previous_in_dt_t1": float((previous & current).sum()),
           "tf_chance_in_dt_t1": float((sizes.float() * current.flatten(1).sum(1).float()).sum() / n_heads)}
    if static_order is not None:
        ranks = torch.empty(n_heads, dtype=torch.long)
        ranks[static_order.cpu()] = torch.arange(n_heads)
        top = ranks[None, :] < sizes[:, None]  # step t's top-|D_{t-1}| static heads
        row["tf_static_in_dt_t1"] = float((top & current.flatten(1)).sum())
    return row


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
        rows.append({"head": head_label(layer, head), "times_newly_active": count,
                     "in_static_top20": bool(static_top20[layer, head])})
    return pd.DataFrame(rows, columns=["head", "times_newly_active", "in_static_top20"])
