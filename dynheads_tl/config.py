"""Shared validation for the notebooks' config objects: every failure is a sentence naming the parameter."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable


class NotebookConfig:
    """Mixin for the claim configs (dataclasses): build from a notebook's parameters, rejecting unknown names.

    A claim config nests the shared parts it needs by inheriting their dataclasses (trace sets and trace
    settings from :mod:`dynheads_tl.corpus`, :class:`ProbeSettings`, the RAG protocol's knobs), so each shared
    parameter is declared, defaulted and checked once; the notebook's parameters cell stays flat for
    papermill. ``__post_init__`` checks each value on its own (types, ranges): every part checks its own
    fields and calls ``super().__post_init__()``, which ends here. :meth:`check_inputs` checks what needs
    a file or the model's config (input files exist and parse, lengths fit the context window) without
    loading the model; :meth:`from_params`, which the notebooks and ``dynheads report`` use, runs both.
    """

    def __post_init__(self) -> None:
        """The end of the parts' cooperative checks (each part checks its fields, then calls super)."""

    @classmethod
    def from_params(cls, params: dict[str, Any]):
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(params) - known)
        if unknown:
            raise ValueError(f"Unknown parameter(s) {unknown}; valid parameters are {sorted(known)}.")
        if "model" in params and not (isinstance(params["model"], str) and params["model"].strip()):
            raise ValueError(f"Parameter 'model' must name a model (an embedded name, a paper alias, a local Hugging "
                             f"Face folder or a hub id), got {params['model']!r}.")
        config = cls(**params)
        config.check_inputs()
        return config

    @classmethod
    def from_namespace(cls, namespace: dict[str, Any]):
        """A notebook's config in one line, ``Config.from_namespace(globals())``: its parameters cell defines
        exactly the config's fields (a test checks that the names and defaults agree)."""
        missing = [name for name in cls.__dataclass_fields__ if name not in namespace]
        if missing:
            raise ValueError(f"The notebook does not define the parameter(s) {missing} that {cls.__name__} needs.")
        return cls.from_params({name: namespace[name] for name in cls.__dataclass_fields__})

    def check_inputs(self) -> None:
        """Checks that read files or the model's config; a config with no such inputs has none."""

    def context_lengths(self) -> dict[str, list[int]]:
        """The contexts the notebook's run reads, per task: ``"NIAH"`` its context lengths in tokens, ``"HotpotQA"``
        its HotpotQA-format context lengths where the notebook sets them (empty: the records' own lengths). Each
        results file records them (``verdicts.json``, ``contexts``) and the report says the longest; a config with
        no context has none."""
        return {}


def chain_post_init(instance: Any, cls: type) -> None:
    """Call the next ``__post_init__`` after ``cls`` in ``instance``'s MRO, if there is one (a part used on
    its own has none after it)."""
    parent = getattr(super(cls, instance), "__post_init__", None)
    if parent is not None:
        parent()


@dataclass
class DeviceSettings:
    """Shared part of every notebook: where the model runs. ``device="auto"``: CUDA when a GPU is present, else the
    CPU; ``dtype="auto"``: bfloat16 on a GPU, float32 on the CPU (see :func:`dynheads_tl.load_model`)."""

    device: str = "auto"
    dtype: str = "auto"

    def __post_init__(self) -> None:
        from dynheads_tl.engine.models import DTYPES

        if not isinstance(self.device, str) or not (
                self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:") and self.device[5:].isdigit()):
            raise ValueError(f"Parameter 'device' must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {self.device!r}.")
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"Parameter 'dtype' must be 'auto' or one of {sorted(DTYPES)}, got {self.dtype!r}.")
        from dynheads_tl.engine.preflight import check_device, check_dtype

        check_device(self.device)
        check_dtype(self.dtype, self.device)
        chain_post_init(self, DeviceSettings)

    def load_model(self):
        """The notebook's model (its ``model`` field) on this device, in this dtype; first, that the cache can be
        written (a notebook run by papermill directly has not been through the report's checks)."""
        from dynheads_tl.engine.models import load_model
        from dynheads_tl.store import check_cache_writable

        check_cache_writable()

        return load_model(getattr(self, "model"), device=self.device, dtype=self.dtype)


@dataclass
class RunSettings(DeviceSettings):
    """Shared part of the notebooks that compute units (:mod:`dynheads_tl.executors`): ``backend="local"`` computes
    them in the notebook's process; ``"ray"`` on a Ray cluster, ``ray_address`` (empty: a local cluster of this
    machine's CPUs; ``"auto"``: the cluster this machine belongs to)."""

    backend: str = "local"
    ray_address: str = ""

    def __post_init__(self) -> None:
        from dynheads_tl.executors import check_backend

        check_backend(self.backend, self.ray_address)
        chain_post_init(self, RunSettings)

    def start(self):
        """Load the model and make the ``backend``'s executor current; returns the model."""
        from dynheads_tl.executors import use_backend

        model = self.load_model()
        use_backend(self.backend, model, name=getattr(self, "model"), device=self.device, dtype=self.dtype,
                    address=self.ray_address)
        return model


@dataclass
class Eq2Settings:
    """Shared part: Eq. 2's denominator leaves out attention on the first ``sink_tokens`` positions (attention
    sinks) and on the last ``local_window`` key positions. The paper gives no values; 4 and 32 follow a
    third-party reproduction."""

    sink_tokens: int = 4
    local_window: int = 32

    def __post_init__(self) -> None:
        check_ints(self, ("sink_tokens", "local_window"), minimum=0)
        chain_post_init(self, Eq2Settings)


