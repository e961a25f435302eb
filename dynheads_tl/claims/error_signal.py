"""Beyond the paper (notebook 05): retrieval-head behaviour as a signal that an answer is wrong.

If an answer is copied from the context through retrieval heads, the heads' behaviour while it is generated
should tell answers read from the context apart from answers the model made up. Published anchors (other
models and data, so for scale only): the Lookback Lens (a per-head ratio of attention on the context against
attention on the generated text, fed to a linear classifier) reaches AUROC 0.85-0.91 in-domain and 0.82-0.85
across tasks; ReDeEP (copying heads plus an FFN score) 0.75-0.82 on RAGTruth.

Everything here comes from ONE traced greedy generation per answer (``TraceConfig(signals=True)``: no second
pass). Per answer (means over its decoding steps):

- **dynamic-head features** (:data:`DYNAMIC_FEATURES`): the size of the Eq. 1 set D_t and the share of steps
  where it is non-empty; the evidence attention mass of the heads in D_t and of the static heads (top
  ``static_k`` by Eq. 1 rate on the training answers); the entropy of the active set (how the answer's Eq. 1
  hits spread over heads); the largest and the mean top-10 Eq. 2 share; and the gap between the set a probe
  predicts from the *previous* step's hidden state and the set that appears;
- **context-only dynamic-head features** (:data:`CONTEXT_FEATURES`): the dynamic-head features above use where
  the true evidence lies (Eq. 1's needle, Eq. 2's supporting facts), which a deployed detector does not know and
  which nearly decides the label (an answer copied from the evidence is right), so they are an upper bound. This
  group counts D_t over the whole context span (:func:`context_copy_mask`), with the heads' attention mass on
  the context and static heads ranked by that copy rate;
- **Lookback-Lens-style ratio** per head (:func:`lookback_ratios`): mean attention per context token over mean
  attention per context token plus mean attention per generated token. "Context" is the sample's context span
  (the haystack or the paragraphs), not the whole prompt as in the Lookback Lens;
- **logit baseline**: the kept tokens' mean and minimum log-probability and mean and maximum entropy;
- **answer-in-context string match** (:func:`context_match_share`, no training): the share of the answer's
  tokens in its longest run copied verbatim from the context. The NIAH label (the UUID reproduced exactly) is
  nearly this, so any detector must be read against it.

Each feature group feeds a standardised logistic regression (scikit-learn, L2, C = 1, not tuned). Answers are
split into folds stratified by (setting, label), with answers that share a sample seed (NIAH settings reuse the
same needles, depths and offsets, so a seed is a layout) kept in one fold (grouped folds, SCIENCE 10); static
heads and the probe are fitted on each fold's training answers only, and the training answers' own features are
cross-fitted (:func:`crossfit_features`). AUROC of the out-of-fold scores with a cluster bootstrap interval
(groups of answers resampled). A setting-only classifier measures how much of the pooled AUROC is knowing the
setting. Transfer trains on one setting and tests on another.

Tests (SCIENCE 11, :func:`comparison_table`): every paired comparison the verdict reads (:data:`COMPARISONS`,
pooled and within each setting) gets its cluster-bootstrap interval of the AUROC difference and an exact sign
test over the layouts: each layout's share of the AUROC (its answers' placement values, which sum to the AUROC)
under one detector against the other. Holm over the whole family, leaving out comparisons that cannot reach
0.05 (too few layouts differ, Tarone) and settings too easy or too hard to evaluate (fewer than
:data:`MIN_PER_CLASS` wrong or right answers, SCIENCE 12). The declared primary comparison (:data:`PRIMARY`):
pooled, the context-only dynamic-head features against the answer-in-context string match.

Labels: an answer is wrong when the UUID is not reproduced exactly (NIAH) or its token F1 is below 0.5
(HotpotQA format). Per-token labels are not defined here.
"""
from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from dynheads_tl.analysis.correlation import SetProbe
from dynheads_tl.analysis.statistics import Interval, format_interval, wilson_interval
from dynheads_tl.config import RunSettings, NotebookConfig, check_choice, check_ints
from dynheads_tl.corpus import SEED_OFFSETS, TraceSettings, collect_traces, layout_traces
from dynheads_tl.engine.tracing import Trace, TraceConfig
from dynheads_tl.tasks.metrics import niah_accuracy, token_f1

logger = logging.getLogger(__name__)

DYNAMIC_FEATURES = ("dt_size", "dt_active_share", "dt_evidence_mass", "static_evidence_mass", "active_set_entropy",
                    "eq2_max", "eq2_top10", "probe_gap")
# The same idea without knowing where the true evidence is (what a deployed detector has): D_t counted over the
# whole context span, heads' attention mass on the context, static heads ranked by that copy rate.
CONTEXT_FEATURES = ("ctx_dt_size", "ctx_dt_active_share", "ctx_dt_context_mass", "ctx_static_context_mass",
                    "ctx_active_set_entropy")
