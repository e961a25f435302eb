"""How a figure or a table is written: with the numbers behind it and the config that made it, atomically, and
byte-identical on a rerun. The figures themselves are drawn by each claim (`claims/<name>/figures.py`).

Every figure: ``NAME.png`` + ``NAME.pdf`` + ``NAME.csv`` + ``NAME.config.json``.
Every table: ``NAME.csv`` + ``NAME.md`` + ``NAME.config.json``.
Each is also recorded in the folder's results file (``verdicts.json``: its kind, caption and the notebook cell that
wrote it, :func:`dynheads_tl.verdicts.record_output`), which the site reads to place it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from dynheads_tl.analysis.plots import FIGURE_DPI
from dynheads_tl.store import atomic_write_text
from dynheads_tl.verdicts import record_output

PDF_METADATA = {"CreationDate": None, "ModDate": None}  # byte-identical reruns


def write_config(out: Path, name: str, config: dict[str, Any]) -> None:
    atomic_write_text(out / f"{name}.config.json", json.dumps(config, indent=1, sort_keys=True, default=str) + "\n")


def markdown_table(frame: pd.DataFrame, floatfmt: str = ".4f") -> str:
    integral = {
        column for column in frame.columns
        if pd.api.types.is_numeric_dtype(frame[column]) and not pd.api.types.is_bool_dtype(frame[column])
        and frame[column].dropna().apply(lambda v: float(v).is_integer()).all()
        and not column.startswith(("jaccard", "entropy", "accuracy", "f1", "em"))
    }

    def fmt(value, column):
        if isinstance(value, (float, np.floating)):
            if np.isnan(value):
                return "–"
            return str(int(value)) if column in integral else format(value, floatfmt)
        return str(value)

    header = "| " + " | ".join(str(c) for c in frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    rows = ["| " + " | ".join(fmt(v, c) for v, c in zip(row, frame.columns)) + " |"
            for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *rows]) + "\n"


def save_table(frame: pd.DataFrame, name: str, out_dir: str | Path, config: dict[str, Any], caption: str = "") -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / f"{name}.csv", frame.to_csv(index=False))
    atomic_write_text(out / f"{name}.md", markdown_table(frame))
    write_config(out, name, config)
    record_output(out, name, "table", caption)
    return out / f"{name}.md"


def figure_caption(fig) -> str:
    """A figure's own title: its suptitle, else its first panel's title ("" when it has neither)."""
    suptitle = getattr(fig, "_suptitle", None)
    if suptitle is not None and suptitle.get_text().strip():
        return " ".join(suptitle.get_text().split())
    titles = [ax.get_title() for ax in fig.axes if ax.get_title().strip()]
    return " ".join(titles[0].split()) if titles else ""


def save_figure(fig, name: str, out_dir: str | Path, data: pd.DataFrame, config: dict[str, Any],
                caption: str = "") -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    caption = caption or figure_caption(fig)
    fig.savefig(out / f"{name}.png", dpi=FIGURE_DPI, bbox_inches="tight", metadata={"Software": None})
    fig.savefig(out / f"{name}.pdf", bbox_inches="tight", metadata=PDF_METADATA)
    # Closed once saved: the notebooks display the PNG that was written, and an open figure would be
    # drawn a second time by the inline backend at the end of the cell.
    plt.close(fig)
    atomic_write_text(out / f"{name}.csv", data.to_csv(index=False))
    write_config(out, name, config)
    record_output(out, name, "figure", caption)
    return out / f"{name}.png"
