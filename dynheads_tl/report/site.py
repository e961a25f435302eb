"""The report as a site: each executed notebook rendered as a page a researcher reads, beside the index.

Everything here reads only what a run left in the output folder (the executed notebooks, the figures and
tables, ``runs.json``), so the site can be re-rendered from a committed report without running a model::

    python -m dynheads_tl.report.site papers_figures            # pages + index
    python -m dynheads_tl.report.site papers_figures --readme README.md   # also the README's findings

What a page gets that nbconvert alone does not give it:

- **Math rendered offline.** ``$…$`` and ``$$…$$`` in Markdown become MathML at render time
  (``latex2mathml``), which browsers draw natively: no script, no network, no raw TeX left.
- **Navigation.** A contents sidebar (a header on narrow screens) with a link back to the index,
  previous / next notebook, the page's own headings and its list of every output file.
- **A report, not a log.** stderr and progress lines are dropped; the parameters cell and papermill's
  injected-parameters cell are folded into one closed ``<details>``; tables longer than
  :data:`MAX_TABLE_ROWS` are cut with the full CSV linked; long verdict paragraphs become bullets, one
  sentence each (the sentences themselves are untouched).
- **Figures described.** Each figure gets alternative text naming its file, its section and the CSV of the numbers
  it plots (nbconvert alone writes a placeholder).
"""
from __future__ import annotations

import base64
import hashlib
import html as _html
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from dynheads_tl.report.text import (LONG_PARAGRAPH, markdown_math_to_mathml, raw_tex, sentences,  # noqa: F401
                                     tex_to_mathml, verdict_bullets)
from dynheads_tl import verdicts
from dynheads_tl.claims import claim_for
from dynheads_tl.report.results import claim_results
from dynheads_tl.store import atomic_write_text

PAPER_URL = "https://arxiv.org/abs/2602.11162"
PAPER_TITLE = "Retrieval Heads are Dynamic (arXiv 2602.11162)"
MAX_TABLE_ROWS = 15  # longer tables are cut to TABLE_ROWS_SHOWN rows, with the CSV linked
TABLE_ROWS_SHOWN = 10

def notebook_title(stem: str) -> str:
    """The page title of notebook ``stem`` as its claim declares it (``"02 · Claim 2: irreplaceability"``)."""
    try:
        return claim_for(stem).page_title
    except ValueError:
        return stem

# --- the notebook's parts --------------------------------------------------------------------------

_PROGRESS_LINE = re.compile(r"^.*(: \d+ to compute|: \d+/\d+ (after|done in) .*|^Notebook compute time: .*)$")


def quiet_stream(text: str) -> str:
    """A stdout stream without its progress lines (``…: 2/7 after 22 s, about 55 s left``) and compute times."""
    return "".join(line for line in text.splitlines(keepends=True) if not _PROGRESS_LINE.match(line.rstrip("\n")))


def _png_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def cell_files(notebook, folder: Path) -> dict[str, list[str]]:
    """Cell id -> the figure and table stems of ``folder`` that the cell wrote, from the folder's results file
    (:func:`dynheads_tl.verdicts.outputs`: the cell each figure and table was saved from). A figure recorded without
    its cell (a run made before the results file recorded cells) is found by its image: the cell whose PNG output
    is the figure's file, byte for byte. A table without a recorded cell is not placed."""
    outputs = verdicts.outputs(folder)
    by_count: dict[int, str] = {}
    by_image: dict[str, str] = {}
    code = [cell for cell in notebook.cells if cell.cell_type == "code" and cell.get("id")]
    for cell in code:
        if isinstance(cell.get("execution_count"), int):
            by_count[cell["execution_count"]] = cell["id"]
        for output in cell.get("outputs", []):
            png = output.get("data", {}).get("image/png")
            if png:
                by_image.setdefault(_png_digest(base64.b64decode("".join(png))), cell["id"])
    found: dict[str, list[str]] = {}
    for entry in outputs:
        cell = by_count.get(entry["cell"]) if isinstance(entry.get("cell"), int) else None
        if cell is None and f"{entry['stem']}.png" in entry["files"]:
            cell = by_image.get(_png_digest((folder / f"{entry['stem']}.png").read_bytes()))
        if cell is not None:
            found.setdefault(cell, []).append(entry["stem"])
    return found


