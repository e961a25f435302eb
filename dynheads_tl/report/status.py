"""A status and a one-cell headline for each row of the report's index, computed from the CSVs present.

The index's "ours" column holds every number of an item (``index.ours_text``); a reader skimming the index
needs less: whether the item reproduced, and the one number that says so, with its interval and n. Each rule
below reads the same CSV the notebook wrote and states its threshold in its docstring.

Statuses of the paper's items: ``reproduced``, ``weaker`` (the same direction, less strongly than the paper),
``not reproduced``, ``undetermined`` (the intervals cannot tell), ``no headroom`` (the setting does not separate
its bounds, so the comparison says nothing) and ``qualitative`` (a picture, no verdict). Items beyond the paper
test a hypothesis of ours: ``supported``, ``partly supported``, ``not supported``, ``undetermined``,
``no headroom``, or ``descriptive`` (a measurement with no hypothesis attached).
"""
from __future__ import annotations

import json as _json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

PAPER_STATUSES = ("reproduced", "weaker", "not reproduced", "undetermined", "no headroom", "qualitative")
BEYOND_STATUSES = ("supported", "partly supported", "not supported", "undetermined", "no headroom", "descriptive")
STATUS_CLASS = {"reproduced": "good", "supported": "good", "weaker": "mixed", "partly supported": "mixed",
                "not reproduced": "bad", "not supported": "bad", "undetermined": "open", "no headroom": "open",
                "qualitative": "none", "descriptive": "none", "not produced": "bad", "see files": "none"}


@dataclass(frozen=True)
class Status:
    status: str
    headline: str  # the headline number with its interval and n
    why: str = ""  # the rule that gave the status, in a sentence


def _ci(value: float, low: float, high: float, digits: int = 2, signed: bool = False) -> str:
    f = f"{{:{'+' if signed else ''}.{digits}f}}"
    return f"{f.format(value)} [{f.format(low)}, {f.format(high)}]".replace("-", "−")


def _paired_bootstrap(a: np.ndarray, b: np.ndarray, seed: int = 0, n_boot: int = 2000) -> tuple[float, float, float]:
    """Mean of the paired differences a − b with a percentile bootstrap 95% interval over pairs."""
    diff = np.asarray(a, float) - np.asarray(b, float)
    diff = diff[~np.isnan(diff)]
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), size=(n_boot, len(diff)))].mean(axis=1)
    return float(diff.mean()), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def _table1(out: Path) -> Status:
    """Reproduced when the adjacent-step Jaccard's whole interval lies at or below the paper's 0.2793 + 0.1 (the sets
    change as much as in the paper, or more); not reproduced when it lies wholly at or above 0.9 (nearly the same
    set at every step); weaker when it lies wholly between the two (they change, less); undetermined when it
    spans either bound."""
    ci = pd.read_csv(out / "01_dynamism/table1_intervals.csv")
    row = ci[(ci["task"] == "niah") & (ci["metric"] == "jaccard_adjacent")].iloc[0]
    paper = 0.2793
    if row.high <= paper + 0.1:
        status = "reproduced"
    elif row.low >= 0.9:
        status = "not reproduced"
    elif row.low > paper + 0.1 and row.high < 0.9:
        status = "weaker"
    else:
        status = "undetermined"
    return Status(status, f"adjacent-step Jaccard {_ci(row.value, row.low, row.high)} (paper {paper:.2f}); "
                          f"n = {int(row.n_samples)} samples",
                  "interval against the paper's value + 0.1 (reproduced) and 0.9 (not reproduced)")


