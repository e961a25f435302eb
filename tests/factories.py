"""Hand-built ``Trace``s for the tests: one factory, so a new Trace field is defaulted in one place.

Everything after generation reads a Trace, never the model, so most analysis tests build one with known values
instead of running a model. :func:`make_trace` needs only the generated tokens; every per-step tensor not given
is zeros shaped [step, layer, head] (or [step, d_model] for ``hidden``), and every other field is a small valid
default. Lists, NumPy arrays and tensors are all accepted where a tensor is expected.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from dynheads_tl.engine.trace_data import Trace


def make_trace(tokens, argmax_pos=None, support_score=None, *, hidden=None, layers: int = 2, heads: int = 2,
               d_model: int = 4, prompt_ids=(10, 11, 12, 13), evidence_spans: Sequence[tuple[int, int]] = ((1, 3),),
               task: str = "niah", answers: Sequence[str] = ("x",), response: str = "x", **fields: Any) -> Trace:
    """A :class:`Trace` of ``len(tokens)`` steps. ``argmax_pos`` fixes the layer and head counts when given
    (else ``layers`` x ``heads``); ``fields`` pass through (``config``, ``meta``, the signals, ...)."""
    tokens = torch.as_tensor(tokens)
    steps = len(tokens)
    argmax_pos = (torch.zeros(steps, layers, heads, dtype=torch.long) if argmax_pos is None
                  else torch.as_tensor(argmax_pos))
    support_score = torch.zeros(argmax_pos.shape) if support_score is None else torch.as_tensor(support_score)
    hidden = torch.zeros(steps, d_model) if hidden is None else torch.as_tensor(hidden)
    return Trace(tokens=tokens, argmax_pos=argmax_pos, support_score=support_score, hidden=hidden,
                 prompt_ids=torch.as_tensor(prompt_ids), evidence_spans=[tuple(s) for s in evidence_spans],
                 task=task, answers=list(answers), response=response, **fields)