def _describe_images(outputs: list, stems: list[str], folder: Path, section: str) -> None:
    """Alternative text for each PNG output that has none (nbconvert would write a placeholder): the figure file
    it shows (found by its bytes), its caption where the notebook recorded one, and the table of the numbers it
    plots, under its section."""
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    files = {_png_digest((folder / f"{stem}.png").read_bytes()): stem for stem in stems
             if (folder / f"{stem}.png").exists()}
    captions = {entry["stem"]: entry.get("caption", "") for entry in verdicts.outputs(folder)} if files else {}
    for i, output in enumerate(images):
        metadata = output.setdefault("metadata", {}).setdefault("image/png", {})
        if metadata.get("alt"):
            continue
        where = f"under “{re.sub(r'[*`$]', '', section)}”"
        stem = files.get(_png_digest(base64.b64decode("".join(output["data"]["image/png"]))))
        if stem:
            data = folder / f"{stem}.csv"
            numbers = f"; the numbers it plots are in {data.name}" if data.exists() else ""
            caption = f" ({captions[stem]})" if captions.get(stem) else ""
            metadata["alt"] = f"Figure {stem}{caption} {where}{numbers}."
        else:
            metadata["alt"] = f"Figure {i + 1} of {len(images)} of this cell {where}."


def shorten_table(html: str, note: str) -> str:
    """An HTML table of more than :data:`MAX_TABLE_ROWS` body rows cut to :data:`TABLE_ROWS_SHOWN`, with
    ``note`` (a sentence and links) after it; other HTML unchanged."""
    body = re.search(r"<tbody>(.*?)</tbody>", html, re.S)
    if not body:
        return html
    rows = re.findall(r"<tr\b.*?</tr>", body.group(1), re.S)
    if len(rows) <= MAX_TABLE_ROWS:
        return html
    kept = "\n".join(rows[:TABLE_ROWS_SHOWN])
    html = html[:body.start(1)] + "\n" + kept + "\n" + html[body.end(1):]
    html = re.sub(r"<p>\d+ rows × \d+ columns</p>", "", html)
    return html + f'<p class="shortened">Showing {TABLE_ROWS_SHOWN} of {len(rows)} rows. {note}</p>'


def prepare_notebook(notebook, output_dir: Path, stem: str):
    """A copy of an executed notebook ready to render (see the module docstring); ``notebook`` is untouched."""
    import copy

    import nbformat

    nb = copy.deepcopy(notebook)
    folder = output_dir / stem
    written = cell_files(nb, folder)
    cells, parameters = [], []
    section = notebook_title(stem)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            titles = re.findall(r"^#{1,3}\s+(.+?)\s*$", cell.source, re.M)
            section = titles[-1] if titles else section
        tags = set(cell.get("metadata", {}).get("tags", []))
        if cell.cell_type == "code" and tags & {"parameters", "injected-parameters"}:
            label = "injected by papermill for this run" if "injected-parameters" in tags else "the notebook's defaults"
            parameters.append((label, cell.source))
            if len(parameters) == 1:
                cells.append(None)  # where the folded parameters go
            continue
        if cell.cell_type == "markdown":
            cell.source = markdown_math_to_mathml(cell.source)
        if cell.cell_type == "code":
            outputs = []
            for output in cell.get("outputs", []):
                if output.output_type == "stream":
                    if output.get("name") == "stderr":
                        continue
                    output.text = quiet_stream(output.text)
                    if not output.text.strip():
                        continue
                data = output.get("data", {})
                if "text/markdown" in data:  # computed text: verdicts and summaries
                    data["text/markdown"] = markdown_math_to_mathml(verdict_bullets(data["text/markdown"]))
                if "text/html" in data and "<table" in data["text/html"]:
                    links = [folder / f"{name}.csv" for name in written.get(cell.get("id"), [])
                             if (folder / f"{name}.csv").exists()]
                    note = (("Full table: " if len(links) == 1 else "Full tables of this cell: ") + ", ".join(f'<a href="../{stem}/{c.name}">{c.name}</a>' for c in links)
                            if links else 'Every table of this notebook: <a href="#all-outputs">all outputs</a>')
                    data["text/html"] = shorten_table(data["text/html"], note + ".")
                outputs.append(output)
            cell.outputs = outputs
            _describe_images(outputs, written.get(cell.get("id"), []), folder, section)
        cells.append(cell)
    if parameters:
        body = "".join(f"<p>{_html.escape(label)}:</p><pre>{_html.escape(source)}</pre>" for label, source in parameters)
        # A fixed id (nbformat would draw a random one), so rendering the same run twice gives the same page.
        folded = nbformat.v4.new_markdown_cell(
            f'<details class="parameters"><summary>Parameters of this run</summary>{body}</details>',
            id="parameters-of-this-run")
        cells = [folded if c is None else c for c in cells]
    nb.cells = cells
    return nb


