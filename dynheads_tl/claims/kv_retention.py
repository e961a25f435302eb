"""Beyond the paper (notebook 06): keep the full KV cache only for the heads that will retrieve.

The protocol is :mod:`dynheads_tl.protocols.retention`; this module is the notebook's config, its training data
(static scores and the probe, from notebook 01's traces of the same setting), the runs (free generation and
teacher forcing on the needle sentence, cached per sample) and the tables, figure and verdict.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pandas as pd

from dynheads_tl.analysis.statistics import (bootstrap_interval, format_interval, mark_separated, paired_sign_test,
                                             wilson_interval)
from dynheads_tl.config import RunSettings, NotebookConfig, StaticSource, check_ints
from dynheads_tl.corpus import SEED_OFFSETS, TraceSettings, layout_traces
from dynheads_tl.engine.models import model_fingerprint, model_name
from dynheads_tl.executors import compute_missing
from dynheads_tl.protocols.ablation import gold_token_ids, two_pass_batch
from dynheads_tl.protocols.retention import (LLAMA_31_8B, STRATEGIES, fixed_scores, kv_heads_kept, memory_table,
                                             model_kv_shape, oracle_scores, predicted_scores, random_scores,
                                             retention_selector)
from dynheads_tl.store import load_cached_json, save_cached_json
from dynheads_tl.tasks import make_niah_samples
from dynheads_tl.tasks.common import prompt_digest
from dynheads_tl.tasks.metrics import niah_accuracy

logger = logging.getLogger(__name__)

ANCHORS = {"DuoAttention": "NIAH intact with 25% (MHA) / 50% (GQA) of heads on full attention",
           "HeadKV": "97% of full-cache quality with 1.5% of the cache"}


@dataclass
class RetentionConfig(StaticSource, TraceSettings, RunSettings, NotebookConfig):
    """Notebook 06's parameters. The NIAH setting (``haystack``, ``context_tokens``) is traced as notebook 01's
    soft-dynamism settings are (``n_setting_calibration`` + ``n_setting`` answers, read from its cache), for the
    static scores and the probe; ``n_samples`` new answers of the same setting are evaluated. ``budgets``: shares
    of the query heads (``"query"``) or KV heads (``"kv"``) kept whole at every step. ``sink_tokens`` and
    ``local_window`` are what a restricted head still sees."""

    model: str = "smollm2-135m-instruct"
    haystack: str = "filler"
    context_tokens: int = 500
    n_setting: int = 24
    n_setting_calibration: int = 8
    n_samples: int = 12
    budgets: list[float] = field(default_factory=lambda: [0.05, 0.1, 0.25, 0.5])
    strategies: list[str] = field(default_factory=lambda: ["static", "query_static", "predicted", "oracle", "random"])
    granularities: list[str] = field(default_factory=lambda: ["query", "kv"])
    seed: int = 0
    batch_size: int = 64
    output_dir: str = "papers_figures"
    use_cache: bool = True

    def __post_init__(self):
        super().__post_init__()
        check_ints(self, ("context_tokens", "n_setting", "n_setting_calibration", "n_samples", "batch_size"))
        check_ints(self, ("seed",), minimum=0)
        if self.sink_tokens + self.local_window < 1:
            raise ValueError("sink_tokens + local_window must be at least 1: a restricted head needs some key to read.")
        if (not isinstance(self.budgets, list) or not self.budgets
                or not all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 < b < 1 for b in self.budgets)):
            raise ValueError(f"Parameter 'budgets' must be a non-empty list of shares in (0, 1), got {self.budgets!r}.")
        per_step = [s for s in STRATEGIES if s not in ("streaming", "full")] + [QUERY_STATIC]
        if not isinstance(self.strategies, list) or not self.strategies or any(s not in per_step for s in self.strategies):
            raise ValueError(f"Parameter 'strategies' must be a non-empty list drawn from {per_step} (streaming and "
                             f"the full cache always run), got {self.strategies!r}.")
        if (not isinstance(self.granularities, list) or not self.granularities
                or any(g not in ("query", "kv") for g in self.granularities)):
            raise ValueError(f"Parameter 'granularities' must be a non-empty list drawn from ['query', 'kv'], "
                             f"got {self.granularities!r}.")

    def check_inputs(self) -> None:
        from dynheads_tl.config import model_context_window
        from dynheads_tl.tasks.haystacks import check_haystack

        check_haystack(self.haystack)
        self.check_static_source()
        window = model_context_window(self.model)
        if self.context_tokens + 200 + self.max_new_tokens > window:
            raise ValueError(f"context_tokens={self.context_tokens} does not fit the model's context of {window}.")


QUERY_STATIC = "query_static"  # a fixed set ranked by QRHead-style query-focused scores (issue #31)


def training(model, config: RetentionConfig):
    """(static scores [layer, head], probe: hidden -> per-head scores) from the setting's notebook-01 traces."""
    from dynheads_tl.analysis.scoring import static_retrieval_scores
    from dynheads_tl.analysis.correlation import SetProbe

    calibration, analysis = layout_traces(model, config, haystack=config.haystack, context_tokens=config.context_tokens,
                                          n_calibration=config.n_setting_calibration, n_analysis=config.n_setting,
                                          seed=config.seed, use_cache=config.use_cache,
                                          batch_size=config.trace_batch_size)
    override = config.static_override()  # static_source: the file's scores are the static strategy's ranking
    static = static_retrieval_scores(calibration, rouge_filter=0.5) if override is None else override
    probe = SetProbe.fit(calibration + analysis)
    if probe is None:
        raise ValueError("No training answer has two steps: the probe cannot be fitted.")
    return static, probe.predict


