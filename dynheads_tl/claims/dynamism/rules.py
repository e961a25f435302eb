"""Claim 1's index statuses: the rule that preregistration.yaml declares for Table 1 (rotation against the paper's
range over its models, and the share of activations outside S_20 against both static sets), and Beyond 1's
description of both static sets, with thresholds read from the file.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from dynheads_tl import preregistration
from dynheads_tl.analysis.scoring import WU_UNFILTERED
from dynheads_tl.claim import Status, ci_text, sidecar

__all__ = ["niah_headroom_sentence", "outside_present", "table1_rule"]


def _top20(folder: Path) -> pd.DataFrame:
    frame = pd.read_csv(folder / "size_aware_overlap.csv")
    return frame[(frame["task"] == "niah") & (frame["static_k"] == 20)].set_index("metric")


def _outside_shares(folder: Path, k: int = 20) -> dict[str, pd.Series]:
    """The share of Eq. 1 activations outside the static top-``k`` (NIAH, bootstrap 95% over layouts) against each
    static set the run wrote: Wu et al.'s and the query-focused one (``static_baselines_niah.csv``), or Wu's alone
    (``size_aware_overlap.csv``, runs before the second baseline). A set the run did not write is absent."""
    out = {}
    both = folder / "static_baselines_niah.csv"
    if both.exists():
        frame = pd.read_csv(both)
        for baseline in ("wu", "query_focused"):
            part = frame[(frame["baseline"] == baseline) & (frame["static_k"] == k) & (frame["metric"] == "share_outside_static")]
            if len(part):
                out[baseline] = part.iloc[0]
    if "wu" not in out and (folder / "size_aware_overlap.csv").exists():
        part = _top20(folder)
        if "share_outside_static" in part.index:
            out["wu"] = part.loc["share_outside_static"]
    return out


def outside_present(row: pd.Series | None, sesoi: float) -> str:
    """"present" when the share's lower bound reaches ``sesoi``, "absent" when its upper bound stays below it,
    "undetermined" between, "missing" when the run did not write it."""
    if row is None:
        return "missing"
    return "present" if row["low"] >= sesoi else "absent" if row["high"] < sesoi else "undetermined"


def table1_rule(adjacent: pd.Series, shares: dict[str, pd.Series], rule: dict) -> tuple[str, dict]:
    """The declared Table 1 rule (preregistration.yaml) on the adjacent-step Jaccard's interval and the share of
    activations outside S_20 against both static sets. Rotation as in the paper: the Jaccard's upper bound <= the
    top of the paper's range over its models + ``rotation_margin``; none: its lower bound above that. In order:
    absent in this setting (the share outside absent against both sets: D_t stays inside S_20); reproduced (rotation
    and the share present against both); weaker (rotation and present against exactly one, or no rotation as in
    the paper but present against both); not reproduced (no rotation and present against neither); undetermined."""
    top = float(rule["paper_range_adjacent_jaccard"][1]) + float(rule["rotation_margin"])
    rotation = "as in the paper" if adjacent["high"] <= top else "less than the paper" if adjacent["low"] > top else "undetermined"
    sesoi = float(rule["outside_sesoi"])
    reading = {b: outside_present(shares.get(b), sesoi) for b in ("wu", "query_focused")}
    present = sum(r == "present" for r in reading.values())
    if all(r == "absent" for r in reading.values()):
        verdict = "absent in this setting"
    elif rotation == "as in the paper" and present == 2:
        verdict = "reproduced"
    elif (rotation == "as in the paper" and present == 1) or (rotation != "as in the paper" and present == 2):
        verdict = "weaker"
    elif rotation == "less than the paper" and not present and "missing" not in reading.values():
        verdict = "not reproduced"
    else:
        verdict = "undetermined"
    return verdict, {"rotation": rotation, "outside": reading, "top": top}


def niah_headroom_sentence(frame: pd.DataFrame) -> str:
    """The NIAH task's headroom and the filter of Wu et al.'s static scores, from :func:`~.pipeline.niah_headroom`'s
    table: the first seed's accuracy with its Wilson 95% interval over its layouts, the later seeds' counts (the same
    layouts, other UUIDs), and the seeds whose static scores are unfiltered because no calibration answer passed
    Wu's ROUGE filter (preregistration.yaml, deviation of 2026-12-06)."""
    first = frame.iloc[0]
    text = (f"NIAH accuracy {int(first.correct)}/{int(first.n_analysis)} "
            f"{ci_text(first.accuracy, first.low, first.high)} (seed {int(first.seed)}, Wilson 95% over its layouts)")
    rest = frame.iloc[1:]
    if len(rest):
        text += ("; other seeds (the same layouts, other UUIDs) "
                 + ", ".join(f"{int(r.correct)}/{int(r.n_analysis)}" for r in rest.itertuples()))
    passed = frame["n_passed"].fillna(-1).astype(int)
    if (passed >= 0).all():
        text += ("; calibration answers passing Wu's ROUGE filter "
                 + ", ".join(f"{k}/{int(n)}" for k, n in zip(passed, frame["n_calibration"])))
    unfiltered = frame[frame["static_filter"].astype(str) == WU_UNFILTERED]
    if len(unfiltered):
        seeds = ", ".join(str(int(x)) for x in unfiltered["seed"])
        text += (f"; no answer passed it on seed{'s' if len(unfiltered) > 1 else ''} {seeds}, whose Wu static scores "
                 "are unfiltered (every calibration step that copies a needle token counts)")
    return text


