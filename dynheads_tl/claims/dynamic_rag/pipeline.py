"""The dynamic-RAG case study's pipeline (notebook 04): evaluation, calibration and training splits, the head probe
that predicts which heads retrieve next, the RIND threshold, Table 4 with intervals and the paired comparisons, on
answer F1 and on the teacher-forced gold-answer log-probability (a secondary measure).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from dynheads_tl.analysis.correlation import ProbeConfig, split_by_sample, train_probe
from dynheads_tl.analysis.scoring import static_eq2_scores
from dynheads_tl.analysis.head_probe import HeadProbe
from dynheads_tl.analysis.statistics import bootstrap_interval, mark_separated, n_to_resolve, paired_sign_test
from dynheads_tl.corpus import TraceSets, collect_traces, hotpot_traces
from dynheads_tl.engine.tracing import TraceConfig
from dynheads_tl.protocols.rag import STRATEGIES, calibrate_rind_threshold, run_units
from dynheads_tl.tasks.metrics import token_f1
from dynheads_tl.tasks.common import Sample
from dynheads_tl.tasks.hotpot_sources import split_records

from .config import SEEDS, RagStudyConfig

__all__ = [
    "COMPARISONS", "PRIMARY", "comparison_table", "teacher_forced_comparisons", "split_samples", "evaluation_samples",
    "training_traces", "train_head_probe", "HeadProbe", "answers_cache_key", "calibrate_rind",
]


def _recall_per_visible(rows: np.ndarray) -> float:
    """Mean evidence recall over the share of context opened (rows: [recall, visible tokens, context tokens]);
    1 is what opening random positions gives."""
    visible = rows[:, 1].sum() / rows[:, 2].sum()
    return float(rows[:, 0].mean() / visible) if visible > 0 else float("nan")


def _paired(rows: pd.DataFrame, a: str, b: str, column: str = "f1") -> pd.DataFrame | None:
    """Strategies a and b's ``column`` (answer F1, or the teacher-forced ``tf_logprob``) on the questions both have
    a value for (columns ``a``, ``b``, one row per question); None when either strategy is missing or they share no
    question."""
    if a not in set(rows["strategy"]) or b not in set(rows["strategy"]):
        return None
    side = lambda s: rows[rows["strategy"] == s].set_index("sample")[column].astype(float)
    joined = pd.concat([side(a).rename("a"), side(b).rename("b")], axis=1, join="inner").dropna()
    return joined if len(joined) else None


# Pairs the verdict compares on F1: the probe against each baseline, and the oracle against the static heads.
COMPARISONS = (("dynamic", "static"), ("dynamic", "dynamic_random"), ("dynamic", "fixed_random"),
               ("oracle", "static"), ("static", "dynamic_random"))


PRIMARY = ("dynamic", "static")  # the case study's declared primary comparison (the paper's Table 4 headline)


def tost_bounds(joined: pd.DataFrame, *, seed: int = 0, alpha: float = 0.05) -> tuple[float, float]:
    """The 1 - 2 ``alpha`` bootstrap interval (90% at alpha 0.05) of the paired differences ``a - b`` of
    :func:`_paired`'s table, which TOST reads (both one-sided tests at alpha, preregistration.yaml)."""
    interval = bootstrap_interval((joined["a"] - joined["b"]).to_numpy(float), confidence=1 - 2 * alpha, seed=seed)
    return interval.low, interval.high


def comparison_table(rows: pd.DataFrame, seed: int = 0, alpha: float = 0.05) -> pd.DataFrame:
    """Paired F1 differences (a − b) for the two bounds (full − none) and :data:`COMPARISONS`: the mean difference
    with a bootstrap 95% interval, how many questions differ and which way, and an exact two-sided sign test on
    the questions that differ: :data:`PRIMARY` tested alone at ``alpha`` (its ``p_adjusted`` is its own ``sign_p``),
    the secondaries Holm-adjusted over the other :data:`COMPARISONS` that can reach ``alpha`` (``testable``:
    a comparison with too few differing questions for any sign test to reach ``alpha`` leaves the family, Tarone;
    the bounds are tested on their own). ``separated``: the adjusted p-value is below ``alpha`` and the interval
    excludes 0 (with most questions tied, a bootstrap interval alone excludes 0 too easily: 4 wins and no loss in
    30 questions give [+0.03, +0.27] but a sign-test p of 0.125). ``half_width`` and ``n_to_resolve`` (questions
    that would resolve the observed difference) say what the design could detect; ``primary`` marks
    :data:`PRIMARY`."""
    out = []
    for a, b in (("full", "none"),) + COMPARISONS:
        joined = _paired(rows, a, b)
        if joined is None:
            continue
        test = paired_sign_test(joined["a"].to_numpy(), joined["b"].to_numpy(), seed=seed)
        diff = test.difference
        tost = tost_bounds(joined, seed=seed, alpha=alpha)
        out.append({"a": a, "b": b, "f1_difference": diff.estimate, "low": diff.low, "high": diff.high,
                    "tost_low": tost[0], "tost_high": tost[1], "n": diff.n,
                    "a_better": test.a_better, "b_better": test.b_better, "sign_p": test.sign_p,
                    "half_width": diff.half_width, "n_to_resolve": n_to_resolve(diff), "primary": (a, b) == PRIMARY})
    table = pd.DataFrame(out)
    return table if table.empty else mark_separated(table, alpha, family=table["a"] != "full", testable_only=True,
                                                    primary=table["primary"].to_numpy(dtype=bool))


