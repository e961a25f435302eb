"""Claim 1's parameters."""
from __future__ import annotations

from dataclasses import dataclass, field

from dynheads_tl.config import (RunSettings, Eq2Selection, NotebookConfig, StaticSource, check_int_list, check_ints,
                                check_model_sizes, check_open_unit)
from dynheads_tl.corpus import (LAYOUT_ANALYSIS_SAMPLES, LAYOUT_CALIBRATION_SAMPLES, TraceSets,
                                   check_settings, parse_setting)
from dynheads_tl.engine.models import DEFAULT_MODEL

__all__ = ["DEFAULT_STATIC_SIZES", "DynamismConfig"]

# The static-set sizes the sweep compares by default. A size at or above the model's head count would hold every
# head (nothing could fall outside it), so a smaller model's default sweep keeps only the sizes below its count
# (Gemma 3 270M, 72 heads: 20 and 50); a list a user passes is checked against the count and refused instead.
DEFAULT_STATIC_SIZES = (20, 50, 100)


@dataclass
class DynamismConfig(StaticSource, Eq2Selection, TraceSets, RunSettings, NotebookConfig):
    """The claim 1 notebook's parameters, validated: the shared trace sets (:class:`~dynheads_tl.corpus.TraceSets`)
    plus claim 1's own. Field comments are in the notebook."""

    model: str = DEFAULT_MODEL
    static_k: int = 20
    static_sizes: list[int] | None = None  # None: DEFAULT_STATIC_SIZES below the model's head count (sweep_sizes)
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    niah_settings: list[str] = field(default_factory=lambda: ["filler:500", "filler:1000", "prose:500", "prose:1000"])
    n_setting: int = LAYOUT_ANALYSIS_SAMPLES  # what notebooks 05 and 06 read per setting; thorough traces 50
    n_setting_calibration: int = LAYOUT_CALIBRATION_SAMPLES
    copy_thresholds: list[float] = field(default_factory=lambda: [0.1, 0.3, 0.5])
    soft_threshold: float = 0.3
    output_dir: str = "papers_figures"

    def __post_init__(self):
        super().__post_init__()
        check_ints(self, ("static_k", "n_setting", "n_setting_calibration"))
        check_open_unit(self, "soft_threshold")
        check_int_list(self, "seeds", minimum=0)
        if self.static_sizes is not None:
            check_int_list(self, "static_sizes", minimum=1)
        if not isinstance(self.niah_settings, list) or not self.niah_settings:
            raise ValueError(f"Parameter 'niah_settings' must be a non-empty list of 'haystack:tokens' strings, "
                             f"got {self.niah_settings!r}.")
        for spec in self.niah_settings:
            parse_setting(spec)  # each spelled 'haystack:tokens'
        if (not isinstance(self.copy_thresholds, list) or not self.copy_thresholds
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1 for v in self.copy_thresholds)):
            raise ValueError(f"Parameter 'copy_thresholds' must be a non-empty list of values in (0, 1), got {self.copy_thresholds!r}.")
        if not any(abs(float(self.soft_threshold) - float(t)) < 1e-12 for t in self.copy_thresholds):
            raise ValueError(f"Parameter 'soft_threshold' ({self.soft_threshold!r}) must be one of copy_thresholds "
                             f"{self.copy_thresholds!r}: the verdict reads the table at that threshold.")

    @property
    def sweep_sizes(self) -> list[int]:
        """The static-set sizes of the sweep: ``static_sizes`` as given, or by default those of
        :data:`DEFAULT_STATIC_SIZES` below the model's head count (read from its header, no weights loaded)."""
        if self.static_sizes is not None:
            return list(self.static_sizes)
        from dynheads_tl.engine.preflight import model_head_shape

        layers, heads = model_head_shape(self.model)
        return [size for size in DEFAULT_STATIC_SIZES if size < layers * heads]

    def context_lengths(self) -> dict[str, list[int]]:
        """The trace sets' contexts and the soft-dynamism settings' lengths."""
        contexts = super().context_lengths()
        contexts["NIAH"] = sorted({*contexts["NIAH"], *(tokens for _, tokens in self.settings)})
        return contexts

    @property
    def settings(self) -> list[tuple[str, int]]:
        """The (haystack, context length) settings of the soft-dynamism section (:func:`~dynheads_tl.corpus.parse_setting`)."""
        return [parse_setting(spec) for spec in self.niah_settings]

    def check_inputs(self) -> None:
        """The haystack, the HotpotQA file and the NIAH length against the model's window, before any model work."""
        from dynheads_tl.engine.preflight import model_context_window
        from dynheads_tl.tasks import check_context_fits, check_haystack, check_hotpot_source

        window = model_context_window(self.model)
        check_context_fits(self.context_tokens, self.max_new_tokens, window, name="context_tokens")
        check_haystack(self.haystack)
        self.check_static_source()
        check_settings(self.niah_settings, "niah_settings", self.model, self.max_new_tokens)
        # A file's calibration split is its first n_hotpot // 2 records and the analysis split the n_hotpot after
        # the first n_hotpot (see _hotpot_records), so 2 * n_hotpot usable records are needed.
        check_hotpot_source(self.hotpot_source, 2 * self.n_hotpot, skip_incomplete=self.hotpot_skip_incomplete,
                            needed_for=f"calibration {max(self.n_hotpot // 2, 1)} + analysis {self.n_hotpot}, "
                                       f"the analysis split starting at record {self.n_hotpot}")
        check_model_sizes(self.model, heads={"static_k": self.static_k, "static_sizes": self.sweep_sizes},
                          max_new_tokens=self.max_new_tokens,
                          contexts={"context_tokens": self.context_tokens, "niah_settings": self.niah_settings})
