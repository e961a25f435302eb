"""Work as units: a claim plans its units, an executor computes the missing ones, the claim assembles its
tables from what comes back (and from the cache).

A *unit* is one traced sample, one ablation job (sample, condition, k), one retention sample, one RAG answer.
Traces, ablation jobs, retention samples and RAG answers each have their own cache keys, the same on every backend;
the claim reads the finished ones from the cache and hands the missing ones to the model's executor, grouped into
*batches* exactly as the local code batches them (so a batch decodes the same rows
on every backend, and results agree whatever runs them). The executor calls ``compute(model, payloads, *args)``
for each batch and yields ``(batch index, results)`` as batches finish; the claim writes each result atomically
into the cache as it arrives, so an interrupted run resumes at the first missing unit on any backend.

Two executors:

- :class:`LocalExecutor` (the default): the batches in order, in this process, on the model the notebook
  loaded.
- :class:`RayExecutor`: one Ray actor per GPU of the cluster (or per CPU slot on a cluster without GPUs), each
  holding its own copy of the model, loaded by name with the run's ``device`` and ``dtype``. Batches go to idle
  actors; results come back to the driver, which writes them. A batch lost with a failed or killed worker is
  put back in the queue and the worker replaced (at most ``max_retries`` times per batch). Each actor's model
  must have the driver's :func:`~dynheads_tl.engine.models.model_fingerprint` (the cache keys hold it), which
  is checked when the actor starts.

``compute`` and its ``args`` travel to the workers by pickling: ``compute`` must be a module-level function
of an installed package (every worker imports ``dynheads_tl``), ``args`` plain data, samples or tensors.

The notebooks choose the executor with their ``backend`` parameter: ``config.start()`` loads the model and binds
the executor to it (:func:`use_backend`, :func:`bind_executor`), and returns the model. An executor belongs to its
model (a Ray executor's actors load that model and check its fingerprint), so it is held per model, never swapped
for the whole process: the cached units (traces, ablation jobs, RAG answers, retention samples) go through
:func:`compute_missing`, which asks :func:`executor_for` the model it was given (local when none was bound) and
yields each missing unit's result under its index.
"""
from __future__ import annotations

import logging
import os
import socket
import time
import weakref
from collections import deque
from typing import Any, Callable, Iterator, Sequence

import torch

from dynheads_tl.engine.sharing import PrefixStore, shared_prefill, store_budget
from dynheads_tl.engine.models import load_model, model_fingerprint
from dynheads_tl.progress import progress
from dynheads_tl.store import load_cached_json, save_cached_json

logger = logging.getLogger(__name__)

BACKENDS = ("local", "ray")
RAY_INSTALL = 'pip install -e ".[ray]"'

Compute = Callable[..., list]


def _units_desc(desc: str, batches: Sequence[Sequence[Any]]) -> str:
    units = sum(len(batch) for batch in batches)
    return desc if units == len(batches) else f"{desc} ({units} units in {len(batches)} batches)"


class LocalExecutor:
    """Every batch in order, in this process, on the notebook's model (the default backend)."""

    name = "local"

    def map(self, model, compute: Compute, batches: Sequence[Sequence[Any]], *, args: tuple = (),
            desc: str = "units") -> Iterator[tuple[int, list]]:
        """Yield ``(i, compute(model, batches[i], *args))`` for every batch, in order, with progress. The batches
        share prompt prefixes (:func:`~dynheads_tl.engine.decoder.shared_prefill`): a batch copies the keys and
        values of a prefix an earlier batch of this call prefilled."""
        with shared_prefill():
            for index in progress(range(len(batches)), desc=_units_desc(desc, batches)):
                results = compute(model, list(batches[index]), *args)
                _check_length(results, batches[index], compute)
                yield index, results

    def close(self) -> None:
        return None


def _check_length(results: list, batch: Sequence[Any], compute: Compute) -> None:
    if len(results) != len(batch):
        raise RuntimeError(f"{getattr(compute, '__name__', compute)} returned {len(results)} results for a batch of "
                           f"{len(batch)} units.")


