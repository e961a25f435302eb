"""Notebook 06's parameters."""
from __future__ import annotations

from dynheads_tl.config import ModelSettings, NotebookConfig, RunSettings, StaticSource, check_model_sizes
from dynheads_tl.corpus import (LAYOUT_ANALYSIS_SAMPLES, LAYOUT_CALIBRATION_SAMPLES, TraceSettings, check_settings,
                                parse_setting)
from dynheads_tl.params import compose, integer, param
from dynheads_tl.protocols.retention import STRATEGIES

__all__ = ["SEEDS", "RetentionConfig", "QUERY_STATIC"]


# Seed offsets of notebook 06's own sample splits (added to a run's seed; CLAIM.seeds).
SEEDS = {"retention": 13000}  # NIAH answers under per-step KV retention


QUERY_STATIC = "query_static"  # a fixed set ranked by QRHead-style query-focused scores
PER_STEP_STRATEGIES = [s for s in STRATEGIES if s not in ("streaming", "full")] + [QUERY_STATIC]


def _niah_setting(name: str, value) -> None:
    parse_setting(value)  # spelled 'haystack:tokens'


def _budgets(name: str, value) -> None:
    if not value or not all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 < b < 1 for b in value):
        raise ValueError(f"Parameter {name!r} must be a non-empty list of shares in (0, 1), got {value!r}.")


def _strategies(name: str, value) -> None:
    if not value or any(s not in PER_STEP_STRATEGIES for s in value):
        raise ValueError(f"Parameter {name!r} must be a non-empty list drawn from {PER_STEP_STRATEGIES} (streaming "
                         f"and the full cache always run), got {value!r}.")


def _granularities(name: str, value) -> None:
    if not value or any(g not in ("query", "kv") for g in value):
        raise ValueError(f"Parameter {name!r} must be a non-empty list drawn from ['query', 'kv'], got {value!r}.")


@compose(TraceSettings, StaticSource, ModelSettings, RunSettings,
         notes={"sink_tokens": "here also the leading positions a restricted head keeps",
                "local_window": "here also the most recent positions a restricted head keeps",
                "trace_batch_size": "here the training answers",
                "hotpot_max_new_tokens": "unused here (a shared trace setting)"})
class RetentionConfig(NotebookConfig):
    """Notebook 06's parameters. The NIAH setting (``niah_setting``, spelled ``"haystack:context_tokens"`` as in
    notebooks 01 and 05: :func:`~dynheads_tl.corpus.parse_setting`) is traced as notebook 01's
    soft-dynamism settings are (``n_setting_calibration`` + ``n_setting`` answers, read from its cache), for the
    static scores and the probe; ``n_samples`` new answers of the same setting are evaluated. ``budgets``: shares
    of the query heads (``"query"``) or KV heads (``"kv"``) kept whole at every step. ``sink_tokens`` and
    ``local_window`` are what a restricted head still sees."""

    niah_setting: str = param("filler:500", "'haystack:tokens' (filler, prose, folder:PATH or wu:PATH); a notebook 01 "
                                            "setting shares its traces", _niah_setting)
    n_setting: int = param(LAYOUT_ANALYSIS_SAMPLES, "training answers, analysis split (the answers notebook 01 traced are read from the cache)", integer())
    n_setting_calibration: int = param(LAYOUT_CALIBRATION_SAMPLES, "training answers, calibration split (the static "
                                                                   "scores)", integer())
    n_samples: int = param(30, "new NIAH answers evaluated under every condition", integer())
    budgets: list[float] = param([0.05, 0.1, 0.25, 0.5], "shares of heads kept whole at each step (the paper preset adds 1% and 2%)", _budgets)
    strategies: list[str] = param(["static", "query_static", "predicted", "oracle", "random"],
                                  "per-step strategies; streaming and full always run", _strategies)
    granularities: list[str] = param(["kv"], 'budgets in KV heads ("kv"; a KV head kept whole keeps its query heads) or single query heads ("query"; the thorough preset adds it)',
                                     _granularities)
    seed: int = param(0, "seeds the samples and, with the sample, the random strategy's draws", integer(0))
    batch_size: int = param(180, "rows decoded together (the conditions of as many samples as fit)", integer())
    output_dir: str = param("runs/notebooks", "where figures and tables are written (the runner passes its own)")
    use_cache: bool = param(True, "reuse cached traces and runs")

    def check(self) -> None:
        if self.sink_tokens + self.local_window < 1:
            raise ValueError("sink_tokens + local_window must be at least 1: a restricted head needs some key to read.")

    @property
    def haystack(self) -> str:
        return parse_setting(self.niah_setting)[0]

    @property
    def context_tokens(self) -> int:
        return parse_setting(self.niah_setting)[1]

    def context_lengths(self) -> dict[str, list[int]]:
        return {"NIAH": [parse_setting(self.niah_setting)[1]]}

    def check_inputs(self) -> None:
        """The setting's haystack and its length against the model's window (:func:`~dynheads_tl.corpus.check_settings`),
        and the static-source file."""
        check_settings([self.niah_setting], "niah_setting", self.model, self.max_new_tokens)
        self.check_static_source(self.model)
        check_model_sizes(self.model, max_new_tokens=self.max_new_tokens, contexts={"niah_setting": [self.niah_setting]})
