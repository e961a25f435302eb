"""The index of the reproduction, and the checks a committed report must pass.

``build_index`` writes ``README.md`` and ``index.html`` from the outputs present; ``render_notebook_html``
turns an executed notebook into a page that opens offline; ``report_problems`` lists what keeps an output
folder from being a report to commit (failed notebooks, machine paths, dead links, stale numbers).
"""
from __future__ import annotations

import html as _html
import json as _json
import logging
import re
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pandas as _pd

from dynheads_tl.engine.tracing import atomic_write_text

logger = logging.getLogger(__name__)

# --- the index of the reproduction -----------------------------------------------------------------

# (id, what the paper shows, the paper's numbers, our file stem (relative to the output dir), notebook)
PAPER_ITEMS = [
    ("Table 1", "NIAH dynamism metrics", "Llama-3.1-8B: Jaccard top-20 .3512, adjacent .2793, entropy 3.8154; 12.97 ± 7.69 heads/step, 238 of 1024 ever active",
     "01_dynamism/table1_niah", "01_dynamism"),
    ("Fig 1", "NIAH heatmap: 10 most variable heads × generated tokens", "qualitative",
     "01_dynamism/fig1_niah_heatmap", "01_dynamism"),
    ("Fig 2", "NIAH accuracy heatmaps under dynamic / static / random masking (ours beside them: size-matched "
     "controls and a teacher-forced drop of the gold token's log-probability)",
     "dynamic masking destroys retrieval; static and random barely matter",
     "02_irreplaceability/fig2_niah_masking", "02_irreplaceability"),
    ("Fig 3", "NIAH progressive masking", "accuracy 1.0 → 0.0 by k = 20; 4.5–7 compensating static heads for k ≥ 5",
     "02_irreplaceability/fig3_niah_progressive", "02_irreplaceability"),
    ("Fig 4", "NIAH CCA vs lag k", "leading correlation .965 (k = 0) → .743 (k = 10)",
     "03_correlation/fig4_niah_cca", "03_correlation"),
    ("Fig 5", "HotpotQA Eq. 2 heatmap", "qualitative", "01_dynamism/fig5_hotpot_heatmap", "01_dynamism"),
    ("Fig 6", "HotpotQA F1 heatmaps under masking (ours beside them: as in Fig 2)", "as Fig 2",
     "02_irreplaceability/fig6_hotpot_masking", "02_irreplaceability"),
    ("Fig 7", "HotpotQA progressive masking (heads ranked by Eq. 2)", "as Fig 3",
     "02_irreplaceability/fig7_hotpot_progressive", "02_irreplaceability"),
    ("Fig 8", "HotpotQA CCA vs lag k", ".856 → .712", "03_correlation/fig8_hotpot_cca", "03_correlation"),
    ("Table 2", "NIAH probe F1 / P / R / AUPRC", "F1 .8038–.8566 (Llama-3.1-8B .8349, AUPRC .9173)",
     "03_correlation/table2_niah_probe", "03_correlation"),
    ("Table 3", "HotpotQA probe MSE / MAE / R²", "R² .7200–.8120 (Llama-3.1-8B .8120)",
     "03_correlation/table3_hotpot_probe", "03_correlation"),
    ("Table 4", "Dynamic RAG EM / F1", "Llama-3.1-8B Dynamic .456/.5586, Static .398/.5098, w/o RAG .252/.3257",
     "04_dynamic_rag/table4_rag", "04_dynamic_rag"),
    ("Beyond 0", "Eq. 2's cutoff calibrated against placebo spans (the paper gives no threshold)",
     "not in the paper (a third party used 0.1)", "01_dynamism/eq2_calibration", "01_dynamism"),
    ("Beyond 1", "NIAH overlap with the static top-k against what set sizes allow (95% bootstrap CI)",
     "not in the paper", "01_dynamism/size_aware_overlap", "01_dynamism"),
    ("Beyond 1b", "NIAH soft dynamism: adjacent-step Jaccard of Eq. 1 vs heads with attention mass on the needle, "
     "over haystacks × lengths with random layouts (95% bootstrap CI)",
     "not in the paper (Eq. 1 only)", "01_dynamism/soft_dynamism", "01_dynamism"),
    ("Beyond 3a", "NIAH held-out CCA with step and current token regressed out (mean of splits, 95% CI)",
     "not in the paper", "03_correlation/fig4_niah_cca_residualised", "03_correlation"),
    ("Beyond 3b", "Probes k steps ahead minus the step-aware prior (NIAH F1, HotpotQA R²; 95% CI over splits)",
     "not in the paper (probes at k = 0 only)", "03_correlation/lead_probes", "03_correlation"),
    ("Beyond 5", "Is the answer wrong? Dynamic-head features against a Lookback-style ratio and the logits "
     "(out-of-fold AUROC, 95% bootstrap CI)",
     "not in the paper; for scale, on other models and data: Lookback Lens AUROC .85–.91 in-domain, .82–.85 "
     "across tasks; ReDeEP .75–.82", "05_error_signal/auroc", "05_error_signal"),
    ("Beyond 6", "Per-step KV retention: NIAH accuracy when only R_t keeps the full cache, static vs predicted vs "
     "oracle vs random at equal budgets (Wilson 95%)",
     "not in the paper; for scale, on other models: DuoAttention keeps NIAH with 25% (MHA) / 50% (GQA) of heads "
     "whole; HeadKV 97% of full-cache quality with 1.5% of the cache", "06_kv_retention/retention", "06_kv_retention"),
]


