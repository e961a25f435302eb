"""Claim 3 — the final hidden state predicts future retrieval heads: CCA and MLP probes.

CCA (Fig 4 / Fig 8): pair the final-norm hidden state of step n with every head's retrieval score at
step n + k (pairs that run past the end of a sample are dropped). Scores are min-max scaled, PCA keeps
95% of the hidden-state variance and 99% of the score variance, and up to 50 canonical pairs are fitted.
The score per head and step is its attention share on the evidence (Eq. 2's ratio; for NIAH the
evidence is the needle), a continuous version of the retrieval pattern.

Independent units. NIAH samples of different seeds share their layout (the depth and haystack offset; the seed
changes only the UUID), so siblings of one layout are nearly the same sample: every split here is by *layout*
(:func:`~dynheads_tl.analysis.layouts.layout_groups`, :func:`~dynheads_tl.analysis.statistics.grouped_splits`),
never by sample, and every table says how many samples and how many layouts (clusters) it rests on (SCIENCE 10).

Controls, because CCA overfits easily with few samples and many dimensions, all computed on each of several
grouped splits, fitted on the training layouts and scored on the held-out ones:
- **in-sample**: the paper's measure (fit and score on the same rows; here the training part of each split);
- **held-out**: fit scaling, PCA and CCA on the training layouts; correlate the canonical variates of
  the held-out layouts;
- **shuffled**: each hidden state paired with the scores of a step of a sample of *another layout*, on both
  sides of the split, then fitted and scored as held-out: how high held-out CCA goes on unrelated pairs;
- **shuffled, same step**: the same with the other layout's scores *at the same step index*, which keeps
  everything that depends only on the position in the answer (e.g. "the UUID starts at step 5"). The gap
  between held-out and this control is the part no position effect explains;
- **permuted within sample**: each sample's scores paired with its own hidden states in another step order (a
  derangement; samples with a single pair at a lag are left out): it keeps the sample's identity and breaks which
  step a score belongs to, so held-out above it is step-specific information within a sample, position included
  (the same-step shuffle controls position), not only recognising which sample a state came from. An exploratory
  secondary, its own Holm family over lags; no status reads it.
Means over the splits carry the corrected resampled t-interval (Nadeau and Bengio 2003,
:func:`~dynheads_tl.analysis.statistics.resampled_t_interval`): splits share most of their layouts, so a plain
t-interval over them would be too narrow.

Probes (Tables 2 and 3): an MLP from the hidden state to the per-head Eq. 1 pattern (multi-label
classification, Asymmetric Loss, threshold maximising F1 on the validation PR curve) or to the Eq. 2
scores (regression). Splits are train/validation/test *by layout*: the paper's 70/20/10, with the test part
enlarged to at least ``min_test_samples`` samples where the data allow
(:func:`~dynheads_tl.analysis.probes.probe_splits`). Baselines in the same tables: the static frequency prior
(each head's training base rate), a step-aware prior (each head's rate at that decoding step) and a linear probe.

The code lives in three modules, re-exported here: :mod:`~dynheads_tl.analysis.layouts` (units, pairs, splits
and means over them), :mod:`~dynheads_tl.analysis.cca` (CCA and its residualised form) and
:mod:`~dynheads_tl.analysis.probes` (the probes, their baselines and summaries).
"""
from __future__ import annotations

from dynheads_tl.analysis.layouts import (NIAH_LAYOUT_KEYS, layout_groups, sample_depth, lagged_pairs,
                                          split_by_sample, step_of, shuffle_across_samples, layout_split,
                                          split_sizes, test_to_train_ratio, over_splits, paired_over_splits,
                                          pair_covariates, PairCovariates, permute_within_samples)  # noqa: F401
from dynheads_tl.analysis.cca import (LinearCCA, CCAFit, fit_cca, cca_summary, cca_in_sample, cca_held_out,
                                      cca_curve, DEPTH_DEGREE, depth_design, OTHER, frequent_levels,
                                      covariate_design, residualise, held_out_correlations, residualised_cca,
                                      generated_token_share, RESIDUALISED, READ_TOKENS_ONLY, WITHIN_SAMPLE,
                                      _canonical_correlations)  # noqa: F401
from dynheads_tl.analysis.probes import (ProbeConfig, asymmetric_loss, train_probe, ridge_probe, best_f1_threshold,
                                         classification_metrics, regression_metrics, step_rates,
                                         MIN_PROBE_TEST_SAMPLES, MAX_PROBE_TEST_FRACTION, probe_test_fraction,
                                         probe_splits, probe_table, LEAD_KS, lead_probe_table, lead_differences,
                                         PROBE_METRICS, probe_summary, SetProbe, predictor_differences)  # noqa: F401
from dynheads_tl.analysis.head_probe import HeadProbe, next_step_probe  # noqa: F401

__all__ = ["NIAH_LAYOUT_KEYS", "layout_groups", "sample_depth", "lagged_pairs", "split_by_sample", "step_of",
           "shuffle_across_samples", "layout_split", "split_sizes", "test_to_train_ratio", "over_splits",
           "paired_over_splits", "pair_covariates", "PairCovariates", "generated_token_share", "RESIDUALISED",
           "READ_TOKENS_ONLY", "LinearCCA", "CCAFit", "fit_cca", "cca_summary",
           "cca_in_sample", "cca_held_out", "cca_curve", "DEPTH_DEGREE", "depth_design", "OTHER", "frequent_levels",
           "covariate_design", "residualise", "held_out_correlations", "residualised_cca", "ProbeConfig",
           "asymmetric_loss", "train_probe", "ridge_probe", "best_f1_threshold", "classification_metrics",
           "regression_metrics", "step_rates", "MIN_PROBE_TEST_SAMPLES", "MAX_PROBE_TEST_FRACTION",
           "probe_test_fraction", "probe_splits", "probe_table", "LEAD_KS", "lead_probe_table", "lead_differences",
           "PROBE_METRICS", "probe_summary", "SetProbe", "predictor_differences", "HeadProbe", "next_step_probe"]
