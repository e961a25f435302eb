"""Notebook 06's parameters."""
from __future__ import annotations

from dataclasses import dataclass, field

from dynheads_tl.config import RunSettings, NotebookConfig, StaticSource, check_ints, check_model_sizes
from dynheads_tl.corpus import (LAYOUT_ANALYSIS_SAMPLES, LAYOUT_CALIBRATION_SAMPLES, TraceSettings,
                                   check_settings, parse_setting)
from dynheads_tl.protocols.retention import STRATEGIES

__all__ = ["SEEDS", "RetentionConfig", "QUERY_STATIC"]


# Seed offsets of notebook 06's own sample splits (added to a run's seed; CLAIM.seeds).
SEEDS = {"retention": 13000}  # NIAH answers under per-step KV retention


@dataclass
class RetentionConfig(StaticSource, TraceSettings, RunSettings, NotebookConfig):
    """Notebook 06's parameters. The NIAH setting (``niah_setting``, spelled ``"haystack:context_tokens"`` as in
    notebooks 01 and 05: :func:`~dynheads_tl.corpus.parse_setting`) is traced as notebook 01's
    soft-dynamism settings are (``n_setting_calibration`` + ``n_setting`` answers, read from its cache), for the
    static scores and the probe; ``n_samples`` new answers of the same setting are evaluated. ``budgets``: shares
    of the query heads (``"query"``) or KV heads (``"kv"``) kept whole at every step. ``sink_tokens`` and
    ``local_window`` are what a restricted head still sees."""

    model: str = "smollm2-135m-instruct"
    niah_setting: str = "filler:500"
    n_setting: int = LAYOUT_ANALYSIS_SAMPLES
    n_setting_calibration: int = LAYOUT_CALIBRATION_SAMPLES
    n_samples: int = 30
    budgets: list[float] = field(default_factory=lambda: [0.05, 0.1, 0.25, 0.5])
    strategies: list[str] = field(default_factory=lambda: ["static", "query_static", "predicted", "oracle", "random"])
    granularities: list[str] = field(default_factory=lambda: ["kv"])
    seed: int = 0
    batch_size: int = 180
    output_dir: str = "papers_figures"
    use_cache: bool = True

    def __post_init__(self):
        super().__post_init__()
        check_ints(self, ("n_setting", "n_setting_calibration", "n_samples", "batch_size"))
        parse_setting(self.niah_setting)  # spelled 'haystack:tokens'

        check_ints(self, ("seed",), minimum=0)
        if self.sink_tokens + self.local_window < 1:
            raise ValueError("sink_tokens + local_window must be at least 1: a restricted head needs some key to read.")
        if (not isinstance(self.budgets, list) or not self.budgets
                or not all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 < b < 1 for b in self.budgets)):
            raise ValueError(f"Parameter 'budgets' must be a non-empty list of shares in (0, 1), got {self.budgets!r}.")
        per_step = [s for s in STRATEGIES if s not in ("streaming", "full")] + [QUERY_STATIC]
        if not isinstance(self.strategies, list) or not self.strategies or any(s not in per_step for s in self.strategies):
            raise ValueError(f"Parameter 'strategies' must be a non-empty list drawn from {per_step} (streaming and "
                             f"the full cache always run), got {self.strategies!r}.")
        if (not isinstance(self.granularities, list) or not self.granularities
                or any(g not in ("query", "kv") for g in self.granularities)):
            raise ValueError(f"Parameter 'granularities' must be a non-empty list drawn from ['query', 'kv'], "
                             f"got {self.granularities!r}.")

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
        self.check_static_source()
        check_model_sizes(self.model, max_new_tokens=self.max_new_tokens, contexts={"niah_setting": [self.niah_setting]})


QUERY_STATIC = "query_static"  # a fixed set ranked by QRHead-style query-focused scores
