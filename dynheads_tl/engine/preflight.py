"""Checks that need no model: where it can run, in which dtype, and how long a context it takes.

Each check fails with one sentence that names the value and says what to do, and each runs before any model is
loaded, and before an embedded model is converted (its context window and head shape are declared with it, in
``dynheads_tl.engine.models.EMBEDDED_MODELS``), so a bad parameter costs a second, not a conversion.
"""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import torch

from dynheads_tl.engine.models import (EMBEDDED_MODELS, converted_model_dir, embedded_gguf, manifest_problem,
                                      resolve_model_source)
from dynheads_tl.tasks.niah import needle_lengths

# Set to 1 (``dynheads report --allow-cpu-half``) to run float16 / bfloat16 on the CPU anyway.
ALLOW_CPU_HALF_ENV = "DYNHEADS_ALLOW_CPU_HALF"


def check_device(device: str, *, name: str = "device") -> None:
    """``device`` ('auto', 'cpu', 'cuda' or 'cuda:N') names a device this machine has."""
    if device in ("auto", "cpu"):
        return
    if not torch.cuda.is_available():
        build = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ValueError(
            f"Parameter '{name}' is {device!r}, but torch sees no CUDA GPU on this machine (torch {torch.__version__}, "
            f"{build}); use {name}='cpu', or 'auto' to take a GPU only where there is one.")
    count = torch.cuda.device_count()
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    if index >= count:
        raise ValueError(
            f"Parameter '{name}' is {device!r}, but this machine has {count} CUDA device(s) "
            f"(cuda:0 to cuda:{count - 1}); use one of those, or 'auto'.")


def device_type(device: str) -> str:
    """'cuda' or 'cpu': where ``device`` ('auto' included) would run on this machine."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if device.startswith("cuda") else "cpu"


def cpu_half_allowed() -> bool:
    return os.environ.get(ALLOW_CPU_HALF_ENV, "") not in ("", "0", "false", "False")


def check_dtype(dtype: str, device: str, *, name: str = "dtype") -> None:
    """Refuse float16 and bfloat16 on the CPU unless :data:`ALLOW_CPU_HALF_ENV` is set: CPU matmuls in half
    precision are many times slower than float32, and this suite's exactness checks were made in float32 there."""
    if dtype in ("float16", "bfloat16") and device_type(device) == "cpu" and not cpu_half_allowed():
        where = "the CPU" if device == "cpu" else f"the CPU ({device!r} finds no GPU here)"
        raise ValueError(
            f"Parameter '{name}' is {dtype!r}, but the model would run on {where}, where half precision is much "
            f"slower than float32 and its numbers are untested; use {name}='float32' or 'auto', or allow it on "
            f"purpose with `dynheads report --allow-cpu-half` (or {ALLOW_CPU_HALF_ENV}=1).")


def embedded_context_window(name: str) -> int:
    """The context window declared for embedded model ``name`` (:class:`~dynheads_tl.engine.models.EmbeddedModel`;
    nothing is read or converted)."""
    return EMBEDDED_MODELS[name].context_window


def embedded_head_shape(name: str) -> tuple[int, int]:
    """(layers, query heads per layer) declared for embedded model ``name``."""
    spec = EMBEDDED_MODELS[name]
    return spec.layers, spec.heads


def _text_config(model: str):
    """``model``'s config (its text part, for a multimodal one), read from its config file without the weights."""
    from transformers import AutoConfig

    source = resolve_model_source(model)
    try:
        config = AutoConfig.from_pretrained(source)
    except Exception as error:  # transformers' own sentence names neither the parameter nor what to do
        raise ValueError(f"Parameter 'model' is {model!r}, but its config file ({_config_file(source)}) cannot be "
                         f"read: {_first_line(error)}. Fix or replace config.json (a Hugging Face model folder's "
                         "config, as save_pretrained writes it), or pass another model.") from error
    return getattr(config, "text_config", None) or config


def _config_file(source: str) -> str:
    folder = Path(source).expanduser()
    return str(folder / "config.json") if folder.is_dir() else f"{source}'s config.json"


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0].rstrip('.')}" if text else type(error).__name__


def _embedded_name(model: str) -> str | None:
    """``model``'s embedded name when it is one (its shape is then read from the GGUF header: checking never
    converts the model)."""
    return str(model).lower() if str(model).lower() in EMBEDDED_MODELS else None


@lru_cache(maxsize=None)
def model_context_window(model: str) -> int:
    """The context window of ``model`` (a name :func:`dynheads_tl.load_model` accepts), read from its config
    file without loading the weights."""
    name = _embedded_name(model)
    window = embedded_context_window(name) if name else None
    if window:
        return window
    config = _text_config(model)
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    raise ValueError(f"The config of model {model!r} states no context window (max_position_embeddings).")