LOGIT_FEATURES = ("logprob_mean", "logprob_min", "entropy_mean", "entropy_max")
GROUPS = ("dynamic", "dynamic_ctx", "lookback", "logit", "dynamic+logit")
# Detectors that need no training: scored as they are, beside the classifiers.
UNTRAINED_GROUPS = ("string_match",)
# The pooled evaluation adds a classifier that knows only which setting an answer came from: settings differ in
# error rate, so any feature that recognises the setting scores above 0.5 on pooled answers.
POOLED_GROUPS = GROUPS + ("setting",)
GROUP_NAMES = {"dynamic": "Dynamic-head features (knowing the evidence)",
               "dynamic_ctx": "Dynamic-head features (context only)", "lookback": "Lookback ratio (per head)",
               "logit": "Logit (probability, entropy)", "dynamic+logit": "Dynamic-head + logit",
               "setting": "Setting only (one-hot)", "string_match": "Answer-in-context string match"}
# Every paired comparison the verdict reads: (a, b) = a's AUROC minus b's, pooled and within each setting.
COMPARISONS = (("dynamic", "lookback"), ("dynamic", "logit"), ("dynamic", "string_match"),
               ("dynamic_ctx", "lookback"), ("dynamic_ctx", "logit"), ("dynamic_ctx", "string_match"),
               ("dynamic+logit", "logit"))
PRIMARY = ("pooled", "dynamic_ctx", "string_match")  # claim 5's declared primary comparison (scope, a, b)
MIN_PER_CLASS = 10  # a setting with fewer wrong (or right) answers is too easy (too hard) to evaluate a detector
ALPHA = 0.05
ANCHORS = {"Lookback Lens (in-domain)": (0.85, 0.91), "Lookback Lens (across tasks)": (0.82, 0.85),
           "ReDeEP (RAGTruth, 7B-13B)": (0.75, 0.82)}


# --- features ----------------------------------------------------------------------------------------
def _require_signals(trace: Trace) -> None:
    if trace.evidence_mass is None or trace.token_logprob is None:
        raise ValueError("This trace was recorded without signals; trace with TraceConfig(signals=True).")


def lookback_ratios(trace: Trace) -> np.ndarray:
    """Per head [layer * head], the mean over steps 1.. of A_ctx / (A_ctx + A_new): A_ctx is the head's mean
    attention per context token, A_new its mean attention per generated token so far (step t reads t of them).
    Step 0 has no generated token and is left out; a one-step answer gives 1 (all context)."""
    _require_signals(trace)
    start, end = trace.meta["context_span"]  # recorded with the signals
    n_context = max(int(end) - int(start), 1)
    steps = torch.arange(trace.n_steps, dtype=torch.float32)
    ctx = trace.context_mass / n_context
    new = trace.generated_mass / steps.clamp_min(1)[:, None, None]
    ratio = ctx / (ctx + new).clamp_min(1e-12)
    if trace.n_steps < 2:
        return np.ones(trace.n_layers * trace.n_heads)
    return ratio[1:].mean(0).flatten().numpy().astype(float)


def context_copy_mask(trace: Trace) -> torch.Tensor:
    """Eq. 1 with the whole context span in place of the evidence: [step, layer, head] heads whose top-1 source
    lies in the context and holds the generated token. Needs no knowledge of where the answer is."""
    from dynheads_tl.engine.equations import eq1_mask

    ids = torch.cat([trace.prompt_ids, trace.tokens])
    start, end = trace.meta["context_span"]
    span = torch.zeros(len(ids), dtype=torch.bool)
    span[int(start): int(end)] = True
    return eq1_mask(trace.argmax_pos, ids, span, trace.tokens)


def context_match_share(trace: Trace) -> float:
    """The answer-in-context string match: the longest run of the answer's generated tokens that occurs verbatim
    (same token ids, contiguous) in the context span, as a share of the answer's tokens. 1: the whole answer is
    copied from the context; a garbled UUID keeps only its copied prefix. Needs no training and no knowledge of
    where the evidence lies."""
    start, end = trace.meta["context_span"]
    context = trace.prompt_ids[int(start): int(end)].numpy()
    answer = trace.tokens.numpy()
    if len(answer) == 0 or len(context) == 0:
        return 0.0
    run = np.zeros(len(context), dtype=int)  # run[j]: the copied run ending at answer token i and context token j
    best = 0
    for token in answer:
        previous = np.concatenate([[0], run[:-1]])
        run = np.where(context == token, previous + 1, 0)
        best = max(best, int(run.max()))
    return best / len(answer)


def _set_features(hits: torch.Tensor, mass: torch.Tensor, static: torch.Tensor) -> tuple[float, ...]:
    """(mean |set|, share of steps with a non-empty set, mean mass of the set's heads, mean mass of the static
    heads, entropy of the answer's hits over heads) for [step, heads] hits and masses."""
    sizes = hits.sum(1).float()
    active = sizes > 0
    set_mass = ((mass * hits).sum(1)[active] / sizes[active]).mean() if active.any() else torch.tensor(0.0)
    per_head = hits.sum(0).float()
    p = per_head[per_head > 0] / per_head.sum() if per_head.sum() > 0 else torch.ones(1)
    return (float(sizes.mean()), float(active.float().mean()), float(set_mass), float(mass[:, static].mean()),
            float(-(p * p.log()).sum()))


