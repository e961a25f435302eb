"""The batch runner: every notebook in order through papermill, with presets and overrides."""
from __future__ import annotations

import json as _json
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
        "01_dynamism": {"n_calibration": 2, "n_analysis": 4, "context_tokens": 300, "max_new_tokens": 12,
                        "n_hotpot": 4, "hotpot_max_new_tokens": 8, "seeds": [0, 1]},
        "02_irreplaceability": {"niah_contexts": [300], "niah_depths": [0.2, 0.8], "hotpot_contexts": [250],
                                "hotpot_depths": [0.5], "runs_per_cell": 1, "n_calibration": 2, "max_new_tokens": 12,
                                "hotpot_max_new_tokens": 8, "progressive_k_max": 10, "n_progressive": 1,
                                "progressive_context": 300},
        "03_correlation": {"n_calibration": 2, "n_analysis": 4, "context_tokens": 300, "max_new_tokens": 12,
                           "n_hotpot": 4, "hotpot_max_new_tokens": 8, "seeds": [0, 1], "max_lag": 2,
                           "probe_epochs": 5, "probe_hidden": [32]},
        "04_dynamic_rag": {"n_samples": 2, "strategies": ["dynamic", "static", "none", "full"], "max_new_tokens": 8,
                           "train_seeds": [0, 1], "n_hotpot_train": 4, "probe_hidden": [32], "probe_epochs": 5},
    },
    "default": {},
    "paper": {
        "01_dynamism": {"model": "meta-llama/Llama-3.1-8B-Instruct", "n_calibration": 100, "n_analysis": 100,
                        "context_tokens": 20000, "max_new_tokens": 64, "n_hotpot": 100, "seeds": [0, 1, 2]},
        "02_irreplaceability": {"model": "meta-llama/Llama-3.1-8B-Instruct",
                                "niah_contexts": [5000, 10000, 20000, 30000, 40000, 50000],
                                "niah_depths": [0.0, 0.25, 0.5, 0.75, 1.0],
                                "hotpot_contexts": [250, 1000, 2000, 3000, 3750],
                                "hotpot_depths": [0.05, 0.25, 0.5, 0.75, 0.95], "runs_per_cell": 5,
                                "n_calibration": 100, "max_new_tokens": 64, "progressive_k_max": 70,
                                "n_progressive": 20, "progressive_context": 20000,
                                # KV cache of Llama-3.1-8B at 50k tokens: ~6.4 GB per row in bf16
                                "batch_size": 4},
        "03_correlation": {"model": "meta-llama/Llama-3.1-8B-Instruct", "n_calibration": 100, "n_analysis": 100,
                           "context_tokens": 20000, "max_new_tokens": 64, "n_hotpot": 100, "seeds": [0, 1, 2],
                           "probe_preset": "paper"},
        "04_dynamic_rag": {"model": "meta-llama/Llama-3.1-8B-Instruct", "n_samples": 500, "n_hotpot_train": 100,
                           "max_new_tokens": 64, "probe_hidden": [8192, 4096, 4096], "probe_epochs": 100},
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


def notebook_parameters(notebook: Path) -> dict[str, Any]:
    """The notebook's declared parameters and their defaults (from its 'parameters' cell)."""
    import papermill

    return {name: info["default"] for name, info in papermill.inspect_notebook(str(notebook)).items()}


def validate_overrides(notebook: Path, parameters: dict[str, Any], declared: dict[str, Any] | None = None) -> None:
    """Unknown names and wrong types fail before any model work, with a sentence naming the parameter.
    ``declared`` is :func:`notebook_parameters` of the notebook, when the caller already has it."""
    import ast

    declared = notebook_parameters(notebook) if declared is None else declared
    for name, value in parameters.items():
        if name not in declared:
            raise ValueError(f"{notebook.stem} has no parameter {name!r}; its parameters are {sorted(declared)}.")
        try:
            default = ast.literal_eval(declared[name])
        except (ValueError, SyntaxError):
            continue
        if isinstance(default, bool) != isinstance(value, bool) or (
                not isinstance(value, type(default)) and not (isinstance(default, float) and isinstance(value, int))):
            raise ValueError(f"{notebook.stem}: parameter {name!r} should be a {type(default).__name__} like "
                             f"{declared[name]}, got {value!r}.")


def _write_runs(output_dir: Path, runs: dict[str, Any]) -> None:
    path = output_dir / "runs.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(_json.dumps(runs, indent=1, sort_keys=True, default=str) + "\n")
    tmp.replace(path)


def run_report(*, preset: str = "default", model: str | None = None, only: str | None = None,
               overrides: dict[str, Any] | None = None, output_dir: Path = OUTPUT_DIR) -> list[Path]:
    """Execute the notebooks in order; stop at the first failure (papermill's error names the cell).

    Parameters are validated against every notebook before the first one starts. Each run is recorded
    in ``runs.json`` and the index is rebuilt at the end, also after a failure.
    """
    import datetime

    import papermill

    if preset not in PRESETS:
        raise ValueError(f"Unknown preset {preset!r}; presets are {sorted(PRESETS)}.")
    output_dir = Path(output_dir)
    notebooks = list_notebooks(only)
    declared = {notebook: notebook_parameters(notebook) for notebook in notebooks}
    plans = []
    for notebook in notebooks:
        parameters = dict(PRESETS[preset].get(notebook.stem, {}))
        if model:
            parameters["model"] = model
        parameters.update({k: v for k, v in (overrides or {}).items() if k in declared[notebook]})
        parameters["output_dir"] = str(output_dir)
        validate_overrides(notebook, parameters, declared[notebook])
        plans.append((notebook, parameters))
    known = {name for names in declared.values() for name in names}
    unused = set(overrides or {}) - known
    if unused:
        raise ValueError(f"No notebook has the parameter(s) {sorted(unused)}; the parameters are {sorted(known)}.")
    executed_dir = output_dir / "executed"
    executed_dir.mkdir(parents=True, exist_ok=True)
    runs_path = output_dir / "runs.json"
    runs = _json.loads(runs_path.read_text()) if runs_path.exists() else {}
    done, started = [], time.time()
    try:
        for i, (notebook, parameters) in enumerate(plans, 1):
            previous = [runs.get(nb.stem, {}).get("minutes") for nb, _ in plans[i - 1:]]
            eta = (f"; about {sum(previous):.0f} min left by the last run's times"
                   if all(isinstance(m, (int, float)) for m in previous) else "")
            print(f"[{i}/{len(plans)}] {notebook.stem} (preset {preset}; {(time.time() - started) / 60:.1f} min so far{eta})",
                  flush=True)
            t0 = time.time()
            papermill.execute_notebook(str(notebook), str(executed_dir / notebook.name), parameters=parameters,
                                       cwd=str(REPO_ROOT), progress_bar=True, kernel_name="python3")
            runs[notebook.stem] = {"model": parameters.get("model", "smollm2-135m-instruct"), "preset": preset,
                                   "parameters": {k: v for k, v in parameters.items() if k != "output_dir"},
                                   "date": datetime.date.today().isoformat(),
                                   "minutes": round((time.time() - t0) / 60, 1)}
            _write_runs(output_dir, runs)
            done.append(executed_dir / notebook.name)
    finally:
        build_index(output_dir)
    print(f"Report done in {(time.time() - started) / 60:.1f} min: {len(done)} notebook(s) in {executed_dir}; "
          f"index: {output_dir / 'README.md'}")
    return done


# --- the index of the reproduction -----------------------------------------------------------------
import html as _html

import pandas as _pd

# (id, what the paper shows, the paper's numbers, our file stem (relative to the output dir), notebook)
PAPER_ITEMS = [
    ("Table 1", "NIAH dynamism metrics", "Llama-3.1-8B: Jaccard top-20 .3512, adjacent .2793, entropy 3.8154; 12.97 ± 7.69 heads/step, 238 of 1024 ever active",
     "01_dynamism/table1_niah", "01_dynamism"),
    ("Fig 1", "NIAH heatmap: 10 most variable heads × generated tokens", "qualitative",
     "01_dynamism/fig1_niah_heatmap", "01_dynamism"),
    ("Fig 2", "NIAH accuracy heatmaps under dynamic / static / random masking", "dynamic masking destroys retrieval; static and random barely matter",
     "02_irreplaceability/fig2_niah_masking", "02_irreplaceability"),
    ("Fig 3", "NIAH progressive masking", "accuracy 1.0 → 0.0 by k = 20; 4.5–7 compensating static heads for k ≥ 5",
     "02_irreplaceability/fig3_niah_progressive", "02_irreplaceability"),
    ("Fig 4", "NIAH CCA vs lag k", "leading correlation .965 (k = 0) → .743 (k = 10)",
     "03_correlation/fig4_niah_cca", "03_correlation"),
    ("Fig 5", "HotpotQA Eq. 2 heatmap", "qualitative", "01_dynamism/fig5_hotpot_heatmap", "01_dynamism"),
    ("Fig 6", "HotpotQA F1 heatmaps under masking", "as Fig 2", "02_irreplaceability/fig6_hotpot_masking", "02_irreplaceability"),
    ("Fig 7", "HotpotQA progressive masking", "as Fig 3", "02_irreplaceability/fig7_hotpot_progressive", "02_irreplaceability"),
    ("Fig 8", "HotpotQA CCA vs lag k", ".856 → .712", "03_correlation/fig8_hotpot_cca", "03_correlation"),
    ("Table 2", "NIAH probe F1 / P / R / AUPRC", "F1 .8038–.8566 (Llama-3.1-8B .8349, AUPRC .9173)",
     "03_correlation/table2_niah_probe", "03_correlation"),
    ("Table 3", "HotpotQA probe MSE / MAE / R²", "R² .7200–.8120 (Llama-3.1-8B .8120)",
     "03_correlation/table3_hotpot_probe", "03_correlation"),
    ("Table 4", "Dynamic RAG EM / F1", "Llama-3.1-8B Dynamic .456/.5586, Static .398/.5098, w/o RAG .252/.3257",
     "04_dynamic_rag/table4_rag", "04_dynamic_rag"),
]


def _headline(stem: Path) -> str:
    """A one-line summary of our numbers, read from the CSV actually present."""
    csv = stem.with_suffix(".csv")
    try:
        frame = _pd.read_csv(csv)
        name = stem.name
        if name.startswith("table1"):
            r = frame.iloc[0]
            return (f"Jaccard top-20 {r.jaccard_static:.4f}, adjacent {r.jaccard_adjacent:.4f}, entropy {r.entropy:.4f}; "
                    f"{r.heads_per_step_mean:.2f} ± {r.heads_per_step_sd:.2f} heads/step, {int(r.ever_active)} of {int(r.n_heads)} ever active")
        if name.startswith(("fig2", "fig6")):
            metric = "accuracy" if "accuracy" in frame else "f1"
            means = frame.groupby("condition")[metric].mean()
            return ", ".join(f"{c.replace('_', ' ')} {means[c]:.2f}" for c in ("none", "dynamic", "static", "static_matched",
                             "random") if c in means) + f" ({metric})"
        if name.startswith(("fig3", "fig7")):
            metric = "accuracy" if "accuracy" in frame else "f1"
            means = frame.groupby("k")[[metric, "m_s"]].mean()
            return "; ".join(f"k={k}: {row[metric]:.2f}, m_s {row['m_s']:.1f}" for k, row in means.iterrows())
        if name.startswith(("fig4", "fig8")):
            part = frame[frame["control"] == "in-sample"].set_index("k")["leading"]
            held = frame[frame["control"] == "held-out"].set_index("k")["leading"]
            shuf = frame[frame["control"] == "shuffled"].set_index("k")["leading"]
            k0, kn = part.index.min(), part.index.max()
            same = frame[frame["control"] == "shuffled, same step"].set_index("k")["leading"]
            return (f"in-sample {part[k0]:.3f} → {part[kn]:.3f}; held-out {held.get(k0, float('nan')):.3f} → "
                    f"{held.get(kn, float('nan')):.3f}; shuffled {shuf.get(k0, float('nan')):.3f}; "
                    f"shuffled same step {same.get(k0, float('nan')):.3f}")
        if name.startswith("table2"):
            r = frame.set_index("predictor").loc["MLP probe"]
            return f"MLP F1 {r.f1:.4f}, P {r.precision:.4f}, R {r.recall:.4f}, AUPRC {r.auprc:.4f}"
        if name.startswith("table3"):
            r = frame.set_index("predictor").loc["MLP probe"]
            return f"MLP MSE {r.mse:.4f}, MAE {r.mae:.4f}, R² {r.r2:.4f}"
        if name.startswith("table4"):
            return "; ".join(f"{r.strategy} {r.em:.3f}/{r.f1:.3f}" for r in frame.itertuples())
    except Exception:  # a file of another shape: link it, do not summarise it
        return "see file"
    return "see figure"


def build_index(output_dir: Path = OUTPUT_DIR) -> Path:
    """Write ``README.md`` and ``index.html`` in ``output_dir`` from the outputs actually present."""
    output_dir = Path(output_dir)
    runs_path = output_dir / "runs.json"
    runs = _json.loads(runs_path.read_text()) if runs_path.exists() else {}
    rows = []
    for item, what, paper, stem_name, notebook in PAPER_ITEMS:
        stem = output_dir / stem_name
        files = sorted(p for p in stem.parent.glob(stem.name + ".*") if not p.name.endswith(".tmp")) if stem.parent.exists() else []
        run = runs.get(notebook, {})
        executed = output_dir / "executed" / f"{notebook}.ipynb"
        if not files:
            rows.append((item, what, paper, "not produced", [], None, run))
            continue
        rows.append((item, what, paper, _headline(stem), files, executed if executed.exists() else None, run))
    md = ["# The reproduction at a glance", "",
          "Regenerated by `dynheads report` from the files present in this folder; an item whose files are "
          "missing says so. Numbers labelled *paper* are quoted from arXiv 2602.11162.", "",
          "Run times are those of the last run, which reads finished traces and ablation runs from the on-disk "
          "cache instead of recomputing them; the top-level README gives the times from scratch.", "",
          "| item | what | paper | ours | files | notebook | model · preset · date · run time |", "|---|---|---|---|---|---|---|"]
    html_rows = []
    for item, what, paper, ours, files, executed, run in rows:
        links = " ".join(f"[{p.suffix.lstrip('.') if not p.name.endswith('.config.json') else 'config'}]({p.relative_to(output_dir).as_posix()})" for p in files)
        nb = f"[{executed.stem}]({executed.relative_to(output_dir).as_posix()})" if executed else "–"
        meta = (f"{run.get('model', '?')} · {run.get('preset', '?')} · {run.get('date', '?')} · {run.get('minutes', '?')} min"
                if run else "–")
        md.append(f"| {item} | {what} | {paper} | {ours} | {links or '–'} | {nb} | {meta} |")
        cells = [item, what, paper, ours]
        link_html = " ".join(f'<a href="{_html.escape(p.relative_to(output_dir).as_posix())}">{_html.escape(p.suffix.lstrip("."))}</a>' for p in files)
        image = next((p for p in files if p.suffix == ".png"), None)
        thumb = f'<br><img src="{_html.escape(image.relative_to(output_dir).as_posix())}" width="320">' if image else ""
        nb_html = f'<a href="{_html.escape(executed.relative_to(output_dir).as_posix())}">{executed.stem}</a>' if executed else "–"
        html_rows.append("<tr>" + "".join(f"<td>{_html.escape(str(c))}</td>" for c in cells)
                         + f"<td>{link_html or '–'}{thumb}</td><td>{nb_html}</td><td>{_html.escape(meta)}</td></tr>")
    if runs:
        md += ["", "## Runs", "", "| notebook | model | preset | parameters | date | minutes |", "|---|---|---|---|---|---|"]
        for notebook, run in sorted(runs.items()):
            md.append(f"| {notebook} | {run.get('model')} | {run.get('preset')} | `{_json.dumps(run.get('parameters', {}))}` | {run.get('date')} | {run.get('minutes')} |")
    (output_dir / "README.md").write_text("\n".join(md) + "\n")
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>dynheads-tl reproduction</title>"
            "<style>body{font-family:sans-serif;margin:2em}td,th{border:1px solid #ccc;padding:4px;vertical-align:top}"
            "table{border-collapse:collapse}</style></head><body><h1>The reproduction at a glance</h1>"
            "<p>Regenerated from the files present; numbers labelled paper are quoted from arXiv 2602.11162.</p>"
            "<table><tr><th>item</th><th>what</th><th>paper</th><th>ours</th><th>files</th><th>notebook</th><th>run</th></tr>"
            + "".join(html_rows) + "</table></body></html>\n")
    (output_dir / "index.html").write_text(page)
    return output_dir / "README.md"
