"""Shared fixtures: seeded RNGs, the embedded model (loaded once per session), tiny random models; and the test groups.

Every test lands in one group, so the fast ones can run alone (``pytest -m unit`` takes seconds):
- ``notebook``: executes a notebook through papermill (marked by hand);
- ``integration``: loads a model (the embedded one or a tiny random one), builds a wheel or runs a
  subprocess: seconds to minutes each;
- ``unit``: everything else (hand-built traces, parsers, configs, files): milliseconds each.
"""
from __future__ import annotations

import inspect
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

import dynheads_tl
from dynheads_tl.engine.models import embedded_model_dir, link_converted_models as link_converted
from dynheads_tl.store import cache_dir


_INTEGRATION_FIXTURES = {"embedded_model", "tiny_suite"}
_INTEGRATION_CALLS = ("load_model(", "build_tiny_model(", "subprocess.", "papermill.", "run_report(", "_run(")


def link_converted_models(cache: Path, names=None) -> Path:
    """``cache`` holding a link to each embedded model's converted folder (``names``: all of them) that the user's
    cache has whole (:func:`dynheads_tl.engine.models.link_converted_models`)."""
    link_converted(cache, names, source=_SUITE_CACHE["models"])
    return cache


def start_script(script: str, call: str, cache: Path, *args) -> subprocess.Popen:
    """``call(*args)`` of the Python source ``script`` in a process of its own (a run a test kills), on the cache folder
    ``cache`` and with this process's torch threads, as :func:`run_script_here` runs it (the same threads, the same
    floats; fewer threads while the notebook smoke runs hold the other cores). Paths are passed as strings."""
    env = {**os.environ, "DYNHEADS_CACHE": str(cache), "OMP_NUM_THREADS": str(torch.get_num_threads())}
    source = f"{script}\nimport json, sys\n{call}(*json.loads(sys.argv[1]))\n"
    shown = json.dumps([str(arg) if isinstance(arg, Path) else arg for arg in args])
    return subprocess.Popen([sys.executable, "-c", source, shown], env=env, cwd=Path(__file__).resolve().parent.parent)


def run_script_here(script: str, call: str, cache: Path, monkeypatch, *args) -> None:
    """:func:`start_script`'s run in this process (no start-up to pay), on the cache folder ``cache``."""
    namespace: dict = {}
    exec(compile(script, call, "exec"), namespace)
    with monkeypatch.context() as patch:
        patch.setenv("DYNHEADS_CACHE", str(cache))
        namespace[call](*[str(arg) if isinstance(arg, Path) else arg for arg in args])


_SUITE_CACHE: dict = {}


def pytest_configure(config):
    """The suite writes into a cache of its own, never into the user's (``$DYNHEADS_CACHE`` or
    ``~/.cache/dynheads_tl``): a fresh folder holding only links to the models the user's cache has converted, set
    before any test module is imported (subprocesses, notebook runs and Ray workers inherit it). Tests that need an
    empty cache still point ``DYNHEADS_CACHE`` at a folder of their own."""
    _SUITE_CACHE["user"] = os.environ.get("DYNHEADS_CACHE")
    _SUITE_CACHE["models"] = cache_dir().resolve()
    _SUITE_CACHE["suite"] = str(link_converted_models(Path(tempfile.mkdtemp(prefix="dynheads-suite-cache-"))))
    os.environ["DYNHEADS_CACHE"] = _SUITE_CACHE["suite"]


def pytest_unconfigure(config):
    if "suite" not in _SUITE_CACHE:
        return
    shutil.rmtree(_SUITE_CACHE.pop("suite"), ignore_errors=True)  # links are removed, never followed
    user = _SUITE_CACHE.pop("user")
    if user is None:
        os.environ.pop("DYNHEADS_CACHE", None)
    else:
        os.environ["DYNHEADS_CACHE"] = user


def _place(item) -> int:
    """0 for most tests; 1 for tests whose processes run side by side (Ray actors, two reports at once): late, when
    the notebook smoke runs, which hold a core from the session's start, have left the cores to them; 2 for the tests
    that read a smoke run: last, since a notebook test reached earlier would leave this process idle while it waits
    for its run."""
    return 2 if item.get_closest_marker("notebook") else 1 if item.get_closest_marker("side_by_side") else 0


