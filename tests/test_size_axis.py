"""The size axis across models (preregistration.yaml scale: and its deviation of 2026-12-06): the declared reading
across sizes on hand-built rows with a known answer, what each reading means, the claims' sentences, and the scale
report's figure and index read from the models' size_axis.csv files."""
from __future__ import annotations

import pandas as pd
import pytest

from dynheads_tl.claims.length_grid import scale as size_axis
from dynheads_tl.report.index import build_index

pytestmark = pytest.mark.unit


def _rows(points, status="undetermined"):
    """One row per model in parameter order: (estimate, half-width of the 95% interval)."""
    out = []
    for i, (estimate, half) in enumerate(points):
        out.append({"model": f"m{i}", "parameters": 10 ** (8 + i), "estimate": estimate, "low": estimate - half,
                    "high": estimate + half, "low90": estimate - 0.84 * half, "high90": estimate + 0.84 * half,
                    "status": status})
    return pd.DataFrame(out)


@pytest.mark.parametrize("points, direction, expected", [
    ([(0.0, 0.05), (0.1, 0.05), (0.2, 0.05), (0.4, 0.05)], "positive", "grows with size"),
    ([(0.4, 0.05), (0.2, 0.05), (0.1, 0.05), (0.0, 0.05)], "positive", "shrinks with size"),
    # the paper's direction is lower for the Jaccard over its bound: falling values grow the effect
    ([(0.99, 0.01), (0.9, 0.02), (0.8, 0.02), (0.7, 0.02)], "lower", "grows with size"),
    # ends apart but a middle step reverses beyond its intervals: not a trend
    ([(0.0, 0.05), (0.5, 0.05), (0.1, 0.05), (0.4, 0.05)], "positive", "undetermined"),
    # every neighbouring difference's 90% interval inside +-0.1
    ([(0.0, 0.02), (0.01, 0.02), (0.0, 0.02), (0.02, 0.02)], "positive", "flat across size"),
    # the same estimates with wide intervals cannot be called flat
    ([(0.0, 0.2), (0.01, 0.2), (0.0, 0.2), (0.02, 0.2)], "positive", "undetermined"),
    ([(0.3, 0.05)], "positive", "undetermined"),  # one model: no axis
    # a difference of 0.02 with 90% half-widths of 0.05 (0.0595 at 95%): flat by the 90% interval combined as
    # independent normal errors (0.02 +- 0.07: inside +-0.1), where the 95% bounds would reach 0.104
    ([(0.0, 0.0595), (0.02, 0.0595)], "positive", "flat across size"),
    # small steps that add up: each neighbouring step within +-0.1, the ends 0.24 apart: not flat
    ([(0.0, 0.005), (0.08, 0.005), (0.16, 0.005), (0.24, 0.005)], "positive", "grows with size"),
    ([(0.0, 0.05), (0.08, 0.05), (0.16, 0.05), (0.09, 0.05)], "positive", "undetermined"),
])
def test_the_reading_across_sizes_follows_the_declared_rule(points, direction, expected):
    assert size_axis.reading(_rows(points), direction, 0.10) == expected


