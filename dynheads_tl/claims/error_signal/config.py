"""Notebook 05's parameters, and what its comparisons declare: the feature groups, the comparisons, the primary one,
the level and the smallest class a setting needs."""
from __future__ import annotations

from dynheads_tl import preregistration
from dynheads_tl.config import HotpotSource, ModelSettings, NotebookConfig, RunSettings, check_model_sizes
from dynheads_tl.corpus import (LAYOUT_ANALYSIS_SAMPLES, LAYOUT_CALIBRATION_SAMPLES, TraceSettings, check_settings,
                                parse_setting)
from dynheads_tl.params import compose, integer, one_of, param
from dynheads_tl.tasks.hotpot import HOTPOT_SETTINGS
from dynheads_tl.tasks.hotpot_sources import check_hotpot_source
from dynheads_tl.tasks.real_data import data_file

__all__ = [
    "SEEDS", "DYNAMIC_FEATURES", "CONTEXT_FEATURES", "LOGIT_FEATURES", "GROUPS", "UNTRAINED_GROUPS", "POOLED_GROUPS",
    "GROUP_NAMES", "COMPARISONS", "PRIMARY", "MIN_PER_CLASS", "ALPHA", "ErrorSignalConfig", "setting_name",
    "hotpot_setting_name", "SQUAD_SETTING", "SEPARATE_SETTINGS",
]


# Seed offsets of notebook 05's own sample splits (added to a run's seed; CLAIM.seeds).
SEEDS = {"error_signal": 12000,  # HotpotQA answers, right and wrong
         "squad": 19000}         # SQuAD 2.0 paragraphs (answerable and unanswerable questions)

# The SQuAD 2.0 setting's name: a secondary setting of its own (preregistration.yaml's real-data deviation, (4)),
# left out of the pooled answers the primary reads; within it the same comparisons, Holm with the secondaries.
SQUAD_SETTING = "SQuAD 2.0 (answerable and unanswerable)"
SEPARATE_SETTINGS = (SQUAD_SETTING,)


DYNAMIC_FEATURES = ("dt_size", "dt_active_share", "dt_evidence_mass", "static_evidence_mass", "active_set_entropy",
                    "eq2_max", "eq2_top10", "probe_gap")


# The same idea without knowing where the true evidence is (what a deployed detector has): D_t counted over the
# whole context span, heads' attention mass on the context, static heads ranked by that copy rate.
CONTEXT_FEATURES = ("ctx_dt_size", "ctx_dt_active_share", "ctx_dt_context_mass", "ctx_static_context_mass",
                    "ctx_active_set_entropy")


LOGIT_FEATURES = ("logprob_mean", "logprob_min", "entropy_mean", "entropy_max")


GROUPS = ("dynamic", "dynamic_ctx", "lookback", "logit", "dynamic+logit")


# Detectors that need no training: scored as they are, beside the classifiers.
UNTRAINED_GROUPS = ("string_match",)


# The pooled evaluation adds a classifier that knows only which setting an answer came from: settings differ in
# error rate, so any feature that recognises the setting scores above 0.5 on pooled answers.
POOLED_GROUPS = GROUPS + ("setting",)


GROUP_NAMES = {"dynamic": "Dynamic-head features (knowing the evidence)",
               "dynamic_ctx": "Dynamic-head features (context only)", "lookback": "Lookback ratio (per head)",
               "logit": "Logit (probability, entropy)", "dynamic+logit": "Dynamic-head + logit",
               "setting": "Setting only (one-hot)", "string_match": "Answer-in-context string match"}


# Every paired comparison the verdict reads: (a, b) = a's AUROC minus b's, pooled and within each setting.
COMPARISONS = (("dynamic", "lookback"), ("dynamic", "logit"), ("dynamic", "string_match"),
               ("dynamic_ctx", "lookback"), ("dynamic_ctx", "logit"), ("dynamic_ctx", "string_match"),
               ("dynamic+logit", "logit"))


def _declared_primary() -> tuple[str, str, str]:
    """Claim 5's primary as the pre-registration file declares it (its id "<a>_vs_<b>", pooled over settings)."""
    declared = preregistration.primary("error_signal")["id"]
    a, sep, b = declared.partition("_vs_")
    if not sep or a not in GROUPS or b not in GROUPS + UNTRAINED_GROUPS:
        raise preregistration.PreregistrationError(
            f"Claim error_signal's declared primary {declared!r} does not name two feature groups as '<a>_vs_<b>'.")
    return ("pooled", a, b)


PRIMARY = _declared_primary()  # claim 5's declared primary comparison (scope, a, b), read from preregistration.yaml


MIN_PER_CLASS = 10  # a setting with fewer wrong (or right) answers is too easy (too hard) to evaluate a detector