# --- sections: which heading makes which file ------------------------------------------------------

_HEADING = re.compile(r'<h([1-3]) id="([^"]+)"[^>]*>(.*?)</h\1>', re.S)


@dataclass(frozen=True)
class Heading:
    level: int
    anchor: str
    html: str  # the heading's content without its pilcrow link
    position: int


def headings(page: str) -> list[Heading]:
    out = []
    for m in _HEADING.finditer(page):
        content = re.sub(r'<a class="anchor-link".*?</a>', "", m.group(3), flags=re.S).strip()
        out.append(Heading(int(m.group(1)), m.group(2), content, m.start()))
    return out


def file_sections(notebook, page: str, output_dir: Path, stem: str) -> dict[str, str]:
    """Each figure and table stem of the notebook's folder -> the anchor of the heading above the cell that wrote
    it (:func:`cell_files`), in the rendered ``page``."""
    heads = headings(page)
    sections: dict[str, str] = {}
    for cell_id, stems in cell_files(notebook, Path(output_dir) / stem).items():
        position = page.find(f'id="cell-id={cell_id}"')
        above = [h for h in heads if h.position < position] if position >= 0 else []
        if above:
            for name in stems:
                sections.setdefault(name, above[-1].anchor)
    return sections


def section_anchor(page_path: Path, section: str) -> str:
    """``#anchor`` of the heading whose text is ``section`` in the rendered page at ``page_path``, or "" when the
    page or the heading is missing."""
    if not section or not Path(page_path).exists():
        return ""
    for heading in headings(Path(page_path).read_text(encoding="utf-8")):
        if " ".join(_html.unescape(re.sub(r"<[^>]+>", "", heading.html)).split()) == section:
            return f"#{heading.anchor}"
    return ""


# --- the page --------------------------------------------------------------------------------------

SITE_STYLE = """
:root{--nav:17rem}
body.jp-Notebook{margin:0;padding:0}
nav.site{box-sizing:border-box;font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;background:#f6f7f9;
  border-bottom:1px solid #ddd;padding:.8em 1em}
nav.site a{color:#0b57a4;text-decoration:none} nav.site a:hover{text-decoration:underline}
nav.site .top{display:flex;flex-wrap:wrap;gap:.4em 1em;margin-bottom:.5em}
nav.site ol{margin:.3em 0 0;padding-left:0;list-style:none} nav.site li{margin:.15em 0} nav.site li.h3{margin-left:.9em;font-size:.95em}
nav.site details summary{cursor:pointer;font-weight:600}
main.page{box-sizing:border-box;max-width:100%;padding:0 .5em}
main.page .jp-Cell{max-width:100%}
main.page .jp-OutputArea-output,main.page .jp-InputArea-editor,main.page .jp-RenderedHTMLCommon{overflow-x:auto;max-width:100%}
main.page pre{white-space:pre-wrap;word-break:break-word}
main.page img{max-width:100%;height:auto}
details.parameters{margin:.5em 0;padding:.3em .6em;border:1px solid #ddd;background:#fafafa}
p.shortened{font-size:.9em;color:#555}
footer.site{font:14px system-ui,sans-serif;border-top:1px solid #ddd;margin-top:2em;padding:1em}
footer.site ul{columns:2;column-gap:2em} @media (max-width:700px){footer.site ul{columns:1}}
@media (min-width:1000px){
  nav.site{position:fixed;top:0;left:0;bottom:0;width:var(--nav);overflow-y:auto;border-right:1px solid #ddd;border-bottom:0}
  main.page,footer.site{margin-left:var(--nav)}
  nav.site details{display:block} nav.site details>summary{display:none}
}
""".strip()


