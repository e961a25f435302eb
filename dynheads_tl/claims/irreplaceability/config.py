"""Claim 2's parameters and what its comparisons declare: the conditions, the comparisons, the primary one, the level
and the headroom floor."""
from __future__ import annotations

from dynheads_tl import preregistration
from dynheads_tl.config import (Eq2Selection, HotpotSource, ModelSettings, NotebookConfig, ProbeSettings,
                                RunSettings, StaticSource, check_model_sizes)
from dynheads_tl.analysis.probes import ProbeConfig
from dynheads_tl.corpus import TraceSettings
from dynheads_tl.engine.preflight import model_context_window
from dynheads_tl.params import compose, fraction_list, integer, integer_list, one_of, param
from dynheads_tl.tasks import check_context_fits, check_hotpot_source
from dynheads_tl.protocols.conditions import conditions_sized, grid_conditions

__all__ = [
    "SEEDS", "GRID_CONDITIONS", "PER_STEP_SIZED", "MIN_SAMPLES_TO_COMPARE", "GRID_MAX_OFFSET", "IrreplaceabilityConfig",
    "COMPARISONS", "PRIMARY", "SELECTED_ON_OUTCOME", "ALPHA", "HEADROOM_FLOOR",
]


# Seed offsets of claim 2's own sample splits (added to a run's seed; CLAIM.seeds).
SEEDS = {
    "ablation_calibration": 5000,    # static set and k
    "ablation_grid": 6000,           # grid cells
    "distractor_pool": 6000 + 7919,  # HotpotQA distractor paragraphs of the grid
    "progressive": 7000,             # progressive-masking samples
}


# The grid's conditions in order, and those whose number of heads is set per step (by D_t, by D_{t-1}, or a part
# of D_t / S_20): both derive from the condition specs (dynheads_tl.protocols.conditions.CONDITIONS), where a
# new condition is declared once. The tuples are the registry at import; the pipeline reads grid_conditions() when
# it runs.
GRID_CONDITIONS = grid_conditions()
PER_STEP_SIZED = conditions_sized("D_t", "D_{t-1}", "part")


# A comparison needs at least this many samples per condition (the minimum per grid cell); with fewer,
# a bootstrap interval is too narrow to trust and the verdict says so instead of comparing.
MIN_SAMPLES_TO_COMPARE = 5


# NIAH grid runs start the haystack at a seeded offset below this many tokens.
GRID_MAX_OFFSET = 3000


@compose(TraceSettings, HotpotSource, Eq2Selection, StaticSource, ProbeSettings, ModelSettings, RunSettings,
         notes={"trace_batch_size": "here the calibration traces", "eq2_rule": "HotpotQA D_t",
                "probe_hidden": "the predicted condition's probe (claim 3's CPU recipe)",
                "probe_epochs": "the predicted condition's probe"})
class IrreplaceabilityConfig(NotebookConfig):
    """The claim 2 notebook's parameters: the shared trace settings plus the grid's and the protocol's, and the
    probe settings of the ``predicted`` condition's probe (claim 3's MLP at lag 1, trained on the calibration
    split)."""

    niah_contexts: list[int] = param([500], "Fig 2 rows: NIAH context lengths in tokens (one: every masking condition, generated and teacher-forced, must fit the time budget)", integer_list(minimum=32))
    niah_depths: list[float] = param([0.1, 0.9], "Fig 2 columns: needle depths (two: 30 samples per condition at 15 runs per cell)", fraction_list)
    hotpot_contexts: list[int] = param([750], "Fig 6 rows: HotpotQA context lengths (750: more unmasked headroom than 250)", integer_list(minimum=32))
    hotpot_depths: list[float] = param([0.1, 0.9], "Fig 6 columns: depth of the gold paragraphs", fraction_list)
    runs_per_cell: int = param(15, "samples per grid cell and depth, each generated and teacher-forced", integer())
    n_calibration: int = param(10, "samples that fix the static set and k, and train the predicted condition's probe", integer())
    progressive_k_max: int = param(30, "Fig 3 / 7: largest number of heads masked per step", integer(0))
    progressive_k_step: int = param(10, "Fig 3 / 7: step between k values (10 keeps the default within its time budget)", integer())
    n_progressive: int = param(30, "samples for progressive masking, per k", integer())
    progressive_context: int = param(500, "NIAH context length for progressive masking", integer())
    ablation_mode: str = param("zero", '"zero" or "mean" ablation of hook_z', one_of(("zero", "mean")))
    keep_cache: str = param("clean", 'which pass\'s keys/values step t leaves in the cache: "clean" or "masked"',
                            one_of(("clean", "masked")))
    seed: int = param(0, "seeds samples and the random baseline", integer(0))
    # Generations decoded together: the runs of one grid cell (15 samples x 15 conditions; teacher-forced apart), or
    # several progressive samples' k values. Larger batches read the weights fewer times per run
    # (bench/bench_decoding.py --parts cell); memory grows with them (the KV cache of every row).
    batch_size: int = param(225, "generations decoded together: a grid cell's runs in one batch, teacher-forced in "
                                 "another", integer())
    output_dir: str = param("runs/notebooks", "where figures and tables are written (the runner passes its own)")
    use_cache: bool = param(True, "reuse cached traces and ablation runs")

    def context_lengths(self) -> dict[str, list[int]]:
        """The NIAH grid's lengths and the progressive curve's, and the HotpotQA grid's lengths."""
        return {"NIAH": sorted({*self.niah_contexts, self.progressive_context}),
                "HotpotQA": sorted(set(self.hotpot_contexts))}

    def check_inputs(self) -> None:
        """Every NIAH and HotpotQA length against the model's context window, before any model work."""
        n_ctx = model_context_window(self.model)
        check_context_fits(self.niah_contexts, self.max_new_tokens, n_ctx, name="niah_contexts")
        check_context_fits(self.progressive_context, self.max_new_tokens, n_ctx, name="progressive_context")
        check_context_fits(self.hotpot_contexts, self.hotpot_max_new_tokens, n_ctx, name="hotpot_contexts")
        self.check_static_source(self.model)
        blocks = self.hotpot_blocks()
        check_hotpot_source(self.hotpot_source, max(start + n for start, n in blocks.values()),
                            skip_incomplete=self.hotpot_skip_incomplete,
                            needed_for=", ".join(f"{split} {n}" for split, (_, n) in blocks.items())
                                       + f" at seed {self.seed}")
        check_model_sizes(self.model, heads={"progressive_k_max": self.progressive_k_max},
                          max_new_tokens=self.max_new_tokens,
                          contexts={"niah_contexts": self.niah_contexts, "progressive_context": self.progressive_context})

    def hotpot_blocks(self) -> dict[str, tuple[int, int]]:
        """Each HotpotQA split's (first record, count) in a real source: calibration, the grid's cells, progressive
        masking, one after another (disjoint), the run's ``seed`` taking its own block of all three."""
        sizes = {"calibration": self.n_calibration,
                 "grid": len(self.hotpot_contexts) * len(self.hotpot_depths) * self.runs_per_cell,
                 "progressive": self.n_progressive}
        start, blocks = self.seed * sum(sizes.values()), {}
        for split, n in sizes.items():
            blocks[split] = (start, n)
            start += n
        return blocks

    def hotpot_splits(self) -> list[tuple[str, int, int, int]]:
        """The HotpotQA splits a real source gives this run (recorded by ``_id`` beside its results)."""
        return [(split, self.seed, start, n) for split, (start, n) in self.hotpot_blocks().items()]

    @property
    def progressive_ks(self) -> list[int]:
        return list(range(0, self.progressive_k_max + 1, self.progressive_k_step))

    def probe_config(self) -> ProbeConfig:
        """The ``predicted`` condition's probe: claim 3's CPU recipe (:class:`ProbeConfig`) with this notebook's
        widths and epochs, seeded by ``seed``."""
        return ProbeConfig(hidden=list(self.probe_hidden), epochs=self.probe_epochs, seed=self.seed)


