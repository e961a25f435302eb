"""Beyond the paper (notebook 06): keep the full KV cache only for the heads that will retrieve.

The protocol is :mod:`dynheads_tl.protocols.retention`; this module is the notebook's config, its training data
(static scores and the probe, from notebook 01's traces of the same setting), the runs (free generation and
teacher forcing on the needle sentence, cached per sample) and the tables, figure and verdict.
"""
from .config import *  # noqa: F401,F403 (the notebook's API: config, pipeline, comparisons and report part)
from .pipeline import *  # noqa: F401,F403
from .comparisons import *  # noqa: F401,F403
from .figures import *  # noqa: F401,F403
from .report import *  # noqa: F401,F403
from .report import CLAIM  # noqa: F401
