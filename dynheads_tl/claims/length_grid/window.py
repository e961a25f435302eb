"""Notebook 07, exploratory (not pre-registered; ``preregistration.yaml``, ``deviations:``): where D_t lies between
global and sliding-window layers as the needle moves away from the answer, and whether D_t rotates among the global
heads as the paper describes.

Why. On a model with sliding-window layers (Gemma 3: a 512-token window on most layers, full attention on a few) a
needle further back than the window is out of reach of every sliding layer: only the heads of the global layers can
copy it, so D_t at long range is a subset of a few heads fixed by the architecture. Two descriptive questions follow.
Where does D_t lie as a function of the needle's distance (the share of Eq. 1 activations in global layers, per
distance bin)? And does the set still change from step to step when it lives among the global heads only (the
adjacent-step Jaccard restricted to the global heads, and to the sliding ones, beside the paper's range)?

Distance. At answer step t the query row is the last token, at prompt position ``len(prompt) - 1 + t``; the
needle's distance is how many positions back its nearest token lies (query position minus the needle's last
position). A sliding layer with window w sees that token iff the distance is below w, so in a bin at or beyond the
window the share in global layers is 1 by construction: there it checks the engine (a sliding head that retrieved
beyond its window would show), and the bin's heads per step say whether retrieval survives on the global heads.

Everything here reads the traces the grid already holds (Eq. 1 sets and prompt lengths) and the loaded model's
layer windows (:func:`~dynheads_tl.engine.grouped.layer_windows`): no model run. Intervals: BCa 95% over layouts
(:func:`~.pipeline.cluster_bca`), the independent unit.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from dynheads_tl import preregistration
from dynheads_tl.analysis.scoring import adjacent_counts
from dynheads_tl.claim import Verdict, ci_text, is_true
from dynheads_tl.engine.trace_data import Trace

from .config import haystack_label
from .pipeline import cluster_bca
from dynheads_tl.engine.grouped import layer_windows

__all__ = ["LayerKinds", "layer_kinds", "distance_edges", "window_steps", "window_shares", "window_jaccard",
           "window_figure", "window_verdict", "WINDOW_SCOPES"]

# The head sets the adjacent-step Jaccard is restricted to.
WINDOW_SCOPES = ("global", "sliding", "all")


@dataclass(frozen=True)
class LayerKinds:
    """Each layer's sliding window (None: full, "global", attention) and the heads per layer."""

    windows: tuple[int | None, ...]
    n_heads: int

    def __post_init__(self) -> None:
        if self.n_heads < 1 or not self.windows:
            raise ValueError(f"LayerKinds needs at least one layer and one head per layer, got {len(self.windows)} "
                             f"layers x {self.n_heads} heads.")
        if any(w is not None and int(w) < 1 for w in self.windows):
            raise ValueError(f"A sliding window is a positive number of tokens, got {list(self.windows)}.")

    @property
    def sliding(self) -> bool:
        """Whether any layer has a sliding window (the analysis runs only then)."""
        return any(w is not None for w in self.windows)

    @property
    def global_layers(self) -> list[int]:
        return [i for i, w in enumerate(self.windows) if w is None]

    @property
    def window_sizes(self) -> list[int]:
        """The distinct sliding windows, smallest first."""
        return sorted({int(w) for w in self.windows if w is not None})

    def global_heads(self) -> torch.Tensor:
        """[layer, head] bool: True on the heads of global layers."""
        is_global = torch.tensor([w is None for w in self.windows])
        return is_global[:, None].expand(len(self.windows), self.n_heads).clone()

    @property
    def global_head_share(self) -> float:
        """The share of heads in global layers: the share of activations in global layers if D_t ignored layer
        type (the reference line of the figure)."""
        return len(self.global_layers) / len(self.windows)

    def table(self) -> pd.DataFrame:
        return pd.DataFrame({"layer": range(len(self.windows)),
                             "kind": ["global" if w is None else "sliding" for w in self.windows],
                             "window": [float("nan") if w is None else int(w) for w in self.windows],
                             "heads": self.n_heads})

    @classmethod
    def from_table(cls, frame: pd.DataFrame) -> "LayerKinds":
        """Read back :meth:`table` (``window_layers.csv``)."""
        frame = frame.sort_values("layer")
        windows = tuple(None if kind == "global" else int(w) for kind, w in zip(frame["kind"], frame["window"]))
        return cls(windows, int(frame["heads"].iloc[0]))


def layer_kinds(model) -> LayerKinds:
    """The loaded model's layer windows (:func:`~dynheads_tl.engine.grouped.layer_windows`) and heads per layer."""

    return LayerKinds(tuple(layer_windows(model)), int(model.cfg.n_heads))


