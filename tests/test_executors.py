"""Executors (units computed locally or on a Ray cluster), the device / dtype / backend parameters, and the Ray
backend against the local one on the embedded model, with a worker killed mid-run.

The notebook-level comparison (the smoke preset of notebooks 01 and 02 on a two-worker local cluster against the
local backend: traces, and ablation runs of the grid and progressive masking) is in tests/test_notebooks.py,
beside the local runs it reuses."""
from __future__ import annotations

import sys
import threading
import time

import pytest
import torch

from dynheads_tl import executors
from dynheads_tl.config import DeviceSettings, RunSettings
from dynheads_tl.engine.models import _resolve_dtype, resolve_device
from dynheads_tl.executors import LocalExecutor, ModelLoader, RayExecutor, check_backend, use_executor


def _double(model, batch, offset):
    return [model * x + offset for x in batch]


def test_the_local_executor_runs_every_batch_in_order_with_its_args():
    out = list(LocalExecutor().map(10, _double, [[1, 2], [3]], args=(0.5,)))
    assert out == [(0, [10.5, 20.5]), (1, [30.5])]
    assert list(LocalExecutor().map(10, _double, [], args=(0,))) == []


def test_a_compute_that_returns_the_wrong_number_of_results_fails():
    with pytest.raises(RuntimeError, match="returned 1 results for a batch of 2"):
        list(LocalExecutor().map(None, lambda model, batch: [0], [[1, 2]]))


def test_backend_parameters_are_checked_before_any_work(monkeypatch):
    with pytest.raises(ValueError, match="'backend' must be one of"):
        check_backend("dask")
    with pytest.raises(ValueError, match="only used with backend='ray'"):
        check_backend("local", "10.0.0.1:6379")
    with pytest.raises(ValueError, match="'backend' must be one of"):
        RunSettings(backend="spark")
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    with pytest.raises(ImportError, match=r'pip install -e "\.\[ray\]"'):
        check_backend("ray")
    with pytest.raises(ImportError, match="optional extra"):
        RunSettings(backend="ray")


def test_device_and_dtype_parameters(monkeypatch):
    assert DeviceSettings().device == "auto" and DeviceSettings().dtype == "auto"
    # the format is checked here; whether this machine has the device, in tests/test_reliability.py
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    DeviceSettings(device="cuda:1", dtype="bfloat16")
    for bad in ({"device": "gpu"}, {"device": "cuda:x"}, {"dtype": "float8"}, {"dtype": "bf16"}):
        with pytest.raises(ValueError, match=f"Parameter '{next(iter(bad))}'"):
            DeviceSettings(**bad)


def test_auto_means_cuda_with_bfloat16_on_a_gpu_and_cpu_with_float32_otherwise():
    assert _resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert _resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert _resolve_dtype("float16", torch.device("cuda")) == torch.float16
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected and resolve_device(None).type == expected
    with pytest.raises(ValueError, match="device must be"):
        resolve_device("tpu:zero")


def test_every_unit_notebook_takes_the_backend_and_every_notebook_the_device():
    from dynheads_tl.report.runner import NOTEBOOK_CONFIGS, config_class

    for stem in NOTEBOOK_CONFIGS:
        fields = set(config_class(stem).__dataclass_fields__)
        assert {"device", "dtype"} <= fields, stem
        if stem != "00_inspect_attention":  # one traced sample, no units
            assert {"backend", "ray_address"} <= fields, stem


def test_choosing_the_backend_alone_still_writes_the_committed_report():
    from dynheads_tl.report.runner import COMMITTED_REPORT, RUNS_DIR, output_dir_for

    assert output_dir_for("default", None, {"backend": "ray", "ray_address": "auto"}) == COMMITTED_REPORT
    assert output_dir_for("default", None, {"device": "cuda"}) == RUNS_DIR / "default"
    assert output_dir_for("smoke", None, {}) == RUNS_DIR / "smoke"


def test_the_command_line_refuses_an_address_without_ray(tmp_path, capsys):
    from dynheads_tl.report.cli import main

    out = tmp_path / "out"
    assert main(["report", "--only", "01", "--address", "10.0.0.1:6379", "--output-dir", str(out)]) == 1
    assert "only used with backend='ray'" in capsys.readouterr().err
    assert main(["report", "--only", "01", "-p", "ray_address='10.0.0.1:6379'", "--output-dir", str(out)]) == 1
    assert not out.exists()  # refused before anything was written


