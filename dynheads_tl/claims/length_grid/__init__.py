"""Notebook 07: claims 1 and 2 on a length x depth NIAH grid on real prose, and whether they change with length.

The grid (lengths x depths x runs per cell) is traced once (claim 1's Eq. 1 sets per answer) and run under claim
2's two-pass masking (D_t, its size-matched static and random controls, and the fair D_{t-1} pair where the
condition registry has it), generated and teacher-forced. Per length: Table 1's quantities and the share of
activations outside Wu's and the query-focused static top-20 (BCa over layouts), Fig 1, and Fig 2 as a length x
depth heatmap per condition. Across lengths: the three slopes the pre-registration file declares (``lengths:``),
BCa over layouts resampled within each length, Holm over the three.

Presets (docs/notebooks.md gives their times, estimated until measured on a quiet hour): default 1k and 2k tokens x
depths 0, 0.25, 0.5, 0.75, 1 x one run per cell (sized for the whole default report to fit in an hour on a 2-core
CPU); ``long`` the pre-registered 1k, 2k, 4k, 8k, and 16k and 32k where the model's window allows, x 0, 0.25, 0.5, 0.75,
1 x two runs; ``smoke`` a tiny grid for tests.
"""
from .config import *  # noqa: F401,F403 (the notebook's API: config, pipeline, figures, trend test and report part)
from .pipeline import *  # noqa: F401,F403
from .figures import *  # noqa: F401,F403
from .trend import *  # noqa: F401,F403
from .report import *  # noqa: F401,F403
from .window import *  # noqa: F401,F403
from .bounded import *  # noqa: F401,F403
from .size_axis import *  # noqa: F401,F403
from .scale import *  # noqa: F401,F403
from .report import CLAIM  # noqa: F401
