"""Head-score files in and out: other tools' static heads as this suite's static set, and this suite's heads
in a form other tools read.

Two formats are read:

- **Wu et al.'s** ``head_score/<model>.json`` (``nightdessert/Retrieval_Head``): one JSON object whose keys are
  ``"layer-head"`` strings and whose values are the per-sample retrieval scores of that head (the head's score is
  their mean, as Wu et al.'s own code ranks them). A bare number as the value is read as the score itself.
- **A plain CSV** with the columns ``layer``, ``head`` and ``score`` (one row per head; further columns ignored).

Either must name every head of the model exactly once; a file whose layer x head shape differs from the model's
is refused with a sentence before any model work (:func:`check_head_file`, which reads the shape from the model's
config file without loading its weights). Heads are query heads (``num_attention_heads``), as in Wu's files.

:func:`write_head_scores` writes Wu's JSON format beside a provenance JSON (model name and fingerprint, tokenizer
and chat-template digests, prompt format, library versions, seeds, n, filter), so a file can be traced to the run
that made it and re-read here or by Wu's scripts.
"""
from __future__ import annotations

import csv
import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any, Sequence

import torch
from jaxtyping import Float
from torch import Tensor
from dynheads_tl.engine.preflight import model_head_shape
from dynheads_tl.engine.models import model_identity
from dynheads_tl.store import atomic_write_text

_KEY = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")
HEAD_FILE_SUFFIXES = (".json", ".csv")


def provenance_path(path: str | Path) -> Path:
    """The provenance file written beside a head-score file: ``<name>.provenance.json``."""
    path = Path(path)
    return path.with_name(path.stem + ".provenance.json")


def _from_entries(entries: dict[tuple[int, int], float], path: Path) -> Float[Tensor, "layer head"]:
    if not entries:
        raise ValueError(f"The head-score file {str(path)!r} names no heads.")
    n_layers = max(layer for layer, _ in entries) + 1
    n_heads = max(head for _, head in entries) + 1
    if len(entries) != n_layers * n_heads:
        raise ValueError(f"The head-score file {str(path)!r} names {len(entries)} heads, but its largest indices "
                         f"imply {n_layers} layers x {n_heads} heads = {n_layers * n_heads}; every head must have a score.")
    scores = torch.zeros(n_layers, n_heads, dtype=torch.float64)
    for (layer, head), value in entries.items():
        scores[layer, head] = value
    return scores


def _json_entries(path: Path) -> dict[tuple[int, int], float]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"The head-score file {str(path)!r} is not Wu et al.'s JSON format "
                         f"({{\"layer-head\": [scores...]}}): {error}.") from error
    if not isinstance(data, dict):
        raise ValueError(f"The head-score file {str(path)!r} holds a JSON {type(data).__name__}, not an object "
                         "keyed by \"layer-head\".")
    entries = {}
    for key, value in data.items():
        match = _KEY.match(str(key))
        if not match:
            raise ValueError(f"The head-score file {str(path)!r} has the key {key!r}; keys must be \"layer-head\" "
                             "(e.g. \"12-3\").")
        values = value if isinstance(value, list) else [value]
        if not values or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                                 for v in values):
            raise ValueError(f"The head-score file {str(path)!r} gives head {key!r} the value {value!r}; a head needs "
                             "a finite number or a non-empty list of them.")
        head = (int(match.group(1)), int(match.group(2)))
        if head in entries:
            raise ValueError(f"The head-score file {str(path)!r} names head {key!r} twice.")
        entries[head] = sum(float(v) for v in values) / len(values)
    return entries


def _csv_entries(path: Path) -> dict[tuple[int, int], float]:
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = {"layer", "head", "score"} - set(reader.fieldnames or [])
        if missing:
            raise ValueError(f"The head-score file {str(path)!r} lacks the column(s) {sorted(missing)}; a CSV head "
                             "file has the columns layer, head, score.")
        entries = {}
        for line, row in enumerate(reader, start=2):
            try:
                head, score = (int(row["layer"]), int(row["head"])), float(row["score"])
            except (TypeError, ValueError) as error:
                raise ValueError(f"Line {line} of the head-score file {str(path)!r} is not an integer layer, an "
                                 f"integer head and a number score: {row!r}.") from error
            if min(head) < 0 or not math.isfinite(score):
                raise ValueError(f"Line {line} of the head-score file {str(path)!r} has a negative index or a "
                                 f"non-finite score: {row!r}.")
            if head in entries:
                raise ValueError(f"The head-score file {str(path)!r} names layer {head[0]} head {head[1]} twice.")
            entries[head] = score
    return entries


