"""The ``Trace``: everything later stages need from one generation, its settings, and its files.

Everything after generation reads a :class:`Trace`, never the model: claims re-analyse from disk and tests build
traces by hand. :class:`TraceConfig` holds the knobs of one traced generation (its :meth:`~TraceConfig.key` is
part of every trace cache key); :func:`save_traces` / :func:`load_traces` and :meth:`Trace.save` /
:meth:`Trace.load` are the file format (``torch.save`` of plain dicts, read with ``weights_only=True``), written
atomically through :mod:`dynheads_tl.store`; :func:`cached_traces` keeps traces in the cache under a config's key.
The loop that records traces is :mod:`dynheads_tl.engine.tracing`.
"""
from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from dynheads_tl.engine.equations import Eq2Rule, eq1_mask, eq2_chance_per_step, evidence_positions
from dynheads_tl.store import atomic_torch_save, atomic_write_text, quarantine, traces_path

# The cache's own logger, where its heal warnings go too.
logger = logging.getLogger("dynheads_tl.store")

PrefillMode = Literal["fast", "hooked"]
# The per-step fields TraceConfig(signals=True) adds to a Trace: per head, then per step.
HEAD_SIGNALS = ("evidence_mass", "context_mass", "generated_mass")
SIGNALS = HEAD_SIGNALS + ("token_logprob", "token_entropy")


