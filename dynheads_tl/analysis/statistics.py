"""Intervals for the report's numbers: every number is stated with its n and a 95% interval.

- :func:`t_interval`: a mean over a few repeated estimates (e.g. the same statistic on 5 by-sample
  splits), Student t with n - 1 degrees of freedom. It describes how much the estimate moves with the
  split, not the sampling error of a population of prompts.
- :func:`bootstrap_interval`: a statistic over samples (percentile bootstrap, resampling samples).
- :func:`wilson_interval`: a proportion (accuracy) over n independent trials.
- :func:`holm_adjust`: Holm's family-wise adjustment of several p-values.
- :func:`paired_sign_test` and :func:`mark_separated`: two conditions run on the same samples, compared by their
  paired difference (bootstrap interval) and an exact sign test; a family of such comparisons is Holm-adjusted and
  a difference is called separated only when the adjusted p-value is small *and* the interval excludes 0.
- :func:`sign_test_min_p`, :func:`sign_test_needs` and :func:`holm_testable`: Holm over the comparisons that can
  reach significance only.
- ``bootstrap_interval(..., clusters=...)``: resample clusters (layouts), not samples; :func:`grouped_splits`
  splits by cluster; :func:`n_to_resolve` says how many units an interval's design would need.
- :func:`resampled_t_interval`: a mean over overlapping train/test splits (Nadeau and Bengio), held within the range
  its statistic can take where one is given (:func:`within`, :data:`CORRELATION_RANGE`).
- :func:`format_interval`: an estimate and its interval as the claims' verdict sentences write them
  ("0.75 [0.47, 0.91]"); some tables and the report index still format theirs inline.
- :func:`detectable_effect` and :func:`n_to_resolve`: what a design could see at 80% power (about 2.8 standard
  errors, SCIENCE 17), and how many units would resolve an observed effect at that power.
- :func:`tost`, :func:`tost_interval` and :func:`tost_row`: two one-sided tests against a smallest effect of interest, the only
  way a difference is said to be negligible ("cannot be told apart" is not "equal").
- :func:`primary_and_holm`: the one convention (pre-registration): the primary tested alone at alpha, the
  secondaries Holm-corrected within their family.
- :func:`interval_words`, :func:`sensitivity_words` and :func:`detectable_words`: an interval and what a null
  result could have seen, in words, saying "every sample at 0" / "ties" where it is degenerate.

Bootstrap intervals are BCa (bias-corrected and accelerated, jackknife over the resampled units). A statistic whose
estimate lies in the tail of its own bootstrap distribution (a count of distinct heads or a maximum, which
resampling can only lower) gets the stated rule of :data:`TAIL_RULE` instead, so that no interval excludes its own
estimate.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from scipy import stats

from dynheads_tl.analysis.bca import bca_bounds, jackknife


# z at 97.5% and at 80%: a two-sided test at 0.05 with 80% power detects (1.96 + 0.84) = 2.80 standard errors.
_Z_ALPHA, _Z_POWER = float(stats.norm.ppf(0.975)), float(stats.norm.ppf(0.80))

# The rule for a statistic whose estimate sits in the tail of its own bootstrap distribution.
TAIL_RULE = ("the estimate lies in the tail of its own bootstrap distribution (a count or a maximum, which resampling "
             "can only lower or raise), so the interval runs from the percentile bound on the far side to the estimate")


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    n: int
    clusters: int | None = None  # independent units among the n (a cluster bootstrap's resampled clusters)
    method: str = ""  # "bca", "tail rule" (TAIL_RULE), "degenerate" (every resample equal), "" (t, Wilson)

    @property
    def half_width(self) -> float:
        """Half the interval's width (about 1.96 standard errors for a 95% interval). The smallest effect the design
        detects at 80% power is larger: :meth:`detectable`."""
        return (self.high - self.low) / 2

    @property
    def standard_error(self) -> float:
        """The standard error a 95% interval of this width implies (half-width / 1.96)."""
        return self.half_width / _Z_ALPHA

    @property
    def detectable(self) -> float:
        """The smallest effect this design detects with 80% power at a two-sided 0.05: about 2.8 standard errors
        (:func:`detectable_effect`)."""
        return detectable_effect(self)

    @property
    def degenerate(self) -> bool:
        """Every resample gave the same value (for a mean: every unit has the same value), so the interval has no
        width and says nothing about sampling error."""
        return self.low == self.high == self.estimate

    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0

    def __str__(self) -> str:
        return f"{self.estimate:+.3f} [{self.low:+.3f}, {self.high:+.3f}] (n = {self.n})"


def t_interval(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """Mean of ``values`` with a Student-t interval; NaNs are dropped. With fewer than two values there is
    no interval: the bounds are NaN (and no value at all gives a NaN estimate, n = 0)."""
    return _student_t(values, confidence, lambda data: data.std(ddof=1) / np.sqrt(len(data)))


def _student_t(values: Sequence[float], confidence: float, standard_error: Callable[[np.ndarray], float]) -> Interval:
    """Mean of ``values`` (NaNs dropped) ± Student t (n - 1 degrees of freedom) × ``standard_error(values)``;
    NaN bounds with fewer than two values, and a NaN estimate with none."""
    data = np.asarray([v for v in values if v == v], dtype=float)
    if len(data) == 0:
        return Interval(float("nan"), float("nan"), float("nan"), 0)
    mean = float(data.mean())
    if len(data) == 1:
        return Interval(mean, float("nan"), float("nan"), 1)
    half = float(stats.t.ppf(0.5 + confidence / 2, len(data) - 1)) * float(standard_error(data))
    return Interval(mean, mean - half, mean + half, len(data))


def bootstrap_interval(values: Sequence[float] | np.ndarray, statistic: Callable[[np.ndarray], float] = np.mean,
                       *, confidence: float = 0.95, n_resamples: int = 2000, seed: int = 0,
                       clusters: Sequence | np.ndarray | None = None, method: str = "bca") -> Interval:
    """Bootstrap interval of ``statistic`` over the first axis of ``values`` (one entry per sample): BCa by default
    (bias-corrected and accelerated; the acceleration from a jackknife over the resampled units), ``method =
    "percentile"`` for the plain percentile interval. Resamples on which the statistic is undefined (NaN, e.g. a
    ratio whose denominator drew only empty samples) are left out; if none is defined the bounds are NaN.

    Two stated rules keep an interval from excluding its own estimate: when every resample gives the same value the
    interval is that value (``method`` "degenerate": say "every sample at X", :func:`interval_words`); when the
    estimate lies in the outer ``(1 - confidence) / 2`` tail of its own bootstrap distribution (a count of distinct
    heads over samples or a maximum, which resampling can only lower), the interval runs from the percentile bound
    on the far side to the estimate (``method`` "tail rule", :data:`TAIL_RULE`).

    ``clusters`` (one label per sample, e.g. the NIAH layout a sample shares with its siblings): resample whole
    clusters instead of samples (SCIENCE 10), so samples that are not independent are not counted as if they
    were; the interval records how many clusters it rests on. Without it every sample is its own cluster."""
    if method not in ("bca", "percentile"):
        raise ValueError(f"method must be 'bca' or 'percentile', got {method!r}.")
    data = np.asarray(values, dtype=float)
    if len(data) == 0:
        raise ValueError("No values to put an interval on.")
    rng = np.random.default_rng(seed)
    if clusters is None:
        groups = None
        members = [np.array([i]) for i in range(len(data))]
        draws = (_mean_draws(data, rng, n_resamples) if statistic is np.mean and data.ndim == 1 else
                 np.array([statistic(data[rng.integers(0, len(data), len(data))]) for _ in range(n_resamples)]))
    else:
        labels = np.asarray(clusters)
        if len(labels) != len(data):
            raise ValueError(f"clusters needs one label per sample: {len(labels)} labels for {len(data)} samples.")
        members = [np.flatnonzero(labels == label) for label in dict.fromkeys(labels.tolist())]
        groups = len(members)
        draws = np.array([statistic(data[np.concatenate([members[j] for j in rng.integers(0, groups, groups)])])
                          for _ in range(n_resamples)])
    estimate = float(statistic(data))
    draws = draws[~np.isnan(draws)]
    alpha = (1 - confidence) / 2
    if len(draws) == 0:
        return Interval(estimate, float("nan"), float("nan"), len(data), groups)
    if np.all(draws == draws[0]):
        value = float(draws[0])
        return Interval(estimate, min(value, estimate), max(value, estimate), len(data), groups, "degenerate")
    percentile = Interval(estimate, float(np.quantile(draws, alpha)), float(np.quantile(draws, 1 - alpha)),
                          len(data), groups, "percentile")
    if method == "percentile" or estimate != estimate:
        return percentile
    below = float((draws < estimate).mean() + 0.5 * (draws == estimate).mean())
    if below >= 1 - alpha:
        return Interval(estimate, percentile.low, estimate, len(data), groups, "tail rule")
    if below <= alpha:
        return Interval(estimate, estimate, percentile.high, len(data), groups, "tail rule")
    if len(members) < 3:
        return percentile
    low, high = bca_bounds(estimate, draws, jackknife(data, members, statistic), 1 - 2 * alpha)
    return Interval(estimate, min(low, estimate), max(high, estimate), len(data), groups, "bca")


def _mean_draws(data: np.ndarray, rng: np.random.Generator, n_resamples: int) -> np.ndarray:
    """The means of ``n_resamples`` resamples of ``data`` (1-D), drawn as the loop ``[data[rng.integers(0, n,
    n)].mean() for _ in range(n_resamples)]`` draws them (the generator gives the same indices in one call of shape
    (rows, n) as in rows calls of n, and a row's mean is the same float), a block of resamples at a time."""
    n = len(data)
    rows = max(1, (1 << 20) // n)  # about 8 MiB of indices a block
    blocks = [data[rng.integers(0, n, (min(rows, n_resamples - start), n))].mean(axis=1)
              for start in range(0, n_resamples, rows)]
    return np.concatenate(blocks) if blocks else np.empty(0)


def detectable_effect(interval: Interval, *, power: float = 0.80, alpha: float = 0.05) -> float:
    """The smallest true effect a design like this one detects with probability ``power`` in a two-sided test at
    ``alpha``: (z_{1 - alpha/2} + z_power) standard errors, 2.80 at the defaults (SCIENCE 17). The standard error is
    the one the 95% interval implies (half-width / 1.96); the half-width alone is the effect detected half of the
    time. NaN when the interval has no width defined."""
    z = float(stats.norm.ppf(1 - alpha / 2)) + float(stats.norm.ppf(power))
    return z * interval.standard_error


def n_to_resolve(interval: Interval, effect: float | None = None, *, power: float = 0.80,
                 alpha: float = 0.05) -> int | None:
    """About how many independent units (clusters where the interval has them) a design like this one needs to
    detect ``effect`` (default: the observed estimate) with probability ``power`` in a two-sided test at ``alpha``:
    the standard error shrinks as 1/sqrt(n), so n = units x (detectable effect / effect)^2 (:func:`detectable_effect`).
    None when the effect is 0 or undefined, or the interval has no width (a degenerate interval says nothing about
    sampling error)."""
    effect = interval.estimate if effect is None else effect
    units = interval.clusters or interval.n
    detectable = detectable_effect(interval, power=power, alpha=alpha)
    if not effect or effect != effect or detectable != detectable or detectable == 0 or units < 1:
        return None
    return int(np.ceil(units * (detectable / abs(effect)) ** 2))


@dataclass(frozen=True)
class Equivalence:
    """Two one-sided tests (TOST) of a difference against the smallest effect of interest ``sesoi``: ``p`` is the
    larger of the two one-sided p-values; ``equivalent`` when it is below alpha, i.e. the difference lies within
    ±sesoi. Not equivalent is not "different": it only means negligibility is not shown."""

    p: float
    equivalent: bool
    sesoi: float


def tost(differences: Sequence[float] | np.ndarray, sesoi: float, *, alpha: float = 0.05) -> Equivalence:
    """TOST on paired differences (one per independent unit): one-sample t-tests of mean > -sesoi and of
    mean < +sesoi, each at ``alpha``. With every difference equal the tests are exact: equivalent when that value
    lies strictly inside ±sesoi. NaNs are dropped; fewer than two values cannot be tested (p NaN, not equivalent)."""
    if not sesoi > 0:
        raise ValueError(f"The smallest effect of interest must be positive, got {sesoi!r}.")
    data = np.asarray([v for v in np.asarray(differences, dtype=float) if v == v])
    if len(data) < 2:
        return Equivalence(float("nan"), False, sesoi)
    mean, se = float(data.mean()), float(data.std(ddof=1) / np.sqrt(len(data)))
    if se == 0:
        inside = -sesoi < mean < sesoi
        return Equivalence(0.0 if inside else 1.0, inside, sesoi)
    df = len(data) - 1
    p = max(float(stats.t.sf((mean + sesoi) / se, df)), float(stats.t.cdf((mean - sesoi) / se, df)))
    return Equivalence(p, p < alpha, sesoi)


def tost_interval(low: float, high: float, sesoi: float) -> bool:
    """TOST read from a 95% interval (when only the interval was written): equivalent when the whole interval lies
    within ±sesoi. A 95% interval inside the margin is TOST at 0.025 on each side, so this is conservative at
    0.05. False when a bound is undefined."""
    if not sesoi > 0:
        raise ValueError(f"The smallest effect of interest must be positive, got {sesoi!r}.")
    return bool(low == low and high == high and -sesoi < low and high < sesoi)


def tost_row(row, sesoi: float) -> bool:
    """TOST read from a results row (a dict or a table row): on its 1 - 2 alpha interval (``tost_low``,
    ``tost_high``: both one-sided tests at alpha, as preregistration.yaml declares) where the row holds one, else on
    its 95% ``low``/``high`` (:func:`tost_interval`: stricter; rows written before the narrower interval was)."""
    low, high = row.get("tost_low", float("nan")), row.get("tost_high", float("nan"))
    if not (low == low and high == high):
        low, high = row["low"], row["high"]
    return tost_interval(low, high, sesoi)


def interval_words(interval: Interval, *, unit: str = "sample", digits: int = 2, signed: bool = False) -> str:
    """An interval in words: "0.75 [0.47, 0.91]", or "every sample at 0.00 (no interval: all equal)" when it is
    degenerate, so that a zero-width interval is never read as a precise one; the tail rule is named."""
    if interval.degenerate:
        spec = f"{'+' if signed else ''}.{digits}f"
        return f"every {unit} at {interval.estimate:{spec}} (no interval: all equal)"
    text = format_interval(interval.estimate, interval.low, interval.high, digits, signed=signed)
    return text + (" (upper bound at the estimate: a count)" if interval.method == "tail rule" else "")


def sensitivity_words(interval: Interval, *, unit: str = "samples", digits: int = 3, what: str = "") -> str:
    """What a null result could have seen (SCIENCE 12, 17), in words: "the design detects differences of about
    X with 80% power; about N <unit> would detect the observed one" — or, for a degenerate interval, that every
    unit ties, so no effect size can be named."""
    if interval.degenerate:
        return f"every one of the {interval.clusters or interval.n} {unit} ties, so the design names no detectable effect"
    detectable = interval.detectable
    if detectable != detectable:
        return "no interval, so no detectable effect can be named"
    need = n_to_resolve(interval)
    tail = ""
    if need is not None:
        units = interval.clusters or interval.n
        tail = (f"; about {need} {unit} would detect the observed one with 80% power" if need > units else
                f"; the observed effect is within what {units} {unit} detect, so the test itself does not reach the level")
    return f"the design detects {what}differences of about ±{detectable:.{digits}f} with 80% power{tail}"


def detectable_words(half_width: float, *, digits: int = 3, what: str = "differences", unit: str = "samples",
                     n: int | None = None) -> str:
    """The sentence part "the design detects <what> of about ±X with 80% power" from a 95% interval's half-width
    (X = 2.8 standard errors, :func:`detectable_effect`), for tables that kept only the half-width; "every one of
    the n <unit> ties, so the design names no detectable effect" when the half-width is 0 (a degenerate interval:
    never "±0.00"); "no interval" when it is undefined."""
    if half_width != half_width:
        return "no interval, so no detectable effect can be named"
    if half_width == 0:
        count = f"every one of the {n} {unit}" if n else f"every one of the {unit}"
        return f"{count} ties, so the design names no detectable effect"
    detectable = detectable_effect(Interval(0.0, -half_width, half_width, n or 0))
    return f"the design detects {what} of about ±{detectable:.{digits}f} with 80% power"


def primary_and_holm(p_values: Sequence[float], primary: Sequence[bool], family: Sequence[bool] | None = None,
                     min_p: Sequence[float] | None = None, alpha: float = 0.05) -> list[float]:
    """The pre-registration's one convention: the primary comparison keeps its own p (tested alone at alpha); the
    secondaries in ``family`` (default: every non-primary row) are Holm-adjusted together, leaving out those whose
    ``min_p`` cannot reach alpha (Tarone; NaN); rows outside the family and not primary get NaN. In input order."""
    n = len(p_values)
    primary = [bool(x) for x in primary]
    family = [not p for p in primary] if family is None else [bool(f) and not p for f, p in zip(family, primary)]
    floors = list(min_p) if min_p is not None else [0.0] * n
    adjusted = [float("nan")] * n
    members = [i for i in range(n) if family[i] and p_values[i] == p_values[i]]
    for i, value in zip(members, holm_testable([p_values[i] for i in members], [floors[i] for i in members], alpha)):
        adjusted[i] = value
    for i in range(n):
        if primary[i]:
            adjusted[i] = float(p_values[i])
    return adjusted


def grouped_splits(groups: Sequence | np.ndarray, n_splits: int = 5, *, test_fraction: float = 0.3,
                   seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """``n_splits`` random train/test splits of samples by group (SCIENCE 10): every group (e.g. a NIAH layout and
    all its needle variants) lies wholly in the train part or wholly in the test part, about ``test_fraction`` of
    the groups in the test part, each split with its own seed. Returns (train indices, test indices) pairs."""
    labels = np.asarray(groups)
    unique = list(dict.fromkeys(labels.tolist()))
    if len(unique) < 2:
        raise ValueError(f"A grouped split needs at least 2 groups, got {len(unique)}.")
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must lie strictly between 0 and 1, got {test_fraction!r}.")
    n_test = min(max(1, int(round(test_fraction * len(unique)))), len(unique) - 1)
    splits = []
    for split in range(n_splits):
        order = np.random.default_rng([seed, split]).permutation(len(unique))
        test_groups = {unique[i] for i in order[:n_test]}
        in_test = np.array([label in test_groups for label in labels.tolist()])
        splits.append((np.flatnonzero(~in_test), np.flatnonzero(in_test)))
    return splits


# The values a correlation can take (a canonical correlation, held out or in-sample; Pearson's r).
CORRELATION_RANGE = (-1.0, 1.0)


def resampled_t_interval(values: Sequence[float], test_to_train: float, confidence: float = 0.95, *,
                         bounds: tuple[float, float] | None = None) -> Interval:
    """Mean of one statistic over repeated random train/test splits of the same units, with the corrected
    resampled t-interval of Nadeau and Bengio (2003): the splits share most of their units, so the variance of
    the mean is (1/J + n_test/n_train) s², not s²/J (J splits, ``test_to_train`` = n_test / n_train in
    independent units). Student t with J - 1 degrees of freedom; NaNs dropped; fewer than two values: NaN bounds.

    ``bounds`` (lowest, highest): the values the statistic can take (:data:`CORRELATION_RANGE` for a correlation,
    (0, 1) for an F1 or a recall). The t-interval is symmetric about the mean and knows nothing of that range, so
    near an end it runs past it (a smoke run's canonical correlation read 0.969 [0.900, 1.039]). What it covers, the
    statistic's mean over random splits, lies in the range, so the interval is intersected with it: the part beyond
    an end holds no possible value, and the intersection covers the true mean exactly when the interval does (the
    same 95% coverage), so it states the same thing without impossible values. A bound at the range's end
    (1.000) reads as that. Fisher's z is no alternative here: it makes a single Pearson r over independent pairs
    near normal, not a mean over overlapping splits, and an in-sample canonical correlation of 1 has z = ∞; nor is a
    bootstrap over the splits, which share their units."""
    interval = _student_t(values, confidence,
                          lambda data: np.sqrt((1 / len(data) + test_to_train) * data.var(ddof=1)))
    return interval if bounds is None else within(interval, *bounds)


def within(interval: Interval, lowest: float, highest: float) -> Interval:
    """``interval`` intersected with [``lowest``, ``highest``], the values its quantity can take (see
    :func:`resampled_t_interval`): its bounds, never its estimate, are moved; NaN bounds stay NaN."""
    clip = lambda bound: bound if bound != bound else float(min(max(bound, lowest), highest))
    return Interval(interval.estimate, clip(interval.low), clip(interval.high), interval.n, interval.clusters,
                    interval.method)


def resampled_t_test(values: Sequence[float], test_to_train: float) -> float:
    """Two-sided p-value of the corrected resampled t-test (:func:`resampled_t_interval`) that the statistic's
    mean over the splits is 0. NaN with fewer than two values; 1 when every value is 0, 0 when all are equal
    and not 0 (no spread)."""
    data = np.asarray([v for v in values if v == v], dtype=float)
    if len(data) < 2:
        return float("nan")
    se = float(np.sqrt((1 / len(data) + test_to_train) * data.var(ddof=1)))
    if se == 0:
        return 1.0 if data.mean() == 0 else 0.0
    return float(2 * stats.t.sf(abs(data.mean()) / se, len(data) - 1))


def ratio_of_sums(rows: np.ndarray) -> float:
    """Σ numerator / Σ denominator over rows of [numerator, denominator] (one row per sample): a pooled ratio,
    the statistic :func:`bootstrap_interval` resamples for pooled metrics. NaN when the denominators sum to 0."""
    total = rows[:, 1].sum()
    return float(rows[:, 0].sum() / total) if total > 0 else float("nan")


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> Interval:
    """Wilson score interval of a proportion."""
    if n <= 0:
        raise ValueError("A proportion needs n >= 1 trials.")
    z = float(stats.norm.ppf(0.5 + confidence / 2))
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return Interval(p, float(centre - half), float(centre + half), n)


def sign_test_min_p(discordant: int) -> float:
    """The smallest two-sided p-value an exact sign test on ``discordant`` untied pairs can reach (all on one side):
    a comparison whose minimum is above the level cannot be significant whatever the data, so it is left out of its
    family's correction (Tarone)."""
    return 1.0 if discordant <= 0 else min(1.0, 2 * 0.5 ** discordant)


def sign_test_needs(alpha: float = 0.05) -> int:
    """The fewest differing pairs with which an exact two-sided sign test can reach ``alpha`` (all on one side,
    :func:`sign_test_min_p`): 6 at 0.05."""
    needed = 1
    while sign_test_min_p(needed) > alpha:
        needed += 1
    return needed


def holm_testable(p_values: Sequence[float], min_p: Sequence[float], alpha: float = 0.05) -> list[float]:
    """Holm over the comparisons that can reach ``alpha`` (their ``min_p`` is at most ``alpha``); the others get
    NaN (untestable: left out of the family, Tarone's refinement of Holm). In the input order."""
    testable = [i for i, floor in enumerate(min_p) if floor <= alpha]
    adjusted = [float("nan")] * len(p_values)
    for i, value in zip(testable, holm_adjust([p_values[i] for i in testable])):
        adjusted[i] = value
    return adjusted


def holm_adjust(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment of ``p_values`` (family-wise error), in the input order."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def format_interval(estimate: float, low: float, high: float, digits: int = 2, *, signed: bool = False) -> str:
    """``estimate [low, high]`` with ``digits`` decimals (``signed``: with an explicit sign, for differences)."""
    spec = f"{'+' if signed else ''}.{digits}f"
    return f"{estimate:{spec}} [{low:{spec}}, {high:{spec}}]"


@dataclass(frozen=True)
class PairedComparison:
    """``a`` against ``b`` on the same samples: the mean paired difference (a − b) with its bootstrap interval, how
    many samples favour each side, and the exact two-sided sign test on the samples that differ."""

    difference: Interval
    a_better: int
    b_better: int
    sign_p: float


def paired_sign_test(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, *,
                     seed: int = 0) -> PairedComparison:
    """Compare two conditions measured on the same samples (``a[i]`` and ``b[i]`` belong to sample ``i``).

    With most samples tied (accuracy 0/1 on a few samples), a bootstrap interval alone excludes 0 too easily: 4
    wins and no loss in 30 samples give an interval above 0 but a sign-test p of 0.125. Use both, through
    :func:`mark_separated`."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"Paired values need the same shape, got {a.shape} and {b.shape}.")
    wins, losses = int((a > b).sum()), int((a < b).sum())
    p = float(stats.binomtest(wins, wins + losses, 0.5).pvalue) if wins + losses else 1.0
    return PairedComparison(bootstrap_interval(a - b, seed=seed), wins, losses, p)


def mark_separated(table, alpha: float = 0.05, family=None, *, testable_only: bool = False, primary=None):
    """Add ``p_adjusted`` (Holm over the rows of ``family``, a boolean mask; default every row; other rows keep
    their raw ``sign_p``) and ``separated`` (adjusted p below ``alpha`` and the ``low``–``high`` interval away from
    0) to a table of paired comparisons with columns ``sign_p``, ``low`` and ``high``. Returns the table.

    ``testable_only`` (needs the columns ``a_better`` and ``b_better``): rows whose sign test cannot reach
    ``alpha`` (too few discordant pairs, :func:`sign_test_min_p`) leave the family, get ``testable`` False and a
    NaN ``p_adjusted``, and are never separated.

    ``primary`` (a boolean mask): those rows are tested alone at ``alpha`` (their ``p_adjusted`` is their own
    ``sign_p``, :func:`primary_and_holm`) and leave the Holm family whatever ``family`` says."""
    if table.empty:
        return table
    if primary is not None:
        primary = np.asarray(primary, dtype=bool)
        family = (np.ones(len(table), dtype=bool) if family is None else np.asarray(family, dtype=bool)) & ~primary
    family = np.ones(len(table), dtype=bool) if family is None else np.asarray(family, dtype=bool)
    table["p_adjusted"] = table["sign_p"]
    if testable_only:
        min_p = np.array([sign_test_min_p(int(d)) for d in (table["a_better"] + table["b_better"]).to_numpy()])
        table["testable"] = min_p <= alpha
        table.loc[~table["testable"].to_numpy(), "p_adjusted"] = float("nan")
        if family.any():
            table.loc[family, "p_adjusted"] = holm_testable(table.loc[family, "sign_p"].tolist(),
                                                            min_p[family].tolist(), alpha)
    elif family.any():
        table.loc[family, "p_adjusted"] = holm_adjust(table.loc[family, "sign_p"].tolist())
    if primary is not None and primary.any():
        table.loc[primary, "p_adjusted"] = table.loc[primary, "sign_p"]
    table["separated"] = (table["p_adjusted"] < alpha) & ((table["low"] > 0) | (table["high"] < 0))
    return table
