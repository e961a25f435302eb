"""On-disk cache keyed by a hash of the config that produced a result; atomic writes; self-healing reads.

An interrupted run resumes: finished entries are read back, and a half-written file never exists
under its final name (writes go to a temporary file that is renamed when complete, see
:func:`dynheads_tl.engine.tracing.atomic_write`). An entry that cannot be read anyway (truncated by a full
disk or a copy, or written by an older layout) is moved aside to ``NAME.corrupt`` with a warning and
recomputed, so one damaged file costs one recomputation instead of failing every later run.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable

from dynheads_tl.engine.models import cache_dir
from dynheads_tl.engine.tracing import Trace, UnreadableFileError, atomic_write_text, load_traces, save_traces

logger = logging.getLogger(__name__)
# Bump when what a key means changes, so older entries are never read as new ones.
# 2: model keys carry models.model_fingerprint (what the model is), not only the name it was loaded by.
STORE_VERSION = 2


def config_hash(config: dict[str, Any]) -> str:
    blob = json.dumps({"store_version": STORE_VERSION, **config}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def tensor_digest(*tensors) -> str:
    """A short hash of tensors' shapes and values (as float32 on the CPU): names trained or computed inputs, such
    as a probe's weights or static head scores, in a cache key."""
    import torch

    digest = hashlib.sha256()
    for tensor in tensors:
        values = torch.as_tensor(tensor).detach().float().cpu().contiguous()
        digest.update(f"{tuple(values.shape)};".encode())
        digest.update(values.numpy().tobytes())
    return digest.hexdigest()[:16]


def traces_path(config: dict[str, Any], root: Path | None = None) -> Path:
    return Path(root or cache_dir() / "traces") / f"{config_hash(config)}.pt"


def quarantine(path: Path, error: Exception) -> Path:
    """Move an unreadable cache entry to ``NAME.corrupt`` (replacing an older one), kept for
    inspection, and log a warning naming it. Returns the new path."""
    aside = path.with_name(path.name + ".corrupt")
    logger.warning("Cache entry %s is unreadable (%s: %s); moved it to %s and recomputing it.",
                   path, type(error).__name__, error, aside.name)
    try:
        os.replace(path, aside)
    except OSError as move_error:  # the atomic rewrite will replace it anyway
        logger.warning("Could not move %s aside (%s); it will be overwritten.", path, move_error)
    return aside


def cached_traces(config: dict[str, Any], compute: Callable[[], list[Trace]], *,
                  root: Path | None = None, use_cache: bool = True) -> list[Trace]:
    """Load the traces for ``config`` if present and readable, else compute, save atomically and
    return them (an unreadable entry is set aside, see :func:`quarantine`)."""
    path = traces_path(config, root)
    if use_cache and path.exists():
        try:
            traces = load_traces(path)
            logger.info("cache hit %s", path.name)
            return traces
        except UnreadableFileError as error:
            quarantine(path, error.__cause__ or error)
    traces = compute()
    if use_cache:
        save_traces(traces, path)
        # Sidecar for people browsing the cache; written after the traces, so it never describes a missing file.
        atomic_write_text(path.with_suffix(".json"), json.dumps(config, indent=1, sort_keys=True, default=str))
    return traces


def result_path(config: dict[str, Any], root: Path | None = None) -> Path:
    """Where the JSON result cached under ``config`` lives (it may not exist yet)."""
    return Path(root or cache_dir() / "results") / f"{config_hash(config)}.json"


def _canonical(config: Any) -> str:
    return json.dumps(config, sort_keys=True, default=str)


def load_cached_json(config: dict[str, Any], *, root: Path | None = None) -> Any | None:
    """The cached result for ``config``, or None when there is none yet, or when the entry is
    unreadable or records another config (then it is set aside, see :func:`quarantine`)."""
    path = result_path(config, root)
    if not path.exists():
        return None
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(entry, dict) or "result" not in entry:
            raise KeyError("no 'result' field")
        if _canonical(entry.get("config")) != _canonical(config):
            raise ValueError("the entry records a different config")
        return entry["result"]
    except (ValueError, KeyError, UnicodeDecodeError) as error:  # JSONDecodeError is a ValueError
        quarantine(path, error)
        return None


def save_cached_json(config: dict[str, Any], result: Any, *, root: Path | None = None) -> Any:
    """Cache a JSON-serialisable ``result`` (e.g. one ablation run's scores) under ``config``, atomically;
    :func:`load_cached_json` reads it back. Returns ``result``."""
    atomic_write_text(result_path(config, root), json.dumps({"config": config, "result": result}, default=str))
    return result
