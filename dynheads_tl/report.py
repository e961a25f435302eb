"""The batch runner: every notebook in order through papermill, with presets and overrides."""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = REPO_ROOT / "notebooks"
OUTPUT_DIR = REPO_ROOT / "papers_figures"

# Per-notebook parameter presets. "default" is each notebook's own parameters cell.
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "smoke": {
        "01_dynamism": {"n_calibration": 2, "n_analysis": 2, "context_tokens": 300,
                        "max_new_tokens": 12, "n_hotpot": 2, "seeds": [0]},
    },
    "default": {},
    "paper": {
        "01_dynamism": {"model": "meta-llama/Llama-3.1-8B-Instruct", "n_calibration": 100,
                        "n_analysis": 100, "context_tokens": [5000, 10000, 20000, 50000],
                        "max_new_tokens": 64, "n_hotpot": 100, "seeds": [0, 1, 2]},
    },
}


def list_notebooks(only: str | None = None) -> list[Path]:
    notebooks = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
    if only:
        chosen = [nb for nb in notebooks if nb.stem == only or nb.name == only or nb.stem.startswith(only)]
        if not chosen:
            raise ValueError(f"No notebook matches {only!r}; notebooks are {[nb.stem for nb in notebooks]}.")
        return chosen
    return notebooks


def run_report(*, preset: str = "default", model: str | None = None, only: str | None = None,
               overrides: dict[str, Any] | None = None, output_dir: Path = OUTPUT_DIR) -> list[Path]:
    """Execute the notebooks; stop at the first failure (papermill's error names the cell)."""
    import papermill

    if preset not in PRESETS:
        raise ValueError(f"Unknown preset {preset!r}; presets are {sorted(PRESETS)}.")
    notebooks = list_notebooks(only)
    executed_dir = output_dir / "executed"
    executed_dir.mkdir(parents=True, exist_ok=True)
    done, started = [], time.time()
    for i, notebook in enumerate(notebooks, 1):
        parameters = dict(PRESETS[preset].get(notebook.stem, {}))
        if model:
            parameters["model"] = model
        parameters.update(overrides or {})
        parameters.setdefault("output_dir", str(output_dir))
        target = executed_dir / notebook.name
        elapsed = time.time() - started
        print(f"[{i}/{len(notebooks)}] {notebook.stem} (preset {preset}; {elapsed / 60:.1f} min so far)", flush=True)
        papermill.execute_notebook(str(notebook), str(target), parameters=parameters,
                                   cwd=str(REPO_ROOT), progress_bar=True, kernel_name="python3")
        done.append(target)
    print(f"Report done in {(time.time() - started) / 60:.1f} min: {len(done)} notebook(s) in {executed_dir}")
    return done
