"""Every notebook config rejects unknown names, wrong types and impossible values with a sentence."""
from __future__ import annotations

import pytest

from dynheads_tl.claims.dynamism import DynamismConfig
from dynheads_tl.claims.irreplaceability import IrreplaceabilityConfig
from dynheads_tl.claims.correlation import PredictabilityConfig
from dynheads_tl.claims.dynamic_rag import RagStudyConfig

CONFIGS = [DynamismConfig, IrreplaceabilityConfig, PredictabilityConfig, RagStudyConfig]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.__name__)
def test_defaults_are_valid_and_unknown_names_are_rejected(config):
    config()
    with pytest.raises(ValueError, match=r"Unknown parameter\(s\) \['colour'\]; valid parameters are"):
        config.from_params({"colour": "blue"})


@pytest.mark.parametrize("config, name, value", [
    (DynamismConfig, "n_analysis", -3), (DynamismConfig, "seeds", "0,1"), (DynamismConfig, "eq2_threshold", 1.5),
    (DynamismConfig, "context_tokens", True), (DynamismConfig, "static_sizes", [20, 0]),
    (IrreplaceabilityConfig, "niah_depths", [0.5, 2]), (IrreplaceabilityConfig, "ablation_mode", "half"),
    (IrreplaceabilityConfig, "keep_cache", "both"), (IrreplaceabilityConfig, "niah_contexts", [10]),
    (IrreplaceabilityConfig, "progressive_k_max", -5),
    (PredictabilityConfig, "max_lag", 80), (PredictabilityConfig, "probe_preset", "gpu"),
    (PredictabilityConfig, "probe_hidden", [0]),
    (RagStudyConfig, "strategies", ["dynamic", "telepathy"]), (RagStudyConfig, "rind_threshold", -1),
    (RagStudyConfig, "n_samples", 0),
    # Fields of the shared parts are checked by the part, whichever notebook config nests it.
    (DynamismConfig, "sink_tokens", -1), (IrreplaceabilityConfig, "hotpot_max_new_tokens", 0),
    (PredictabilityConfig, "probe_epochs", 0), (RagStudyConfig, "probe_hidden", []),
    (RagStudyConfig, "local_window", -2), (RagStudyConfig, "n_heads", 0),
    (DynamismConfig, "trace_batch_size", 0), (IrreplaceabilityConfig, "trace_batch_size", 1.5),
    (RagStudyConfig, "trace_batch_size", -1),
])
def test_bad_values_name_the_parameter(config, name, value):
    with pytest.raises(ValueError, match=f"'{name}'"):
        config(**{name: value})


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.__name__)
def test_each_parameter_is_declared_once_with_its_help_and_check(config):
    """Claim configs compose the shared parts (trace sets, trace settings, Eq. 2 settings, probe settings, the
    RAG protocol's knobs) into one flat dataclass: every field carries a help line, and composing a part whose
    field the config also declares is refused."""
    import dataclasses

    from dynheads_tl.config import NotebookConfig, ProbeSettings
    from dynheads_tl.params import Part, compose, field_help, param

    assert all(field_help(f) for f in dataclasses.fields(config)), config
    with pytest.raises(TypeError, match="'probe_epochs' is declared by both Twice and ProbeSettings"):
        @compose(ProbeSettings)
        class Twice(NotebookConfig):
            probe_epochs: int = param(3, "again")
    assert issubclass(config, Part) and not any(issubclass(config, part) for part in config.parts)


def test_the_shared_parts_are_shared():
    from dynheads_tl.config import Eq2Settings, ModelSettings, ProbeSettings, RunSettings
    from dynheads_tl.corpus import TraceSets, TraceSettings
    from dynheads_tl.protocols.rag import RagConfig

    assert TraceSets in DynamismConfig.parts and TraceSets in PredictabilityConfig.parts
    assert TraceSettings in IrreplaceabilityConfig.parts and TraceSets not in IrreplaceabilityConfig.parts
    assert RagConfig in RagStudyConfig.parts and Eq2Settings in RagConfig.parts
    assert ProbeSettings in PredictabilityConfig.parts and ProbeSettings in RagStudyConfig.parts
    assert all({ModelSettings, RunSettings} <= set(config.parts) for config in CONFIGS)
    # The part taken out of a claim config carries the claim's values (claims 1 and 3 then share a cache key).
    assert TraceSets.of(PredictabilityConfig(n_hotpot=7, sink_tokens=2)) == TraceSets.of(DynamismConfig(n_hotpot=7, sink_tokens=2))
    assert DynamismConfig(max_new_tokens=9).trace_config("niah") == TraceSettings(max_new_tokens=9).trace_config("niah")
    assert RagStudyConfig(window=9, local_window=5).rag_config(rind_threshold=1.5) == \
        RagConfig(window=9, local_window=5, rind_threshold=1.5)
    with pytest.raises(ValueError, match="calibrate it first"):
        RagStudyConfig().rag_config()
    with pytest.raises(TypeError, match="is not composed of ProbeSettings"):
        DynamismConfig().part(ProbeSettings)


