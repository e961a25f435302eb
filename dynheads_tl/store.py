"""On-disk cache keyed by a hash of the config that produced a result; atomic writes; self-healing reads.

The bottom layer: it imports nothing else of the package, so every layer above (the engine's trace files, the
claims' results, the report's pages and figures) writes through the same :func:`atomic_write`.

An interrupted run resumes: finished entries are read back, and a half-written file never exists
under its final name (writes go to a temporary file that is renamed when complete, see
:func:`atomic_write`). An entry that cannot be read anyway (truncated by a full
disk or a copy, or written by an older layout) is moved aside to ``NAME.corrupt`` with a warning and
recomputed, so one damaged file costs one recomputation instead of failing every later run. An entry this run
may not read (its permissions) is treated the same way; when it cannot be replaced either, the run stops with a
:class:`CacheError` sentence, never a traceback. Traces are cached through the same keys and healing by
:func:`dynheads_tl.engine.trace_data.cached_traces`.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, Callable

logger = logging.getLogger(__name__)
# Bump when what a key means changes, so older entries are never read as new ones.
# 2: model keys carry models.model_fingerprint (what the model is), not only the name it was loaded by.
# 3: no entry is read under another key than its own (a cache written under the keys of version 2 is recomputed).
STORE_VERSION = 3


def cache_dir() -> Path:
    """The cache's root: ``$DYNHEADS_CACHE`` or ``~/.cache/dynheads_tl`` (converted models, traces, results, locks)."""
    root = os.environ.get("DYNHEADS_CACHE") or Path.home() / ".cache" / "dynheads_tl"
    return Path(root).expanduser()


def _umask() -> int:
    """The process's umask (read by setting it and putting it back; os has no getter)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# Files get the mode an ordinary open() would give them (0666 less the umask), not mkstemp's private 0600: a
# cache or report folder shared by a group stays readable to it. Read once, at import.
_FILE_MODE = 0o666 & ~_umask()


def atomic_write(path: str | Path, write: Callable[[BinaryIO], None]) -> Path:
    """Write ``path`` all at once or not at all: ``write`` fills a temporary file in the same folder,
    which is flushed to disk and then renamed over ``path``.

    Why: a run killed mid-write (or a full disk) must never leave a half-written file under the final
    name, since every later run would read it as a finished result. The temporary name ends in
    ``.tmp`` and is removed if ``write`` fails. This is the one writer for every cache and result file. The file
    gets the mode ``open()`` would give it (0666 less the umask), not the temporary file's 0600.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), _FILE_MODE)
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())  # the data is on disk before the name points at it
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """:func:`atomic_write` for UTF-8 text (JSON results, sidecars, CSV and Markdown tables)."""
    return atomic_write(path, lambda handle: handle.write(text.encode("utf-8")))


def atomic_torch_save(obj: Any, path: str | Path) -> Path:
    """:func:`atomic_write` for ``torch.save``."""
    import torch

    return atomic_write(path, lambda handle: torch.save(obj, handle))


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


# Every heal warning starts with this, so the report runner can repeat them on the terminal (a notebook's own
# warnings land in the executed notebook only).
HEAL_PREFIX = "Cache entry "


class CacheError(RuntimeError):
    """A cache entry or folder this run can neither read nor replace; the message says which and what to do."""


def _reason(error: BaseException) -> str:
    """A short phrase for why a file could not be read: the first line of the error, without torch's advice to
    load with ``weights_only=False`` (which runs arbitrary code from the file, wrong advice for a damaged cache)."""
    if isinstance(error, PermissionError):
        return "permission denied"
    text = str(error)
    if "weights_only" in text or "Weights only load failed" in text:
        unsupported = next((line.strip() for line in text.splitlines() if "Unsupported global" in line), "")
        return "it holds objects that a safe (weights-only) load refuses" + (f": {unsupported}" if unsupported else "")
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def quarantine(path: Path, error: BaseException) -> Path:
    """Move an unreadable cache entry to ``NAME.corrupt`` (replacing an older one), kept for inspection, and log
    a warning naming it and why. Returns the new path. When the entry can neither be moved nor will be
    replaceable (its folder is not writable), raise :class:`CacheError` with a sentence instead."""
    aside = path.with_name(path.name + ".corrupt")
    try:
        os.replace(path, aside)
    except OSError as move_error:
        if not os.access(path.parent, os.W_OK):
            raise CacheError(
                f"Cache entry {path} cannot be read ({_reason(error)}), and its folder is not writable, so it cannot "
                f"be recomputed in place ({_reason(move_error)}); fix the permissions (chmod u+rw), remove the "
                "entry, or point DYNHEADS_CACHE at another folder.") from error
        logger.warning("%s%s is unreadable (%s); recomputing it (it could not be moved aside: %s).",
                       HEAL_PREFIX, path, _reason(error), _reason(move_error))
        return aside
    logger.warning("%s%s is unreadable (%s); moved it to %s and recomputing it.",
                   HEAL_PREFIX, path, _reason(error), aside.name)
    return aside


def _probe_write(folder: Path) -> None:
    """Create and remove a file in ``folder`` (tests replace it to act as a non-root user would see)."""
    with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
        pass


def _read_text(path: Path) -> str:
    """A cache entry's text (tests replace it to simulate an entry this user may not read)."""
    return path.read_text(encoding="utf-8")


def check_writable_folder(path: str | Path, what: str, hint: str) -> Path:
    """Check that folder ``path`` exists and takes a new file, or can be created (its nearest existing parent takes
    one), creating nothing; else a ValueError with one sentence naming the folder, the reason and ``hint`` (what
    to do). Returns the path."""
    path = Path(path).absolute()
    existing = next(p for p in [path, *path.parents] if p.exists())
    if not existing.is_dir():
        where = "is a file" if existing == path else f"lies under {existing}, which is a file"
        raise ValueError(f"The {what} {path} {where}, not a folder; {hint}.")
    try:
        _probe_write(existing)
    except OSError as error:
        reason = _reason(error) if isinstance(error, PermissionError) else (error.strerror or str(error))
        problem = "cannot be written" if existing == path else f"cannot be created: {existing} is not writable"
        raise ValueError(f"The {what} {path} {problem} ({reason}); {hint}, or fix the permissions.") from error
    return path


def check_cache_writable(root: Path | None = None) -> Path:
    """The cache folder (``$DYNHEADS_CACHE``) and its entry folders can be created and written."""
    root = Path(root or cache_dir())
    hint = "set DYNHEADS_CACHE to another folder"
    check_writable_folder(root, "cache folder (DYNHEADS_CACHE)", hint)
    for sub in ("traces", "results"):
        if (root / sub).exists():
            check_writable_folder(root / sub, "cache folder", hint)
    return root


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
        entry = json.loads(_read_text(path))
        if not isinstance(entry, dict) or "result" not in entry:
            raise KeyError("no 'result' field")
        if _canonical(entry.get("config")) != _canonical(config):
            raise ValueError("the entry records a different config")
        return entry["result"]
    except (ValueError, KeyError, UnicodeDecodeError, PermissionError, IsADirectoryError) as error:
        quarantine(path, error)  # JSONDecodeError is a ValueError
        return None


def save_cached_json(config: dict[str, Any], result: Any, *, root: Path | None = None) -> Any:
    """Cache a JSON-serialisable ``result`` (e.g. one ablation run's scores) under ``config``, atomically;
    :func:`load_cached_json` reads it back. Returns ``result``."""
    atomic_write_text(result_path(config, root), json.dumps({"config": config, "result": result}, default=str))
    return result
