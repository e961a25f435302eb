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

A set chosen on step t's own clean pass (D_t) is partly expected to hurt step t more than a step-blind set, by
selection alone (its heads already point at the token being produced). The fair comparison masks a set known
*before* step t:

- ``previous_step``: D_{t-1}, the previous answer step's set from its clean pass;
- ``static_previous`` / ``random_previous``: as many top static heads / random heads as D_{t-1} has (its
  size-matched controls).

- ``predicted``: the probe's set, also known before step t: the top-|D_{t-1}| heads of a probe read on the
  final-norm hidden state of step t-1's clean pass (the state whose logits chose token t-1; the pass that gave
  D_{t-1}). The probe is claim 3's at lag k = 1 (hidden[n] -> step n + 1's Eq. 1 set for NIAH, its Eq. 2 scores
  for HotpotQA), trained on the calibration split only (``AblationSetup.probe``). It asks whether a set a
  deployed predictor could name before the step hurts more than as many static or random heads.

At step 0 there is no previous set: the four mask nothing there, so they cover the same steps, and their
teacher-forced comparison is read on the steps t >= 1 (``tf_drop_t1``, where the drop at step 0 is exactly 0).

Each masks nothing on a step where its set is empty (``static_nondynamic`` masks all of S_20 on a step
where D_t is empty).

**One declaration per condition.** :class:`ConditionSpec` holds a condition's name, its builder (how it selects),
its title (the figures' panel and row label), how it is sized (:data:`SIZINGS`), whether it is a panel of the
masking grid, which setup fields it needs and whether its runs record how much of D_t its set held.
:data:`CONDITIONS` is the registry, in grid order; the grid (:func:`grid_conditions`), the order, the titles
(:func:`condition_titles`) and the figure panels derive from it, so a new condition is one
:func:`register_condition` call (or one entry of :data:`_SPECS`). A spec without a title, an unknown sizing or a
name already taken is refused with a sentence.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal

from jaxtyping import Bool
from torch import Tensor

from dynheads_tl.engine.equations import Eq2Rule
from dynheads_tl.engine.hooks import AblationMode
from dynheads_tl.protocols.selectors import (previous_size, random_heads, select_dynamic, select_dynamic_nonstatic,
                                             select_fixed, select_predicted, select_previous_step, select_random_k,
                                             select_random_matched, select_random_nondynamic, select_random_nonstatic,
                                             select_static_matched, select_static_nondynamic, select_top_ranked)
from dynheads_tl.protocols.stepwise import Selector
from dynheads_tl.protocols.two_pass import CachePolicy
from dynheads_tl.tasks.common import WIDE_STRIDE, mix_seed

Condition = str  # a key of CONDITIONS


@dataclass
class AblationSetup:
    """Everything the conditions share: static set, k, protocol knobs.

    ``static_order`` (flat head indices by static score, best first) is needed by ``static_matched``; ``probe``
    by ``predicted``."""

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
    # A second static ranking (QRHead-style query-focused scores), needed by ``query_matched``.
    query_order: Tensor | None = None
    # A probe from a hidden state [d_model] to one score per head, with a ``digest`` naming its weights (claim 3's
    # lag-1 probe trained on the calibration split: analysis.head_probe.next_step_probe), needed by ``predicted``.
    probe: Callable[[Tensor], Tensor] | None = None


# (model, setup, sample_seed, k) -> (the selector, the k its runs record)
ConditionBuilder = Callable[[object, AblationSetup, int, int | None], tuple[Selector, int | None]]


def _draw_seed(setup: AblationSetup, sample_seed: int) -> int:
    """The seed of a sample's random draws: the setup's seed and the sample's."""
    return mix_seed(setup.seed, sample_seed, WIDE_STRIDE)


def _static_matched(model, setup: AblationSetup, sample_seed: int, k: int | None):
    if setup.static_order is None:
        raise ValueError("The static_matched condition needs AblationSetup.static_order (the static ranking).")
    return select_static_matched(setup.static_order), None


def _static_previous(model, setup: AblationSetup, sample_seed: int, k: int | None):
    """The static control of ``previous_step``: the top-|D_{t-1}| heads of the static ranking."""
    if setup.static_order is None:
        raise ValueError("The static_previous condition needs AblationSetup.static_order (the static ranking).")
    return select_static_matched(setup.static_order, previous_size), None


def _predicted(model, setup: AblationSetup, sample_seed: int, k: int | None):
    """The probe's top-|D_{t-1}| heads from the previous step's clean hidden state (a set known before step t)."""
    if setup.probe is None:
        raise ValueError("The predicted condition needs AblationSetup.probe (a probe trained on the calibration "
                         "split, analysis.head_probe.next_step_probe).")
    return select_predicted(setup.probe), None


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


# How many heads a condition masks at a step (the figures group their panels by it).
Sizing = Literal["none", "fixed_k", "D_t", "D_{t-1}", "part", "k"]
SIZINGS: dict[str, str] = {
    "none": "masks nothing",
    "fixed_k": "the calibration's fixed k heads at every step",
    "D_t": "as many heads as D_t at each step",
    "D_{t-1}": "as many heads as D_{t-1} at each step (nothing at step 0)",
    "part": "a part of D_t or of S_20 (or as many heads) at each step",
    "k": "the run's k heads at each step (progressive masking)",
}


@dataclass(frozen=True)
class ConditionSpec:
    """One masking condition, declared once: ``name``; ``build`` (model, setup, sample seed, k) -> (its selector,
    the k its runs record); ``title``, the figures' label for it; ``sizing``, how many heads it masks at a step
    (:data:`SIZINGS`); ``grid``, whether it is a panel of the masking grid (Fig 2 / Fig 6; the progressive
    conditions are not); ``needs``, the :class:`AblationSetup` fields it cannot be built without (the grid leaves
    it out of a run whose setup lacks one); ``overlap``, whether its teacher-forced runs also record how much of
    the actual D_t its masked set held (for a set predicted before the step: how well it predicted D_t,
    :func:`~dynheads_tl.protocols.ablation_metrics.overlap_with_dynamic`)."""

    name: str
    build: ConditionBuilder
    title: str
    sizing: Sizing
    grid: bool = True
    needs: tuple[str, ...] = field(default=())
    overlap: bool = False

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"A condition's name must be a plain identifier, got {self.name!r}.")
        if not isinstance(self.title, str) or not self.title.strip():
            raise ValueError(f"Condition {self.name!r} has no title: every condition needs one, because the "
                             "figures label its panel and its row with it.")
        if self.sizing not in SIZINGS:
            raise ValueError(f"Condition {self.name!r} has sizing {self.sizing!r}; use one of {', '.join(SIZINGS)}.")
        if not callable(self.build):
            raise ValueError(f"Condition {self.name!r} has no builder: build must be a callable "
                             "(model, setup, sample_seed, k) -> (selector, k).")
        unknown = [name for name in self.needs if name not in AblationSetup.__dataclass_fields__]
        if unknown:
            raise ValueError(f"Condition {self.name!r} needs {', '.join(unknown)}, which AblationSetup does not have.")

    def available(self, setup: AblationSetup) -> bool:
        """Whether ``setup`` has every field this condition needs."""
        return all(getattr(setup, name) is not None for name in self.needs)


