"""A notebook run's results as data: ``<output folder>/verdicts.json``, beside the figures and tables.

One file per notebook output folder (``papers_figures/<preset>/<model>/02_irreplaceability/verdicts.json``),
computed from the files the notebook wrote by its claim's own functions (:class:`~dynheads_tl.claim.Claim`), so that
it can be recomputed from a committed report without running a model. It holds:

- ``schema_version``: the version of the declared schema (:mod:`dynheads_tl.results_schema`) the file follows;
- ``model``, ``preset`` and ``run`` (date, minutes, parameters: the runner's record of the run);
- ``contexts``: the context lengths the run read, per task (NIAH tokens; HotpotQA-format);
- ``preregistration``: the sha256 of ``preregistration.yaml`` the verdicts were computed under;
- ``primary``: the claim's primary comparison, as declared there (measure, comparison, test, direction, smallest
  effect of interest, units) and as observed (estimate, interval, n and units, test, p, adjusted p, and what exactly
  the files hold);
- ``items``: per index row (paper item), its status, the id and text of the rule declared for it in the
  pre-registration file, its headline, every number ("ours"), its files, its data (real or synthetic) and, on the
  row the claim's primary decides, the primary as keyed fields;
- ``findings``: per verdict the README quotes, its sentences and the notebook section that shows it;
- ``outputs``: every figure and table the notebook wrote, with its files, caption and the notebook cell that wrote
  it (recorded by :func:`record_output` as the notebook saves them, in ``recorded_outputs.json``: the cell's id
  where the front end sends one, and the sha256 of the cell's source, which the executed notebook keeps beside the
  cell's id).

:func:`write` is the file's one writer, and it validates what it writes against the schema; :func:`read` and
:func:`load` validate what they read. The report layer (the README's answer, the findings page, the index, the site) reads these files and parses no notebook source.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from dynheads_tl import preregistration
from dynheads_tl.claim import Status, sidecar
from dynheads_tl.results_schema import SCHEMA_VERSION, Results
from dynheads_tl.store import atomic_write_text

__all__ = ["FILE", "RECORDED", "SCHEMA_VERSION", "ResultsError", "build", "compute", "contexts", "write", "read",
           "load", "record_output", "outputs", "primary_problems", "source_digest", "synthetic", "validate"]

FILE = "verdicts.json"
RECORDED = "recorded_outputs.json"  # the notebook's own record of the outputs it saved (record_output)


class ResultsError(ValueError):
    """A results file or dict that does not follow the declared schema."""


def validate(data: dict[str, Any], where: str = FILE) -> Results:
    """``data`` as a :class:`~dynheads_tl.results_schema.Results`; :class:`ResultsError` naming every field that
    breaks the schema otherwise."""
    try:
        return Results.model_validate(data)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in error.errors())
        raise ResultsError(f"{where} does not follow the results schema (version {SCHEMA_VERSION}): "
                           f"{problems}") from None
# What a status or headline function may raise on files of another shape (an older run): the row then says
# "see files" rather than stopping the report.
_READ_ERRORS = (OSError, KeyError, IndexError, ValueError, AttributeError, TypeError)


def _raw(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def load(folder: Path) -> Results | None:
    """``<folder>/verdicts.json`` as typed results, or None when it is missing, unreadable or of another schema
    version (the report then computes it from the notebook's files). A file of this version that breaks the schema
    raises :class:`ResultsError`: it was damaged or written by hand."""
    data = _raw(Path(folder) / FILE)
    if data is None or data.get("schema_version") != SCHEMA_VERSION:
        return None
    return validate(data, str(Path(folder) / FILE))


def read(folder: Path) -> dict[str, Any] | None:
    """:func:`load` as a plain dict (the JSON's own shape), or None."""
    found = load(folder)
    return None if found is None else found.model_dump(mode="json")


def _dump(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1, sort_keys=True, default=str, allow_nan=False, ensure_ascii=False) + "\n"


def _finite(value: Any) -> Any:
    """JSON has no NaN: a missing number is null."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, float) and value != value:
        return None
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy scalars
        return _finite(value.item())
    return value


def source_digest(source: str) -> str:
    """The sha256 of a notebook cell's source (as the kernel ran it, and as the executed notebook keeps it)."""
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


def _current_cell() -> dict[str, str]:
    """The notebook cell running now, as IPython runs it: ``cell_source``, the :func:`source_digest` of its source,
    and ``cell_id``, the cell's id where the front end sent one with the request (JupyterLab does; nbclient 0.11,
    which papermill runs, does not); empty outside IPython. Read from the running cell's ``ExecutionInfo``, else
    from the kernel's execute request. No execution count: the one IPython holds while a cell runs is not the one
    the executed notebook shows."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython comes with the notebooks' kernel
        return {}
    shell = get_ipython()
    if shell is None:
        return {}
    info = getattr(getattr(getattr(shell, "displayhook", None), "exec_result", None), "info", None)
    source, cell_id = getattr(info, "raw_cell", None), getattr(info, "cell_id", None)
    if not isinstance(source, str):
        kernel = getattr(shell, "kernel", None)
        parent = kernel.get_parent() if hasattr(kernel, "get_parent") else {}
        parent = parent if isinstance(parent, dict) else {}
        source = (parent.get("content") or {}).get("code")
        cell_id = cell_id or (parent.get("metadata") or {}).get("cellId")
    if not isinstance(source, str):
        return {}
    found = {"cell_source": source_digest(source)}
    if isinstance(cell_id, str) and cell_id:
        found["cell_id"] = cell_id
    return found


def record_output(folder: Path, stem: str, kind: str, caption: str = "", *, cell_id: str | None = None,
                  cell_source: str | None = None) -> None:
    """Record in ``<folder>/verdicts.json`` that the notebook wrote figure or table ``stem`` (``kind``: "figure" or
    "table"), with its caption and the cell writing it, so the site can say which section makes which file: the
    cell's id and the :func:`source_digest` of its source (``cell_id``, ``cell_source``; by default the running
    cell's, :func:`_current_cell`)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    outputs = recorded_outputs(folder)
    cell = _current_cell() if cell_id is None and cell_source is None else {"cell_id": cell_id,
                                                                            "cell_source": cell_source}
    outputs[stem] = {"kind": kind, "caption": caption, **{k: v for k, v in cell.items() if v}}
    atomic_write_text(folder / RECORDED, _dump(_finite(outputs)))


def begin_outputs(folder: Path) -> dict[str, Any]:
    """Start a notebook run's record of outputs in ``folder``: returns the previous run's record and leaves an empty
    one, so that the run's record holds only what it writes (:func:`end_outputs` settles the rest)."""
    folder = Path(folder)
    before = recorded_outputs(folder)
    if before:
        atomic_write_text(folder / RECORDED, _dump({}))
    return before


def end_outputs(folder: Path, before: dict[str, Any], *, finished: bool, since: float | None = None) -> list[str]:
    """Settle a run's record against the previous run's (``before``, from :func:`begin_outputs`). A finished run:
    the files of every output the previous run recorded and this one did not record are removed, so that no table
    of an earlier run (one this run left out, an empty one say) is listed as this run's, except a file written at or
    after ``since`` (the run's start, a POSIX time): this run wrote it outside the record (the HotpotQA questions'
    ``_id`` list, say), so it is not stale. Returns the stems whose files were removed. A stopped run: its record
    keeps the previous entries it did not replace, since their files are still there."""
    folder = Path(folder)
    now = recorded_outputs(folder)
    stale = [stem for stem in before if stem not in now]
    if not stale:
        return []
    if finished:
        removed = []
        for stem in stale:
            old = [name for name in _files(folder, stem)
                   if since is None or (folder / name).stat().st_mtime < since]
            for name in old:
                (folder / name).unlink()
            removed += [stem] if old else []
        return removed
    atomic_write_text(folder / RECORDED, _dump(_finite({**{stem: before[stem] for stem in stale}, **now})))
    return []


def recorded_outputs(folder: Path) -> dict[str, Any]:
    """What :func:`record_output` recorded in ``folder``: its ``recorded_outputs.json``, else (a folder written
    before that file existed) the record a results file of any version kept; empty when neither says."""
    folder = Path(folder)
    own = _raw(folder / RECORDED)
    if own is not None:
        return own
    return dict((_raw(folder / FILE) or {}).get("outputs_recorded") or {})


def _files(folder: Path, stem: str) -> list[str]:
    return sorted(p.name for p in folder.glob(f"{stem}.*") if p.is_file() and not p.name.endswith(".tmp")
                  and p.name.split(".")[0] == stem)


def _item(claim, item, folder: Path, primary: dict[str, Any] | None = None) -> dict[str, Any]:
    """An index row's results. Its status is computed even when the row's own files are missing (a rule may read
    other tables); ``produced`` says whether they are there, and the index shows "not produced" when not. The row
    the claim's primary decides (``Primary.item``) carries ``primary``."""
    files = _files(folder, item.output)
    found = Status("see files", "see the files")
    if item.status is not None:
        try:
            found = item.status(folder)
        except _READ_ERRORS:
            pass
    ours = "see figure"
    if item.headline is not None:
        try:
            ours = item.headline(folder)
        except _READ_ERRORS:
            ours = "see file"
    try:
        declared = preregistration.item_rule(claim.name, item.item).get("rule")
    except preregistration.PreregistrationError:
        declared = None
    decides = primary is not None and primary.get("item") == item.item
    return {"item": item.item, "rule_id": f"claims.{claim.name}.items.{item.item}", "produced": bool(files),
            "status": found.status, "headline": found.headline, "ours": ours if files else "not produced",
            "why": found.why, "declared_rule": declared, "files": files,
            "data": "synthetic" if synthetic(item, folder) else "real", "primary": primary if decides else None}


def synthetic(item, folder: Path) -> bool:
    """Whether an index row rests on synthetic HotpotQA-format questions: a HotpotQA row (``PaperItem.hotpot``) whose
    run config (``<stem>.config.json``) names no real source. A config without ``hotpot_source`` counts as synthetic
    (the generator was every notebook's default before the dev set became it), so an unlabelled result is never
    passed off as real data."""
    return bool(item.hotpot) and str(sidecar(folder, item.output).get("hotpot_source", "synthetic")) == "synthetic"


def _declared_primary(claim) -> dict[str, Any] | None:
    try:
        return preregistration.primary(claim.name)
    except preregistration.PreregistrationError:
        return None


def _primary(claim, folder: Path) -> dict[str, Any] | None:
    declared = _declared_primary(claim)
    if claim.primary is None and declared is None:
        return None
    entry: dict[str, Any] = {"id": claim.primary.id if claim.primary else None,
                             "item": claim.primary.item if claim.primary else None, "declared": declared,
                             "observed": None}
    if claim.primary is not None:
        try:
            entry["observed"] = _observed(claim.primary.observed(folder))
        except _READ_ERRORS as error:
            entry["missing"] = f"this run's files hold no such comparison ({type(error).__name__}: {error})"
        if entry["observed"] is None and "missing" not in entry:
            entry["missing"] = "this run's files hold no such comparison"
    return entry


def _observed(found: dict[str, Any] | None) -> dict[str, Any] | None:
    """A claim's ``Primary.observed`` dict (flat ``low``/``high``, optional ``level``) in the schema's shape."""
    if found is None:
        return None
    found = dict(found)
    interval = {"low": found.pop("low", None), "high": found.pop("high", None), "level": found.pop("level", 0.95)}
    return {**found, "interval": interval}


def _finding(finding, folder: Path, notebook: str) -> dict[str, Any]:
    entry = {"label": finding.label, "section": finding.section, "sentences": []}
    try:
        entry["sentences"] = list(finding.sentences(folder))
    except _READ_ERRORS as error:
        entry["sentences"] = [f"not in this run: the files of {notebook} lack what this verdict reads "
                              f"({type(error).__name__}: {error}); the next run adds it."]
    return entry


def outputs(folder: Path, recorded: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every figure and table in ``folder`` (a stem with a CSV, PNG or Markdown file), each with its files and what
    :func:`record_output` recorded of it (``recorded``; by default read from the folder's results file): its kind,
    caption and the notebook cell that wrote it (``cell_id``, ``cell_source``), None where not recorded. A results
    file written before cells were recorded so holds an execution count (``cell``), which is left out: it was one
    more than the writing cell's own, and no count names a cell reliably."""
    folder = Path(folder)
    if recorded is None:
        recorded = recorded_outputs(folder)
    stems = sorted({p.name.split(".")[0] for p in folder.iterdir() if p.is_file() and p.suffix in (".csv", ".png", ".md")
                    and p.name != FILE}) if folder.is_dir() else []
    out = []
    for stem in stems:
        files = _files(folder, stem)
        record = recorded.get(stem, {})
        kind = record.get("kind") or ("figure" if f"{stem}.png" in files else "table")
        out.append({"stem": stem, "kind": kind, "files": files, "caption": record.get("caption", ""),
                    "cell_id": record.get("cell_id"), "cell_source": record.get("cell_source")})
    return out


def contexts(claim, folder: Path) -> dict[str, list[int]] | None:
    """The contexts the run read, per task (:meth:`~dynheads_tl.config.NotebookConfig.context_lengths` of the
    config its files were written under, read from their sidecars); None when no sidecar says."""
    fields = set(getattr(claim.config, "__dataclass_fields__", {}))
    for path in sorted(Path(folder).glob("*.config.json")):
        values = sidecar(folder, path.name[:-len(".config.json")])
        if values:
            try:
                return claim.config(**{k: v for k, v in values.items() if k in fields}).context_lengths()
            except _READ_ERRORS:
                return None
    return None


def build(claim, folder: Path, run: dict[str, Any] | None = None) -> dict[str, Any]:
    """:func:`compute` as a plain dict (the JSON's own shape)."""
    return compute(claim, folder, run).model_dump(mode="json")


def compute(claim, folder: Path, run: dict[str, Any] | None = None) -> Results:
    """The typed results of ``claim``'s notebook, computed from the files in its output ``folder`` and checked
    against the schema; ``run`` is the runner's record of the run (``runs.json``: model, preset, parameters, date,
    minutes)."""
    folder = Path(folder)
    run = dict(run or {})
    recorded = recorded_outputs(folder)
    model = run.get("model")
    if model is None:
        configs = sorted(folder.glob("*.config.json")) if folder.is_dir() else []
        model = next((sidecar(folder, p.name[:-len(".config.json")]).get("model") for p in configs), None)
    primary = _primary(claim, folder)
    data = {
        "schema_version": SCHEMA_VERSION, "notebook": claim.notebook, "claim": claim.name, "title": claim.title,
        "model": model, "preset": run.get("preset"),
        "run": {"date": run.get("date"), "minutes": run.get("minutes"), "parameters": run.get("parameters") or {}},
        "contexts": contexts(claim, folder) if folder.is_dir() else None,
        "preregistration": {"file": "preregistration.yaml", "sha256": preregistration.sha256()},
        "primary": primary,
        "items": [_item(claim, item, folder, primary) for item in claim.items],
        "findings": [_finding(finding, folder, claim.notebook) for finding in claim.findings],
        "outputs": outputs(folder, recorded),
        "outputs_recorded": recorded,
    }
    return validate(_finite(data), f"{claim.notebook}/{FILE}")


def write(claim, folder: Path, run: dict[str, Any] | None = None) -> Path:
    """Compute :func:`build` and write it to ``<folder>/verdicts.json`` (atomically; the file's one writer, after
    validating it against the schema); returns its path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / FILE, _dump(build(claim, folder, run)))
    return folder / FILE


_DECLARED_FIELDS = ("id", "measure", "comparison", "test", "direction", "sesoi", "units")


def primary_problems(data: dict[str, Any]) -> list[str]:
    """Where a results file's primary differs from what the pre-registration file declares for its claim: another
    comparison computed (its id), a declaration copied from another version of the file, or a primary missing on
    one side. Empty when they agree."""
    name = data.get("claim", "?")
    try:
        declared = preregistration.primary(name)
    except preregistration.PreregistrationError:
        declared = None
    recorded = data.get("primary")
    where = f"{data.get('notebook', name)}/{FILE}"
    if declared is None:
        return [] if recorded is None else [f"{where} states a primary, but preregistration.yaml declares none for "
                                            f"claim {name!r}"]
    if recorded is None:
        return [f"{where} states no primary, but preregistration.yaml declares {declared['id']!r} for claim {name!r}"]
    problems = []
    if recorded.get("id") != declared["id"]:
        problems.append(f"{where}: the claim's code computes the primary {recorded.get('id')!r}, but "
                        f"preregistration.yaml declares {declared['id']!r}")
    copied = recorded.get("declared") or {}
    changed = [f for f in _DECLARED_FIELDS if copied.get(f) != declared.get(f)]
    if changed:
        problems.append(f"{where}: the primary's {', '.join(changed)} differ from preregistration.yaml's declaration "
                        "(the file was written under another version of it; recompute it)")
    return problems