def conditions(model, config: RetentionConfig) -> list[dict]:
    """Every (strategy, granularity, budget) run, plus streaming (b = 0) and the full cache; ``b`` in query
    heads or KV heads."""
    n_q = model.cfg.n_layers * model.cfg.n_heads
    n_kv = model.cfg.n_layers * model_kv_shape(model).n_kv_heads
    out = [{"strategy": "full", "granularity": "query", "budget": 1.0, "b": n_q},
           {"strategy": "streaming", "granularity": "query", "budget": 0.0, "b": 0}]
    for granularity in config.granularities:
        units = n_q if granularity == "query" else n_kv
        for budget in config.budgets:
            b = max(1, int(round(budget * units)))
            out += [{"strategy": s, "granularity": granularity, "budget": float(budget), "b": b} for s in config.strategies]
    return out


def query_training(model, config: RetentionConfig):
    """The query-focused scores [layer, head] (:func:`~dynheads_tl.analysis.query_focus.query_focused_scores`, mean
    over samples) of the same calibration prompts as :func:`training`'s static scores, or None when the strategy is
    not run."""
    if QUERY_STATIC not in config.strategies:
        return None
    from dynheads_tl.analysis.query_focus import query_focused_scores
    from dynheads_tl.corpus import layout_split_samples

    samples = layout_split_samples(model, config, haystack=config.haystack, context_tokens=config.context_tokens,
                                   n=config.n_setting_calibration, seed=config.seed)
    return query_focused_scores(model, samples, use_cache=config.use_cache).mean(0).float()