def distance_edges(lengths, windows) -> list[int]:
    """The lower edges of the distance bins: 0, every sliding window and every grid length, in order; a bin runs
    from its edge to the next one (the last is open). With a 512-token window and lengths 1k, 2k: <512, 512-999,
    1,000-1,999, >=2,000."""
    return sorted({0, *(int(w) for w in windows), *(int(x) for x in lengths)})


def _bin_labels(edges: list[int]) -> list[str]:
    return [f"{a:,}–{b - 1:,}" for a, b in zip(edges, edges[1:])] + [f"≥{edges[-1]:,}"]


def window_steps(cells: list[tuple[dict, object]], traces: list[Trace], kinds: LayerKinds) -> pd.DataFrame:
    """One row per (grid sample, answer step): the sample's cell (``context``, ``depth``, ``layout``), the step,
    the needle's distance from the query row (to its nearest and its farthest token) and how many heads of D_t lie
    in global and in sliding layers. A sample without an evidence position has NaN distances."""
    if len(cells) != len(traces):
        raise ValueError(f"{len(cells)} grid cells but {len(traces)} traces.")
    is_global = kinds.global_heads()
    rows = []
    for index, ((cell, _), trace) in enumerate(zip(cells, traces)):
        if (trace.n_layers, trace.n_heads) != tuple(is_global.shape):
            raise ValueError(f"Trace {index} has {trace.n_layers} layers x {trace.n_heads} heads; the layer kinds "
                             f"describe {is_global.shape[0]} x {is_global.shape[1]}.")
        mask = trace.retrieval_mask
        in_global = (mask & is_global).flatten(1).sum(1)
        in_sliding = (mask & ~is_global).flatten(1).sum(1)
        needle = trace.evidence_mask.nonzero().flatten()
        query = len(trace.prompt_ids) - 1 + torch.arange(trace.n_steps)
        near = (query - needle.max()).double() if len(needle) else torch.full((trace.n_steps,), float("nan"))
        far = (query - needle.min()).double() if len(needle) else torch.full((trace.n_steps,), float("nan"))
        for step in range(trace.n_steps):
            rows.append({"sample": index, "context": int(cell["context"]), "depth": float(cell["depth"]),
                         "layout": cell["layout"], "step": step, "distance": float(near[step]),
                         "distance_far": float(far[step]), "global_heads": int(in_global[step]),
                         "sliding_heads": int(in_sliding[step])})
    return pd.DataFrame(rows, columns=["sample", "context", "depth", "layout", "step", "distance", "distance_far",
                                       "global_heads", "sliding_heads"])


def _interval(n: int, clusters, statistic, n_resamples: int, seed: int) -> dict:
    value, low, high, degenerate = cluster_bca(n, clusters, statistic, n_resamples=n_resamples, seed=seed)
    return {"value": value, "low": low, "high": high, "degenerate": degenerate}


def window_shares(steps: pd.DataFrame, kinds: LayerKinds, lengths, *, n_resamples: int = 2000,
                  seed: int = 0) -> pd.DataFrame:
    """Per distance bin (:func:`distance_edges`) and measure, the value with its BCa 95% interval over layouts:
    ``share_global`` (the share of the bin's Eq. 1 activations in global layers: their sum over the sum of all
    activations, pooled over the bin's steps; undefined without an activation) and ``heads_per_step`` (mean |D_t|
    over the bin's steps). Each row also gives the bin's edges, whether it lies at or beyond every sliding window
    (``beyond_window``, where the share is 1 by construction), the share of heads in global layers
    (``global_head_share``, the share if D_t ignored layer type) and its n: samples, layouts, steps, activations.
    A bin that no step falls in keeps its rows, with NaN values and n = 0."""
    edges = distance_edges(lengths, kinds.window_sizes)
    labels = _bin_labels(edges)
    widest = max(kinds.window_sizes) if kinds.sliding else float("inf")
    placed = steps.dropna(subset=["distance"])
    which = np.searchsorted(np.asarray(edges), placed["distance"].to_numpy(float), side="right") - 1
    rows = []
    for b, (label, low_edge) in enumerate(zip(labels, edges)):
        part = placed[which == b]
        per_sample = part.groupby("sample", sort=True).agg(layout=("layout", "first"), steps=("step", "size"),
                                                           global_heads=("global_heads", "sum"),
                                                           sliding_heads=("sliding_heads", "sum")).reset_index()
        glob = per_sample["global_heads"].to_numpy(float)
        total = glob + per_sample["sliding_heads"].to_numpy(float)
        n_steps = per_sample["steps"].to_numpy(float)
        statistics = {
            "share_global": lambda i: float(glob[i].sum() / total[i].sum()) if total[i].sum() > 0 else float("nan"),
            "heads_per_step": lambda i: float(total[i].sum() / n_steps[i].sum()) if n_steps[i].sum() > 0 else float("nan"),
        }
        common = {"bin": label, "distance_low": low_edge,
                  "distance_high": edges[b + 1] - 1 if b + 1 < len(edges) else float("nan"),
                  "beyond_window": bool(low_edge >= widest), "global_head_share": kinds.global_head_share,
                  "n_samples": len(per_sample), "n_layouts": int(per_sample["layout"].nunique()),
                  "n_steps": int(n_steps.sum()), "n_activations": int(total.sum())}
        for measure, statistic in statistics.items():
            if len(per_sample):
                values = _interval(len(per_sample), per_sample["layout"], statistic, n_resamples, seed)
            else:
                values = {"value": float("nan"), "low": float("nan"), "high": float("nan"), "degenerate": False}
            rows.append({**common, "measure": measure, **values})
    return pd.DataFrame(rows)


