"""The checksum manifest of a converted model folder: written once the conversion is complete, checked on every load."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

MANIFEST_NAME = "CHECKSUM.json"
ManifestCheck = Literal["size", "sha256"]


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, read in blocks (a converted model's files, a GGUF and its parts)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(folder: str | Path) -> Path:
    """Record the size and sha256 of every file in ``folder`` (recursively) in ``CHECKSUM.json``.

    Written inside the conversion's temporary folder, before it is renamed into place, so the
    manifest always describes a complete conversion.
    """
    folder = Path(folder)
    files = {
        path.relative_to(folder).as_posix(): {"size": path.stat().st_size, "sha256": file_sha256(path)}
        for path in sorted(folder.rglob("*")) if path.is_file() and path.name != MANIFEST_NAME
    }
    manifest = folder / MANIFEST_NAME
    manifest.write_text(json.dumps({"format": 1, "files": files}, indent=1, sort_keys=True) + "\n")
    return manifest


def manifest_problem(folder: str | Path, check: ManifestCheck = "size") -> str | None:
    """What is wrong with a converted model folder, as a phrase, or None when it matches its manifest.

    ``check="size"`` only compares each recorded file's size (a few ``stat`` calls, done on every
    load, catching truncation and missing files); ``"sha256"`` re-hashes every file (seconds; done by
    ``dynheads install-model``). A folder without a manifest counts as unverified.
    """
    if check not in ("size", "sha256"):
        raise ValueError(f"check must be 'size' or 'sha256', got {check!r}.")
    folder = Path(folder)
    if not folder.is_dir():
        return "the folder does not exist"
    try:
        files = json.loads((folder / MANIFEST_NAME).read_text())["files"]
        records = [(name, int(entry["size"]), str(entry["sha256"])) for name, entry in files.items()]
    except FileNotFoundError:
        return f"it has no {MANIFEST_NAME} (converted by an older version, or interrupted)"
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        return f"its {MANIFEST_NAME} is unreadable ({type(error).__name__}: {error})"
    if not records:
        return f"its {MANIFEST_NAME} lists no files"
    for name, size, sha256 in records:
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes where {size} were written"
        if check == "sha256" and file_sha256(path) != sha256:
            return f"{name} does not match its recorded sha256"
    return None
