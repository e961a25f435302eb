"""Figures and tables, each written with the numbers behind it and the config that made it.

Every figure: ``NAME.png`` + ``NAME.pdf`` + ``NAME.csv`` + ``NAME.config.json``.
Every table: ``NAME.csv`` + ``NAME.md`` + ``NAME.config.json``.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

PDF_METADATA = {"CreationDate": None, "ModDate": None}  # byte-identical reruns


def _atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)


def _write_config(out: Path, name: str, config: dict[str, Any]) -> None:
    _atomic_write_text(out / f"{name}.config.json", json.dumps(config, indent=1, sort_keys=True, default=str) + "\n")


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


def save_table(frame: pd.DataFrame, name: str, out_dir: str | Path, config: dict[str, Any]) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _atomic_write_text(out / f"{name}.csv", frame.to_csv(index=False))
    _atomic_write_text(out / f"{name}.md", markdown_table(frame))
    _write_config(out, name, config)
    return out / f"{name}.md"


def save_figure(fig, name: str, out_dir: str | Path, data: pd.DataFrame, config: dict[str, Any]) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / f"{name}.png", dpi=130, bbox_inches="tight", metadata={"Software": None})
    fig.savefig(out / f"{name}.pdf", bbox_inches="tight", metadata=PDF_METADATA)
    _atomic_write_text(out / f"{name}.csv", data.to_csv(index=False))
    _write_config(out, name, config)
    return out / f"{name}.png"


def head_label(layer: int, head: int) -> str:
    return f"L{layer}H{head}"


def step_heatmap(scores: np.ndarray, hits: np.ndarray | None, token_labels: Sequence[str],
                 head_labels: Sequence[str], title: str, colorbar: str):
    """Heads (rows) x generated tokens (columns); dots mark Eq. 1 hits when given."""
    width = max(6.0, 0.32 * len(token_labels) + 2)
    fig, ax = plt.subplots(figsize=(width, 0.35 * len(head_labels) + 1.8))
    sns.heatmap(scores, ax=ax, cmap="viridis", vmin=0, vmax=max(float(np.nanmax(scores)), 1e-6),
                xticklabels=list(token_labels), yticklabels=list(head_labels), cbar_kws={"label": colorbar})
    if hits is not None:
        rows, cols = np.nonzero(hits)
        ax.scatter(cols + 0.5, rows + 0.5, s=14, c="white", edgecolors="black", linewidths=0.5,
                   label="Eq. 1 retrieval head")
        if len(rows):
            ax.legend(loc="upper right", bbox_to_anchor=(1.0, 1.18), fontsize=8, frameon=False)
    ax.set_xlabel("generated token")
    ax.set_ylabel("head")
    ax.set_title(title)
    plt.setp(ax.get_xticklabels(), rotation=90, fontsize=7)
    fig.tight_layout()
    return fig


def long_tail_figure(frequency: pd.DataFrame, curve: Sequence[int], n_heads: int, title: str):
    """Left: ranked activation frequency, static heads marked. Right: distinct heads vs steps."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6))
    ranked = frequency.sort_values("frequency", ascending=False).reset_index(drop=True)
    ranked = ranked[ranked["frequency"] > 0]
    colors = np.where(ranked["static_top20"], "tab:orange", "tab:blue")
    left.bar(np.arange(len(ranked)), ranked["frequency"], color=colors, width=1.0)
    left.set_xlabel("head rank (active heads only)")
    left.set_ylabel("fraction of steps active")
    left.set_title(f"{title}: activation frequency")
    from matplotlib.patches import Patch

    left.legend(handles=[Patch(color="tab:orange", label="static top-20"), Patch(color="tab:blue", label="other")])
    right.plot(np.arange(1, len(curve) + 1), curve)
    right.axhline(n_heads, color="grey", ls=":", label=f"all {n_heads} heads")
    right.set_xlabel("decoding steps seen")
    right.set_ylabel("distinct heads ever active")
    right.set_title(f"{title}: heads seen vs steps")
    right.legend()
    fig.tight_layout()
    return fig