def static_heads(traces: list[Trace], k: int, context: bool = False) -> torch.Tensor:
    """Flat indices of the ``k`` heads with the highest Eq. 1 rate over every step of ``traces`` (``context``: of
    the context-copy rate, :func:`context_copy_mask`)."""
    hits = torch.cat([(context_copy_mask(t) if context else t.retrieval_mask).flatten(1).float() for t in traces])
    return torch.topk(hits.mean(0), min(k, hits.shape[1])).indices


def probe_gap(trace: Trace, probe: SetProbe | None) -> float:
    """Mean over steps t >= 1 with a non-empty D_t of 1 - |P_t ∩ D_t| / |D_t|, where P_t holds the |D_t| heads the
    probe ranks highest from the hidden state at t - 1 (size-matched, so a set's size does not enter). 1 when no
    such step exists (nothing to predict, counted as a full miss) or there is no probe."""
    if probe is None or trace.n_steps < 2:
        return 1.0
    actual = trace.retrieval_mask[1:].flatten(1).numpy()
    predicted = probe.scores(trace)
    gaps = []
    for row, scores in zip(actual, predicted):
        size = int(row.sum())
        if size == 0:
            continue
        top = np.argsort(-scores, kind="stable")[:size]
        gaps.append(1.0 - row[top].sum() / size)
    return float(np.mean(gaps)) if gaps else 1.0


def answer_features(trace: Trace, static: torch.Tensor, probe: SetProbe | None,
                    static_ctx: torch.Tensor | None = None) -> dict[str, float]:
    """The dynamic-head, context-only and logit features of one answer (module docstring); ``static`` and
    ``static_ctx``: flat head indices (the Eq. 1 and the context-copy static heads; the latter defaults to the
    former)."""
    _require_signals(trace)
    dynamic = _set_features(trace.retrieval_mask.flatten(1), trace.evidence_mass.flatten(1), static)
    context = _set_features(context_copy_mask(trace).flatten(1), trace.context_mass.flatten(1),
                            static if static_ctx is None else static_ctx)
    shares = trace.support_score.flatten(1)
    top10 = torch.topk(shares, min(10, shares.shape[1]), dim=1).values
    return {
        **dict(zip(("dt_size", "dt_active_share", "dt_evidence_mass", "static_evidence_mass", "active_set_entropy"),
                   dynamic)),
        **dict(zip(CONTEXT_FEATURES, context)),
        "eq2_max": float(shares.max(1).values.mean()),
        "eq2_top10": float(top10.mean()),
        "probe_gap": probe_gap(trace, probe),
        "logprob_mean": float(trace.token_logprob.mean()),
        "logprob_min": float(trace.token_logprob.min()),
        "entropy_mean": float(trace.token_entropy.mean()),
        "entropy_max": float(trace.token_entropy.max()),
    }


def feature_matrices(traces: list[Trace], fit_traces: list[Trace], static_k: int) -> dict[str, np.ndarray]:
    """Each group's [answer, feature] matrix for ``traces``, with static heads and the probe fitted on
    ``fit_traces`` only (the training answers)."""
    static = static_heads(fit_traces, static_k)
    static_ctx = static_heads(fit_traces, static_k, context=True)
    probe = SetProbe.fit(fit_traces)
    rows = [answer_features(t, static, probe, static_ctx) for t in traces]
    matrix = lambda names: np.array([[r[name] for name in names] for r in rows])
    dynamic, logit = matrix(DYNAMIC_FEATURES), matrix(LOGIT_FEATURES)
    return {"dynamic": dynamic, "dynamic_ctx": matrix(CONTEXT_FEATURES),
            "lookback": np.stack([lookback_ratios(t) for t in traces]), "logit": logit,
            "dynamic+logit": np.concatenate([dynamic, logit], axis=1)}


# --- evaluation -------------------------------------------------------------------------------------
def _classifier():
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=5000))


def fit_predict(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray) -> np.ndarray:
    """Probability of "wrong" for ``x_test`` from a logistic regression fitted on the training answers (a
    constant 0.5 when the training answers hold one class only)."""
    if len(set(y_train.tolist())) < 2:
        return np.full(len(x_test), 0.5)
    return _classifier().fit(x_train, y_train).predict_proba(x_test)[:, 1]


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


