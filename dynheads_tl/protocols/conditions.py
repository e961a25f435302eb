"""The conditions of claim 2's experiments: named masking rules (:mod:`dynheads_tl.protocols.selectors`) built
from what the calibration split gives (:class:`AblationSetup`).

The paper's conditions: ``none``, ``dynamic`` (D_t at every step), and the baselines ``static`` (the static
top-k heads at every step) and ``random`` (k seeded random heads, drawn once per sample), with k the mean
dynamic-set size of the calibration split. ``progressive`` ranks every head at step t (Eq. 1 hits first, then
by attention share on the evidence) and masks the top k; ``progressive_random`` is its size-matched control,
k random heads drawn afresh at each step (seeded by the sample and the step).

Controls that are not in the paper, each decided at each step from that step's D_t (S_20: the static
top-20 of the calibration split):

- ``static_matched``: as many of the top static heads as D_t has heads (dynamic and static masking
  remove the same number of heads at every step); ``query_matched``: the same design with the query-focused
  (QRHead-style) ranking;
- ``random_matched``: |D_t| random heads, drawn from a generator seeded by the sample and the step;
- ``dynamic_nonstatic``: D_t minus S_20, the part of the dynamic set that a static view misses;
- ``static_nondynamic``: the heads of S_20 that are not in D_t at that step;
- ``random_nonstatic``: as many random heads from outside S_20 as D_t minus S_20 has (the size-matched
  control of ``dynamic_nonstatic``);
- ``random_nondynamic``: as many random heads from outside D_t as S_20 minus D_t has (the size-matched
  control of ``static_nondynamic``).

Each masks nothing on a step where its set is empty (``static_nondynamic`` masks all of S_20 on a step
where D_t is empty). :data:`CONDITIONS` maps each name to its builder: a new condition is one entry there.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

from jaxtyping import Bool
from torch import Tensor

from dynheads_tl.engine.equations import Eq2Rule
from dynheads_tl.engine.hooks import AblationMode
from dynheads_tl.protocols.selectors import (random_heads, select_dynamic, select_dynamic_nonstatic, select_fixed,
                                             select_random_k, select_random_matched, select_random_nondynamic,
                                             select_random_nonstatic, select_static_matched, select_static_nondynamic, select_top_ranked)
from dynheads_tl.protocols.stepwise import Selector
from dynheads_tl.protocols.two_pass import CachePolicy
from dynheads_tl.tasks.common import WIDE_STRIDE, mix_seed

Condition = str  # a key of CONDITIONS


@dataclass
class AblationSetup:
    """Everything the conditions share: static set, k, protocol knobs.

    ``static_order`` (flat head indices by static score, best first) is needed by ``static_matched``."""

    static_mask: Bool[Tensor, "layer head"]
    static_top20: Bool[Tensor, "layer head"]
    k: int
    kind: Literal["eq1", "eq2"] = "eq1"
    threshold: "float | Eq2Rule" = 0.1  # Eq. 2's selection rule (a number: the fixed threshold)
    mode: AblationMode = "zero"
    keep_cache: CachePolicy = "clean"
    mean_z: Tensor | None = None
    seed: int = 0
    static_order: Tensor | None = None
    # A second static ranking (QRHead-style query-focused scores, issue #31), needed by ``query_matched``.
    query_order: Tensor | None = None


# (model, setup, sample_seed, k) -> (the selector, the k its runs record)
ConditionBuilder = Callable[[object, AblationSetup, int, int | None], tuple[Selector, int | None]]


def _draw_seed(setup: AblationSetup, sample_seed: int) -> int:
    """The seed of a sample's random draws: the setup's seed and the sample's."""
    return mix_seed(setup.seed, sample_seed, WIDE_STRIDE)


def _static_matched(model, setup: AblationSetup, sample_seed: int, k: int | None):
    if setup.static_order is None:
        raise ValueError("The static_matched condition needs AblationSetup.static_order (the static ranking).")
    return select_static_matched(setup.static_order), None


def _query_matched(model, setup: AblationSetup, sample_seed: int, k: int | None):
    """The size-matched design with the query-focused ranking."""
    if setup.query_order is None:
        raise ValueError("The query_matched condition needs AblationSetup.query_order (the query-focused ranking).")
    return select_static_matched(setup.query_order), None


def _random(model, setup: AblationSetup, sample_seed: int, k: int | None):
    heads = random_heads(model.cfg.n_layers, model.cfg.n_heads, setup.k, _draw_seed(setup, sample_seed))
    return select_fixed(heads), setup.k


def _progressive(model, setup: AblationSetup, sample_seed: int, k: int | None):
    if k is None or k < 0:
        raise ValueError("Progressive masking needs k >= 0.")
    return select_top_ranked(k), k


def _progressive_random(model, setup: AblationSetup, sample_seed: int, k: int | None):
    if k is None or k < 0:
        raise ValueError("Progressive masking needs k >= 0.")
    return select_random_k(k, _draw_seed(setup, sample_seed)), k


CONDITIONS: dict[str, ConditionBuilder] = {
    "none": lambda model, setup, sample_seed, k: ((lambda view: None), None),
    "dynamic": lambda model, setup, sample_seed, k: (select_dynamic, None),
    "static": lambda model, setup, sample_seed, k: (select_fixed(setup.static_mask), setup.k),
    "static_matched": _static_matched,
    "query_matched": _query_matched,
    "random": _random,
    "random_matched": lambda model, setup, sample_seed, k: (
        select_random_matched(_draw_seed(setup, sample_seed)), None),
    "dynamic_nonstatic": lambda model, setup, sample_seed, k: (select_dynamic_nonstatic(setup.static_top20), None),
    "static_nondynamic": lambda model, setup, sample_seed, k: (select_static_nondynamic(setup.static_top20), None),
    "random_nonstatic": lambda model, setup, sample_seed, k: (
        select_random_nonstatic(setup.static_top20, _draw_seed(setup, sample_seed)), None),
    "random_nondynamic": lambda model, setup, sample_seed, k: (
        select_random_nondynamic(setup.static_top20, _draw_seed(setup, sample_seed)), None),
    "progressive": _progressive,
    "progressive_random": _progressive_random,
}


def make_selector(model, condition: Condition, setup: AblationSetup, *, sample_seed: int = 0,
                  k: int | None = None) -> tuple[Selector, int | None]:
    """The selector of one condition (:data:`CONDITIONS`) and the k it records (static/random: ``setup.k``;
    progressive and its random control: ``k``; the per-step conditions: None)."""
    build = CONDITIONS.get(condition)
    if build is None:
        raise ValueError(f"Unknown condition {condition!r}; use one of {', '.join(CONDITIONS)}.")
    return build(model, setup, sample_seed, k)
