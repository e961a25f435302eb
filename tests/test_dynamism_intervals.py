"""Claim 1's intervals resample whole NIAH layouts (issue #32, SCIENCE 10): samples of different seeds that share a
depth and haystack offset are one unit, so the interval is wider than one that counts them as independent. No model."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from dynheads_tl.claims.dynamism import TaskResult, size_aware_table, table1_intervals


def _result(layouts: int, siblings: int, *, same_layout: bool) -> TaskResult:
    """``layouts`` x ``siblings`` analysis samples; siblings of one layout carry identical step sets (they differ only
    in the UUID), the layouts differ a lot in how many heads retrieve per step."""
    generator = torch.Generator().manual_seed(0)
    analysis, sets = [], []
    for layout in range(layouts):
        size = int(torch.randint(1, 12, (1,), generator=generator))
        steps = torch.zeros(6, 30, 9, dtype=torch.bool)
        for step in range(6):
            steps[step].view(-1)[torch.randperm(270, generator=generator)[:size]] = True
        for sibling in range(siblings):
            offset = 37 * layout if same_layout else 37 * layout + sibling  # distinct offsets: independent samples
            analysis.append(SimpleNamespace(task="niah", meta={"haystack": "filler", "context_tokens": 500,
                                                               "depth": 0.1 * layout, "haystack_offset": offset}))
            sets.append(steps)
    scores = torch.rand(30, 9, generator=generator)
    return TaskResult("niah", 0, [], analysis, scores, sets, {}, {})


def test_table1_intervals_resample_layouts_and_are_wider_than_the_naive_bootstrap():
    clustered = table1_intervals([_result(10, 3, same_layout=True)], n_resamples=400).set_index("metric")
    naive = table1_intervals([_result(10, 3, same_layout=False)], n_resamples=400).set_index("metric")
    assert (clustered["n_layouts"] == 10).all() and (naive["n_layouts"] == 30).all()
    assert (clustered["n_samples"] == 30).all()
    # The same 30 step sets, so the same estimates; resampling 10 layouts instead of 30 samples widens the interval.
    assert clustered.loc["heads_per_step_mean", "value"] == naive.loc["heads_per_step_mean", "value"]
    width = lambda t: t.loc["heads_per_step_mean", "high"] - t.loc["heads_per_step_mean", "low"]
    assert width(clustered) > 1.3 * width(naive)


def test_size_aware_table_counts_layouts():
    table = size_aware_table([_result(8, 3, same_layout=True)], [20])
    assert (table["n_layouts"] == 8).all() and (table["n_samples"] == 24).all()