def _file_groups(folder: Path, link_prefix: str) -> list[tuple[str, list[tuple[str, str]]]]:
    """The files of a notebook's folder grouped by stem: [(stem, [(label, href), ...]), ...], figures first."""
    groups: dict[str, list[tuple[str, str]]] = {}
    if not folder.is_dir():
        return []
    for path in sorted(folder.iterdir()):
        if not path.is_file() or path.name.endswith(".tmp"):
            continue
        name_stem = path.name.split(".")[0]
        label = "config" if path.name.endswith(".config.json") else path.suffix.lstrip(".")
        groups.setdefault(name_stem, []).append((label, f"{link_prefix}{path.name}"))
    order = {"png": 0, "pdf": 1, "csv": 2, "md": 3, "config": 4}
    items = [(s, sorted(links, key=lambda l: order.get(l[0], 9))) for s, links in groups.items()]
    return sorted(items, key=lambda g: (not any(label == "png" for label, _ in g[1]), g[0]))


def outputs_list_html(folder: Path, link_prefix: str, sections: dict[str, str] | None = None,
                      page_link: str = "") -> str:
    """An "all outputs" list: each figure and table of the folder with links to every file it was written as,
    and, where known, to the section of the notebook page that makes it."""
    esc = _html.escape
    rows = []
    for name_stem, links in _file_groups(folder, link_prefix):
        files = " · ".join(f'<a href="{esc(href)}">{esc(label)}</a>' for label, href in links)
        kind = ("figure" if any(label == "png" for label, _ in links) else
                "results" if f"{name_stem}.json" == verdicts.FILE else "table")
        section = (sections or {}).get(name_stem)
        where = f' · <a href="{esc(page_link)}#{esc(section)}">section</a>' if section else ""
        rows.append(f"<li><strong>{esc(name_stem)}</strong> ({kind}): {files}{where}</li>")
    return "<ul>" + "".join(rows) + "</ul>" if rows else "<p>No output files.</p>"


def notebook_order(output_dir: Path) -> list[str]:
    return sorted(p.stem for p in (Path(output_dir) / "executed").glob("[0-9][0-9]_*.ipynb")
                  if not p.name.endswith(".failed.ipynb"))


def _nav(stem: str, order: list[str], heads: list[Heading], meta: str, results: bool = False) -> str:
    esc = _html.escape
    i = order.index(stem) if stem in order else -1
    prev_link = (f'<a href="{esc(order[i - 1])}.html" rel="prev">← {esc(notebook_title(order[i - 1]))}</a>'
                 if i > 0 else "")
    next_link = (f'<a href="{esc(order[i + 1])}.html" rel="next">{esc(notebook_title(order[i + 1]))} →</a>'
                 if 0 <= i < len(order) - 1 else "")
    contents = "".join(f'<li class="h{h.level}"><a href="#{esc(h.anchor)}">{h.html}</a></li>'
                       for h in heads if h.level >= 2)
    contents += ('<li><a href="#results">Results of this notebook</a></li>' if results else "") + \
        '<li><a href="#all-outputs">All outputs of this notebook</a></li>'
    pages = "".join(f'<li><a href="{esc(s)}.html">{esc(notebook_title(s))}</a></li>' for s in order if s != stem)
    return (f'<nav class="site" aria-label="Report"><div class="top"><a href="../index.html">↑ The report (index)</a>'
            f'<a href="{PAPER_URL}">The paper</a></div>'
            f'<div class="top">{prev_link}{next_link}</div>'
            f'<div><strong>{esc(notebook_title(stem))}</strong>'
            + (f'<br><small>{esc(meta)}</small>' if meta else "") +
            f'</div><details open><summary>Contents</summary><ol>{contents}</ol>'
            f'<p><strong>Other notebooks</strong></p><ol>{pages}</ol></details></nav>'
            # On a narrow screen the contents start folded, so the page's own text comes first.
            '<script>if (window.innerWidth < 1000) document.querySelector("nav.site details").removeAttribute("open");'
            '</script>')


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