def _paper_range() -> tuple[float, float]:
    """The paper's adjacent-step Jaccard over its five models (Table 1), as claim 1's declared rule holds it."""
    low, high = preregistration.item_rule("dynamism", "Table 1")["paper_range_adjacent_jaccard"]
    return float(low), float(high)


def _reading(low: float, high: float, value: float, paper: tuple[float, float]) -> str:
    """Where an interval lies against the paper's range: above, below, within, or overlapping it (no test);
    "undefined" without a value, "no interval" with one layout."""
    if value != value:
        return "undefined"
    if low != low or high != high:
        return "no interval"
    if low > paper[1]:
        return "above the paper's range"
    if high < paper[0]:
        return "below the paper's range"
    if low >= paper[0] and high <= paper[1]:
        return "within the paper's range"
    return "overlaps the paper's range"


# How a sentence says each reading of :func:`_reading` ("the global heads' interval ...").
_READING_WORDS = {"above the paper's range": "lies above it", "below the paper's range": "lies below it",
                  "within the paper's range": "lies within it", "overlaps the paper's range": "overlaps it",
                  "undefined": "is undefined", "no interval": "is not defined (one layout)"}


def window_jaccard(cells: list[tuple[dict, object]], traces: list[Trace], kinds: LayerKinds, *,
                   n_resamples: int = 2000, seed: int = 0) -> pd.DataFrame:
    """The adjacent-step Jaccard of D_t restricted to the heads of global layers, to those of sliding layers, and
    over all heads (:data:`WINDOW_SCOPES`), per length and over every length (``length`` "all"): J(D_t ∩ H,
    D_{t+1} ∩ H) summed over the consecutive step pairs whose restricted union is non-empty, over the pairs pooled
    (as Table 1's adjacent Jaccard), BCa 95% over layouts. ``size_bound``: the same pooling of min/max of the two
    restricted set sizes, the largest Jaccard those sizes allow (SCIENCE 2); ``heads_per_step``: mean |D_t ∩ H|.
    Beside each, the paper's range over its five models and where the interval lies against it (descriptive)."""
    if len(cells) != len(traces):
        raise ValueError(f"{len(cells)} grid cells but {len(traces)} traces.")
    is_global = kinds.global_heads()
    scopes = {"global": is_global, "sliding": ~is_global, "all": torch.ones_like(is_global)}
    paper = _paper_range()
    units = []
    for (cell, _), trace in zip(cells, traces):
        for scope, heads in scopes.items():
            sets = trace.retrieval_mask & heads
            counts = adjacent_counts(sets)
            sizes = sets.flatten(1).sum(1).double()
            a, b = sizes[:-1], sizes[1:]
            counted = (a + b) > 0  # adjacent_counts' pairs: the union is non-empty
            bound = float((torch.minimum(a, b)[counted] / torch.maximum(a, b)[counted]).sum())
            units.append({"scope": scope, "length": int(cell["context"]), "layout": cell["layout"],
                          "pairs": counts["pairs"], "jaccard_sum": counts["jaccard_sum"], "bound_sum": bound,
                          "steps": counts["steps"], "size_sum": counts["size_sum"]})
    frame = pd.DataFrame(units)
    rows = []
    for scope in WINDOW_SCOPES:
        at_scope = frame[frame["scope"] == scope]
        groups = [(str(int(x)), at_scope[at_scope["length"] == x]) for x in sorted(at_scope["length"].unique())]
        for length, part in groups + [("all", at_scope)]:
            part = part.reset_index(drop=True)
            pairs, jac, bound = (part[c].to_numpy(float) for c in ("pairs", "jaccard_sum", "bound_sum"))
            steps, size = part["steps"].to_numpy(float), part["size_sum"].to_numpy(float)
            ratio = lambda num, den: (lambda i: float(num[i].sum() / den[i].sum()) if den[i].sum() > 0 else float("nan"))
            row = {"scope": scope, "length": length, "heads": int(scopes[scope].sum())}
            for measure, statistic in (("jaccard_adjacent", ratio(jac, pairs)), ("size_bound", ratio(bound, pairs)),
                                       ("heads_per_step", ratio(size, steps))):
                values = _interval(len(part), part["layout"], statistic, n_resamples, seed)
                row.update({measure: values["value"], f"{measure}_low": values["low"],
                            f"{measure}_high": values["high"]})
                if measure == "jaccard_adjacent":
                    row["degenerate"] = values["degenerate"]
            # n: the samples and layouts that hold a step pair (the others add nothing to the pooled ratio)
            holding = part[part["pairs"] > 0]
            row.update({"pairs": int(pairs.sum()), "n_samples": len(holding), "n_layouts": int(holding["layout"].nunique()),
                        "paper_low": paper[0], "paper_high": paper[1],
                        "reading": _reading(row["jaccard_adjacent_low"], row["jaccard_adjacent_high"],
                                            row["jaccard_adjacent"], paper)})
            rows.append(row)
    return pd.DataFrame(rows)


