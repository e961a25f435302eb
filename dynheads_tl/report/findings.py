"""The report's findings page, ``<report>/findings.md``: the verdict sentences the claims declare
(``Claim.findings``), each index row's status, whether the models agree, each preset's runs and the dated
deviations of the pre-registration, read from each notebook folder's results (``verdicts.json``,
:mod:`dynheads_tl.verdicts`). The README carries the short answer instead (:mod:`dynheads_tl.report.answer`)
and links here; :func:`update_readme` writes both."""
from __future__ import annotations

from pathlib import Path

from dynheads_tl import preregistration
from dynheads_tl.claims import all_claims
from dynheads_tl.report.answer import preset_sections, update_answer
from dynheads_tl.report.across import agreement, model_agreement
from dynheads_tl.report.results import (all_results, contexts_phrase, is_model_report, model_reports, preset_reports,
                                        read_runs)
from dynheads_tl.report.site import section_anchor
from dynheads_tl.store import atomic_write_text

FINDINGS_FILE = "findings.md"  # in the report's root folder
FINDINGS_START, FINDINGS_END = "<!-- findings:start -->", "<!-- findings:end -->"  # around the page's computed part
PAGE_HEAD = """# What the committed report finds

Every line below is computed from the notebook folders' results files (`verdicts.json`) by
`python -m dynheads_tl.report.rerender papers_figures --results --readme README.md`, which also renders the README's
answer table; a test fails when this page differs from the files. The linked notebook sections give every interval,
n and threshold; [the index](index.html) has every item's numbers, and [preregistration.yaml](../preregistration.yaml)
the primaries and status rules (why each setting is confirmatory or exploratory:
[the report docs](../docs/report.md#pre-registration-and-what-the-statuses-read)).
"""


def declared_findings() -> list[tuple[str, str, str]]:
    """Every claim's declared findings (:class:`~dynheads_tl.claim.Finding`) as (label, notebook stem, section), in
    notebook order."""
    return [(f.label, claim.notebook, f.section) for claim in all_claims() for f in claim.findings]


def findings(output_dir: Path) -> list[tuple[str, str, list[str]]]:
    """[(label, notebook page with the verdict's section, sentences)] from each notebook folder's results, for the
    notebooks that ran (an executed notebook is present)."""
    output_dir = Path(output_dir)
    results = all_results(output_dir)
    out = []
    for claim in all_claims():
        data = results.get(claim.notebook)
        if data is None or not (output_dir / "executed" / f"{claim.notebook}.ipynb").exists():
            continue
        page = f"executed/{claim.notebook}.html"
        for finding in data.findings:
            out.append((finding.label, page + section_anchor(output_dir / page, finding.section),
                        list(finding.sentences)))
    return out


def statuses(output_dir: Path) -> list[tuple[str, str, bool]]:
    """(item, status, whether it rests on synthetic data) of every index row whose files are present, in the paper's
    order."""
    results = all_results(output_dir)
    pairs = sorted(((claim, item) for claim in all_claims() for item in claim.items), key=lambda p: p[1].position)
    out = []
    for claim, item in pairs:
        row = results[claim.notebook].item(item.item) if claim.notebook in results else None
        if row is not None and row.produced:
            out.append((item.item, row.status, row.data == "synthetic"))
    return out


