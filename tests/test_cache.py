"""The on-disk caches heal and are keyed by what made them.

A damaged entry (truncated, another format, an older layout) is set aside with a warning naming it and
recomputed to the same result; keys carry a fingerprint of the model's config and weights, so another
model saved under the same path misses; the converted embedded model is checked against its manifest.
Tiny random models keep these mechanical tests fast; every file goes to ``tmp_path``.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
import torch

import dynheads_tl
from dynheads_tl import store
from dynheads_tl.engine import models
from dynheads_tl.corpus import collect_traces
from dynheads_tl.tasks import make_niah_samples
from dynheads_tl.tasks.common import Sample
from dynheads_tl.engine import trace_data
from dynheads_tl.engine.trace_data import Trace, TraceConfig, UnreadableFileError, load_traces, save_traces
from dynheads_tl.engine.tracing import trace_generation
from dynheads_tl.store import atomic_write, atomic_write_text
from conftest import build_tiny_model
from factories import make_trace

TRACE_CONFIG = TraceConfig(max_new_tokens=6)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    # Built before any test points DYNHEADS_CACHE elsewhere: it borrows the embedded model's tokenizer.
    return build_tiny_model("llama", tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def tiny_model(tiny_folder):
    return dynheads_tl.load_model(str(tiny_folder), device="cpu")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("DYNHEADS_CACHE", str(root))
    return root


@pytest.fixture(scope="module")
def samples(tiny_model):
    return make_niah_samples(tiny_model.tokenizer, n=3, context_tokens=60, seed=3, max_new_tokens=6)


def small_trace() -> Trace:
    return make_trace([5, 6], torch.zeros(2, 2, 4, dtype=torch.long), torch.rand(2, 2, 4), hidden=torch.rand(2, 8),
                      prompt_ids=torch.arange(10), evidence_spans=[(3, 5)], config={"a": 1})


def assert_same_traces(first: list[Trace], second: list[Trace]) -> None:
    assert len(first) == len(second)
    for a, b in zip(first, second):
        for name in ("tokens", "argmax_pos", "support_score", "hidden", "prompt_ids"):
            assert torch.equal(getattr(a, name), getattr(b, name))
        assert a.config == b.config and a.response == b.response


# --- self-healing reads -----------------------------------------------------------------------------

def test_truncated_trace_file_heals_on_the_next_run(tiny_model, samples, cache, caplog):
    first = collect_traces(tiny_model, samples, TRACE_CONFIG, {"test": "heal"})
    files = sorted((cache / "traces").glob("*.pt"))
    assert len(files) == 3 and len(list((cache / "traces").glob("*.json"))) == 3
    damaged, intact = files[1], files[0]
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])
    intact_mtime = intact.stat().st_mtime_ns

    with caplog.at_level(logging.WARNING, logger="dynheads_tl.store"):
        healed = collect_traces(tiny_model, samples, TRACE_CONFIG, {"test": "heal"})
    assert_same_traces(first, healed)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(damaged) in warnings[0] and "recomputing" in warnings[0]
    assert damaged.with_name(damaged.name + ".corrupt").exists()
    assert intact.stat().st_mtime_ns == intact_mtime, "readable entries are not recomputed"
    index = json.loads(damaged.with_suffix(".json").read_text())["index"]
    assert_same_traces(load_traces(damaged), first[index: index + 1])  # rewritten whole

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dynheads_tl.store"):
        again = collect_traces(tiny_model, samples, TRACE_CONFIG, {"test": "heal"})
    assert_same_traces(first, again)
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
    assert not list((cache / "traces").glob("*.tmp"))


def test_trace_entry_of_an_older_layout_is_recomputed(tmp_path, caplog):
    config = {"test": "old layout"}
    path = store.traces_path(config, tmp_path)
    save_traces([small_trace()], path)
    old = torch.load(path, weights_only=True)
    del old[0]["info"]  # as if written before the field existed
    torch.save(old, path)
    with caplog.at_level(logging.WARNING, logger="dynheads_tl.store"):
        traces = trace_data.cached_traces(config, lambda: [small_trace()], root=tmp_path)
    assert len(traces) == 1 and str(path) in caplog.text
    assert_same_traces(load_traces(path), traces)


@pytest.mark.parametrize("damage", ["truncated", "not json", "no result field", "other config", "binary"])
def test_damaged_result_json_heals(tmp_path, caplog, damage):
    config = {"claim": 2, "k": 5, "spans": (1, 2)}
    result = {"row": {"em": 1.0, "response": "Paris"}, "new_heads": [0, 3, 1]}

    def run() -> dict:
        """How ablation.cached_runs uses the store: read, else compute and save."""
        cached = store.load_cached_json(config, root=tmp_path)
        return cached if cached is not None else store.save_cached_json(config, json.loads(json.dumps(result)),
                                                                          root=tmp_path)

    assert run() == result
    path = next(tmp_path.glob("*.json"))
    text = path.read_text()
    path.write_bytes({
        "truncated": text[: len(text) // 2].encode(),
        "not json": b"<html>",
        "no result field": json.dumps({"config": config}).encode(),
        "other config": json.dumps({"config": {"claim": 1}, "result": {}}).encode(),
        "binary": b"\xff\xfe\x00",
    }[damage])
    with caplog.at_level(logging.WARNING, logger="dynheads_tl.store"):
        assert store.load_cached_json(config, root=tmp_path) is None
    assert str(path) in caplog.text and "recomputing" in caplog.text
    assert (tmp_path / (path.name + ".corrupt")).exists()
    assert run() == result and run() == result
    assert store.load_cached_json(config, root=tmp_path) == result


@pytest.mark.parametrize("content", ["truncated", "garbage", "old layout", "single trace"])
def test_direct_load_of_a_bad_file_names_it(tmp_path, content):
    path = save_traces([small_trace(), small_trace()], tmp_path / "traces.pt")
    if content == "truncated":
        path.write_bytes(path.read_bytes()[:-200])
    elif content == "garbage":
        path.write_text("not a torch file")
    elif content == "old layout":
        torch.save([{"tensors": {}}], path)
    else:  # a Trace.save file is one dict, not the list save_traces writes
        small_trace().save(path)
    with pytest.raises(UnreadableFileError, match="Cannot read the saved traces in") as error:
        load_traces(path)
    assert str(path) in str(error.value) and error.value.__cause__ is not None
    if content != "single trace":
        with pytest.raises(UnreadableFileError, match="Cannot read"):
            Trace.load(path)


def test_missing_file_is_not_reported_as_damage(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_traces(tmp_path / "absent.pt")


def test_atomic_write_keeps_the_old_file_when_interrupted(tmp_path):
    path = atomic_write_text(tmp_path / "out.json", "old")

    def fail_halfway(handle):
        handle.write(b"half of the new")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, fail_halfway)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_atomic_write_gives_the_mode_open_would(tmp_path, monkeypatch):
    # mkstemp creates 0600 files; a result must get 0666 less the umask, as open() gives it, so that a group
    # sharing the cache or the report folder can read it. The umask is read at import: 022 here -> 0644.
    monkeypatch.setattr(store, "_FILE_MODE", 0o666 & ~0o022)
    path = atomic_write_text(tmp_path / "shared.json", "{}")
    assert path.stat().st_mode & 0o777 == 0o644
    old = os.umask(0o027)
    try:  # reading the umask returns it and leaves it as it was
        assert store._umask() == 0o027 and os.umask(0o027) == 0o027
    finally:
        os.umask(old)


# --- keys from contents ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def other_tiny_folder(tiny_folder):
    return build_tiny_model("llama", tiny_folder.parent / "other", seed=1)


def test_trace_groups_split_batches_not_keys(tiny_model, samples, cache, monkeypatch):
    """``groups`` keeps samples of two labels out of one batch (the length grid: one batch per haystack layout) and
    leaves the cache keys as they were: a run without groups reads every trace back."""
    from dynheads_tl import corpus

    batches, original = [], corpus.trace_units

    def recording(model, batch, *args):
        batches.append(len(batch))
        return original(model, batch, *args)

    monkeypatch.setattr(corpus, "trace_units", recording)
    with pytest.raises(ValueError, match="2 group labels for 3 samples"):
        collect_traces(tiny_model, samples, TRACE_CONFIG, {"test": "groups"}, groups=[0, 1])
    grouped = collect_traces(tiny_model, samples, TRACE_CONFIG, {"test": "groups"}, batch_size=8, groups=[1, 0, 1])
    assert batches == [2, 1]  # label 1 (samples 0 and 2) first, then label 0
    assert [t.prompt_ids.tolist() for t in grouped] == [list(s.prompt_ids) for s in samples], "in sample order"
    again = collect_traces(tiny_model, samples, TRACE_CONFIG, {"test": "groups"}, batch_size=8)
    assert batches == [2, 1], "the same keys: nothing computed again"
    assert_same_traces(grouped, again)


def test_keys_follow_the_model_not_its_path(tmp_path, samples, tiny_folder, other_tiny_folder, cache):
    folder = tmp_path / "model"
    shutil.copytree(tiny_folder, folder)
    first = dynheads_tl.load_model(str(folder), device="cpu")
    reloaded = dynheads_tl.load_model(str(folder), device="cpu")
    assert models.model_fingerprint(first) == models.model_fingerprint(reloaded), "deterministic across loads"
    old = collect_traces(first, samples[:1], TRACE_CONFIG, {"test": "keys"})

    shutil.rmtree(folder)
    shutil.copytree(other_tiny_folder, folder)  # another model saved under the same path
    other = dynheads_tl.load_model(str(folder), device="cpu")
    assert models.model_name(other) == models.model_name(first)
    assert models.model_fingerprint(other) != models.model_fingerprint(first)
    new = collect_traces(other, samples[:1], TRACE_CONFIG, {"test": "keys"})
    assert len(list((cache / "traces").glob("*.pt"))) == 2, "the second model missed the first one's entry"
    assert not torch.equal(old[0].support_score, new[0].support_score)
    assert new[0].config["model_fingerprint"] == models.model_fingerprint(other)


def test_fingerprint_sees_config_and_is_memoised(tiny_model, tiny_folder):
    fingerprint = models.model_fingerprint(tiny_model)
    assert len(fingerprint) == 16 and int(fingerprint, 16) >= 0
    assert tiny_model.__dict__["_dynheads_fingerprint"] == fingerprint
    twin = dynheads_tl.load_model(str(tiny_folder), device="cpu")
    twin.original_model.config.rms_norm_eps = 1e-3  # same weights, another computation
    assert models.model_fingerprint(twin) != fingerprint


# --- the converted embedded model ----------------------------------------------------------------------

def fake_files(folder):
    (folder / "model.safetensors").write_bytes(bytes(range(256)) * 40)
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "sub").mkdir()
    (folder / "sub" / "tokenizer.json").write_text("{}")


def test_manifest_detects_damage(tmp_path):
    fake_files(tmp_path)
    assert models.manifest_problem(tmp_path) == "it has no CHECKSUM.json (converted by an older version, or interrupted)"
    models.write_manifest(tmp_path)
    assert set(json.loads((tmp_path / "CHECKSUM.json").read_text())["files"]) == {
        "model.safetensors", "config.json", "sub/tokenizer.json"}
    assert models.manifest_problem(tmp_path, "size") is None and models.manifest_problem(tmp_path, "sha256") is None

    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    assert models.manifest_problem(tmp_path) == "model.safetensors has 1000 bytes where 10240 were written"
    weights.write_bytes(bytes(10240))  # right size, wrong bytes: only the full check sees it
    assert models.manifest_problem(tmp_path, "size") is None
    assert models.manifest_problem(tmp_path, "sha256") == "model.safetensors does not match its recorded sha256"
    (tmp_path / "sub" / "tokenizer.json").unlink()
    assert models.manifest_problem(tmp_path) == "sub/tokenizer.json is missing"
    (tmp_path / "CHECKSUM.json").write_text("{")
    assert "CHECKSUM.json is unreadable" in models.manifest_problem(tmp_path)


@pytest.fixture
def fake_converter(monkeypatch, cache):
    calls = []

    def convert(name, folder):
        calls.append(folder)
        fake_files(folder)

    monkeypatch.setattr(models, "_convert_embedded", convert)
    return calls


def test_embedded_model_dir_reconverts_a_damaged_folder(fake_converter, cache, caplog):
    folder = models.embedded_model_dir()
    assert folder == cache / "smollm2-135m-instruct-v1" and len(fake_converter) == 1
    assert models.embedded_model_dir() == folder and len(fake_converter) == 1, "a sound folder is reused"
    assert not [p for p in cache.iterdir() if ".tmp" in p.name or ".old" in p.name]

    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with caplog.at_level(logging.WARNING, logger="dynheads_tl.engine.models"):
        assert models.embedded_model_dir() == folder
    assert len(fake_converter) == 2 and weights.stat().st_size == 10240
    assert f"The converted model in {folder} cannot be used: model.safetensors has 100 bytes" in caplog.text

    (folder / "CHECKSUM.json").unlink()  # converted before manifests existed: unverified
    models.embedded_model_dir()
    assert len(fake_converter) == 3 and (folder / "CHECKSUM.json").exists()
    models.embedded_model_dir(rebuild=True)
    assert len(fake_converter) == 4


def test_failed_conversion_leaves_no_folder(monkeypatch, cache):
    monkeypatch.setattr(models, "_package_dir", lambda package: None)
    with pytest.raises(ModuleNotFoundError, match="pip install"):
        models.embedded_model_dir()
    assert not [p for p in cache.iterdir() if p.is_dir()]


def test_install_model_verifies_checksums_and_rebuilds(fake_converter, cache, monkeypatch, capsys):
    from dynheads_tl.report import cli

    monkeypatch.setattr(cli, "_package_dir", lambda package: cache)  # the package counts as installed
    assert cli.main(["install-model"]) == 0
    folder = cache / "smollm2-135m-instruct-v1"
    assert capsys.readouterr().out.strip() == str(folder) and len(fake_converter) == 1
    assert cli.main(["install-model"]) == 0 and len(fake_converter) == 1
    (folder / "model.safetensors").write_bytes(bytes(10240))  # same size: only sha256 sees it
    assert models.embedded_model_dir() == folder and len(fake_converter) == 1, "loads check sizes only"
    assert cli.main(["install-model"]) == 0 and len(fake_converter) == 2
    assert cli.main(["install-model", "--rebuild"]) == 0 and len(fake_converter) == 3
    assert capsys.readouterr().out.strip().splitlines() == [str(folder)] * 3


# --- context length ----------------------------------------------------------------------------------

def test_trace_refuses_a_prompt_past_the_context(tiny_model, monkeypatch):
    limit = tiny_model.cfg.n_ctx
    assert limit == 512
    sample = Sample(task="niah", prompt_ids=[5] * 500, evidence_spans=[(10, 12)], answers=["x"], question="q",
                    context_span=(0, 500))
    monkeypatch.setattr(dynheads_tl.engine.tracing, "new_buffers", lambda *a, **k: pytest.fail("model work started"))
    with pytest.raises(ValueError, match=r"Sample 0 \(niah\) needs room for 524 tokens \(500 prompt tokens \+ "
                                         r"max_new_tokens=24\), more than the model's context of n_ctx=512"):
        trace_generation(tiny_model, sample, TraceConfig(max_new_tokens=24))


def test_trace_accepts_a_prompt_that_just_fits(tiny_model):
    sample = Sample(task="niah", prompt_ids=list(range(5, 5 + 508)), evidence_spans=[(10, 12)], answers=["x"],
                    question="q", context_span=(0, 508))
    trace = trace_generation(tiny_model, sample, TraceConfig(max_new_tokens=4, stop_at_eos=False))
    assert trace.n_steps == 4


# --- every trace set is traced in batches -------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_long_model(tmp_path_factory):
    return dynheads_tl.load_model(str(build_tiny_model("llama", tmp_path_factory.mktemp("long") / "model",
                                                       max_positions=1024)), device="cpu")


def test_trace_sets_are_traced_in_batches_of_trace_batch_size(tiny_long_model, cache, monkeypatch):
    """``trace_batch_size`` reaches every split of claim 1's trace sets (NIAH, HotpotQA and its placebo spans),
    and batching changes no token, top-1 source or Eq. 1 set (the batch size is not in the cache key)."""
    from dynheads_tl import corpus

    seen: list[int] = []

    def spying(original):
        def spy(model, samples, trace_config):
            seen.append(len(samples))
            return original(model, samples, trace_config)
        return spy

    monkeypatch.setattr(corpus, "trace_units", spying(corpus.trace_units))
    monkeypatch.setattr(corpus, "pair_units", spying(corpus.pair_units))
    small = dict(context_tokens=60, n_calibration=2, n_analysis=3, n_hotpot=2, max_new_tokens=5,
                 hotpot_max_new_tokens=4, hotpot_source="synthetic")
    batched = corpus.TraceSets(**small, trace_batch_size=3)
    model = tiny_long_model
    traces = [*corpus.niah_traces(model, batched, 0), *corpus.hotpot_traces(model, batched, 0),
              corpus.hotpot_placebo_traces(model, batched, 0)]
    # NIAH splits of 2 and 3 samples, HotpotQA of 1 and 2, placebo of 1: one batch each
    assert seen == [2, 3, 1, 2, 1]
    seen.clear()
    read_back = corpus.TraceSets(**small, trace_batch_size=1)  # the batch size is not in the cache key
    again = [*corpus.niah_traces(model, read_back, 0), *corpus.hotpot_traces(model, read_back, 0),
             corpus.hotpot_placebo_traces(model, read_back, 0)]
    assert seen == []
    for split, split_again in zip(traces, again):
        assert_same_traces(split, split_again)
    single = corpus.TraceSets(**small, trace_batch_size=1, use_cache=False)
    alone = [*corpus.niah_traces(model, single, 0), *corpus.hotpot_traces(model, single, 0),
             corpus.hotpot_placebo_traces(model, single, 0)]
    assert seen == [1] * 9
    for split, split_alone in zip(traces, alone):
        assert len(split) == len(split_alone)
        for a, b in zip(split, split_alone):
            assert torch.equal(a.tokens, b.tokens) and torch.equal(a.argmax_pos, b.argmax_pos)
            assert torch.equal(a.retrieval_mask, b.retrieval_mask)
            torch.testing.assert_close(a.support_score, b.support_score, atol=1e-4, rtol=0)


def test_a_calibration_split_and_its_placebo_spans_are_generated_once(tiny_long_model, cache, monkeypatch):
    """From an empty cache the Eq. 2 calibration (``calibrated_eq2_rule``) generates each calibration question once
    for its real and placebo traces, caches both under the keys each is read by, and equals tracing the placebo
    samples on their own; a second read computes nothing, and a lost placebo entry is generated again alone."""
    from dynheads_tl import corpus
    from dynheads_tl.engine.tracing import trace_batch
    from dynheads_tl.store import traces_path
    from dynheads_tl.tasks.common import placebo_sample

    counts = {"trace": 0, "pair": 0}

    def counting(name, original):
        def spy(model, samples, trace_config):
            counts[name] += len(samples)
            return original(model, samples, trace_config)
        return spy

    monkeypatch.setattr(corpus, "trace_units", counting("trace", corpus.trace_units))
    monkeypatch.setattr(corpus, "pair_units", counting("pair", corpus.pair_units))
    sets = corpus.TraceSets(context_tokens=60, n_calibration=2, n_analysis=3, n_hotpot=4, max_new_tokens=5,
                            hotpot_max_new_tokens=4, hotpot_source="synthetic", trace_batch_size=4)
    model = tiny_long_model
    rule, real, placebo = corpus.calibrated_eq2_rule(model, sets, [0, 1])
    assert counts == {"trace": 0, "pair": 4}, "two seeds of two calibration questions, each generated once"
    assert len(real) == len(placebo) == 4 and rule.kind == "chance"
    assert all(torch.equal(r.tokens, p.tokens) for r, p in zip(real, placebo))
    assert [r.evidence_spans for r in real] != [p.evidence_spans for p in placebo]
    # the real half is what hotpot_traces reads: the calibration split costs nothing more
    assert_same_traces(corpus.hotpot_traces(model, sets, 0)[0], real[:2])
    assert counts == {"trace": 4, "pair": 4}, "only seed 0's four analysis questions"
    samples, spec = corpus._hotpot_split(model, sets, 0, "calibration")
    moved = [placebo_sample(s, corpus.SEED_OFFSETS["placebo"] + corpus.mix_seed(0, i, 1000)) for i, s in enumerate(samples)]
    alone = trace_batch(model, moved, sets.trace_config("hotpot"))
    for got, want in zip(placebo[:2], alone):
        assert torch.equal(got.support_score, want.support_score) and got.evidence_spans == want.evidence_spans
    again = corpus.calibrated_eq2_rule(model, sets, [0, 1])
    assert counts == {"trace": 4, "pair": 4} and again[0] == rule
    assert_same_traces(again[2], placebo)
    placebo_key = corpus.trace_keys(model, moved, sets.trace_config("hotpot"), {**spec, "placebo": 0})[1]
    traces_path(placebo_key).unlink()
    healed = corpus.hotpot_placebo_traces(model, sets, 0)
    assert counts == {"trace": 4, "pair": 5}, "the lost entry only"
    assert_same_traces(healed[:1], placebo[:1])  # read back
    # generated again in a batch of one, not of two: equal to float rounding
    assert torch.equal(healed[1].argmax_pos, placebo[1].argmax_pos) and healed[1].evidence_spans == placebo[1].evidence_spans
    torch.testing.assert_close(healed[1].support_score, placebo[1].support_score, atol=1e-5, rtol=0)


def test_layout_traces_share_samples_across_sizes(cache, tiny_model, monkeypatch):
    """A layout setting's traces are keyed per sample without the split's size: a larger split traces only the
    samples a smaller one lacks, and a smaller one traces nothing."""
    from dynheads_tl import corpus
    from dynheads_tl.corpus import TraceSettings, layout_split_samples, layout_traces

    settings = TraceSettings(max_new_tokens=4)
    where = dict(haystack="filler", context_tokens=60)
    traced = []
    original = corpus.trace_units

    def counting(model, samples, trace_config):
        traced.append(len(samples))
        return original(model, samples, trace_config)

    monkeypatch.setattr(corpus, "trace_units", counting)
    calibration, analysis = layout_traces(tiny_model, settings, **where, n_calibration=1, n_analysis=2, seed=5,
                                          batch_size=2)
    assert traced == [1, 2]
    traced.clear()

    _, larger = layout_traces(tiny_model, settings, **where, n_calibration=1, n_analysis=4, seed=5, batch_size=2)
    assert traced == [2], "only the two samples the smaller split lacks are traced"
    traced.clear()
    assert_same_traces(larger[:2], analysis)
    assert [t.prompt_ids.tolist() for t in larger] == [
        s.prompt_ids for s in layout_split_samples(tiny_model, settings, **where, n=4, seed=5, split="layout_analysis")]

    _, smaller = layout_traces(tiny_model, settings, **where, n_calibration=1, n_analysis=3, seed=5, batch_size=2)
    assert traced == [] and len(smaller) == 3
    assert_same_traces(smaller, larger[:3])


def test_the_suite_runs_on_a_cache_of_its_own():
    """No test writes into the user's cache: the suite's cache is a fresh folder (tests/conftest.py) whose
    converted models, where it has any, are links into the user's cache."""
    from conftest import _SUITE_CACHE

    suite = store.cache_dir()
    assert str(suite) == _SUITE_CACHE["suite"] and suite != _SUITE_CACHE["models"]
    assert suite.name.startswith("dynheads-suite-cache-") and not suite.is_relative_to(Path.home() / ".cache")
    for name in models.EMBEDDED_MODELS:
        linked = suite / models.converted_model_dir(name).name
        assert linked.is_symlink() == (models.manifest_problem(_SUITE_CACHE["models"] / linked.name, "size") is None)
