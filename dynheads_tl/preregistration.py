"""The pre-registration file (``preregistration.yaml`` at the repository root): every claim's primary comparison,
its measure, test, alpha, direction and smallest effect of interest, and the thresholds of each status rule, frozen
before the confirmatory runs (SCIENCE.md rules 11, 14-17).

Claims read their primaries and thresholds from here, so the file is the one place they are declared; results
files record :func:`sha256` so a reader can tell which declaration decided a verdict. A change after data is a dated
entry under ``deviations``, never an edit of a frozen value (:func:`deviations` returns them for the report).
"""
from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

__all__ = ["PreregistrationError", "path", "load", "sha256", "claim", "primary", "item_rule", "alpha", "deviations",
           "lengths", "standing"]

# The file sits at the repository root beside the package (the suite runs from a checkout: `make setup` installs it
# editable).
_CANDIDATES = (Path(__file__).resolve().parent.parent / "preregistration.yaml",)

_PRIMARY_FIELDS = ("id", "measure", "comparison", "test", "direction", "sesoi", "units")


class PreregistrationError(ValueError):
    """The pre-registration file is missing, unreadable, or lacks what a claim asks of it."""


def path() -> Path:
    """Where the pre-registration file is read from."""
    for candidate in _CANDIDATES:
        if candidate.exists():
            return candidate
    raise PreregistrationError(f"The pre-registration file was not found (looked at {', '.join(map(str, _CANDIDATES))}).")


@lru_cache(maxsize=1)
def _read(where: str) -> tuple[dict[str, Any], str]:
    raw = Path(where).read_bytes()
    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as error:
        raise PreregistrationError(f"The pre-registration file {where} is not valid YAML: {error}") from None
    if not isinstance(data, dict) or not isinstance(data.get("claims"), dict):
        raise PreregistrationError(f"The pre-registration file {where} has no 'claims' mapping.")
    data = _amended(data, where)
    for name, entry in data["claims"].items():
        declared = (entry or {}).get("primary")
        if declared is None:
            continue
        missing = [f for f in _PRIMARY_FIELDS if f not in declared]
        if missing:
            raise PreregistrationError(f"The pre-registration file declares claim {name!r}'s primary without {missing}.")
    return data, hashlib.sha256(raw).hexdigest()


def _amended(data: dict[str, Any], where: str) -> dict[str, Any]:
    """The file as its deviations leave it: a deviation may carry ``amends``, a mapping from a dotted path of the
    file (``claims.dynamic_rag.primary.sesoi``) to the value that replaces the frozen one from that date on. The
    frozen text above stays as it was written (a reader sees both); the claims read the amended value. A path that
    names nothing in the file is refused, so an amendment cannot silently miss."""
    import copy

    amended = copy.deepcopy(data)
    for index, deviation in enumerate(amended.get("deviations") or []):
        for dotted, value in ((deviation or {}).get("amends") or {}).items():
            keys = str(dotted).split(".")
            node = amended
            for key in keys[:-1]:
                node = node.get(key) if isinstance(node, dict) else None
                if node is None:
                    break
            if not isinstance(node, dict) or keys[-1] not in node:
                raise PreregistrationError(f"The pre-registration file {where}: deviation {index + 1} "
                                           f"({deviation.get('date', 'undated')}) amends {dotted!r}, which the file "
                                           "does not declare.")
            node[keys[-1]] = value
    return amended


def load() -> dict[str, Any]:
    """The parsed file with its deviations' amendments applied (read once per process)."""
    return _read(str(path()))[0]


def sha256() -> str:
    """The sha256 of the file's bytes, recorded in every results file."""
    return _read(str(path()))[1]


def claim(name: str) -> dict[str, Any]:
    """The entry of claim ``name`` (its folder name: ``irreplaceability``)."""
    claims = load()["claims"]
    if name not in claims:
        raise PreregistrationError(f"The pre-registration file declares no claim {name!r} (it has {sorted(claims)}).")
    return claims[name] or {}


def primary(name: str) -> dict[str, Any] | None:
    """Claim ``name``'s declared primary comparison, or None for a claim that tests nothing (pictures only)."""
    return claim(name).get("primary")


def item_rule(name: str, item: str) -> dict[str, Any]:
    """The status rule and thresholds declared for index row ``item`` (``"Fig 2"``) of claim ``name``."""
    items = claim(name).get("items") or {}
    if item not in items:
        raise PreregistrationError(f"The pre-registration file declares no rule for {item!r} of claim {name!r}.")
    return items[item]


def alpha() -> float:
    """The level every primary is tested at, and every secondary family after Holm."""
    return float(load()["conventions"]["alpha"])


def deviations() -> list[dict[str, Any]]:
    """Dated changes made after data, each quoted by the report."""
    return list(load().get("deviations") or [])


def lengths() -> dict[str, Any]:
    """The length x depth grid's declared lengths, depths and primaries."""
    return load()["lengths"]


def standing(model: str) -> str:
    """What the file declares a model's runs to be: its ``confirmatory`` or ``exploratory`` entry that names the
    model (``"gemma-3-270m: every claim, ..."``), as "confirmatory: <the entry's scope>"; "" when no entry names it."""
    data = load()
    for kind in ("confirmatory", "exploratory"):
        for entry in data.get(kind) or []:
            name, _, scope = str(entry).partition(":")
            if name.strip() == model:
                return f"{kind}: {scope.strip()}"
    return ""