def _selector(model, condition: dict, static, probe, sample_seed: int, query=None):
    """The condition's selector; the random strategy's draws are seeded by ``sample_seed`` (run seed and sample);
    ``query_static`` ranks by the query-focused scores ``query``."""
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    if condition["strategy"] == QUERY_STATIC and query is None:
        raise ValueError("The query_static strategy needs the query-focused scores (query_training).")
    group = n_heads // model_kv_shape(model).n_kv_heads
    units = n_layers * n_heads if condition["granularity"] == "query" else n_layers * (n_heads // group)
    scorer = {"static": lambda: fixed_scores(static), "oracle": lambda: oracle_scores,
              "random": lambda: random_scores((n_layers, n_heads), sample_seed),
              "predicted": lambda: predicted_scores(probe, static), QUERY_STATIC: lambda: fixed_scores(query),
              "streaming": lambda: None, "full": lambda: None}[condition["strategy"]]()
    return retention_selector(scorer, condition["b"], granularity=condition["granularity"], group=group,
                              n_units=units)


def _sample_key(model, sample, config: RetentionConfig) -> dict:
    """A sample's cache key: the sample, the conditions, the training data's spec and the model (and, with
    ``static_source``, the file's scores: the key of a run without one is unchanged)."""
    key = {"kind": "kv_retention", "version": 3, "prompt": prompt_digest(sample), "conditions": conditions(model, config),
           "trace": config.trace_config("niah").key(),
           "training": {"haystack": config.haystack, "context_tokens": config.context_tokens, "seed": config.seed,
                        "n": [config.n_setting_calibration, config.n_setting]},
           "model": model_name(model), "model_fingerprint": model_fingerprint(model)}
    if config.static_source:
        from dynheads_tl.analysis.head_files import scores_digest

        key["static_source"] = scores_digest(config.static_override())
    return key


def retention_units(model, items: list[tuple], config: RetentionConfig, static, probe, query=None) -> list[list[dict]]:
    """One batch of retention units (the executors' ``compute``): every condition on each ``(sample, index)`` of
    ``items``, free and teacher-forced (no cache). The rows of all the items are decoded together, at most
    ``config.batch_size`` per batch: the conditions that need no clean pass apart from the oracle's, which needs
    one."""
    conds = conditions(model, config)
    group = model.cfg.n_heads // model_kv_shape(model).n_kv_heads
    trace_config = config.trace_config("niah")
    gold = {index: gold_token_ids(model.tokenizer, sample) for sample, index in items}
    rows: dict[int, list[dict]] = {index: [] for _, index in items}
    # Only the oracle reads the clean pass; every other condition runs one retained pass per step.
    runs = [(sample, index, c) for sample, index in items for c in conds]
    oracle = [run for run in runs if run[2]["strategy"] == "oracle"]
    others = [run for run in runs if run[2]["strategy"] != "oracle"]
    chunks = [(part[i: i + config.batch_size], part is oracle) for part in (others, oracle)
              for i in range(0, len(part), config.batch_size)]
    for chunk, needs_clean in chunks:
        jobs = [(sample, _selector(model, c, static, probe, config.seed * 1_000_003 + index, query))
                for sample, index, c in chunk]
        protocol = dict(keep_cache="masked", intervention="retain", clean_pass=needs_clean)
        free = two_pass_batch(model, jobs, trace_config, **protocol)
        forced = two_pass_batch(model, jobs, trace_config, gold=[gold[index] for _, index, _ in chunk], **protocol)
        for (sample, index, c), f, t in zip(chunk, free, forced):
            kept = f.masked_heads.flatten(1).sum(1).float()
            rows[index].append({**c, "sample": index, "accuracy": niah_accuracy(f.response, sample.answers[0]),
                                "response": f.response, "gold_logprob": float(t.masked_logprob.mean()),
                                "heads_kept": float(kept.mean()) if len(kept) else float("nan"),
                                "kv_heads_kept": float(kv_heads_kept(f.masked_heads, group).float().mean())})
    return [rows[index] for _, index in items]  # per sample: the one-pass conditions in order, then the oracle's


def samples_per_batch(model, config: RetentionConfig) -> int:
    """How many samples share a decoding batch: as many as fit their one-pass conditions in ``batch_size`` rows
    (at least one). The weights are read once per forward whatever the rows, so fuller batches cost less per row."""
    one_pass = sum(c["strategy"] != "oracle" for c in conditions(model, config))
    return max(1, config.batch_size // max(one_pass, 1))


def evaluation_samples(model, config: RetentionConfig):
    return make_niah_samples(model.tokenizer, n=config.n_samples, context_tokens=config.context_tokens,
                             seed=SEED_OFFSETS["retention"] + config.seed, haystack=config.haystack,
                             random_layout=True, max_new_tokens=config.max_new_tokens, max_tokens=int(model.cfg.n_ctx))


def run(model, config: RetentionConfig) -> pd.DataFrame:
    """Every sample's rows: cached samples read back, the missing ones (one unit each: every condition of the
    sample, batched) computed by the current executor and cached as they come back."""
    static, probe = training(model, config)
    query = query_training(model, config)
    samples = evaluation_samples(model, config)
    keys = [_sample_key(model, sample, config) for sample in samples]
    per_sample = [load_cached_json(key) if config.use_cache else None for key in keys]
    missing = [i for i, rows in enumerate(per_sample) if rows is None]
    size = samples_per_batch(model, config)
    chunks = [missing[start: start + size] for start in range(0, len(missing), size)]
    for index, rows in compute_missing(model, retention_units, chunks, lambda i: (samples[i], i),
                                       args=(config, static, probe, query), desc="KV retention (every condition per sample)"):
        per_sample[index] = save_cached_json(keys[index], rows) if config.use_cache else rows
    return pd.DataFrame([row for rows in per_sample for row in rows])


def summary(rows: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Per condition: NIAH accuracy (Wilson 95%), the mean teacher-forced log-probability of the gold tokens and
    its difference from the full cache, paired by sample (bootstrap 95%), and the heads / KV heads kept per step."""
    full = rows[rows["strategy"] == "full"].set_index("sample")["gold_logprob"]
    out = []
    for (strategy, granularity, budget, b), part in rows.groupby(["strategy", "granularity", "budget", "b"], sort=False):
        acc = wilson_interval(int(part["accuracy"].sum()), len(part))
        lp = bootstrap_interval(part["gold_logprob"].to_numpy(float), seed=seed)
        gap = bootstrap_interval((part.set_index("sample")["gold_logprob"] - full).dropna().to_numpy(float), seed=seed)
        out.append({"strategy": strategy, "granularity": granularity, "budget": budget, "b": b, "n": len(part),
                    "accuracy": acc.estimate, "accuracy_low": acc.low, "accuracy_high": acc.high,
                    "gold_logprob": lp.estimate, "gold_logprob_low": lp.low, "gold_logprob_high": lp.high,
                    "vs_full": gap.estimate, "vs_full_low": gap.low, "vs_full_high": gap.high,
                    "heads_kept": float(part["heads_kept"].mean()), "kv_heads_kept": float(part["kv_heads_kept"].mean())})
    return pd.DataFrame(out)


def _pick(rows: pd.DataFrame, strategy: str, granularity: str, budget: float, column: str) -> pd.Series:
    part = rows[(rows["strategy"] == strategy) & (rows["granularity"] == granularity) & (rows["budget"] == budget)]
    return part.set_index("sample")[column].astype(float)


def predicted_vs_static(rows: pd.DataFrame, seed: int = 0, alpha: float = 0.05, *,
                        static: str = "static") -> pd.DataFrame:
    """Predicted minus static retention at every (granularity, budget), paired by sample: the accuracy difference
    with a bootstrap 95% interval, wins and losses and an exact two-sided sign test, Holm-adjusted over all the
    budgets compared (``separated`` needs the adjusted p below ``alpha`` and the interval away from 0, as in the
    case study); and the teacher-forced gold log-probability difference (bootstrap 95%). ``static`` names the
    static strategy compared (``"query_static"``: the query-focused static set)."""
    out = []
    present = rows[rows["strategy"].isin(["predicted", static])]
    if present["strategy"].nunique() < 2:
        return pd.DataFrame()
    for (granularity, budget), _ in present.groupby(["granularity", "budget"], sort=True):
        acc = pd.concat([_pick(rows, "predicted", granularity, budget, "accuracy").rename("a"),
                         _pick(rows, static, granularity, budget, "accuracy").rename("b")], axis=1, join="inner")
        lp = pd.concat([_pick(rows, "predicted", granularity, budget, "gold_logprob").rename("a"),
                        _pick(rows, static, granularity, budget, "gold_logprob").rename("b")], axis=1, join="inner")
        if acc.empty:
            continue
        test = paired_sign_test(acc["a"].to_numpy(), acc["b"].to_numpy(), seed=seed)
        d = test.difference
        g = bootstrap_interval((lp["a"] - lp["b"]).to_numpy(), seed=seed)
        out.append({"granularity": granularity, "budget": budget, "n": len(acc), "accuracy_difference": d.estimate,
                    "low": d.low, "high": d.high, "predicted_better": test.a_better, "static_better": test.b_better,
                    "sign_p": test.sign_p, "logprob_difference": g.estimate, "logprob_low": g.low,
                    "logprob_high": g.high})
    return mark_separated(pd.DataFrame(out), alpha)


def query_baseline_verdict(comparisons: pd.DataFrame, query_comparisons: pd.DataFrame) -> str:
    """Issue #31's question for notebook 06, computed: does "predicted against static retention" read the same at
    every (granularity, budget) when the static set is the query-focused one (QRHead-style) instead of Wu et al.'s?
    Each comparison's reading is "beats", "falls below" (only where :func:`predicted_vs_static` marks it separated,
    Holm-adjusted) or "cannot be told apart"; the conclusion "does not change" when every budget reads the same."""
    if comparisons.empty or query_comparisons.empty:
        return "The query-focused static strategy was not run beside Wu et al.'s static set."

    def reading(r):
        return ("beats" if r.accuracy_difference > 0 else "falls below") if r.separated else "cannot be told apart from"

    wu = {(r.granularity, r.budget): reading(r) for r in comparisons.itertuples()}
    query = {(r.granularity, r.budget): (reading(r), r) for r in query_comparisons.itertuples()}
    parts, changed = [], []
    for key, (word, r) in query.items():
        parts.append(f"{key[0]} heads {key[1]:.0%}: predicted {word} the query-focused static set (accuracy "
                     f"{_fmt(r.accuracy_difference, r.low, r.high, True)}, n = {r.n}, Holm-adjusted sign-test p = "
                     f"{r.p_adjusted:.2f}; against Wu's: {wu.get(key, 'not run')})")
        if wu.get(key) != word:
            changed.append(f"{key[0]} {key[1]:.0%}")
    return ("With the query-focused static set as the static baseline: " + "; ".join(parts) + ". The conclusion "
            + ("does not change at any budget." if not changed else f"changes at {', '.join(changed)}."))


def _fmt(e, lo, hi, signed=False):
    return format_interval(e, lo, hi, 2, signed=signed)


def verdict(table: pd.DataFrame, comparisons: pd.DataFrame) -> str:
    """Computed sentences: whether the setting separates the full cache from streaming; the smallest budget at
    which each strategy reaches 95% of the full cache's accuracy (point estimates, said so); and, at each budget,
    predicted against static retention, claimed only where :func:`predicted_vs_static` marks it separated."""
    t = table.set_index(["strategy", "granularity"])
    full, streaming = t.loc[("full", "query")], t.loc[("streaming", "query")]
    lines = [f"Full cache accuracy {_fmt(full['accuracy'], full['accuracy_low'], full['accuracy_high'])}, streaming "
             f"only {_fmt(streaming['accuracy'], streaming['accuracy_low'], streaming['accuracy_high'])} (n = "
             f"{int(full['n'])} samples, Wilson 95%)."]
    room = bool(full["accuracy_low"] > streaming["accuracy_high"])
    if not room:
        lines.append("The two bounds' intervals overlap, so this setting cannot rank retention strategies; the "
                     "comparisons below are for the record.")
    target = 0.95 * float(full["accuracy"])
    for granularity in dict.fromkeys(table["granularity"]):
        part = table[(table["granularity"] == granularity) & ~table["strategy"].isin(["full", "streaming"])]
        if part.empty or full["accuracy"] <= 0:
            continue
        reach = []
        for strategy, rows_s in part.groupby("strategy", sort=False):
            ok = rows_s[rows_s["accuracy"] >= target].sort_values("budget")
            reach.append(f"{strategy} at {ok['budget'].iloc[0]:.0%}" if len(ok) else f"{strategy} at no budget tried")
        lines.append(f"{granularity}-head budgets: the smallest budget whose accuracy reaches 95% of the full "
                     "cache's (point estimates) is " + ", ".join(reach) + ".")
    if len(comparisons):
        parts = []
        for r in comparisons.itertuples():
            word = ("for the record" if not room else
                    ("beats" if r.accuracy_difference > 0 else "falls below") if r.separated else "cannot be told apart")
            parts.append(f"{r.granularity} heads {r.budget:.0%}: {word} (accuracy {_fmt(r.accuracy_difference, r.low, r.high, True)}, "
                         f"{r.predicted_better} samples better and {r.static_better} worse, Holm-adjusted sign-test "
                         f"p = {r.p_adjusted:.2f}; gold log-prob {_fmt(r.logprob_difference, r.logprob_low, r.logprob_high, True)} nats/token)")
        lines.append("Predicted against static retention, paired by sample: " + "; ".join(parts) + ".")
    lines.append("A per-step strategy keeps a different set of KV heads whole at every step, so it needs the evicted "
                 "entries stored elsewhere (host memory, say); the memory tables count only what is kept on the "
                 "device.")
    lines.append("For scale (other models): " + "; ".join(f"{k}: {v}" for k, v in ANCHORS.items()) + ".")
    return " ".join(lines)


def memory(model, config: RetentionConfig, table: pd.DataFrame) -> pd.DataFrame:
    """Computed KV memory per sequence (GiB, bf16) for this model and Llama-3.1-8B, at the share of KV heads each
    condition actually kept whole per step (a KV head counts when any of its query heads is retained), for each
    strategy and budget run."""
    shape = model_kv_shape(model)
    total = shape.n_layers * shape.n_kv_heads
    frames = []
    for r in table.itertuples():
        share = float(r.kv_heads_kept) / total
        for kv in (shape, LLAMA_31_8B):
            row = memory_table([kv], [share], sink_tokens=config.sink_tokens, local_window=config.local_window).iloc[0]
            frames.append({"strategy": r.strategy, "granularity": r.granularity, "budget": r.budget, **row.to_dict()})
    return pd.DataFrame(frames)
