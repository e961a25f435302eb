"""Binary classifiers and how well they rank: a standardised logistic regression, grouped and stratified folds,
AUROC (as the Mann-Whitney statistic), each group's share of the AUROC, cluster-bootstrap draws of AUROCs and of
their paired differences, and ROC points for figures.

Labels are 0/1 with 1 the class a score should rank high (notebook 05: a wrong answer); a *group* is a cluster of
items that are not independent (answers sharing a layout), which folds keep on one side and the bootstrap
resamples whole. Nothing here knows what the items are: the claims bring the features and the words.
"""
from __future__ import annotations

import warnings
from typing import Iterator

import numpy as np
import pandas as pd


def logistic_classifier():
    """A standardised logistic regression (scikit-learn, L2, C = 1, not tuned)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=5000))


def fit_predict(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray) -> np.ndarray:
    """Probability of "wrong" for ``x_test`` from a logistic regression fitted on the training answers (a
    constant 0.5 when the training answers hold one class only)."""
    if len(set(y_train.tolist())) < 2:
        return np.full(len(x_test), 0.5)
    return logistic_classifier().fit(x_train, y_train).predict_proba(x_test)[:, 1]


def auroc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (ties count half), as the Mann-Whitney statistic of the wrong answers' score
    ranks (equal to scikit-learn's ``roc_auc_score``, tested, without its per-call overhead in the bootstrap);
    NaN when only one class is present."""
    from scipy.stats import rankdata

    labels = np.asarray(labels).astype(bool)
    n_pos = int(labels.sum())
    n_neg = len(labels) - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = rankdata(np.asarray(scores, dtype=float))
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def folds(labels: np.ndarray, n_folds: int, seed: int, *, groups: np.ndarray | None = None,
          strata: np.ndarray | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train, test) index splits over answers, stratified by ``strata`` (default: the label) and keeping each
    group (answers that share a needle, depth and offset across settings) on one side; fewer folds when a class
    has fewer members."""
    from sklearn.model_selection import StratifiedGroupKFold

    smallest = int(min(labels.sum(), len(labels) - labels.sum()))
    if smallest < 2:
        raise ValueError(f"Cross-validation needs at least 2 right and 2 wrong answers; got {int(labels.sum())} "
                         f"wrong of {len(labels)}. Use settings where the model fails more often (or less).")
    groups = np.arange(len(labels)) if groups is None else np.asarray(groups)
    strata = labels if strata is None else np.asarray(strata)
    splitter = StratifiedGroupKFold(n_splits=min(n_folds, smallest, len(set(groups.tolist()))), shuffle=True,
                                    random_state=seed)
    with warnings.catch_warnings():
        # A (setting, label) stratum with fewer members than folds (3 wrong filler answers, say) is spread over
        # as many folds as it has members; scikit-learn warns, and the split is still valid.
        warnings.filterwarnings("ignore", message="The least populated class", category=UserWarning)
        return list(splitter.split(np.zeros(len(labels)), strata, groups))


def quantile(values: np.ndarray, q: float) -> float:
    """The ``q`` quantile of bootstrap draws; NaN when there are none (every resample had one class only)."""
    return float(np.quantile(values, q)) if len(values) else float("nan")


def cluster_resamples(labels: np.ndarray, members: list[np.ndarray], *, seed: int,
                      n_resamples: int) -> Iterator[np.ndarray]:
    """The item indices of each of ``n_resamples`` cluster-bootstrap resamples: as many clusters as ``members``
    holds (each cluster's item indices), drawn with replacement from a generator seeded with ``seed``. Resamples
    with one class only are drawn and skipped, so the draws after them do not depend on what is computed."""
    rng = np.random.default_rng(seed)
    for _ in range(n_resamples):
        index = np.concatenate([members[j] for j in rng.integers(0, len(members), len(members))])
        if not 0 < labels[index].sum() < len(index):
            continue
        yield index


def bootstrap_aurocs(labels: np.ndarray, scores: dict[str, np.ndarray], groups: np.ndarray, *, seed: int,
                     n_resamples: int) -> dict[str, list[float]]:
    """Cluster-bootstrap draws of every scorer's AUROC, the same resampled groups for all (groups in sorted order,
    as :func:`numpy.unique` gives them); resamples with one class only are skipped."""
    labels = np.asarray(labels)
    unique, inverse = np.unique(groups, return_inverse=True)
    members = [np.flatnonzero(inverse == g) for g in range(len(unique))]
    draws: dict[str, list[float]] = {name: [] for name in scores}
    for index in cluster_resamples(labels, members, seed=seed, n_resamples=n_resamples):
        for name, s in scores.items():
            draws[name].append(auroc(labels[index], s[index]))
    return draws


def paired_auroc_draws(labels: np.ndarray, scores: dict[str, np.ndarray], groups: np.ndarray,
                       pairs: list[tuple[str, str]], *, seed: int, n_resamples: int) -> dict[tuple[str, str], np.ndarray]:
    """Cluster-bootstrap draws of each pair's AUROC difference (a − b, the same resampled groups for both sides;
    groups in the order they first appear); resamples with one class only are skipped."""
    labels, groups = np.asarray(labels), np.asarray(groups)
    unique = list(dict.fromkeys(groups.tolist()))
    members = [np.flatnonzero(groups == g) for g in unique]
    draws: dict[tuple[str, str], list[float]] = {pair: [] for pair in pairs}
    for index in cluster_resamples(labels, members, seed=seed, n_resamples=n_resamples):
        for a, b in pairs:
            draws[(a, b)].append(auroc(labels[index], scores[a][index]) - auroc(labels[index], scores[b][index]))
    return {pair: np.array(values) for pair, values in draws.items()}


def placement_contributions(labels: np.ndarray, scores: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each group's share of the AUROC: a wrong answer's placement value (the share of right answers it outscores,
    ties half) over 2 n_wrong, a right answer's (the share of wrong answers that outscore it) over 2 n_right,
    summed over the group's answers. The shares sum to the AUROC, so two detectors' shares, group by group, are
    the paired units of a sign test between them. Returns (group labels, shares)."""
    labels, scores, groups = np.asarray(labels).astype(bool), np.asarray(scores, dtype=float), np.asarray(groups)
    wrong, right = scores[labels], scores[~labels]
    if len(wrong) == 0 or len(right) == 0:
        raise ValueError("Placement values need both right and wrong answers.")
    share = np.empty(len(scores))
    share[labels] = (((wrong[:, None] > right[None, :]) + 0.5 * (wrong[:, None] == right[None, :])).mean(1)
                     / (2 * len(wrong)))
    share[~labels] = (((wrong[None, :] > right[:, None]) + 0.5 * (wrong[None, :] == right[:, None])).mean(1)
                      / (2 * len(right)))
    unique = np.array(list(dict.fromkeys(groups.tolist())))
    return unique, np.array([share[groups == g].sum() for g in unique])


def roc_points(labels: np.ndarray, scores: dict[str, np.ndarray]) -> pd.DataFrame:
    """The ROC curve of every scorer (false and true positive rates), for a figure; one ``group`` per scorer. A
    scorer that scored nothing (NaN: too few of one class to train it) or labels of one class have no curve."""
    from sklearn.metrics import roc_curve

    frames = [pd.DataFrame(columns=["group", "fpr", "tpr"])]
    labels = np.asarray(labels).astype(bool)
    if labels.all() or not labels.any():
        return frames[0]
    for group, s in scores.items():
        if not np.isfinite(np.asarray(s, dtype=float)).all():
            continue
        fpr, tpr, _ = roc_curve(labels, s)
        frames.append(pd.DataFrame({"group": group, "fpr": fpr, "tpr": tpr}))
    return pd.concat(frames, ignore_index=True)
