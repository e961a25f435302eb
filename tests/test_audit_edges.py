"""Issue #65's smaller edges outside the index (tests/test_index_edges.py has the index's): a correlation's interval
that passes 1, a type error's grammar, a NIAH setting quoted as written, and a silent model conversion.

Each is unit-sized: no model runs (the setting checks read the embedded model's header and tokenizer, as the configs
do before any model work), and the conversion runs on a fake GGUF loader."""
from __future__ import annotations

import contextlib
import re

import numpy as np
import pandas as pd
import pytest

from dynheads_tl.analysis.correlation import over_splits, probe_summary
from dynheads_tl.analysis.statistics import CORRELATION_RANGE, resampled_t_interval, within


# --- a correlation's interval stays within [-1, 1] ------------------------------------------------------------------

# Five splits of a first canonical correlation near 1, as a smoke run has them: the mean's t-interval passes 1.
NEAR_ONE = [0.90, 0.99, 1.0, 0.975, 0.98]


def _splits(values, column="first"):
    return pd.DataFrame({"k": 1, "control": "held-out", "split_seed": range(len(values)), column: values,
                         "test_samples": 6, "test_clusters": 3, "train_clusters": 7, "n_samples": 20,
                         "n_clusters": 10})


def test_a_correlations_interval_over_splits_stays_within_minus_one_and_one():
    plain = resampled_t_interval(NEAR_ONE, 3 / 7)
    assert plain.high > 1, "the symmetric t-interval itself passes 1 (the issue's 0.969 [0.900, 1.039])"
    row = over_splits(_splits(NEAR_ONE), ("first",)).iloc[0]
    assert row["first"] == pytest.approx(np.mean(NEAR_ONE))
    assert row["first_high"] == 1.0 and row["first_low"] == pytest.approx(plain.low), \
        "the interval intersected with [-1, 1]: the part past 1 holds no possible value, the rest is unchanged"
    low = over_splits(_splits([-v for v in NEAR_ONE]), ("first",)).iloc[0]
    assert low["first_low"] == -1.0 and low["first_high"] == pytest.approx(-plain.low)
    middle = [0.4, 0.5, 0.6, 0.45, 0.55]
    inside, t = over_splits(_splits(middle), ("first",)).iloc[0], resampled_t_interval(middle, 3 / 7)
    assert (inside["first_low"], inside["first_high"]) == pytest.approx((t.low, t.high)), "away from the ends, as before"


def test_the_bounds_move_only_the_bounds_and_keep_nan():
    interval = resampled_t_interval(NEAR_ONE, 3 / 7, bounds=CORRELATION_RANGE)
    assert interval.estimate == pytest.approx(np.mean(NEAR_ONE)) and interval.high == 1.0 and interval.n == 5
    single = within(resampled_t_interval([0.99], 0.5), *CORRELATION_RANGE)
    assert single.estimate == 0.99 and single.low != single.low and single.high != single.high, "one split: no interval"


def test_a_probe_metrics_interval_stays_within_the_metrics_range():
    raw = pd.DataFrame({"k": 0, "predictor": "MLP probe", "split_seed": range(5), "f1": [0.5] * 5,
                        "precision": [0.5] * 5, "recall": NEAR_ONE, "auprc": [0.5] * 5,
                        "test_samples": 6, "test_clusters": 3, "train_clusters": 7, "n_samples": 20, "n_clusters": 10})
    row = probe_summary(raw, "classification").iloc[0]
    assert row["recall_high"] == 1.0 and row["recall"] == pytest.approx(np.mean(NEAR_ONE))


# --- error messages -----------------------------------------------------------------------------------------------

def test_a_type_error_names_the_type_with_its_article():
    from dynheads_tl.claims.dynamism.config import DynamismConfig

    with pytest.raises(ValueError, match=re.escape("Parameter 'n_analysis' should be an integer (like 20), got 2.5.")):
        DynamismConfig(n_analysis=2.5)
    flag = "Parameter 'use_cache' should be True or False (like True), got 1."
    with pytest.raises(ValueError, match=re.escape(flag)):
        DynamismConfig(use_cache=1)
    with pytest.raises(ValueError, match=re.escape("Parameter 'haystack' should be a string (like 'filler'), got 3.")):
        DynamismConfig(haystack=3)


