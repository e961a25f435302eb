"""Executors (units computed locally or on a Ray cluster), the device / dtype / backend parameters, and the Ray
backend against the local one on the embedded model: a notebook's ``backend="ray"`` reaching a Ray executor, notebook
02's ablation units (each kind of selector, progressive masking, teacher forcing, Eq. 1 and Eq. 2) and traced
samples with a worker killed mid-run, each equal to the local backend's results.

Two of the four kinds of units are run on Ray here: traces (every notebook that traces goes through them) and
ablation runs (notebook 02). Notebook 04's RAG answers and notebook 06's retention samples go through the same
executor interface (:func:`dynheads_tl.executors.compute_missing`) but are not run on Ray by the tests."""
from __future__ import annotations

import sys
import threading
import time

import pytest
import torch

from dynheads_tl import executors
from dynheads_tl.config import ModelSettings, RunSettings
from dynheads_tl.engine.models import _resolve_dtype, resolve_device
from dynheads_tl.executors import LocalExecutor, ModelLoader, RayExecutor, check_backend


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
    assert ModelSettings().device == "auto" and ModelSettings().dtype == "auto"
    # the format is checked here; whether this machine has the device, in tests/test_reliability.py
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    ModelSettings(device="cuda:1", dtype="bfloat16")
    for bad in ({"device": "gpu"}, {"device": "cuda:x"}, {"dtype": "float8"}, {"dtype": "bf16"}):
        with pytest.raises(ValueError, match=f"Parameter '{next(iter(bad))}'"):
            ModelSettings(**bad)


def test_auto_means_cuda_with_bfloat16_on_a_gpu_and_cpu_with_float32_otherwise():
    assert _resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert _resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert _resolve_dtype("float16", torch.device("cuda")) == torch.float16
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected and resolve_device(None).type == expected
    with pytest.raises(ValueError, match="device must be"):
        resolve_device("tpu:zero")


def test_every_unit_notebook_takes_the_backend_and_every_notebook_the_device():
    from dynheads_tl.claims import all_claims
    from dynheads_tl.report.runner import config_class

    for stem in [claim.notebook for claim in all_claims()]:
        fields = set(config_class(stem).__dataclass_fields__)
        assert {"device", "dtype"} <= fields, stem
        if stem != "00_inspect_attention":  # one traced sample, no units
            assert {"backend", "ray_address"} <= fields, stem


def test_choosing_the_backend_alone_still_writes_the_committed_report():
    """--committed takes the backend (who computes) and keeps its folders; a single run writes runs/ either way."""
    from dynheads_tl.report.committed import COMMITTED_REPORT, committed_plan, run_committed_report
    from dynheads_tl.report.runner import RUNS_DIR, output_dir_for

    own = "smollm2-135m-instruct"  # the folder of a run of the presets' own model: runs/<preset>/<model>/
    assert output_dir_for("default", None, {"backend": "ray", "ray_address": "auto"}) == RUNS_DIR / "default" / own
    assert output_dir_for("default", None, {"device": "cuda"}) == RUNS_DIR / "default" / own
    assert output_dir_for("smoke", None, {}) == RUNS_DIR / "smoke" / own
    assert committed_plan()[0].output_dir == COMMITTED_REPORT / "default" / own
    with pytest.raises(ValueError, match="would change what it says"):
        run_committed_report(overrides={"backend": "ray", "device": "cuda"})


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
# One two-worker local cluster for the module (its actors load the model once); each test binds it to the model
# with monkeypatch, which puts the previous binding back without closing the pool (bind_executor would close it).

try:
    import ray
except ImportError:  # the tests above still run; these skip
    ray = None

def needs_ray(test):
    """A test on a local Ray cluster: skipped without Ray; run late (``side_by_side``: its driver and two actors want
    the cores the notebook smoke runs hold early in the session)."""
    return pytest.mark.side_by_side(
        pytest.mark.skipif(ray is None, reason='Ray is not installed (pip install -e ".[ray]")')(test))