def test_memory_per_unit_is_computed_from_the_config():
    """The parameter count from a config's sizes equals the real model's; Llama-3.1-8B's KV cache at 50k tokens in
    bf16 is 2 x 32 layers x 8 KV heads x 128 x 50k x 2 bytes."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from dynheads_tl.engine.sizing import GiB, PAPER_MODEL_SHAPES, ModelShape, unit_memory_table

    config = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    shape = ModelShape.from_config("tiny", config)
    assert shape.n_params == sum(p.numel() for p in LlamaForCausalLM(config).parameters())
    assert (shape.n_layers, shape.n_heads, shape.n_kv_heads, shape.head_dim) == (3, 4, 2, 16)
    llama = next(s for s in PAPER_MODEL_SHAPES if s.name == "Llama-3.1-8B-Instruct")
    assert llama.kv_bytes(50_000) == 2 * 32 * 8 * 128 * 50_000 * 2
    table = unit_memory_table([llama], contexts=(5_000, 50_000)).iloc[0]
    assert table["kv_GiB_50k"] == pytest.approx(6.1, abs=0.05) and table["kv_GiB_5k"] == pytest.approx(0.61, abs=0.01)
    assert table["unit_GiB_50k"] == pytest.approx(table["weights_GiB"] + table["kv_GiB_50k"]
                                                  + table["step_transient_GiB_50k"])
    assert table["weights_GiB"] == pytest.approx(8.03e9 * 2 / GiB)


# --- Ray on the embedded model ------------------------------------------------------------------------------

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def ray_executor(embedded_model):
    """A local two-worker cluster whose actors load the embedded model on the CPU in float32 (as the driver)."""
    from dynheads_tl.engine.models import model_fingerprint

    executor = RayExecutor(ModelLoader("smollm2-135m-instruct", "cpu", "float32"), num_cpus=2,
                           expected_fingerprint=model_fingerprint(embedded_model))
    yield executor
    executor.close()
    use_executor(LocalExecutor())


class _one_thread:
    """One torch thread in this process, as in each Ray actor: float reductions then match across backends."""

    def __enter__(self):
        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        torch.set_num_threads(self.threads)


def _niah(model, n):
    from dynheads_tl.tasks import make_niah_samples

    return make_niah_samples(model.tokenizer, n=n, context_tokens=300, seed=77, haystack="filler",
                             random_layout=True, max_new_tokens=16, max_tokens=int(model.cfg.n_ctx))


def _same_traces(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x.tokens, y.tokens) and x.response == y.response
        assert torch.equal(x.argmax_pos, y.argmax_pos) and torch.equal(x.retrieval_mask, y.retrieval_mask)
        torch.testing.assert_close(x.support_score, y.support_score, atol=1e-6, rtol=0)
        torch.testing.assert_close(x.hidden, y.hidden, atol=1e-6, rtol=1e-6)


def test_ray_workers_with_another_model_are_refused_on_every_call(embedded_model):
    """Workers whose model is not the driver's are refused, and stopped: a second call starts a new pool and refuses
    it again, so nothing is ever computed (and cached under the driver's fingerprint) by the wrong model."""
    from dynheads_tl.corpus import trace_units
    from dynheads_tl.engine.tracing import TraceConfig

    executor = RayExecutor(ModelLoader("smollm2-135m-instruct", "cpu", "float32"), num_cpus=2,
                           expected_fingerprint="not-this-model")
    try:
        for _ in range(2):
            with pytest.raises(RuntimeError, match="is not the driver's model"):
                list(executor.map(embedded_model, trace_units, [_niah(embedded_model, 1)],
                                  args=(TraceConfig(max_new_tokens=2),)))
            assert executor.actors == []
    finally:
        executor.close()


def test_ray_traces_equal_local_traces_even_when_a_worker_is_killed(embedded_model, ray_executor, tmp_path,
                                                                    monkeypatch):
    """Four traced samples, one per batch, on two workers; one worker is killed while it traces. The lost batch is
    retried on a new worker, every result is written by the driver into the cache, and the traces are those of
    the local backend: tokens and Eq. 1 sets exactly, floats to 1e-6."""
    from dynheads_tl.corpus import collect_traces
    from dynheads_tl.engine.tracing import TraceConfig

    samples, config = _niah(embedded_model, 4), TraceConfig(max_new_tokens=12)
    use_executor(LocalExecutor())
    with _one_thread():
        local = collect_traces(embedded_model, samples, config, {"test": "local"}, use_cache=False)

    ray_executor._start()  # the actors load the model from the usual cache before it moves
    monkeypatch.setenv("DYNHEADS_CACHE", str(tmp_path))
    killed = []

    def kill_one_mid_batch():
        deadline = time.time() + 300
        while time.time() < deadline and not killed:
            for slot, (_, sent) in list(ray_executor.in_flight.items()):
                if time.time() - sent > 0.1:  # sent, and still running: a batch takes seconds
                    ray.kill(ray_executor.actors[slot], no_restart=True)
                    killed.append(slot)
                    break
            time.sleep(0.05)

    killer = threading.Thread(target=kill_one_mid_batch, daemon=True)
    use_executor(ray_executor)
    killer.start()
    remote = collect_traces(embedded_model, samples, config, {"test": "ray"}, use_cache=True)
    killer.join(timeout=5)
    use_executor(LocalExecutor())
    assert killed, "no worker was killed while it had a batch"
    assert ray_executor.retried >= 1
    _same_traces(local, remote)
    # Written by the driver, one entry per sample, and read back from there on the next call.
    assert len(list(tmp_path.glob("traces/*.pt"))) == len(samples)
    again = collect_traces(embedded_model, samples, config, {"test": "ray"}, use_cache=True)
    _same_traces(remote, again)