def findings_markdown(output_dir: Path, link_prefix: str = "papers_figures/") -> str:
    """The README's findings block (between its markers): each model's findings, statuses and runs in the default
    preset (:func:`findings`, ``default/<model>/``), each under a line naming its model, and whether the models agree;
    then each other preset's (:func:`preset_block`); then the pre-registration's deviations. A folder that is one
    model's report (``runs.json``) gives that report's findings."""
    if is_model_report(output_dir):
        return "\n\n".join(block for block in ("\n".join(_model_findings(output_dir, link_prefix)),
                                                "\n".join(deviation_lines())) if block)
    blocks = []
    for preset in preset_reports(output_dir):
        if preset.preset != "default":
            blocks.append(preset_block(preset, link_prefix))
            continue
        reports = model_reports(preset.folder)
        for report in reports:
            where = f"{link_prefix}{preset.prefix}{report.prefix}"
            lines = _model_findings(report.folder, where)
            if lines:
                declared = preregistration.standing(report.model)
                declared = f"; preregistration.yaml: {declared}" if declared else ""
                lines.insert(0, f"**{report.model}** ([{preset.prefix}{report.prefix}]({where}index.html){declared}):\n")
            blocks.append("\n".join(lines))
        agreeing = agreement_lines(preset.folder, [report.model for report in reports])
        if agreeing:
            blocks.append("\n".join(agreeing))
    blocks.append("\n".join(deviation_lines()))
    return "\n\n".join(block for block in blocks if block)


def preset_block(preset, link_prefix: str) -> str:
    """The findings of a named preset's runs beside the default ones (``<report>/<preset>/<model>/``, such as
    notebook 07's ``long`` grid): a heading line, then each model's findings, statuses and runs as for the default
    preset, and whether the models agree."""
    reports = model_reports(preset.folder)
    where = f"{link_prefix}{preset.prefix}"
    lines = [f"**Preset `{preset.preset}`** ([its index]({where}index.html); runs the committed report keeps beside "
             "the default ones, by the same notebooks and rules; each line says the contexts it read):\n"]
    for section in preset_sections(preset):  # what sums the preset up across its models (the size axis) comes first
        lines += [f"*{section.title}* ([figure]({where}{section.figure})):\n"]
        lines += [f"- {sentence}" for sentence in section.sentences] + [""]
    for report in reports:
        found = _model_findings(report.folder, f"{where}{report.prefix}")
        if found:
            lines += [f"*{report.model}* ([{preset.prefix}{report.prefix}]({where}{report.prefix}index.html)):\n"] + found + [""]
    lines += agreement_lines(preset.folder, [report.model for report in reports])
    return "\n".join(lines).rstrip()


def deviation_lines() -> list[str]:
    """preregistration.yaml's dated deviations, each quoted whole (what changed after the file was frozen, why, and
    whether results had been seen), under a heading; empty when the file has none."""
    entries = preregistration.deviations()
    if not entries:
        return []
    lines = [f"**Deviations from preregistration.yaml** ({len(entries)} dated {'entry' if len(entries) == 1 else 'entries'} added after it was frozen, quoted "
             "whole):\n"]
    for entry in entries:
        lines.append(f"- {entry.get('date', 'undated')}: {entry.get('what', '')} Why: {entry.get('why', '')}. "
                     f"Results already seen: {entry.get('results already seen', 'not said')}.")
    return lines


def agreement_lines(output_dir: Path, models: list[str]) -> list[str]:
    """With more than one model: a heading line, then one computed line per claim on what its items' statuses on
    the models say together (:func:`~dynheads_tl.report.across.agreement`): where they agree (one settled status),
    differ (settled statuses that differ), are not settled on some model (undetermined or no headroom), or exist
    on one model only; pictures and descriptions are left out. Empty with one model."""
    claims = model_agreement(output_dir)
    if not claims:
        return []
    lines = [f"**Do the models agree?** (each item's status on {', '.join(models)}, by the rules of "
             "preregistration.yaml: \"agree\" where every model reaches the same settled status, \"differ\" where "
             "they reach different ones, \"not settled\" where a model's test settled nothing (undetermined or no "
             "headroom); pictures and descriptions are left out):\n"]
    groups = {"agree": "Agree", "differ": "Differ", "not settled": "Not settled", "not on every model": "Not on every model"}
    for title, items in claims:
        found: dict[str, list[str]] = {}
        for item, cells in items:
            verdict = agreement([c.status for c in cells])
            if verdict == "no verdict":
                continue
            synthetic = ", synthetic" if any(c.synthetic for c in cells) else ""
            if verdict == "agree":
                text = f"{item} ({cells[0].status}{synthetic})"
            else:
                text = f"{item} (" + ", ".join(f"{c.status} on {model}" for model, c in zip(models, cells)) \
                       + f"{synthetic})"
            found.setdefault(verdict, []).append(text)
        parts = [f"{groups[verdict]}: {'; '.join(found[verdict])}." for verdict in groups if verdict in found]
        if parts:
            lines.append(f"- **{title}**: " + " ".join(parts))
    return lines