@dataclass
class TraceConfig:
    """Knobs of one traced generation (saved beside every Trace).

    ``sink_tokens`` and ``local_window`` define Eq. 2's denominator: attention on the first
    ``sink_tokens`` positions (attention sinks) and on the last ``local_window`` key positions is
    left out. The paper gives no values; 4 and 32 follow a third-party reproduction.

    ``evidence_attention``: also record every head's attention weight on each evidence position at every
    step (:attr:`Trace.evidence_attention`), for soft retrieval measures such as the copy mass
    (:func:`dynheads_tl.analysis.scoring.copy_mass`). Off by default: it costs memory in proportion to the
    evidence length.

    ``stop_at_newline``: a row also stops after the first token whose text holds a newline (that token is kept), as
    Wu et al.'s detection loop does (:func:`dynheads_tl.tasks.wu_detect.wu_trace_config` turns it on).

    ``signals``: also record, at every step, each head's raw attention mass on the evidence, on the whole
    context (``Sample.context_span``) and on the tokens generated so far, and the log-probability and the
    entropy of the next-token distribution the kept token came from (:attr:`Trace.evidence_mass` and the
    others): the inputs of answer-level error signals such as the Lookback Lens ratio, from the same pass.
    """

    max_new_tokens: int = 24
    sink_tokens: int = 4
    local_window: int = 32
    prefill: PrefillMode = "fast"
    stop_at_eos: bool = True
    stop_at_newline: bool = False
    evidence_attention: bool = False
    signals: bool = False

    def __post_init__(self):
        for name in ("max_new_tokens", "sink_tokens", "local_window"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0 or (name == "max_new_tokens" and value < 1):
                raise ValueError(f"{name} must be a non-negative integer (max_new_tokens >= 1), got {value!r}.")
        if self.prefill not in ("fast", "hooked"):
            raise ValueError(f"prefill must be 'fast' or 'hooked', got {self.prefill!r}.")
        for name in ("stop_at_eos", "stop_at_newline", "evidence_attention", "signals"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}.")

    def key(self) -> dict[str, Any]:
        """The settings as a cache key. ``stop_at_newline``, ``evidence_attention`` and ``signals`` appear only when
        on, so traces cached before they existed keep their keys (a trace recorded with them also holds everything
        without)."""
        values = asdict(self)
        for name in ("stop_at_newline", "evidence_attention", "signals"):
            if not values[name]:
                del values[name]
        return values


@dataclass
class Trace:
    """Everything later stages need from one generation, per decoding step, all layers x heads."""

    tokens: Int[Tensor, "step"]
    argmax_pos: Int[Tensor, "step layer head"]
    support_score: Float[Tensor, "step layer head"]
    hidden: Float[Tensor, "step d_model"]
    prompt_ids: Int[Tensor, "pos"]
    evidence_spans: list[tuple[int, int]]
    task: str
    answers: list[str]
    response: str
    config: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    # With TraceConfig(evidence_attention=True): each head's attention weight on each evidence position
    # (the positions of ``evidence_mask``, in order), at every step; None otherwise.
    evidence_attention: Float[Tensor, "step layer head evidence"] | None = None
    # With TraceConfig(signals=True): each head's attention mass on the evidence, on the context span and on the
    # generated tokens so far (the query's own token included), and the kept token's log-probability and the
    # entropy (nats) of its next-token distribution, at every step; None otherwise.
    evidence_mass: Float[Tensor, "step layer head"] | None = None
    context_mass: Float[Tensor, "step layer head"] | None = None
    generated_mass: Float[Tensor, "step layer head"] | None = None
    token_logprob: Float[Tensor, "step"] | None = None
    token_entropy: Float[Tensor, "step"] | None = None

    @property
    def n_steps(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def n_layers(self) -> int:
        return int(self.argmax_pos.shape[1])

    @property
    def n_heads(self) -> int:
        return int(self.argmax_pos.shape[2])

    @property
    def evidence_mask(self) -> Bool[Tensor, "pos"]:
        return evidence_positions(self.evidence_spans, len(self.prompt_ids))

    @property
    def eq2_chance(self) -> Float[Tensor, "step"]:
        """Each step's chance Eq. 2 share (:func:`~dynheads_tl.engine.equations.eq2_chance_per_step`), with the
        trace's own sink and window."""
        return eq2_chance_per_step(self.evidence_mask, len(self.prompt_ids), self.n_steps,
                                   int(self.config.get("sink_tokens", 4)), int(self.config.get("local_window", 32)))

    def eq2_sets(self, rule: "Eq2Rule | float") -> Bool[Tensor, "step layer head"]:
        """The heads Eq. 2 marks at every step under ``rule`` (a bare number: the fixed threshold); the chance
        shares are computed only for the chance rule."""
        rule = Eq2Rule.of(rule)
        if rule.kind == "fixed":
            return self.support_score > rule.value
        return rule.select(self.support_score, self.eq2_chance)

    @property
    def retrieval_mask(self) -> Bool[Tensor, "step layer head"]:
        """Eq. 1: the head's top-1 source lies in the evidence (needle) span AND holds the token
        generated at this step."""
        all_ids = torch.cat([self.prompt_ids, self.tokens])
        in_span = evidence_positions(self.evidence_spans, len(all_ids))
        return eq1_mask(self.argmax_pos, all_ids, in_span, self.tokens)

    # --- persistence ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "tensors": {k: getattr(self, k) for k in ("tokens", "argmax_pos", "support_score", "hidden", "prompt_ids",
                                                      "evidence_attention", *SIGNALS) if getattr(self, k) is not None},
            "info": json.dumps({k: getattr(self, k) for k in ("evidence_spans", "task", "answers", "response", "config", "meta")}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Trace":
        info = json.loads(data["info"])
        info["evidence_spans"] = [tuple(s) for s in info["evidence_spans"]]
        return cls(**data["tensors"], **info)

    def save(self, path: str | Path) -> Path:
        """Atomic (see :func:`dynheads_tl.store.atomic_write`), so an interrupted save never leaves half a trace."""
        return atomic_torch_save(self.to_dict(), path)

    @classmethod
    def load(cls, path: str | Path) -> "Trace":
        """Read a file written by :meth:`save`; a damaged one raises :class:`UnreadableFileError`."""
        return _read_saved(path, lambda data: cls.from_dict(data))


class UnreadableFileError(ValueError):
    """A saved file exists but cannot be read back: truncated, of another format, or written by an
    older version whose layout this one does not know. Its message names the file."""


def save_traces(traces: list[Trace], path: str | Path) -> Path:
    """Several traces in one file, atomically; :func:`load_traces` reads them back."""
    return atomic_torch_save([t.to_dict() for t in traces], path)


def load_traces(path: str | Path) -> list[Trace]:
    """Read a file written by :func:`save_traces`; a damaged one raises :class:`UnreadableFileError`."""
    def parse(data: Any) -> list[Trace]:
        if not isinstance(data, list):
            raise TypeError(f"expected a list of saved traces, found a {type(data).__name__}")
        return [Trace.from_dict(d) for d in data]

    return _read_saved(path, parse)


def _read_saved(path: str | Path, parse: Callable[[Any], Any]) -> Any:
    """``parse(torch.load(path))``, with any failure to read or parse re-raised as one error naming the file.

    A missing file or a permission problem is not damage and passes through unchanged.
    """
    try:
        return parse(torch.load(path, weights_only=True))
    except (FileNotFoundError, PermissionError, IsADirectoryError):
        raise
    except Exception as error:  # truncation (OSError, EOFError, RuntimeError), pickle errors, old layouts
        raise UnreadableFileError(
            f"Cannot read the saved traces in {str(path)!r}: the file is truncated, not a dynheads_tl trace "
            f"file, or written by an older version ({type(error).__name__}: {error})."
        ) from error


def read_cached_traces(config: dict[str, Any], root: Path | None = None) -> list[Trace] | None:
    """The traces cached for ``config``, or None when there are none or they cannot be read (an unreadable entry
    is set aside, see :func:`dynheads_tl.store.quarantine`)."""
    path = traces_path(config, root)
    if not path.exists():
        return None
    try:
        traces = load_traces(path)
        logger.info("cache hit %s", path.name)
        return traces
    except UnreadableFileError as error:
        quarantine(path, error.__cause__ or error)
    except (PermissionError, IsADirectoryError) as error:  # not damage, but this run cannot read it either
        quarantine(path, error)
    return None


def cached_traces(config: dict[str, Any], compute: Callable[[], list[Trace]], *,
                  root: Path | None = None, use_cache: bool = True) -> list[Trace]:
    """Load the traces for ``config`` if present and readable, else compute, save atomically and
    return them (an unreadable entry is set aside, see :func:`dynheads_tl.store.quarantine`)."""
    path = traces_path(config, root)
    traces = read_cached_traces(config, root) if use_cache else None
    if traces is not None:
        return traces
    traces = compute()
    if use_cache:
        save_traces(traces, path)
        # Sidecar for people browsing the cache; written after the traces, so it never describes a missing file.
        atomic_write_text(path.with_suffix(".json"), json.dumps(config, indent=1, sort_keys=True, default=str))
    return traces