# nbconvert's lab template draws no alternative text for a PNG output (and then writes a placeholder): this block
# writes the one prepare_notebook puts in the output's metadata.
_ALT_TEXT_BLOCK = """
{% block data_png scoped %}
{%- set alt = output | get_metadata('alt', 'image/png') -%}
{%- if alt -%}{{ super() | replace('<img ', '<img alt="' ~ (alt | escape_html) ~ '" ', 1) }}
{%- else -%}{{ super() }}{%- endif -%}
{% endblock data_png %}
"""


def _number(value, signed: bool = False) -> str:
    if value is None:
        return "n/a"
    return (f"{value:+.3g}" if signed else f"{value:.3g}").replace("-", "−")


def results_html(output_dir: Path, stem: str) -> str:
    """The notebook's results as its folder's results file states them (``verdicts.json``, computed from the files
    when absent): the primary comparison as declared and as observed, each index row's status and headline with the
    rule that gave it, and the verdicts the README quotes. Empty for a notebook no claim declares."""
    try:
        data = claim_results(output_dir, claim_for(stem))
    except ValueError:
        return ""
    if not data:
        return ""
    esc = _html.escape
    source = (f'<a href="../{esc(stem)}/{verdicts.FILE}">{verdicts.FILE}</a>'
              if (Path(output_dir) / stem / verdicts.FILE).exists() else "the files below (no results file yet)")
    parts = ['<section class="results"><h2 id="results">Results of this notebook</h2>',
             f"<p>As computed from {source} by the rules the claim declares, under preregistration.yaml "
             f"(sha256 {esc(str(data.get('preregistration', {}).get('sha256', ''))[:12])}).</p>"]
    primary = data.get("primary")
    if primary and primary.get("declared"):
        declared, observed = primary["declared"], primary.get("observed")
        numbers = (f"{_number(observed.get('estimate'), True)} [{_number(observed.get('low'), True)}, "
                   f"{_number(observed.get('high'), True)}], n = {observed.get('n')} {observed.get('units', '')}, "
                   f"p {_number(observed.get('p'))}, adjusted p {_number(observed.get('p_adjusted'))}; computed as "
                   f"{observed.get('computed', '')}" if observed else primary.get("missing", "not in this run"))
        parts.append(f"<p><strong>Primary comparison</strong> ({esc(declared['id'])}: {esc(declared['comparison'])}; "
                     f"{esc(declared['test'])}): {esc(numbers)}.</p>")
    rows = [f'<li><strong>{esc(row["item"])}</strong>: <span class="status">{esc(row["status"])}</span> — '
            f'{esc(row["headline"])}' + (f'<details><summary>rule</summary><p>{esc(row["rule"])}</p></details>'
                                          if row.get("rule") else "") + "</li>"
            for row in data.get("items", []) if row.get("produced")]
    if rows:
        parts.append("<ul>" + "".join(rows) + "</ul>")
    for finding in data.get("findings", []):
        parts.append(f"<p><strong>{esc(finding['label'])}</strong>: {esc(' '.join(finding['sentences']))}</p>")
    return "".join(parts) + "</section>"