def _headline(stem: Path) -> str:
    """A one-line summary of our numbers, read from the CSV actually present."""
    csv = stem.with_suffix(".csv")
    try:
        frame = _pd.read_csv(csv)
        name = stem.name
        if name.startswith("table1"):
            r = frame.iloc[0]
            text = (f"Jaccard top-20 {r.jaccard_static:.4f}, adjacent {r.jaccard_adjacent:.4f}, entropy {r.entropy:.4f}; "
                    f"{r.heads_per_step_mean:.2f} ± {r.heads_per_step_sd:.2f} heads/step, {int(r.ever_active)} of {int(r.n_heads)} ever active")
            intervals = stem.parent / "table1_intervals.csv"  # all seeds pooled, bootstrap over samples
            if intervals.exists():
                ci = _pd.read_csv(intervals)
                ci = ci[ci["task"] == r.task].set_index("metric")
                cell = lambda m: f"{ci.loc[m, 'value']:.3f} [{ci.loc[m, 'low']:.3f}, {ci.loc[m, 'high']:.3f}]"
                text += (f" (first seed); all {int(ci['n_samples'].iloc[0])} samples "
                         f"of {int(ci['n_seeds'].iloc[0])} seeds: Jaccard top-20 {cell('jaccard_static')}, adjacent "
                         f"{cell('jaccard_adjacent')}, {cell('heads_per_step_mean')} heads/step")
            return text
        if name.startswith(("fig2", "fig6")) and "tf_drop" in frame:
            return _masking_headline(frame)
        if name.startswith(("fig2", "fig6")):  # runs made before the matched controls and teacher forcing
            metric = "accuracy" if "accuracy" in frame else "f1"
            means = frame.groupby("condition")[metric].mean()
            return ", ".join(f"{c.replace('_', ' ')} {means[c]:.2f}" for c in ("none", "dynamic", "static", "static_matched",
                             "random") if c in means) + f" ({metric})"
        if name.startswith(("fig3", "fig7")):
            from dynheads_tl.claims.irreplaceability import metric_interval

            metric = "accuracy" if "accuracy" in frame else "f1"
            parts = []
            for k, part in frame.groupby("k"):
                ci = metric_interval(part[metric], metric)
                parts.append(f"k={k}: {ci.estimate:.2f} [{ci.low:.2f}, {ci.high:.2f}], m_s {part['m_s'].mean():.1f}")
            n = int(frame.groupby("k").size().min())
            interval = "Wilson" if metric == "accuracy" else "bootstrap"
            return "; ".join(parts) + f" ({metric}, {interval} 95%, n = {n} samples per k)"
        if name.startswith("size_aware_overlap"):
            part = frame[(frame["task"] == "niah") & (frame["static_k"] == 20)].set_index("metric")
            cell = lambda m: f"{part.loc[m, 'value']:.3f} [{part.loc[m, 'low']:.3f}, {part.loc[m, 'high']:.3f}]"
            return (f"top-20: outside share {cell('share_outside_static')}, coverage {cell('static_coverage')}, "
                    f"Jaccard {cell('jaccard_static')} = {cell('jaccard_over_bound')} of its size bound "
                    f"(n = {int(part.loc['static_coverage', 'n_samples'])} samples)")
        if name.startswith("soft_dynamism"):
            part = frame[(frame["setting"] == "all") & (frame["metric"] == "jaccard_adjacent")]
            cell = lambda r: f"{r.value:.2f} [{r.low:.2f}, {r.high:.2f}]"
            sidecar = stem.parent / f"{stem.name}.config.json"  # the threshold the notebook's verdict reads
            threshold = _json.loads(sidecar.read_text()).get("soft_threshold", 0.3) if sidecar.exists() else 0.3
            chosen = [r for r in part.itertuples() if r.kind == "eq1" or abs(r.threshold - threshold) < 1e-9]
            return ("adjacent Jaccard, all settings: " + "; ".join(f"{r.definition} {cell(r)}" for r in chosen)
                    + f" (n = {int(part['n_samples'].iloc[0])} samples)")
        if name.endswith("_residualised"):
            first = lambda control: frame[frame["control"] == control].set_index("k")
            resid, chance = first("held-out, residualised"), first("held-out, residualised, chance")
            return "; ".join(f"k={k}: {r['first']:.3f} [{r.first_low:.3f}, {r.first_high:.3f}] vs chance "
                             f"{chance.loc[k, 'first']:.3f}" for k, r in resid.iterrows() if k in chance.index) + \
                f" (first canonical correlation, {int(resid['splits'].min())} splits)"
        if name.startswith("lead_probes"):
            parts = []
            for task, metric in (("niah", "f1"), ("hotpot", "r2")):
                rows = frame[(frame["task"] == task) & (frame["metric"] == metric)]
                parts.append(f"{task} {metric.upper()}: " + ", ".join(
                    f"k={r.k} {r.vs_step_prior:+.3f} [{r.vs_step_prior_low:+.3f}, {r.vs_step_prior_high:+.3f}]"
                    for r in rows.itertuples()))
            return "; ".join(parts)
        if name.startswith(("fig4", "fig8")):
            value = "first" if "first" in frame else "leading"  # the first canonical pair (older runs: the largest)
            parts = []
            for control in ("in-sample", "held-out", "shuffled", "shuffled, same step"):
                series = frame[frame["control"] == control].set_index("k")[value]
                if len(series):
                    parts.append(f"{control} " + " ".join(f"{v:.3f}" for v in series.sort_index()))
            held = frame[frame["control"] == "held-out"].set_index("k")[value]
            same = frame[frame["control"] == "shuffled, same step"].set_index("k")[value]
            beaten = [int(k) for k in held.index if k in same.index and same[k] >= held[k]]
            return (f"first canonical correlation at k = {int(frame['k'].min())}..{int(frame['k'].max())}: "
                    + "; ".join(parts)
                    + (f"; the same-step shuffle reaches held-out at k = {', '.join(map(str, beaten))}" if beaten else ""))
        if name.startswith("table2"):
            r = frame.set_index("predictor").loc["MLP probe"]
            return f"MLP F1 {r.f1:.4f}, P {r.precision:.4f}, R {r.recall:.4f}, AUPRC {r.auprc:.4f}"
        if name.startswith("table3"):
            r = frame.set_index("predictor").loc["MLP probe"]
            return f"MLP MSE {r.mse:.4f}, MAE {r.mae:.4f}, R² {r.r2:.4f}"
        if name.startswith("table4"):
            if "f1_low" not in frame:  # runs made before the intervals
                return "; ".join(f"{r.strategy} {r.em:.3f}/{r.f1:.3f}" for r in frame.itertuples())
            parts = [f"{r.strategy} EM {r.em:.2f} [{r.em_low:.2f}, {r.em_high:.2f}], F1 {r.f1:.2f} [{r.f1_low:.2f}, "
                     f"{r.f1_high:.2f}]" + ("" if r.strategy in ("none", "full") else
                                            f", recall/opened {r.recall_per_visible:.2f}") for r in frame.itertuples()]
            sidecar = stem.parent / f"{stem.name}.config.json"
            setting = _json.loads(sidecar.read_text()).get("rag_setting", "multihop") if sidecar.exists() else "multihop"
            return (f"{setting} setting, n = {int(frame['n'].min())} questions: " + "; ".join(parts)
                    + " (EM Wilson, F1 bootstrap 95%; recall/opened: chance = 1)")
        if name == "auroc" and "dynamic_minus" in frame:
            parts = [f"{r.method} {r.auroc:.2f} [{r.low:.2f}, {r.high:.2f}]" for r in frame.itertuples()]
            diff = lambda r, key: (f"vs {r.group} {getattr(r, key + '_minus'):+.2f} [{getattr(r, key + '_minus_low'):+.2f}, "
                                   f"{getattr(r, key + '_minus_high'):+.2f}]")
            rows = [r for r in frame.itertuples() if r.group in ("lookback", "logit")]
            text = (f"n = {int(frame['n'].iloc[0])} pooled answers ({int(frame['wrong'].iloc[0])} wrong): " + "; ".join(parts)
                    + "; evidence-knowing features " + ", ".join(diff(r, "dynamic") for r in rows))
            if "dynamic_ctx_minus" in frame:
                text += "; context-only features " + ", ".join(diff(r, "dynamic_ctx") for r in rows)
            return text + " (paired)"
        if name == "retention" and "vs_full" in frame:
            bounds = frame.set_index("strategy")
            head = (f"full cache {bounds.loc['full', 'accuracy']:.2f} [{bounds.loc['full', 'accuracy_low']:.2f}, "
                    f"{bounds.loc['full', 'accuracy_high']:.2f}], streaming {bounds.loc['streaming', 'accuracy']:.2f} "
                    f"[{bounds.loc['streaming', 'accuracy_low']:.2f}, {bounds.loc['streaming', 'accuracy_high']:.2f}]")
            parts = []
            for budget, part in frame[~frame["strategy"].isin(["full", "streaming"])].groupby("budget"):
                parts.append(f"{budget:.0%}: " + ", ".join(
                    f"{r.strategy}{'' if r.granularity == 'query' else ' (KV)'} {r.accuracy:.2f} [{r.accuracy_low:.2f}, "
                    f"{r.accuracy_high:.2f}]" for r in part.itertuples()))
            return f"n = {int(frame['n'].min())} samples; {head}; " + "; ".join(parts)
        if name.startswith("eq2_calibration"):
            chosen = frame[frame["chosen"]].iloc[0]
            return (f"share > {chosen.factor:.2f} x chance (placebo spans marked on {100 * chosen.placebo_rate:.1f}% of "
                    f"head-steps): {chosen.heads_per_step:.1f} heads per step, {int(chosen.heads_ever_active)} ever active")
    except Exception:  # a file of another shape: link it, do not summarise it
        return "see file"
    return "see figure"


