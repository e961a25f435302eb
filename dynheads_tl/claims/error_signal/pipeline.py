"""Notebook 05's pipeline: the answers (NIAH settings shared with notebook 01's cache, HotpotQA-format questions),
out-of-fold detector scores with grouped folds, AUROC intervals, transfer across settings and the paired tests.
"""
from __future__ import annotations

import logging
import numpy as np
import pandas as pd
from sklearn.model_selection import GroupKFold

from dynheads_tl.analysis.classification import (auroc, bootstrap_aurocs, fit_predict, folds, paired_auroc_draws,
                                                 placement_contributions, quantile)
from dynheads_tl.analysis.statistics import Interval, mark_separated, n_to_resolve, paired_sign_test, wilson_interval
from dynheads_tl.claim import is_true
from dynheads_tl.corpus import collect_traces, layout_traces, parse_setting
from dynheads_tl.engine.tracing import Trace, TraceConfig
from dynheads_tl.tasks.hotpot import HOTPOT_SETTINGS
from dynheads_tl.tasks.hotpot_sources import source_key, split_records
from dynheads_tl.tasks.squad import build_squad_sample, draw_squad_questions, squad_wrong
from dynheads_tl.tasks.metrics import niah_accuracy, token_f1

from .config import (ALPHA, COMPARISONS, GROUP_NAMES, GROUPS, MIN_PER_CLASS, POOLED_GROUPS, PRIMARY, SEEDS,
                     SEPARATE_SETTINGS, SQUAD_SETTING, ErrorSignalConfig, hotpot_setting_name, setting_name)
from .features import context_match_share, feature_matrices

__all__ = [
    "crossfit_features", "answer_groups", "out_of_fold_scores", "untrained_scores", "auroc_intervals",
    "transfer_table", "comparison_table", "mark_primary", "gather", "data_table", "pooled", "pooled_sets",
    "per_setting_table", "separate_settings", "squad_questions", "squad_question_table",
]


logger = logging.getLogger(__name__)