@pytest.fixture(scope="module")
def ray_cluster():
    """Shuts down, at the module's end, the one local two-CPU Ray instance that :func:`ray_executor` starts: every
    executor of the module finds Ray running and leaves it running when it closes, so the tests share one start-up."""
    yield
    if ray is not None and ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="module")
def ray_executor(embedded_model, ray_cluster):
    """A local two-worker cluster whose actors load the embedded model on the CPU in float32 (as the driver)."""
    from dynheads_tl.engine.models import model_fingerprint

    executor = RayExecutor(ModelLoader("smollm2-135m-instruct", "cpu", "float32"), num_cpus=2,
                           expected_fingerprint=model_fingerprint(embedded_model))
    executor._connect()  # the module's instance; this executor did not start it, so closing it leaves Ray up
    executor._started_ray = False
    yield executor
    executor.close()


class _Closing:
    """An executor that records being closed."""

    def __init__(self):
        self.closed = 0

    def close(self):
        self.closed += 1


def test_executors_are_bound_per_model_and_closed_when_replaced_or_when_the_model_goes():
    """Binding one model's executor leaves another model's alone; binding a second executor to the same model closes
    the first; a model that is garbage-collected closes its executor (a rerun `config.start()` loads a new model and
    its old Ray actors must not keep their slots); an object that cannot be bound gets the local executor."""
    import gc

    first, second = _OtherModel(), _OtherModel()
    a, b, c = _Closing(), _Closing(), _Closing()
    executors.bind_executor(first, a)
    executors.bind_executor(second, b)
    assert executors.executor_for(first) is a and executors.executor_for(second) is b
    executors.bind_executor(first, c)
    assert (a.closed, b.closed, c.closed) == (1, 0, 0) and executors.executor_for(first) is c
    del first
    gc.collect()
    assert (a.closed, b.closed, c.closed) == (1, 0, 1) and executors.executor_for(second) is b
    assert executors.executor_for(None) is executors._LOCAL and executors.executor_for(_OtherModel()) is executors._LOCAL
    del second
    gc.collect()
    assert b.closed == 1


class _OtherModel:
    """A stand-in for a second model in the same process (weak-referenceable, as a torch module is)."""


def _bind_for_the_test(monkeypatch, executor, model):
    """``executor`` computes ``model``'s units until the test ends; the previous binding comes back then, and neither
    executor is closed."""
    monkeypatch.setitem(executors._BOUND, model, executor)


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


def _same_frames(local, remote, name):
    """The same rows and columns; a column whose cells are all numbers or missing matches to 1e-6 with its missing
    cells in the same places, any other column exactly (responses, head sets)."""
    import pandas as pd

    assert list(local.columns) == list(remote.columns) and local.shape == remote.shape, name
    assert len(local), f"{name}: no rows to compare"
    for column in local.columns:
        a, b = local[column], remote[column]
        x, y = (pd.to_numeric(c, errors="coerce").astype(float) for c in (a, b))
        if (a.isna() | x.notna()).all() and (b.isna() | y.notna()).all() and x.notna().any():
            assert x.isna().equals(y.isna()), f"{name}: {column} (missing cells)"
            assert not ((x - y).abs() > 1e-6).any(), f"{name}: {column}"
        else:
            assert a.astype(str).tolist() == b.astype(str).tolist(), f"{name}: {column}"


@needs_ray
def test_ray_workers_with_another_model_are_refused_on_every_call(embedded_model, ray_executor, tmp_path):
    """Workers whose model is not the driver's are refused, and stopped: a second call starts a new pool and refuses
    it again, so nothing is ever computed (and cached under the driver's fingerprint) by the wrong model. The
    workers load a tiny random model (one worker: each call starts one)."""
    from conftest import build_tiny_model
    from dynheads_tl.corpus import trace_units
    from dynheads_tl.engine.models import model_fingerprint
    from dynheads_tl.engine.tracing import TraceConfig

    other = build_tiny_model("llama", tmp_path / "other")
    ray_executor.close_actors()  # the shared instance's two CPUs free for this test's worker
    executor = RayExecutor(ModelLoader(str(other), "cpu", "float32"), num_cpus=2, actors=1,
                           expected_fingerprint=model_fingerprint(embedded_model))
    try:
        for _ in range(2):
            with pytest.raises(RuntimeError, match="is not the driver's model"):
                list(executor.map(embedded_model, trace_units, [_niah(embedded_model, 1)],
                                  args=(TraceConfig(max_new_tokens=2),)))
            assert executor.actors == []
    finally:
        executor.close()


