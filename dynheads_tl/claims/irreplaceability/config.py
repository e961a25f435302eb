"""Claim 2's parameters and what its comparisons declare: the conditions, the comparisons, the primary one, the level
and the headroom floor."""
from __future__ import annotations

from dataclasses import dataclass, field

from dynheads_tl import preregistration
from dynheads_tl.config import (RunSettings, Eq2Selection, NotebookConfig, StaticSource, check_choice, check_fraction_list, check_int_list,
                                check_ints)
from dynheads_tl.corpus import TraceSettings
from dynheads_tl.engine.models import DEFAULT_MODEL

__all__ = [
    "SEEDS", "GRID_CONDITIONS", "PER_STEP_SIZED", "MIN_SAMPLES_TO_COMPARE", "GRID_MAX_OFFSET", "IrreplaceabilityConfig",
    "COMPARISONS", "PRIMARY", "ALPHA", "HEADROOM_FLOOR",
]


# Seed offsets of claim 2's own sample splits (added to a run's seed; CLAIM.seeds).
SEEDS = {
    "ablation_calibration": 5000,    # static set and k
    "ablation_grid": 6000,           # grid cells
    "distractor_pool": 6000 + 7919,  # HotpotQA distractor paragraphs of the grid
    "progressive": 7000,             # progressive-masking samples
}


# The paper's three conditions and the unmasked baseline, then our controls: the size-matched static and
# random baselines, and the parts of D_t outside / of S_20 outside D_t (see dynheads_tl.protocols.ablation).
GRID_CONDITIONS = ("none", "dynamic", "static", "random", "static_matched", "query_matched", "random_matched",
                   "dynamic_nonstatic",
                   "random_nonstatic", "static_nondynamic", "random_nondynamic")


# Conditions whose number of heads is set by D_t at each step (the others mask a fixed k, or nothing).
PER_STEP_SIZED = ("dynamic", "static_matched", "query_matched", "random_matched", "dynamic_nonstatic", "random_nonstatic",
                  "static_nondynamic", "random_nondynamic")


# A comparison needs at least this many samples per condition (the minimum per grid cell); with fewer,
# a bootstrap interval is too narrow to trust and the verdict says so instead of comparing.
MIN_SAMPLES_TO_COMPARE = 5


# NIAH grid runs start the haystack at a seeded offset below this many tokens.
GRID_MAX_OFFSET = 3000


@dataclass
class IrreplaceabilityConfig(StaticSource, Eq2Selection, TraceSettings, RunSettings, NotebookConfig):
    """The claim 2 notebook's parameters: the shared trace settings plus the grid's and the protocol's."""

    model: str = DEFAULT_MODEL
    niah_contexts: list[int] = field(default_factory=lambda: [500])
    niah_depths: list[float] = field(default_factory=lambda: [0.1, 0.9])
    hotpot_contexts: list[int] = field(default_factory=lambda: [750])
    hotpot_depths: list[float] = field(default_factory=lambda: [0.1, 0.9])
    runs_per_cell: int = 15
    n_calibration: int = 10
    progressive_k_max: int = 30
    progressive_k_step: int = 10
    n_progressive: int = 30
    progressive_context: int = 500
    ablation_mode: str = "zero"
    keep_cache: str = "clean"
    seed: int = 0
    # Generations decoded together: the runs of one grid cell (15 samples x 11 conditions; teacher-forced apart), or
    # several progressive samples' k values. Larger batches read the weights fewer times per run
    # (bench/bench_decoding.py --parts cell); memory grows with them (the KV cache of every row).
    batch_size: int = 165
    output_dir: str = "papers_figures"
    use_cache: bool = True  # reuse cached traces and ablation runs

    def __post_init__(self):
        super().__post_init__()
        check_ints(self, ("runs_per_cell", "n_calibration", "progressive_k_step", "n_progressive",
                          "progressive_context", "batch_size"))
        check_ints(self, ("progressive_k_max",), minimum=0)
        check_int_list(self, "niah_contexts", minimum=32)
        check_int_list(self, "hotpot_contexts", minimum=32)
        check_fraction_list(self, "niah_depths")
        check_fraction_list(self, "hotpot_depths")
        check_choice(self, "ablation_mode", ("zero", "mean"))
        check_choice(self, "keep_cache", ("clean", "masked"))

    def check_inputs(self) -> None:
        """Every NIAH and HotpotQA length against the model's context window, before any model work."""
        from dynheads_tl.engine.preflight import model_context_window
        from dynheads_tl.tasks import check_context_fits

        n_ctx = model_context_window(self.model)
        check_context_fits(self.niah_contexts, self.max_new_tokens, n_ctx, name="niah_contexts")
        check_context_fits(self.progressive_context, self.max_new_tokens, n_ctx, name="progressive_context")
        check_context_fits(self.hotpot_contexts, self.hotpot_max_new_tokens, n_ctx, name="hotpot_contexts")
        self.check_static_source()

    @property
    def progressive_ks(self) -> list[int]:
        return list(range(0, self.progressive_k_max + 1, self.progressive_k_step))


# Every comparison claim 2 makes: (a, b, what a masks, what b masks). The paper's two (against its fixed-k
# baselines, not size-matched), our size-matched controls, and the second (query-focused) static ranking.
COMPARISONS = (
    ("dynamic", "static", "masking D_t", "masking the static top-k"),
    ("dynamic", "random", "masking D_t", "masking k random heads"),
    ("dynamic", "random_matched", "masking D_t", "masking |D_t| random heads"),
    ("dynamic", "static_matched", "masking D_t", "masking the top-|D_t| static heads"),
    ("dynamic_nonstatic", "random_nonstatic", "masking D_t \\ S_20", "masking as many random heads from outside S_20"),
    ("dynamic_nonstatic", "random_matched", "masking D_t \\ S_20", "masking |D_t| random heads"),
    ("static_nondynamic", "random_nondynamic", "masking S_20 \\ D_t", "masking as many random heads from outside D_t"),
    ("dynamic", "query_matched", "masking D_t", "masking the query-focused top-|D_t|"),
)


# The declared primary comparison (SCIENCE 11): masking D_t against masking as many top static heads, on NIAH's
# teacher-forced drop of the gold token's log-probability (size-matched, and a continuous measure that one early
# error cannot derail). It is tested alone at ALPHA; every other comparison is secondary, Holm-corrected together.
PRIMARY = ("niah", "dynamic", "static_matched", "tf_drop")


ALPHA = preregistration.alpha()


# Headroom (SCIENCE 7): a free-generation comparison ranks conditions only when the unmasked run can lose
# something, i.e. the unmasked metric's 95% interval reaches HEADROOM_FLOOR; the teacher-forced drop always has
# headroom (it is 0 unmasked and unbounded above). Declared in preregistration.yaml (Fig 2's rule).
HEADROOM_FLOOR = float(preregistration.item_rule("irreplaceability", "Fig 2")["headroom_floor"])