def pytest_collection_modifyitems(items):
    items.sort(key=_place)  # stable: each group keeps the files' order
    for item in items:
        if item.get_closest_marker("notebook"):
            continue
        fixtures = set(getattr(item, "fixturenames", ()))
        try:
            source = inspect.getsource(item.function)
        except (OSError, TypeError):
            source = ""
        heavy = fixtures & _INTEGRATION_FIXTURES or any(call in source for call in _INTEGRATION_CALLS)
        heavy = heavy or any(name.startswith(("tiny", "model")) for name in fixtures)
        item.add_marker(pytest.mark.integration if heavy else pytest.mark.unit)


@pytest.fixture(autouse=True)
def seed_everything():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield


_SUITE_THREADS = torch.get_num_threads()  # this process's torch threads when nothing else runs beside it


@pytest.fixture(scope="session", autouse=True)
def smoke_runs(request, tmp_path_factory):
    """The notebook smoke runs that the selected tests read (``tests/test_notebooks.py``), started as the session
    starts and stopped when it ends; None when no notebook test is selected (``-m unit``, one file)."""
    runs = None
    if any(item.get_closest_marker("notebook") for item in request.session.items):
        from test_notebooks import start_smoke_runs

        runs = start_smoke_runs(request.session, tmp_path_factory)
        _SMOKE_RUNS[:] = [] if runs is None else [runs]
        if runs is not None and runs.workers < _SUITE_THREADS:  # runs beside the other tests: they take the other
            # cores (torch's threads spin while they wait for a core, so more threads than cores costs far more than
            # it gains)
            torch.set_num_threads(max(1, _SUITE_THREADS - runs.workers))
    yield runs
    torch.set_num_threads(_SUITE_THREADS)
    if runs is not None:
        runs.stop()


_SMOKE_RUNS: list = []  # the session's SmokeRuns, for the terminal summary


def pytest_terminal_summary(terminalreporter):
    for runs in _SMOKE_RUNS:
        terminalreporter.write_line(runs.summary())


@pytest.fixture(autouse=True)
def _threads_back_once_the_runs_are_done(smoke_runs):
    """Before each test: once every smoke run has finished, this process takes its torch threads back (here, in the
    tests' own thread, where torch's thread count applies)."""
    if smoke_runs is not None and torch.get_num_threads() != _SUITE_THREADS and smoke_runs.idle():
        torch.set_num_threads(_SUITE_THREADS)
    yield


@pytest.fixture(scope="session")
def embedded_model():
    """The embedded model on the CPU, shared by every module: no test changes it (hooks are added in contexts, and
    monkeypatches of its fast twin are undone after each test)."""
    return dynheads_tl.load_model("smollm2-135m-instruct", device="cpu")


@pytest.fixture(scope="session")
def embedded_reference():
    """The embedded model in plain transformers (eager attention, float32, eval mode): the independent side of the
    parity tests, loaded once for every module that compares against it (no test changes it)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(embedded_model_dir()), attn_implementation="eager",
                                                dtype=torch.float32).eval()


TINY_CONFIGS = {
    "llama": ("LlamaConfig", {}),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {"head_dim": 16}),
    "phi3": ("Phi3Config", {"pad_token_id": 2}),
    # Gemma 3's shape in miniature: one KV head, Q/K norms, sliding layers around a global one with a window
    # (16) shorter than the test prompts, a RoPE base per layer type.
    "gemma3": ("Gemma3TextConfig", {
        "num_hidden_layers": 3, "num_key_value_heads": 1, "head_dim": 16, "query_pre_attn_scalar": 16,
        "sliding_window": 16, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
        "pad_token_id": 0}),
}


def build_tiny_model(family: str, folder, *, seed: int = 0, max_positions: int = 512):
    """A 2-layer random model of ``family`` saved as a local Hugging Face folder, using the
    embedded model's tokenizer so that chat prompts and offsets work as for real models; its context
    holds ``max_positions`` tokens (HotpotQA prompts need about 520)."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    class_name, extra = TINY_CONFIGS[family]
    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir())
    config = getattr(transformers, class_name)(**{
        "vocab_size": len(tokenizer), "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": max_positions,
        "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False, **extra})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    # Random init gives near-uniform attention; sharpen it so argmaxes are well separated.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "q_proj" in name or "k_proj" in name or "qkv_proj" in name:
                param.mul_(8.0)
            elif "q_norm" in name or "k_norm" in name:  # normalised queries and keys: scale after the norm
                param.fill_(2.0)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