@dataclass
class Eq2Selection:
    """Shared part: which heads Eq. 2 marks as retrieving (claims 1 and 2).

    ``eq2_rule="chance"`` (default): a head counts when its share exceeds c x chance, the evidence's share of the
    eligible positions; c is calibrated on the HotpotQA calibration split so that heads reading placebo spans
    (the evidence moved to random context positions of the same sizes) are marked on ``eq2_false_rate`` of
    head-steps. ``eq2_rule="fixed"``: share > ``eq2_threshold`` (the paper's form; 0.1 follows a third party)."""

    eq2_rule: str = "chance"
    eq2_threshold: float = 0.1
    eq2_false_rate: float = 0.01

    def __post_init__(self) -> None:
        check_choice(self, "eq2_rule", ("chance", "fixed"))
        check_open_unit(self, "eq2_threshold")
        check_open_unit(self, "eq2_false_rate")
        chain_post_init(self, Eq2Selection)


@dataclass
class ProbeSettings:
    """Shared part: the MLP probe's size and training length (claims 3 and the RAG case study)."""

    probe_hidden: list[int] = field(default_factory=lambda: [256])
    probe_epochs: int = 60

    def __post_init__(self) -> None:
        check_ints(self, ("probe_epochs",))
        check_int_list(self, "probe_hidden", minimum=1)
        chain_post_init(self, ProbeSettings)


@dataclass
class StaticSource:
    """Shared part of the claims with a static set: ``static_source=""`` (default) scores the static heads on the
    claim's calibration split; a path to a Wu et al. ``head_score`` JSON or a ``layer,head,score`` CSV uses that
    file's scores instead, for every task of the claim (:mod:`dynheads_tl.analysis.head_files`; a file of another
    layer x head shape than the model's is refused before any model work)."""

    static_source: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.static_source, str):
            raise ValueError(f"Parameter 'static_source' must be '' or a path to a .json or .csv head-score file, "
                             f"got {self.static_source!r}.")
        chain_post_init(self, StaticSource)

    def check_static_source(self) -> None:
        """Read the file and check its shape against the model's config (called from ``check_inputs``)."""
        if self.static_source:
            from dynheads_tl.analysis.head_files import check_head_file

            check_head_file(self.static_source, getattr(self, "model"))

    def static_override(self):
        """The file's [layer, head] scores (float32), or None when the claim scores its own static set."""
        if not self.static_source:
            return None
        from dynheads_tl.analysis.head_files import check_head_file

        return check_head_file(self.static_source, getattr(self, "model")).float()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_ints(config: Any, names: Iterable[str], *, minimum: int = 1) -> None:
    for name in names:
        value = getattr(config, name)
        if not _is_int(value) or value < minimum:
            kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise ValueError(f"Parameter {name!r} must be {kind}, got {value!r}.")


def check_int_list(config: Any, name: str, *, minimum: int | None = None, allow_empty: bool = False) -> None:
    value = getattr(config, name)
    if (not isinstance(value, list) or (not value and not allow_empty)
            or not all(_is_int(v) and (minimum is None or v >= minimum) for v in value)):
        bound = "" if minimum is None else f" >= {minimum}"
        raise ValueError(f"Parameter {name!r} must be a non-empty list of integers{bound}, got {value!r}.")


def check_fraction_list(config: Any, name: str) -> None:
    value = getattr(config, name)
    if not isinstance(value, list) or not value or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1 for v in value):
        raise ValueError(f"Parameter {name!r} must be a non-empty list of fractions in [0, 1], got {value!r}.")


def check_open_unit(config: Any, name: str) -> None:
    value = getattr(config, name)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 < float(value) < 1.0:
        raise ValueError(f"Parameter {name!r} must be in (0, 1), got {value!r}.")


def check_choice(config: Any, name: str, choices: Iterable[str]) -> None:
    value, choices = getattr(config, name), list(choices)
    if value not in choices:
        raise ValueError(f"Parameter {name!r} must be one of {choices}, got {value!r}.")


def check_model_sizes(model: str, *, heads: dict[str, Any] | None = None, max_new_tokens: int | None = None,
                      contexts: dict[str, Any] | None = None) -> None:
    """Sizes against the model, read from its header and tokenizer without loading it: head counts (``heads``, name ->
    an int or a list) against its layers x heads; NIAH ``max_new_tokens`` against the tokens an answer needs to pass
    the calibration filter; NIAH context lengths (``contexts``, name -> an int, a list of ints, or a list of
    ``"haystack:tokens"`` settings) against the needle sentence. Called last in a config's ``check_inputs``: the
    tokenizer is the slowest thing read (:func:`~dynheads_tl.engine.preflight.check_niah_lengths`)."""
    from dynheads_tl.engine.preflight import check_head_counts, check_niah_lengths

    if heads:
        check_head_counts(model, heads)
    for name, value in (contexts or {}).items():
        values = value if isinstance(value, list) else [value]
        lengths = [_setting_tokens(v) if isinstance(v, str) else v for v in values]
        lengths = [v for v in lengths if v is not None]
        if lengths:
            check_niah_lengths(model, contexts=(name, lengths))
    if max_new_tokens is not None:
        check_niah_lengths(model, max_new_tokens=("max_new_tokens", max_new_tokens))


def _setting_tokens(spec: str) -> int | None:
    """The context length of a ``"haystack:tokens"`` setting, or None for Wu et al.'s haystack (its own needles)."""
    from dynheads_tl.tasks.wu_detect import is_wu_spec

    haystack, _, tokens = spec.rpartition(":")
    return None if is_wu_spec(haystack) or not tokens.isdigit() else int(tokens)