def read_head_scores(path: str | Path, shape: tuple[int, int] | None = None) -> Float[Tensor, "layer head"]:
    """The per-head scores of a Wu et al. JSON or a ``layer,head,score`` CSV file, as a [layer, head] tensor
    (float64). With ``shape`` (the model's layers and heads), a file of another shape is refused."""
    path = Path(path).expanduser()
    if path.suffix.lower() not in HEAD_FILE_SUFFIXES:
        raise ValueError(f"The head-score file {str(path)!r} must end in .json (Wu et al.'s format) or .csv "
                         "(layer,head,score).")
    if not path.is_file():
        raise ValueError(f"The head-score file {str(path)!r} does not exist.")
    entries = _json_entries(path) if path.suffix.lower() == ".json" else _csv_entries(path)
    scores = _from_entries(entries, path)
    if shape is not None and tuple(scores.shape) != tuple(shape):
        raise ValueError(f"The head-score file {str(path)!r} scores {scores.shape[0]} layers x {scores.shape[1]} "
                         f"heads, but the model has {shape[0]} x {shape[1]}: it was made for another model and "
                         "cannot be this model's static set.")
    return scores


def check_head_file(path: str, model: str, *, name: str = "static_source") -> Float[Tensor, "layer head"]:
    """Read the head file of parameter ``name`` and check it against ``model``'s layer x head shape, read from the
    model's config without loading its weights (:func:`dynheads_tl.engine.preflight.model_head_shape`)."""

    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"Parameter {name!r} must be a path to a .json or .csv head-score file, got {path!r}.")
    try:
        return read_head_scores(path, model_head_shape(model))
    except ValueError as error:
        raise ValueError(f"Parameter {name!r}: {error}") from error


def _per_sample(scores: Tensor | Sequence[Tensor]) -> Float[Tensor, "sample layer head"]:
    if isinstance(scores, Tensor):
        return scores[None] if scores.dim() == 2 else scores
    if not len(scores):
        raise ValueError("write_head_scores needs at least one sample's scores.")
    return torch.stack([torch.as_tensor(s) for s in scores])


def wu_json(scores: Tensor | Sequence[Tensor]) -> str:
    """Wu et al.'s format: ``{"layer-head": [score of each sample]}`` on one line, layers then heads in order.
    A single [layer, head] tensor is written as one-element lists."""
    stacked = _per_sample(scores).double()
    n_layers, n_heads = stacked.shape[1:]
    return json.dumps({f"{layer}-{head}": [float(v) for v in stacked[:, layer, head]]
                       for layer in range(n_layers) for head in range(n_heads)})


def _digest(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def scores_digest(scores: Tensor) -> str:
    """A short digest of a [layer, head] score tensor (its shape and float32 values), for cache keys."""
    values = scores.detach().to(torch.float32).cpu().contiguous()
    return hashlib.sha256(str(tuple(values.shape)).encode() + values.numpy().tobytes()).hexdigest()[:16]


def tokenizer_digests(tokenizer) -> dict[str, Any]:
    """Short SHA-256 digests of the tokenizer (its serialised vocabulary and rules) and of its chat template."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True)
    template = getattr(tokenizer, "chat_template", None)
    return {"tokenizer_class": type(tokenizer).__name__, "tokenizer_digest": _digest(text),
            "chat_template_digest": _digest(template if isinstance(template, str) else None)}


def library_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for package in ("dynheads_tl", "transformer_lens", "transformers", "torch", "rouge_score"):
        try:
            out[package] = version(package.replace("_", "-"))
        except PackageNotFoundError:
            try:
                out[package] = version(package)
            except PackageNotFoundError:
                out[package] = "not installed"
    return out


def provenance(model, *, score: str, prompt_format: str, seeds: Sequence[int], n: int, n_kept: int | None = None,
               filter: str, **extra: Any) -> dict[str, Any]:
    """What a head-score file was computed from: the model (name, fingerprint, layers x heads), its tokenizer and
    chat template (digests), the prompt format, library versions, seeds, samples (n, and n kept by the filter),
    the filter, and whatever ``extra`` names (trace settings, data source)."""

    return {"score": score, **model_identity(model),
            "layers": int(model.cfg.n_layers), "heads": int(model.cfg.n_heads),
            **tokenizer_digests(model.tokenizer), "prompt_format": prompt_format, "libraries": library_versions(),
            "seeds": [int(s) for s in seeds], "n": int(n), "n_kept": None if n_kept is None else int(n_kept),
            "filter": filter, **extra}


def write_head_scores(path: str | Path, scores: Tensor | Sequence[Tensor], info: dict[str, Any]) -> Path:
    """Write ``scores`` (one [layer, head] tensor, or one per sample) in Wu et al.'s JSON format at ``path``, and
    ``info`` (see :func:`provenance`) beside it (:func:`provenance_path`); both atomically. Overwrites, never
    appends (Wu's script appends a rerun's samples to an existing file)."""

    path = Path(path)
    if path.suffix != ".json":
        raise ValueError(f"A head-score file is written in Wu et al.'s JSON format; its name must end in .json, "
                         f"got {str(path)!r}.")
    atomic_write_text(path, wu_json(scores))
    atomic_write_text(provenance_path(path), json.dumps(info, indent=2, sort_keys=True))
    return path