# --- evaluation -------------------------------------------------------------------------------------
def crossfit_features(traces: list[Trace], static_k: int, *, n_inner: int = 5, seed: int = 0,
                      groups: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Training answers' features with the static heads and the probe fitted on the *other* inner folds, so that
    the classifier trains on features made as the test answers' are (fitted without them)."""
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
    setting-only baseline (one-hot) is scored too. With fewer than two right or two wrong answers nothing can be
    cross-validated: every trained group scores NaN (its AUROC is undefined, and the status reads no headroom),
    the untrained detectors are scored as always."""
    groups = answer_groups(traces)
    names = np.array(settings if settings is not None else ["all"] * len(traces))
    strata = np.array([f"{n}|{int(y)}" for n, y in zip(names, labels)])
    onehot = (names[:, None] == np.array(sorted(set(names.tolist())))[None, :]).astype(float)
    wanted = POOLED_GROUPS if settings is not None else GROUPS
    wrong = int(np.asarray(labels).sum())
    if min(wrong, len(labels) - wrong) < 2:
        logger.warning("%d wrong of %d answers: too few of one class to cross-validate; the trained detectors are "
                       "not scored.", wrong, len(labels))
        return {**{group: np.full(len(traces), np.nan) for group in wanted}, **untrained_scores(traces)}
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
    draws = bootstrap_aurocs(labels, scores, groups, seed=seed, n_resamples=n_resamples)

    def paired(a: str, b: str, name: str) -> dict[str, float]:
        diff = np.array(draws[a]) - np.array(draws[b])
        return {name: auroc(labels, scores[a]) - auroc(labels, scores[b]), f"{name}_low": quantile(diff, 0.025),
                f"{name}_high": quantile(diff, 0.975)}

    rows = []
    for group, s in scores.items():
        values = np.array(draws[group])
        row = {"group": group, "method": GROUP_NAMES.get(group, group), "n": len(labels), "wrong": int(labels.sum()),
               "auroc": auroc(labels, s), "low": quantile(values, 0.025), "high": quantile(values, 0.975)}
        if reference in scores and group != reference:
            row.update(paired(reference, group, f"{reference}_minus"))
        if "dynamic_ctx" in scores and group in ("lookback", "logit"):
            row.update(paired("dynamic_ctx", group, "dynamic_ctx_minus"))
        if group == "dynamic+logit" and "logit" in scores:
            row.update(paired(group, "logit", "minus_logit"))
        rows.append(row)
    return pd.DataFrame(rows)


def pooled_sets(sets: dict[str, tuple[list[Trace], np.ndarray]]) -> dict[str, tuple[list[Trace], np.ndarray]]:
    """``sets`` without :data:`SEPARATE_SETTINGS`."""
    return {name: value for name, value in sets.items() if name not in SEPARATE_SETTINGS}


def transfer_table(sets: dict[str, tuple[list[Trace], np.ndarray]], static_k: int, *, seed: int = 0,
                   n_resamples: int = 1000) -> pd.DataFrame:
    """AUROC of every group trained on all answers of one setting and tested on another's, with a bootstrap
    interval over the test answers; pairs whose test or training setting holds one class only are left out, and so
    are the settings kept out of the pooled answers (:data:`SEPARATE_SETTINGS`)."""
    sets = pooled_sets(sets)
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


def comparison_table(labels: np.ndarray, scores: dict[str, np.ndarray], groups: np.ndarray,
                     settings: list[str] | None = None, *, seed: int = 0, n_resamples: int = 2000,
                     scope_name: str = "pooled") -> pd.DataFrame:
    """Every comparison of :data:`COMPARISONS` pooled and within each setting (``settings``: one name per answer),
    one row each: the AUROC difference (a − b) with its cluster-bootstrap 95% interval (layouts resampled; 90%,
    ``tost_low``/``tost_high``, for TOST), the
    layouts whose AUROC share favours each side and the exact two-sided sign test over them
    (:func:`placement_contributions`, :func:`~dynheads_tl.analysis.statistics.paired_sign_test`); :data:`PRIMARY`
    is tested alone at :data:`ALPHA` (its ``p_adjusted`` is its own ``sign_p``), then Holm over the secondary
    family (:func:`~dynheads_tl.analysis.statistics.mark_separated` with ``testable_only``: comparisons
    that cannot reach 0.05 leave it) with the scopes that have at least :data:`MIN_PER_CLASS` wrong and right
    answers; ``half_width`` and ``n_to_resolve`` (layouts that would resolve the observed difference) say what the
    design could detect; ``primary`` marks :data:`PRIMARY`."""
    labels, groups = np.asarray(labels), np.asarray(groups)
    names = np.array(settings if settings is not None else ["pooled"] * len(labels))
    scopes = [(scope_name, np.ones(len(labels), dtype=bool))]
    if settings is not None and len(set(names.tolist())) > 1:
        scopes += [(name, names == name) for name in dict.fromkeys(names.tolist())]
    rows = []
    for scope, mask in scopes:
        y, g = labels[mask], groups[mask]
        both = bool(0 < y.sum() < len(y))
        pairs = [(a, b) for a, b in COMPARISONS if a in scores and b in scores]
        if not both and scope != scope_name:
            continue
        # the pooled scope keeps its rows (with their counts, for the headroom rule) when a class is missing or a
        # detector could not be trained; only scored pairs are tested
        scored = [(a, b) for a, b in pairs
                  if both and np.isfinite(scores[a][mask]).all() and np.isfinite(scores[b][mask]).all()]
        draws = paired_auroc_draws(y, {k: v[mask] for k, v in scores.items()}, g, scored, seed=seed,
                                   n_resamples=n_resamples)
        for a, b in pairs:
            if (a, b) not in scored:
                wrong, right = int(y.sum()), int(len(y) - y.sum())
                nan = float("nan")
                rows.append({"scope": scope, "a": a, "b": b, "n": int(len(y)), "wrong": wrong, "right": right,
                             "clusters": len(set(g.tolist())), "difference": nan, "low": nan, "high": nan,
                             "tost_low": nan, "tost_high": nan, "a_better": 0, "b_better": 0, "sign_p": nan,
                             "evaluable": False, "half_width": nan, "n_to_resolve": None})
                continue
            _, share_a = placement_contributions(y, scores[a][mask], g)
            _, share_b = placement_contributions(y, scores[b][mask], g)
            test = paired_sign_test(share_a, share_b, seed=seed)
            diff = auroc(y, scores[a][mask]) - auroc(y, scores[b][mask])
            low, high = quantile(draws[(a, b)], 0.025), quantile(draws[(a, b)], 0.975)
            wrong, right = int(y.sum()), int(len(y) - y.sum())
            interval = Interval(diff, low, high, int(len(y)), len(share_a))
            rows.append({"scope": scope, "a": a, "b": b, "n": int(len(y)), "wrong": wrong, "right": right,
                         "clusters": len(share_a), "difference": diff, "low": low, "high": high,
                         # the 90% interval TOST reads (both one-sided tests at 0.05; preregistration.yaml)
                         "tost_low": quantile(draws[(a, b)], 0.05), "tost_high": quantile(draws[(a, b)], 0.95),
                         "a_better": test.a_better, "b_better": test.b_better, "sign_p": test.sign_p,
                         "evaluable": wrong >= MIN_PER_CLASS and right >= MIN_PER_CLASS,
                         "half_width": interval.half_width, "n_to_resolve": n_to_resolve(interval)})
    return mark_primary(pd.DataFrame(rows))


def mark_primary(table: pd.DataFrame) -> pd.DataFrame:
    """``primary`` (:data:`PRIMARY`), ``p_adjusted`` and ``separated`` of a comparison table by the one convention:
    the primary tested alone at :data:`ALPHA`, the evaluable secondaries Holm-corrected among themselves (those that
    cannot reach 0.05 left out). Applied to a table read back from ``auroc_comparisons.csv`` it re-marks the rows
    under the declaration in the code (:data:`PRIMARY`), whatever primary the file was written under."""
    if table.empty:
        return table
    table = table.drop(columns=[c for c in ("primary", "p_adjusted", "separated") if c in table]).copy()
    table["evaluable"] = table["evaluable"].map(is_true)
    table["primary"] = [(r.scope, r.a, r.b) == PRIMARY for r in table.itertuples()]
    table = mark_separated(table, ALPHA, family=table["evaluable"].to_numpy(), testable_only=True,
                           primary=(table["primary"] & table["evaluable"]).to_numpy(dtype=bool))
    outside = ~table["evaluable"]
    table.loc[outside, "p_adjusted"] = float("nan")
    table.loc[outside, "separated"] = False
    return table


def gather(model, config: ErrorSignalConfig) -> dict[str, tuple[list[Trace], np.ndarray]]:
    """Per setting, its traces (with signals) and labels (1 = wrong)."""
    sets = {}
    for spec in config.niah_settings:
        haystack, tokens = parse_setting(spec)
        calibration, analysis = layout_traces(model, config, haystack=haystack, context_tokens=tokens,
                                              n_calibration=config.n_setting_calibration, n_analysis=config.n_setting,
                                              seed=config.seed, use_cache=config.use_cache,
                                              batch_size=config.trace_batch_size)
        traces = calibration + analysis
        sets[setting_name(spec)] = (traces, np.array([1 - niah_accuracy(t.response, t.answers[0]) for t in traces]))
    if config.n_hotpot:
        setting = HOTPOT_SETTINGS[config.hotpot_setting]
        seed = SEEDS["error_signal"] + config.seed
        records = split_records(config, "answers")  # a real source: the seed's block (config.hotpot_splits)
        samples = setting.samples(model.tokenizer, config.n_hotpot, seed, max_tokens=int(model.cfg.n_ctx),
                                  source_records=records)
        trace_config = TraceConfig(max_new_tokens=config.hotpot_max_new_tokens, sink_tokens=config.sink_tokens,
                                   local_window=config.local_window, signals=True)
        spec = dict(task="hotpot", split="error_signal", setting=config.hotpot_setting, n=config.n_hotpot, seed=seed,
                    **source_key(config.hotpot_source, samples))
        traces = collect_traces(model, samples, trace_config, spec, use_cache=config.use_cache,
                                batch_size=config.trace_batch_size, desc=f"HotpotQA {config.hotpot_setting} answers")
        sets[hotpot_setting_name(config.hotpot_setting, config.hotpot_source)] = (
            traces, np.array([float(token_f1(t.response, t.answers[0]) < 0.5) for t in traces]))
    if config.n_squad:
        samples = [build_squad_sample(model.tokenizer, question, max_new_tokens=config.hotpot_max_new_tokens,
                                      max_tokens=int(model.cfg.n_ctx)) for question in squad_questions(config)]
        trace_config = TraceConfig(max_new_tokens=config.hotpot_max_new_tokens, sink_tokens=config.sink_tokens,
                                   local_window=config.local_window, signals=True)
        spec = dict(task="squad", split="error_signal", n=config.n_squad, seed=SEEDS["squad"] + config.seed,
                    ids=[s.meta["id"] for s in samples])
        traces = collect_traces(model, samples, trace_config, spec, use_cache=config.use_cache,
                                batch_size=config.trace_batch_size, desc="SQuAD 2.0 answers")
        sets[SQUAD_SETTING] = (traces, np.array([float(squad_wrong(t.response, t.answers, t.meta["answerable"]))
                                                 for t in traces]))
    return sets


def squad_questions(config: ErrorSignalConfig) -> list:
    """The SQuAD 2.0 questions of the run (``n_squad`` of each kind, one of each per paragraph, seeded)."""
    return draw_squad_questions(config.n_squad, config.n_squad, SEEDS["squad"] + config.seed)


def squad_question_table(config: ErrorSignalConfig) -> pd.DataFrame:
    """The SQuAD 2.0 questions by ``id``: paragraph (file order) and whether answerable."""
    return pd.DataFrame([(q.paragraph, q.qid, q.answerable) for q in squad_questions(config)],
                        columns=["paragraph", "id", "answerable"])


def separate_settings(sets: dict[str, tuple[list[Trace], np.ndarray]], comparisons: pd.DataFrame,
                      config: ErrorSignalConfig) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each setting that stays out of the pooled answers (:data:`SEPARATE_SETTINGS`: SQuAD 2.0) analysed within
    itself: out-of-fold scores trained and tested on its own answers (folds and clusters by paragraph), its AUROCs,
    and the same comparisons as the pooled ones (scope: the setting's name), added to ``comparisons`` and re-marked
    (:func:`mark_primary`: the primary alone, Holm over every evaluable secondary, these included). Returns (the
    AUROC table, the comparisons). A setting with fewer than two right or two wrong answers cannot be
    cross-validated and adds nothing (its counts are in the answers table)."""
    tables, added = [], []
    for name in SEPARATE_SETTINGS:
        if name not in sets:
            continue
        traces, labels = sets[name]
        if min(labels.sum(), len(labels) - labels.sum()) < 2:
            logger.warning("%s: %d wrong of %d answers, too few of one class to cross-validate.", name,
                           int(labels.sum()), len(labels))
            continue
        groups = answer_groups(traces)
        scores = out_of_fold_scores(traces, labels, config.static_k, config.n_folds, config.seed)
        tables.append(auroc_intervals(labels, scores, seed=config.seed, groups=groups).assign(setting=name))
        added.append(comparison_table(labels, scores, groups, seed=config.seed, scope_name=name))
    if not added:
        return pd.DataFrame(), comparisons
    return pd.concat(tables, ignore_index=True), mark_primary(pd.concat([comparisons, *added], ignore_index=True))


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
    """The pooled answers the primary reads: every setting but :data:`SEPARATE_SETTINGS` (:func:`separate_settings`)."""
    sets = pooled_sets(sets)
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