def render_page(executed_ipynb: Path, output_dir: Path | None = None, *, meta: str = "") -> Path:
    """Render one executed notebook to ``<same folder>/<stem>.html`` as a page of the site; returns its path.

    ``output_dir`` is the report folder (default: the notebook's folder's parent). The page loads nothing
    from the network (nbconvert's CDN scripts are removed, math is MathML); it is written atomically.
    """
    import nbformat
    from nbconvert import HTMLExporter

    executed_ipynb = Path(executed_ipynb)
    output_dir = Path(output_dir) if output_dir is not None else executed_ipynb.parent.parent
    stem = executed_ipynb.stem
    notebook = nbformat.read(executed_ipynb, as_version=4)
    prepared = prepare_notebook(notebook, output_dir, stem)
    exporter = HTMLExporter(template_name="lab")
    exporter.raw_template = _OFFLINE_TEMPLATE + _ALT_TEXT_BLOCK
    page, _ = exporter.from_notebook_node(prepared, resources={"metadata": {"name": notebook_title(stem)}})
    remote = remote_resources(page)
    if remote:
        raise RuntimeError(f"The HTML rendering of {executed_ipynb.name} would load {remote} from the network; "
                           "remove them so it opens offline.")
    # nbconvert's heading-anchor filter round-trips headings through ElementTree, which writes MathML's
    # namespace as a prefix (<ns0:math>) that browsers do not draw as math: put the plain elements back.
    page = re.sub(r"<ns\d+:math\b", '<math xmlns="http://www.w3.org/1998/Math/MathML"', page)
    page = re.sub(r"(</?)ns\d+:(\w+)", r"\1\2", page)
    page = re.sub(r'\s+xmlns:ns\d+="[^"]*"', "", page)
    heads = headings(page)
    order = notebook_order(output_dir)
    sections = file_sections(prepared, page, output_dir, stem)
    results = results_html(output_dir, stem)
    footer = ('<footer class="site">' + results + '<h2 id="all-outputs">All outputs of this notebook</h2>'
              + outputs_list_html(output_dir / stem, f"../{stem}/", sections, "")
              + f'<p><a href="../index.html">↑ The report (index)</a> · <a href="{stem}.ipynb">this notebook as .ipynb</a>'
              f' · <a href="{PAPER_URL}">{_html.escape(PAPER_TITLE)}</a></p></footer>')
    page = page.replace("</head>", f"<style>{SITE_STYLE}</style>\n</head>", 1)
    page = re.sub(r"(<body[^>]*>)", lambda m: m.group(1) + _nav(stem, order, heads, meta, bool(results))
                  + '<main class="page">',
                  page, count=1)
    page = page.replace("</body>", "</main>" + footer + "</body>", 1)
    target = executed_ipynb.with_suffix(".html")
    atomic_write_text(target, page)
    return target


def page_sections(output_dir: Path, stem: str) -> dict[str, str]:
    """File stem -> section anchor of the rendered page ``executed/<stem>.html`` (empty when absent)."""
    import nbformat

    output_dir = Path(output_dir)
    ipynb, page = output_dir / "executed" / f"{stem}.ipynb", output_dir / "executed" / f"{stem}.html"
    if not (ipynb.exists() and page.exists()):
        return {}
    prepared = prepare_notebook(nbformat.read(ipynb, as_version=4), output_dir, stem)
    return file_sections(prepared, page.read_text(encoding="utf-8"), output_dir, stem)


# --- the whole site --------------------------------------------------------------------------------

def run_meta(runs: dict) -> str:
    """Model, preset and date of the runs, once: "m · preset p · 2026-12-01" (ranges where they differ)."""
    if not runs:
        return ""
    models = sorted({str(r.get("model", "?")) for r in runs.values()})
    presets = sorted({str(r.get("preset", "?")) for r in runs.values()})
    dates = sorted({str(r.get("date", "?")) for r in runs.values()})
    date = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    return f"{', '.join(models)} · preset {', '.join(presets)} · {date}"