@needs_ray
def test_a_notebook_asking_for_ray_hands_its_units_to_ray_workers_with_its_model(embedded_model, monkeypatch):
    """``backend="ray"`` in a notebook's parameters: ``config.start()`` (which every unit notebook calls) binds to the
    model it returns a Ray executor whose actors load the notebook's model with its device and dtype, and must match the driver's
    fingerprint. Nothing starts until a unit is computed (the tests below compute units on such an executor)."""
    from dynheads_tl.engine.models import model_fingerprint
    from dynheads_tl.claims import all_claims
    from dynheads_tl.report.runner import config_class, notebook_dir

    _bind_for_the_test(monkeypatch, LocalExecutor(), embedded_model)
    unit_notebooks = [claim.notebook for claim in all_claims() if "backend" in config_class(claim.notebook).__dataclass_fields__]
    assert len(unit_notebooks) == 7
    for stem in unit_notebooks:
        assert "lm = config.start()" in (notebook_dir() / f"{stem}.ipynb").read_text(), stem
        cls = config_class(stem)
        monkeypatch.setattr(cls, "load_model", lambda self: embedded_model)  # the driver's model, not a new load
        config = cls(backend="ray", device="cpu", dtype="float32")
        assert config.start() is embedded_model
        executor = executors.executor_for(embedded_model)
        assert isinstance(executor, RayExecutor) and executor.actors == [], stem
        assert executors.executor_for(_OtherModel()) is executors._LOCAL, "another model's units stay local"
        assert (executor.load.name, executor.load.device, executor.load.dtype) == (config.model, "cpu", "float32")
        assert executor.expected_fingerprint == model_fingerprint(embedded_model) and executor.address == ""
        executor.close()


