"""Claim 3 — the final hidden state predicts future retrieval heads: CCA and MLP probes.

CCA (Fig 4 / Fig 8): pair the final-norm hidden state of step n with every head's retrieval score at
step n + k (pairs that run past the end of a sample are dropped). Scores are min-max scaled, PCA keeps
95% of the hidden-state variance and 99% of the score variance, and up to 50 canonical pairs are fitted.
The score per head and step is its attention share on the evidence (Eq. 2's ratio; for NIAH the
evidence is the needle), a continuous version of the retrieval pattern.

Independent units. NIAH samples of different seeds share their layout (the depth and haystack offset; the seed
changes only the UUID), so siblings of one layout are nearly the same sample: every split here is by *layout*
(:func:`layout_groups`, :func:`~dynheads_tl.analysis.statistics.grouped_splits`), never by sample, and every
table says how many samples and how many layouts (clusters) it rests on (SCIENCE 10).

Controls, because CCA overfits easily with few samples and many dimensions, all computed on each of several
grouped splits, fitted on the training layouts and scored on the held-out ones:
- **in-sample**: the paper's measure (fit and score on the same rows; here the training part of each split);
- **held-out**: fit scaling, PCA and CCA on the training layouts; correlate the canonical variates of
  the held-out layouts;
- **shuffled**: each hidden state paired with the scores of a step of a sample of *another layout*, on both
  sides of the split, then fitted and scored as held-out: how high held-out CCA goes on unrelated pairs;
- **shuffled, same step**: the same with the other layout's scores *at the same step index*, which keeps
  everything that depends only on the position in the answer (e.g. "the UUID starts at step 5"). The gap
  between held-out and this control is the part no position effect explains.
Means over the splits carry the corrected resampled t-interval (Nadeau and Bengio 2003,
:func:`~dynheads_tl.analysis.statistics.resampled_t_interval`): splits share most of their layouts, so a plain
t-interval over them would be too narrow.

Probes (Tables 2 and 3): an MLP from the hidden state to the per-head Eq. 1 pattern (multi-label
classification, Asymmetric Loss, threshold maximising F1 on the validation PR curve) or to the Eq. 2
scores (regression). Splits are train/validation/test *by layout*: the paper's 70/20/10, with the test part
enlarged to at least ``min_test_samples`` samples where the data allow (:func:`probe_splits`). Baselines in the
same tables: the static frequency prior (each head's training base rate), a step-aware prior (each head's rate
at that decoding step) and a linear probe.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Sequence

import numpy as np
import pandas as pd
import torch
from sklearn.decomposition import PCA
from sklearn.metrics import (average_precision_score, f1_score, mean_absolute_error, mean_squared_error,
                             precision_recall_curve, precision_score, r2_score, recall_score)

from dynheads_tl.analysis.statistics import grouped_splits, resampled_t_interval, resampled_t_test
from dynheads_tl.engine.trace_data import Trace
from dynheads_tl.tasks.common import mix_seed

# What makes two NIAH samples the same layout: the needle's depth and the haystack window (the seed changes only
# the UUID). HotpotQA samples are one question each (a file's records recur across seeds).
NIAH_LAYOUT_KEYS = ("haystack", "context_tokens", "depth", "haystack_offset")


def layout_groups(traces: Sequence[Trace]) -> np.ndarray:
    """One cluster label per trace (SCIENCE 10): NIAH traces with the same haystack, length, depth and haystack
    offset share a label whatever their UUID; HotpotQA traces of the same question (record id) and layout share
    one. A trace whose sample recipe is unknown (no ``meta``) is its own cluster."""
    labels = []
    for index, trace in enumerate(traces):
        meta = trace.meta or {}
        if trace.task == "niah" and "depth" in meta:
            labels.append("niah|" + "|".join(str(meta.get(key)) for key in NIAH_LAYOUT_KEYS))
        elif trace.task == "hotpot" and meta.get("id") is not None:
            labels.append(f"hotpot|{meta['id']}|{meta.get('context_tokens')}|{meta.get('depth')}")
        else:
            labels.append(f"sample|{index}")
    return np.array(labels)


def sample_depth(trace: Trace) -> float:
    """Where the evidence starts, as a fraction of the context (``actual_depth``; the requested depth, else 0)."""
    meta = trace.meta or {}
    value = meta.get("actual_depth", meta.get("depth"))
    return float(value) if value is not None else 0.0


# --- pairing -------------------------------------------------------------------------------------
def lagged_pairs(traces: Sequence[Trace], k: int, target: Literal["score", "eq1"] = "score"):
    """(hidden[n], target[n + k]) for every sample and every n with n + k inside the sample.

    Returns X [pairs, d_model], Y [pairs, layer*head] and the sample index of every pair.
    """
    xs, ys, groups = [], [], []
    for index, trace in enumerate(traces):
        n = trace.n_steps - k
        if n <= 0:
            continue
        values = trace.support_score if target == "score" else trace.retrieval_mask.float()
        xs.append(trace.hidden[:n].double().numpy())
        ys.append(values[k:k + n].flatten(1).double().numpy())
        groups.append(np.full(n, index))
    if not xs:
        raise ValueError(f"No sample is longer than k = {k} steps.")
    return np.concatenate(xs), np.concatenate(ys), np.concatenate(groups)


def split_by_sample(n_samples: int, fractions: Sequence[float], seed: int = 0) -> list[np.ndarray]:
    """Sample indices split by ``fractions`` (e.g. 0.7/0.2/0.1), so no sample is on two sides."""
    if abs(sum(fractions) - 1.0) > 1e-6:
        raise ValueError(f"Split fractions must sum to 1, got {list(fractions)}.")
    order = np.random.default_rng(seed).permutation(n_samples)
    cuts = np.round(np.cumsum(fractions)[:-1] * n_samples).astype(int)
    return [np.sort(part) for part in np.split(order, cuts)]


# --- CCA -----------------------------------------------------------------------------------------
class LinearCCA:
    """Canonical correlation analysis in closed form: whiten both sides with their training covariances,
    then the SVD of the whitened cross-covariance gives every canonical pair at once, ordered by their
    training correlation (the singular values). Exact, and fast enough to refit for every lag and split
    (scikit-learn's iterative CCA took ~15 s per fit here)."""

    def __init__(self, n_components: int, ridge: float = 1e-8):
        self.n_components, self.ridge = n_components, ridge

    @staticmethod
    def _inverse_sqrt(cov: np.ndarray, ridge: float) -> np.ndarray:
        values, vectors = np.linalg.eigh(cov + ridge * max(np.trace(cov) / len(cov), 1e-12) * np.eye(len(cov)))
        return vectors @ np.diag(1.0 / np.sqrt(np.clip(values, 1e-12, None))) @ vectors.T

    def fit(self, x: np.ndarray, y: np.ndarray) -> "LinearCCA":
        self.x_mean, self.y_mean = x.mean(0), y.mean(0)
        xc, yc = x - self.x_mean, y - self.y_mean
        n = len(x) - 1
        wx = self._inverse_sqrt(xc.T @ xc / n, self.ridge)
        wy = self._inverse_sqrt(yc.T @ yc / n, self.ridge)
        u, singular, vt = np.linalg.svd(wx @ (xc.T @ yc / n) @ wy)
        self.x_weights = wx @ u[:, : self.n_components]
        self.y_weights = wy @ vt.T[:, : self.n_components]
        self.correlations = singular[: self.n_components]
        return self

    def transform(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return (x - self.x_mean) @ self.x_weights, (y - self.y_mean) @ self.y_weights


@dataclass
class CCAFit:
    x_pca: PCA
    y_pca: PCA
    y_min: np.ndarray
    y_range: np.ndarray
    cca: LinearCCA
    n_components: int

    def transform(self, x: np.ndarray, y: np.ndarray):
        y_scaled = (y - self.y_min) / self.y_range
        return self.cca.transform(self.x_pca.transform(x), self.y_pca.transform(y_scaled))


def _canonical_correlations(u: np.ndarray, v: np.ndarray, *, signed: bool = False) -> np.ndarray:
    """Correlation of each pair of canonical variates (absolute unless ``signed``: on the fitting rows every
    pair correlates positively by construction; on held-out rows a negative value means the relation flipped)."""
    corr = []
    for i in range(u.shape[1]):
        a, b = u[:, i] - u[:, i].mean(), v[:, i] - v[:, i].mean()
        denom = np.sqrt((a * a).sum() * (b * b).sum())
        value = float((a * b).sum() / denom) if denom > 0 else 0.0
        corr.append(value if signed else abs(value))
    return np.array(corr)


def fit_cca(x: np.ndarray, y: np.ndarray, *, x_variance: float = 0.95, y_variance: float = 0.99,
            max_components: int = 50) -> CCAFit:
    """Min-max scale y, PCA both sides, CCA with as many components as the data supports (<= 50)."""
    y_min = y.min(0)
    y_range = np.where(y.max(0) - y_min > 0, y.max(0) - y_min, 1.0)
    y_scaled = (y - y_min) / y_range
    x_pca = PCA(n_components=x_variance, svd_solver="full").fit(x)
    y_pca = PCA(n_components=y_variance, svd_solver="full").fit(y_scaled)
    n = min(max_components, x_pca.n_components_, y_pca.n_components_, len(x) - 1)
    if n < 1:
        raise ValueError("Too few pairs or dimensions for CCA.")
    cca = LinearCCA(n).fit(x_pca.transform(x), y_pca.transform(y_scaled))
    return CCAFit(x_pca, y_pca, y_min, y_range, cca, n)


def cca_summary(correlations: np.ndarray) -> dict[str, float]:
    """``first``: the first canonical pair (the one the fit ranked first); ``leading``: the largest
    correlation of any pair (on held-out rows a later pair can beat the first); means of the first 10 / 50."""
    ordered = np.sort(correlations)[::-1]
    return {"first": float(correlations[0]), "leading": float(ordered[0]), "top10_mean": float(correlations[:10].mean()),
            "top50_mean": float(correlations[:50].mean()), "n_components": int(len(ordered))}


def cca_in_sample(x, y, **kwargs) -> dict[str, float]:
    fit = fit_cca(x, y, **kwargs)
    return cca_summary(_canonical_correlations(*fit.transform(x, y)))


def cca_held_out(x, y, groups, train_samples, test_samples, **kwargs) -> dict[str, float]:
    train, test = np.isin(groups, train_samples), np.isin(groups, test_samples)
    fit = fit_cca(x[train], y[train], **kwargs)
    return cca_summary(_canonical_correlations(*fit.transform(x[test], y[test]), signed=True))


def step_of(groups: np.ndarray) -> np.ndarray:
    """Each pair's step index inside its own sample (pairs of a sample are contiguous and in order)."""
    steps = np.zeros(len(groups), dtype=int)
    for g in np.unique(groups):
        rows = np.flatnonzero(groups == g)
        steps[rows] = np.arange(len(rows))
    return steps


def shuffle_across_samples(y: np.ndarray, groups: np.ndarray, seed: int = 0, *, same_step: bool = False,
                           clusters: np.ndarray | None = None) -> np.ndarray:
    """Each row gets the scores of a step of a *different* sample: a random step, or (``same_step``)
    the same step index, which keeps whatever depends on the position in the answer alone. ``groups``: each
    row's sample; ``clusters`` (one label per row, default the sample): the donor must come from another
    cluster, so a NIAH row is never paired with its own layout's sibling (nearly the same sample)."""
    rng = np.random.default_rng(seed)
    shuffled = np.empty_like(y)
    clusters = groups if clusters is None else np.asarray(clusters)
    if len(np.unique(clusters)) < 2:
        raise ValueError("The shuffled control needs at least two samples of different layouts.")
    steps = step_of(groups)
    for c in np.unique(clusters):
        other = clusters != c
        for row in np.flatnonzero(clusters == c):
            candidates = np.flatnonzero(other & (steps == steps[row])) if same_step else np.empty(0, dtype=int)
            if len(candidates) == 0:
                candidates = np.flatnonzero(other)
            shuffled[row] = y[rng.choice(candidates)]
    return shuffled


def layout_split(clusters: np.ndarray, seed: int, test_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(train samples, test samples) of one grouped split: each layout wholly on one side."""
    return grouped_splits(clusters, 1, test_fraction=test_fraction, seed=seed)[0]


def _split_sizes(clusters: np.ndarray, train: np.ndarray, test: np.ndarray) -> dict[str, int]:
    return {"train_samples": len(train), "train_clusters": len(set(clusters[train].tolist())),
            "test_samples": len(test), "test_clusters": len(set(clusters[test].tolist())),
            "n_samples": len(clusters), "n_clusters": len(set(clusters.tolist()))}


def cca_curve(traces: Sequence[Trace], ks: Sequence[int], split_seeds: Sequence[int] = (0,), *,
              held_out_fraction: float = 0.3, clusters: np.ndarray | None = None, **kwargs) -> pd.DataFrame:
    """Fig 4 / Fig 8 on every grouped split (one per seed in ``split_seeds``, layouts from :func:`layout_groups`
    unless ``clusters`` gives them): for each lag k, one row per (k, split, control) with the in-sample (training
    layouts), held-out and the two shuffled controls (both fitted on shuffled training pairs and scored on
    shuffled held-out pairs, donors from other layouts). :func:`over_splits` averages them."""
    clusters = layout_groups(traces) if clusters is None else np.asarray(clusters)
    rows = []
    for split_seed in split_seeds:
        train_s, test_s = layout_split(clusters, split_seed, held_out_fraction)
        sizes = _split_sizes(clusters, train_s, test_s)
        for k in ks:
            try:
                x, y, groups = lagged_pairs(traces, k)
            except ValueError:
                continue
            train, test = np.isin(groups, train_s), np.isin(groups, test_s)
            pair_clusters = clusters[groups]

            def shuffled(same_step: bool):
                part = lambda m, offset: shuffle_across_samples(y[m], groups[m], mix_seed(split_seed, k + offset, 1000),
                                                                same_step=same_step, clusters=pair_clusters[m])
                fit = fit_cca(x[train], part(train, 0), **kwargs)
                return cca_summary(_canonical_correlations(*fit.transform(x[test], part(test, 500)), signed=True))

            for control, summary in (
                ("in-sample", lambda: cca_in_sample(x[train], y[train], **kwargs)),
                ("held-out", lambda: cca_held_out(x, y, groups, train_s, test_s, **kwargs)),
                ("shuffled", lambda: shuffled(False)),
                ("shuffled, same step", lambda: shuffled(True)),
            ):
                try:
                    rows.append({"k": k, "split_seed": split_seed, "control": control, "pairs": len(x),
                                 "test_pairs": int(test.sum()), **sizes, **summary()})
                except ValueError:
                    continue
    return pd.DataFrame(rows)


def test_to_train_ratio(table: pd.DataFrame) -> float:
    """n_test / n_train in layouts (independent units), averaged over the splits of ``table``: the overlap
    correction of :func:`~dynheads_tl.analysis.statistics.resampled_t_interval`."""
    return float((table["test_clusters"] / table["train_clusters"]).mean())


def over_splits(table: pd.DataFrame, columns: Sequence[str] = ("first", "top10_mean", "top50_mean"),
                by: Sequence[str] = ("k", "control")) -> pd.DataFrame:
    """Per (k, control): the mean of each of ``columns`` over the splits with its corrected resampled 95%
    t-interval (``<column>_low`` / ``_high``), ``splits``, and what each split held: ``test_samples`` /
    ``test_clusters`` (mean per split) and ``n_samples`` / ``n_clusters`` (all of them)."""
    rows = []
    for key, part in table.groupby(list(by), sort=True):
        ratio = test_to_train_ratio(part)
        row = dict(zip(by, key if isinstance(key, tuple) else (key,)))
        for column in columns:
            if column not in part:
                continue
            interval = resampled_t_interval(part[column], ratio)
            row.update({column: interval.estimate, f"{column}_low": interval.low, f"{column}_high": interval.high})
        row.update({"splits": int(part["split_seed"].nunique()), "test_samples": float(part["test_samples"].mean()),
                    "test_clusters": float(part["test_clusters"].mean()),
                    "n_samples": int(part["n_samples"].iloc[0]), "n_clusters": int(part["n_clusters"].iloc[0])})
        if "pairs" in part:
            row["pairs"] = int(part["pairs"].iloc[0])
        if "first" in part and "leading" in part:
            row["leading"] = float(part["leading"].mean())
        rows.append(row)
    return pd.DataFrame(rows)


def paired_over_splits(table: pd.DataFrame, a: str, b: str, column: str = "first") -> pd.DataFrame:
    """Per k: control ``a`` minus control ``b`` on the same splits (mean, corrected resampled 95% interval and
    the two-sided corrected resampled t-test's p-value), for the verdicts' tests."""
    rows = []
    for k, part in table.groupby("k", sort=True):
        wide = part.pivot(index="split_seed", columns="control", values=column)
        if a not in wide or b not in wide:
            continue
        diff = (wide[a] - wide[b]).dropna()
        ratio = test_to_train_ratio(part)
        interval = resampled_t_interval(diff, ratio)
        rows.append({"k": int(k), "a": a, "b": b, "difference": interval.estimate, "low": interval.low,
                     "high": interval.high, "p": resampled_t_test(diff, ratio), "splits": interval.n})
    return pd.DataFrame(rows)


# --- probes --------------------------------------------------------------------------------------
@dataclass
class ProbeConfig:
    """MLP probe settings. ``paper()`` is the paper's recipe; the default fits a CPU."""

    hidden: list[int] = field(default_factory=lambda: [256])
    dropout: float = 0.1
    epochs: int = 60
    batch_size: int = 128
    lr: float = 3e-4
    patience: int = 3
    grad_clip: float = 1.0
    asl_gamma_neg: float = 4.0
    asl_gamma_pos: float = 1.0
    asl_clip: float = 0.05
    seed: int = 0

    @classmethod
    def paper(cls) -> "ProbeConfig":
        return cls(hidden=[8192, 4096, 4096], dropout=0.1, epochs=100, batch_size=128, lr=3e-4, patience=3)


def asymmetric_loss(logits: torch.Tensor, targets: torch.Tensor, gamma_neg: float = 4.0, gamma_pos: float = 1.0,
                    clip: float = 0.05, eps: float = 1e-8) -> torch.Tensor:
    """Asymmetric Loss (Ridnik et al. 2021) for multi-label classification with rare positives."""
    p = torch.sigmoid(logits)
    p_neg = (p - clip).clamp(min=0) if clip > 0 else p
    loss_pos = targets * (1 - p) ** gamma_pos * torch.log(p.clamp(min=eps))
    loss_neg = (1 - targets) * p_neg ** gamma_neg * torch.log((1 - p_neg).clamp(min=eps))
    return -(loss_pos + loss_neg).sum(1).mean()


def _mlp(d_in: int, d_out: int, hidden: list[int], dropout: float) -> torch.nn.Module:
    layers, width = [], d_in
    for h in hidden:
        layers += [torch.nn.Linear(width, h), torch.nn.GELU(), torch.nn.Dropout(dropout)]
        width = h
    layers.append(torch.nn.Linear(width, d_out))
    return torch.nn.Sequential(*layers)


def train_probe(x_train, y_train, x_val, y_val, *, task: Literal["classification", "regression"],
                config: ProbeConfig, linear: bool = False) -> torch.nn.Module:
    """Train an MLP (or a linear map) with Adam, ReduceLROnPlateau on the validation loss, grad clipping;
    keep the weights with the best validation loss."""
    torch.manual_seed(config.seed)
    xt, yt = torch.as_tensor(x_train, dtype=torch.float32), torch.as_tensor(y_train, dtype=torch.float32)
    xv, yv = torch.as_tensor(x_val, dtype=torch.float32), torch.as_tensor(y_val, dtype=torch.float32)
    mean, std = xt.mean(0), xt.std(0).clamp(min=1e-6)
    net = _mlp(xt.shape[1], yt.shape[1], [] if linear else config.hidden, config.dropout)
    model = torch.nn.Sequential(_Standardize(mean, std), net)
    if task == "classification":
        loss_fn = lambda out, y: asymmetric_loss(out, y, config.asl_gamma_neg, config.asl_gamma_pos, config.asl_clip)
    else:
        loss_fn = torch.nn.functional.mse_loss
    optimiser = torch.optim.Adam(model.parameters(), lr=config.lr)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimiser, patience=config.patience)
    generator = torch.Generator().manual_seed(config.seed)
    with torch.enable_grad():  # also when a caller has switched gradients off globally
        best_state = _fit(model, loss_fn, optimiser, scheduler, generator, xt, yt, xv, yv, config)
    model.load_state_dict(best_state)
    return model.eval()


def _fit(model, loss_fn, optimiser, scheduler, generator, xt, yt, xv, yv, config) -> dict:
    """The training loop; returns the state dict with the best validation loss."""
    best, best_state = float("inf"), None
    for _ in range(config.epochs):
        model.train()
        for batch in torch.randperm(len(xt), generator=generator).split(config.batch_size):
            optimiser.zero_grad()
            loss = loss_fn(model(xt[batch]), yt[batch])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimiser.step()
        model.eval()
        with torch.no_grad():
            val = float(loss_fn(model(xv), yv)) if len(xv) else float(loss)
        scheduler.step(val)
        if val < best or best_state is None:
            best, best_state = val, {k: v.clone() for k, v in model.state_dict().items()}
    return best_state


class _Standardize(torch.nn.Module):
    def __init__(self, mean, std):
        super().__init__()
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)

    def forward(self, x):
        return (x - self.mean) / self.std


def ridge_probe(x_train, y_train, alpha: float = 1.0) -> torch.nn.Module:
    """The regression linear probe: closed-form ridge on standardised inputs (scikit-learn)."""
    from sklearn.linear_model import Ridge

    mean, std = x_train.mean(0), np.clip(x_train.std(0), 1e-6, None)
    ridge = Ridge(alpha=alpha).fit((x_train - mean) / std, y_train)
    linear = torch.nn.Linear(x_train.shape[1], y_train.shape[1])
    with torch.no_grad():
        linear.weight.copy_(torch.as_tensor(ridge.coef_, dtype=torch.float32))
        linear.bias.copy_(torch.as_tensor(ridge.intercept_, dtype=torch.float32))
    standardize = _Standardize(torch.as_tensor(mean, dtype=torch.float32), torch.as_tensor(std, dtype=torch.float32))
    return torch.nn.Sequential(standardize, linear).eval()


def best_f1_threshold(y_true: np.ndarray, scores: np.ndarray) -> float:
    """The decision threshold maximising micro F1 on the (validation) PR curve."""
    if y_true.sum() == 0:
        return 0.5
    precision, recall, thresholds = precision_recall_curve(y_true.ravel(), scores.ravel())
    f1 = 2 * precision * recall / np.clip(precision + recall, 1e-12, None)
    return float(thresholds[int(np.argmax(f1[:-1]))])


def classification_metrics(y_true, scores, threshold) -> dict[str, float]:
    pred = (scores >= threshold).astype(int)
    t, p = y_true.ravel().astype(int), pred.ravel()
    return {"f1": f1_score(t, p, zero_division=0), "precision": precision_score(t, p, zero_division=0),
            "recall": recall_score(t, p, zero_division=0),
            "auprc": average_precision_score(t, scores.ravel()) if t.any() else float("nan"),
            "threshold": threshold}


def regression_metrics(y_true, y_pred) -> dict[str, float]:
    return {"mse": mean_squared_error(y_true, y_pred), "mae": mean_absolute_error(y_true, y_pred),
            "r2": r2_score(y_true, y_pred, multioutput="variance_weighted")}


def step_rates(y_train: np.ndarray, train_steps: np.ndarray, *, fallback: np.ndarray):
    """A predictor that knows only the decoding step: each head's mean target at that step index on the
    training pairs (``fallback``, e.g. the overall base rate, for steps the training split never reached).
    Returns a function from step indices to [pairs, heads] predictions."""
    table = {int(t): y_train[train_steps == t].mean(0) for t in np.unique(train_steps)}

    def predict(steps: np.ndarray) -> np.ndarray:
        return np.stack([table.get(int(t), fallback) for t in steps]) if len(steps) else np.empty((0, len(fallback)))

    return predict


MIN_PROBE_TEST_SAMPLES = 20  # SCIENCE 12: a probe's test part holds at least this many samples where data allow
MAX_PROBE_TEST_FRACTION = 1 / 3  # ... but never more than a third of the layouts (training keeps the majority)


def probe_test_fraction(n_samples: int, min_test_samples: int = MIN_PROBE_TEST_SAMPLES,
                        test_fraction: float = 0.1) -> float:
    """The paper's 10% test share, raised to ``min_test_samples`` of ``n_samples`` and capped at
    :data:`MAX_PROBE_TEST_FRACTION`."""
    return min(max(test_fraction, min_test_samples / max(n_samples, 1)), MAX_PROBE_TEST_FRACTION)


def probe_splits(clusters: np.ndarray, split_seed: int, *, min_test_samples: int = MIN_PROBE_TEST_SAMPLES,
                 val_fraction: float = 0.2) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(train, validation, test) sample indices of one split by layout (``clusters``): the test layouts first
    (:func:`probe_test_fraction` of them), then ``val_fraction`` of all layouts from the rest for validation."""
    clusters = np.asarray(clusters)
    if len(set(clusters.tolist())) < 3:
        raise ValueError(f"A train/validation/test split by layout needs at least 3 layouts, got "
                         f"{len(set(clusters.tolist()))}.")
    test_fraction = probe_test_fraction(len(clusters), min_test_samples)
    rest, test = layout_split(clusters, split_seed, test_fraction)
    inner_train, inner_val = layout_split(clusters[rest], 7919 + split_seed, min(val_fraction / (1 - test_fraction), 0.5))
    return np.sort(rest[inner_train]), np.sort(rest[inner_val]), np.sort(test)


def probe_table(traces: Sequence[Trace], task: Literal["classification", "regression"], config: ProbeConfig,
                *, k: int = 0, split_seed: int = 0, linear_probe: bool = True, clusters: np.ndarray | None = None,
                min_test_samples: int = MIN_PROBE_TEST_SAMPLES) -> pd.DataFrame:
    """Table 2 (classification of Eq. 1) or Table 3 (regression of Eq. 2 scores) on one split by layout
    (:func:`probe_splits`): MLP probe, linear probe, the static-frequency prior and a step-aware prior (each
    head's rate at that decoding step: what the position in the answer alone predicts), all scored on the test
    layouts. The linear probe is a linear layer trained like the MLP (classification) or closed-form ridge
    regression (regression). Each row says how many samples and layouts the split's parts hold."""
    target = "eq1" if task == "classification" else "score"
    x, y, groups = lagged_pairs(traces, k, target)
    clusters = layout_groups(traces) if clusters is None else np.asarray(clusters)
    train_s, val_s, test_s = probe_splits(clusters, split_seed, min_test_samples=min_test_samples)
    parts = [np.isin(groups, s) for s in (train_s, val_s, test_s)]
    if not all(part.any() for part in parts):
        raise ValueError(f"At k = {k}, a split of split seed {split_seed} has no pairs (samples too short).")
    (xtr, ytr), (xva, yva), (xte, yte) = [(x[m], y[m]) for m in parts]
    rows = []
    predictors = {"MLP probe": train_probe(xtr, ytr, xva, yva, task=task, config=config)}
    if linear_probe and task == "classification":
        predictors["linear probe"] = train_probe(xtr, ytr, xva, yva, task=task, config=config, linear=True)
    elif linear_probe:
        predictors["linear probe"] = ridge_probe(xtr, ytr)
    base_rate = ytr.mean(0)
    steps = step_of(groups) + k  # the decoding step each target belongs to
    for name, model in predictors.items():
        with torch.no_grad():
            out = lambda data: model(torch.as_tensor(data, dtype=torch.float32))
            if task == "classification":
                val_scores, test_scores = torch.sigmoid(out(xva)).numpy(), torch.sigmoid(out(xte)).numpy()
            else:
                val_scores, test_scores = out(xva).numpy(), out(xte).numpy()
        rows.append((name, val_scores, test_scores))
    rows.append(("static-frequency prior", np.tile(base_rate, (len(xva), 1)), np.tile(base_rate, (len(xte), 1))))
    step_prior = step_rates(ytr, steps[parts[0]], fallback=base_rate)
    rows.append(("step-aware prior", step_prior(steps[parts[1]]), step_prior(steps[parts[2]])))
    table = []
    for name, val_scores, test_scores in rows:
        if task == "classification":
            metrics = classification_metrics(yte, test_scores, best_f1_threshold(yva, val_scores))
        else:
            metrics = regression_metrics(yte, test_scores)
        table.append({"predictor": name, **metrics, "train_pairs": len(xtr), "test_pairs": len(xte),
                      "test_positive_rate": float(yte.mean()), **_split_sizes(clusters, train_s, test_s),
                      "val_samples": len(val_s)})
    return pd.DataFrame(table)


# --- claim 3 beyond position: residualised CCA and probes k steps ahead ---------------------------
LEAD_KS = (0, 1, 2, 3, 5, 10)


def pair_covariates(traces: Sequence[Trace], k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For every pair of :func:`lagged_pairs` (same order): the step index n of the hidden state, the token
    that step reads (its input: the last prompt token at n = 0, else the token generated at n - 1), the
    token the target's step n + k reads (the same token when k = 0), and the sample's evidence depth
    (:func:`sample_depth`)."""
    steps, tokens, target_tokens, depths = [], [], [], []
    for trace in traces:
        n = trace.n_steps - k
        if n <= 0:
            continue
        inputs = torch.cat([trace.prompt_ids[-1:], trace.tokens[:-1]])
        steps.append(np.arange(n))
        tokens.append(inputs[:n].numpy())
        target_tokens.append(inputs[k:k + n].numpy())
        depths.append(np.full(n, sample_depth(trace)))
    if not steps:
        raise ValueError(f"No sample is longer than k = {k} steps.")
    return np.concatenate(steps), np.concatenate(tokens), np.concatenate(target_tokens), np.concatenate(depths)


DEPTH_DEGREE = 3  # the depth covariate: a cubic polynomial (held-out layouts have depths training never saw)


def depth_design(depths: np.ndarray, degree: int = DEPTH_DEGREE) -> np.ndarray:
    """Columns d, d², ..., d^degree of the evidence depth d (centred at 0.5), for the residualisation: a smooth
    function of depth, so that it applies to the held-out layouts' depths, which one-hot levels would not."""
    centred = np.asarray(depths, dtype=float) - 0.5
    return np.stack([centred ** power for power in range(1, degree + 1)], axis=1)


OTHER = -1  # the pooled level of tokens too rare in training to get their own column


def frequent_levels(values: np.ndarray, min_count: int) -> set[int]:
    levels, counts = np.unique(values, return_counts=True)
    return {int(v) for v, c in zip(levels, counts) if c >= min_count}


def covariate_design(columns: Sequence[np.ndarray], levels: Sequence[Sequence[int]]) -> np.ndarray:
    """One-hot blocks, one per covariate (``columns[i]`` over ``levels[i]``, e.g. the step index and tokens);
    a value outside its levels gets an all-zero block."""
    blocks = []
    for values, known in zip(columns, levels):
        index = {int(v): i for i, v in enumerate(sorted(known))}
        block = np.zeros((len(values), len(index)))
        for row, value in enumerate(values):
            if int(value) in index:
                block[row, index[int(value)]] = 1.0
        blocks.append(block)
    return np.concatenate(blocks, axis=1)


def residualise(train: np.ndarray, test: np.ndarray, design_train: np.ndarray, design_test: np.ndarray,
                *, alpha: float = 1e-3) -> tuple[np.ndarray, np.ndarray]:
    """What is left of ``train`` / ``test`` after a (nearly unpenalised) ridge regression on the covariates,
    fitted on the training rows only."""
    from sklearn.linear_model import Ridge

    ridge = Ridge(alpha=alpha).fit(design_train, train)
    return train - ridge.predict(design_train), test - ridge.predict(design_test)


def held_out_correlations(x_train, y_train, x_test, y_test, **kwargs) -> np.ndarray:
    """Per canonical pair, in the order CCA fitted them on the training rows, the *signed* correlation of the
    held-out rows' canonical variates (a pair whose relation flips sign on new samples counts as negative).
    Entry 0 is the held-out first canonical correlation."""
    fit = fit_cca(x_train, y_train, **kwargs)
    return _canonical_correlations(*fit.transform(x_test, y_test), signed=True)


def _first_and_top10(correlations: np.ndarray) -> dict[str, float]:
    return {"first": float(correlations[0]), "top10_mean": float(correlations[:10].mean())}


def residualised_cca(traces: Sequence[Trace], ks: Sequence[int], split_seeds: Sequence[int], *,
                     held_out_fraction: float = 0.3, min_token_count: int = 5, clusters: np.ndarray | None = None,
                     **kwargs) -> pd.DataFrame:
    """Held-out CCA between hidden[n] and scores[n + k], raw and after removing what position, depth and token
    identity explain, for each lag and grouped split (by layout, :func:`layout_groups` unless ``clusters``).
    One row per (k, split seed, control):

    - ``held-out``: CCA fitted on the training layouts, signed correlations of the held-out layouts;
    - ``held-out, residualised``: both sides first regressed, on the training layouts, on the step index,
      the token step n reads and the token step n + k reads (one-hot each) and the evidence depth (a cubic,
      :func:`depth_design`; :func:`residualise`); CCA on the residuals. Tokens seen fewer than
      ``min_token_count`` times in training are pooled into one level for the fit, and held-out rows whose
      tokens are not frequent training tokens are left out (their token effect could not be removed);
      ``test_rows_dropped`` says how many;
    - ``held-out, residualised, chance``: the same fit, scored on held-out residuals whose scores come from
      a held-out sample of another layout at the same step (the level of an unrelated pairing).
    Columns ``first`` (first canonical pair) and ``top10_mean`` (mean of the first 10 pairs)."""
    clusters = layout_groups(traces) if clusters is None else np.asarray(clusters)
    rows = []
    for k in ks:
        try:
            x, y, groups = lagged_pairs(traces, k)
        except ValueError:
            continue
        steps, tokens, target_tokens, depths = pair_covariates(traces, k)
        depth_columns = depth_design(depths)
        for split_seed in split_seeds:
            train_s, test_s = layout_split(clusters, split_seed, held_out_fraction)
            train, test = np.isin(groups, train_s), np.isin(groups, test_s)
            if train.sum() < 3:
                continue
            frequent = frequent_levels(tokens[train], min_token_count)
            frequent_target = frequent_levels(target_tokens[train], min_token_count)
            pool = lambda values, keep: np.array([v if int(v) in keep else OTHER for v in values])
            covered = test & np.isin(tokens, list(frequent)) & np.isin(target_tokens, list(frequent_target))
            if len(np.unique(groups[covered])) < 2:
                continue
            levels = [set(steps[train].tolist()), frequent | {OTHER}, frequent_target | {OTHER}]
            design = lambda rows: np.concatenate([covariate_design(
                [steps[rows], pool(tokens[rows], frequent), pool(target_tokens[rows], frequent_target)], levels),
                depth_columns[rows]], axis=1)
            d_train, d_test = design(train), design(covered)
            x_tr, x_te = residualise(x[train], x[covered], d_train, d_test)
            y_tr, y_te = residualise(y[train], y[covered], d_train, d_test)
            if len(np.unique(clusters[groups[covered]])) < 2:
                continue
            y_te_chance = shuffle_across_samples(y_te, groups[covered], seed=split_seed + k, same_step=True,
                                                 clusters=clusters[groups[covered]])
            base = {"k": k, "split_seed": split_seed, "train_pairs": int(train.sum()), "test_pairs": int(covered.sum()),
                    "test_rows_dropped": int(test.sum() - covered.sum()), **_split_sizes(clusters, train_s, test_s)}
            try:
                raw = held_out_correlations(x[train], y[train], x[covered], y[covered], **kwargs)
                fit = fit_cca(x_tr, y_tr, **kwargs)
            except ValueError:
                continue
            signed = lambda u_v: _canonical_correlations(*u_v, signed=True)
            rows.append({**base, "control": "held-out", **_first_and_top10(raw)})
            rows.append({**base, "control": "held-out, residualised", **_first_and_top10(signed(fit.transform(x_te, y_te)))})
            rows.append({**base, "control": "held-out, residualised, chance",
                         **_first_and_top10(signed(fit.transform(x_te, y_te_chance)))})
    return pd.DataFrame(rows)


def lead_probe_table(traces: Sequence[Trace], task: Literal["classification", "regression"], config: ProbeConfig,
                     ks: Sequence[int] = LEAD_KS, split_seeds: Sequence[int] = (0, 1, 2, 3, 4),
                     progress_desc: str | None = None, *, linear_ks: Sequence[int] = (),
                     min_test_samples: int = MIN_PROBE_TEST_SAMPLES) -> pd.DataFrame:
    """Probes from hidden[n] to the target at step n + k (Eq. 1 sets for classification, Eq. 2 scores for
    regression), for each k and each train/validation/test split by layout (:func:`probe_splits`). One row
    per (k, split seed, predictor) with F1 / precision / recall / AUPRC or MSE / MAE / R² on the test layouts;
    predictors are the MLP probe, the static-frequency prior (the base rate), the step-aware prior (each head's
    rate at step n + k) and, at the lags in ``linear_ks``, the linear probe (Tables 2 and 3 read k = 0)."""
    from dynheads_tl.progress import progress

    clusters = layout_groups(traces)
    jobs = [(k, s) for k in ks for s in split_seeds]
    rows = []
    for k, split_seed in (progress(jobs, desc=progress_desc) if progress_desc else jobs):
        try:
            table = probe_table(traces, task, ProbeConfig(**{**config.__dict__, "seed": split_seed}), k=k,
                                split_seed=split_seed, linear_probe=k in linear_ks, clusters=clusters,
                                min_test_samples=min_test_samples)
        except ValueError:
            continue
        for record in table.to_dict("records"):
            rows.append({"k": k, "split_seed": split_seed, **record})
    return pd.DataFrame(rows)


def lead_differences(table: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per k: the probe's ``metric`` minus the base rate's and minus the step-aware prior's on the same splits,
    each as a mean over the splits with the corrected resampled 95% t-interval and the two-sided p-value of the
    corrected resampled t-test (``<name>_p``; :func:`~dynheads_tl.analysis.statistics.resampled_t_interval`:
    the splits share layouts); ``splits`` counts the splits where the metric is defined (fewer than 2: NaN
    bounds, never a zero-width interval); ``test_samples`` / ``test_clusters`` per split (means) and
    ``n_samples`` / ``n_clusters`` in all."""
    out = []
    for k, part in table.groupby("k"):
        wide = part.pivot(index="split_seed", columns="predictor", values=metric)
        splits = part.drop_duplicates("split_seed")
        ratio = test_to_train_ratio(splits)
        valid = int(wide["MLP probe"].notna().sum())
        row = {"k": int(k), "metric": metric, "splits": valid,
               "probe": resampled_t_interval(wide["MLP probe"], ratio).estimate,
               "test_samples": float(splits["test_samples"].mean()), "test_clusters": float(splits["test_clusters"].mean()),
               "n_samples": int(splits["n_samples"].iloc[0]), "n_clusters": int(splits["n_clusters"].iloc[0])}
        for baseline, name in (("static-frequency prior", "vs_base_rate"), ("step-aware prior", "vs_step_prior")):
            difference = wide["MLP probe"] - wide[baseline]
            interval = resampled_t_interval(difference, ratio)
            row.update({name: interval.estimate, f"{name}_low": interval.low, f"{name}_high": interval.high,
                        f"{name}_p": resampled_t_test(difference, ratio)})
        out.append(row)
    return pd.DataFrame(out)


PROBE_METRICS = {"classification": ("f1", "precision", "recall", "auprc"), "regression": ("mse", "mae", "r2")}


def probe_summary(raw: pd.DataFrame, task: Literal["classification", "regression"], k: int = 0) -> pd.DataFrame:
    """Table 2 / Table 3: per predictor at lag ``k``, each metric's mean over the splits by layout with its
    corrected resampled 95% t-interval (``<metric>_low`` / ``_high``), the number of splits and what each
    split's test part held (``test_samples``, ``test_clusters``: means per split; ``n_samples``, ``n_clusters``:
    the whole set)."""
    part = raw[raw["k"] == k]
    if part.empty:
        return pd.DataFrame()
    ratio = test_to_train_ratio(part.drop_duplicates("split_seed"))
    rows = []
    for predictor in dict.fromkeys(part["predictor"]):
        rows_of = part[part["predictor"] == predictor]
        row = {"predictor": predictor}
        for metric in PROBE_METRICS[task]:
            interval = resampled_t_interval(rows_of[metric], ratio)
            row.update({metric: interval.estimate, f"{metric}_low": interval.low, f"{metric}_high": interval.high})
        row.update({"splits": int(rows_of["split_seed"].nunique()), "test_samples": float(rows_of["test_samples"].mean()),
                    "test_clusters": float(rows_of["test_clusters"].mean()), "n_samples": int(rows_of["n_samples"].iloc[0]),
                    "n_clusters": int(rows_of["n_clusters"].iloc[0])})
        rows.append(row)
    return pd.DataFrame(rows)


@dataclass
class SetProbe:
    """A ridge regression from the hidden state at step t - 1 to each head's Eq. 1 indicator at step t, fitted on
    training answers: the next step's heads ranked from what the model had before that step (notebook 05's probe
    gap, notebook 06's predicted retention). Standardised inputs, alpha 10, not tuned."""

    model: object

    @classmethod
    def fit(cls, traces: list[Trace], alpha: float = 10.0) -> "SetProbe | None":
        from sklearn.linear_model import Ridge
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        x = [t.hidden[:-1].numpy() for t in traces if t.n_steps > 1]
        y = [t.retrieval_mask[1:].flatten(1).float().numpy() for t in traces if t.n_steps > 1]
        if not x:
            return None
        return cls(make_pipeline(StandardScaler(), Ridge(alpha=alpha)).fit(np.concatenate(x), np.concatenate(y)))

    def scores(self, trace: Trace) -> np.ndarray:
        """[step - 1, layer * head] predicted scores for steps 1.."""
        return self.model.predict(trace.hidden[:-1].numpy())

    def predict(self, hidden: torch.Tensor) -> np.ndarray:
        """[layer * head] scores for the step after the one whose hidden state [d_model] is given."""
        return self.model.predict(hidden.float().cpu().numpy()[None])[0]


def predictor_differences(raw: pd.DataFrame, metric: str, k: int = 0, reference: str = "MLP probe") -> pd.DataFrame:
    """At lag ``k``: ``reference`` minus every other predictor on the same splits, in ``metric`` (mean, corrected
    resampled 95% interval, two-sided corrected resampled t-test ``p``), one row per other predictor; for lower-
    is-better metrics (MSE, MAE) the sign is as computed (reference minus other)."""
    part = raw[raw["k"] == k]
    if part.empty or reference not in set(part["predictor"]):
        return pd.DataFrame()
    wide = part.pivot(index="split_seed", columns="predictor", values=metric)
    ratio = test_to_train_ratio(part.drop_duplicates("split_seed"))
    rows = []
    for other in dict.fromkeys(part["predictor"]):
        if other == reference:
            continue
        difference = (wide[reference] - wide[other]).dropna()
        interval = resampled_t_interval(difference, ratio)
        rows.append({"k": k, "metric": metric, "a": reference, "b": other, "difference": interval.estimate,
                     "low": interval.low, "high": interval.high, "p": resampled_t_test(difference, ratio),
                     "splits": interval.n})
    return pd.DataFrame(rows)