def _model_findings(output_dir: Path, link_prefix: str) -> list[str]:
    lines = []
    results = all_results(output_dir)
    for label, page, chosen in findings(output_dir):
        stem = page.split("/")[1].partition(".")[0]
        read = contexts_phrase(results[stem].contexts if stem in results else None)
        read = f"; contexts: {read}" if read else ""
        lines.append(f"- **{label}** ([notebook {stem[:2]}]({link_prefix}{page}){read}): " + " ".join(chosen))
    found = statuses(output_dir)
    if found:
        lines.append(f"- **Status of each item** (computed from its CSVs by the rule preregistration.yaml declares; "
                     f"[the index]({link_prefix}index.html) has the numbers): "
                     + "; ".join(f"{item} {status}" + (" (synthetic)" if synthetic else "")
                                 for item, status, synthetic in found) + ".")
    provenance = runs_sentence(output_dir, link_prefix)
    if provenance:
        lines.append(provenance)
    return lines


def runs_sentence(output_dir: Path, link_prefix: str = "papers_figures/") -> str:
    """One line on where the quoted runs come from, read from ``runs.json`` (so it cannot contradict it): each
    notebook's date and minutes, and the model, preset and parameters when they are shared (else per notebook)."""
    runs = read_runs(Path(output_dir))
    if not runs:
        return ""
    shared = {}
    for field in ("model", "preset", "parameters"):
        values = {repr(record.get(field)) for record in runs.values()}
        if len(values) == 1:
            shared[field] = next(iter(runs.values())).get(field)
    parts = []
    for stem in sorted(runs):
        record = runs[stem]
        extra = [f"{field} {record.get(field)}" for field in ("model", "preset") if field not in shared]
        if "parameters" not in shared and record.get("parameters"):
            extra.append(f"parameters {record['parameters']}")
        minutes = record.get("minutes")
        when = f"{record.get('date', 'undated')}" + (f", {minutes} min" if minutes is not None else "")
        parts.append(f"{stem[:2]} on {when}" + (f" ({'; '.join(extra)})" if extra else ""))
    common = [f"model {shared['model']}" if "model" in shared else "",
              f"preset {shared['preset']}" if "preset" in shared else "",
              ("parameters as declared" if not shared["parameters"] else f"parameters {shared['parameters']}")
              if "parameters" in shared else ""]
    common = ", ".join(c for c in common if c)
    return (f"- **Runs** (from [runs.json]({link_prefix}runs.json)" + (f"; {common}" if common else "") + "): "
            + "; ".join(parts) + ".")


def findings_page(output_dir: Path) -> str:
    """The whole findings page (``<report>/findings.md``): its head, then :func:`findings_markdown` between the
    markers, links relative to the report's root."""
    return f"{PAGE_HEAD}\n{FINDINGS_START}\n{findings_markdown(output_dir, link_prefix='')}\n{FINDINGS_END}\n"


def update_readme(readme: Path, output_dir: Path, link_prefix: str = "papers_figures/") -> bool:
    """Write the findings page (:func:`findings_page`) into ``output_dir`` and the answer table and figure
    (:func:`~dynheads_tl.report.answer.update_answer`) into ``readme``; True when either changed."""
    page = Path(output_dir) / FINDINGS_FILE
    text = findings_page(output_dir)
    changed = not page.exists() or page.read_text(encoding="utf-8") != text
    if changed:
        atomic_write_text(page, text)
    return update_answer(readme, output_dir, link_prefix) or changed


def page_findings(page_text: str) -> str:
    """The block between a findings page's markers, stripped."""
    return page_text.split(FINDINGS_START, 1)[1].split(FINDINGS_END, 1)[0].strip()
