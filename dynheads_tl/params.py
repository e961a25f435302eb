"""Parameters declared once, and configs composed of parts.

A notebook's parameters are flat (papermill writes one cell of ``name = value`` lines), but many of them are shared:
the trace sets of claims 1 and 3, Eq. 2's settings, the probe's size, where the model runs. Each shared group is a
*part*: a small dataclass whose fields are declared with :func:`param`, so that each field carries its default, a
one-line help text and its check. :func:`compose` builds a flat dataclass from parts plus a class's own fields,
refusing a name that two of them declare. Validation is one function, :func:`check_value`: the type of the
default (an int parameter takes no float, a bool no int), then the field's own check. A config runs it over
every field when it is made, and ``dynheads report`` runs the same function over the values it is given before
any notebook starts (:func:`check_parameters`). A check that relates two fields is a part's or a config's
``check`` method.

A part is reached from a config that composes it with :meth:`Part.part` (or ``Part.of(config)``), a new part
instance holding the config's values of its fields; a part names the methods a composed config offers on its
behalf (``delegated``), each of which runs on such an instance, so a part's method only ever sees the fields
the part declares. Every failure is a sentence that names the parameter.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
from dataclasses import MISSING, dataclass, field
from typing import Any, Callable, ClassVar, Iterable

__all__ = ["Check", "Part", "all_of", "check_parameters", "check_value", "compose", "field_default", "field_help", "fraction_list",
           "integer", "integer_list", "one_of", "open_unit", "optional", "param"]

Check = Callable[[str, Any], None]  # (parameter name, value) -> None, or a ValueError with a sentence


def param(default: Any, help: str, check: Check | None = None) -> Any:
    """A part's field: its default (a list is copied for each instance), a one-line help text and its check."""
    metadata = {"help": help, "check": check}
    if isinstance(default, (list, dict, set)):
        return field(default_factory=functools.partial(copy.deepcopy, default), metadata=metadata)
    return field(default=default, metadata=metadata)


def field_default(f: dataclasses.Field) -> Any:
    """A field's default value (a fresh one from its ``default_factory`` where it has one)."""
    return f.default_factory() if f.default is MISSING and f.default_factory is not MISSING else f.default


def field_help(f: dataclasses.Field) -> str:
    """A field's help text ('' when it was declared without :func:`param`), with the note the composing config
    adds for its notebook (:func:`compose`'s ``notes``) after a semicolon."""
    text, note = f.metadata.get("help", ""), f.metadata.get("note")
    return f"{text}; {note}" if note else text


def _check_type(name: str, value: Any, default: Any) -> None:
    """The value has the default's type (an int may stand for a float; a bool is not an int); a None default
    leaves the type to the field's check."""
    if default is None or default is MISSING:
        return
    kind = type(default)
    if isinstance(default, bool) != isinstance(value, bool) or (
            not isinstance(value, kind) and not (kind is float and isinstance(value, int))):
        raise ValueError(f"Parameter {name!r} should be {_a_type(kind)} (like {default!r}), got {value!r}.")


# Types as an error message names them, with their article ("an integer", not "a int").
_TYPE_WORDS = {bool: "True or False", int: "an integer", float: "a number", str: "a string", list: "a list",
               tuple: "a tuple", dict: "a dict"}


def _a_type(kind: type) -> str:
    """``kind`` in words with its article: "an integer", "a list"; another type by its name, "an" before a vowel."""
    if kind in _TYPE_WORDS:
        return _TYPE_WORDS[kind]
    name = kind.__name__
    return ("an " if name[:1].lower() in "aeiou" else "a ") + name


def check_value(f: dataclasses.Field, value: Any) -> None:
    """The one check of a parameter's value: its default's type, then the check declared with the field."""
    _check_type(f.name, value, field_default(f))
    check = f.metadata.get("check")
    if check is not None:
        check(f.name, value)


def check_parameters(config_class: type, values: dict[str, Any]) -> None:
    """Each of ``values`` by its field of ``config_class`` (:func:`check_value`); names it lacks are left to the
    caller."""
    fields = {f.name: f for f in dataclasses.fields(config_class)}
    for name, value in values.items():
        if name in fields:
            check_value(fields[name], value)


class Part:
    """Base of config parts and of the configs composed from them (dataclasses made by :func:`compose`).

    When made, every field is checked (:func:`check_value`), then the ``check`` of each part composed in (innermost
    first; a part's ``check`` reads only its own fields), then the class's own ``check``."""

    parts: ClassVar[tuple[type, ...]] = ()  # every part composed in, nested ones included
    delegated: ClassVar[tuple[str, ...]] = ()  # methods a config that composes this part offers on its behalf

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            check_value(f, getattr(self, f.name))
        for part in type(self).parts:
            if "check" in vars(part):
                part.check(self)
        if "check" in vars(type(self)):
            self.check()

    def check(self) -> None:
        """Checks that relate fields of this class (each field's own check runs first)."""

    @classmethod
    def of(cls, source: Any, **overrides: Any):
        """This part with ``source``'s values of its fields (the others keep their defaults), e.g. the trace sets of
        a claim config: two claims with the same values get equal parts, and so the same cache keys."""
        values = {f.name: getattr(source, f.name) for f in dataclasses.fields(cls) if hasattr(source, f.name)}
        return cls(**{**values, **overrides})

    def part(self, part: type):
        """The part ``part`` of this config, holding this config's values of its fields."""
        if part not in type(self).parts:
            raise TypeError(f"{type(self).__name__} is not composed of {part.__name__}; its parts are "
                            f"{[p.__name__ for p in type(self).parts]}.")
        return part.of(self)