def _masking_headline(frame: _pd.DataFrame) -> str:
    """Fig 2 / Fig 6 with the matched controls: per condition the free-generation metric (Wilson 95% for
    accuracy, bootstrap 95% over samples for F1) and the teacher-forced drop of the gold token's
    log-probability (nats per step, bootstrap 95%), with n."""
    from dynheads_tl.claims.irreplaceability import metric_interval

    metric = "accuracy" if "accuracy" in frame else "f1"
    order = ("none", "dynamic", "static", "random", "static_matched", "random_matched", "dynamic_nonstatic",
             "random_nonstatic", "static_nondynamic", "random_nondynamic")
    conditions = [c for c in order if c in set(frame["condition"])]

    free, drops = [], []
    for condition in conditions:
        part = frame[frame["condition"] == condition]
        a = metric_interval(part[metric], metric)
        d = metric_interval(part["tf_drop"], "tf_drop")
        free.append(f"{condition.replace('_', ' ')} {a.estimate:.2f} [{a.low:.2f}, {a.high:.2f}]")
        drops.append(f"{condition.replace('_', ' ')} {d.estimate:.2f} [{d.low:.2f}, {d.high:.2f}]")
    n = int(frame.groupby("condition").size().min())
    return (f"{metric} ({'Wilson' if metric == 'accuracy' else 'bootstrap'} 95%, n = {n} per condition): "
            + ", ".join(free) + "; teacher-forced gold log-prob drop, nats/step (bootstrap 95%): " + ", ".join(drops))


