"""Which notebooks a report run executes (:func:`preset_notebooks`), and where it writes when no folder is named:
``runs/<preset>/<model>/``, the layout of the committed report (:mod:`~dynheads_tl.report.results`), so that no
model's run replaces another's; and the refusal of a folder that holds another model's runs. Only ``dynheads report
--committed`` writes the committed report (:mod:`~dynheads_tl.report.runner`).
"""
from __future__ import annotations

import dataclasses
import os
from collections import Counter
from pathlib import Path
from typing import Any

from dynheads_tl.claims import all_claims, claim_for
from dynheads_tl.engine.models import DEFAULT_MODEL
from dynheads_tl.params import field_default
from dynheads_tl.report.results import WHOLE_REPORT_PRESETS, model_folder_name, read_runs

RUNS_DIR = Path("runs")  # every run but --committed: runs/<preset>/<model>/ (git-ignored)


def preset_notebooks(preset: str, notebooks: list[Path], named: bool = False) -> tuple[list[Path], list[Path]]:
    """Of ``notebooks``, those a run of ``preset`` executes and those it leaves out. A whole-report preset
    (:data:`~dynheads_tl.report.results.WHOLE_REPORT_PRESETS`) runs every notebook; a focused one (``long``,
    ``scale``) only those whose claims declare it, so that ``--preset long`` does not spend an hour on the default
    report's other notebooks. A notebook the run ``named`` (``--only``) that the preset leaves out is refused."""
    if preset in WHOLE_REPORT_PRESETS:
        return list(notebooks), []
    runs = [nb for nb in notebooks if preset in claim_for(nb.stem).presets]
    if named and not runs:
        declaring = sorted(claim.notebook for claim in all_claims() if preset in claim.presets)
        raise ValueError(f"{notebooks[0].stem} has no setting in the {preset!r} preset, which runs "
                         f"{', '.join(declaring) or 'no notebook'}; run it in the default preset (leave --preset out).")
    return runs, [nb for nb in notebooks if nb not in runs]


def preset_models(preset: str) -> dict[str, str]:
    """Notebook stem -> the model a run of ``preset`` gives it when the run names none: the preset's own (``paper``:
    Llama-3.1-8B-Instruct, for every notebook but 00) or the notebook's default (the embedded SmolLM2-135M)."""
    found = {}
    for claim in all_claims():
        own = {f.name: field_default(f) for f in dataclasses.fields(claim.config)}.get("model", DEFAULT_MODEL)
        found[claim.notebook] = str(claim.preset(preset).get("model") or own or DEFAULT_MODEL)
    return found


def run_models(preset: str, model: str | None) -> dict[str, str]:
    """Notebook stem -> the model a run of ``preset`` gives it, with ``model`` (``--model`` or ``-p model=``) when
    one is named."""
    return {stem: str(model) if model else own for stem, own in preset_models(preset).items()}


def run_folder_name(model: str) -> str:
    """A model as the name of its runs' folder under its preset's: :func:`~dynheads_tl.report.results.model_folder_name`
    of a model name or hub id (``google/gemma-3-270m`` -> ``google--gemma-3-270m``), the folder's own name for a
    local model folder."""
    text = str(model).strip()
    path = Path(text).expanduser()
    if text.startswith(("/", "./", "../", "~")) or (os.sep in text and path.is_dir()):
        text = path.resolve().name
    try:
        return model_folder_name(text)
    except ValueError as error:
        raise ValueError(f"{error} Or name the output folder with --output-dir.") from None


def output_dir_for(preset: str, model: str | None, overrides: dict[str, Any]) -> Path:
    """Where a run goes when no ``output_dir`` is given: always a git-ignored folder under ``runs/``
    (:func:`default_output_dir`), one per preset and model, so that no model's run replaces another's. ``model`` is
    ``--model``, else ``-p model=`` in ``overrides``; other overrides (``-p``, ``--device``) and ``--only`` keep
    the folder. The committed report, ``papers_figures/``, is written only by ``dynheads report --committed``
    (:mod:`dynheads_tl.report.committed`, which names each of its folders) or by a run that names it with
    ``--output-dir``."""
    named = model if model is not None else overrides.get("model")
    return default_output_dir(preset, str(named) if named else None)


def default_output_dir(preset: str, model: str | None = None) -> Path:
    """``runs/<preset>/<model>/``: ``model``, else the model the preset gives most of its notebooks (the embedded
    SmolLM2-135M for every preset but ``paper``, whose notebooks run Llama-3.1-8B-Instruct but for 00)."""
    if model is None:
        counts = Counter(preset_models(preset).values())
        model = min(counts, key=lambda name: (-counts[name], name))
    return RUNS_DIR / preset / run_folder_name(model)


def other_model_runs(output_dir: Path, preset: str, model: str | None) -> dict[str, str]:
    """Notebook stem -> the model recorded in ``<output_dir>/runs.json`` for it, for each run there of another model
    than a run of ``preset`` with ``model`` (:func:`run_models`) gives that notebook: what such a run would replace,
    or mix with in one index."""
    expected = run_models(preset, model)
    found = {}
    for stem, record in read_runs(output_dir).items():
        recorded = record.get("model") if isinstance(record, dict) else None
        if recorded and str(recorded) != expected.get(stem, str(model or DEFAULT_MODEL)):
            found[stem] = str(recorded)
    return found


def refuse_other_models(output_dir: Path, preset: str, model: str | None, shown: str, named: bool) -> None:
    """A ValueError when ``output_dir`` holds runs of another model (:func:`other_model_runs`); ``named``: whether the
    user named the folder (``--output-dir``), which the sentence's advice follows."""
    others = other_model_runs(output_dir, preset, model)
    if not others:
        return
    models = sorted(set(run_models(preset, model).values()))
    held = ", ".join(f"{stem} on {recorded}" for stem, recorded in sorted(others.items()))
    advice = (f"name another folder with --output-dir, or leave it out: this run's own folder is "
              f"{default_output_dir(preset, model).as_posix()}/" if named else
              "move that folder away (an earlier version put every model's runs of a preset in one folder), or name "
              "another with --output-dir")
    raise ValueError(f"The output folder {shown} holds runs of another model ({held}); this run is of "
                     f"{', '.join(models)}, and would replace them or mix two models in one index. Nothing was run; "
                     f"{advice}.")
