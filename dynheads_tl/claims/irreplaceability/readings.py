"""Claim 2's readings of one comparison row (:func:`~.comparisons.comparison_table`), which its verdict sentences
share: what more data would do, the short reading (hurts more / less, cannot distinguish, ...), and one declared
comparison in one computed sentence.
"""
from __future__ import annotations

import pandas as pd

from dynheads_tl.analysis.statistics import detectable_words, format_interval

from .comparisons import DROP_METRICS, _row
from .config import ALPHA, COMPARISONS, MIN_SAMPLES_TO_COMPARE


def _resolve_text(row) -> str:
    """What more data would do: about how many samples would put the observed difference's interval away from 0
    (when that is more than the design has), or, when the interval already is, that the corrected exact test is
    what does not reach the level."""
    need = row["n_to_resolve"]
    if need == need and need and int(need) > int(row["n"]):
        return f"; about {int(need)} samples would resolve the observed one"
    if row["low"] > 0 or row["high"] < 0:
        return f"; the interval excludes 0, but the exact test (corrected) does not reach {ALPHA}"
    return ""


def _reading(row) -> str:
    """A short reading of one comparison row: D_t hurts more / less, cannot distinguish, too few samples, cannot be
    tested, or no headroom."""
    if row is None or row["n"] < MIN_SAMPLES_TO_COMPARE:
        return "too few samples"
    if not row["headroom"]:
        return "no headroom"
    if not row["testable"] and row["a_worse"] + row["b_worse"] > 0:
        return "cannot be tested"
    if not row["separated"]:
        return "cannot distinguish"
    hurts_more = (row["difference"] > 0) if row["metric"] in DROP_METRICS else (row["difference"] < 0)
    return "D_t hurts more" if hurts_more else "D_t hurts less"


def _declared_verdict(comparisons: pd.DataFrame, declared: tuple, lead: str, judge: bool = True,
                      task_label: str | None = None) -> str:
    """One declared comparison ``(task, a, b, metric)`` in one computed sentence opened by ``lead``: reproduced
    when masking a raises the gold token's teacher-forced log-probability drop more than masking b (separated: the
    row's test at its level and the paired 95% interval above 0); not reproduced when b hurts more; otherwise
    undetermined, with the smallest effect the design could detect. With ``judge`` False (a secondary comparison,
    which decides no status) the sentence gives the reading without the status word. ``task_label`` names the task
    in the sentence (default: NIAH, or the task's name)."""
    task, a, b, metric = declared
    name_a, name_b = next((na, nb) for ca, cb, na, nb in COMPARISONS if (ca, cb) == (a, b))
    short_a, short_b = name_a.removeprefix("masking "), name_b.removeprefix("masking ")
    steps = ", steps t ≥ 1" if metric == "tf_drop_t1" else ""
    label = task_label or (task.upper() if task == "niah" else task)
    lead = f"{lead} ({label}, {name_a} against {name_b}, teacher-forced{steps}): "
    row = _row(comparisons, task, a, b, metric)
    if row is None:
        return f"{lead}not in this run (its files predate the condition; the next run computes it)."
    numbers = (f"{short_a} − {short_b}, gold log-probability drop "
               f"{format_interval(row['difference'], row['low'], row['high'], 3, signed=True)} nats per step, paired "
               f"over n = {int(row['n'])} samples; {short_a} hurt more on {int(row['a_worse'])}, {short_b} on "
               f"{int(row['b_worse'])}")
    test = "sign test" if row["primary"] else "Holm-adjusted sign test"
    reading = _reading(row)
    if not judge:
        word = {"D_t hurts more": f"{short_a} hurts more", "D_t hurts less": f"{short_b} hurt more",
                "cannot be tested": "too few samples differ for a sign test"}.get(reading, "the two cannot be told apart")
        return f"{lead}{word} ({numbers}; {test} p = {row['p_adjusted']:.3g})."
    if reading == "D_t hurts more":
        return f"{lead}**reproduced**: {short_a} hurts more ({numbers}; {test} p = {row['p_adjusted']:.3g})."
    if reading == "D_t hurts less":
        return f"{lead}**not reproduced**: {short_b} hurt more ({numbers}; {test} p = {row['p_adjusted']:.3g})."
    if reading == "cannot be tested":
        return f"{lead}**undetermined**: too few samples differ for a sign test to reach {ALPHA} ({numbers})."
    return (f"{lead}**undetermined**: the two cannot be told apart ({numbers}; sign test p = {row['sign_p']:.3g}); "
            f"{detectable_words(row['half_width'], what='differences (nats)', n=int(row['n']))}{_resolve_text(row)}.")