def test_the_runner_and_the_config_check_a_value_with_the_same_sentence(tmp_path):
    """``dynheads report`` checks each given value by the config's own field check before building the config."""
    from dynheads_tl.report.runner import notebook_dir, validate_overrides

    notebook = notebook_dir() / "01_dynamism.ipynb"
    for name, value in (("n_analysis", -3), ("n_analysis", "many"), ("seeds", [-1]), ("model", "")):
        with pytest.raises(ValueError) as made:
            DynamismConfig(**{name: value})
        with pytest.raises(ValueError) as checked:
            validate_overrides(notebook, {name: value})
        assert str(checked.value) == f"01_dynamism: {made.value}"


def test_the_default_model_is_named_once():
    from dynheads_tl.claims import all_claims
    from dynheads_tl.engine.models import DEFAULT_MODEL

    assert {claim.config().model for claim in all_claims()} == {DEFAULT_MODEL}


def test_the_default_static_size_sweep_fits_each_model_and_a_given_one_is_kept():
    # 270 heads (SmolLM2) hold the three default sizes; 72 (Gemma 3 270M) only those below 72, since a static set of
    # every head leaves nothing outside it
    assert DynamismConfig().sweep_sizes == [20, 50, 100]
    assert DynamismConfig(model="gemma-3-270m").sweep_sizes == [20, 50]
    assert DynamismConfig(model="gemma-3-270m", static_sizes=[10, 30]).sweep_sizes == [10, 30]


def test_each_config_names_the_contexts_its_run_reads():
    from dynheads_tl.claims.error_signal import ErrorSignalConfig
    from dynheads_tl.claims.kv_retention import RetentionConfig
    from dynheads_tl.claims.length_grid import LengthGridConfig

    assert DynamismConfig(niah_settings=["filler:500", "prose:2000"]).context_lengths() == \
        {"NIAH": [500, 1000, 2000], "HotpotQA": []}
    assert IrreplaceabilityConfig(niah_contexts=[500, 4000], progressive_context=500,
                                  hotpot_contexts=[750]).context_lengths() == {"NIAH": [500, 4000], "HotpotQA": [750]}
    assert PredictabilityConfig(context_tokens=3000).context_lengths()["NIAH"] == [3000]
    assert RagStudyConfig().context_lengths() == {"HotpotQA": []}
    assert ErrorSignalConfig(niah_settings=["prose:1000", "filler:4000"], n_hotpot=0).context_lengths() == \
        {"NIAH": [1000, 4000]}
    assert RetentionConfig(niah_setting="prose:2000").context_lengths() == {"NIAH": [2000]}
    assert LengthGridConfig(lengths=[1000, 8000, 2000]).context_lengths() == {"NIAH": [1000, 2000, 8000]}


def test_the_readme_says_the_longest_context_of_each_run():
    from dynheads_tl.report.results import contexts_phrase

    assert contexts_phrase({"HotpotQA": [], "NIAH": [500, 1000]}) == \
        "NIAH up to 1,000 tokens (500 and 1,000); HotpotQA-format"
    assert contexts_phrase({"NIAH": [1000, 2000, 8000], "HotpotQA": [750]}) == \
        "NIAH up to 8,000 tokens (1,000, 2,000 and 8,000); HotpotQA up to 750 tokens"
    assert contexts_phrase({"NIAH": [500]}) == "NIAH up to 500 tokens"
    assert contexts_phrase(None) == ""


def test_a_config_note_extends_a_parts_help_and_a_stray_note_is_refused():
    """compose(notes=...) adds what a shared parameter means in one notebook; the part's own help stays the first
    half, and a note for a field no part declares is refused with a sentence."""
    import dataclasses

    from dynheads_tl.params import Part, compose, field_help, param

    @dataclasses.dataclass
    class Shared(Part):
        steps: int = param(4, "decoding steps")

    @compose(Shared, notes={"steps": "unused here"})
    class Noted(Part):
        size: int = param(2, "a size")

    @compose(Shared)
    class Plain(Part):
        pass

    help_of = {f.name: field_help(f) for f in dataclasses.fields(Noted)}
    assert help_of == {"steps": "decoding steps; unused here", "size": "a size"}
    assert field_help(dataclasses.fields(Plain)[0]) == "decoding steps"  # the part itself is unchanged
    with pytest.raises(TypeError, match=r"notes name \['size'\], which none of its parts declares"):
        @compose(Shared, notes={"size": "x"})
        class Stray(Part):
            size: int = param(2, "a size")
