"""Every notebook config rejects unknown names, wrong types and impossible values with a sentence."""
from __future__ import annotations

import pytest

from dynheads_tl.claims.dynamism import DynamismConfig
from dynheads_tl.claims.irreplaceability import IrreplaceabilityConfig
from dynheads_tl.claims.predictability import PredictabilityConfig
from dynheads_tl.claims.rag_study import RagStudyConfig

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
])
def test_bad_values_name_the_parameter(config, name, value):
    with pytest.raises(ValueError, match=f"'{name}'"):
        config(**{name: value})
