"""Claim 3's probes (Tables 2 and 3): MLP, linear and prior predictors of the next step's retrieval heads from the
hidden state, on train/validation/test splits by layout (:func:`probe_table`), k steps ahead
(:func:`lead_probe_table`), their summaries and paired differences over splits, and the next-step set probe
(:class:`SetProbe`) that notebooks 05 and 06 use. A trained probe as a per-head scorer (claim 2's ``predicted``
condition, the RAG case study): :mod:`dynheads_tl.analysis.head_probe`.

The method and its baselines: :mod:`dynheads_tl.analysis.correlation`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal, Sequence

import numpy as np
import pandas as pd
import torch
from sklearn.metrics import (average_precision_score, f1_score, mean_absolute_error, mean_squared_error,
                             precision_recall_curve, precision_score, r2_score, recall_score)

from dynheads_tl.analysis.cca import OTHER, covariate_design, frequent_levels
from dynheads_tl.analysis.layouts import (lagged_pairs, layout_groups, layout_split, pair_covariates, split_sizes,
                                          step_of, test_to_train_ratio)
from dynheads_tl.analysis.statistics import resampled_t_interval, resampled_t_test
from dynheads_tl.engine.trace_data import Trace
from dynheads_tl.progress import progress
from dynheads_tl.store import config_hash, load_cached_json, save_cached_json, tensor_digest


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


TOKEN_PRIOR = "step-and-token prior"


def step_token_prior(columns_train: Sequence[np.ndarray], y_train: np.ndarray, *, min_count: int = 5,
                     alpha: float = 1.0):
    """A predictor that knows the decoding step and the tokens, not the hidden state: a ridge regression of each
    head's target on one-hot blocks of ``columns_train`` (here the step n + k, the tokens read at n and n + k and
    the token generated at n + k), fitted on the training pairs. A token seen fewer than ``min_count`` times there
    shares one pooled level; a step the training pairs never reached gets no column. Returns a function from the
    same columns of other pairs to [pairs, heads] predictions (for Eq. 1 sets: rates, clipped to [0, 1] by the
    caller where needed)."""
    from sklearn.linear_model import Ridge

    steps, *tokens = columns_train
    frequent = [frequent_levels(values, min_count) for values in tokens]
    levels = [set(np.asarray(steps).tolist())] + [keep | {OTHER} for keep in frequent]

    def design(columns: Sequence[np.ndarray]) -> np.ndarray:
        step_values, *token_values = columns
        pooled = [np.array([v if int(v) in keep else OTHER for v in values]) for values, keep in zip(token_values, frequent)]
        return covariate_design([step_values] + pooled, levels)

    ridge = Ridge(alpha=alpha).fit(design(columns_train), y_train)
    return lambda columns: ridge.predict(design(columns)) if len(columns[0]) else np.empty((0, y_train.shape[1]))


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
    (:func:`probe_splits`): MLP probe, linear probe, the static-frequency prior, a step-aware prior (each
    head's rate at that decoding step: what the position in the answer alone predicts) and the step-and-token
    prior (:func:`step_token_prior`: the step, the tokens read at n and n + k and the token generated at n + k,
    which Eq. 1 at step n + k is defined against), all scored on the test layouts. The linear probe is a linear
    layer trained like the MLP (classification) or closed-form ridge regression (regression). Each row says how
    many samples and layouts the split's parts hold."""
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
    covariates = pair_covariates(traces, k)
    columns = (steps, covariates.tokens, covariates.target_tokens, covariates.generated_tokens)
    token_prior = step_token_prior([c[parts[0]] for c in columns], ytr)
    clip = (lambda p: np.clip(p, 0.0, 1.0)) if task == "classification" else (lambda p: p)
    rows.append((TOKEN_PRIOR, clip(token_prior([c[parts[1]] for c in columns])),
                 clip(token_prior([c[parts[2]] for c in columns]))))
    table = []
    for name, val_scores, test_scores in rows:
        if task == "classification":
            metrics = classification_metrics(yte, test_scores, best_f1_threshold(yva, val_scores))
        else:
            metrics = regression_metrics(yte, test_scores)
        table.append({"predictor": name, **metrics, "train_pairs": len(xtr), "test_pairs": len(xte),
                      "test_positive_rate": float(yte.mean()), **split_sizes(clusters, train_s, test_s),
                      "val_samples": len(val_s)})
    return pd.DataFrame(table)



# --- probes k steps ahead -----------------------------------------------------------------------
LEAD_KS = (0, 1, 2, 3, 5, 10)



