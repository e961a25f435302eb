"""Claim 3's parameters, and what its tests declare: the level, the primary comparison and the metrics' names."""
from __future__ import annotations

from dynheads_tl import preregistration
from dynheads_tl.analysis.correlation import LEAD_KS, MIN_PROBE_TEST_SAMPLES, ProbeConfig
from dynheads_tl.config import ModelSettings, NotebookConfig, ProbeSettings, RunSettings, check_model_sizes
from dynheads_tl.corpus import TraceSets, hotpot_records_needed, trace_set_splits
from dynheads_tl.engine.preflight import model_context_window
from dynheads_tl.params import compose, integer, integer_list, one_of, param
from dynheads_tl.tasks import check_context_fits, check_haystack, check_hotpot_source

__all__ = ["ALPHA", "METRIC_LABELS", "PRIMARY", "PredictabilityConfig"]


ALPHA = preregistration.alpha()  # the primary's level, and the family-wise level of every Holm-adjusted secondary


METRIC_LABELS = {"f1": "F1", "auprc": "AUPRC", "r2": "R²"}


# claim 3's declared primary comparison: this task and metric at the first lag ahead, the probe against the
# step-and-token prior (lag_tests)
PRIMARY = ("niah", "f1")


def _max_lag(name: str, value) -> None:
    integer(0)(name, value)
    if value > 50:
        raise ValueError(f"Parameter {name!r} must be at most 50, got {value!r}.")


def _n_splits(name: str, value) -> None:
    integer()(name, value)
    if value < 2:
        raise ValueError(f"Parameter {name!r} must be at least 2 (an interval needs two splits), got {value!r}.")


@compose(TraceSets, ProbeSettings, ModelSettings, RunSettings,
         notes={**{name: "as in notebook 01, whose traces are reused" for name in
                   ("context_tokens", "haystack", "n_calibration", "n_analysis", "n_hotpot", "hotpot_source",
                    "hotpot_skip_incomplete")},
                **{name: 'used with probe_preset "cpu"' for name in ("probe_hidden", "probe_epochs")}})
class PredictabilityConfig(NotebookConfig):
    """The claim 3 notebook's parameters: claim 1's trace sets (its cached traces are read), the probe
    settings, and claim 3's own."""

    seeds: list[int] = param([0, 1, 2], "seeds whose samples are pooled", integer_list(minimum=0))
    max_lag: int = param(10, "largest lag k between hidden state and scores", _max_lag)
    probe_preset: str = param("cpu", '"cpu" (the small MLP of probe_hidden, probe_epochs) or "paper" (MLP [8192, '
                                     '4096, 4096], 100 epochs)', one_of(("cpu", "paper")))
    split_seed: int = param(0, "seeds the splits by layout and probe initialisation (the first of n_splits)",
                            integer(0))
    lead_ks: list[int] = param(list(LEAD_KS), "lags k of the residualised CCA and of the probes k steps ahead",
                               integer_list(minimum=0))
    n_splits: int = param(5, "splits by layout that every interval is taken over", _n_splits)
    probe_min_test: int = param(MIN_PROBE_TEST_SAMPLES, "probe test parts hold at least this many samples where "
                                                        "the data allow", integer())
    output_dir: str = param("runs/notebooks", "where figures and tables are written (the runner passes its own)")

    def hotpot_splits(self) -> list[tuple[str, int, int, int]]:
        """The HotpotQA splits a real source gives this run: claim 1's (recorded by ``_id`` beside its results)."""
        return trace_set_splits(self.n_hotpot, self.seeds) if self.n_hotpot else []

    def check_inputs(self) -> None:
        """The haystack and the NIAH length against the model's context window, before any model work."""
        check_context_fits(self.context_tokens, self.max_new_tokens, model_context_window(self.model),
                           name="context_tokens")
        check_haystack(self.haystack)
        check_hotpot_source(self.hotpot_source, hotpot_records_needed(self.n_hotpot, self.seeds),
                            skip_incomplete=self.hotpot_skip_incomplete,
                            needed_for=f"claim 1's calibration {max(self.n_hotpot // 2, 1)} + analysis "
                                       f"{self.n_hotpot} per seed, seeds {self.seeds}")
        check_model_sizes(self.model, max_new_tokens=self.max_new_tokens, contexts={"context_tokens": self.context_tokens})

    def probe_config(self) -> ProbeConfig:
        if self.probe_preset == "paper":
            return ProbeConfig.paper()
        return ProbeConfig(hidden=list(self.probe_hidden), epochs=self.probe_epochs, seed=self.split_seed)
