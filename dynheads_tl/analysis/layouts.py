"""Claim 3's units and pairs: which samples share a layout, the (hidden state, scores k steps later) pairs of each
sample, splits by layout, and means over splits with the corrected resampled t-interval.

NIAH samples of different seeds share their layout (the needle's depth and the haystack window; the seed changes
only the UUID), so siblings of one layout are nearly the same sample: every split is by *layout*
(:func:`layout_groups`, :func:`layout_split`), never by sample, and every table says how many samples and layouts
it rests on (SCIENCE 10). Splits share most of their layouts, so means over them carry the corrected resampled
t-interval (Nadeau and Bengio 2003, :func:`~dynheads_tl.analysis.statistics.resampled_t_interval`).
"""
from __future__ import annotations

from typing import Literal, NamedTuple, Sequence

import numpy as np
import pandas as pd
import torch

from dynheads_tl.analysis.statistics import CORRELATION_RANGE, grouped_splits, resampled_t_interval, resampled_t_test
from dynheads_tl.engine.trace_data import Trace


# What makes two NIAH samples the same layout: the needle's depth and the haystack window (the seed changes only
# the UUID). HotpotQA samples are one question each (a file's records recur across seeds).
NIAH_LAYOUT_KEYS = ("haystack", "context_tokens", "depth", "haystack_offset")


def layout_groups(traces: Sequence[Trace]) -> np.ndarray:
    """One cluster label per trace (SCIENCE 10): NIAH traces with the same haystack, length, depth and haystack
    offset share a label whatever their UUID; HotpotQA traces of the same question (record id) and layout share
    one. A trace whose sample recipe is unknown (no ``meta``) is its own cluster."""
    labels = []
    for index, trace in enumerate(traces):
        meta = trace.meta or {}
        if trace.task == "niah" and "depth" in meta:
            labels.append("niah|" + "|".join(str(meta.get(key)) for key in NIAH_LAYOUT_KEYS))
        elif trace.task == "hotpot" and meta.get("id") is not None:
            labels.append(f"hotpot|{meta['id']}|{meta.get('context_tokens')}|{meta.get('depth')}")
        else:
            labels.append(f"sample|{index}")
    return np.array(labels)


def sample_depth(trace: Trace) -> float:
    """Where the evidence starts, as a fraction of the context (``actual_depth``; the requested depth, else 0)."""
    meta = trace.meta or {}
    value = meta.get("actual_depth", meta.get("depth"))
    return float(value) if value is not None else 0.0


# --- pairing -------------------------------------------------------------------------------------
def lagged_pairs(traces: Sequence[Trace], k: int, target: Literal["score", "eq1"] = "score"):
    """(hidden[n], target[n + k]) for every sample and every n with n + k inside the sample.

    Returns X [pairs, d_model], Y [pairs, layer*head] and the sample index of every pair.
    """
    xs, ys, groups = [], [], []
    for index, trace in enumerate(traces):
        n = trace.n_steps - k
        if n <= 0:
            continue
        values = trace.support_score if target == "score" else trace.retrieval_mask.float()
        xs.append(trace.hidden[:n].double().numpy())
        ys.append(values[k:k + n].flatten(1).double().numpy())
        groups.append(np.full(n, index))
    if not xs:
        raise ValueError(f"No sample is longer than k = {k} steps.")
    return np.concatenate(xs), np.concatenate(ys), np.concatenate(groups)


def split_by_sample(n_samples: int, fractions: Sequence[float], seed: int = 0) -> list[np.ndarray]:
    """Sample indices split by ``fractions`` (e.g. 0.7/0.2/0.1), so no sample is on two sides."""
    if abs(sum(fractions) - 1.0) > 1e-6:
        raise ValueError(f"Split fractions must sum to 1, got {list(fractions)}.")
    order = np.random.default_rng(seed).permutation(n_samples)
    cuts = np.round(np.cumsum(fractions)[:-1] * n_samples).astype(int)
    return [np.sort(part) for part in np.split(order, cuts)]