ALPHA = preregistration.alpha()


# --- the notebook's pipeline ------------------------------------------------------------------------
def _niah_settings(name: str, value) -> None:
    if not all(isinstance(spec, str) for spec in value):
        raise ValueError(f"Parameter {name!r} must be a list of 'haystack:tokens' strings, got {value!r}.")
    names = [setting_name(spec) for spec in value]
    if len(set(names)) < len(names):
        raise ValueError(f"Parameter {name!r} names a setting twice: {value!r}.")


@compose(TraceSettings, HotpotSource, ModelSettings, RunSettings)
class ErrorSignalConfig(NotebookConfig):
    """Notebook 05's parameters. NIAH settings are ``"haystack:context_tokens"`` strings; each is traced as
    notebook 01's soft-dynamism settings are (random depth and haystack offset, ``n_setting_calibration`` +
    ``n_setting`` samples, both pooled here), so a setting that notebook 01 ran is read from its cache.
    ``n_hotpot``: HotpotQA-format answers of the headroom setting (0 leaves them out)."""

    niah_settings: list[str] = param(["essays:1000", "filler:1000"], "NIAH settings as haystack:context_tokens "
                                                                     "(essays, prose, filler, folder:PATH)", _niah_settings)
    n_setting: int = param(LAYOUT_ANALYSIS_SAMPLES, "NIAH answers per setting, analysis split (the answers notebook 01 traced are read from the cache)", integer())
    n_setting_calibration: int = param(LAYOUT_CALIBRATION_SAMPLES, "NIAH answers per setting, calibration split",
                                       integer())
    n_hotpot: int = param(40, "HotpotQA answers of the headroom setting (records [seed x n, (seed + 1) x n) of a real "
                              "source); 0 leaves them out",
                          integer(0))
    n_squad: int = param(30, "SQuAD 2.0 dev questions of each kind (answerable, unanswerable), one of each per "
                             "paragraph: a secondary setting of its own, out of the pooled primary; 0 leaves it out",
                         integer(0))
    hotpot_setting: str = param("headroom", "headroom (the gold paragraphs and one distractor, two worked examples) "
                                            "or multihop",
                                one_of(list(HOTPOT_SETTINGS)))
    static_k: int = param(20, "static heads whose evidence mass is a feature (top by Eq. 1 rate on the training answers)", integer())
    n_folds: int = param(5, "stratified folds over answers", integer(2))
    seed: int = param(0, "seeds the samples, the folds and the bootstrap", integer(0))
    output_dir: str = param("runs/notebooks", "where figures and tables are written (the runner passes its own)")
    use_cache: bool = param(True, "reuse cached traces")

    def check(self) -> None:
        if not self.niah_settings and self.n_hotpot == 0:
            raise ValueError("No pooled data: give at least one NIAH setting or n_hotpot > 0 (SQuAD 2.0, n_squad, is "
                             "a setting of its own, never pooled).")

    def context_lengths(self) -> dict[str, list[int]]:
        """The NIAH settings' lengths, and HotpotQA (the records' own lengths) when it has answers."""
        return {"NIAH": sorted({parse_setting(spec)[1] for spec in self.niah_settings}),
                **({"HotpotQA": []} if self.n_hotpot > 0 else {})}

    def hotpot_splits(self) -> list[tuple[str, int, int, int]]:
        """The HotpotQA answers' block of a real source (recorded by ``_id`` beside the results)."""
        return [("answers", self.seed, self.seed * self.n_hotpot, self.n_hotpot)] if self.n_hotpot else []

    def check_inputs(self) -> None:
        """Each NIAH setting's haystack, and its length against the model's window (the one check every notebook's
        settings get: :func:`~dynheads_tl.corpus.check_settings`)."""
        if self.niah_settings:
            check_settings(self.niah_settings, "niah_settings", self.model, self.max_new_tokens)
        if self.n_hotpot:
            check_hotpot_source(self.hotpot_source, (self.seed + 1) * self.n_hotpot,
                                skip_incomplete=self.hotpot_skip_incomplete,
                                needed_for=f"{self.n_hotpot} answers at seed {self.seed}")
        if self.n_squad:
            data_file("squad")  # installed, or an error with the install command, before any model work
        check_model_sizes(self.model, heads={"static_k": self.static_k},
                          max_new_tokens=self.max_new_tokens if self.niah_settings else None,
                          contexts={"niah_settings": self.niah_settings})


def hotpot_setting_name(setting: str, source: str) -> str:
    """The name of the HotpotQA answers' setting in every table: synthetic questions say so."""
    return f"HotpotQA {setting}" + (" (synthetic)" if source == "synthetic" else "")


def setting_name(spec: str) -> str:
    haystack, tokens = parse_setting(spec)
    return f"NIAH {haystack} {tokens}"