def crossfit_features(traces: list[Trace], static_k: int, *, n_inner: int = 5, seed: int = 0,
                      groups: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Training answers' features with the static heads and the probe fitted on the *other* inner folds, so that
    the classifier trains on features made as the test answers' are (fitted without them)."""
    from sklearn.model_selection import GroupKFold

    groups = np.arange(len(traces)) if groups is None else np.asarray(groups)
    k = min(n_inner, len(set(groups.tolist())))
    out: dict[str, np.ndarray] = {}
    for fit, held in GroupKFold(n_splits=k, shuffle=True, random_state=seed).split(np.zeros(len(traces)), groups=groups):
        x = feature_matrices([traces[i] for i in held], [traces[i] for i in fit], static_k)
        for group, matrix in x.items():
            out.setdefault(group, np.zeros((len(traces), matrix.shape[1])))[held] = matrix
    return out


def answer_groups(traces: list[Trace]) -> np.ndarray:
    """One id per answer such that answers sharing a sample seed (NIAH: the same needle, depth and haystack offset
    in another setting) share it."""
    return np.array([f"{t.task}:{t.meta.get('seed', i)}" for i, t in enumerate(traces)])


def out_of_fold_scores(traces: list[Trace], labels: np.ndarray, static_k: int, n_folds: int, seed: int,
                       settings: list[str] | None = None) -> dict[str, np.ndarray]:
    """Each group's out-of-fold probability of "wrong" per answer. Folds keep answers of one sample seed together
    and are stratified by (setting, label); static heads and probe are refitted inside every fold, and the
    training answers' features are cross-fitted (:func:`crossfit_features`). With ``settings``, the
    setting-only baseline (one-hot) is scored too."""
    groups = answer_groups(traces)
    names = np.array(settings if settings is not None else ["all"] * len(traces))
    strata = np.array([f"{n}|{int(y)}" for n, y in zip(names, labels)])
    onehot = (names[:, None] == np.array(sorted(set(names.tolist())))[None, :]).astype(float)
    wanted = POOLED_GROUPS if settings is not None else GROUPS
    scores = {group: np.zeros(len(traces)) for group in wanted}
    for train, test in folds(labels, n_folds, seed, groups=groups, strata=strata):
        fit = [traces[i] for i in train]
        x_train = crossfit_features(fit, static_k, seed=seed, groups=groups[train])
        x_test = feature_matrices([traces[i] for i in test], fit, static_k)
        x_train["setting"], x_test["setting"] = onehot[train], onehot[test]
        for group in wanted:
            scores[group][test] = fit_predict(x_train[group], labels[train], x_test[group])
    return {**scores, **untrained_scores(traces)}


def untrained_scores(traces: list[Trace]) -> dict[str, np.ndarray]:
    """The detectors without training (:data:`UNTRAINED_GROUPS`), as scores of "wrong" (higher = more likely)."""
    return {"string_match": np.array([1.0 - context_match_share(t) for t in traces])}


def auroc_intervals(labels: np.ndarray, scores: dict[str, np.ndarray], *, seed: int = 0, n_resamples: int = 2000,
                    reference: str = "dynamic", groups: np.ndarray | None = None) -> pd.DataFrame:
    """AUROC of every group with a percentile bootstrap interval, and its paired difference from ``reference``
    (the same resampled answers for both); ``dynamic+logit`` also gets its paired difference from ``logit``.
    With ``groups``, whole groups are resampled (a cluster bootstrap: answers sharing a sample seed move
    together). Resamples with one class only are skipped."""
    labels = np.asarray(labels)
    groups = np.arange(len(labels)) if groups is None else np.asarray(groups)
    unique, members = np.unique(groups, return_inverse=True)
    by_group = [np.flatnonzero(members == g) for g in range(len(unique))]
    rng = np.random.default_rng(seed)
    draws: dict[str, list[float]] = {group: [] for group in scores}
    for _ in range(n_resamples):
        index = np.concatenate([by_group[g] for g in rng.integers(0, len(unique), len(unique))])
        if not 0 < labels[index].sum() < len(index):
            continue
        for group, s in scores.items():
            draws[group].append(auroc(labels[index], s[index]))
    def paired(a: str, b: str, name: str) -> dict[str, float]:
        diff = np.array(draws[a]) - np.array(draws[b])
        return {name: auroc(labels, scores[a]) - auroc(labels, scores[b]), f"{name}_low": _q(diff, 0.025),
                f"{name}_high": _q(diff, 0.975)}

    rows = []
    for group, s in scores.items():
        values = np.array(draws[group])
        row = {"group": group, "method": GROUP_NAMES.get(group, group), "n": len(labels), "wrong": int(labels.sum()),
               "auroc": auroc(labels, s), "low": _q(values, 0.025), "high": _q(values, 0.975)}
        if reference in scores and group != reference:
            row.update(paired(reference, group, f"{reference}_minus"))
        if "dynamic_ctx" in scores and group in ("lookback", "logit"):
            row.update(paired("dynamic_ctx", group, "dynamic_ctx_minus"))
        if group == "dynamic+logit" and "logit" in scores:
            row.update(paired(group, "logit", "minus_logit"))
        rows.append(row)
    return pd.DataFrame(rows)


def _q(values: np.ndarray, q: float) -> float:
    return float(np.quantile(values, q)) if len(values) else float("nan")


def roc_points(labels: np.ndarray, scores: dict[str, np.ndarray]) -> pd.DataFrame:
    """The ROC curve of every group (false and true positive rates), for the figure."""
    from sklearn.metrics import roc_curve

    frames = []
    for group, s in scores.items():
        fpr, tpr, _ = roc_curve(labels, s)
        frames.append(pd.DataFrame({"group": group, "fpr": fpr, "tpr": tpr}))
    return pd.concat(frames, ignore_index=True)


def transfer_table(sets: dict[str, tuple[list[Trace], np.ndarray]], static_k: int, *, seed: int = 0,
                   n_resamples: int = 1000) -> pd.DataFrame:
    """AUROC of every group trained on all answers of one setting and tested on another's, with a bootstrap
    interval over the test answers; pairs whose test or training setting holds one class only are left out."""
    rows = []
    for train_name, (train_traces, train_labels) in sets.items():
        if len(set(train_labels.tolist())) < 2:
            continue
        # The training setting's cross-fitted features serve every test setting: computed once.
        x_train = crossfit_features(train_traces, static_k, seed=seed, groups=answer_groups(train_traces))
        for test_name, (test_traces, test_labels) in sets.items():
            if train_name == test_name or len(set(test_labels.tolist())) < 2:
                continue
            x_test = feature_matrices(test_traces, train_traces, static_k)
            scores = {**{g: fit_predict(x_train[g], train_labels, x_test[g]) for g in GROUPS},
                      **untrained_scores(test_traces)}
            table = auroc_intervals(test_labels, scores, seed=seed, n_resamples=n_resamples)
            rows.append(table.assign(train=train_name, test=test_name))
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()


def placement_contributions(labels: np.ndarray, scores: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each group's share of the AUROC: a wrong answer's placement value (the share of right answers it outscores,
    ties half) over 2 n_wrong, a right answer's (the share of wrong answers that outscore it) over 2 n_right,
    summed over the group's answers. The shares sum to the AUROC, so two detectors' shares, group by group, are
    the paired units of :func:`comparison_table`'s sign test. Returns (group labels, shares)."""
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


def comparison_table(labels: np.ndarray, scores: dict[str, np.ndarray], groups: np.ndarray,
                     settings: list[str] | None = None, *, seed: int = 0, n_resamples: int = 2000) -> pd.DataFrame:
    """Every comparison of :data:`COMPARISONS` pooled and within each setting (``settings``: one name per answer),
    one row each: the AUROC difference (a − b) with its cluster-bootstrap 95% interval (layouts resampled), the
    layouts whose AUROC share favours each side and the exact two-sided sign test over them
    (:func:`placement_contributions`, :func:`~dynheads_tl.analysis.statistics.paired_sign_test`), then Holm over
    the whole family (:func:`~dynheads_tl.analysis.statistics.mark_separated` with ``testable_only``: comparisons
    that cannot reach 0.05 leave it) with the scopes that have at least :data:`MIN_PER_CLASS` wrong and right
    answers; ``half_width`` and ``n_to_resolve`` (layouts that would resolve the observed difference) say what the
    design could detect; ``primary`` marks :data:`PRIMARY`."""
    from dynheads_tl.analysis.statistics import mark_separated, n_to_resolve, paired_sign_test

    labels, groups = np.asarray(labels), np.asarray(groups)
    names = np.array(settings if settings is not None else ["pooled"] * len(labels))
    scopes = [("pooled", np.ones(len(labels), dtype=bool))]
    if settings is not None and len(set(names.tolist())) > 1:
        scopes += [(name, names == name) for name in dict.fromkeys(names.tolist())]
    rows = []
    for scope, mask in scopes:
        y, g = labels[mask], groups[mask]
        if not 0 < y.sum() < len(y):
            continue
        pairs = [(a, b) for a, b in COMPARISONS if a in scores and b in scores]
        draws = _paired_draws(y, {k: v[mask] for k, v in scores.items()}, g, pairs, seed=seed, n_resamples=n_resamples)
        for a, b in pairs:
            _, share_a = placement_contributions(y, scores[a][mask], g)
            _, share_b = placement_contributions(y, scores[b][mask], g)
            test = paired_sign_test(share_a, share_b, seed=seed)
            diff = auroc(y, scores[a][mask]) - auroc(y, scores[b][mask])
            low, high = _q(draws[(a, b)], 0.025), _q(draws[(a, b)], 0.975)
            wrong, right = int(y.sum()), int(len(y) - y.sum())
            interval = Interval(diff, low, high, int(len(y)), len(share_a))
            rows.append({"scope": scope, "a": a, "b": b, "n": int(len(y)), "wrong": wrong, "right": right,
                         "clusters": len(share_a), "difference": diff, "low": low, "high": high,
                         "a_better": test.a_better, "b_better": test.b_better, "sign_p": test.sign_p,
                         "evaluable": wrong >= MIN_PER_CLASS and right >= MIN_PER_CLASS,
                         "half_width": interval.half_width, "n_to_resolve": n_to_resolve(interval)})
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    table = mark_separated(table, ALPHA, family=table["evaluable"].to_numpy(), testable_only=True)
    outside = ~table["evaluable"]
    table.loc[outside, "p_adjusted"] = float("nan")
    table.loc[outside, "separated"] = False
    table["primary"] = [(r.scope, r.a, r.b) == PRIMARY for r in table.itertuples()]
    return table


def _paired_draws(labels, scores, groups, pairs, *, seed: int, n_resamples: int) -> dict[tuple[str, str], np.ndarray]:
    """Cluster-bootstrap draws of each pair's AUROC difference (the same resampled layouts for both sides);
    resamples with one class only are skipped."""
    unique = list(dict.fromkeys(groups.tolist()))
    members = [np.flatnonzero(groups == g) for g in unique]
    rng = np.random.default_rng(seed)
    draws: dict[tuple[str, str], list[float]] = {pair: [] for pair in pairs}
    for _ in range(n_resamples):
        index = np.concatenate([members[j] for j in rng.integers(0, len(unique), len(unique))])
        if not 0 < labels[index].sum() < len(index):
            continue
        for a, b in pairs:
            draws[(a, b)].append(auroc(labels[index], scores[a][index]) - auroc(labels[index], scores[b][index]))
    return {pair: np.array(values) for pair, values in draws.items()}


def _fmt(estimate: float, low: float, high: float, signed: bool = False) -> str:
    return format_interval(estimate, low, high, 3, signed=signed)


def _p(value: float) -> str:
    """``= 0.012``, ``< 0.001`` or ``n/a`` (not tested), to follow "p_adj"."""
    return "n/a" if value != value else f"= {value:.3f}" if value >= 0.001 else "< 0.001"


def _compared(row) -> str:
    """One comparison in words: the verb, b's name and the numbers (interval, sign counts, adjusted p), and for a
    comparison that cannot be told apart what the design could detect."""
    name = GROUP_NAMES.get(row["b"], row["b"]).lower()
    numbers = (f"{_fmt(row['difference'], row['low'], row['high'], signed=True)}, layouts {int(row['a_better'])}:"
               f"{int(row['b_better'])}")
    if not row["evaluable"]:
        return f"are not tested against the {name} ({numbers}; too few wrong or right answers)"
    if not row["testable"]:
        return (f"cannot be tested against the {name} ({numbers}: too few layouts differ for a sign test to reach "
                f"{ALPHA})")
    if row["separated"]:
        verb = "beat" if row["difference"] > 0 else "fall below"
        return f"{verb} the {name} ({numbers}, p_adj {_p(row['p_adjusted'])})"
    need = f", about {int(row['n_to_resolve'])} layouts would resolve the observed one" if row["n_to_resolve"] else ""
    return (f"cannot be told apart from the {name} ({numbers}, p_adj {_p(row['p_adjusted'])}; the design could "
            f"detect differences of about ±{row['half_width']:.3f}{need})")


def difficulty_sentences(data: pd.DataFrame) -> list[str]:
    """Settings with fewer than :data:`MIN_PER_CLASS` wrong answers are too easy to evaluate a detector, those with
    fewer right ones too hard (SCIENCE 12): one computed sentence each."""
    lines = []
    for row in data.itertuples():
        right = int(row.n) - int(row.wrong)
        if row.wrong < MIN_PER_CLASS and right < MIN_PER_CLASS:
            lines.append(f"{row.setting} has {int(row.wrong)} wrong and {right} right answers (fewer than "
                         f"{MIN_PER_CLASS} of each): too small to evaluate an error detector on its own; its "
                         "within-setting comparisons are shown but not tested.")
        elif row.wrong < MIN_PER_CLASS:
            lines.append(f"{row.setting} has only {int(row.wrong)} wrong answers of {int(row.n)} (fewer than "
                         f"{MIN_PER_CLASS}): too easy to evaluate an error detector on its own; its within-setting "
                         "comparisons are shown but not tested.")
        elif right < MIN_PER_CLASS:
            lines.append(f"{row.setting} has only {right} right answers of {int(row.n)} (fewer than {MIN_PER_CLASS}): "
                         "too hard to evaluate an error detector on its own; its within-setting comparisons are shown "
                         "but not tested.")
    return lines


def verdict(table: pd.DataFrame, comparisons: pd.DataFrame, data: pd.DataFrame | None = None,
            per_setting: pd.DataFrame | None = None) -> str:
    """Computed sentences: every group's pooled AUROC with its interval (beside what knowing only the setting
    gives); which settings are too easy or too hard to evaluate (fewer than :data:`MIN_PER_CLASS` wrong or right
    answers); the declared primary comparison; then every comparison of ``comparisons``
    (:func:`comparison_table`) pooled and within each setting: "beat" / "fall below" only where the
    Holm-adjusted sign test is below 0.05 and the paired interval excludes 0, else "cannot be told apart" with
    the difference the design could detect, or "cannot be tested" where too few layouts differ."""
    t = table.set_index("group")
    ref = t.loc["dynamic"]
    lines = [f"On n = {int(ref['n'])} pooled answers ({int(ref['wrong'])} wrong), out-of-fold AUROC: "
             + "; ".join(f"{r['method']} {_fmt(r['auroc'], r['low'], r['high'])}" for _, r in t.iterrows()) + "."]
    lines.append("The first group uses where the true evidence lies (the needle, the supporting sentence), which a "
                 "deployed detector does not know: an answer copied from the evidence is nearly always right, so "
                 "that group is an upper bound, not a detector. The context-only group and the baselines use no "
                 "such knowledge; the answer-in-context string match is nearly the NIAH label itself.")
    if "setting" in t.index:
        lines.append("Settings differ in error rate, so pooled AUROC partly measures which setting an answer came "
                     "from; the setting-only classifier above is that part, and the within-setting numbers below "
                     "are free of it.")
    if data is not None:
        lines += difficulty_sentences(data)
    if comparisons.empty:
        lines.append("No comparison could be made (a scope with one class only).")
    else:
        testable = comparisons[comparisons["evaluable"] & comparisons["testable"]]
        lines.append(f"Tests: exact sign tests over layouts, Holm over the {len(testable)} testable comparisons of "
                     f"this verdict ({int((comparisons['evaluable'] & ~comparisons['testable']).sum())} untestable, "
                     f"{int((~comparisons['evaluable']).sum())} in scopes too easy or too hard, left out).")
        primary = comparisons[comparisons["primary"]]
        if len(primary):
            lines.append("Primary comparison (declared): pooled, the context-only dynamic-head features "
                         + _compared(primary.iloc[0]) + ".")
        variants = (("dynamic", "the dynamic-head features that know the evidence"),
                    ("dynamic_ctx", "the context-only dynamic-head features"))
        for scope, part in comparisons.groupby("scope", sort=False):
            where = "Pooled" if scope == "pooled" else f"Within {scope} (n = {int(part['n'].iloc[0])}, " \
                                                        f"{int(part['wrong'].iloc[0])} wrong)"
            if scope != "pooled" and per_setting is not None and len(per_setting):
                p = per_setting[per_setting["setting"] == scope].set_index("group")
                cells = ", ".join(f"{g} {_fmt(p.loc[g, 'auroc'], p.loc[g, 'low'], p.loc[g, 'high'])}"
                                  for g in ("dynamic", "dynamic_ctx", "lookback", "logit", "string_match") if g in p.index)
                where += f" [AUROC {cells}]"
            short = "Pooled" if scope == "pooled" else f"Within {scope}"
            for key, name in variants:
                rows = part[(part["a"] == key) & ~part["primary"]]
                if len(rows):
                    lines.append(f"{where}, {name} " + "; ".join(_compared(r) for _, r in rows.iterrows()) + ".")
                    where = short  # the scope's sizes and AUROCs are stated once
            added = part[part["a"] == "dynamic+logit"]
            if len(added):
                lines.append(f"{where}, the evidence-knowing features added to the logit features "
                             + _compared(added.iloc[0]).replace("the logit (probability, entropy)", "the logit features alone")
                             + ".")
    lines.append("For scale only (other models and data): " + "; ".join(
        f"{name} {low:.2f}-{high:.2f}" for name, (low, high) in ANCHORS.items()) + ".")
    return " ".join(lines)


# --- the notebook's pipeline ------------------------------------------------------------------------
@dataclass
class ErrorSignalConfig(TraceSettings, RunSettings, NotebookConfig):
    """Notebook 05's parameters. NIAH settings are ``"haystack:context_tokens"`` strings; each is traced as
    notebook 01's soft-dynamism settings are (random depth and haystack offset, ``n_setting_calibration`` +
    ``n_setting`` samples, both pooled here), so a setting that notebook 01 ran is read from its cache.
    ``n_hotpot``: HotpotQA-format answers of the headroom setting (0 leaves them out)."""

    model: str = "smollm2-135m-instruct"
    niah_settings: list[str] = field(default_factory=lambda: ["prose:1000", "filler:1000"])
    n_setting: int = 24
    n_setting_calibration: int = 8
    n_hotpot: int = 40
    hotpot_setting: str = "headroom"
    static_k: int = 20
    n_folds: int = 5
    seed: int = 0
    output_dir: str = "papers_figures"
    use_cache: bool = True

    def __post_init__(self):
        super().__post_init__()
        check_ints(self, ("n_setting", "n_setting_calibration", "static_k"))
        check_ints(self, ("n_hotpot", "seed"), minimum=0)
        check_ints(self, ("n_folds",), minimum=2)
        from dynheads_tl.tasks.hotpot import HOTPOT_SETTINGS

        check_choice(self, "hotpot_setting", list(HOTPOT_SETTINGS))
        if not isinstance(self.niah_settings, list) or not all(isinstance(s, str) for s in self.niah_settings):
            raise ValueError(f"Parameter 'niah_settings' must be a list of 'haystack:tokens' strings, got {self.niah_settings!r}.")
        if not self.niah_settings and self.n_hotpot == 0:
            raise ValueError("No data: give at least one NIAH setting or n_hotpot > 0.")
        names = [setting_name(spec) for spec in self.niah_settings]
        if len(set(names)) < len(names):
            raise ValueError(f"Parameter 'niah_settings' names a setting twice: {self.niah_settings!r}.")

    @staticmethod
    def parse_setting(spec: str) -> tuple[str, int]:
        haystack, sep, tokens = spec.rpartition(":")
        if not sep or not haystack or not tokens.isdigit() or int(tokens) < 16:
            raise ValueError(f"NIAH setting {spec!r} must read 'haystack:context_tokens' (e.g. 'prose:2000').")
        return haystack, int(tokens)

    def check_inputs(self) -> None:
        from dynheads_tl.config import model_context_window
        from dynheads_tl.tasks.haystacks import check_haystack

        window = model_context_window(self.model)
        for spec in self.niah_settings:
            haystack, tokens = self.parse_setting(spec)
            check_haystack(haystack)
            if tokens + 200 + self.max_new_tokens > window:
                raise ValueError(f"NIAH setting {spec!r} does not fit the model's context of {window} tokens.")


def setting_name(spec: str) -> str:
    haystack, tokens = ErrorSignalConfig.parse_setting(spec)
    return f"NIAH {haystack} {tokens}"


def gather(model, config: ErrorSignalConfig) -> dict[str, tuple[list[Trace], np.ndarray]]:
    """Per setting, its traces (with signals) and labels (1 = wrong)."""
    from dynheads_tl.tasks.hotpot import HOTPOT_SETTINGS

    sets = {}
    for spec in config.niah_settings:
        haystack, tokens = config.parse_setting(spec)
        calibration, analysis = layout_traces(model, config, haystack=haystack, context_tokens=tokens,
                                              n_calibration=config.n_setting_calibration, n_analysis=config.n_setting,
                                              seed=config.seed, use_cache=config.use_cache,
                                              batch_size=config.trace_batch_size)
        traces = calibration + analysis
        sets[setting_name(spec)] = (traces, np.array([1 - niah_accuracy(t.response, t.answers[0]) for t in traces]))
    if config.n_hotpot:
        setting = HOTPOT_SETTINGS[config.hotpot_setting]
        seed = SEED_OFFSETS["error_signal"] + config.seed
        samples = setting.samples(model.tokenizer, config.n_hotpot, seed, max_tokens=int(model.cfg.n_ctx))
        trace_config = TraceConfig(max_new_tokens=config.hotpot_max_new_tokens, sink_tokens=config.sink_tokens,
                                   local_window=config.local_window, signals=True)
        spec = dict(task="hotpot", split="error_signal", setting=config.hotpot_setting, n=config.n_hotpot, seed=seed)
        traces = collect_traces(model, samples, trace_config, spec, use_cache=config.use_cache,
                                batch_size=config.trace_batch_size, desc=f"HotpotQA {config.hotpot_setting} answers")
        sets[f"HotpotQA {config.hotpot_setting} (synthetic)"] = (
            traces, np.array([float(token_f1(t.response, t.answers[0]) < 0.5) for t in traces]))
    return sets


def data_table(sets: dict[str, tuple[list[Trace], np.ndarray]]) -> pd.DataFrame:
    """Per setting: answers, wrong answers and the error rate with a Wilson interval, the layouts (independent
    units) they hold, and whether the setting is too easy or too hard to evaluate a detector on
    (:data:`MIN_PER_CLASS`)."""
    rows = []
    for name, (traces, labels) in sets.items():
        rate: Interval = wilson_interval(int(labels.sum()), len(labels))
        wrong = int(labels.sum())
        rows.append({"setting": name, "n": len(labels), "wrong": wrong, "error_rate": rate.estimate,
                     "low": rate.low, "high": rate.high, "layouts": len(set(answer_groups(traces).tolist())),
                     "too_easy": wrong < MIN_PER_CLASS, "too_hard": len(labels) - wrong < MIN_PER_CLASS,
                     "mean_steps": float(np.mean([t.n_steps for t in traces]))})
    return pd.DataFrame(rows)


def pooled(sets: dict[str, tuple[list[Trace], np.ndarray]]) -> tuple[list[Trace], np.ndarray, list[str]]:
    traces = [t for ts, _ in sets.values() for t in ts]
    labels = np.concatenate([labels for _, labels in sets.values()])
    names = [name for name, (ts, _) in sets.items() for _ in ts]
    return traces, labels, names


def per_setting_table(labels: np.ndarray, scores: dict[str, np.ndarray], names: list[str], *,
                      seed: int = 0) -> pd.DataFrame:
    """The pooled cross-validation's out-of-fold AUROC within each setting (settings with both classes)."""
    names_arr, frames = np.array(names), []
    for name in dict.fromkeys(names):
        part = names_arr == name
        if 0 < labels[part].sum() < part.sum():
            frames.append(auroc_intervals(labels[part], {g: s[part] for g, s in scores.items() if g != "setting"},
                                          seed=seed, n_resamples=1000).assign(setting=name))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
