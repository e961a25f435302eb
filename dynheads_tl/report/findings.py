"""The README's findings: the computed verdict sentences the claims declare (``Claim.findings``), quoted from the
executed notebooks' outputs, with each index row's status, written between the README's markers."""
from __future__ import annotations

import re
from pathlib import Path

from dynheads_tl.report.site import headings
from dynheads_tl.report.text import sentences
from dynheads_tl.store import atomic_write_text

FINDINGS_START, FINDINGS_END = "<!-- findings:start -->", "<!-- findings:end -->"


def _verdict_cell(notebook, function: str):
    """The first code cell whose source calls ``function`` and that shows Markdown, or None."""
    for cell in notebook.cells:
        if cell.cell_type == "code" and function in cell.source:
            if any(output.get("data", {}).get("text/markdown") for output in cell.get("outputs", [])):
                return cell
    return None


def _verdict_text(notebook, function: str) -> str | None:
    """Every Markdown output of the verdict's cell, as paragraphs (a cell may show more than one verdict)."""
    cell = _verdict_cell(notebook, function)
    if cell is None:
        return None
    return "\n\n".join(o["data"]["text/markdown"] for o in cell.outputs if o.get("data", {}).get("text/markdown"))


def _verdict_anchor(notebook, function: str, page_path: Path) -> str:
    """``#anchor`` of the heading above the verdict's cell in the rendered page, or "" when unknown."""
    cell = _verdict_cell(notebook, function)
    if cell is None or not cell.get("id") or not page_path.exists():
        return ""
    page = page_path.read_text(encoding="utf-8")
    position = page.find(f'id="cell-id={cell.id}"')
    above = [h for h in headings(page) if 0 <= h.position < position]
    return f"#{above[-1].anchor}" if above else ""


def declared_findings() -> list[tuple[str, str, str, str, int]]:
    """Every claim's declared findings (:class:`~dynheads_tl.claim.Finding`) as (label, notebook stem, call,
    pattern, limit), in notebook order."""
    from dynheads_tl.claims import all_claims

    return [(f.label, claim.notebook, f.call, f.pattern, f.limit) for claim in all_claims() for f in claim.findings]


def findings(output_dir: Path) -> list[tuple[str, str, list[str]]]:
    """[(label, notebook page with the verdict's section, sentences)] quoted from the executed notebooks'
    computed verdicts: of each declared finding, the Markdown output of the first code cell whose source contains
    its call, the sentences that match its pattern."""
    import nbformat

    output_dir = Path(output_dir)
    out = []
    for label, stem, function, pattern, limit in declared_findings():
        path = output_dir / "executed" / f"{stem}.ipynb"
        if not path.exists():
            continue
        notebook = nbformat.read(path, as_version=4)
        text = _verdict_text(notebook, function)
        if text is None:  # a run made before the claim declared this verdict: say so rather than leave it out
            out.append((label, f"executed/{stem}.html", [f"not in this run: its executed notebook predates this "
                                                         f"verdict (`{function}`); the next run adds it."]))
            continue
        page = f"executed/{stem}.html" + _verdict_anchor(notebook, function, path.with_suffix(".html"))
        chosen = []
        for paragraph in re.split(r"\n\s*\n", text):
            flat = re.sub(r"\*\*", "", " ".join(paragraph.split()))
            lead = re.match(r"^([^:.]{2,30}): ", flat)  # "NIAH: …", "HotpotQA (synthetic): …"
            picked = [s for s in sentences(flat) if re.search(pattern, s)]
            chosen += [f"{lead.group(1)}: {s}" if lead and not s.startswith(lead.group(1)) else s for s in picked]
        out.append((label, page, chosen[:limit]))
    return out


def findings_markdown(output_dir: Path, link_prefix: str = "papers_figures/") -> str:
    """The README's findings block (between its markers), from :func:`findings`."""
    lines = []
    from dynheads_tl.report.index import _produced_files, hotpot_source, index_items, item_stem
    from dynheads_tl.report.status import item_status

    for label, page, chosen in findings(output_dir):
        number = page.split("/")[1][:2]
        lines.append(f"- **{label}** ([notebook {number}]({link_prefix}{page})): " + " ".join(chosen))
    synthetic = lambda claim, item: item.hotpot and hotpot_source(Path(output_dir) / item_stem(claim, item)) == "synthetic"
    statuses = [f"{item.item} {item_status(output_dir, item.item).status}"
                + (" (synthetic)" if synthetic(claim, item) else "") for claim, item in index_items()
                if _produced_files(Path(output_dir) / item_stem(claim, item))]
    if statuses:
        lines.append(f"- **Status of each item** (computed from its CSVs by the rule preregistration.yaml declares; "
                     f"[the index]({link_prefix}index.html) has the numbers): " + "; ".join(statuses) + ".")
    provenance = runs_sentence(output_dir, link_prefix)
    if provenance:
        lines.append(provenance)
    return "\n".join(lines)


def runs_sentence(output_dir: Path, link_prefix: str = "papers_figures/") -> str:
    """One line on where the quoted runs come from, read from ``runs.json`` (so it cannot contradict it): each
    notebook's date and minutes, and the model, preset and parameters when they are shared (else per notebook)."""
    from dynheads_tl.report.index import read_runs

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


def update_readme(readme: Path, output_dir: Path, link_prefix: str = "papers_figures/") -> bool:
    """Write :func:`findings_markdown` between the README's markers; True when the README changed."""
    readme = Path(readme)
    text = readme.read_text(encoding="utf-8")
    if FINDINGS_START not in text or FINDINGS_END not in text:
        raise ValueError(f"{readme} has no {FINDINGS_START} … {FINDINGS_END} block to fill.")
    head, rest = text.split(FINDINGS_START, 1)
    _, tail = rest.split(FINDINGS_END, 1)
    new = f"{head}{FINDINGS_START}\n{findings_markdown(output_dir, link_prefix)}\n{FINDINGS_END}{tail}"
    if new != text:
        atomic_write_text(readme, new)
    return new != text


def readme_findings(readme_text: str) -> str:
    """The block between the README's findings markers, stripped."""
    return readme_text.split(FINDINGS_START, 1)[1].split(FINDINGS_END, 1)[0].strip()