def _table1_status(folder: Path) -> Status:
    """The declared Table 1 rule (preregistration.yaml; :func:`table1_rule`): the adjacent-step Jaccard against the
    paper's range over its models (``table1_intervals.csv``) and the share of activations outside S_20 against
    both static sets (:func:`_outside_shares`); a static set the run did not write is "missing"."""
    rule = preregistration.item_rule("dynamism", "Table 1")
    ci = pd.read_csv(folder / "table1_intervals.csv")
    row = ci[(ci["task"] == "niah") & (ci["metric"] == "jaccard_adjacent")].iloc[0]
    shares = _outside_shares(folder)
    verdict, read = table1_rule(row, shares, rule)
    low, high = rule["paper_range_adjacent_jaccard"]
    units = (f"{int(row.n_layouts)} layouts ({int(row.n_samples)} samples)" if "n_layouts" in row and row.n_layouts == row.n_layouts
             else f"{int(row.n_samples)} samples")
    names = {"wu": "Wu et al.'s", "query_focused": "the query-focused"}
    outside = "; ".join(f"outside {names[b]} S_20 {ci_text(shares[b]['value'], shares[b]['low'], shares[b]['high'], 3)}"
                        if b in shares else f"outside {names[b]} S_20: missing" for b in names)
    headline = (f"adjacent-step Jaccard {ci_text(row.value, row.low, row.high)} (paper {low:.2f}–{high:.2f} over its "
                f"models); {outside}; n = {units}, bootstrap 95% over layouts")
    if (folder / "niah_headroom.csv").exists():  # runs before the headroom table do not have it
        headline += "; " + niah_headroom_sentence(pd.read_csv(folder / "niah_headroom.csv"))
    why = (f"rotation {read['rotation']} (upper bound against {read['top']:.3f}); share outside: Wu "
           f"{read['outside']['wu']}, query-focused {read['outside']['query_focused']} (smallest effect of interest "
           f"{rule['outside_sesoi']:g}); Wu's static score averages the same Eq. 1 event over calibration, so its "
           "share is close to built in")
    if verdict != "reproduced":
        run = sidecar(folder, "table1_intervals") or sidecar(folder, "table1_niah")
        where = f"{run.get('model', 'this model')} at {run.get('context_tokens', '?')} tokens"
        why += (f". What would settle it: whether D_t leaves a static set whose calibration never saw the analysis "
                f"prompts, on the confirmatory model and at 1k–8k tokens of real prose ({where} here, "
                f"{units})")
        why += "."
    return Status(verdict, headline, why)


def _size_aware_status(folder: Path) -> Status:
    """Descriptive: the share of Eq. 1 activations outside the static top-20 against both static sets (Wu et al.'s
    and the query-focused one, bootstrap 95% over layouts), each with the Jaccard's size bound."""
    part = _top20(folder)
    shares = _outside_shares(folder)
    bounds = {}
    both = folder / "static_baselines_niah.csv"
    if both.exists():
        frame = pd.read_csv(both)
        for baseline in ("wu", "query_focused"):
            hit = frame[(frame["baseline"] == baseline) & (frame["static_k"] == 20) & (frame["metric"] == "jaccard_over_bound")]
            if len(hit):
                bounds[baseline] = hit.iloc[0]
    if "wu" not in bounds and "jaccard_over_bound" in part.index:
        bounds["wu"] = part.loc["jaccard_over_bound"]
    names = {"wu": "Wu et al.'s", "query_focused": "query-focused"}
    cells = []
    for b, name in names.items():
        if b not in shares:
            cells.append(f"{name} top-20: missing")
            continue
        r = shares[b]
        text = f"{name} top-20: outside {ci_text(r['value'], r['low'], r['high'], 3)}"
        if b in bounds:
            text += f", Jaccard {ci_text(bounds[b]['value'], bounds[b]['low'], bounds[b]['high'], 3)} of its size bound"
        cells.append(text)
    row = part.loc["share_outside_static"]
    units = (f"{int(row.n_layouts)} layouts ({int(row.n_samples)} samples)" if "n_layouts" in row
             else f"{int(row.n_samples)} samples")
    return Status("descriptive", "NIAH share of Eq. 1 activations outside the static set: " + "; ".join(cells)
                  + f"; n = {units}")
