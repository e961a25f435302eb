"""The dynamic-RAG case study (notebook 04, Table 4): in-context RAG guided by predicted retrieval heads.

The RAG loop itself (visibility masks, the RIND trigger, retrieval, retraction, head strategies) is the protocol
:mod:`dynheads_tl.protocols.rag`; this claim is the notebook's config, the probe and static scores it trains on
claim 1's HotpotQA splits (:mod:`dynheads_tl.corpus`), its evaluation questions, Table 4 and its verdict.
"""
from .config import *  # noqa: F401,F403 (the notebook's API: config, pipeline and report part)
from .pipeline import *  # noqa: F401,F403
from .figures import *  # noqa: F401,F403
from .report import *  # noqa: F401,F403
from .report import CLAIM  # noqa: F401