def test_a_claim_reads_all_its_primaries_and_mixed_meanings_cannot_tell():
    readings = pd.DataFrame([
        {"primary": "outside_share_static_10pct", "reading": "flat across size", "meaning": "not at these sizes",
         "models": "a b", "left_out": "", "statuses": ""},
        {"primary": "adjacent_jaccard_over_bound", "reading": "undetermined", "meaning": "the size axis cannot tell",
         "models": "a b", "left_out": ""},
        {"primary": "fair_previous_step_vs_static", "reading": "flat across size", "meaning": "not at these sizes",
         "models": "a b", "left_out": ""},
        {"primary": "predicted_vs_static", "reading": "shrinks with size", "meaning": "not at these sizes",
         "models": "a c", "left_out": "b", "statuses": "a: not supported; b: no headroom; c: not supported"},
        {"primary": "probe_k1_vs_step_token_prior", "reading": "grows with size",
         "meaning": "the models may be too small", "models": "a b", "left_out": "",
         "statuses": "a: not supported; b: undetermined"}])
    sentences = size_axis.claim_sentences(readings, ["a", "b"])
    assert sentences["Claim 1, dynamism"].endswith("so **the size axis cannot tell**.")
    assert sentences["Claim 2, irreplaceability"].startswith("Claim 2, irreplaceability, across 2 of the 4 declared "
                                                             "sizes (a, b): ")
    assert sentences["Claim 2, irreplaceability"].endswith("so **not at these sizes**.")
    # a trend names the largest model's status, which its meaning reads, beside the models it leaves out
    assert "(largest, c: not supported; without b: no headroom or no estimate)" in sentences["Claim 2, irreplaceability"]
    assert sentences["Claim 3, predictability"].endswith("grows with size (largest, b: undetermined), so **the models "
                                                         "may be too small**.")


def test_models_are_read_in_the_order_of_their_block_parameters_not_the_lists(tmp_path):
    flat = {"outside_share_static_10pct": (0.0, 0.01)}
    for name, parameters in (("smollm2-135m-instruct", 106_200_000), ("gemma-3-270m", 100_300_000)):
        folder = tmp_path / name / "07_length_grid"  # scale/<model>/
        folder.mkdir(parents=True)
        _model_table(name, parameters, flat).to_csv(folder / "size_axis.csv", index=False)
    assert list(dict.fromkeys(size_axis.scale_tables(tmp_path)["model"])) == ["gemma-3-270m", "smollm2-135m-instruct"]


def test_the_meaning_reads_the_largest_models_status_and_every_models():
    grows = _rows([(0.0, 0.05), (0.2, 0.05)])
    assert size_axis._meaning("grows with size", grows) == "the models may be too small"
    grows.loc[1, "status"] = "supported"
    assert size_axis._meaning("grows with size", grows) == "the size axis cannot tell"
    flat = _rows([(0.0, 0.02), (0.01, 0.02)], status="not supported")
    assert size_axis._meaning("flat across size", flat) == "not at these sizes"
    assert size_axis._meaning("undetermined", flat) == "the size axis cannot tell"


def _model_table(model, parameters, values, status="not supported", accuracy=0.9):
    rows = []
    for primary, (estimate, half) in values.items():
        rows.append({"primary": primary, "estimate": estimate, "low": estimate - half, "high": estimate + half,
                     "low90": estimate - 0.84 * half, "high90": estimate + 0.84 * half, "n": 30, "units": "layouts",
                     "test": "t", "p": 0.5, "sesoi": 0.1, "direction": "positive", "status": status,
                     "kind": "primary"})
    rows += [{"primary": "jaccard_adjacent", "estimate": 0.5, "low": 0.4, "high": 0.6, "kind": "descriptive",
              "status": ""},
             {"primary": "heads_per_step", "estimate": 2.0, "low": 1.5, "high": 2.5, "kind": "descriptive",
              "status": ""},
             {"primary": "accuracy_unmasked", "estimate": accuracy, "low": accuracy - 0.1, "high": accuracy + 0.1,
              "kind": "descriptive", "status": "headroom"}]
    return pd.DataFrame(rows).assign(model=model, parameters=parameters, n_heads=100, static_size=10)


