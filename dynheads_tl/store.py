"""On-disk cache keyed by a hash of the config that produced a result; atomic writes.

An interrupted run resumes: finished entries are read back, and a half-written file never exists
under its final name (writes go to a temporary file that is renamed when complete).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable

from .models import cache_dir
from .tracing import Trace, load_traces, save_traces

logger = logging.getLogger(__name__)
STORE_VERSION = 1


def config_hash(config: dict[str, Any]) -> str:
    blob = json.dumps({"store_version": STORE_VERSION, **config}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def traces_path(config: dict[str, Any], root: Path | None = None) -> Path:
    return Path(root or cache_dir() / "traces") / f"{config_hash(config)}.pt"


def cached_traces(config: dict[str, Any], compute: Callable[[], list[Trace]], *,
                  root: Path | None = None, use_cache: bool = True) -> list[Trace]:
    """Load the traces for ``config`` if present, else compute, save atomically and return them."""
    path = traces_path(config, root)
    if use_cache and path.exists():
        logger.info("cache hit %s", path.name)
        return load_traces(path)
    traces = compute()
    if use_cache:
        save_traces(traces, path)
        path.with_suffix(".json").write_text(json.dumps(config, indent=1, sort_keys=True, default=str))
    return traces


def _json_path(config: dict[str, Any], root: Path | None) -> Path:
    return Path(root or cache_dir() / "results") / f"{config_hash(config)}.json"


def load_cached_json(config: dict[str, Any], *, root: Path | None = None) -> Any | None:
    """The cached result for ``config``, or None when there is none yet."""
    path = _json_path(config, root)
    return json.loads(path.read_text())["result"] if path.exists() else None


def save_cached_json(config: dict[str, Any], result: Any, *, root: Path | None = None) -> Any:
    """Cache a JSON-serialisable ``result`` (e.g. one ablation run's scores) under ``config``, atomically;
    :func:`load_cached_json` reads it back. Returns ``result``."""
    path = _json_path(config, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"config": config, "result": result}, default=str))
    os.replace(tmp, path)
    return result