# Every comparison claim 2 makes: (a, b, what a masks, what b masks). The paper's two (against its fixed-k
# baselines, not size-matched), our size-matched controls, the fair comparison (D_{t-1}, a set known before step t,
# against as many static and random heads), the probe's set (also known before step t; an exploratory secondary,
# preregistration.yaml's deviation of 2026-12-04) against the same controls, and the second (query-focused)
# static ranking. Each is read on the
# free-generation metric and on the teacher-forced drop (teacher_forced_measure: steps t >= 1 where a side is sized
# by D_{t-1}).
COMPARISONS = (
    ("dynamic", "static", "masking D_t", "masking the static top-k"),
    ("dynamic", "random", "masking D_t", "masking k random heads"),
    ("dynamic", "random_matched", "masking D_t", "masking |D_t| random heads"),
    ("dynamic", "static_matched", "masking D_t", "masking the top-|D_t| static heads"),
    ("previous_step", "static_previous", "masking D_{t-1}", "masking the top-|D_{t-1}| static heads"),
    ("previous_step", "random_previous", "masking D_{t-1}", "masking |D_{t-1}| random heads"),
    ("predicted", "static_previous", "masking the probe's predicted set", "masking the top-|D_{t-1}| static heads"),
    ("predicted", "random_previous", "masking the probe's predicted set", "masking |D_{t-1}| random heads"),
    ("dynamic_nonstatic", "random_nonstatic", "masking D_t \\ S_20", "masking as many random heads from outside S_20"),
    ("dynamic_nonstatic", "random_matched", "masking D_t \\ S_20", "masking |D_t| random heads"),
    ("static_nondynamic", "random_nondynamic", "masking S_20 \\ D_t", "masking as many random heads from outside D_t"),
    ("dynamic", "query_matched", "masking D_t", "masking the query-focused top-|D_t|"),
)


# The declared primary comparison (SCIENCE 11 and 15; preregistration.yaml, irreplaceability:
# fair_previous_step_vs_static): masking D_{t-1}, the previous step's Eq. 1 set (known before step t, so not chosen
# on step t's outcome), against masking as many top static heads (|D_{t-1}| at each step), on NIAH's teacher-forced
# drop of the gold token's log-probability over the steps t >= 1 (at t = 0 there is no previous set and both mask
# nothing). It is tested alone at ALPHA; every other comparison is secondary, Holm-corrected together, among them
# D_t against the top-|D_t| static heads (SELECTED_ON_OUTCOME: partly expected from selection alone).
PRIMARY = ("niah", "previous_step", "static_previous", "tf_drop_t1")
SELECTED_ON_OUTCOME = ("niah", "dynamic", "static_matched", "tf_drop")


ALPHA = preregistration.alpha()


# Headroom (SCIENCE 7): a free-generation comparison ranks conditions only when the unmasked run can lose
# something, i.e. the unmasked metric's 95% interval reaches HEADROOM_FLOOR; the teacher-forced drop always has
# headroom (it is 0 unmasked and unbounded above). Declared in preregistration.yaml (Fig 2's rule).
HEADROOM_FLOOR = float(preregistration.item_rule("irreplaceability", "Fig 2")["headroom_floor"])