def test_the_scale_report_reads_every_models_runs_draws_the_figure_and_states_one_sentence_per_claim(tmp_path):
    flat = {"outside_share_static_10pct": (0.0, 0.01), "adjacent_jaccard_over_bound": (0.99, 0.005),
            "fair_previous_step_vs_static": (0.0, 0.01), "predicted_vs_static": (0.0, 0.01),
            "probe_k1_vs_step_token_prior": (0.0, 0.01)}
    big = dict(flat, fair_previous_step_vs_static=(0.5, 0.05), predicted_vs_static=(float("nan"), float("nan")))
    small = _model_table("small-model", 10 ** 8, flat)
    large = _model_table("large-model", 10 ** 9, big)
    large.loc[large["primary"] == "fair_previous_step_vs_static", "status"] = "undetermined"
    # a model's report read on its own (the folder itself) and one in the preset's folder layout (<model>/)
    for folder, table in ((tmp_path / "07_length_grid", large), (tmp_path / "small" / "07_length_grid", small)):
        folder.mkdir(parents=True)
        table.to_csv(folder / "size_axis.csv", index=False)
    readings, models = size_axis.write_size_axis(tmp_path)
    assert models == ["small-model", "large-model"]
    sentences = size_axis.claim_sentences(readings, models)
    assert (tmp_path / "size_axis.png").stat().st_size > 0 and (tmp_path / "size_axis_reading.csv").is_file()
    by = readings.set_index("primary")
    assert by.loc["outside_share_static_10pct", "reading"] == "flat across size"
    assert by.loc["outside_share_static_10pct", "models"] == "small-model large-model"  # parameter order
    assert by.loc["fair_previous_step_vs_static", "reading"] == "grows with size"
    assert by.loc["fair_previous_step_vs_static", "meaning"] == "the models may be too small"
    assert by.loc["predicted_vs_static", "left_out"] == "large-model"  # no estimate: left out, and said so
    assert by.loc["predicted_vs_static", "reading"] == "undetermined"
    assert sentences["Claim 1, dynamism"].startswith(
        "Claim 1, dynamism, across 2 of the 4 declared sizes (small-model, large-model): ")  # names its models
    assert sentences["Claim 1, dynamism"].endswith("so **not at these sizes**.")
    assert "the models may be too small" in sentences["Claim 2, irreplaceability"]
    assert "across 2 of the 4 declared sizes" in sentences["Claim 3, predictability"]
    build_index(tmp_path)
    readme = (tmp_path / "README.md").read_text()
    assert "## The size axis" in readme and "![The size axis" in readme
    assert sentences["Claim 2, irreplaceability"] in readme
    assert "The size axis" in (tmp_path / "index.html").read_text()


def test_the_paper_models_block_parameters_follow_their_published_shapes():
    # Llama-3.1-8B: 32 layers of q, o (4096 x 4096), k, v (4096 x 1024), a gated MLP of 14,336 and two norms
    llama = size_axis.PAPER_MODELS.set_index("model").loc["Llama-3.1-8B", "parameters"]
    assert llama == 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096)
    assert 6.9e9 < llama < 7.0e9
    assert list(size_axis.PAPER_MODELS["jaccard_adjacent"]) == [0.3188, 0.5056, 0.3668, 0.2793, 0.4979]


def test_the_readmes_answer_quotes_the_size_axis_sentences_and_gives_its_models_no_column(tmp_path):
    import json

    from dynheads_tl.report.answer import answer_markdown, settings

    scale = tmp_path / "scale" / "small-model"
    flat = {p: (0.0, 0.01) for p in ("outside_share_static_10pct", "adjacent_jaccard_over_bound",
                                     "fair_previous_step_vs_static", "predicted_vs_static",
                                     "probe_k1_vs_step_token_prior")}
    (scale / "07_length_grid").mkdir(parents=True)
    _model_table("small-model", 10 ** 8, flat).to_csv(scale / "07_length_grid" / "size_axis.csv", index=False)
    (scale / "runs.json").write_text(json.dumps({"07_length_grid": {"preset": "scale", "model": "small-model"}}))
    assert settings(tmp_path) == []  # the scale runs are summed up by the size axis, not a column each
    text = answer_markdown(tmp_path, "papers_figures/")
    assert "**The size axis** (1 of the 4 declared sizes: small-model;" in text
    assert "(papers_figures/scale/index.html)):" in text
    assert "- Claim 1: outside share undetermined; Jaccard over its bound undetermined: **the size axis cannot " \
           "tell**." in text
