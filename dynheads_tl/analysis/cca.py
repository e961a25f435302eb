"""Claim 3's CCA (Fig 4 / Fig 8) and its residualised form: the hidden state of step n against every head's score at
step n + k, in-sample, held out by layout and against shuffled controls (:func:`cca_curve`), and with the step,
the tokens and the needle's depth regressed out of both sides first (:func:`residualised_cca`).

The method, its controls and why they are there: :mod:`dynheads_tl.analysis.correlation`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
from sklearn.decomposition import PCA

from dynheads_tl.analysis.layouts import (lagged_pairs, layout_groups, layout_split, pair_covariates, permutable_rows,
                                          permute_within_samples,
                                          shuffle_across_samples, split_sizes, test_to_train_ratio)
from dynheads_tl.analysis.statistics import resampled_t_interval, resampled_t_test
from dynheads_tl.engine.trace_data import Trace
from dynheads_tl.tasks.common import mix_seed

# The control that keeps each sample and permutes its steps (layouts.permute_within_samples): an exploratory
# secondary of Fig 4 / Fig 8 (preregistration.yaml, deviation of 2026-12-05); no status reads it.
WITHIN_SAMPLE = "permuted within sample"


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



def cca_curve(traces: Sequence[Trace], ks: Sequence[int], split_seeds: Sequence[int] = (0,), *,
              held_out_fraction: float = 0.3, clusters: np.ndarray | None = None, **kwargs) -> pd.DataFrame:
    """Fig 4 / Fig 8 on every grouped split (one per seed in ``split_seeds``, layouts from :func:`layout_groups`
    unless ``clusters`` gives them): for each lag k, one row per (k, split, control) with the in-sample (training
    layouts), held-out, the two shuffled controls (donors from other layouts) and the within-sample permutation
    (:data:`WITHIN_SAMPLE`: each sample's own steps in another order), each fitted on controlled training pairs and
    scored on controlled held-out pairs. :func:`over_splits` averages them."""
    clusters = layout_groups(traces) if clusters is None else np.asarray(clusters)
    rows = []
    for split_seed in split_seeds:
        train_s, test_s = layout_split(clusters, split_seed, held_out_fraction)
        sizes = split_sizes(clusters, train_s, test_s)
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

            def within():  # samples with a single pair at this lag keep their true pair: left out of this control
                movable = permutable_rows(groups)
                fit_rows, score_rows = train & movable, test & movable
                part = lambda m, offset: permute_within_samples(y[m], groups[m], mix_seed(split_seed, k + offset, 2000))
                fit = fit_cca(x[fit_rows], part(fit_rows, 0), **kwargs)
                summary = cca_summary(_canonical_correlations(*fit.transform(x[score_rows], part(score_rows, 500)),
                                                              signed=True))
                return {**summary, "left_out_pairs": int((~movable).sum())}

            for control, summary in (
                ("in-sample", lambda: cca_in_sample(x[train], y[train], **kwargs)),
                ("held-out", lambda: cca_held_out(x, y, groups, train_s, test_s, **kwargs)),
                ("shuffled", lambda: shuffled(False)),
                ("shuffled, same step", lambda: shuffled(True)),
                (WITHIN_SAMPLE, within),
            ):
                try:
                    rows.append({"k": k, "split_seed": split_seed, "control": control, "pairs": len(x),
                                 "test_pairs": int(test.sum()), **sizes, **summary()})
                except ValueError:
                    continue
    return pd.DataFrame(rows)



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


# The covariates each residualisation removes (besides the step index and the evidence depth): the tokens read at
# n and n + k, and (the default one) also the token generated at n + k.
RESIDUALISED = "held-out, residualised"
READ_TOKENS_ONLY = "held-out, residualised (tokens read only)"


def residualised_cca(traces: Sequence[Trace], ks: Sequence[int], split_seeds: Sequence[int], *,
                     held_out_fraction: float = 0.3, min_token_count: int = 5, clusters: np.ndarray | None = None,
                     **kwargs) -> pd.DataFrame:
    """Held-out CCA between hidden[n] and scores[n + k], raw and after removing what position, depth and token
    identity explain, for each lag and grouped split (by layout, :func:`layout_groups` unless ``clusters``).
    One row per (k, split seed, control):

    - ``held-out``: CCA fitted on the training layouts, signed correlations of the held-out layouts;
    - ``held-out, residualised``: both sides first regressed, on the training layouts, on the step index,
      the token step n reads, the token step n + k reads and the token generated at step n + k (one-hot each;
      Eq. 1 at step n + k is defined against that token, and h_n may encode it) and the evidence depth (a cubic,
      :func:`depth_design`; :func:`residualise`); CCA on the residuals. Tokens seen fewer than
      ``min_token_count`` times in training are pooled into one level for the fit, and held-out rows whose
      tokens are not frequent training tokens are left out (their token effect could not be removed);
      ``test_rows_dropped`` says how many;
    - ``held-out, residualised, chance``: the same fit, scored on held-out residuals whose scores come from
      a held-out sample of another layout at the same step (the level of an unrelated pairing);
    - ``held-out, residualised (tokens read only)`` and its ``, chance``: the same without the generated token
      among the covariates, on the same held-out rows, so that the two residualisations' gains over chance can
      be compared (:func:`generated_token_share`).
    Columns ``first`` (first canonical pair) and ``top10_mean`` (mean of the first 10 pairs)."""
    clusters = layout_groups(traces) if clusters is None else np.asarray(clusters)
    rows = []
    for k in ks:
        try:
            x, y, groups = lagged_pairs(traces, k)
        except ValueError:
            continue
        covariates = pair_covariates(traces, k)
        steps, depth_columns = covariates.steps, depth_design(covariates.depths)
        token_columns = (covariates.tokens, covariates.target_tokens, covariates.generated_tokens)
        for split_seed in split_seeds:
            train_s, test_s = layout_split(clusters, split_seed, held_out_fraction)
            train, test = np.isin(groups, train_s), np.isin(groups, test_s)
            if train.sum() < 3:
                continue
            frequent = [frequent_levels(values[train], min_token_count) for values in token_columns]
            pool = lambda values, keep: np.array([v if int(v) in keep else OTHER for v in values])
            covered = test.copy()
            for values, keep in zip(token_columns, frequent):
                covered &= np.isin(values, list(keep))
            if len(np.unique(groups[covered])) < 2 or len(np.unique(clusters[groups[covered]])) < 2:
                continue

            def design(rows: np.ndarray, n_tokens: int) -> np.ndarray:
                levels = [set(steps[train].tolist())] + [keep | {OTHER} for keep in frequent[:n_tokens]]
                columns = [steps[rows]] + [pool(values[rows], keep) for values, keep in
                                           zip(token_columns[:n_tokens], frequent[:n_tokens])]
                return np.concatenate([covariate_design(columns, levels), depth_columns[rows]], axis=1)

            base = {"k": k, "split_seed": split_seed, "train_pairs": int(train.sum()), "test_pairs": int(covered.sum()),
                    "test_rows_dropped": int(test.sum() - covered.sum()), **split_sizes(clusters, train_s, test_s)}
            try:
                raw = held_out_correlations(x[train], y[train], x[covered], y[covered], **kwargs)
            except ValueError:
                continue
            signed = lambda u_v: _canonical_correlations(*u_v, signed=True)
            found = [{**base, "control": "held-out", **_first_and_top10(raw)}]
            for name, n_tokens in ((RESIDUALISED, 3), (READ_TOKENS_ONLY, 2)):
                d_train, d_test = design(train, n_tokens), design(covered, n_tokens)
                x_tr, x_te = residualise(x[train], x[covered], d_train, d_test)
                y_tr, y_te = residualise(y[train], y[covered], d_train, d_test)
                y_te_chance = shuffle_across_samples(y_te, groups[covered], seed=split_seed + k, same_step=True,
                                                     clusters=clusters[groups[covered]])
                try:
                    fit = fit_cca(x_tr, y_tr, **kwargs)
                except ValueError:
                    found = []
                    break
                found.append({**base, "control": name, **_first_and_top10(signed(fit.transform(x_te, y_te)))})
                found.append({**base, "control": f"{name}, chance",
                              **_first_and_top10(signed(fit.transform(x_te, y_te_chance)))})
            rows += found
    return pd.DataFrame(rows)


def generated_token_share(table: pd.DataFrame, column: str = "first") -> pd.DataFrame:
    """How much of each lag's residualised gain the generated token explains, from :func:`residualised_cca`'s rows:
    per k, the gain over chance with the tokens read only (``gain_read_only``: residualised minus its chance
    pairing), the gain once the token generated at n + k is regressed out too (``gain_with_generated``), the part
    that goes (``removed``: their difference on the same splits, with the corrected resampled 95% interval and
    p-value over splits) and ``share_removed`` (removed / gain with the tokens read only; NaN when that gain is not
    above 0), with the splits they rest on."""
    columns = ["k", "gain_read_only", "gain_with_generated", "removed", "removed_low", "removed_high", "removed_p",
               "share_removed", "splits"]
    rows = []
    if table.empty or "k" not in table:  # nothing residualised (too few samples to fit): no lag to read
        return pd.DataFrame(columns=columns)
    for k, part in table.groupby("k", sort=True):
        wide = part.pivot(index="split_seed", columns="control", values=column)
        needed = [RESIDUALISED, f"{RESIDUALISED}, chance", READ_TOKENS_ONLY, f"{READ_TOKENS_ONLY}, chance"]
        if any(name not in wide for name in needed):
            continue
        wide = wide[needed].dropna()
        if wide.empty:
            continue
        read_only = wide[READ_TOKENS_ONLY] - wide[f"{READ_TOKENS_ONLY}, chance"]
        with_generated = wide[RESIDUALISED] - wide[f"{RESIDUALISED}, chance"]
        ratio = test_to_train_ratio(part.drop_duplicates("split_seed"))
        removed = resampled_t_interval(read_only - with_generated, ratio)
        gain = float(read_only.mean())
        rows.append({"k": int(k), "gain_read_only": gain, "gain_with_generated": float(with_generated.mean()),
                     "removed": removed.estimate, "removed_low": removed.low, "removed_high": removed.high,
                     "removed_p": resampled_t_test(read_only - with_generated, ratio),
                     "share_removed": removed.estimate / gain if gain > 0 else float("nan"), "splits": len(wide)})
    return pd.DataFrame(rows, columns=columns)