def window_figure(shares: pd.DataFrame, kinds: LayerKinds, title: str):
    """The share of Eq. 1 activations in global layers per distance bin, with its BCa 95% interval and n; the
    sliding window marked (the boundary between the last bin inside it and the first beyond), and the share of heads
    in global layers as the line D_t would sit on if it ignored layer type."""
    import matplotlib.pyplot as plt

    at = shares[shares["measure"] == "share_global"].reset_index(drop=True)
    x = np.arange(len(at))
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(at) + 2.0), 3.6), layout="constrained")
    value = at["value"].to_numpy(float)
    low = np.where(np.isnan(at["low"].to_numpy(float)), value, at["low"].to_numpy(float))
    high = np.where(np.isnan(at["high"].to_numpy(float)), value, at["high"].to_numpy(float))
    shown = ~np.isnan(value)
    ax.errorbar(x[shown], value[shown], yerr=[value[shown] - low[shown], high[shown] - value[shown]], fmt="o",
                capsize=4, color="tab:blue", label="share of D_t in global layers (BCa 95%, over layouts)")
    ax.axhline(kinds.global_head_share, color="grey", linestyle=":",
               label=f"share of heads in global layers ({kinds.global_head_share:.2f})")
    beyond = at.index[at["beyond_window"].map(is_true)].tolist()
    if beyond and beyond[0] > 0:
        ax.axvline(beyond[0] - 0.5, color="tab:red", linestyle="--",
                   label=f"sliding window ({', '.join(f'{w:,}' for w in kinds.window_sizes)} tokens)")
    for i, r in at.iterrows():
        ax.annotate(f"{int(r['n_layouts'])} lay.\n{int(r['n_activations'])} act." if r["n_samples"] else "no data",
                    (i, 0.02), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x)
    ax.set_xticklabels(at["bin"].tolist())
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("needle's distance from the answer's query token (tokens, nearest needle token)")
    ax.set_ylabel("share in global layers")
    ax.legend(fontsize=7, loc="center left")
    ax.set_title(title, fontsize=10)
    return fig


def _deviation_note() -> str:
    """How the sentences label the analysis: exploratory and descriptive, with the dated deviation that added it."""
    dated = [str(d.get("date")) for d in preregistration.deviations() if "issue 49" in str(d.get("why", ""))]
    where = f"; preregistration.yaml, deviation of {dated[0]}" if dated else ""
    return f"exploratory and descriptive, not pre-registered{where}"


def _layers_text(kinds: LayerKinds) -> str:
    layers = kinds.global_layers
    return (f"the {len(layers) * kinds.n_heads} heads of the {len(layers)} global layer{'s' * (len(layers) != 1)} "
            f"({', '.join(map(str, layers)) or 'none'}; {kinds.global_head_share:.0%} of the heads)")


def _layouts(n) -> str:
    return f"{int(n)} layout{'s' * (int(n) != 1)}"


def _value(value: float, low: float, high: float, degenerate=False) -> str:
    if value != value:
        return "undefined"
    if low != low:
        return f"{value:.2f} (one layout: no interval)"
    if is_true(degenerate):
        return f"every layout at {value:.2f} (degenerate)"
    return ci_text(value, low, high)


