"""A trained probe as a scorer of heads (:class:`HeadProbe`), and claim 3's probe at lag k = 1 trained on a
calibration split (:func:`next_step_probe`): the scores by which claim 2's ``predicted`` condition picks the heads to
mask at step t from the hidden state of step t - 1. The RAG case study's probe is a :class:`HeadProbe` too.
"""
from __future__ import annotations

import copy
import json
from dataclasses import asdict
from typing import Literal, Sequence

import numpy as np
import torch

from dynheads_tl.analysis.layouts import lagged_pairs, layout_groups, layout_split
from dynheads_tl.analysis.probes import ProbeConfig, _mlp, _Standardize, train_probe
from dynheads_tl.engine.trace_data import Trace
from dynheads_tl.store import tensor_digest, config_hash, atomic_torch_save, cache_dir, quarantine

__all__ = ["HeadProbe", "next_step_probe"]


class HeadProbe:
    """A trained probe as a scorer of heads: a hidden state [d_model] -> one score per head [layer, head] (a logit
    for a classification probe, a predicted Eq. 2 score for a regression probe; either ranks the heads).
    ``digest`` names its weights, so cached runs of another probe are never read back."""

    def __init__(self, network: torch.nn.Module, shape: tuple[int, int]):
        # A copy: weights edited afterwards in the caller's network must not change what this digest names.
        self.network, self.shape = copy.deepcopy(network).eval(), tuple(shape)
        self.digest = tensor_digest(*self.network.state_dict().values())

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.network(hidden[None].float())[0].reshape(self.shape)


# Bump when what next_step_probe trains changes, so a cached probe of the older recipe is not read back.
_NEXT_STEP_PROBE_VERSION = 1


def next_step_probe(traces: Sequence[Trace], task: Literal["classification", "regression"], config: ProbeConfig, *,
                    val_fraction: float = 0.2, use_cache: bool = True) -> HeadProbe | None:
    """Claim 3's probe at lag k = 1, trained on ``traces`` alone (a calibration split): :func:`train_probe` on the
    pairs of :func:`~dynheads_tl.analysis.layouts.lagged_pairs` (hidden[n], target[n + 1]), where hidden[n] is the
    final-norm state at the last position of step n's forward (the state whose logits chose token n, so it exists
    before step n + 1 runs) and the target is step n + 1's Eq. 1 set (``"classification"``, Table 2's probe) or its
    Eq. 2 scores (``"regression"``, Table 3's). Validation (for the best epoch and the learning-rate schedule) is
    ``val_fraction`` of the layouts (:func:`~dynheads_tl.analysis.layouts.layout_groups`), split by layout with
    ``config.seed``; with a single layout there is no validation part and the last epoch is kept.

    Deterministic under ``config.seed`` (seeded initialisation, batch order and split). With ``use_cache`` the
    trained weights are cached under a key of the training pairs, the split and ``config``, so a later run reads
    the same probe back (and the cached runs keyed by its digest stay valid) whatever its thread count. None when no
    trace has two steps (no pair to learn from)."""
    if task not in ("classification", "regression"):
        raise ValueError(f"task must be 'classification' or 'regression', got {task!r}.")
    traces = list(traces)
    if not traces or all(trace.n_steps < 2 for trace in traces):
        return None
    x, y, groups = lagged_pairs(traces, 1, "eq1" if task == "classification" else "score")
    clusters = layout_groups(traces)
    if len(set(clusters.tolist())) >= 2:
        train_samples, val_samples = layout_split(clusters, config.seed, val_fraction)
    else:
        train_samples, val_samples = np.arange(len(traces)), np.array([], dtype=int)
    train, val = np.isin(groups, train_samples), np.isin(groups, val_samples)
    shape = tuple(traces[0].retrieval_mask.shape[1:])

    key = {"unit": "next_step_probe", "version": _NEXT_STEP_PROBE_VERSION, "task": task, "config": asdict(config),
           "pairs": tensor_digest(torch.as_tensor(x), torch.as_tensor(y)),
           "split": tensor_digest(torch.as_tensor(train), torch.as_tensor(val)), "shape": list(shape)}
    path = _probe_cache_dir() / f"{config_hash(key)}.pt"
    if use_cache and path.exists():
        network = _read_probe(path, key, x.shape[1], y.shape[1], config)
        if network is not None:
            return HeadProbe(network, shape)
    network = train_probe(x[train], y[train], x[val], y[val], task=task, config=config)
    if use_cache:
        atomic_torch_save({"key": json.dumps(key, sort_keys=True), "state": network.state_dict()}, path)
    return HeadProbe(network, shape)


def _probe_cache_dir():
    return cache_dir() / "probes"


def _read_probe(path, key: dict, d_in: int, d_out: int, config: ProbeConfig) -> torch.nn.Module | None:
    """The cached network at ``path`` (rebuilt as :func:`train_probe` builds it), or None when the entry is
    unreadable or records another key (then it is set aside and the probe retrained)."""

    try:
        entry = torch.load(path, weights_only=True)
        if entry.get("key") != json.dumps(key, sort_keys=True):
            raise ValueError("the entry records a different probe")
        network = torch.nn.Sequential(_Standardize(torch.zeros(d_in), torch.ones(d_in)),
                                      _mlp(d_in, d_out, config.hidden, config.dropout))
        network.load_state_dict(entry["state"])
        return network.eval()
    except Exception as error:  # any unreadable entry (truncated, older layout, foreign file) is recomputed
        quarantine(path, error)
        return None