_random_matched = lambda model, setup, sample_seed, k: (select_random_matched(_draw_seed(setup, sample_seed)), None)

# The paper's conditions and the unmasked baseline, then the size-matched controls, the fair comparison (sets
# known before the step: D_{t-1}, its controls and the probe's set) and the parts of D_t / S_20; then progressive
# masking (not a grid panel). The order here is the grid's, the tables' and the figures'.
_SPECS = (
    ConditionSpec("none", lambda model, setup, sample_seed, k: ((lambda view: None), None), "unmasked", "none"),
    ConditionSpec("dynamic", lambda model, setup, sample_seed, k: (select_dynamic, None), "D_t masked", "D_t"),
    ConditionSpec("static", lambda model, setup, sample_seed, k: (select_fixed(setup.static_mask), setup.k),
                  "static top-k masked", "fixed_k"),
    ConditionSpec("random", _random, "random k masked", "fixed_k"),
    ConditionSpec("static_matched", _static_matched, "static top-|D_t| masked", "D_t", needs=("static_order",)),
    ConditionSpec("query_matched", _query_matched, "query-focused top-|D_t| masked", "D_t", needs=("query_order",)),
    ConditionSpec("random_matched", _random_matched, "random |D_t| masked", "D_t"),
    ConditionSpec("previous_step", lambda model, setup, sample_seed, k: (select_previous_step, None),
                  "D_{t-1} masked (known before step t)", "D_{t-1}"),
    ConditionSpec("static_previous", _static_previous, "static top-|D_{t-1}| masked", "D_{t-1}",
                  needs=("static_order",)),
    ConditionSpec("random_previous", lambda model, setup, sample_seed, k: (
        select_random_matched(_draw_seed(setup, sample_seed), previous_size), None), "random |D_{t-1}| masked",
        "D_{t-1}"),
    ConditionSpec("predicted", _predicted, "probe's top-|D_{t-1}| masked (predicted before step t)", "D_{t-1}",
                  needs=("probe",), overlap=True),
    ConditionSpec("dynamic_nonstatic", lambda model, setup, sample_seed, k: (
        select_dynamic_nonstatic(setup.static_top20), None), "D_t \\ S_20 masked", "part"),
    ConditionSpec("random_nonstatic", lambda model, setup, sample_seed, k: (
        select_random_nonstatic(setup.static_top20, _draw_seed(setup, sample_seed)), None),
        "random |D_t \\ S_20| (outside S_20)", "part"),
    ConditionSpec("static_nondynamic", lambda model, setup, sample_seed, k: (
        select_static_nondynamic(setup.static_top20), None), "S_20 \\ D_t masked", "part"),
    ConditionSpec("random_nondynamic", lambda model, setup, sample_seed, k: (
        select_random_nondynamic(setup.static_top20, _draw_seed(setup, sample_seed)), None),
        "random |S_20 \\ D_t| (outside D_t)", "part"),
    ConditionSpec("progressive", _progressive, "top-k ranked heads masked", "k", grid=False),
    ConditionSpec("progressive_random", _progressive_random, "k random heads masked", "k", grid=False),
)