def test_a_niah_setting_is_quoted_as_the_user_wrote_it():
    from dynheads_tl.claims.dynamism.config import DynamismConfig
    from dynheads_tl.claims.error_signal.config import ErrorSignalConfig

    for config in (DynamismConfig(niah_settings=["filler:500", "prose:9000"]),
                   ErrorSignalConfig(niah_settings=["prose:9000"])):
        with pytest.raises(ValueError) as error:
            config.check_inputs()
        assert str(error.value) == (
            "Parameter 'niah_settings' holds 'prose:9000': 9,000 tokens of context plus about 128 prompt-template "
            "tokens and max_new_tokens=40 exceed the model's context window of 8,192 tokens; use at most 8,024 "
            "tokens of context ('prose:8024').")
    with pytest.raises(ValueError, match=re.escape("Parameter 'niah_settings' holds 'prose:20', a NIAH context of 20 "
                                                   "tokens, but the needle sentence alone takes")):
        DynamismConfig(niah_settings=["filler:500", "prose:20"]).check_inputs()
    with pytest.raises(ValueError, match=re.escape("Parameter 'context_tokens' asks for a NIAH context of 20 tokens")):
        DynamismConfig(context_tokens=20).check_inputs()  # a number is still quoted as the number


# --- the embedded model's conversion says what it is doing -----------------------------------------------------------

def test_converting_an_embedded_model_says_what_it_is_doing_on_stderr(tmp_path, monkeypatch, capsys):
    """``dynheads install-model --name gemma-3-270m`` reads and de-quantises a GGUF for about two minutes; it says so
    before, and says where it saved the result after (here on a fake loader: no weights are read)."""
    import torch
    import transformers

    from dynheads_tl.engine import models

    monkeypatch.setenv("DYNHEADS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("DYNHEADS_PROGRESS", "bar")  # as in a terminal
    gguf = tmp_path / "parts" / "gemma-3-270m-q4_k_m.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(bytes(2_000_000))

    @contextlib.contextmanager
    def joined(name):
        yield gguf

    class Tokenizer:
        chat_template = None

        def save_pretrained(self, folder):
            (folder / "tokenizer.json").write_text("{}")

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(2, 2)
            self.config = transformers.PretrainedConfig(tie_word_embeddings=False)

    monkeypatch.setattr(models, "embedded_gguf", joined)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: Tokenizer())
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: Model())
    folder = models.embedded_model_dir("gemma-3-270m", rebuild=True)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 4, lines
    assert lines[0] == "Checking and joining the GGUF parts of gemma-3-270m from their packages into one file…"
    assert lines[1] == ("Converting gemma-3-270m from its 2 MB Q4_K_M GGUF into float32 Hugging Face files, once per "
                        "cache: reading and de-quantising the weights can take minutes on a CPU…")
    assert lines[2] == "Writing the converted weights, config and tokenizer of gemma-3-270m…"
    assert re.fullmatch(rf"Saved the converted gemma-3-270m in {re.escape(str(folder))} \(\d+ s\)\.", lines[3])
    assert (folder / "model.safetensors").exists()


# --- papermill's cell bar -----------------------------------------------------------------------------------------

def test_the_cell_bar_shows_cells_and_time_spent_but_no_rate_or_eta():
    """A report's cells take seconds to an hour each, so tqdm's rate and ETA over cells mean nothing: the runner gives
    papermill a bar of the cell count and the time spent (the runner's own line estimates what is left)."""
    import io

    from tqdm import tqdm

    from dynheads_tl.report.runner import CELL_BAR

    out = io.StringIO()
    bar = tqdm(total=12, unit="cell", file=out, **CELL_BAR)
    bar.update(3)
    bar.close()
    shown = out.getvalue().replace("\r", "\n").strip().splitlines()[-1]
    assert re.fullmatch(r"cells: 3/12 \[\d\d:\d\d so far\]", shown), shown
    assert not re.search(r"\{(remaining|rate|rate_fmt|rate_inv)[^}]*\}", CELL_BAR["bar_format"])


def test_the_smoke_reports_time_is_the_measured_one():
    """The README and `--preset`'s help give the smoke report's measured time (docs/benchmarks.md), not "a few
    minutes", which a user on a busy machine found to be over an hour."""
    from pathlib import Path

    from dynheads_tl.report import cli

    root = Path(__file__).resolve().parent.parent
    readme, benchmarks = (root / "README.md").read_text(), (root / "docs" / "benchmarks.md").read_text()
    measured = re.search(r"`dynheads report --preset smoke` \(SmolLM2, every notebook\) \| (\d+)\.\d min", benchmarks)
    assert measured, "docs/benchmarks.md records the smoke report's time"
    minutes = measured.group(1)
    assert f"{minutes} min idle for SmolLM2" in readme and "a few minutes" not in readme
    with pytest.raises(SystemExit), contextlib.redirect_stdout(__import__("io").StringIO()) as out:
        cli.main(["report", "--help"])
    text = " ".join(out.getvalue().split())
    assert f"{minutes} min on an idle 2-core machine" in text and "a few minutes" not in text
