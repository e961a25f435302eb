"""The pre-registration file parses, declares every claim and every index row, and uses the claims' status words."""
from __future__ import annotations

import pytest

from dynheads_tl import preregistration
from dynheads_tl.claim import BEYOND_STATUSES, PAPER_STATUSES
from dynheads_tl.claims import all_claims

pytestmark = pytest.mark.unit


def test_every_claim_and_every_index_row_is_declared():
    declared = preregistration.load()["claims"]
    for claim in all_claims():
        assert claim.name in declared, f"{claim.name} has no entry in preregistration.yaml"
        assert declared[claim.name]["notebook"] == claim.notebook
        for item in claim.items:
            rule = preregistration.item_rule(claim.name, item.item)
            assert rule.get("rule"), f"{claim.name} {item.item}: no rule text"


def test_primaries_name_every_field_and_a_positive_sesoi():
    for name, entry in preregistration.load()["claims"].items():
        declared = entry.get("primary")
        if declared is None:
            continue
        assert float(declared["sesoi"]) > 0, name
        assert declared["id"] and declared["measure"] and declared["test"], name


def test_status_vocabulary_matches_the_claims():
    statuses = preregistration.load()["statuses"]
    assert tuple(statuses["paper"]) == PAPER_STATUSES
    assert tuple(statuses["beyond"]) == BEYOND_STATUSES


def test_sha256_is_of_the_file_bytes():
    import hashlib

    assert preregistration.sha256() == hashlib.sha256(preregistration.path().read_bytes()).hexdigest()
    assert preregistration.alpha() == 0.05


def test_a_missing_primary_field_is_refused_with_a_sentence(tmp_path, monkeypatch):
    bad = tmp_path / "preregistration.yaml"
    bad.write_text("claims:\n  x:\n    primary: {id: a, measure: b}\n")
    monkeypatch.setattr(preregistration, "_CANDIDATES", (bad,))
    with pytest.raises(preregistration.PreregistrationError, match="primary without"):
        preregistration.load()


def test_unknown_claim_and_item_are_refused():
    with pytest.raises(preregistration.PreregistrationError, match="no claim"):
        preregistration.claim("no_such_claim")
    with pytest.raises(preregistration.PreregistrationError, match="no rule"):
        preregistration.item_rule("dynamism", "Fig 99")
