"""The dynamic-RAG case study's parameters (notebook 04)."""
from __future__ import annotations

from dynheads_tl.config import HotpotSource, ModelSettings, NotebookConfig, ProbeSettings, RunSettings
from dynheads_tl.corpus import hotpot_records_needed, trace_set_splits
from dynheads_tl.engine.preflight import check_head_counts, model_context_window
from dynheads_tl.params import compose, integer, integer_list, one_of, param
from dynheads_tl.protocols.rag import STRATEGIES, RagConfig
from dynheads_tl.tasks import check_hotpot_source
from dynheads_tl.tasks.hotpot import HOTPOT_SETTINGS, HotpotSetting

__all__ = ["RagStudyConfig", "SEEDS"]


# Seed offsets of the case study's own sample splits (added to a run's seed; CLAIM.seeds).
SEEDS = {
    "rag_evaluation": 9000,   # evaluation questions
    "rag_calibration": 9500,  # questions that set the RIND threshold
    "rag_train": 9700,        # headroom setting: static heads and probe training
}


def _strategies(name: str, value) -> None:
    if not value or any(s not in STRATEGIES for s in value):
        raise ValueError(f"Parameter {name!r} must be a non-empty list drawn from {list(STRATEGIES)}, got {value!r}.")


@compose(RagConfig, HotpotSource, ProbeSettings, ModelSettings, RunSettings)
class RagStudyConfig(NotebookConfig):
    """The case-study notebook's parameters: the RAG protocol's knobs (:class:`~dynheads_tl.protocols.rag.RagConfig`),
    the probe settings, and the study's own. ``rind_threshold=None`` (default) calibrates RIND's threshold on the
    setting's calibration questions (:func:`calibrate_rind`)."""

    rag_setting: str = param("headroom", '"headroom" (the gold paragraphs and one distractor, 2 worked examples) or '
                                         '"multihop" (the paper\'s: the record\'s 10 paragraphs)',
                             one_of(list(HOTPOT_SETTINGS)))
    n_samples: int = param(30, "evaluation questions (unseen by the probe and by RIND's calibration)", integer())
    n_rind_calibration: int = param(16, "questions that set RIND's threshold (answered without retrieval)", integer())
    strategies: list[str] = param(list(STRATEGIES), "strategies to run", _strategies)
    train_seeds: list[int] = param([0, 1, 2], "seeds of the training questions (static scores and the probe)",
                                   integer_list(minimum=0))
    n_hotpot_train: int = param(20, "training questions per seed (multihop: claim 1's HotpotQA analysis split size)",
                                integer())
    trace_batch_size: int = param(24, "training questions traced together when not cached (speed only)", integer())
    output_dir: str = param("runs/notebooks", "where figures and tables are written (the runner passes its own)")
    use_cache: bool = param(True, "reuse cached traces and answers")

    @property
    def setting(self) -> HotpotSetting:
        return HOTPOT_SETTINGS[self.rag_setting]

    def context_lengths(self) -> dict[str, list[int]]:
        """HotpotQA-format questions only, at the records' own lengths."""
        return {"HotpotQA": []}

    def check_inputs(self) -> None:
        """The HotpotQA file (enough usable records for every split) and the model, before any model work."""
        model_context_window(self.model)  # an unknown model fails here, not after the notebook started
        check_head_counts(self.model, {"n_heads": self.n_heads})
        check_hotpot_source(self.hotpot_source, self.records_needed, skip_incomplete=self.hotpot_skip_incomplete,
                            needed_for=f"evaluation {self.n_samples} + RIND calibration {self.n_rind_calibration}"
                                       + (f" + probe training {len(self.train_seeds)} x {self.n_hotpot_train}"
                                          if self.rag_setting == "headroom" else ""))

    @property
    def file_offset(self) -> int:
        """Where a real source's evaluation records start: after claim 1's HotpotQA splits in the multi-hop setting
        (its probe trains on seed s's block of records for each training seed, see corpus._hotpot_records), at the
        first record in the headroom setting (whose training records come after evaluation and RIND's)."""
        return hotpot_records_needed(self.n_hotpot_train, self.train_seeds) if self.rag_setting == "multihop" else 0

    def hotpot_splits(self) -> list[tuple[str, int, int, int]]:
        """(split, seed, first record, count) of every block of a real source this run reads, disjoint: in the
        multi-hop setting claim 1's splits (the probe's training), then evaluation, then RIND's calibration, then
        (headroom setting) each training seed's questions. Recorded by ``_id`` beside the results."""
        blocks = []
        if self.rag_setting == "multihop":
            blocks += [(f"train {split}", seed, start, n)
                       for split, seed, start, n in trace_set_splits(self.n_hotpot_train, self.train_seeds)]
        start = self.file_offset
        blocks += [("evaluation", self.seed, start, self.n_samples),
                   ("rind", self.seed, start + self.n_samples, self.n_rind_calibration)]
        if self.rag_setting == "headroom":
            start += self.n_samples + self.n_rind_calibration
            blocks += [("train", seed, start + index * self.n_hotpot_train, self.n_hotpot_train)
                       for index, seed in enumerate(self.train_seeds)]
        return blocks

    @property
    def records_needed(self) -> int:
        return max((start + n for _, _, start, n in self.hotpot_splits()), default=0)

    def rag_config(self, rind_threshold: float | None = None) -> RagConfig:
        """The protocol's part of these parameters, as a plain :class:`RagConfig` (``rind_threshold``: the
        calibrated value, where the parameter is None)."""
        threshold = self.rind_threshold
        if threshold is None:
            if rind_threshold is None:
                raise ValueError("rind_threshold is None: calibrate it first (calibrate_rind) and pass the value.")
            threshold = rind_threshold
        return RagConfig.of(self, rind_threshold=threshold)