def step_of(groups: np.ndarray) -> np.ndarray:
    """Each pair's step index inside its own sample (pairs of a sample are contiguous and in order)."""
    steps = np.zeros(len(groups), dtype=int)
    for g in np.unique(groups):
        rows = np.flatnonzero(groups == g)
        steps[rows] = np.arange(len(rows))
    return steps


def shuffle_across_samples(y: np.ndarray, groups: np.ndarray, seed: int = 0, *, same_step: bool = False,
                           clusters: np.ndarray | None = None) -> np.ndarray:
    """Each row gets the scores of a step of a *different* sample: a random step, or (``same_step``)
    the same step index, which keeps whatever depends on the position in the answer alone. ``groups``: each
    row's sample; ``clusters`` (one label per row, default the sample): the donor must come from another
    cluster, so a NIAH row is never paired with its own layout's sibling (nearly the same sample)."""
    rng = np.random.default_rng(seed)
    shuffled = np.empty_like(y)
    clusters = groups if clusters is None else np.asarray(clusters)
    if len(np.unique(clusters)) < 2:
        raise ValueError("The shuffled control needs at least two samples of different layouts.")
    steps = step_of(groups)
    for c in np.unique(clusters):
        other = clusters != c
        for row in np.flatnonzero(clusters == c):
            candidates = np.flatnonzero(other & (steps == steps[row])) if same_step else np.empty(0, dtype=int)
            if len(candidates) == 0:
                candidates = np.flatnonzero(other)
            shuffled[row] = y[rng.choice(candidates)]
    return shuffled


def permute_within_samples(y: np.ndarray, groups: np.ndarray, seed: int = 0) -> np.ndarray:
    """Each sample's rows get the scores of *its own* steps in another order, a derangement (Sattolo's algorithm: a
    random cycle through all of the sample's rows, so no row keeps its own step): the pairing keeps which sample a
    score came from and breaks which step it belongs to. A sample with a single row cannot be permuted and keeps its
    true pair: :func:`permutable_rows` leaves such samples out of the comparison."""
    rng = np.random.default_rng(seed)
    permuted = np.array(y, copy=True)
    for g in np.unique(groups):
        rows = np.flatnonzero(groups == g)
        order = np.arange(len(rows))
        for i in range(len(rows) - 1, 0, -1):  # Sattolo: swap with an earlier position only
            j = int(rng.integers(0, i))
            order[i], order[j] = order[j], order[i]
        permuted[rows] = y[rows[order]]
    return permuted


def permutable_rows(groups: np.ndarray) -> np.ndarray:
    """The rows whose sample has at least two rows (the only ones :func:`permute_within_samples` can move)."""
    labels, counts = np.unique(groups, return_counts=True)
    return np.isin(groups, labels[counts >= 2])