@needs_ray
def test_ray_ablation_runs_equal_local_runs(embedded_model, ray_executor, monkeypatch):
    """Notebook 02's units on two workers: a NIAH grid cell under a condition of each kind of selector (two batches,
    which may come back in either order), progressive masking with k = 0 and 5, and a HotpotQA cell under Eq. 2's
    chance rule, generated and teacher-forced. Every row equals the local backend's, with one torch thread on both
    sides: responses and masked heads exactly, numbers to 1e-6."""
    from dynheads_tl.analysis.scoring import static_top_k
    from dynheads_tl.claims.irreplaceability import GRID_CONDITIONS
    from dynheads_tl.engine.equations import Eq2Rule
    from dynheads_tl.engine.tracing import TraceConfig
    from dynheads_tl.protocols.ablation import AblationSetup, grid_experiment, progressive_experiment
    from dynheads_tl.tasks import make_hotpot_samples

    model = embedded_model
    scores = torch.rand(model.cfg.n_layers, model.cfg.n_heads, generator=torch.Generator().manual_seed(5))
    order = torch.argsort(scores.flatten(), descending=True, stable=True)

    def setup(kind, threshold):
        return AblationSetup(static_mask=static_top_k(scores, 4), static_top20=static_top_k(scores, 20), k=4,
                             kind=kind, threshold=threshold, seed=3, static_order=order, query_order=order.flip(0))

    [niah] = _niah(model, 1)
    [hotpot] = make_hotpot_samples(model.tokenizer, n=1, seed=3, context_tokens=250, max_tokens=int(model.cfg.n_ctx))
    niah_setup, hotpot_setup = setup("eq1", 0.1), setup("eq2", Eq2Rule("chance", 3.0))
    # four NIAH steps: the dynamic and progressive runs already mask heads within them (asserted below)
    niah_config, hotpot_config = TraceConfig(max_new_tokens=4), TraceConfig(max_new_tokens=4)

    # A condition of each kind of selector (each reads another part of the setup on the worker).
    conditions = ["none", "dynamic", "static", "static_matched", "query_matched", "random_matched", "random_nondynamic"]

    def run():
        grid = grid_experiment(model, [({"context": 300, "depth": 0.5, "run": 0}, niah)], niah_setup, niah_config,
                               conditions=conditions, batch_size=4, teacher_forced=False)
        progressive, new_heads = progressive_experiment(model, [niah], niah_setup, niah_config, [0, 5], batch_size=3)
        hotpot_grid = grid_experiment(model, [({"context": 250, "depth": 0.5, "run": 0}, hotpot)], hotpot_setup,
                                      hotpot_config, conditions=["none", "dynamic", "static"], batch_size=3,
                                      teacher_forced=True)
        return grid, progressive, new_heads, hotpot_grid

    _bind_for_the_test(monkeypatch, LocalExecutor(), embedded_model)
    with _one_thread():
        local = run()
    batches = []
    original = ray_executor.map

    def counting(model, compute, batches_, **kwargs):
        batches.append((compute.__name__, len(batches_)))
        yield from original(model, compute, batches_, **kwargs)

    monkeypatch.setattr(ray_executor, "map", counting)
    _bind_for_the_test(monkeypatch, ray_executor, embedded_model)
    remote = run()
    # Every run went to the workers: 7 NIAH runs in batches of 4, the progressive sample's 4 runs (unmasked, k = 0,
    # k = 5 and its random control) in batches of 3, 3 generated and 3 teacher-forced HotpotQA runs (teacher forcing
    # feeds the whole gold continuation: the short HotpotQA answer).
    assert batches == [("ablation_units", 2), ("ablation_units", 2), ("ablation_units", 2)]
    grid, progressive, new_heads, hotpot_grid = local
    assert list(grid["condition"]) == conditions and set(conditions) <= set(GRID_CONDITIONS)
    assert (grid.set_index("condition").loc["dynamic", "heads_ever_masked"] != ""), "D_t is masked: the runs differ"
    assert (progressive["k"] == 5).any() and (progressive["heads_ever_masked"] != "").any()
    assert progressive["ranking"].tolist() == ["ranked", "ranked", "random"]
    assert (hotpot_grid["tf_steps"] > 0).all(), "the HotpotQA runs were teacher-forced too"
    _same_frames(grid, remote[0], "NIAH grid")
    _same_frames(progressive, remote[1], "progressive")
    assert torch.equal(new_heads, remote[2])
    _same_frames(hotpot_grid, remote[3], "HotpotQA grid")


@needs_ray
def test_ray_traces_equal_local_traces_even_when_a_worker_is_killed(embedded_model, ray_executor, tmp_path,
                                                                    monkeypatch):
    """Four traced samples, one per batch, on two workers; one worker is killed while it traces. The lost batch is
    retried on a new worker, every result is written by the driver into the cache, and the traces are those of
    the local backend: tokens and Eq. 1 sets exactly, floats to 1e-6."""
    from dynheads_tl.corpus import collect_traces
    from dynheads_tl.engine.tracing import TraceConfig

    # six steps: a batch still runs long enough to be killed mid-way (asserted below)
    samples, config = _niah(embedded_model, 4), TraceConfig(max_new_tokens=6)
    _bind_for_the_test(monkeypatch, LocalExecutor(), embedded_model)
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
    retried = ray_executor.retried
    _bind_for_the_test(monkeypatch, ray_executor, embedded_model)
    killer.start()
    remote = collect_traces(embedded_model, samples, config, {"test": "ray"}, use_cache=True)
    killer.join(timeout=5)
    assert killed, "no worker was killed while it had a batch"
    assert ray_executor.retried >= retried + 1
    _same_traces(local, remote)
    # Written by the driver, one entry per sample, and read back from there on the next call.
    assert len(list(tmp_path.glob("traces/*.pt"))) == len(samples)
    _bind_for_the_test(monkeypatch, LocalExecutor(), embedded_model)
    again = collect_traces(embedded_model, samples, config, {"test": "ray"}, use_cache=True)
    _same_traces(remote, again)