def teacher_forced_comparisons(rows: pd.DataFrame, seed: int = 0, alpha: float = 0.05) -> pd.DataFrame:
    """The teacher-forced secondary (preregistration.yaml: "teacher-forced gold-answer log-probability under each
    strategy (nats/token)") as paired comparisons over questions, on ``rows``' ``tf_logprob`` (the mean log-probability
    of the gold answer's tokens with the strategy's context, :func:`~dynheads_tl.protocols.rag.run_strategies` with
    ``teacher_forced``): the bounds (full − none), tested alone, which say whether the context moves the gold answer's
    probability at all; then Dynamic (probe) minus each other strategy run, in Table 4's order, one secondary family
    Holm-adjusted among itself at ``alpha`` (the comparisons whose differing questions are too few for a sign test to
    reach ``alpha`` leave it, Tarone: ``testable`` False). Each row: the mean paired difference in nats/token with a
    bootstrap 95% interval over questions, how many questions favour each side, the exact two-sided sign test,
    ``p_adjusted``, ``separated`` (adjusted p below ``alpha`` and the interval away from 0), ``half_width`` and
    ``n_to_resolve``; ``family`` says "bounds" or "secondary". The declared primary (answer F1, Dynamic − Static,
    :func:`comparison_table`) is not in this family and is unaffected by it. Empty without ``tf_logprob``."""
    if "tf_logprob" not in rows:
        return pd.DataFrame()
    ran = [s for s in STRATEGIES if s in set(rows["strategy"])]
    pairs = [("full", "none")] + [("dynamic", b) for b in ran if b != "dynamic"]
    out = []
    for a, b in pairs:
        joined = _paired(rows, a, b, "tf_logprob")
        if joined is None:
            continue
        test = paired_sign_test(joined["a"].to_numpy(), joined["b"].to_numpy(), seed=seed)
        diff = test.difference
        out.append({"a": a, "b": b, "measure": "tf_logprob", "tf_logprob_difference": diff.estimate, "low": diff.low,
                    "high": diff.high, "n": diff.n, "a_better": test.a_better, "b_better": test.b_better,
                    "sign_p": test.sign_p, "half_width": diff.half_width, "n_to_resolve": n_to_resolve(diff),
                    "family": "bounds" if (a, b) == ("full", "none") else "secondary"})
    table = pd.DataFrame(out)
    return table if table.empty else mark_separated(table, alpha, family=table["family"] == "secondary",
                                                    testable_only=True)


def split_samples(model, config: RagStudyConfig, split: str, seed_index: int = 0) -> list[Sample]:
    """The questions of one split of the study's setting: ``"evaluation"`` (n_samples), ``"rind"``
    (n_rind_calibration, RIND's threshold) or ``"train"`` (n_hotpot_train per training seed, the headroom
    setting's probe and static heads). Synthetic questions draw from the split's seed offset; a file's records are
    taken in order: evaluation first (in the multi-hop setting after claim 1's splits, which train its probe:
    :meth:`RagStudyConfig.hotpot_splits`), then RIND calibration, then the headroom setting's training seeds'."""
    counts = {"evaluation": config.n_samples, "rind": config.n_rind_calibration, "train": config.n_hotpot_train}
    offsets = {"evaluation": SEEDS["rag_evaluation"], "rind": SEEDS["rag_calibration"],
               "train": SEEDS["rag_train"]}
    n = counts[split]
    seed = offsets[split] + (config.seed if split != "train" else config.train_seeds[seed_index])
    records = split_records(config, split, seed_index if split == "train" else 0)  # RagStudyConfig.hotpot_splits
    return config.setting.samples(model.tokenizer, n, seed, source_records=records, max_tokens=int(model.cfg.n_ctx))