def _masking(out: Path, task: str) -> Status:
    """Teacher-forced drop of the gold token's log-probability, paired over samples (bootstrap 95%):
    no headroom when the unmasked metric's interval stays below 0.5; reproduced when masking D_t hurts more
    than as many random heads *and* than as many top static heads (both paired intervals above 0); not reproduced
    when either interval lies wholly below 0 (random or static heads hurt more than D_t); undetermined otherwise (an
    interval that contains 0 cannot tell the conditions apart, which is what the notebook's sentence says)."""
    name = "fig2_niah_masking" if task == "niah" else "fig6_hotpot_masking"
    grid = pd.read_csv(out / f"02_irreplaceability/{name}.csv")
    summary = pd.read_csv(out / f"02_irreplaceability/{task}_conditions.csv").set_index("condition")
    metric = "accuracy" if "accuracy" in summary else "f1"
    keys = ["context", "depth", "run"]
    wide = grid.pivot_table(index=keys, columns="condition", values="tf_drop")
    d_random = _paired_bootstrap(wide["dynamic"], wide["random_matched"])
    d_static = _paired_bootstrap(wide["dynamic"], wide["static_matched"])
    cell = lambda c: _ci(summary.loc[c, "tf_drop"], summary.loc[c, "tf_drop_low"], summary.loc[c, "tf_drop_high"])
    n = int(summary["n"].min())
    headline = (f"gold log-prob drop, nats/step: D_t {cell('dynamic')}, as many static {cell('static_matched')}, "
                f"as many random {cell('random_matched')}; n = {n} per condition")
    if summary.loc["none", f"{metric}_high"] < 0.5:
        status = "no headroom"
    elif d_random[1] > 0 and d_static[1] > 0:
        status = "reproduced"
    elif d_random[2] < 0 or d_static[2] < 0:
        status = "not reproduced"
    else:
        status = "undetermined"
    return Status(status, headline, f"unmasked {metric} {_ci(summary.loc['none', metric], summary.loc['none', f'{metric}_low'], summary.loc['none', f'{metric}_high'])}; "
                                    f"D_t − static {_ci(*d_static, signed=True)}, D_t − random {_ci(*d_random, signed=True)}")


def _progressive(out: Path, task: str) -> Status:
    """No headroom when the k = 0 metric's interval stays below 0.5; reproduced when the metric's interval at the
    largest k lies wholly below the k = 0 interval; not reproduced when the largest k's interval lies wholly at or
    above the k = 0 estimate (no drop at all); undetermined otherwise (Wilson for accuracy, bootstrap for F1)."""
    from dynheads_tl.claims.irreplaceability import metric_interval

    name = "fig3_niah_progressive" if task == "niah" else "fig7_hotpot_progressive"
    frame = pd.read_csv(out / f"02_irreplaceability/{name}.csv")
    metric = "accuracy" if "accuracy" in frame else "f1"
    first, last = frame["k"].min(), frame["k"].max()
    a = metric_interval(frame[frame["k"] == first][metric], metric)
    b = metric_interval(frame[frame["k"] == last][metric], metric)
    n = int(frame.groupby("k").size().min())
    if a.high < 0.5:
        status = "no headroom"
    elif b.high < a.low:
        status = "reproduced"
    elif b.low >= a.estimate:
        status = "not reproduced"
    else:
        status = "undetermined"
    return Status(status, f"{metric} k = {first}: {_ci(a.estimate, a.low, a.high)} → k = {last}: "
                          f"{_ci(b.estimate, b.low, b.high)}; n = {n} samples per k")


