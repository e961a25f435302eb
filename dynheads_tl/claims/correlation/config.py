"""Claim 3's parameters, and what its tests declare: the level, the primary comparison and the metrics' names."""
from __future__ import annotations

from dataclasses import dataclass, field

from dynheads_tl import preregistration
from dynheads_tl.config import (RunSettings, NotebookConfig, ProbeSettings, check_choice, check_int_list, check_ints,
                                check_model_sizes)
from dynheads_tl.analysis.correlation import LEAD_KS, MIN_PROBE_TEST_SAMPLES, ProbeConfig
from dynheads_tl.corpus import TraceSets
from dynheads_tl.engine.models import DEFAULT_MODEL

__all__ = ["ALPHA", "METRIC_LABELS", "PRIMARY", "PredictabilityConfig"]


ALPHA = preregistration.alpha()  # the primary's level, and the family-wise level of every Holm-adjusted secondary


METRIC_LABELS = {"f1": "F1", "auprc": "AUPRC", "r2": "R²"}


# claim 3's declared primary comparison: this task and metric at the first lag ahead, the probe against the
# step-and-token prior (lag_tests)
PRIMARY = ("niah", "f1")


@dataclass
class PredictabilityConfig(TraceSets, ProbeSettings, RunSettings, NotebookConfig):
    """The claim 3 notebook's parameters: claim 1's trace sets (its cached traces are read), the probe
    settings, and claim 3's own."""

    model: str = DEFAULT_MODEL
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    max_lag: int = 10
    probe_preset: str = "cpu"
    split_seed: int = 0
    lead_ks: list[int] = field(default_factory=lambda: list(LEAD_KS))
    n_splits: int = 5
    probe_min_test: int = MIN_PROBE_TEST_SAMPLES
    output_dir: str = "papers_figures"

    def __post_init__(self):
        super().__post_init__()
        check_ints(self, ("max_lag",), minimum=0)
        if self.max_lag > 50:
            raise ValueError(f"Parameter 'max_lag' must be at most 50, got {self.max_lag!r}.")
        check_choice(self, "probe_preset", ("cpu", "paper"))
        check_int_list(self, "seeds", minimum=0)
        check_int_list(self, "lead_ks", minimum=0)
        check_ints(self, ("n_splits", "probe_min_test"))
        check_ints(self, ("split_seed",), minimum=0)
        if self.n_splits < 2:
            raise ValueError(f"Parameter 'n_splits' must be at least 2 (an interval needs two splits), got {self.n_splits!r}.")

    def check_inputs(self) -> None:
        """The haystack and the NIAH length against the model's context window, before any model work."""
        from dynheads_tl.engine.preflight import model_context_window
        from dynheads_tl.tasks import check_context_fits, check_haystack, check_hotpot_source

        check_context_fits(self.context_tokens, self.max_new_tokens, model_context_window(self.model),
                           name="context_tokens")
        check_haystack(self.haystack)
        check_hotpot_source(self.hotpot_source, 2 * self.n_hotpot, skip_incomplete=self.hotpot_skip_incomplete,
                            needed_for=f"claim 1's calibration {max(self.n_hotpot // 2, 1)} + analysis {self.n_hotpot}")
        check_model_sizes(self.model, max_new_tokens=self.max_new_tokens, contexts={"context_tokens": self.context_tokens})

    def probe_config(self) -> ProbeConfig:
        if self.probe_preset == "paper":
            return ProbeConfig.paper()
        return ProbeConfig(hidden=list(self.probe_hidden), epochs=self.probe_epochs, seed=self.split_seed)