# Items whose data are HotpotQA questions: the synthetic generator unless the config names a real file.
HOTPOT_ITEMS = frozenset({"Fig 5", "Fig 6", "Fig 7", "Fig 8", "Table 3", "Table 4", "Beyond 0", "Beyond 3b", "Beyond 5"})
SYNTHETIC_NOTE = "(synthetic HotpotQA-format data)"


def hotpot_label(source: str) -> str:
    """The dataset name for a figure title: synthetic questions are never called plain "HotpotQA"."""
    return "HotpotQA (synthetic)" if source == "synthetic" else "HotpotQA"


def hotpot_source(stem: Path) -> str:
    """Where the HotpotQA data behind ``stem`` came from, read from ``<stem>.config.json``.

    A config without ``hotpot_source`` (or no config) counts as ``"synthetic"``: the generator is every
    entry point's default, and real data are used only when a config names the file, so an unlabelled
    result is assumed synthetic rather than passed off as real HotpotQA.
    """
    config = stem.with_name(stem.name + ".config.json")
    try:
        return str(_json.loads(config.read_text()).get("hotpot_source", "synthetic"))
    except (OSError, ValueError, AttributeError):
        return "synthetic"


def _produced_files(stem: Path) -> list[Path]:
    if not stem.parent.exists():
        return []
    return sorted(p for p in stem.parent.glob(stem.name + ".*") if not p.name.endswith(".tmp"))


def ours_text(output_dir: Path, item: str, stem_name: str) -> str:
    """The "ours" cell of an index row: the headline from the CSV present, or "not produced", plus
    the synthetic-data label for HotpotQA items."""
    stem = Path(output_dir) / stem_name
    if not _produced_files(stem):
        return "not produced"
    text = _headline(stem)
    if item in HOTPOT_ITEMS and hotpot_source(stem) == "synthetic":
        text += " " + SYNTHETIC_NOTE
    return text


@dataclass(frozen=True)
class _Row:
    item: str
    what: str
    paper: str
    ours: str
    files: list[str]  # relative to the output folder, POSIX
    notebook: str
    notebook_link: str | None  # the HTML rendering when present, else the executed .ipynb
    ipynb_link: str | None
    run: dict[str, Any]
    status: str = "not produced"  # report.status: computed from the item's CSVs
    headline: str = "not produced"  # the headline number with its interval and n
    section: str | None = None  # the link to the page section that makes the item's files


def _rel(path: Path, output_dir: Path) -> str:
    return path.relative_to(output_dir).as_posix()


def _notebook_links(output_dir: Path, notebook: str) -> tuple[str | None, str | None]:
    ipynb = output_dir / "executed" / f"{notebook}.ipynb"
    rendered = ipynb.with_suffix(".html")
    ipynb_link = _rel(ipynb, output_dir) if ipynb.exists() else None
    return (_rel(rendered, output_dir) if rendered.exists() else ipynb_link), ipynb_link


def _rows(output_dir: Path, runs: dict[str, Any]) -> list[_Row]:
    from dynheads_tl.report.site import page_sections
    from dynheads_tl.report.status import item_status

    rows, sections = [], {}
    for item, what, paper, stem_name, notebook in PAPER_ITEMS:
        files = [_rel(p, output_dir) for p in _produced_files(output_dir / stem_name)]
        link, ipynb = _notebook_links(output_dir, notebook) if files else (None, None)
        status, headline, section = "not produced", "not produced", None
        if files:
            found = item_status(output_dir, item)
            status, headline = found.status, found.headline
            if item in HOTPOT_ITEMS and hotpot_source(output_dir / stem_name) == "synthetic" and found.status != "qualitative":
                headline += " " + SYNTHETIC_NOTE
            if link and link.endswith(".html"):
                if notebook not in sections:
                    sections[notebook] = page_sections(output_dir, notebook)
                anchor = sections[notebook].get(Path(stem_name).name)
                section = f"{link}#{anchor}" if anchor else link
        rows.append(_Row(item, what, paper, ours_text(output_dir, item, stem_name), files, notebook, link, ipynb,
                         runs.get(notebook, {}), status, headline, section))
    return rows


def _file_label(name: str) -> str:
    return "config" if name.endswith(".config.json") else name.rsplit(".", 1)[-1]


def _run_meta(run: dict[str, Any]) -> str:
    if not run:
        return "–"
    return f"{run.get('model', '?')} · {run.get('preset', '?')} · {run.get('date', '?')} · {run.get('minutes', '?')} min"


INTRO = ("Regenerated by `dynheads report` from the files present in this folder; an item whose files are "
         "missing says so. Numbers labelled *paper* are quoted from arXiv 2602.11162. HotpotQA items marked "
         f"{SYNTHETIC_NOTE} were computed on questions from the seeded synthetic generator, not the real dataset.")
