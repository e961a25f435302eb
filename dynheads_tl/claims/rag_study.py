"""Case study notebook (Table 4): dynamic in-context RAG guided by predicted retrieval heads.

The RAG loop itself (visibility masks, the RIND trigger, retrieval, retraction, head strategies) is the
protocol :mod:`dynheads_tl.protocols.rag`; this module is the notebook's config, the probe and static scores
it trains on claim 1's HotpotQA splits (:mod:`dynheads_tl.corpus`), its evaluation questions and Table 4.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields

import numpy as np
import pandas as pd
import torch

from dynheads_tl.analysis.statistics import (bootstrap_interval, format_interval, mark_separated,
                                             n_to_resolve, paired_sign_test, wilson_interval)
from dynheads_tl.config import RunSettings, NotebookConfig, ProbeSettings, check_choice, check_int_list, check_ints
from dynheads_tl.corpus import SEED_OFFSETS, TraceSets, collect_traces, hotpot_traces
from dynheads_tl.engine.tracing import TraceConfig
from dynheads_tl.protocols.rag import STRATEGIES, RagConfig, calibrate_rind_threshold, run_units
from dynheads_tl.tasks.hotpot import HOTPOT_SETTINGS, HotpotSetting
from dynheads_tl.tasks.metrics import token_f1
from dynheads_tl.tasks.common import Sample

logger = logging.getLogger(__name__)

PAPER_TABLE4 = {
    "Llama-3.1-8B-Instruct": {"dynamic": (0.456, 0.5586), "static": (0.398, 0.5098), "dynamic_random": (0.272, 0.3670),
                              "fixed_random": (0.272, 0.3763), "none": (0.252, 0.3257)},
    "Llama-3.2-3B-Instruct": {"dynamic": (0.384, 0.4993), "static": (0.428, 0.5386)},
}


STRATEGY_NAMES = {"dynamic": "Dynamic (probe)", "oracle": "Oracle (actual heads)", "static": "Static",
                  "dynamic_random": "Dynamic Random", "fixed_random": "Fixed Random", "none": "w/o RAG",
                  "full": "Full context (upper bound)"}


def _recall_per_visible(rows: np.ndarray) -> float:
    """Mean evidence recall over the share of context opened (rows: [recall, visible tokens, context tokens]);
    1 is what opening random positions gives."""
    visible = rows[:, 1].sum() / rows[:, 2].sum()
    return float(rows[:, 0].mean() / visible) if visible > 0 else float("nan")


def table4(rows: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Table 4 with n and 95% intervals: EM (Wilson), F1 and evidence recall per visible share (bootstrap over
    questions), retrievals per answer, the share of context opened, and the paper's numbers beside ours."""
    records = []
    for strategy, part in rows.groupby("strategy", sort=False):
        n = len(part)
        em = wilson_interval(int(part["em"].sum()), n)
        f1 = bootstrap_interval(part["f1"].to_numpy(float), seed=seed)
        ratio = bootstrap_interval(part[["evidence_recall", "visible_context_tokens", "context_tokens"]].to_numpy(float),
                                   _recall_per_visible, seed=seed)
        records.append({"strategy": strategy, "method": STRATEGY_NAMES.get(strategy, strategy), "n": n,
                        "em": em.estimate, "em_low": em.low, "em_high": em.high,
                        "f1": f1.estimate, "f1_low": f1.low, "f1_high": f1.high,
                        "retrievals": float(part["retrievals"].mean()),
                        "visible_context_share": float(part["visible_context_tokens"].sum() / part["context_tokens"].sum()),
                        "evidence_recall": float(part["evidence_recall"].mean()),
                        "recall_per_visible": ratio.estimate, "recall_per_visible_low": ratio.low,
                        "recall_per_visible_high": ratio.high})
    summary = pd.DataFrame(records)
    for paper_model, values in PAPER_TABLE4.items():
        summary[f"paper EM/F1 {paper_model}"] = summary["strategy"].map(
            lambda s: f"{values[s][0]:.3f}/{values[s][1]:.4f}" if s in values else "–")
    return summary