def _cca(out: Path, name: str) -> Status:
    """Held-out first canonical correlation against pairing each hidden state with another sample's scores at
    the same step (the position control), read from the notebook's tests (``<name>_tests.csv``: paired over grouped
    splits, Holm over lags x controls, ``separated``): reproduced when held-out is separated above the same-step
    shuffle at every lag, weaker when at some, not reproduced when the shuffle is separated above it at every lag,
    undetermined otherwise. A run without that file (single values, no interval) is undetermined."""
    frame = pd.read_csv(out / f"03_correlation/{name}.csv")
    value = "first" if "first" in frame else "leading"
    held = frame[frame["control"] == "held-out"].set_index("k")[value].sort_index()
    same = frame[frame["control"] == "shuffled, same step"].set_index("k")[value].reindex(held.index)
    tests_path = out / f"03_correlation/{name}_tests.csv"
    if tests_path.exists():
        tests = pd.read_csv(tests_path)
        tests = tests[tests["b"] == "shuffled, same step"]
        sep = tests["separated"].astype(str).str.lower() == "true"
        above = int((sep & (tests["difference"] > 0)).sum())
        below = int((sep & (tests["difference"] < 0)).sum())
        lags = len(tests)
        status = ("reproduced" if lags and above == lags else "weaker" if above else
                  "not reproduced" if lags and below == lags else "undetermined")
        why = f"held-out separated above the same-step shuffle at {above} of {lags} lags (Holm-adjusted)"
    else:
        above, status = int((held > same).sum()), "undetermined"
        why = "this run's CSV has single values with no interval or test, so no status is given"
    k0, k1 = held.index[0], held.index[-1]
    pairs = int(frame[(frame["control"] == "held-out") & (frame["k"] == k0)]["pairs"].iloc[0]) if "pairs" in frame else 0
    ends = f"{held[k0]:.3f} → {held[k1]:.3f}"
    split = out / f"03_correlation/{name}_residualised.csv"  # the held-out value with its interval over splits
    if split.exists():
        resid = pd.read_csv(split)
        resid = resid[resid["control"] == "held-out"].set_index("k")
        if k0 in resid.index and k1 in resid.index:
            a, b = resid.loc[k0], resid.loc[k1]
            ends = (f"{_ci(a['first'], a.first_low, a.first_high, 3)} → {_ci(b['first'], b.first_low, b.first_high, 3)} "
                    f"(t-interval over {int(a.splits)} splits)")
    return Status(status, f"held-out first canonical correlation {ends}, k = {k0} → {k1}, against a same-step shuffle "
                          f"{same[k0]:.3f} → {same[k1]:.3f}; n = {pairs} step pairs at k = {k0}",
                  why)


def _lead(out: Path, task: str, metric: str) -> tuple[pd.DataFrame, pd.Series]:
    frame = pd.read_csv(out / "03_correlation/lead_probes.csv")
    rows = frame[(frame["task"] == task) & (frame["metric"] == metric)].sort_values("k")
    return rows, rows.iloc[0]


def _probe_table(out: Path, task: str) -> Status:
    """The MLP probe at k = 0 minus the step-aware prior (95% t-interval over splits): reproduced when the
    interval is above 0, not reproduced when below 0 or when the probe's R² is not above 0 (no better than
    the mean), undetermined otherwise."""
    name, metric = ("table2_niah_probe", "f1") if task == "niah" else ("table3_hotpot_probe", "r2")
    table = pd.read_csv(out / f"03_correlation/{name}.csv").set_index("predictor")
    ours = table.loc["MLP probe", metric]
    _, row = _lead(out, task, metric)
    if metric == "r2" and ours <= 0:
        status = "not reproduced"
    else:
        status = "reproduced" if row.vs_step_prior_low > 0 else "not reproduced" if row.vs_step_prior_high < 0 else "undetermined"
    paper = {"f1": 0.8349, "r2": 0.8120}[metric]
    return Status(status, f"MLP {'F1' if metric == 'f1' else 'R²'} {ours:.2f} (paper {paper:.2f}); minus the step-aware prior "
                          f"{_ci(row.vs_step_prior, row.vs_step_prior_low, row.vs_step_prior_high, signed=True)}, "
                          f"n = {int(row.splits)} splits")


def _table4(out: Path) -> Status:
    """Paired F1 differences with a Holm-adjusted sign test (``separated``): no headroom unless full context
    beats no retrieval; reproduced when dynamic beats static, not reproduced when static beats dynamic,
    undetermined otherwise."""
    table = pd.read_csv(out / "04_dynamic_rag/table4_rag.csv").set_index("strategy")
    comp = pd.read_csv(out / "04_dynamic_rag/table4_comparisons.csv")
    pair = lambda a, b: comp[(comp["a"] == a) & (comp["b"] == b)].iloc[0]
    bounds, ds = pair("full", "none"), pair("dynamic", "static")
    separated = lambda r: bool(r.separated) if isinstance(r.separated, (bool, np.bool_)) else str(r.separated) == "True"
    if not (separated(bounds) and bounds.f1_difference > 0):
        status = "no headroom"
    elif separated(ds):
        status = "reproduced" if ds.f1_difference > 0 else "not reproduced"
    else:
        status = "undetermined"
    f1 = lambda s: _ci(table.loc[s, "f1"], table.loc[s, "f1_low"], table.loc[s, "f1_high"])
    return Status(status, f"F1 dynamic {f1('dynamic')} vs static {f1('static')}, paired "
                          f"{_ci(ds.f1_difference, ds.low, ds.high, signed=True)} (Holm p = {ds.p_adjusted:.2f}); "
                          f"n = {int(ds.n)} questions")