RUN_TIME_NOTE = ("Run times are those of the last run, which reads finished traces and ablation runs from the on-disk "
                 "cache instead of recomputing them; docs/benchmarks.md in the repository gives the times from scratch.")
STATUS_NOTE = ("The status is computed from each item's CSV by the rule in dynheads_tl/report/status.py (its "
               "thresholds are in the rule's docstring): reproduced, weaker (the same direction, less strongly), "
               "not reproduced, undetermined (the intervals cannot tell), no headroom (the setting does not separate "
               "its bounds, so the comparison says nothing), qualitative (a picture). Items beyond the paper test a "
               "hypothesis of ours: supported, partly supported, not supported, undetermined, or descriptive.")


def _markdown(rows: list[_Row], runs: dict[str, Any]) -> str:
    from dynheads_tl.report.site import run_meta

    md = ["# The reproduction at a glance", "", INTRO, "", STATUS_NOTE, ""]
    if runs:
        md += [f"Runs: {run_meta(runs)}. {RUN_TIME_NOTE}", ""]
    md += ["| item | what | paper | ours | status | headline | files | notebook |",
           "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        links = " ".join(f"[{_file_label(name)}]({name})" for name in row.files) or "–"
        notebook = f"[{row.notebook}]({row.ipynb_link})" if row.ipynb_link else "–"
        status, headline = ("–", "–") if row.status == "not produced" else (row.status, row.headline)
        md.append(f"| {row.item} | {row.what} | {row.paper} | {row.ours} | {status} | {headline} | {links} | {notebook} |")
    if runs:
        md += ["", "## Runs", "", "| notebook | model | preset | parameters | date | minutes |", "|---|---|---|---|---|---|"]
        for notebook, run in sorted(runs.items()):
            md.append(f"| {notebook} | {run.get('model')} | {run.get('preset')} | "
                      f"`{_json.dumps(run.get('parameters', {}))}` | {run.get('date')} | {run.get('minutes')} |")
    return "\n".join(md) + "\n"


_STYLE = """
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;line-height:1.45;color:#222;max-width:1280px;
     margin:0 auto;padding:1em}
h1{margin-top:0;font-size:1.6em} h2{margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:.2em}
header.site{display:flex;flex-wrap:wrap;gap:.3em 1.2em;align-items:baseline;font-size:.95em;margin-bottom:.5em}
header.site a{white-space:nowrap}
.meta{background:#f4f6f8;border:1px solid #dde;padding:.5em .8em}
.table-box{overflow-x:auto;max-width:100%;-webkit-overflow-scrolling:touch;border:1px solid #ddd}
table{border-collapse:collapse;width:100%;font-size:.92em}
.table-box table{min-width:760px}
th,td{border:1px solid #ccc;padding:.35em .55em;vertical-align:top;text-align:left}
th{background:#f2f2f2;position:sticky;top:0} tbody tr:nth-child(even) td{background:#fafafa}
td.item{white-space:nowrap;font-weight:600} td.missing,.missing{color:#a00}
.status{display:inline-block;white-space:nowrap;padding:.05em .45em;border-radius:.8em;font-size:.88em;font-weight:600}
.status.good{background:#dcefdc;color:#17501a}.status.mixed{background:#fdf0c8;color:#6a4a00}
.status.bad{background:#f8d9d6;color:#7a1b12}.status.open{background:#e3e7ee;color:#2b3a55}.status.none{background:#eee;color:#444}
details summary{cursor:pointer;color:#0b57a4}
a{color:#0b57a4} code{font-size:.9em;word-break:break-all}
figure{margin:1.5em 0 2.5em} figcaption{margin-bottom:.5em}
figure img{display:block;max-width:100%;height:auto;border:1px solid #ddd}
ul.outputs li{margin:.15em 0}
""".strip()


def _anchor(item: str) -> str:
    return item.lower().replace(" ", "-")


def _html_page(rows: list[_Row], runs: dict[str, Any], output_dir: Path) -> str:
    from dynheads_tl.report.site import NOTEBOOK_TITLES, PAPER_TITLE, PAPER_URL, notebook_order, outputs_list_html, run_meta
    from dynheads_tl.report.status import STATUS_CLASS

    esc = _html.escape
    intro = esc(INTRO).replace("`dynheads report`", "<code>dynheads report</code>").replace("*paper*", "<em>paper</em>")
    notebooks = notebook_order(output_dir)
    pages = []
    for notebook in notebooks:
        link, _ = _notebook_links(output_dir, notebook)
        if link:
            pages.append(f'<a href="{esc(link)}">{esc(NOTEBOOK_TITLES.get(notebook, notebook))}</a>')
    parts = ["<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             "<title>Retrieval heads are dynamic: the reproduction</title>", f"<style>{_STYLE}</style></head><body>",
             f'<header class="site"><strong>The report</strong><a href="{PAPER_URL}">{esc(PAPER_TITLE)}</a>'
             '<a href="#items">Items</a><a href="#figures">Figures</a><a href="#all-outputs">All outputs</a>'
             '<a href="#runs">Runs</a></header>',
             "<h1>The reproduction at a glance</h1>"]
    if runs:
        parts.append(f'<p class="meta"><strong>Runs:</strong> {esc(run_meta(runs))}</p>')
    if pages:
        parts.append("<p><strong>Notebooks:</strong> " + " · ".join(pages) + "</p>")
    parts += [f"<p>{intro}</p>", f"<p>{esc(STATUS_NOTE)}</p>",
              '<h2 id="items">Paper items</h2>', '<div class="table-box"><table><thead><tr><th>item</th><th>status</th>'
              "<th>what the paper shows</th><th>paper</th><th>ours</th><th>files</th><th>notebook</th></tr></thead><tbody>"]
    figures = []
    for row in rows:
        image = next((name for name in row.files if name.endswith(".png")), None)
        target = row.section or (f"#{_anchor(row.item)}" if image else None)
        item = f'<a href="{esc(target)}">{esc(row.item)}</a>' if target else esc(row.item)
        links = " ".join(f'<a href="{esc(name)}">{esc(_file_label(name))}</a>' for name in row.files) or "–"
        notebook = "–"
        if row.notebook_link:
            notebook = f'<a href="{esc(row.notebook_link)}">{esc(row.notebook)}</a>'
            if row.ipynb_link and row.ipynb_link != row.notebook_link:
                notebook += f' (<a href="{esc(row.ipynb_link)}">ipynb</a>)'
            if image:
                notebook += f' · <a href="#{_anchor(row.item)}">figure</a>'
        if row.status == "not produced":
            status = '<span class="status bad">missing</span>'
            ours = f'<td class="ours missing">{esc(row.ours)}</td>'
        else:
            status = f'<span class="status {STATUS_CLASS.get(row.status, "none")}">{esc(row.status)}</span>'
            ours = (f'<td>{esc(row.headline)}<details><summary>all numbers</summary>'
                    f'<div class="ours">{esc(row.ours)}</div></details></td>')
        parts.append(f'<tr data-item="{esc(row.item)}"><td class="item">{item}</td><td>{status}</td>'
                     f"<td>{esc(row.what)}</td><td>{esc(row.paper)}</td>{ours}<td>{links}</td><td>{notebook}</td></tr>")
        if image:
            section = f' <a href="{esc(row.section)}">The section that makes it.</a>' if row.section else ""
            figures.append(f'<figure id="{_anchor(row.item)}"><figcaption><strong>{esc(row.item)}</strong> '
                           f"({esc(row.status)}): {esc(row.what)}.{section} Click the image for the full size."
                           f'</figcaption><a href="{esc(image)}"><img src="{esc(image)}" alt="{esc(row.item)}: '
                           f'{esc(row.what)}" loading="lazy"></a></figure>')
    parts.append("</tbody></table></div>")
    if figures:
        parts += ['<h2 id="figures">Figures</h2>', *figures]
    folders = sorted({stem.split("/")[0] for *_, stem, _ in PAPER_ITEMS} | set(notebooks))
    outputs = []
    for folder in folders:
        if (output_dir / folder).is_dir():
            link, _ = _notebook_links(output_dir, folder)
            page = link if link and link.endswith(".html") else ""
            from dynheads_tl.report.site import page_sections

            sections = page_sections(output_dir, folder) if page else {}
            title = esc(NOTEBOOK_TITLES.get(folder, folder))
            heading = f'<a href="{esc(page)}">{title}</a>' if page else title
            outputs.append(f"<h3>{heading}</h3>" + outputs_list_html(output_dir / folder, f"{folder}/", sections, page)
                           .replace("<ul>", '<ul class="outputs">', 1))
    if outputs:
        parts += ['<h2 id="all-outputs">All outputs</h2>',
                  "<p>Every figure and table each notebook wrote, with each file it was written as and the section "
                  "of the notebook page that makes it.</p>", *outputs]
    if runs:
        parts += ['<h2 id="runs">Runs</h2>', f"<p>{esc(RUN_TIME_NOTE)}</p>",
                  '<div class="table-box"><table><thead><tr><th>notebook</th><th>model</th><th>preset</th><th>parameters</th>'
                  "<th>date</th><th>minutes</th></tr></thead><tbody>"]
        for notebook, run in sorted(runs.items()):
            link, _ = _notebook_links(output_dir, notebook)
            name = f'<a href="{esc(link)}">{esc(notebook)}</a>' if link else esc(notebook)
            parts.append(f"<tr><td>{name}</td><td>{esc(str(run.get('model')))}</td><td>{esc(str(run.get('preset')))}</td>"
                         f"<td><code>{esc(_json.dumps(run.get('parameters', {})))}</code></td>"
                         f"<td>{esc(str(run.get('date')))}</td><td>{esc(str(run.get('minutes')))}</td></tr>")
        parts.append("</tbody></table></div>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def read_runs(output_dir: Path) -> dict[str, Any]:
    """``<output_dir>/runs.json`` (what ran, with which parameters), or nothing when it is missing or
    damaged: the index then lists no runs, and the next run rewrites it with its own records."""
    path = Path(output_dir) / "runs.json"
    if not path.exists():
        return {}
    try:
        runs = _json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        logger.warning("%s is unreadable (%s); it is rewritten by the next run.", path, error)
        return {}
    return runs if isinstance(runs, dict) else {}


def build_index(output_dir: Path) -> Path:
    """Write ``README.md`` and ``index.html`` in ``output_dir`` from the outputs actually present.

    Every link is relative to ``output_dir``, so the folder can be moved or published as it is. Call it
    after :func:`render_notebook_html`, so notebook links go to the renderings. Returns the README path.
    """
    output_dir = Path(output_dir)
    runs = read_runs(output_dir)
    rows = _rows(output_dir, runs)
    atomic_write_text(output_dir / "README.md", _markdown(rows, runs))
    atomic_write_text(output_dir / "index.html", _html_page(rows, runs, output_dir))
    return output_dir / "README.md"


# --- HTML renderings of executed notebooks ---------------------------------------------------------

# The lab template without the blocks that load require.js, MathJax, mermaid and the widget manager
# from CDNs: the rendering must open in a browser with no network. Inline outputs (PNG data URIs,
# the circuitsvis bundle of notebook 00) are untouched. TeX is converted to MathML before rendering (site.py).
_OFFLINE_TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{% block jupyter_widgets %}{% endblock jupyter_widgets %}
"""

# A script or stylesheet fetched from the network: <script src="http...">, <script src="//...">,
# <link href="http..."> and `import ... from "https://..."` / `import("https://...")` in module scripts.
_REMOTE_RESOURCE = re.compile(
    r"""<script\b[^>]*?\bsrc\s*=\s*["']?(?:https?:)?//[^"'\s>]*"""
    r"""|<link\b[^>]*?\bhref\s*=\s*["']?(?:https?:)?//[^"'\s>]*"""
    r"""|\bimport\s*(?:\(\s*|[\w{}\s,*]*?\bfrom\s*)["'](?:https?:)?//[^"']*""", re.I)


def remote_resources(page: str) -> list[str]:
    """Scripts, stylesheets and module imports that ``page`` would fetch from the network."""
    return sorted(set(match.group(0)[:200] for match in _REMOTE_RESOURCE.finditer(page)))


def render_notebook_html(executed_ipynb: Path) -> Path:
    """Render an executed notebook to ``<same folder>/<stem>.html``, a page of the report's site that works
    offline (see :func:`dynheads_tl.report.site.render_page`); returns its path."""
    try:
        import nbconvert  # noqa: F401
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError("Rendering executed notebooks to HTML needs nbconvert: pip install 'nbconvert>=7'.") from error
    from dynheads_tl.report.site import render_page

    return render_page(Path(executed_ipynb))


# --- checks over a finished report -----------------------------------------------------------------

TEXT_SUFFIXES = frozenset({".json", ".ipynb", ".md", ".csv", ".html", ".txt"})

# A path of at least two components after a quote, space, bracket, "=", ":" or ";" (the end of &quot;).
# After "https:" the next character is "/", which no component starts with, so URLs do not match.
_ABSOLUTE_PATH = re.compile(r"""(?:^|(?<=["'(\s=,\[>:;]))(?:/[\w.+~-]+){2,}/?""", re.M)
_FILE_URI = re.compile(r"""file:/+[^\s"'<>)]+""")
_WINDOWS_PATH = re.compile(r"""\b[A-Za-z]:\\{1,2}[\w.-]+(?:\\{1,2}[\w.-]+)+""")
# Not paths of a machine: JavaScript regex literals in inline bundles (/Trident/i.test(...)) and the
# documentation placeholder /path/to/...
_NOT_A_PATH = re.compile(r"/[^/]+/[dgimsuyv]{1,7}\.\w+|/path/to(/.*)?")


def absolute_paths(text: str) -> list[str]:
    """Absolute file-system paths (POSIX, file:// or Windows) in ``text``; URLs are not paths."""
    hits = [m.group(0) for m in _ABSOLUTE_PATH.finditer(text) if not _NOT_A_PATH.fullmatch(m.group(0))]
    hits += [m.group(0) for m in _FILE_URI.finditer(text)] + [m.group(0) for m in _WINDOWS_PATH.finditer(text)]
    return sorted(set(hits))


def path_problems(output_dir: Path) -> list[str]:
    """Committed text files that name an absolute path of the machine that wrote them."""
    output_dir = Path(output_dir)
    problems = []
    for path in sorted(output_dir.rglob("*")):
        if path.suffix in TEXT_SUFFIXES and path.is_file() and not path.name.endswith(".tmp"):
            hits = absolute_paths(path.read_text(encoding="utf-8", errors="replace"))
            if hits:
                shown = ", ".join(hits[:3]) + (f" and {len(hits) - 3} more" if len(hits) > 3 else "")
                problems.append(f"{_rel(path, output_dir)} holds absolute path(s) of a machine: {shown}")
    return problems


def notebook_problems(output_dir: Path) -> list[str]:
    """Executed notebooks that failed, or whose parameters differ from what ``runs.json`` records.

    A notebook finished when papermill recorded no exception and no cell has an error output. Its
    parameters are ``metadata.papermill.parameters`` without ``output_dir``, which the runner leaves
    out of ``runs.json``.
    """
    output_dir = Path(output_dir)
    runs = read_runs(output_dir)
    problems = []
    executed = sorted((output_dir / "executed").glob("*.ipynb"))
    for path in executed:
        name = _rel(path, output_dir)
        try:
            notebook = _json.loads(path.read_text(encoding="utf-8"))
        except ValueError as error:
            problems.append(f"{name} is not valid JSON ({error})")
            continue
        papermill = notebook.get("metadata", {}).get("papermill")
        if papermill is None:
            problems.append(f"{name} has no papermill metadata: it was not written by the runner")
            papermill = {}
        if papermill.get("exception"):
            problems.append(f"{name}: papermill recorded an exception, the run failed")
        for number, cell in enumerate(notebook.get("cells", [])):
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    problems.append(f"{name}: cell {number} raised {output.get('ename')}: "
                                    f"{str(output.get('evalue'))[:120]}")
        parameters = {k: v for k, v in papermill.get("parameters", {}).items() if k != "output_dir"}
        if path.stem not in runs:
            problems.append(f"{name} has no entry in runs.json")
        elif parameters != runs[path.stem].get("parameters", {}):
            problems.append(f"{name} ran with parameters {parameters}, but runs.json records "
                            f"{runs[path.stem].get('parameters', {})}")
    for notebook in sorted(set(runs) - {p.stem for p in executed}):
        problems.append(f"runs.json records {notebook}, but executed/{notebook}.ipynb is missing")
    return problems


class _LinkCollector(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.links += [value for key, value in attrs if key in ("href", "src") and value is not None]


_MARKDOWN_LINK = re.compile(r"""!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+["'][^)]*["'])?\s*\)""")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def _link_problem(target: str, source: str, output_dir: Path) -> str | None:
    if target.startswith("#"):
        return None
    if target.lower().startswith("file:") or target.startswith("/") or _WINDOWS_PATH.match(target):
        return f"{source} links to the absolute path {target}"
    if _SCHEME.match(target):  # http(s), mailto, data: not files of the folder
        return None
    relative = unquote(target.split("#", 1)[0].split("?", 1)[0])
    resolved = (output_dir / relative).resolve()
    if not resolved.is_relative_to(output_dir.resolve()):
        return f"{source} links to {target}, outside the folder"
    if not resolved.is_file():
        return f"{source} links to {target}, which does not exist"
    return None


def link_problems(output_dir: Path) -> list[str]:
    """Links in ``index.html`` (href, src) and ``README.md`` (Markdown links) that are absolute, leave
    the folder, or point to a file that does not exist."""
    output_dir = Path(output_dir)
    targets: list[tuple[str, str]] = []
    page = output_dir / "index.html"
    if page.exists():
        collector = _LinkCollector()
        collector.feed(page.read_text(encoding="utf-8"))
        targets += [("index.html", link) for link in collector.links]
    readme = output_dir / "README.md"
    if readme.exists():
        targets += [("README.md", m.group(1)) for m in _MARKDOWN_LINK.finditer(readme.read_text(encoding="utf-8"))]
    problems = [_link_problem(target, source, output_dir) for source, target in targets]
    return [problem for problem in dict.fromkeys(problems) if problem]


class _OursCollector(HTMLParser):
    """The text of the element of class ``ours`` (a ``<td>``, or the ``<div>`` behind a row's "all numbers")
    in each ``<tr data-item=...>`` of index.html."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ours: dict[str, str] = {}
        self._item: str | None = None
        self._text: list[str] | None = None
        self._tag: str | None = None
        self._depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "tr":
            self._item = attributes.get("data-item")
        elif self._text is not None and tag == self._tag:
            self._depth += 1
        elif self._item and self._text is None and "ours" in (attributes.get("class") or "").split():
            self._text, self._tag, self._depth = [], tag, 0

    def handle_data(self, data: str) -> None:
        if self._text is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if self._text is not None and tag == self._tag:
            if self._depth:
                self._depth -= 1
                return
            if self._item:
                self.ours[self._item] = "".join(self._text).strip()
            self._text, self._tag = None, None
        elif tag == "tr":
            self._item = None


def _readme_ours(readme: str) -> dict[str, str]:
    items = {item for item, *_ in PAPER_ITEMS}
    ours = {}
    for line in readme.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 4 and cells[0] in items and cells[0] not in ours:
            ours[cells[0]] = cells[3]
    return ours


def headline_problems(output_dir: Path) -> list[str]:
    """Rows whose "ours" text in README.md or index.html differs from what the CSV now present gives.

    The expected text is :func:`ours_text`, which formats numbers read from the CSV (or says "not
    produced"), so an index left over from an earlier run, or edited by hand, is caught.
    """
    output_dir = Path(output_dir)
    expected = {item: ours_text(output_dir, item, stem_name) for item, _, _, stem_name, _ in PAPER_ITEMS}
    quoted: dict[str, dict[str, str]] = {}
    if (output_dir / "README.md").exists():
        quoted["README.md"] = _readme_ours((output_dir / "README.md").read_text(encoding="utf-8"))
    if (output_dir / "index.html").exists():
        collector = _OursCollector()
        collector.feed((output_dir / "index.html").read_text(encoding="utf-8"))
        quoted["index.html"] = collector.ours
    if not quoted:
        return ["neither README.md nor index.html exists"]
    problems = []
    for source, rows in quoted.items():
        for item, text in expected.items():
            if item not in rows:
                problems.append(f"{source} has no row for {item}")
            elif rows[item] != text:
                problems.append(f"{source} quotes {rows[item]!r} for {item}, but its files give {text!r}")
    return problems


def offline_problems(output_dir: Path) -> list[str]:
    """HTML files under ``output_dir`` that would load a script or stylesheet from the network."""
    output_dir = Path(output_dir)
    problems = []
    for path in sorted(output_dir.rglob("*.html")):
        remote = remote_resources(path.read_text(encoding="utf-8", errors="replace"))
        if remote:
            problems.append(f"{_rel(path, output_dir)} loads from the network: {', '.join(remote[:3])}")
    return problems


def report_problems(output_dir: Path) -> list[str]:
    """Everything that keeps ``output_dir`` from being a report to commit; empty when it is one."""
    return (notebook_problems(output_dir) + path_problems(output_dir) + link_problems(output_dir)
            + headline_problems(output_dir) + offline_problems(output_dir))