def _paired_f1(rows: pd.DataFrame, a: str, b: str) -> pd.DataFrame | None:
    """Strategies a and b's F1 on the questions both answered (columns ``a``, ``b``, one row per question); None
    when either strategy is missing or they share no question."""
    if a not in set(rows["strategy"]) or b not in set(rows["strategy"]):
        return None
    side = lambda s: rows[rows["strategy"] == s].set_index("sample")["f1"].astype(float)
    joined = pd.concat([side(a).rename("a"), side(b).rename("b")], axis=1, join="inner").dropna()
    return joined if len(joined) else None


# Pairs the verdict compares on F1: the probe against each baseline, and the oracle against the static heads.
COMPARISONS = (("dynamic", "static"), ("dynamic", "dynamic_random"), ("dynamic", "fixed_random"),
               ("oracle", "static"), ("static", "dynamic_random"))
PRIMARY = ("dynamic", "static")  # the case study's declared primary comparison (the paper's Table 4 headline)


def comparison_table(rows: pd.DataFrame, seed: int = 0, alpha: float = 0.05) -> pd.DataFrame:
    """Paired F1 differences (a − b) for the two bounds (full − none) and :data:`COMPARISONS`: the mean difference
    with a bootstrap 95% interval, how many questions differ and which way, and an exact two-sided sign test on
    the questions that differ, Holm-adjusted over :data:`COMPARISONS` that can reach ``alpha`` (``testable``:
    a comparison with too few differing questions for any sign test to reach ``alpha`` leaves the family, Tarone;
    the bounds are tested on their own). ``separated``: the adjusted p-value is below ``alpha`` and the interval
    excludes 0 (with most questions tied, a bootstrap interval alone excludes 0 too easily: 4 wins and no loss in
    30 questions give [+0.03, +0.27] but a sign-test p of 0.125). ``half_width`` and ``n_to_resolve`` (questions
    that would resolve the observed difference) say what the design could detect; ``primary`` marks
    :data:`PRIMARY`."""
    out = []
    for a, b in (("full", "none"),) + COMPARISONS:
        joined = _paired_f1(rows, a, b)
        if joined is None:
            continue
        test = paired_sign_test(joined["a"].to_numpy(), joined["b"].to_numpy(), seed=seed)
        diff = test.difference
        out.append({"a": a, "b": b, "f1_difference": diff.estimate, "low": diff.low, "high": diff.high, "n": diff.n,
                    "a_better": test.a_better, "b_better": test.b_better, "sign_p": test.sign_p,
                    "half_width": diff.half_width, "n_to_resolve": n_to_resolve(diff), "primary": (a, b) == PRIMARY})
    table = pd.DataFrame(out)
    return table if table.empty else mark_separated(table, alpha, family=table["a"] != "full", testable_only=True)


def _fmt(estimate: float, low: float, high: float) -> str:
    return format_interval(estimate, low, high, 3)


