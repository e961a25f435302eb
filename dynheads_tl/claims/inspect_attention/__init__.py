"""Notebook 00, inspect attention: one sample's every attention row at every decoding step, in circuitsvis and
seaborn views (a way in, no claim tested)."""
from dynheads_tl.claim import Claim

from .config import *  # noqa: F401,F403 (the notebook's API: config, pipeline and views)
from .config import InspectConfig
from .pipeline import *  # noqa: F401,F403
from .report import *  # noqa: F401,F403

CLAIM = Claim(notebook="00_inspect_attention", config=InspectConfig, title="Inspecting attention")
