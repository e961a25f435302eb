"""Claim 3, the hidden state predicts the retrieval heads (notebook 03): CCA curves (Fig 4, Fig 8) and probes
(Tables 2, 3) against step-aware baselines, over splits by layout.

The declared primary comparison (:data:`PRIMARY`; ``preregistration.yaml``): the NIAH MLP probe's F1 minus the
step-and-token prior's (the step index, the tokens read at n and n + k and the token generated at n + k) at the
first lag ahead (the smallest k ≥ 1 of ``lead_ks``), i.e. whether the hidden state predicts the next retrieval
heads beyond position and the next token; preregistration.yaml declares it against a prior that also knows the tokens read and the
token generated at n + k, and the status says so where only the step-aware prior was written. Every comparison a
verdict reads is a corrected resampled t-test over the splits: the primary tested alone at 0.05, the rest
Holm-adjusted over the family the verdict reads (SCIENCE 10-12). The index statuses are in ``rules.py``.
"""
from .config import *  # noqa: F401,F403 (the notebook's API: config, pipeline and report part)
from .pipeline import *  # noqa: F401,F403
from .figures import *  # noqa: F401,F403
from .report import *  # noqa: F401,F403
from .report import CLAIM  # noqa: F401
