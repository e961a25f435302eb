"""The size axis across models (``preregistration.yaml``, section ``scale:`` and its deviation of 2026-12-06): each
model's ``size_axis.csv`` from notebook 07's ``scale`` runs in the committed report (``scale/<model>/07_length_grid/``),
ordered by their block parameters; per primary the declared reading across
sizes (grows, shrinks, flat, undetermined) and what it says (the ``meaning:`` list); per claim one computed sentence;
and the size figure: each primary against block parameters (log scale), one point per model with its 95% interval,
the smallest effect of interest as a band, and the paper's five models beside ours where the paper gives the measure
(the raw adjacent-step Jaccard and heads per step of Table 1).

Written into the ``scale/`` preset's folder by :func:`write_size_axis` (``size_axis_reading.csv``, ``size_axis.png``)
when its index is built (:func:`size_axis_section`, the claim's ``section``), which shows them after the answer; the
README's answer and the findings read the same section without drawing it again (``write=False``).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from dynheads_tl import preregistration
from dynheads_tl.analysis.plots import FIGURE_DPI
from dynheads_tl.claim import ReportSection

from .size_axis import CLAIM_PRIMARIES, MASKING_PRIMARIES, label, restatus

__all__ = ["PAPER_MODELS", "scale_tables", "reading", "size_readings", "claim_sentences", "size_figure",
           "write_size_axis", "READING_FILE", "FIGURE_STEM", "size_axis_section", "brief_sentences"]

READING_FILE = "size_axis_reading.csv"
FIGURE_STEM = "size_axis"
_Z90 = 1.6448536269514722

# The paper's five models: block parameters computed from their published configurations (d_model, layers, query and
# KV heads of 128 dimensions, gated MLP width; attention and MLP matrices and two norms per layer, no embedding),
# and Table 1's adjacent-step Jaccard and heads per step (PAPER.md, reported numbers).
PAPER_MODELS = pd.DataFrame([
    # name, d_model, layers, heads, kv heads, MLP width, adjacent Jaccard, heads per step
    ("Llama-3.2-3B", 3072, 28, 24, 8, 8192, 0.3188, 9.69),
    ("Phi-4-mini", 3072, 32, 24, 8, 8192, 0.5056, 6.13),
    ("Qwen3-8B", 4096, 36, 32, 8, 12288, 0.3668, 20.18),
    ("Llama-3.1-8B", 4096, 32, 32, 8, 14336, 0.2793, 12.97),
    ("Llama-2-13B", 5120, 40, 40, 40, 13824, 0.4979, 6.20),
], columns=["model", "d_model", "layers", "heads", "kv_heads", "d_mlp", "jaccard_adjacent", "heads_per_step"])
PAPER_MODELS["parameters"] = PAPER_MODELS.layers * (
    2 * PAPER_MODELS.d_model * PAPER_MODELS.heads * 128 + 2 * PAPER_MODELS.d_model * PAPER_MODELS.kv_heads * 128
    + 3 * PAPER_MODELS.d_model * PAPER_MODELS.d_mlp + 2 * PAPER_MODELS.d_model)


def scale_tables(scale_dir: Path) -> pd.DataFrame:
    """Every model's ``size_axis.csv`` in the ``scale`` preset's folder (``scale/<model>/07_length_grid/``; a single
    model's report read on its own: its own), one frame, models in order of their block parameters; empty when no
    scale run exists."""
    scale_dir = Path(scale_dir)
    files = sorted(scale_dir.glob("07_length_grid/size_axis.csv")) + sorted(
        scale_dir.glob("*/07_length_grid/size_axis.csv"))
    if not files:
        return pd.DataFrame()
    table = pd.concat([restatus(pd.read_csv(f)) for f in files], ignore_index=True)
    return table.sort_values(["parameters", "model"], kind="stable").reset_index(drop=True)


def _beyond(a: pd.Series, b: pd.Series, higher: bool) -> bool:
    """Whether ``a``'s 95% interval lies wholly beyond ``b``'s in the direction ``higher`` (or lower)."""
    return bool(a["low"] > b["high"]) if higher else bool(a["high"] < b["low"])


def _difference90(a: pd.Series, b: pd.Series) -> tuple[float, float, float]:
    """b − a with a 90% interval combining the two models' own 90% intervals as independent normal errors (the
    deviation of 2026-12-06, (3))."""
    se = math.hypot((a["high90"] - a["low90"]) / (2 * _Z90), (b["high90"] - b["low90"]) / (2 * _Z90))
    diff = float(b["estimate"] - a["estimate"])
    return diff, diff - _Z90 * se, diff + _Z90 * se


def reading(rows: pd.DataFrame, direction: str, sesoi: float) -> str:
    """The declared reading across sizes of one primary, over ``rows`` (one per model, in parameter order, each with a
    finite estimate and interval), read in this order: grows / shrinks with size (the largest model's interval wholly
    beyond the smallest's in, or against, the paper's direction, and no neighbouring step reversing beyond its
    intervals), flat (every neighbouring difference's 90% interval, and the largest minus the smallest model's,
    within ± sesoi), undetermined otherwise or with fewer than two models."""
    if len(rows) < 2:
        return "undetermined"
    higher = direction in ("higher", "positive")
    steps = list(zip(rows.iloc[:-1].to_dict("records"), rows.iloc[1:].to_dict("records")))
    smallest, largest = rows.iloc[0], rows.iloc[-1]
    for grows, towards in (("grows with size", higher), ("shrinks with size", not higher)):
        if _beyond(largest, smallest, towards) and not any(_beyond(pd.Series(b), pd.Series(a), not towards)
                                                           for a, b in steps):
            return grows
    differences = [_difference90(pd.Series(a), pd.Series(b)) for a, b in steps] + [_difference90(smallest, largest)]
    if all(np.isfinite([low, high]).all() and -sesoi < low and high < sesoi for _, low, high in differences):
        return "flat across size"
    return "undetermined"


def _meaning(found: str, rows: pd.DataFrame) -> str:
    supported = rows["status"].eq("supported")
    if found == "grows with size" and not supported.iloc[-1]:
        return "the models may be too small"
    if found in ("flat across size", "shrinks with size") and not supported.any():
        return "not at these sizes"
    return "the size axis cannot tell"


def size_readings(table: pd.DataFrame) -> pd.DataFrame:
    """Per declared primary: the models it reads (in parameter order; a masking primary leaves out a model without
    headroom, and any primary a model whose estimate is not finite), the reading across sizes, what it means, and each
    model's status."""
    declared = preregistration.load()["scale"]["primaries"]
    out = []
    for primary in declared:
        pid, direction = primary["id"], str(primary["paper_direction"]).split(" ")[0]
        rows = table[(table["primary"] == pid)].reset_index(drop=True)
        left_out = rows[~np.isfinite(rows[["estimate", "low", "high"]].to_numpy(float)).all(1)
                        | ((rows["status"] == "no headroom") if pid in MASKING_PRIMARIES else False)]
        used = rows.drop(left_out.index).reset_index(drop=True)
        found = reading(used, direction, float(primary["sesoi"]))
        out.append({"primary": pid, "direction": direction, "sesoi": float(primary["sesoi"]), "reading": found,
                    "meaning": _meaning(found, used) if len(used) else "the size axis cannot tell",
                    "models": " ".join(used["model"]), "left_out": " ".join(left_out["model"]),
                    "statuses": "; ".join(f"{m}: {s}" for m, s in zip(rows["model"], rows["status"]))})
    return pd.DataFrame(out)


