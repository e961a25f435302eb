"""Shared validation for the notebooks' config objects: every failure is a sentence naming the parameter."""
from __future__ import annotations

from typing import Any, Iterable


class NotebookConfig:
    """Mixin for the claim configs (dataclasses): build from a notebook's parameters, rejecting unknown names."""

    @classmethod
    def from_params(cls, params: dict[str, Any]):
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(params) - known)
        if unknown:
            raise ValueError(f"Unknown parameter(s) {unknown}; valid parameters are {sorted(known)}.")
        return cls(**params)


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
