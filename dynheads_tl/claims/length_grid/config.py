"""Notebook 07's parameters: the length x depth grid, its haystack, and what each cell runs."""
from __future__ import annotations

from dataclasses import dataclass, field

from dynheads_tl.config import (RunSettings, NotebookConfig, check_fraction_list, check_int_list, check_ints)
from dynheads_tl.corpus import TraceSettings
from dynheads_tl.engine.models import DEFAULT_MODEL

__all__ = ["SEEDS", "GRID_CONDITIONS", "PREVIOUS_CONDITION", "PREVIOUS_BASELINE", "EASY_CONTROL",
           "LengthGridConfig"]


# Seed offsets of notebook 07's own sample splits (added to a run's seed; CLAIM.seeds).
SEEDS = {
    "length_calibration": 14000,  # the static sets (Wu's and the query-focused), one split over the grid's lengths
    "length_grid": 15000,         # the grid's samples (UUIDs) and each (length, run)'s haystack offset
}


# Claim 2's conditions on the grid: unmasked, D_t, and D_t's size-matched static and random controls.
GRID_CONDITIONS = ("none", "dynamic", "static_matched", "random_matched")
# The fair comparison (a set known before the step, D_{t-1}) and its size-matched static control, run when the
# condition registry (protocols/conditions.py) has them, looked up by these names.
PREVIOUS_CONDITION = "previous_step"
PREVIOUS_BASELINE = "static_previous"  # the top-|D_{t-1}| static heads (claim 2's fair control)


# The haystack of five repeated sentences: the easy control, labelled so wherever it is run.
EASY_CONTROL = "filler"


@dataclass
class LengthGridConfig(TraceSettings, RunSettings, NotebookConfig):
    """The length x depth grid's parameters. ``lengths`` (context tokens) x ``depths`` (needle positions, 0 = the
    start, 1 = the end) x ``runs_per_cell`` samples; the runs of one (length, run) share a haystack offset, so
    the rows of one length share the haystack up to their needle (prefix sharing). ``haystack``: ``prose`` (real
    text, the default), ``folder:PATH`` (e.g. the Paul Graham essays), or ``filler`` (the easy control, labelled so).
    ``n_calibration`` samples at random layouts over the same lengths (their own seeds) give the two static sets:
    Wu et al.'s score and the query-focused one. ``batch_size``: rows decoded together in the masking runs (a
    cell's samples x conditions)."""

    model: str = DEFAULT_MODEL
    haystack: str = "prose"
    lengths: list[int] = field(default_factory=lambda: [1000, 2000])
    depths: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    runs_per_cell: int = 1
    n_calibration: int = 6
    static_k: int = 20
    max_offset: int = 3000
    masking: bool = True
    ablation_mode: str = "zero"
    seed: int = 0
    n_resamples: int = 2000
    batch_size: int = 64
    output_dir: str = "papers_figures"
    use_cache: bool = True

    def __post_init__(self):
        super().__post_init__()
        check_ints(self, ("runs_per_cell", "n_calibration", "static_k", "max_offset", "n_resamples", "batch_size"))
        check_ints(self, ("seed",), minimum=0)
        check_int_list(self, "lengths", minimum=16)
        check_fraction_list(self, "depths")
        if len(set(self.lengths)) != len(self.lengths) or len(set(self.depths)) != len(self.depths):
            raise ValueError(f"Parameters 'lengths' and 'depths' must not repeat a value, got {self.lengths!r} and "
                             f"{self.depths!r}.")
        if not isinstance(self.masking, bool):
            raise ValueError(f"Parameter 'masking' must be True or False, got {self.masking!r}.")
        if self.ablation_mode not in ("zero", "mean"):
            raise ValueError(f"Parameter 'ablation_mode' must be 'zero' or 'mean', got {self.ablation_mode!r}.")
        if self.ablation_mode == "mean":
            raise ValueError("Parameter 'ablation_mode' 'mean' is not run on the length grid (a mean output per "
                             "length would be one more calibration); use 'zero'.")

    @property
    def easy_control(self) -> bool:
        """Whether the haystack is the filler: every table, figure and verdict then says "easy control"."""
        return self.haystack == EASY_CONTROL

    @property
    def haystack_label(self) -> str:
        return f"{self.haystack} (the easy control)" if self.easy_control else self.haystack

    def context_lengths(self) -> dict[str, list[int]]:
        return {"NIAH": sorted(set(self.lengths))}

    def check_inputs(self) -> None:
        """The haystack, and every length against the model's context window (read from its config, no model
        loaded), before any model work."""
        from dynheads_tl.engine.preflight import model_context_window
        from dynheads_tl.tasks import check_context_fits, check_haystack

        if str(self.haystack).startswith(("wu:", "wu-base:", "wu-chat:")):
            raise ValueError(f"Parameter 'haystack' {self.haystack!r} is Wu et al.'s detection set, whose needles "
                             "and depths are its own; the grid takes 'prose', 'folder:PATH' or 'filler'.")
        check_haystack(self.haystack)
        check_context_fits(self.lengths, self.max_new_tokens, model_context_window(self.model), name="lengths")