def _claim_verdict(meanings: list[str]) -> str:
    """What a claim's primaries' meanings say together (the deviation of 2026-12-06, (4))."""
    if "the models may be too small" in meanings:
        return "the models may be too small"
    if meanings and all(m == "not at these sizes" for m in meanings):
        return "not at these sizes"
    return "the size axis cannot tell"


def _largest(row) -> str:
    """For a trend across sizes, the largest model's status (which the meaning reads): "largest, M: supported";
    empty for a flat or undetermined reading."""
    if row.reading not in ("grows with size", "shrinks with size") or not row.models:
        return ""
    largest = str(row.models).split()[-1]
    status = dict(part.split(": ", 1) for part in str(row.statuses).split("; ")).get(largest, "?")
    return f"largest, {largest}: {status}"


def claim_sentences(readings: pd.DataFrame, models: list[str]) -> dict[str, str]:
    """One computed sentence per claim: what its primaries' readings across sizes say (the deviation of 2026-12-06,
    (4)), over ``models`` (every model run, in parameter order), naming any a primary leaves out."""
    total = len(preregistration.load()["scale"]["models"])
    out = {}
    for claim, primaries in CLAIM_PRIMARIES.items():
        rows = readings[readings["primary"].isin(primaries)]
        verdict = _claim_verdict(rows["meaning"].tolist())
        parts = []
        for r in rows.itertuples():
            notes = [_largest(r)] + ([f"without {r.left_out}: no headroom or no estimate"] if r.left_out else [])
            notes = [note for note in notes if note]
            parts.append(f"{label(r.primary)} {r.reading}" + (f" ({'; '.join(notes)})" if notes else ""))
        out[claim] = (f"{claim}, across {len(models)} of the {total} declared sizes ({', '.join(models)}): "
                      + "; ".join(parts) + f", so **{verdict}**.")
    return out


