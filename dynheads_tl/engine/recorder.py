"""The recorder: per-step buffers, the hooks that reduce each attention row into them, and the ``Trace``.

At every decoding step the reduction hooks (:func:`reduction_hooks`) reduce each head's [batch, 1, key] pattern
row to what the paper needs (top-1 source position for Eq. 1, Eq. 2's evidence share, and on request the
evidence attention and the error-signal masses) before the next layer runs, writing into buffers preallocated
for the whole generation (:func:`new_buffers`); :func:`build_trace` cuts one row's buffers into a :class:`Trace`.
Memory grows linearly in the number of steps.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from dynheads_tl.engine.equations import eq2_share, evidence_positions
from dynheads_tl.engine.hooks import HookList, StepState, pattern_hook_name
from dynheads_tl.engine.models import model_identity
from dynheads_tl.engine.trace_data import HEAD_SIGNALS, SIGNALS, Trace, TraceConfig
from dynheads_tl.tasks.common import Sample


def reduction_hooks(state: StepState, buffers: dict[str, Tensor], masks: dict[str, Tensor], n_layers: int) -> HookList:
    """Hooks that reduce each step's attention rows to Eq. 1 / Eq. 2 inputs, for every row of a batch.

    ``buffers`` come from :func:`new_buffers` ([batch, step, ...]). ``masks`` holds ``"evidence"`` and
    ``"eligible"`` ([batch, key], padded coordinates) and ``"offsets"`` (each row's left padding);
    source positions are stored in each row's own, unpadded coordinates.
    """
    def make(layer: int):
        def hook(pattern: Float[Tensor, "batch head query key"], hook):
            if not state.active:
                return None
            rows = pattern[:, :, -1, :].float()  # [batch, head, key]
            buffers["argmax_pos"][:, state.step, layer] = rows.argmax(-1) - masks["offsets"][:, None]
            key_len = rows.shape[-1]
            buffers["support_score"][:, state.step, layer] = eq2_share(
                rows, masks["evidence"][:, :key_len], masks["eligible"][:, :key_len])
            if "placebo_support_score" in buffers:  # the same rows' share on a second evidence set (placebo spans)
                buffers["placebo_support_score"][:, state.step, layer] = eq2_share(
                    rows, masks["placebo_evidence"][:, :key_len], masks["eligible"][:, :key_len])
            if "evidence_attention" in buffers:  # each evidence position's weight (padding slots get 0)
                index, valid = masks["evidence_index"], masks["evidence_valid"]
                taken = rows.gather(-1, index[:, None, :].expand(-1, rows.shape[1], -1).clamp_max(key_len - 1))
                buffers["evidence_attention"][:, state.step, layer] = (taken * valid[:, None, :]).to(
                    buffers["evidence_attention"].dtype)
            if "context_mass" in buffers:
                buffers["evidence_mass"][:, state.step, layer] = (rows * masks["evidence"][:, None, :key_len]).sum(-1)
                buffers["context_mass"][:, state.step, layer] = (rows * masks["context"][:, None, :key_len]).sum(-1)
                buffers["generated_mass"][:, state.step, layer] = rows[..., masks["first_generated"]:].sum(-1)
            return None

        return hook

    def hidden_hook(resid: Float[Tensor, "batch pos d_model"], hook):
        if state.active:
            buffers["hidden"][:, state.step] = resid[:, -1].float()
        return None

    hooks = [(pattern_hook_name(layer), make(layer)) for layer in range(n_layers)]
    hooks.append(("ln_final.hook_out", hidden_hook))
    return hooks


def max_evidence(samples: Sequence[Sample]) -> int:
    """The largest number of evidence positions of any sample (the evidence-attention buffer's width)."""
    return max(int(evidence_positions(s.evidence_spans, len(s.prompt_ids)).sum()) for s in samples)


def record_token_signals(buffers: dict[str, Tensor], step: int, logits: Float[Tensor, "batch vocab"],
                         chosen: Int[Tensor, "batch"]) -> None:
    """Step ``step``'s kept-token log-probability and next-token entropy (nats) from ``logits``."""
    log_p = torch.log_softmax(logits.float(), dim=-1)
    buffers["token_logprob"][:, step] = log_p.gather(-1, chosen.reshape(-1, 1).to(log_p.device))[:, 0]
    buffers["token_entropy"][:, step] = -(log_p.exp() * log_p).sum(-1)


def new_buffers(model, max_steps: int, batch: int = 1, evidence_width: int = 0,
                signals: bool = False, placebo: bool = False) -> dict[str, Tensor]:
    """Per-row, per-step outputs of the reduction hooks, preallocated for ``max_steps`` steps; with
    ``evidence_width`` > 0 also the attention on up to that many evidence positions (float16); with ``signals``
    the fields of :data:`SIGNALS`; with ``placebo`` Eq. 2's share on a second evidence set
    (``"placebo_support_score"``, read from ``masks["placebo_evidence"]``)."""
    n_layers, n_heads, d_model = model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_model
    device = next(model.parameters()).device
    buffers = {
        "argmax_pos": torch.zeros(batch, max_steps, n_layers, n_heads, dtype=torch.long, device=device),
        "support_score": torch.zeros(batch, max_steps, n_layers, n_heads, dtype=torch.float32, device=device),
        "hidden": torch.zeros(batch, max_steps, d_model, dtype=torch.float32, device=device),
    }
    if placebo:
        buffers["placebo_support_score"] = torch.zeros_like(buffers["support_score"])
    if evidence_width > 0:
        buffers["evidence_attention"] = torch.zeros(batch, max_steps, n_layers, n_heads, evidence_width,
                                                    dtype=torch.float16, device=device)
    if signals:
        for name in HEAD_SIGNALS:
            buffers[name] = torch.zeros(batch, max_steps, n_layers, n_heads, dtype=torch.float32, device=device)
        for name in SIGNALS[len(HEAD_SIGNALS):]:
            buffers[name] = torch.zeros(batch, max_steps, dtype=torch.float32, device=device)
    return buffers


def build_trace(model, sample: Sample, config: TraceConfig, tokens: list[int], buffers: dict[str, Tensor],
                row: int = 0, **extra_config) -> Trace:
    """Row ``row`` of the recorded ``buffers``, cut to its ``tokens``, as the :class:`Trace` of ``sample``; its
    config is ``config``'s fields, the model's name and fingerprint, and ``extra_config``."""
    n = len(tokens)
    # Copies, not views: a view of the batch's buffer would carry (and save) the whole batch's storage.
    own = lambda tensor: tensor.detach().to("cpu", copy=True).contiguous()
    evidence_attention = None
    if "evidence_attention" in buffers:
        n_evidence = int(evidence_positions(sample.evidence_spans, len(sample.prompt_ids)).sum())
        evidence_attention = own(buffers["evidence_attention"][row, :n, ..., :n_evidence])
    return Trace(
        tokens=torch.tensor(tokens, dtype=torch.long),
        argmax_pos=own(buffers["argmax_pos"][row, :n]),
        support_score=own(buffers["support_score"][row, :n]),
        hidden=own(buffers["hidden"][row, :n]),
        prompt_ids=torch.as_tensor(sample.prompt_ids, dtype=torch.long),
        evidence_spans=[tuple(s) for s in sample.evidence_spans],
        task=sample.task,
        answers=list(sample.answers),
        response=model.tokenizer.decode(tokens, skip_special_tokens=True),
        config={**asdict(config), **model_identity(model), **extra_config},
        # With signals, the context span the context mass was taken over (its length normalises it).
        meta={**sample.meta, **({"context_span": list(sample.context_span)} if "context_mass" in buffers else {})},
        evidence_attention=evidence_attention,
        **{name: own(buffers[name][row, :n]) for name in SIGNALS if name in buffers},
    )
