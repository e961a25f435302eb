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
under one detector against the other. The declared primary comparison (:data:`PRIMARY`, read from
preregistration.yaml): pooled, the context-only dynamic-head features against the Lookback ratio, tested alone
at 0.05. Holm over the secondary family, leaving out comparisons that cannot reach 0.05 (too few layouts differ,
Tarone) and settings too easy or too hard to evaluate (fewer than :data:`MIN_PER_CLASS` wrong or right answers,
SCIENCE 12).

Labels: an answer is wrong when the UUID is not reproduced exactly (NIAH) or its token F1 is below 0.5
(HotpotQA format). Per-token labels are not defined here.
"""
from .config import *  # noqa: F401,F403 (the notebook's API: config, features, pipeline and report part)
from .features import *  # noqa: F401,F403
from .pipeline import *  # noqa: F401,F403
from .figures import *  # noqa: F401,F403
from .report import *  # noqa: F401,F403
from .report import CLAIM  # noqa: F401
from dynheads_tl.analysis.classification import roc_points  # noqa: F401 (notebook 05 draws its ROC curves)
