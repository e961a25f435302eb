"""Haystack text sources for NIAH, all offline.

- ``filler``: RULER-style repeated noise sentences (written for this project). The easy haystack,
  where the embedded 135M model retrieves well; the default.
- ``prose``: real English prose shipped with CPython itself (the language reference topics in
  ``pydoc_data``), so it needs no download. Harder for small models.
- ``folder:PATH``: every ``.txt`` file in a folder, sorted by name and concatenated (point it at the
  Paul Graham essays that the standard NIAH harness uses).
"""
from __future__ import annotations

import re
from pathlib import Path

FILLER_SENTENCES = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
)


def filler_haystack(min_chars: int = 200_000) -> str:
    repeats = min_chars // len(FILLER_SENTENCES) + 1
    return FILLER_SENTENCES * repeats


def prose_haystack(min_chars: int = 200_000) -> str:
    """Python's reference documentation topics as running prose (code lines dropped)."""
    from pydoc_data.topics import topics

    paragraphs = []
    for key in sorted(topics):
        for block in topics[key].split("\n\n"):
            lines = [line.strip() for line in block.splitlines()]
            # Keep prose paragraphs; skip indented code, grammar rules and headings.
            if block.startswith("   ") or any(ch in block for ch in "*=") or len(block) < 120:
                continue
            text = " ".join(line for line in lines if line)
            if text.endswith("."):
                paragraphs.append(re.sub(r"\s+", " ", text))
    text = " ".join(paragraphs)
    if not text:
        raise RuntimeError("pydoc_data gave no prose paragraphs; use the filler haystack instead.")
    while len(text) < min_chars:
        text = text + " " + text
    return text


def folder_haystack(folder: str | Path, min_chars: int = 0) -> str:
    path = Path(folder).expanduser()
    files = sorted(path.glob("*.txt")) if path.is_dir() else []
    if not files:
        raise ValueError(f"Haystack folder {str(path)!r} holds no .txt files.")
    text = " ".join(" ".join(f.read_text(encoding="utf-8", errors="replace").split()) for f in files)
    while min_chars and len(text) < min_chars:
        text = text + " " + text
    return text


def load_haystack(source: str, min_chars: int = 200_000) -> str:
    """``"filler"``, ``"prose"`` or ``"folder:PATH"``."""
    if source == "filler":
        return filler_haystack(min_chars)
    if source == "prose":
        return prose_haystack(min_chars)
    if source.startswith("folder:"):
        return folder_haystack(source[len("folder:"):], min_chars)
    raise ValueError(
        f"Unknown haystack {source!r}; use 'filler', 'prose' or 'folder:/path/to/txt/files'."
    )