_BRIEF = {"outside_share_static_10pct": "outside share", "adjacent_jaccard_over_bound": "Jaccard over its bound",
          "fair_previous_step_vs_static": "D_{t-1} drop", "predicted_vs_static": "predicted-set drop",
          "probe_k1_vs_step_token_prior": "probe gain"}


def brief_sentences(readings: pd.DataFrame) -> dict[str, str]:
    """:func:`claim_sentences` shortened for the README: per claim, each primary's reading in a word or two and
    what the claim's readings say (the models are named once beside them, :class:`~dynheads_tl.claim.ReportSection`
    ``about``)."""
    out = {}
    for claim, primaries in CLAIM_PRIMARIES.items():
        rows = readings[readings["primary"].isin(primaries)]
        verdict = f"**{_claim_verdict(rows['meaning'].tolist())}**."
        parts = [f"{_BRIEF.get(r.primary, r.primary)} {str(r.reading).replace(' with size', '').replace(' across size', '')}"
                 for r in rows.itertuples()]  # the models a primary leaves out: in the full sentences
        out[claim] = f"{claim.split(',')[0]}: " + "; ".join(parts) + f": {verdict}"
    return out


def size_figure(table: pd.DataFrame, readings: pd.DataFrame, title: str):
    """Each primary (and the raw adjacent Jaccard and heads per step) against block parameters, log scale: our models
    with 95% intervals, the sesoi as a band, the paper's models beside the measures Table 1 gives."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogLocator

    panels = list(readings["primary"]) + ["jaccard_adjacent", "heads_per_step"]
    fig, axes = plt.subplots(2, 4, figsize=(17, 9))
    # the grey band: effects short of the smallest effect of interest, between no effect and the sesoi
    bands = {"outside_share_static_10pct": lambda s: (0.0, s), "adjacent_jaccard_over_bound": lambda s: (1 - s, 1.0)}
    left_out = {r.primary: set(str(r.left_out).split()) for r in readings.itertuples()}
    for ax, primary in zip(axes.flat, panels):
        rows = table[table["primary"] == primary].copy()
        if primary == "heads_per_step":  # as a share of the model's heads: the paper's models have 672-1,600
            for column in ("estimate", "low", "high"):
                rows[column] = rows[column] / rows["n_heads"]
        x = rows["parameters"].to_numpy(float)
        y, low, high = (rows[c].to_numpy(float) for c in ("estimate", "low", "high"))
        out = rows["model"].isin(left_out.get(primary, set())).to_numpy()
        for keep, face, text in ((~out, "C0", "ours (95% CI)"), (out, "white", "ours, left out of the reading")):
            if keep.any():
                ax.errorbar(x[keep], y[keep], yerr=[y[keep] - low[keep], high[keep] - y[keep]], fmt="o", color="C0",
                            markerfacecolor=face, capsize=4, label=text)
        for xi, yi, name in zip(x, y, rows["model"]):
            # beside a model of nearly the same size (Gemma 3 and SmolLM2), the lower point's label goes below it;
            # the largest model's goes to its left, inside the frame and clear of the paper's models to its right
            below = any(abs(np.log10(xi / xj)) < 0.15 and yj > yi for xj, yj in zip(x, y))
            largest = len(x) > 1 and xi == x.max()
            ax.annotate(str(name).split("-instruct")[0], (xi, yi), textcoords="offset points",
                        xytext=(-5 if largest else 5, -11 if below or largest else 5), fontsize=7,
                        ha="right" if largest else "left")
        found = readings.set_index("primary")["reading"].get(primary)
        if found is not None:
            sesoi = float(readings.set_index("primary").loc[primary, "sesoi"])
            lo, hi = bands.get(primary, lambda s: (0.0, s))(sesoi)
            ax.axhspan(lo, hi, color="0.85", zorder=0, label=f"short of the sesoi ({sesoi:g})")
            ax.axhline(0 if primary not in bands else (1.0 if primary == "adjacent_jaccard_over_bound" else 0.0),
                       color="0.5", lw=0.8)
        if primary in PAPER_MODELS:
            paper = PAPER_MODELS[primary] / (PAPER_MODELS["layers"] * PAPER_MODELS["heads"]
                                             if primary == "heads_per_step" else 1)
            ax.scatter(PAPER_MODELS["parameters"], paper, marker="s", color="C3", label="the paper's models (Table 1)")
        ax.set_xscale("log")
        ax.xaxis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))  # 2 and 5 x 10^n: 3 and 4 ran into each other
        ax.margins(x=0.15, y=0.15)  # room for the labels inside the frame
        ax.set_xlabel("transformer-block parameters")
        name = "heads per step, as a share of the heads" if primary == "heads_per_step" else label(primary)
        ax.set_title(name + (f"\n{found}" if found else ""), fontsize=9)
        # under the panel, where no point or label can be
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def write_size_axis(scale_dir: Path, *, write: bool = True) -> tuple[pd.DataFrame, list[str]] | None:
    """Read every model's scale run and return (the readings, the models in parameter order); with ``write``, also
    write ``size_axis_reading.csv`` and the figure (PNG and PDF) into ``scale_dir``. None when no scale run exists."""
    import matplotlib.pyplot as plt

    table = scale_tables(scale_dir)
    if table.empty:
        return None
    readings = size_readings(table)
    models = list(dict.fromkeys(table["model"]))  # in parameter order
    if not write:
        return readings, models
    readings.to_csv(Path(scale_dir) / READING_FILE, index=False)
    fig = size_figure(table, readings, f"The size axis: five primaries across {len(models)} model{'s' * (len(models) != 1)} "
                                       "(NIAH, 2,000 tokens of the essays, static sets of 10% of the heads)")
    fig.savefig(Path(scale_dir) / f"{FIGURE_STEM}.png", dpi=FIGURE_DPI, bbox_inches="tight",
                metadata={"Software": None})
    fig.savefig(Path(scale_dir) / f"{FIGURE_STEM}.pdf", bbox_inches="tight",
                metadata={"CreationDate": None, "ModDate": None})
    plt.close(fig)
    return readings, models


def size_axis_section(output_dir: Path, *, write: bool = True) -> ReportSection | None:
    """The size axis of the report in ``output_dir`` (notebook 07's ``section``), from its models' scale runs
    (:func:`write_size_axis`; with ``write``, the figure and readings file drawn afresh): the figure, one sentence per
    claim and each primary's reading; None where the report holds no scale run (every report but the ``scale`` one)."""
    written = write_size_axis(output_dir, write=write)
    if written is None:
        return None
    readings, models = written
    total = len(preregistration.load()["scale"]["models"])
    rows = tuple((r.primary, r.reading, r.meaning, r.models or "–", r.statuses) for r in readings.itertuples())
    return ReportSection("The size axis", f"{FIGURE_STEM}.png", "The size axis: each primary against block parameters",
                         tuple(claim_sentences(readings, models).values()),
                         ("primary", "reading across sizes", "what it says", "models read", "each model's status"),
                         rows, brief=tuple(brief_sentences(readings).values()),
                         about=f"{len(models)} of the {total} declared sizes: {', '.join(models)}")
