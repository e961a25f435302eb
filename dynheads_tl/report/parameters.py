"""Each notebook's parameters cell, derived from its claim's config class.

A parameter is declared once, with :func:`~dynheads_tl.params.param` (its default, its one-line help and its
check), in a config part or a claim's config, and a config adds what a shared parameter means in its notebook with
:func:`~dynheads_tl.params.compose`'s ``notes``. The notebook's parameters cell (``name = default  # help`` lines,
which papermill reads and overrides) is written from that declaration: :func:`parameters_cell` renders it,
``dynheads parameters --write`` rewrites the cell of every notebook (its jupytext ``.py`` source and its
``.ipynb``), and a test fails when a cell differs from its rendering. ``dynheads report --only NAME --help``
prints the same lines (:func:`notebook_parameters_help`).

The cell keeps the notebook's own order of its parameters (readers meet ``model`` first); a field the cell lacks
is appended, one the config no longer has is dropped.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import nbformat

from dynheads_tl.claims import claim_for
from dynheads_tl.params import field_default, field_help

__all__ = ["cell_names", "literal_source", "notebook_parameters_help", "parameters_cell", "write_parameters_cells"]

JUPYTEXT_MARKER = '# %% tags=["parameters"]'


def literal_source(value: Any) -> str:
    """``value`` as the Python literal a parameters cell holds: strings in double quotes, lists and dicts spelled
    out (papermill reads the cell as source; a tuple or a call is refused by the notebook tests)."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(literal_source(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{literal_source(k)}: {literal_source(v)}" for k, v in value.items()) + "}"
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    raise TypeError(f"A parameter default must be a literal (str, number, bool, None, list or dict), got {value!r}.")


def cell_names(source: str) -> list[str]:
    """The parameter names a parameters cell assigns, in its order."""
    return [line.split("=", 1)[0].strip() for line in source.splitlines() if "=" in line.split("#", 1)[0]]


def parameters_cell(config_class: type, order: list[str] | None = None) -> str:
    """The parameters cell of a notebook whose config is ``config_class``: one ``name = default  # help`` line per
    field, in ``order`` (the cell's current names; the config's field order for the rest)."""
    fields = {f.name: f for f in dataclasses.fields(config_class)}
    names = [name for name in (order or []) if name in fields]
    names += [name for name in fields if name not in names]
    lines = []
    for name in names:
        help_text = field_help(fields[name])
        if not help_text:
            raise ValueError(f"{config_class.__name__}.{name} has no help text; declare it with param().")
        lines.append(f"{name} = {literal_source(field_default(fields[name]))}  # {help_text}")
    return "\n".join(lines)


def _tagged_cell(notebook) -> Any:
    cells = [c for c in notebook.cells if c.cell_type == "code" and "parameters" in c.metadata.get("tags", [])]
    if len(cells) != 1:
        raise ValueError(f"A notebook needs exactly one code cell tagged 'parameters', found {len(cells)}.")
    return cells[0]


def _replace_in_jupytext(text: str, cell: str, path: Path) -> str:
    """``text`` (a jupytext percent source) with the parameters cell's lines replaced by ``cell``."""
    lines = text.split("\n")
    if JUPYTEXT_MARKER not in lines:
        raise ValueError(f"{path} has no line {JUPYTEXT_MARKER!r} (the parameters cell of a jupytext source).")
    start = lines.index(JUPYTEXT_MARKER) + 1
    end = start
    while end < len(lines) and not lines[end].startswith("# %%"):
        end += 1
    while end > start and not lines[end - 1].strip():
        end -= 1
    return "\n".join(lines[:start] + cell.split("\n") + lines[end:])


def write_parameters_cells(notebooks: list[Path]) -> list[Path]:
    """Rewrite each notebook's parameters cell (its ``.ipynb`` and, when present, its jupytext ``.py``) from its
    claim's config; returns the files that changed."""
    changed = []
    for path in notebooks:
        notebook = nbformat.read(path, as_version=4)
        tagged = _tagged_cell(notebook)
        cell = parameters_cell(claim_for(path.stem).config, cell_names(tagged.source))
        if tagged.source != cell:
            tagged.source = cell
            nbformat.write(notebook, path)
            changed.append(path)
        source = path.with_suffix(".py")
        if source.exists():
            text = source.read_text()
            new = _replace_in_jupytext(text, cell, source)
            if new != text:
                source.write_text(new)
                changed.append(source)
    return changed


def notebook_parameters_help(notebook: Path) -> str:
    """``dynheads report --only NAME --help``'s listing: the notebook's parameters cell as it is rendered from the
    config (every parameter with its default and help), for ``-p name=value``."""
    tagged = _tagged_cell(nbformat.read(notebook, as_version=4))
    cell = parameters_cell(claim_for(notebook.stem).config, cell_names(tagged.source))
    return (f"parameters of {notebook.stem} (-p name=value; each line: name = default  # help):\n"
            + "\n".join(f"  {line}" for line in cell.splitlines()))