def layout_split(clusters: np.ndarray, seed: int, test_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(train samples, test samples) of one grouped split: each layout wholly on one side."""
    return grouped_splits(clusters, 1, test_fraction=test_fraction, seed=seed)[0]


def split_sizes(clusters: np.ndarray, train: np.ndarray, test: np.ndarray) -> dict[str, int]:
    return {"train_samples": len(train), "train_clusters": len(set(clusters[train].tolist())),
            "test_samples": len(test), "test_clusters": len(set(clusters[test].tolist())),
            "n_samples": len(clusters), "n_clusters": len(set(clusters.tolist()))}


def test_to_train_ratio(table: pd.DataFrame) -> float:
    """n_test / n_train in layouts (independent units), averaged over the splits of ``table``: the overlap
    correction of :func:`~dynheads_tl.analysis.statistics.resampled_t_interval`."""
    return float((table["test_clusters"] / table["train_clusters"]).mean())


def over_splits(table: pd.DataFrame, columns: Sequence[str] = ("first", "top10_mean", "top50_mean"),
                by: Sequence[str] = ("k", "control"), *,
                bounds: tuple[float, float] | None = CORRELATION_RANGE) -> pd.DataFrame:
    """Per (k, control): the mean of each of ``columns`` over the splits with its corrected resampled 95%
    t-interval (``<column>_low`` / ``_high``), ``splits``, and what each split held: ``test_samples`` /
    ``test_clusters`` (mean per split) and ``n_samples`` / ``n_clusters`` (all of them). The columns are
    correlations (canonical correlations of CCA), so each interval is held within ``bounds``, [−1, 1]
    (:func:`~dynheads_tl.analysis.statistics.resampled_t_interval` says why that is the interval's own reading);
    ``bounds=None`` for columns of another range."""
    rows = []
    for key, part in table.groupby(list(by), sort=True):
        ratio = test_to_train_ratio(part)
        row = dict(zip(by, key if isinstance(key, tuple) else (key,)))
        for column in columns:
            if column not in part:
                continue
            interval = resampled_t_interval(part[column], ratio, bounds=bounds)
            row.update({column: interval.estimate, f"{column}_low": interval.low, f"{column}_high": interval.high})
        row.update({"splits": int(part["split_seed"].nunique()), "test_samples": float(part["test_samples"].mean()),
                    "test_clusters": float(part["test_clusters"].mean()),
                    "n_samples": int(part["n_samples"].iloc[0]), "n_clusters": int(part["n_clusters"].iloc[0])})
        if "pairs" in part:
            row["pairs"] = int(part["pairs"].iloc[0])
        if "first" in part and "leading" in part:
            row["leading"] = float(part["leading"].mean())
        rows.append(row)
    return pd.DataFrame(rows)


def paired_over_splits(table: pd.DataFrame, a: str, b: str, column: str = "first") -> pd.DataFrame:
    """Per k: control ``a`` minus control ``b`` on the same splits (mean, corrected resampled 95% interval and
    the two-sided corrected resampled t-test's p-value), for the verdicts' tests."""
    rows = []
    for k, part in table.groupby("k", sort=True):
        wide = part.pivot(index="split_seed", columns="control", values=column)
        if a not in wide or b not in wide:
            continue
        diff = (wide[a] - wide[b]).dropna()
        ratio = test_to_train_ratio(part)
        interval = resampled_t_interval(diff, ratio)
        rows.append({"k": int(k), "a": a, "b": b, "difference": interval.estimate, "low": interval.low,
                     "high": interval.high, "p": resampled_t_test(diff, ratio), "splits": interval.n})
    return pd.DataFrame(rows)


class PairCovariates(NamedTuple):
    """What a pair of :func:`lagged_pairs` could be explained by besides the hidden state, one entry per pair."""

    steps: np.ndarray            # the step index n of the hidden state
    tokens: np.ndarray           # the token step n reads (the last prompt token at n = 0, else the one generated at n - 1)
    target_tokens: np.ndarray    # the token step n + k reads (the same as ``tokens`` at k = 0)
    generated_tokens: np.ndarray  # the token generated at step n + k, which Eq. 1 at that step is defined against
    depths: np.ndarray           # the sample's evidence depth (:func:`sample_depth`)


def pair_covariates(traces: Sequence[Trace], k: int) -> PairCovariates:
    """For every pair of :func:`lagged_pairs` (same order): the step index n of the hidden state, the token
    that step reads (its input: the last prompt token at n = 0, else the token generated at n - 1), the
    token the target's step n + k reads (the same token when k = 0), the token generated at step n + k (Eq. 1 at
    that step asks whether a head's argmax holds it, and h_n may encode it: a residualisation that leaves it in
    credits the hidden state with the next token) and the sample's evidence depth (:func:`sample_depth`)."""
    steps, tokens, target_tokens, generated, depths = [], [], [], [], []
    for trace in traces:
        n = trace.n_steps - k
        if n <= 0:
            continue
        inputs = torch.cat([trace.prompt_ids[-1:], trace.tokens[:-1]])
        steps.append(np.arange(n))
        tokens.append(inputs[:n].numpy())
        target_tokens.append(inputs[k:k + n].numpy())
        generated.append(trace.tokens[k:k + n].numpy())
        depths.append(np.full(n, sample_depth(trace)))
    if not steps:
        raise ValueError(f"No sample is longer than k = {k} steps.")
    return PairCovariates(np.concatenate(steps), np.concatenate(tokens), np.concatenate(target_tokens),
                          np.concatenate(generated), np.concatenate(depths))