def require_ray():
    """The ``ray`` module, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError as error:
        raise ImportError(f"backend='ray' needs Ray, which is an optional extra: {RAY_INSTALL} "
                          "(or `pip install ray`).") from error
    return ray


class _Worker:
    """A Ray actor's state: its own model, loaded once (wrapped by ``ray.remote`` in :class:`RayExecutor`)."""

    def __init__(self, load: Callable[[], Any], threads: int | None):
        if threads:
            torch.set_num_threads(threads)
        self.model = load()
        self.store = PrefixStore(store_budget())  # shared prompt prefixes across this actor's batches

    def fingerprint(self) -> str:
        return model_fingerprint(self.model)

    def pid(self) -> int:
        return os.getpid()

    def run(self, compute: Compute, batch: list, args: tuple) -> list:
        with shared_prefill(self.store):
            return compute(self.model, batch, *args)


class ModelLoader:
    """A picklable recipe for the actors' model: :func:`~dynheads_tl.engine.models.load_model` by name, with the
    run's device and dtype (``"auto"``: CUDA with bf16 where the actor has a GPU, CPU with fp32 otherwise)."""

    def __init__(self, name: str, device: str = "auto", dtype: str = "auto"):
        self.name, self.device, self.dtype = name, device, dtype

    def __call__(self):
        # Ray gives each GPU actor one GPU, which it sees as cuda:0, whatever the driver's cuda:N.
        device = "cuda" if self.device.startswith("cuda") else self.device
        return load_model(self.name, device=device, dtype=self.dtype)

    def __repr__(self) -> str:
        return f"ModelLoader({self.name!r}, device={self.device!r}, dtype={self.dtype!r})"


