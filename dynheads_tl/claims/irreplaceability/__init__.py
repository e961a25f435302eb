"""Claim 2, dynamic retrieval heads are irreplaceable (notebook 02): Fig 2/3/6/7 with size-matched controls, a
teacher-forced measure that one early error cannot derail, exact sign tests with Holm and one declared primary
comparison."""
from .config import *  # noqa: F401,F403 (the notebook's API: config, pipeline, comparisons and report part)
from .pipeline import *  # noqa: F401,F403
from .comparisons import *  # noqa: F401,F403
from .figures import *  # noqa: F401,F403
from .report import *  # noqa: F401,F403
from .report import CLAIM  # noqa: F401