WINDOW_KEYS = ("applies", "inside", "beyond", "jaccard")  # the parts of window_verdict


def window_verdict(layers: pd.DataFrame, shares: pd.DataFrame | None, jaccard: pd.DataFrame | None, model: str,
                   haystack: str) -> Verdict:
    """The computed sentences: on a model without sliding-window layers, one sentence saying the analysis does not
    apply; otherwise, one sentence per bin inside the window (the share of D_t in global layers with its interval
    and n), one for the bins beyond it (the share there, 1 by construction, stated as a check, and D_t's heads per
    step), and one for the adjacent-step Jaccard among the global heads, the sliding heads and all heads beside the
    paper's range, pooled over the grid's lengths. Descriptive: no threshold decides anything here."""
    kinds = LayerKinds.from_table(layers)
    label = haystack_label(haystack)
    if not kinds.sliding:
        return Verdict(("applies", f"On {model}, every one of the {len(kinds.windows)} layers attends to the whole "
                                   "context (no sliding-window layer), so the global vs sliding-window analysis "
                                   "(exploratory) does not apply and is skipped."), declared=WINDOW_KEYS)
    windows = " and ".join(f"{w:,}" for w in kinds.window_sizes)
    out = []
    share = shares[shares["measure"] == "share_global"]
    per_step = shares[shares["measure"] == "heads_per_step"].set_index("bin")
    inside = share[~share["beyond_window"].map(is_true)]
    lengths = sorted({int(x) for x in jaccard["length"] if str(x) != "all"}) if jaccard is not None else []
    setting = f"{model}, NIAH on the {label} haystack at {', '.join(f'{x:,}' for x in lengths)} tokens"
    parts = []
    for r in inside.itertuples():
        n = f"{_layouts(r.n_layouts)}, {int(r.n_samples)} samples, {int(r.n_activations)} activations"
        parts.append(f"at {r.bin} tokens from the needle {_value(r.value, r.low, r.high, r.degenerate)} ({n})"
                     if r.n_samples else f"at {r.bin} tokens from the needle no step (no data)")
    out.append(("inside", f"On {setting} ({_deviation_note()}), {_layers_text(kinds)} take this share of the Eq. 1 "
               f"activations while the needle lies inside the {windows}-token window: " + "; ".join(parts) + "."))
    beyond = share[share["beyond_window"].map(is_true) & (share["n_samples"] > 0)]
    if len(beyond):
        values = beyond["value"].dropna()
        check = ("no activation to count" if values.empty else
                 "every one in global layers, as the window requires" if (values == 1).all() else
                 f"a share of {values.min():.2f} in global layers: a sliding head retrieved beyond its window, "
                 f"which the mask should not allow")
        heads = "; ".join(f"at {b} tokens {_value(per_step.loc[b, 'value'], per_step.loc[b, 'low'], per_step.loc[b, 'high'], per_step.loc[b, 'degenerate'])} "
                          f"heads per step ({_layouts(per_step.loc[b, 'n_layouts'])})" for b in beyond["bin"])
        out.append(("beyond", f"Beyond the window sliding layers cannot see the needle, so the share in global layers "
                              f"is 1 by construction (a check, not a finding: {check}); D_t there holds {heads}."))
    else:
        out.append(("beyond", "No answer step had its needle beyond the window on this grid."))
    if jaccard is not None and len(jaccard):
        pooled = jaccard[jaccard["length"].astype(str) == "all"].set_index("scope")
        bits = []
        for scope, what in (("global", "among the global heads"), ("sliding", "among the sliding-window heads"),
                            ("all", "over all heads")):
            r = pooled.loc[scope]
            bits.append(f"{what} {_value(r['jaccard_adjacent'], r['jaccard_adjacent_low'], r['jaccard_adjacent_high'], r['degenerate'])}, "
                        f"size bound {r['size_bound']:.2f} ({_layouts(r['n_layouts'])}, {int(r['pairs'])} step pairs)"
                        if r["pairs"] else f"{what} undefined (no step pair with an activation)")
        g = pooled.loc["global"]
        out.append(("jaccard", "The adjacent-step Jaccard of D_t over the grid's lengths is " + "; ".join(bits)
                    + f"; the paper's range over its five models is {g['paper_low']:.4f}–{g['paper_high']:.4f}, and "
                    f"the global heads' interval {_READING_WORDS.get(g['reading'], g['reading'])} (descriptive, no "
                    "test)."))
    return Verdict(*out, declared=WINDOW_KEYS)