class RayExecutor:
    """Batches on a Ray cluster: one actor per GPU (or per ``cpus_per_actor`` CPUs where the cluster has no GPU).

    ``address``: an existing cluster (``ray start --head`` printed it; ``"auto"`` finds one on this machine);
    empty: a local cluster of this machine's CPUs (``num_cpus``, default all). ``load``: how an actor builds its
    model (a :class:`ModelLoader`). ``actors`` caps how many start (default: as many as the resources allow).
    ``expected_fingerprint``: the driver's model fingerprint, which every actor's model must match; a pool that
    fails the check is stopped, and the next call starts and checks a new one. ``start_timeout``: how long an
    actor may take to load its model. Each CPU actor runs ``cpus_per_actor`` torch threads: float results equal
    a local run's with as many threads, and differ from other thread counts by rounding.
    """

    name = "ray"

    def __init__(self, load: Callable[[], Any], *, address: str = "", num_cpus: int | None = None,
                 actors: int | None = None, cpus_per_actor: int = 1, max_retries: int = 3,
                 expected_fingerprint: str | None = None, start_timeout: float = 1800.0):
        if actors is not None and (not isinstance(actors, int) or actors < 1):
            raise ValueError(f"actors must be a positive integer, got {actors!r}.")
        if not isinstance(cpus_per_actor, int) or cpus_per_actor < 1:
            raise ValueError(f"cpus_per_actor must be a positive integer, got {cpus_per_actor!r}.")
        self.ray = require_ray()
        self.load, self.address, self.num_cpus = load, address, num_cpus
        self.max_actors, self.cpus_per_actor, self.max_retries = actors, cpus_per_actor, max_retries
        self.expected_fingerprint = expected_fingerprint
        self.start_timeout = start_timeout  # seconds an actor may take to load its model (an 8B one from the hub)
        self.actors: list = []
        self.retried = 0  # batches put back in the queue after their worker died
        self.in_flight: dict[int, tuple[int, float]] = {}  # actor slot -> (batch, when it was sent), during map
        self._started_ray = False

    # -- the cluster ------------------------------------------------------------------------------------
    def _connect(self) -> None:
        ray = self.ray
        if ray.is_initialized():
            return
        kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
        # Ray's start-up notices (token authentication, "Started a local Ray instance") would land in every
        # executed notebook; its errors still show.
        ray_log = logging.getLogger("ray")
        level = ray_log.level
        ray_log.setLevel(logging.ERROR)
        try:
            if self.address:
                ray.init(address=self.address, **kwargs)
            else:
                ray.init(num_cpus=self.num_cpus or os.cpu_count() or 1, **kwargs)
                self._started_ray = True
        finally:
            ray_log.setLevel(level)

    def _plan(self) -> tuple[int, dict[str, Any]]:
        """How many actors, and each one's resources: a GPU each where the cluster has GPUs, else CPU slots."""
        resources = self.ray.cluster_resources()
        gpus, cpus = int(resources.get("GPU", 0)), int(resources.get("CPU", 0))
        if gpus:
            count, options = gpus, {"num_gpus": 1, "num_cpus": 1}
        else:
            count, options = max(1, cpus // self.cpus_per_actor), {"num_cpus": self.cpus_per_actor}
        return min(count, self.max_actors or count), options

    def _new_actor(self):
        _, options = self._plan()
        threads = None if "num_gpus" in options else self.cpus_per_actor
        actor = self.ray.remote(max_restarts=0, max_concurrency=1, **options)(_Worker).remote(self.load, threads)
        return actor

    def _start(self) -> None:
        if self.actors:
            return
        self._connect()
        count, _ = self._plan()
        started = time.time()
        actors = [self._new_actor() for _ in range(count)]
        try:
            self._check_fingerprints(self.ray.get([actor.fingerprint.remote() for actor in actors],
                                                  timeout=self.start_timeout))
        except BaseException:
            for actor in actors:  # a refused (or unstartable) pool is never kept for a later call
                self._kill(actor)
            raise
        self.actors = actors
        logger.info("Ray: %d actor(s) loaded the model in %.0f s", count, time.time() - started)

    def _kill(self, actor) -> None:
        try:
            self.ray.kill(actor, no_restart=True)
        except Exception:  # an actor that already died
            pass

    def _replace(self, slot: int) -> None:
        """A new actor in ``slot`` (the old one killed, in case it is only unreachable and still holds its GPU),
        checked like the first ones; on failure the executor stops using every actor."""
        self._kill(self.actors[slot])
        self.actors[slot] = self._new_actor()
        try:
            self._check_fingerprints([self.ray.get(self.actors[slot].fingerprint.remote(), timeout=self.start_timeout)])
        except BaseException:
            self.close_actors()
            raise

    def _check_fingerprints(self, prints: list[str]) -> None:
        wrong = [p for p in prints if self.expected_fingerprint is not None and p != self.expected_fingerprint]
        if wrong:
            raise RuntimeError(
                f"A Ray worker's model ({self.load!r}) is not the driver's model: fingerprint {wrong[0]} against "
                f"{self.expected_fingerprint}. The cache keys hold the driver's fingerprint, so the workers must load "
                "the same weights with the same dtype; give the driver and the workers the same model, device class "
                "and dtype (a driver on CPU in float32 and workers on GPU in bfloat16 differ: run the driver on a GPU "
                "node, or give --dtype bfloat16).")

    # -- the work ---------------------------------------------------------------------------------------
    def map(self, model, compute: Compute, batches: Sequence[Sequence[Any]], *, args: tuple = (),
            desc: str = "units") -> Iterator[tuple[int, list]]:
        """Yield ``(i, results of batch i)`` as batches finish, in any order; ``model`` (the driver's) is not
        used for computing. A batch whose worker dies is queued again on a fresh worker."""
        if not batches:
            return
        self._start()
        ray = self.ray
        queue = deque(range(len(batches)))
        attempts = [0] * len(batches)
        running: dict[Any, tuple[int, int]] = {}  # future -> (batch, actor slot)
        idle = deque(range(len(self.actors)))
        arg_ref = ray.put(args)

        def finished() -> Iterator[tuple[int, list]]:
            try:
                while queue or running:
                    while queue and idle:
                        index, slot = queue.popleft(), idle.popleft()
                        future = self.actors[slot].run.remote(compute, list(batches[index]), arg_ref)
                        running[future] = (index, slot)
                        self.in_flight[slot] = (index, time.time())
                    [done], _ = ray.wait(list(running), num_returns=1)
                    index, slot = running.pop(done)
                    self.in_flight.pop(slot, None)
                    try:
                        results = ray.get(done)
                    except ray.exceptions.RayActorError as error:
                        attempts[index] += 1
                        if attempts[index] > self.max_retries:
                            raise RuntimeError(f"Batch {index} lost its worker {attempts[index]} times; "
                                               "giving up.") from error
                        self.retried += 1
                        logger.warning("A Ray worker died (%s); batch %d goes back in the queue on a new worker.",
                                       type(error).__name__, index)
                        self._replace(slot)
                        queue.appendleft(index)
                        idle.append(slot)
                        continue
                    idle.append(slot)
                    _check_length(results, batches[index], compute)
                    yield index, results
            finally:  # an error, or a caller that stops early: no orphaned batch keeps an actor busy
                for future in running:
                    try:
                        ray.cancel(future)
                    except Exception:
                        pass
                self.in_flight.clear()

        yield from progress(finished(), desc=_units_desc(f"{desc} on {len(self.actors)} Ray workers", batches),
                            total=len(batches))

    def close_actors(self) -> None:
        """Stop the actors; a later :meth:`map` starts (and checks) new ones."""
        for actor in self.actors:
            self._kill(actor)
        self.actors = []

    def close(self) -> None:
        """Stop the actors (and the local cluster this executor started)."""
        self.close_actors()
        if self._started_ray and self.ray.is_initialized():
            self.ray.shutdown()
            self._started_ray = False


# Each model's executor: the one a config's start bound to it (:func:`bind_executor`), else local. An executor
# belongs to one model (a Ray executor's actors load that model and check its fingerprint), so it is held per model,
# not per process: binding one model's executor leaves every other model's alone. Weak keys: a model that is
# garbage-collected drops its entry.
_BOUND: "weakref.WeakKeyDictionary[Any, LocalExecutor | RayExecutor]" = weakref.WeakKeyDictionary()
_CLOSERS: "weakref.WeakKeyDictionary[Any, weakref.finalize]" = weakref.WeakKeyDictionary()  # each bound one's closer
_LOCAL = LocalExecutor()


def executor_for(model) -> LocalExecutor | RayExecutor:
    """The executor that computes ``model``'s missing units: the one bound to it, else the local one (also for an
    object that cannot be bound, such as None)."""
    try:
        return _BOUND.get(model, _LOCAL)
    except TypeError:  # not weak-referenceable: nothing can have been bound to it
        return _LOCAL


def bind_executor(model, executor: LocalExecutor | RayExecutor) -> LocalExecutor | RayExecutor:
    """Make ``executor`` compute ``model``'s units; returns it. The executor bound before, if another, is closed
    now, and this one is closed when the model is garbage-collected (a notebook that runs ``config.start()`` again
    loads a new model: the old model's Ray actors are stopped with it instead of holding their slots)."""
    previous = _BOUND.get(model)
    if previous is not executor:
        closer = _CLOSERS.pop(model, None)
        if closer is not None:
            closer.detach()
        if previous is not None:
            previous.close()
        _BOUND[model] = executor
        _CLOSERS[model] = weakref.finalize(model, executor.close)
    return executor


def chunks_by_label(indices: Sequence[int], labels: Sequence[Any], batch_size: int) -> dict[Any, list[list[int]]]:
    """``indices`` split by their ``labels`` (a label per unit, read at each index), labels in order of first
    appearance, each label's indices in their order and in chunks of at most ``batch_size``: batches that never
    mix labels (grid cells, haystack layouts, generated and teacher-forced runs)."""
    members: dict[Any, list[int]] = {}
    for i in indices:
        members.setdefault(labels[i], []).append(i)
    return {label: [part[start: start + batch_size] for start in range(0, len(part), batch_size)]
            for label, part in members.items()}


def compute_missing(model, compute: Compute, chunks: Sequence[Sequence[int]], unit: Callable[[int], Any], *,
                    args: tuple = (), desc: str = "units") -> Iterator[tuple[int, Any]]:
    """The claims' one way of handing work to ``model``'s executor (:func:`executor_for`). ``chunks`` are lists of unit indices (the
    units missing from the cache, batched as the claim batches them) and ``unit(i)`` is unit ``i``'s payload.
    Yields ``(unit index, result)`` as each batch comes back, so the caller caches every result as it arrives."""
    batches = [[unit(i) for i in chunk] for chunk in chunks]
    for number, results in executor_for(model).map(model, compute, batches, args=args, desc=desc):
        yield from zip(chunks[number], results)


def cached_units(model, compute: Compute, keys: Sequence[dict | None], plan: Callable[[list[int]], Sequence[Sequence[int]]],
                 unit: Callable[[int], Any], *, args: tuple = (), desc: str = "units") -> list[Any]:
    """The claims' one "read the cache, compute what is missing, cache it" loop for JSON units: ``keys`` has one cache
    key per unit (None: that unit is not cached and always computed); every cached unit is read back, ``plan(missing
    indices)`` batches the rest, :func:`compute_missing` hands the batches to the model's executor, and each result
    is cached as its batch comes back (an interrupted run keeps what it finished). Returns the results in unit
    order."""
    results: list[Any] = [None if key is None else load_cached_json(key) for key in keys]
    missing = [i for i, result in enumerate(results) if result is None]
    for i, result in compute_missing(model, compute, plan(missing), unit, args=args, desc=desc):
        results[i] = result if keys[i] is None else save_cached_json(keys[i], result)
    return results


def check_backend(backend: str, address: str = "") -> None:
    """``backend`` and ``ray_address`` as parameters: a known backend, an address only with Ray, and Ray installed."""
    if backend not in BACKENDS:
        raise ValueError(f"Parameter 'backend' must be one of {list(BACKENDS)}, got {backend!r}.")
    if not isinstance(address, str):
        raise ValueError(f"Parameter 'ray_address' must be a string (empty: a local cluster), got {address!r}.")
    if address and backend != "ray":
        raise ValueError(f"Parameter 'ray_address' ({address!r}) is only used with backend='ray'.")
    if backend == "ray":
        require_ray()
        if address:
            check_ray_address(address)


# How long a Ray address has to answer before the run is refused (a cluster's GCS answers in milliseconds).
RAY_ADDRESS_TIMEOUT = 3.0


def _resolve_auto_address() -> str:
    """The address 'auto' stands for (RAY_ADDRESS, else the cluster that ``ray start`` left on this machine), or a
    ValueError that says none runs."""
    try:
        from ray._private.services import get_ray_address_from_environment
    except ImportError:  # pragma: no cover - a Ray without this helper: ray.init reports it
        return ""
    try:
        found = get_ray_address_from_environment("auto", None)
    except ConnectionError as error:
        raise ValueError("Parameter 'ray_address' is 'auto', but no Ray cluster runs on this machine (and RAY_ADDRESS "
                         "is not set); start one with `ray start --head`, pass its address, or leave ray_address "
                         "empty for a local cluster of this machine.") from error
    return "" if found in (None, "auto") else str(found)


def check_ray_address(address: str, *, timeout: float | None = None) -> None:
    """``address`` (``HOST:PORT``, ``ray://HOST:PORT`` or ``auto``) answers a TCP connection within ``timeout``
    seconds (:data:`RAY_ADDRESS_TIMEOUT`): refused with one sentence before any model is loaded, instead of Ray's
    minutes of retries and a traceback."""
    timeout = RAY_ADDRESS_TIMEOUT if timeout is None else timeout
    target = _resolve_auto_address() if address == "auto" else address
    if not target:
        return
    bare = target.split("://", 1)[1] if "://" in target else target
    host, _, port = bare.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"Parameter 'ray_address' must look like HOST:PORT (as `ray start --head` prints it), "
                         f"ray://HOST:PORT or 'auto', got {address!r}.")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as error:
        reason = "timed out" if isinstance(error, TimeoutError) else (error.strerror or type(error).__name__)
        shown = repr(address) if target == address else f"{address!r} ({target})"
        raise ValueError(f"Parameter 'ray_address' is {shown}, but nothing "
                         f"answers there within {timeout:g} s ({reason}); start the cluster with `ray start --head` "
                         "and pass the address it prints, or leave ray_address empty for a local cluster of this "
                         "machine.") from error


def use_backend(backend: str, model, *, name: str, device: str = "auto", dtype: str = "auto", address: str = "",
                **options: Any) -> LocalExecutor | RayExecutor:
    """The executor a notebook's ``backend`` parameter asks for, bound to ``model`` (:func:`bind_executor`): the
    driver's model, whose fingerprint the workers must match; ``name``, ``device`` and ``dtype`` are how each Ray
    actor loads its own. Returns it."""
    check_backend(backend, address)
    if backend == "local":
        return bind_executor(model, LocalExecutor())
    return bind_executor(model, RayExecutor(ModelLoader(name, device, dtype), address=address,
                                            expected_fingerprint=model_fingerprint(model), **options))
