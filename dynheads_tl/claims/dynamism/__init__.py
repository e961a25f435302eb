"""Claim 1, retrieval heads are dynamic (notebook 01): Table 1, Fig 1, Fig 5, the size-aware overlap, soft
dynamism over settings, head-score files and a second (query-focused) static set.

Static heads come from a calibration split; the dynamic analysis uses different samples.
"""
from .config import *  # noqa: F401,F403 (the notebook's API: config, pipeline, settings and report part)
from .pipeline import *  # noqa: F401,F403
from .settings import *  # noqa: F401,F403
from .figures import *  # noqa: F401,F403
from .report import *  # noqa: F401,F403
from .report import CLAIM  # noqa: F401
