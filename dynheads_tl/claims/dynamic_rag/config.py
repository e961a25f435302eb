"""The dynamic-RAG case study's parameters (notebook 04)."""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from dynheads_tl.config import RunSettings, NotebookConfig, ProbeSettings, check_choice, check_int_list, check_ints
from dynheads_tl.protocols.rag import STRATEGIES, RagConfig
from dynheads_tl.tasks.hotpot import HOTPOT_SETTINGS, HotpotSetting

__all__ = ["RagStudyConfig", "SEEDS"]


# Seed offsets of the case study's own sample splits (added to a run's seed; CLAIM.seeds).
SEEDS = {
    "rag_evaluation": 9000,   # evaluation questions
    "rag_calibration": 9500,  # questions that set the RIND threshold
    "rag_train": 9700,        # headroom setting: static heads and probe training
}


@dataclass
class RagStudyConfig(RagConfig, ProbeSettings, RunSettings, NotebookConfig):
    """The case-study notebook's parameters: the RAG protocol's knobs (:class:`~dynheads_tl.protocols.rag.RagConfig`),
    the probe settings, and the study's own. ``rind_threshold=None`` (default) calibrates RIND's threshold on the
    setting's calibration questions (:func:`calibrate_rind`)."""

    model: str = "smollm2-135m-instruct"
    rag_setting: str = "headroom"
    n_samples: int = 30
    n_rind_calibration: int = 16
    hotpot_source: str = "synthetic"
    hotpot_skip_incomplete: bool = False
    strategies: list[str] = field(default_factory=lambda: list(STRATEGIES))
    train_seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    n_hotpot_train: int = 20
    trace_batch_size: int = 24
    output_dir: str = "papers_figures"
    use_cache: bool = True

    def __post_init__(self):
        super().__post_init__()
        check_ints(self, ("n_samples", "n_hotpot_train", "n_rind_calibration", "trace_batch_size"))
        check_int_list(self, "train_seeds", minimum=0)
        check_choice(self, "rag_setting", list(HOTPOT_SETTINGS))
        unknown = [s for s in self.strategies if s not in STRATEGIES] if isinstance(self.strategies, list) else [0]
        if unknown or not self.strategies:
            raise ValueError(f"Parameter 'strategies' must be a non-empty list drawn from {list(STRATEGIES)}, got {self.strategies!r}.")

    @property
    def setting(self) -> HotpotSetting:
        return HOTPOT_SETTINGS[self.rag_setting]

    def context_lengths(self) -> dict[str, list[int]]:
        """HotpotQA-format questions only, at the records' own lengths."""
        return {"HotpotQA": []}

    def check_inputs(self) -> None:
        """The HotpotQA file (enough usable records for every split) and the model, before any model work."""
        from dynheads_tl.engine.preflight import check_head_counts, model_context_window
        from dynheads_tl.tasks import check_hotpot_source

        model_context_window(self.model)  # an unknown model fails here, not after the notebook started
        check_head_counts(self.model, {"n_heads": self.n_heads})
        check_hotpot_source(self.hotpot_source, self.records_needed, skip_incomplete=self.hotpot_skip_incomplete,
                            needed_for=f"evaluation {self.n_samples} + RIND calibration {self.n_rind_calibration}"
                                       + (f" + probe training {len(self.train_seeds)} x {self.n_hotpot_train}"
                                          if self.rag_setting == "headroom" else ""))

    @property
    def file_offset(self) -> int:
        """Where a file's evaluation records start: after claim 1's HotpotQA splits in the multi-hop setting (its
        probe trains on records [0, n/2) and [n, 2n) with n = n_hotpot_train, see corpus._hotpot_records), at the
        first record in the headroom setting (whose training records come after evaluation and RIND's)."""
        return 2 * self.n_hotpot_train if self.rag_setting == "multihop" else 0

    @property
    def records_needed(self) -> int:
        training = len(self.train_seeds) * self.n_hotpot_train if self.rag_setting == "headroom" else 0
        return self.file_offset + self.n_samples + self.n_rind_calibration + training

    def rag_config(self, rind_threshold: float | None = None) -> RagConfig:
        """The protocol's part of these parameters, as a plain :class:`RagConfig` (``rind_threshold``: the
        calibrated value, where the parameter is None)."""
        values = {f.name: getattr(self, f.name) for f in fields(RagConfig)}
        if values["rind_threshold"] is None:
            if rind_threshold is None:
                raise ValueError("rind_threshold is None: calibrate it first (calibrate_rind) and pass the value.")
            values["rind_threshold"] = rind_threshold
        return RagConfig(**values)