def rag_verdict(table: pd.DataFrame, comparisons: pd.DataFrame) -> str:
    """The case study in computed sentences: the headroom between the bounds, what each strategy opens against
    chance, and which strategies differ on F1, the declared primary comparison (:data:`PRIMARY`) first. A
    difference is claimed only where ``comparison_table`` marks it separated (Holm-adjusted sign test and bootstrap
    interval); a comparison that cannot be told apart says how large a difference the design could detect, one
    that cannot reach significance at all (too few differing questions) says so; and no strategy is ranked at all
    when the bounds leave no room (full context F1 below 0.5 or not separated from w/o RAG)."""
    t = table.set_index("strategy")
    lines, room = [], False
    if {"full", "none"} <= set(t.index):
        full, none = t.loc["full"], t.loc["none"]
        bound = comparisons[(comparisons["a"] == "full") & (comparisons["b"] == "none")]
        gap = ("" if bound.empty else
               f"; full − none {_fmt(*bound.iloc[0][['f1_difference', 'low', 'high']])}")
        room = not bound.empty and bool(bound.iloc[0]["separated"]) and float(full["f1"]) >= 0.5
        lines.append(f"Bounds: full context F1 {_fmt(full['f1'], full['f1_low'], full['f1_high'])}, w/o RAG "
                     f"{_fmt(none['f1'], none['f1_low'], none['f1_high'])} (n = {int(full['n'])}){gap}: this setting "
                     + ("leaves room for retrieval to help." if room else
                        "leaves little room for retrieval to help, so no strategy is ranked below."))
    opened = [s for s in ("dynamic", "oracle", "static", "dynamic_random", "fixed_random") if s in t.index]
    if opened:
        parts = []
        for s in opened:
            r = t.loc[s]
            parts.append(f"{r['method']} {_fmt(r['recall_per_visible'], r['recall_per_visible_low'], r['recall_per_visible_high'])}")
        lines.append("Evidence recall per share of context opened (chance = 1): " + "; ".join(parts) + ".")
    strategies = comparisons[comparisons["a"] != "full"] if len(comparisons) else comparisons
    if len(strategies) and "primary" in strategies:
        strategies = pd.concat([strategies[strategies["primary"]], strategies[~strategies["primary"]]])
    for row in strategies.itertuples():
        name_a, name_b = STRATEGY_NAMES.get(row.a, row.a), STRATEGY_NAMES.get(row.b, row.b)
        testable = bool(getattr(row, "testable", True))
        adjusted = f"Holm-adjusted {row.p_adjusted:.3f}" if testable else "untestable, left out of the Holm family"
        numbers = (f"F1 difference {_fmt(row.f1_difference, row.low, row.high)}, paired over n = {row.n}; "
                   f"{row.a_better} questions better, {row.b_better} worse, sign test p = {row.sign_p:.3f}, {adjusted}")
        lead = "Primary comparison (declared): " if getattr(row, "primary", False) else ""
        if not room:
            lines.append(f"{lead}{name_a} against {name_b}, for the record ({numbers}).")
        elif row.separated:
            lines.append(f"{lead}{name_a} {'beats' if row.f1_difference > 0 else 'falls below'} {name_b} ({numbers}).")
        elif not testable:
            lines.append(f"{lead}{name_a} and {name_b} cannot be tested: only {row.a_better + row.b_better} questions "
                         f"differ, too few for a sign test to reach 0.05 ({numbers}).")
        else:
            need = getattr(row, "n_to_resolve", None)
            need = f"; about {int(need)} questions would resolve the observed one" if need == need and need else ""
            lines.append(f"{lead}{name_a} and {name_b} cannot be told apart ({numbers}); the design could detect "
                         f"F1 differences of about ±{row.half_width:.3f}{need}.")
    return " ".join(lines)


# --- the notebook's pipeline ------------------------------------------------------------------------
@dataclass
class RagStudyConfig(RagConfig, ProbeSettings, RunSettings, NotebookConfig):
    """The case-study notebook's parameters: the RAG protocol's knobs (:class:`~dynheads_tl.protocols.rag.RagConfig`),
    the probe settings, and the study's own. ``rind_threshold=None`` (default) calibrates RIND's threshold on the
    setting's calibration questions (:func:`calibrate_rind`)."""

    model: str = "smollm2-135m-instruct"
    rag_setting: str = "headroom"
    n_samples: int = 30
    n_rind_calibration: int = 16
    hotpot_source: str = "synthetic"
    hotpot_skip_incomplete: bool = False
    strategies: list[str] = field(default_factory=lambda: list(STRATEGIES))
    train_seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    n_hotpot_train: int = 20
    trace_batch_size: int = 8
    output_dir: str = "papers_figures"
    use_cache: bool = True

    def __post_init__(self):
        super().__post_init__()
        check_ints(self, ("n_samples", "n_hotpot_train", "n_rind_calibration", "trace_batch_size"))
        check_int_list(self, "train_seeds")
        check_choice(self, "rag_setting", list(HOTPOT_SETTINGS))
        unknown = [s for s in self.strategies if s not in STRATEGIES] if isinstance(self.strategies, list) else [0]
        if unknown or not self.strategies:
            raise ValueError(f"Parameter 'strategies' must be a non-empty list drawn from {list(STRATEGIES)}, got {self.strategies!r}.")

    @property
    def setting(self) -> HotpotSetting:
        return HOTPOT_SETTINGS[self.rag_setting]

    def check_inputs(self) -> None:
        """The HotpotQA file (enough usable records for every split) and the model, before any model work."""
        from dynheads_tl.config import model_context_window
        from dynheads_tl.tasks import check_hotpot_source

        model_context_window(self.model)  # an unknown model fails here, not after the notebook started
        check_hotpot_source(self.hotpot_source, self.records_needed, skip_incomplete=self.hotpot_skip_incomplete,
                            needed_for=f"evaluation {self.n_samples} + RIND calibration {self.n_rind_calibration}"
                                       + (f" + probe training {len(self.train_seeds)} x {self.n_hotpot_train}"
                                          if self.rag_setting == "headroom" else ""))

    @property
    def file_offset(self) -> int:
        """Where a file's evaluation records start: after claim 1's HotpotQA splits in the multi-hop setting (its
        probe trains on records [0, n/2) and [n, 2n) with n = n_hotpot_train, see corpus._hotpot_records), at the
        first record in the headroom setting (whose training records come after evaluation and RIND's)."""
        return 2 * self.n_hotpot_train if self.rag_setting == "multihop" else 0

    @property
    def records_needed(self) -> int:
        training = len(self.train_seeds) * self.n_hotpot_train if self.rag_setting == "headroom" else 0
        return self.file_offset + self.n_samples + self.n_rind_calibration + training

    def rag_config(self, rind_threshold: float | None = None) -> RagConfig:
        """The protocol's part of these parameters, as a plain :class:`RagConfig` (``rind_threshold``: the
        calibrated value, where the parameter is None)."""
        values = {f.name: getattr(self, f.name) for f in fields(RagConfig)}
        if values["rind_threshold"] is None:
            if rind_threshold is None:
                raise ValueError("rind_threshold is None: calibrate it first (calibrate_rind) and pass the value.")
            values["rind_threshold"] = rind_threshold
        return RagConfig(**values)