def evaluation_samples(model, config: RagStudyConfig) -> list[Sample]:
    return split_samples(model, config, "evaluation")


def training_traces(model, config: RagStudyConfig) -> tuple[list, list]:
    """(calibration, all) HotpotQA traces the static heads and the probe learn from. The multi-hop setting reads
    claim 1's splits (its cached traces when notebook 01 ran with these sizes); the headroom setting traces its own
    training questions, the first half of each seed's as the calibration part."""
    if config.rag_setting == "multihop":
        claim1 = TraceSets(n_hotpot=config.n_hotpot_train, use_cache=config.use_cache, sink_tokens=config.sink_tokens,
                           trace_batch_size=config.trace_batch_size,
                           local_window=config.local_window, hotpot_source=config.hotpot_source,
                           hotpot_skip_incomplete=config.hotpot_skip_incomplete)
        calibration, traces = [], []
        for seed in config.train_seeds:
            cal, ana = hotpot_traces(model, claim1, seed)
            calibration += cal
            traces += cal + ana
        return calibration, traces
    trace_config = TraceConfig(max_new_tokens=config.max_new_tokens, sink_tokens=config.sink_tokens,
                               local_window=config.local_window)
    calibration, traces = [], []
    for index, seed in enumerate(config.train_seeds):
        samples = split_samples(model, config, "train", index)
        spec = dict(task="hotpot", split="rag_train", setting=config.rag_setting, n=len(samples),
                    source=config.hotpot_source, seed=SEEDS["rag_train"] + seed)
        done = collect_traces(model, samples, trace_config, spec, use_cache=config.use_cache,
                              batch_size=config.trace_batch_size,
                              desc=f"HotpotQA {config.rag_setting} training (seed {seed})")
        calibration += done[: max(len(done) // 2, 1)]
        traces += done
    return calibration, traces


def train_head_probe(model, config: RagStudyConfig):
    """Static Eq. 2 scores and a regression probe (hidden state -> per-head Eq. 2 score), both from the setting's
    training traces (:func:`training_traces`)."""
    calibration, traces = training_traces(model, config)
    static_scores = static_eq2_scores(calibration)
    train, val = split_by_sample(len(traces), [0.8, 0.2], config.seed)
    stack = lambda idx, attr: torch.cat([getattr(traces[i], attr).flatten(1) for i in idx]).numpy()
    probe_model = train_probe(stack(train, "hidden"), stack(train, "support_score"), stack(val, "hidden"),
                              stack(val, "support_score"), task="regression",
                              config=ProbeConfig(hidden=list(config.probe_hidden), epochs=config.probe_epochs, seed=config.seed))
    return static_scores, HeadProbe(probe_model, tuple(static_scores.shape))


def answers_cache_key(config: RagStudyConfig, split: str, probe: HeadProbe | None = None) -> dict | None:
    """The ``cache_key`` of :func:`~dynheads_tl.protocols.rag.run_units` for one split's answers (None when
    ``use_cache`` is off): the split, and the probe's digest when a probe answers."""
    if not config.use_cache:
        return None
    return {"claim": "rag_study", "split": split, **({} if probe is None else {"probe": probe.digest})}


def calibrate_rind(model, config: RagStudyConfig) -> tuple[float, pd.DataFrame]:
    """RIND's threshold: the parameter if set, else :func:`~dynheads_tl.protocols.rag.calibrate_rind_threshold`
    on the RIND calibration questions, each answered without retrieval (as every strategy answers before its
    first retrieval), labelled wrong when F1 < 0.5. Returns the threshold and the per-question table."""
    if config.rind_threshold is not None:
        return float(config.rind_threshold), pd.DataFrame()
    samples = split_samples(model, config, "rind")
    probe_config = config.rag_config(rind_threshold=float("inf"))  # never fires; every sentence's value is recorded
    results = run_units(model, [("none", index, sample) for index, sample in enumerate(samples)], probe_config,
                        desc="RIND calibration (no retrieval)", cache_key=answers_cache_key(config, "rind"))
    rows = []
    for index, (sample, result) in enumerate(zip(samples, results)):
        f1 = token_f1(result["response"], sample.answers[0])
        rows.append({"sample": index, "rind_max": max(result["rind_values"], default=0.0), "f1": f1, "wrong": f1 < 0.5,
                     "response": result["response"], "gold": sample.answers[0]})
    table = pd.DataFrame(rows)
    threshold = calibrate_rind_threshold(table["rind_max"].tolist(), table["wrong"].tolist())
    table.attrs["threshold"] = threshold
    return threshold, table