# The registry: each condition's name -> its spec, in grid order.
CONDITIONS: dict[str, ConditionSpec] = {}


def register_condition(spec: ConditionSpec) -> ConditionSpec:
    """Add ``spec`` to :data:`CONDITIONS` (after the others): the grid, the tables and the figures pick it up."""
    if not isinstance(spec, ConditionSpec):
        raise ValueError(f"register_condition takes a ConditionSpec, got {type(spec).__name__}.")
    if spec.name in CONDITIONS:
        raise ValueError(f"A condition named {spec.name!r} is already registered.")
    CONDITIONS[spec.name] = spec
    return spec


for _spec in _SPECS:
    register_condition(_spec)


def condition_spec(name: Condition) -> ConditionSpec:
    """The spec of ``name``; an unknown name is answered with the registered ones."""
    spec = CONDITIONS.get(name)
    if spec is None:
        raise ValueError(f"Unknown condition {name!r}; use one of {', '.join(CONDITIONS)}.")
    return spec


def grid_conditions(setup: AblationSetup | None = None) -> tuple[str, ...]:
    """The masking grid's conditions in order (the registry's grid panels); with ``setup``, those it can build
    (a condition whose needed field is None there is left out)."""
    return tuple(name for name, spec in CONDITIONS.items()
                 if spec.grid and (setup is None or spec.available(setup)))


def condition_titles() -> dict[str, str]:
    """Each condition's title, in the registry's order (the figures' panels and rows)."""
    return {name: spec.title for name, spec in CONDITIONS.items()}


def conditions_sized(*sizings: str) -> tuple[str, ...]:
    """The grid conditions whose sizing is one of ``sizings`` (:data:`SIZINGS`), in order."""
    unknown = [s for s in sizings if s not in SIZINGS]
    if unknown:
        raise ValueError(f"Unknown sizing {', '.join(map(repr, unknown))}; use one of {', '.join(SIZINGS)}.")
    return tuple(name for name in grid_conditions() if CONDITIONS[name].sizing in sizings)


def teacher_forced_measure(*conditions: Condition) -> str:
    """The teacher-forced column a comparison of ``conditions`` is read on: ``tf_drop`` (every gold step), or
    ``tf_drop_t1`` (steps t >= 1) when one of them cannot mask at step 0 (a D_{t-1}-sized condition), so that both
    sides cover the same steps."""
    previous = any(condition_spec(c).sizing == "D_{t-1}" for c in conditions)
    return "tf_drop_t1" if previous else "tf_drop"


def make_selector(model, condition: Condition, setup: AblationSetup, *, sample_seed: int = 0,
                  k: int | None = None) -> tuple[Selector, int | None]:
    """The selector of one condition (:data:`CONDITIONS`) and the k it records (static/random: ``setup.k``;
    progressive and its random control: ``k``; the per-step conditions: None)."""
    return condition_spec(condition).build(model, setup, sample_seed, k)