def _eq2(out: Path) -> Status:
    """Descriptive: the calibrated cutoff and how much more often it marks the real spans than placebo spans."""
    frame = pd.read_csv(out / "01_dynamism/eq2_calibration.csv")
    row = frame[frame["chosen"].astype(str) == "True"].iloc[0]
    return Status("descriptive", f"cutoff {row.factor:.2f} × chance: real spans marked {row.real_rate / row.placebo_rate:.1f}× "
                                 f"as often as placebo spans; {row.heads_per_step:.1f} heads per step")


def _size_aware(out: Path) -> Status:
    """Descriptive: the share of Eq. 1 activations outside the static top-20 (bootstrap 95% over samples)."""
    frame = pd.read_csv(out / "01_dynamism/size_aware_overlap.csv")
    part = frame[(frame["task"] == "niah") & (frame["static_k"] == 20)].set_index("metric")
    row = part.loc["share_outside_static"]
    cov = part.loc["static_coverage"]
    return Status("descriptive", f"NIAH: share outside the static top-20 {_ci(row.value, row.low, row.high, 3)}, coverage "
                                 f"{_ci(cov.value, cov.low, cov.high, 3)}; n = {int(row.n_samples)} samples")


def _soft(out: Path) -> Status:
    """Descriptive: adjacent-step Jaccard of the Eq. 1 set against the heads with evidence mass (attention on the
    whole needle) above the
    notebook's threshold, all settings pooled (bootstrap 95% over samples)."""
    frame = pd.read_csv(out / "01_dynamism/soft_dynamism.csv")
    sidecar = out / "01_dynamism/soft_dynamism.config.json"
    threshold = _json.loads(sidecar.read_text()).get("soft_threshold", 0.3) if sidecar.exists() else 0.3
    part = frame[(frame["setting"] == "all") & (frame["metric"] == "jaccard_adjacent")]
    eq1 = part[part["kind"] == "eq1"].iloc[0]
    mass = part[(part["kind"] == "evidence") & ((part["threshold"] - threshold).abs() < 1e-9)].iloc[0]
    return Status("descriptive", f"adjacent Jaccard: Eq. 1 {_ci(eq1.value, eq1.low, eq1.high)}, {mass.definition} "
                                 f"{_ci(mass.value, mass.low, mass.high)}; n = {int(eq1.n_samples)} samples")


def _residualised(out: Path) -> Status:
    """Supported when the residualised held-out correlation at the first lag lies above its chance pairing's
    interval, not supported when the intervals overlap (95% t-intervals over splits)."""
    frame = pd.read_csv(out / "03_correlation/fig4_niah_cca_residualised.csv")
    resid = frame[frame["control"] == "held-out, residualised"].set_index("k").sort_index()
    chance = frame[frame["control"] == "held-out, residualised, chance"].set_index("k")
    k = resid.index[0]
    r, c = resid.loc[k], chance.loc[k]
    status = "supported" if r.first_low > c.first_high else "not supported"
    return Status(status, f"k = {k}: {_ci(r['first'], r.first_low, r.first_high, 3)} against chance "
                          f"{_ci(c['first'], c.first_low, c.first_high, 3)}; n = {int(r.splits)} splits")


def _lead_probes(out: Path) -> Status:
    """Does the hidden state predict the NIAH Eq. 1 set k ≥ 1 steps ahead better than the step-aware prior?
    Supported when the difference's interval is above 0 at every lag k ≥ 1, partly supported when at some,
    not supported when at none."""
    rows, _ = _lead(out, "niah", "f1")
    ahead = rows[rows["k"] >= 1]
    above = ahead[ahead["vs_step_prior_low"] > 0]
    status = "supported" if len(above) == len(ahead) else "partly supported" if len(above) else "not supported"
    best = ahead.iloc[0]
    return Status(status, f"NIAH F1 − step-aware prior at k = {int(best.k)}: "
                          f"{_ci(best.vs_step_prior, best.vs_step_prior_low, best.vs_step_prior_high, 3, True)}; "
                          f"above 0 at {len(above)} of {len(ahead)} lags k ≥ 1; n = {int(best.splits)} splits")


