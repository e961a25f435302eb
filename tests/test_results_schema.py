"""The results schema (dynheads_tl/results_schema.py): every committed results file follows it, the committed JSON
Schema is the models' own, a file that breaks it is refused naming the field, and verdicts.json has one writer."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dynheads_tl import verdicts
from dynheads_tl.claims import all_claims
from dynheads_tl.results_schema import SCHEMA_VERSION, json_schema

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = sorted((ROOT / "papers_figures").rglob(verdicts.FILE))


def test_the_committed_report_has_results_files():
    assert len(COMMITTED) >= 26


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: str(p.relative_to(ROOT / "papers_figures").parent))
def test_every_committed_results_file_validates(path):
    results = verdicts.load(path.parent)
    assert results is not None and results.schema_version == SCHEMA_VERSION
    claim = next(c for c in all_claims() if c.notebook == results.notebook)
    assert [row.item for row in results.items] == [item.item for item in claim.items]
    for row in results.items:
        assert row.rule_id == f"claims.{claim.name}.items.{row.item}"
    if claim.primary is not None and claim.primary.item is not None:
        # the row the primary decides carries it, and no other row does
        carriers = [row.item for row in results.items if row.primary is not None]
        assert carriers == [claim.primary.item]
        assert results.item(claim.primary.item).primary == results.primary


def test_the_committed_json_schema_is_the_models_own():
    committed = json.loads((ROOT / "docs" / "results.schema.json").read_text())
    assert committed == json_schema(), "regenerate it: python -m dynheads_tl.results_schema > docs/results.schema.json"


def test_a_results_file_that_breaks_the_schema_is_refused_naming_the_field(tmp_path):
    good = json.loads((ROOT / "papers_figures" / "default" / "smollm2-135m-instruct" / "02_irreplaceability"
                       / verdicts.FILE).read_text())
    bad = dict(good, items=[dict(good["items"][0], status="probably fine")] + good["items"][1:])
    (tmp_path / verdicts.FILE).write_text(json.dumps(bad))
    with pytest.raises(verdicts.ResultsError, match=r"items\.0\.status"):
        verdicts.load(tmp_path)
    (tmp_path / verdicts.FILE).write_text(json.dumps(dict(good, surprise=1)))
    with pytest.raises(verdicts.ResultsError, match="surprise"):
        verdicts.load(tmp_path)
    assert good["primary"]["observed"], "the committed claim 2 run states its primary"
    broken = json.loads(json.dumps(good))
    broken["primary"]["observed"]["interval"]["level"] = 95  # a percentage where a fraction belongs
    (tmp_path / verdicts.FILE).write_text(json.dumps(broken))
    with pytest.raises(verdicts.ResultsError, match=r"primary\.observed\.interval\.level"):
        verdicts.load(tmp_path)


def test_a_file_of_another_version_is_not_read_as_results(tmp_path):
    (tmp_path / verdicts.FILE).write_text(json.dumps({"format": 1, "items": []}))
    assert verdicts.load(tmp_path) is None and verdicts.read(tmp_path) is None


def test_recording_an_output_never_writes_the_results_file(tmp_path):
    """One writer: the notebook's cells record their outputs in a file of their own; only verdicts.write writes
    verdicts.json, and it carries the record over."""
    verdicts.record_output(tmp_path, "fig", "figure", "A figure", cell_source="a" * 64)
    assert not (tmp_path / verdicts.FILE).exists()
    assert verdicts.recorded_outputs(tmp_path) == {"fig": {"kind": "figure", "caption": "A figure",
                                                           "cell_source": "a" * 64}}
    (tmp_path / "fig.png").write_bytes(b"")
    claim = next(c for c in all_claims() if c.notebook == "02_irreplaceability")
    verdicts.write(claim, tmp_path)
    written = verdicts.load(tmp_path)
    assert written.outputs_recorded["fig"]["caption"] == "A figure"
    assert [o.stem for o in written.outputs] == ["fig"] and written.outputs[0].caption == "A figure"


def test_every_declared_primary_names_one_of_its_claims_rows():
    for claim in all_claims():
        if claim.primary is not None:
            assert claim.primary.item in {item.item for item in claim.items}, claim.notebook


def test_a_verdict_is_quoted_by_key_and_survives_pickling():
    import copy
    import pickle

    from dynheads_tl.claim import Verdict

    verdict = Verdict(("primary", "Primary comparison: **supported** (x)."), ("empty", "  "), ("other", "More."),
                      declared=("primary", "other", "absent this run"))
    assert verdict == "Primary comparison: **supported** (x). More." and verdict.keys == ["primary", "other"]
    assert verdict.quote("primary") == ["Primary comparison: supported (x)."]
    assert verdict.quote("absent this run") == [], "a declared part this run lacks quotes nothing"
    with pytest.raises(KeyError, match="primry"):
        verdict.quote("primary", "primry")  # a typo is an error, not a silently missing quote
    for again in (pickle.loads(pickle.dumps(verdict)), copy.deepcopy(verdict)):
        assert again == verdict and again.parts == verdict.parts and again.declared == verdict.declared