@lru_cache(maxsize=None)
def model_head_shape(model: str) -> tuple[int, int]:
    """(layers, query heads per layer) of ``model``, read from its config file without loading the weights: the
    shape a head-score file (``static_source``) must have."""
    name = _embedded_name(model)
    shape = embedded_head_shape(name) if name else None
    if shape:
        return shape
    config = _text_config(model)
    layers, heads = getattr(config, "num_hidden_layers", None), getattr(config, "num_attention_heads", None)
    if not (isinstance(layers, int) and isinstance(heads, int)):
        raise ValueError(f"The config of model {model!r} states no num_hidden_layers / num_attention_heads.")
    return layers, heads


def _embedded_tokenizer(name: str):
    """Embedded model ``name``'s tokenizer without converting the model: read from its converted folder when it is
    there and whole, else from its GGUF (slower: transformers builds the tokenizer from it; a model shipped in chunks
    is assembled in a temporary folder for the read, :func:`~dynheads_tl.engine.models.embedded_gguf`)."""
    converted = converted_model_dir(name)
    if manifest_problem(converted, "size") is None:
        return _read_tokenizer(name, str(converted), {})
    with embedded_gguf(name) as gguf:  # says how to install the packages when they are missing
        return _read_tokenizer(name, str(gguf.parent), {"gguf_file": gguf.name})


def _read_tokenizer(model: str, source: str, extra: dict):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source, **extra)
    except Exception as error:
        raise ValueError(f"Parameter 'model' is {model!r}, but its tokenizer cannot be read from {source}: "
                         f"{_first_line(error)}. Fix or replace the tokenizer files, or pass another model.") from error


@lru_cache(maxsize=None)
def model_tokenizer(model: str):
    """``model``'s tokenizer, read without loading the weights (nor converting the embedded model)."""
    name = _embedded_name(model)
    if name:
        return _embedded_tokenizer(name)
    return _read_tokenizer(model, resolve_model_source(model), {})


@lru_cache(maxsize=None)
def niah_needs(model: str) -> tuple[int, int]:
    """(answer tokens, needle tokens) of a NIAH sample for ``model``'s tokenizer (:func:`~dynheads_tl.tasks.niah.needle_lengths`)."""
    return needle_lengths(model_tokenizer(model))


def check_niah_lengths(model: str, *, max_new_tokens: tuple[str, int] | None = None,
                       contexts: tuple[str, object] | None = None, written: list[str] | None = None) -> None:
    """NIAH lengths against what a sample needs with ``model``'s tokenizer: ``max_new_tokens`` (name, value) must give
    an answer room to pass the calibration filter, each of ``contexts`` (name, an int or a list) must hold more than
    the needle sentence; ``written``, beside a list of lengths, is each as the user wrote it (``"prose:20"``), which
    the message quotes. Checked last (the tokenizer is read once per model; for an embedded model not converted yet,
    from its GGUF file), so cheaper checks refuse first."""
    answer_tokens, needle_tokens = niah_needs(model)
    if max_new_tokens is not None:
        name, value = max_new_tokens
        if value < answer_tokens:
            raise ValueError(
                f"Parameter '{name}' is {value}, but a NIAH answer (a UUID) needs at least {answer_tokens} tokens with "
                f"the tokenizer of {model!r} before it can count (more than half of its five words, Wu et al.'s ROUGE-1 "
                f"filter), so no sample could; use {name} >= {answer_tokens}.")
    if contexts is not None:
        name, values = contexts
        values = values if isinstance(values, (list, tuple)) else [values]
        short = [v for v in values if v <= needle_tokens]
        if short:
            shortest = values.index(min(short))
            asks = (f"holds {written[shortest]!r}, a NIAH context of {min(short)} tokens" if written is not None
                    else f"asks for a NIAH context of {min(short)} tokens")
            raise ValueError(
                f"Parameter '{name}' {asks}, but the needle sentence alone "
                f"takes {needle_tokens} tokens with the tokenizer of {model!r}, which leaves no haystack to hide it in; use a "
                f"length above {needle_tokens} tokens (a few hundred or more for a meaningful search).")


def check_head_counts(model: str, values: dict[str, object]) -> None:
    """Head counts (name -> an int or a list of ints) against ``model``'s layers x query heads, read from its header
    (:func:`model_head_shape`): a static set or a masked set cannot hold more heads than the model has."""
    layers, heads = model_head_shape(model)
    total = layers * heads
    for name, value in values.items():
        largest = max(value) if isinstance(value, (list, tuple)) and value else value
        if isinstance(largest, int) and largest > total:
            raise ValueError(f"Parameter '{name}' is {value!r}, but {model!r} has {total} heads ({layers} layers x "
                             f"{heads} query heads); use at most {total}.")