def lead_probe_table(traces: Sequence[Trace], task: Literal["classification", "regression"], config: ProbeConfig,
                     ks: Sequence[int] = LEAD_KS, split_seeds: Sequence[int] = (0, 1, 2, 3, 4),
                     progress_desc: str | None = None, *, linear_ks: Sequence[int] = (),
                     min_test_samples: int = MIN_PROBE_TEST_SAMPLES, cache: bool = False) -> pd.DataFrame:
    """Probes from hidden[n] to the target at step n + k (Eq. 1 sets for classification, Eq. 2 scores for
    regression), for each k and each train/validation/test split by layout (:func:`probe_splits`). One row
    per (k, split seed, predictor) with F1 / precision / recall / AUPRC or MSE / MAE / R² on the test layouts;
    predictors are the MLP probe, the static-frequency prior (the base rate), the step-aware prior (each head's
    rate at step n + k) and, at the lags in ``linear_ks``, the linear probe (Tables 2 and 3 read k = 0).

    With ``cache``, each (k, split seed)'s rows are a cached unit keyed by the probe settings and a hash of the
    pairs they are computed from (:func:`_pairs_digest`): a run from the cache reads them back instead of training
    the probes again; other traces, settings or splits compute their own."""

    clusters = layout_groups(traces)
    digests: dict[int, str] = {}
    units = []  # (k, split seed, its seeded config, its cache key or None, its cached records or None)
    for k in ks:
        for split_seed in split_seeds:
            seeded = ProbeConfig(**{**config.__dict__, "seed": split_seed})
            key = None
            if cache:
                if k not in digests:
                    digests[k] = _pairs_digest(traces, task, k, clusters)
                key = {"unit": "lead_probe", "version": _LEAD_PROBE_VERSION, "task": task, "config": asdict(seeded),
                       "k": k, "split_seed": split_seed, "linear_probe": k in linear_ks,
                       "min_test_samples": min_test_samples, "pairs": digests[k]}
            units.append((k, split_seed, seeded, key, None if key is None else load_cached_json(key)))
    missing = [unit for unit in units if unit[4] is None]  # the progress line counts what is computed, not read back
    computed = {}
    for k, split_seed, seeded, key, _ in (progress(missing, desc=progress_desc) if progress_desc else missing):
        try:
            records = probe_table(traces, task, seeded, k=k, split_seed=split_seed, linear_probe=k in linear_ks,
                                  clusters=clusters, min_test_samples=min_test_samples).to_dict("records")
        except ValueError:  # no pairs at this lag, or a split without any: the lag has no row for this seed
            records = []
        if key is not None:
            save_cached_json(key, records)
        computed[k, split_seed] = records
    rows = []
    for k, split_seed, _, _, cached in units:
        records = cached if cached is not None else computed[k, split_seed]
        rows += [{"k": k, "split_seed": split_seed, **record} for record in records]
    return pd.DataFrame(rows)


# Bump when what a cached row of :func:`lead_probe_table` means changes (its metrics, predictors or splits).
_LEAD_PROBE_VERSION = 1


def _pairs_digest(traces: Sequence[Trace], task: str, k: int, clusters: np.ndarray) -> str:
    """A hash of everything :func:`probe_table` reads from ``traces`` at lag ``k``: the probe's inputs and targets,
    the pairs' samples and layouts, and the step-and-token prior's covariates ("" when no sample reaches k)."""
    try:
        x, y, groups = lagged_pairs(traces, k, "eq1" if task == "classification" else "score")
        covariates = pair_covariates(traces, k)
    except ValueError:
        return ""
    columns = (covariates.steps, covariates.tokens, covariates.target_tokens, covariates.generated_tokens)
    layouts = config_hash({"layouts": [str(label) for label in np.asarray(clusters).tolist()]})  # labels: strings
    return layouts + tensor_digest(torch.as_tensor(x), torch.as_tensor(y), torch.as_tensor(groups),
                                   *(torch.as_tensor(c) for c in columns))


def lead_differences(table: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per k: the probe's ``metric`` minus the base rate's, the step-aware prior's and the step-and-token prior's
    (``vs_token_prior``) on the same splits,
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
        for baseline, name in (("static-frequency prior", "vs_base_rate"), ("step-aware prior", "vs_step_prior"),
                               (TOKEN_PRIOR, "vs_token_prior")):
            if baseline not in wide:  # tables from before the step-and-token prior
                continue
            difference = wide["MLP probe"] - wide[baseline]
            interval = resampled_t_interval(difference, ratio)
            row.update({name: interval.estimate, f"{name}_low": interval.low, f"{name}_high": interval.high,
                        f"{name}_p": resampled_t_test(difference, ratio)})
        out.append(row)
    return pd.DataFrame(out)


PROBE_METRICS = {"classification": ("f1", "precision", "recall", "auprc"), "regression": ("mse", "mae", "r2")}
# The values each probe metric can take; a metric's interval is held within them (R² has no lower end, errors no
# upper one; :func:`~dynheads_tl.analysis.statistics.resampled_t_interval`).
PROBE_METRIC_RANGES = {"f1": (0.0, 1.0), "precision": (0.0, 1.0), "recall": (0.0, 1.0), "auprc": (0.0, 1.0),
                       "mse": (0.0, float("inf")), "mae": (0.0, float("inf")), "r2": (float("-inf"), 1.0)}


def probe_summary(raw: pd.DataFrame, task: Literal["classification", "regression"], k: int = 0) -> pd.DataFrame:
    """Table 2 / Table 3: per predictor at lag ``k``, each metric's mean over the splits by layout with its
    corrected resampled 95% t-interval (``<metric>_low`` / ``_high``, held within the metric's range,
    :data:`PROBE_METRIC_RANGES`: a recall's interval never passes 1), the number of splits and what each
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
            interval = resampled_t_interval(rows_of[metric], ratio, bounds=PROBE_METRIC_RANGES.get(metric))
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