def _auroc(out: Path) -> Status:
    """Do context-only dynamic-head features flag wrong answers better than a Lookback-style ratio? Supported
    when the paired AUROC difference's interval is above 0, not supported when below, undetermined when it
    contains 0 (cluster bootstrap 95%)."""
    frame = pd.read_csv(out / "05_error_signal/auroc.csv").set_index("group")
    look = frame.loc["lookback"]
    d, lo, hi = look.dynamic_ctx_minus, look.dynamic_ctx_minus_low, look.dynamic_ctx_minus_high
    status = "supported" if lo > 0 else "not supported" if hi < 0 else "undetermined"
    ctx = frame.loc["dynamic_ctx"]
    return Status(status, f"AUROC context-only {_ci(ctx.auroc, ctx.low, ctx.high)} vs Lookback "
                          f"{_ci(look.auroc, look.low, look.high)}, paired {_ci(d, lo, hi, signed=True)}; "
                          f"n = {int(ctx.n)} answers ({int(ctx.wrong)} wrong)")


def _retention(out: Path) -> Status:
    """No headroom unless the full cache's accuracy interval lies above streaming's; then supported when
    predicted beats static at some budget (Holm-adjusted sign test), not supported when static beats
    predicted at some budget, undetermined when no comparison is separated."""
    frame = pd.read_csv(out / "06_kv_retention/retention.csv")
    comp = pd.read_csv(out / "06_kv_retention/predicted_vs_static.csv")
    full = frame[frame["strategy"] == "full"].iloc[0]
    stream = frame[frame["strategy"] == "streaming"].iloc[0]
    separated = comp[comp["separated"].astype(str) == "True"]
    if full.accuracy_low <= stream.accuracy_high:
        status = "no headroom"
    elif len(separated):
        status = "supported" if (separated["accuracy_difference"] > 0).any() else "not supported"
    else:
        status = "undetermined"
    q = frame[(frame["granularity"] == "query") & (frame["budget"].round(6) == 0.25)].set_index("strategy")
    acc = lambda s: _ci(q.loc[s, "accuracy"], q.loc[s, "accuracy_low"], q.loc[s, "accuracy_high"])
    head = (f"at 25% of query heads: predicted {acc('predicted')} vs static {acc('static')}; "
            if {"predicted", "static"} <= set(q.index) else "")
    return Status(status, head + f"full cache {_ci(full.accuracy, full.accuracy_low, full.accuracy_high)}; "
                                 f"n = {int(full.n)} samples; {len(separated)} of {len(comp)} comparisons separated")


RULES: dict[str, Callable[[Path], Status]] = {
    "Table 1": _table1,
    "Fig 1": lambda out: Status("qualitative", "a picture of one answer"),
    "Fig 2": lambda out: _masking(out, "niah"),
    "Fig 3": lambda out: _progressive(out, "niah"),
    "Fig 4": lambda out: _cca(out, "fig4_niah_cca"),
    "Fig 5": lambda out: Status("qualitative", "a picture of one answer"),
    "Fig 6": lambda out: _masking(out, "hotpot"),
    "Fig 7": lambda out: _progressive(out, "hotpot"),
    "Fig 8": lambda out: _cca(out, "fig8_hotpot_cca"),
    "Table 2": lambda out: _probe_table(out, "niah"),
    "Table 3": lambda out: _probe_table(out, "hotpot"),
    "Table 4": _table4,
    "Beyond 0": _eq2,
    "Beyond 1": _size_aware,
    "Beyond 1b": _soft,
    "Beyond 3a": _residualised,
    "Beyond 3b": _lead_probes,
    "Beyond 5": _auroc,
    "Beyond 6": _retention,
}


def item_status(output_dir: Path, item: str) -> Status:
    """The status and headline of one index row; ``see files`` when its CSVs are missing or of another shape
    (an older run), so the index is still written."""
    rule = RULES.get(item)
    if rule is None:
        return Status("see files", "see the files")
    try:
        return rule(Path(output_dir))
    except (OSError, KeyError, IndexError, ValueError, AttributeError, TypeError):
        return Status("see files", "see the files")