def _delegate(part: type, name: str):
    method = getattr(part, name)

    @functools.wraps(method)
    def delegated(self, *args, **kwargs):
        return getattr(self.part(part), name)(*args, **kwargs)

    return delegated


def compose(*parts: type, notes: dict[str, str] | None = None) -> Callable[[type], type]:
    """Class decorator: a flat dataclass of ``parts``' fields (in order) followed by the class's own fields, each
    name declared once (a name in two of them is refused). The class (a :class:`Part` subclass) lists its parts in
    ``parts`` (nested ones included) and gets the methods they delegate, unless it defines them itself.

    ``notes`` adds to a part's field what it means in this config's notebook (e.g. "per seed, as in notebook 01"):
    :func:`field_help` gives the part's help, then the note; the notebook's parameters cell and ``dynheads report
    --only NAME --help`` show both. A note for a name the parts do not declare is refused."""
    notes = dict(notes or {})

    def build(cls: type) -> type:
        if not issubclass(cls, Part):
            raise TypeError(f"{cls.__name__} must derive from Part to be composed.")
        own = dict(vars(cls).get("__annotations__", {}))
        declared = {f.name for part in parts for f in dataclasses.fields(part)}
        stray = sorted(set(notes) - declared)
        if stray:
            raise TypeError(f"{cls.__name__}: notes name {stray}, which none of its parts declares (a field of the "
                            "class itself carries its help in param()).")
        annotations: dict[str, Any] = {}
        owner: dict[str, str] = {}
        for part in parts:
            for f in dataclasses.fields(part):
                if f.name in owner or f.name in own:
                    raise TypeError(f"{cls.__name__}: parameter {f.name!r} is declared by both "
                                    f"{owner.get(f.name, cls.__name__)} and {part.__name__}.")
                owner[f.name] = part.__name__
                annotations[f.name] = f.type
                metadata = {**f.metadata, "note": notes[f.name]} if f.name in notes else f.metadata
                setattr(cls, f.name, field(default=f.default, default_factory=f.default_factory,
                                           metadata=metadata))
        cls.__annotations__ = {**annotations, **own}
        nested = [inner for part in parts for inner in (*part.parts, part)]
        cls.parts = tuple(dict.fromkeys(nested))
        offered: dict[str, str] = {}
        for part in cls.parts:
            for name in vars(part).get("delegated", ()):
                if name in vars(cls):
                    continue
                if name in offered:
                    raise TypeError(f"{cls.__name__}: parts {offered[name]} and {part.__name__} both offer {name}(); "
                                    "define it on the config.")
                offered[name] = part.__name__
                setattr(cls, name, _delegate(part, name))
        return dataclass(cls)

    return build


# --- checks: each a function (name, value) raising a sentence that names the parameter ----------------------
def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def integer(minimum: int = 1) -> Check:
    """An integer >= ``minimum``."""
    kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"

    def check(name: str, value: Any) -> None:
        if not _is_int(value) or value < minimum:
            raise ValueError(f"Parameter {name!r} must be {kind}, got {value!r}.")

    return check


def integer_list(minimum: int | None = None) -> Check:
    """A non-empty list of integers, each >= ``minimum`` when given."""
    bound = "" if minimum is None else f" >= {minimum}"

    def check(name: str, value: Any) -> None:
        if (not isinstance(value, list) or not value
                or not all(_is_int(v) and (minimum is None or v >= minimum) for v in value)):
            raise ValueError(f"Parameter {name!r} must be a non-empty list of integers{bound}, got {value!r}.")

    return check


def fraction_list(name: str, value: Any) -> None:
    """A non-empty list of fractions in [0, 1]."""
    if not isinstance(value, list) or not value or not all(_is_number(v) and 0 <= v <= 1 for v in value):
        raise ValueError(f"Parameter {name!r} must be a non-empty list of fractions in [0, 1], got {value!r}.")


def open_unit(name: str, value: Any) -> None:
    """A number in (0, 1)."""
    if not _is_number(value) or not 0.0 < float(value) < 1.0:
        raise ValueError(f"Parameter {name!r} must be in (0, 1), got {value!r}.")


def one_of(choices: Iterable[str]) -> Check:
    """One of ``choices``."""
    choices = list(choices)

    def check(name: str, value: Any) -> None:
        if value not in choices:
            raise ValueError(f"Parameter {name!r} must be one of {choices}, got {value!r}.")

    return check


def all_of(*checks: Check) -> Check:
    """Every one of ``checks``, in order."""

    def combined(name: str, value: Any) -> None:
        for check in checks:
            check(name, value)

    return combined


def optional(check: Check) -> Check:
    """None, or a value that passes ``check``."""

    def optional_check(name: str, value: Any) -> None:
        if value is not None:
            check(name, value)

    return optional_check
