"""Claim 1's parameters."""
from __future__ import annotations

from dynheads_tl.config import (Eq2Selection, ModelSettings, NotebookConfig, RunSettings, StaticSource,
                                check_model_sizes)
from dynheads_tl.corpus import (LAYOUT_ANALYSIS_SAMPLES, LAYOUT_CALIBRATION_SAMPLES, TraceSets, check_settings,
                                hotpot_records_needed, parse_setting, trace_set_splits)
from dynheads_tl.engine.preflight import model_context_window, model_head_shape
from dynheads_tl.params import compose, integer, integer_list, open_unit, optional, param
from dynheads_tl.tasks import check_context_fits, check_haystack, check_hotpot_source

__all__ = ["DEFAULT_STATIC_SIZES", "DynamismConfig"]

# The static-set sizes the sweep compares by default. A size at or above the model's head count would hold every
# head (nothing could fall outside it), so a smaller model's default sweep keeps only the sizes below its count
# (Gemma 3 270M, 72 heads: 20 and 50); a list a user passes is checked against the count and refused instead.
DEFAULT_STATIC_SIZES = (20, 50, 100)


def _niah_settings(name: str, value) -> None:
    if not value or not all(isinstance(spec, str) for spec in value):
        raise ValueError(f"Parameter {name!r} must be a non-empty list of 'haystack:tokens' strings, got {value!r}.")
    for spec in value:
        parse_setting(spec)  # each spelled 'haystack:tokens'


def _copy_thresholds(name: str, value) -> None:
    if not value or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1 for v in value):
        raise ValueError(f"Parameter {name!r} must be a non-empty list of values in (0, 1), got {value!r}.")


@compose(TraceSets, Eq2Selection, StaticSource, ModelSettings, RunSettings)
class DynamismConfig(NotebookConfig):
    """The claim 1 notebook's parameters, validated: the shared trace sets (:class:`~dynheads_tl.corpus.TraceSets`)
    plus claim 1's own."""

    static_k: int = param(20, "size of the static retrieval set", integer())
    static_sizes: list[int] | None = param(None, "static set sizes for the sweep; None: 20, 50 and 100, those below "
                                                 "the model's head count", optional(integer_list(minimum=1)))
    seeds: list[int] = param([0, 1, 2], "one full run per seed; the first is the headline run", integer_list(minimum=0))
    niah_settings: list[str] = param(["filler:500", "filler:1000", "essays:500", "essays:1000"],
                                     "soft dynamism: settings, 'haystack:tokens'", _niah_settings)
    n_setting: int = param(LAYOUT_ANALYSIS_SAMPLES, "soft dynamism: analysis samples per setting (random depth and "
                                                    "haystack offset; thorough: 50)", integer())
    n_setting_calibration: int = param(LAYOUT_CALIBRATION_SAMPLES, "soft dynamism: calibration samples per setting "
                                                                   "(its static set)", integer())
    copy_thresholds: list[float] = param([0.1, 0.3, 0.5], "soft dynamism: copy / evidence mass thresholds",
                                         _copy_thresholds)
    soft_threshold: float = param(0.3, "soft dynamism: the threshold the verdict reads", open_unit)
    output_dir: str = param("runs/notebooks", "where figures and tables are written (the runner passes its own)")

    def check(self) -> None:
        if not any(abs(float(self.soft_threshold) - float(t)) < 1e-12 for t in self.copy_thresholds):
            raise ValueError(f"Parameter 'soft_threshold' ({self.soft_threshold!r}) must be one of copy_thresholds "
                             f"{self.copy_thresholds!r}: the verdict reads the table at that threshold.")

    @property
    def sweep_sizes(self) -> list[int]:
        """The static-set sizes of the sweep: ``static_sizes`` as given, or by default those of
        :data:`DEFAULT_STATIC_SIZES` below the model's head count (read from its header, no weights loaded)."""
        if self.static_sizes is not None:
            return list(self.static_sizes)
        layers, heads = model_head_shape(self.model)
        return [size for size in DEFAULT_STATIC_SIZES if size < layers * heads]

    def context_lengths(self) -> dict[str, list[int]]:
        """The trace sets' contexts and the soft-dynamism settings' lengths."""
        contexts = self.part(TraceSets).context_lengths()
        contexts["NIAH"] = sorted({*contexts["NIAH"], *(tokens for _, tokens in self.settings)})
        return contexts

    @property
    def settings(self) -> list[tuple[str, int]]:
        """The (haystack, context length) settings of the soft-dynamism section (:func:`~dynheads_tl.corpus.parse_setting`)."""
        return [parse_setting(spec) for spec in self.niah_settings]

    def hotpot_splits(self) -> list[tuple[str, int, int, int]]:
        """The HotpotQA splits a real source gives this run (recorded by ``_id`` beside its results)."""
        return trace_set_splits(self.n_hotpot, self.seeds) if self.n_hotpot else []

    def check_inputs(self) -> None:
        """The haystack, the HotpotQA file and the NIAH length against the model's window, before any model work."""
        window = model_context_window(self.model)
        check_context_fits(self.context_tokens, self.max_new_tokens, window, name="context_tokens")
        check_haystack(self.haystack)
        self.check_static_source(self.model)
        check_settings(self.niah_settings, "niah_settings", self.model, self.max_new_tokens)
        # A real source gives seed s its own block of records (calibration, then analysis; corpus._hotpot_records)
        check_hotpot_source(self.hotpot_source, hotpot_records_needed(self.n_hotpot, self.seeds),
                            skip_incomplete=self.hotpot_skip_incomplete,
                            needed_for=f"calibration {max(self.n_hotpot // 2, 1)} + analysis {self.n_hotpot} per seed, "
                                       f"seeds {self.seeds}")
        check_model_sizes(self.model, heads={"static_k": self.static_k, "static_sizes": self.sweep_sizes},
                          max_new_tokens=self.max_new_tokens,
                          contexts={"context_tokens": self.context_tokens, "niah_settings": self.niah_settings})
