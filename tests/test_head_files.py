"""Head-score files in and out (issue #31): Wu et al.'s ``head_score`` JSON and a layer,head,score CSV as the static
set, refused for another model's shape; the suite's scores written back in Wu's format with provenance."""
from __future__ import annotations

import json

import pytest
import torch

from dynheads_tl import Trace
from dynheads_tl.analysis.head_files import (check_head_file, provenance_path, read_head_scores, scores_digest,
                                             wu_json, write_head_scores)
from dynheads_tl.analysis.scoring import static_retrieval_per_sample, static_retrieval_scores
from dynheads_tl.engine.preflight import model_head_shape
from factories import make_trace

EMBEDDED = "smollm2-135m-instruct"


def _write_wu(path, per_head: dict[str, list[float]]):
    path.write_text(json.dumps(per_head))
    return path


def test_round_trip_of_per_sample_scores(tmp_path):
    per_sample = torch.rand(4, 3, 5, dtype=torch.float64)
    info = {"model": "tiny", "n": 4}
    path = write_head_scores(tmp_path / "heads.json", list(per_sample), info)
    # Wu's layout: one "layer-head" key per head, its list one entry per sample, in sample order
    data = json.loads(path.read_text())
    assert list(data)[:6] == ["0-0", "0-1", "0-2", "0-3", "0-4", "1-0"]
    assert data["2-3"] == per_sample[:, 2, 3].tolist()
    # JSON floats round-trip exactly, so the means are the same float64 values
    torch.testing.assert_close(read_head_scores(path, (3, 5)), per_sample.mean(0), rtol=0, atol=1e-15)
    assert json.loads(provenance_path(path).read_text()) == info
    # A rewrite overwrites (Wu's script appends a rerun's samples)
    write_head_scores(path, per_sample[0], info)
    assert all(len(v) == 1 for v in json.loads(path.read_text()).values())


def test_csv_and_wu_json_give_the_same_scores(tmp_path):
    scores = torch.arange(6, dtype=torch.float64).reshape(2, 3) / 7
    csv_path = tmp_path / "heads.csv"
    rows = ["head,layer,score,extra"] + [f"{h},{l},{scores[l, h].item()!r},x" for l in range(2) for h in range(3)]
    csv_path.write_text("\n".join([rows[0], *reversed(rows[1:])]) + "\n")  # rows in any order, extra columns
    json_path = tmp_path / "heads.json"
    json_path.write_text(wu_json(scores))
    torch.testing.assert_close(read_head_scores(csv_path), scores, rtol=0, atol=0)
    torch.testing.assert_close(read_head_scores(json_path), scores, rtol=0, atol=0)


def test_suite_scores_written_and_read_back_give_the_same_static_set(tmp_path):
    # Hand-built traces of 2 layers x 2 heads: the per-sample terms, their file and the static score agree.
    prompt = torch.tensor([10, 11, 30, 31, 12])
    traces = [make_trace([30, 31], pos, prompt_ids=prompt, evidence_spans=[(2, 4)], answers=["abc"], response="abc")
              for pos in ([[[2, 0], [0, 3]], [[3, 0], [0, 0]]], [[[0, 0], [2, 0]], [[0, 3], [0, 0]]])]
    per_sample = static_retrieval_per_sample(traces, rouge_filter=0.5)
    path = write_head_scores(tmp_path / "s.json", per_sample, {})
    assert json.loads(path.read_text())["0-0"] == [1.0, 0.0]
    torch.testing.assert_close(read_head_scores(path).float(), static_retrieval_scores(traces, rouge_filter=0.5))


@pytest.mark.parametrize("text, message", [
    ('{"0-0": [1.0], "x": [2.0]}', "keys must be"),
    ('{"0-0": [1.0], "0-1": []}', "non-empty list"),
    ('{"0-0": [1.0], "1-1": [1.0]}', "every head must have a score"),
    ('[1, 2]', "not an object"),
    ('{"0-0": [1.0', "not Wu et al.'s JSON"),
])
def test_malformed_wu_files_are_refused_with_a_sentence(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        read_head_scores(path)


def test_a_file_from_another_model_is_refused_before_any_model_work(tmp_path):
    """A 32 x 32 file (Llama-2-7B's shape, as Wu's shipped files have) against the embedded 30 x 9 model: the
    config refuses it when built, reading only the model's config file."""
    from dynheads_tl.claims.dynamism import DynamismConfig
    from dynheads_tl.claims.irreplaceability import IrreplaceabilityConfig
    from dynheads_tl.claims.kv_retention import RetentionConfig

    assert model_head_shape(EMBEDDED) == (30, 9)
    other = _write_wu(tmp_path / "Llama-2-7b.json", {f"{l}-{h}": [0.1] for l in range(32) for h in range(32)})
    for config in (DynamismConfig, IrreplaceabilityConfig, RetentionConfig):
        with pytest.raises(ValueError, match=r"static_source.*32 layers x 32 heads.*30 x 9.*another model"):
            config.from_params({"static_source": str(other)})
    with pytest.raises(ValueError, match="does not exist"):
        DynamismConfig.from_params({"static_source": str(tmp_path / "missing.json")})
    with pytest.raises(ValueError, match=".json .*or .csv"):
        check_head_file(str(tmp_path / "heads.txt"), EMBEDDED)


def test_a_matching_file_becomes_the_claims_static_set(tmp_path):
    from dynheads_tl.claims.dynamism import DynamismConfig, analyse_task

    scores = torch.rand(30, 9, generator=torch.Generator().manual_seed(3))
    path = tmp_path / "ours.json"
    path.write_text(wu_json(scores))
    config = DynamismConfig.from_params({"static_source": str(path)})
    torch.testing.assert_close(config.static_override(config.model), scores)
    # One hand-built analysis trace; no calibration answer passes the filter, so only the file can give a static set.
    trace = make_trace([5], layers=30, heads=9, prompt_ids=[5, 6], evidence_spans=[(0, 1)], answers=["abc"],
                       response="abc")
    failed = Trace(**{**trace.__dict__, "response": "no idea"})
    result = analyse_task("niah", [failed], [trace], config, seed=0)
    torch.testing.assert_close(result.static_scores, scores)
    assert result.static_mask(20).sum() == 20 and bool(result.static_mask(20)[scores == scores.max()].all())
    assert scores_digest(scores) != scores_digest(scores.flip(0))