def _file_records(config: RagStudyConfig) -> list | None:
    """A file's usable records (None for the synthetic generator), with a warning for skipped ones."""
    from dynheads_tl.tasks.hotpot import load_hotpot_records

    if config.hotpot_source == "synthetic":
        return None
    loaded = load_hotpot_records(config.hotpot_source, skip_incomplete=config.hotpot_skip_incomplete)
    if loaded.skipped:
        logger.warning("%d incomplete HotpotQA records of %s were skipped (hotpot_skip_incomplete=True).",
                       loaded.skipped, config.hotpot_source)
    return list(loaded)


def split_samples(model, config: RagStudyConfig, split: str, seed_index: int = 0) -> list[Sample]:
    """The questions of one split of the study's setting: ``"evaluation"`` (n_samples), ``"rind"``
    (n_rind_calibration, RIND's threshold) or ``"train"`` (n_hotpot_train per training seed, the headroom
    setting's probe and static heads). Synthetic questions draw from the split's seed offset; a file's records are
    taken in order: evaluation first (in the multi-hop setting after claim 1's splits, which train its probe:
    :attr:`RagStudyConfig.file_offset`), then RIND calibration, then the headroom setting's training seeds'."""
    counts = {"evaluation": config.n_samples, "rind": config.n_rind_calibration, "train": config.n_hotpot_train}
    offsets = {"evaluation": SEED_OFFSETS["rag_evaluation"], "rind": SEED_OFFSETS["rag_calibration"],
               "train": SEED_OFFSETS["rag_train"]}
    n = counts[split]
    seed = offsets[split] + (config.seed if split != "train" else config.train_seeds[seed_index])
    records = _file_records(config)
    if records is not None:
        start = config.file_offset + {
            "evaluation": 0, "rind": config.n_samples,
            "train": config.n_samples + config.n_rind_calibration + seed_index * config.n_hotpot_train}[split]
        records = records[start: start + n]
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
                    source=config.hotpot_source, seed=SEED_OFFSETS["rag_train"] + seed)
        done = collect_traces(model, samples, trace_config, spec, use_cache=config.use_cache,
                              batch_size=config.trace_batch_size,
                              desc=f"HotpotQA {config.rag_setting} training (seed {seed})")
        calibration += done[: max(len(done) // 2, 1)]
        traces += done
    return calibration, traces


def train_head_probe(model, config: RagStudyConfig):
    """Static Eq. 2 scores and a regression probe (hidden state -> per-head Eq. 2 score), both from the setting's
    training traces (:func:`training_traces`)."""
    from dynheads_tl.analysis.correlation import ProbeConfig, split_by_sample, train_probe
    from dynheads_tl.analysis.scoring import static_eq2_scores

    calibration, traces = training_traces(model, config)
    static_scores = static_eq2_scores(calibration)
    train, val = split_by_sample(len(traces), [0.8, 0.2], config.seed)
    stack = lambda idx, attr: torch.cat([getattr(traces[i], attr).flatten(1) for i in idx]).numpy()
    probe_model = train_probe(stack(train, "hidden"), stack(train, "support_score"), stack(val, "hidden"),
                              stack(val, "support_score"), task="regression",
                              config=ProbeConfig(hidden=list(config.probe_hidden), epochs=config.probe_epochs, seed=config.seed))
    return static_scores, HeadProbe(probe_model, tuple(static_scores.shape))


class HeadProbe:
    """The trained regression probe as the dynamic strategy calls it: a hidden state -> per-head Eq. 2 scores
    [layer, head]. ``digest`` names its weights, so cached answers of another probe are never read back."""

    def __init__(self, network: torch.nn.Module, shape: tuple[int, int]):
        import copy

        from dynheads_tl.store import tensor_digest

        # A copy: weights edited afterwards in the caller's network must not change what this digest names.
        self.network, self.shape = copy.deepcopy(network).eval(), shape
        self.digest = tensor_digest(*self.network.state_dict().values())

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.network(hidden[None].float())[0].reshape(self.shape)


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


SETTING_TEXT = {"multihop": "synthetic multi-hop HotpotQA-format questions (bridge and comparison, 10 paragraphs)",
                "headroom": "synthetic single-hop HotpotQA-format questions (the gold paragraph and one distractor, "
                            "two worked examples before the question)"}


def summary_markdown(table: pd.DataFrame, config: RagStudyConfig) -> str:
    """What was run, and per strategy EM / F1 with intervals and what it opened (numbers only; the verdict is
    :func:`rag_verdict`)."""
    data = SETTING_TEXT[config.rag_setting] if config.hotpot_source == "synthetic" else \
        f"HotpotQA records from {config.hotpot_source!r} ({config.rag_setting} setting)"
    lines = [f"**Model:** {config.model}; {data}; n = {int(table['n'].min())} evaluation questions per strategy."]
    for r in table.itertuples():
        opened = ("" if r.strategy in ("none", "full") else
                  f", {r.retrievals:.2f} retrievals/answer, {100 * r.visible_context_share:.0f}% of the context opened, "
                  f"{100 * r.evidence_recall:.0f}% of supporting-fact tokens opened")
        lines.append(f"- **{r.method}**: EM {_fmt(r.em, r.em_low, r.em_high)}, F1 {_fmt(r.f1, r.f1_low, r.f1_high)}{opened}.")
    paper = PAPER_TABLE4["Llama-3.1-8B-Instruct"]
    lines.append(f"- Paper (Llama-3.1-8B): Dynamic {paper['dynamic'][0]:.3f}/{paper['dynamic'][1]:.4f} against Static "
                 f"{paper['static'][0]:.3f}/{paper['static'][1]:.4f}; Llama-3.2-3B reverses the order.")
    return "\n".join(lines)


def rind_sentence(table: pd.DataFrame, threshold: float) -> str:
    """The RIND threshold in one computed sentence: given, or calibrated and how it splits the calibration answers."""
    if table.empty:
        return f"RIND threshold {threshold:.3f} (given as a parameter, not calibrated)."
    wrong, right = table[table["wrong"]], table[~table["wrong"]]
    fire = lambda part: f"{int((part['rind_max'] > threshold).sum())} of {len(part)}"
    return (f"RIND threshold {threshold:.3f}, calibrated on n = {len(table)} questions answered without retrieval: it "
            f"fires on {fire(wrong)} wrong answers and {fire(right)} right ones (F1 < 0.5 counts as wrong)."
            + (" Every calibration answer is wrong without the context, so the threshold sits below every positive "
               "value: retrieval fires whenever RIND flags any content word." if right.empty else ""))
