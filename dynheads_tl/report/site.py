"""The report as a site: each executed notebook rendered as a page a researcher reads, beside the index.

Everything here reads only what a run left in the output folder (the executed notebooks, the figures and
tables, ``runs.json``), so the site can be re-rendered from a committed report without running a model::

    python -m dynheads_tl.report.rerender papers_figures            # pages + index

The page is nbconvert's lab page from the template ``notebook.html.j2`` (:mod:`dynheads_tl.report.templating`), with
the page's data passed in as a :class:`Page`. What it gets that nbconvert alone does not give it:

- **Math rendered offline.** ``$…$`` and ``$$…$$`` in Markdown, as nbconvert's Markdown renderer tokenises them,
  become MathML at render time (``latex2mathml``), which browsers draw natively: no script, no network, no raw TeX.
- **Navigation.** A contents sidebar (a header on narrow screens) with a link back to the index,
  previous / next notebook, the page's own headings and its list of every output file.
- **A report, not a log.** stderr and progress lines are dropped; the parameters cell and papermill's
  injected-parameters cell are folded into one closed ``<details>``; tables longer than
  :data:`MAX_TABLE_ROWS` are cut with the full CSV linked; long verdict paragraphs become bullets, one
  sentence each (the sentences themselves are untouched).
- **Figures described.** Each figure gets alternative text naming its file, its section and the CSV of the numbers
  it plots (nbconvert alone writes a placeholder).
- **Figures enlarged.** A click on a figure shows it at full size (the page scales a wide one down to its column):
  it links to its PNG file beside the page; an image with no file opens over the page (CSS ``:target``, no script).

The rendered HTML is read with BeautifulSoup (headings, the section above each cell, network loads), never with
regular expressions.
"""
from __future__ import annotations

import base64
import copy
import functools
import hashlib
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from bs4 import BeautifulSoup, SoupStrainer

from dynheads_tl import verdicts
from dynheads_tl.claims import claim_for
from dynheads_tl.report.results import claim_results
from dynheads_tl.report.templating import page_exporter, part
from dynheads_tl.report.text import verdict_bullets
from dynheads_tl.store import atomic_write, atomic_write_text

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
    (:func:`dynheads_tl.verdicts.outputs`: the cell each figure and table was saved from, recorded as it was
    written). A file's cell is the one with the id recorded for it (where the front end sent the kernel an id),
    else the one code cell whose source has the recorded digest (a source two cells share names neither). A figure
    recorded without either (a run made before the results file recorded them) is found by its image: the cell
    whose PNG output is the figure's file, byte for byte. A table without either is not placed: its page links the
    list of every output instead. No execution count or position is used: the counts older results files hold were
    one past the writing cell's."""
    outputs = verdicts.outputs(folder)
    code = [cell for cell in notebook.cells if cell.cell_type == "code" and cell.get("id")]
    ids = {cell["id"] for cell in code}
    by_source: dict[str, list[str]] = {}
    by_image: dict[str, str] = {}
    for cell in code:
        by_source.setdefault(verdicts.source_digest(cell.source), []).append(cell["id"])
        for output in cell.get("outputs", []):
            png = output.get("data", {}).get("image/png")
            if png:
                by_image.setdefault(_png_digest(base64.b64decode("".join(png))), cell["id"])
    found: dict[str, list[str]] = {}
    for entry in outputs:
        cell = entry.get("cell_id") if entry.get("cell_id") in ids else None
        if cell is None and entry.get("cell_source"):
            matches = by_source.get(entry["cell_source"], [])
            cell = matches[0] if len(matches) == 1 else None
        if cell is None and f"{entry['stem']}.png" in entry["files"]:
            cell = by_image.get(_png_digest((folder / f"{entry['stem']}.png").read_bytes()))
        if cell is not None:
            found.setdefault(cell, []).append(entry["stem"])
    return found


def _describe_images(outputs: list, stems: list[str], folder: Path, section: str, zoom_ids=None) -> None:
    """Alternative text for each PNG output that has none (nbconvert would write a placeholder): the figure file
    it shows (found by its bytes), its caption where the notebook recorded one, and the table of the numbers it
    plots, under its section. And how a click shows it at full size (notebook.html.j2): ``enlarge``, the link to its
    figure file beside the page; an image with no file gets ``zoom``, an id unique on the page (the next of
    ``zoom_ids``), and opens over the page."""
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    files = {_png_digest((folder / f"{stem}.png").read_bytes()): stem for stem in stems
             if (folder / f"{stem}.png").exists()}
    captions = {entry["stem"]: entry.get("caption", "") for entry in verdicts.outputs(folder)} if files else {}
    zoom_ids = zoom_ids if zoom_ids is not None else itertools.count(1)
    for i, output in enumerate(images):
        metadata = output.setdefault("metadata", {}).setdefault("image/png", {})
        stem = files.get(_png_digest(base64.b64decode("".join(output["data"]["image/png"]))))
        if stem:
            metadata["enlarge"] = f"../{folder.name}/{stem}.png"
            # the page shows the figure's own file (nbconvert reads metadata.filenames), not a base64 copy
            output["metadata"]["filenames"] = {"image/png": metadata["enlarge"]}
        else:
            metadata["zoom"] = f"figure-{next(zoom_ids)}"
        if metadata.get("alt"):
            continue
        where = f"under “{re.sub(r'[*`$]', '', section)}”"
        if stem:
            data = folder / f"{stem}.csv"
            numbers = f"; the numbers it plots are in {data.name}" if data.exists() else ""
            caption = f" ({captions[stem]})" if captions.get(stem) else ""
            metadata["alt"] = f"Figure {stem}{caption} {where}{numbers}."
        else:
            metadata["alt"] = f"Figure {i + 1} of {len(images)} of this cell {where}."


_ROW_COUNT = re.compile(r"^\d+ rows × \d+ columns$")  # pandas' line under a long table


def shorten_table(html: str, files: list[tuple[str, str]]) -> str:
    """An HTML table of more than :data:`MAX_TABLE_ROWS` body rows cut to :data:`TABLE_ROWS_SHOWN`, with a note
    after it linking ``files`` (name, href), or the page's list of every output when there are none; other HTML
    unchanged."""
    soup = BeautifulSoup(html, "html.parser")
    body = soup.find("tbody")
    rows = body.find_all("tr", recursive=False) if body else []
    if len(rows) <= MAX_TABLE_ROWS:
        return html
    for row in rows[TABLE_ROWS_SHOWN:]:
        row.decompose()
    for count in soup.find_all("p", string=_ROW_COUNT):
        count.decompose()
    soup.append(BeautifulSoup(part("table_note", TABLE_ROWS_SHOWN, len(rows), files), "html.parser"))
    return str(soup)


def prepare_notebook(notebook, output_dir: Path, stem: str):
    """A copy of an executed notebook ready to render (see the module docstring); ``notebook`` is untouched."""
    nb = copy.deepcopy(notebook)
    folder = output_dir / stem
    written = cell_files(nb, folder)
    # A cut table links the CSVs its cell wrote only where every file's cell is known: a file written without its
    # cell recorded (a results file of a run before cells were) may be any cell's, so no cell's list is complete,
    # and each cut table links the page's list of every output instead.
    placed = {name for names in written.values() for name in names}
    complete = all(entry["stem"] in placed or entry.get("cell_id") or entry.get("cell_source")
                   for entry in verdicts.outputs(folder))
    cells, parameters = [], []
    zoom_ids = itertools.count(1)  # the ids of the images with no file of their own, unique on the page
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
                    data["text/markdown"] = verdict_bullets(data["text/markdown"])
                if "text/html" in data and "<table" in data["text/html"]:
                    files = [(f"{name}.csv", f"../{stem}/{name}.csv") for name in written.get(cell.get("id"), [])
                             if complete and (folder / f"{name}.csv").exists()]
                    data["text/html"] = shorten_table(data["text/html"], files)
                outputs.append(output)
            cell.outputs = outputs
            _describe_images(outputs, written.get(cell.get("id"), []), folder, section, zoom_ids)
        cells.append(cell)
    if parameters:
        # A fixed id (nbformat would draw a random one), so rendering the same run twice gives the same page.
        folded = nbformat.v4.new_markdown_cell(part("parameters", parameters), id="parameters-of-this-run")
        cells = [folded if c is None else c for c in cells]
    nb.cells = cells
    return nb


# --- sections: which heading makes which file ------------------------------------------------------

_HEADINGS = ("h1", "h2", "h3")


@dataclass(frozen=True)
class Heading:
    level: int
    anchor: str
    html: str  # the heading's content (its markup as rendered) without its pilcrow link
    text: str  # what it reads, spaces collapsed


@dataclass(frozen=True)
class Outline:
    headings: list[Heading]
    sections: dict[str, str]  # file stem -> the anchor of the heading above the cell that wrote it


def _is_heading(tag) -> bool:
    return tag.name in _HEADINGS and tag.has_attr("id")


def _heading(tag) -> Heading:
    content = copy.copy(tag)
    for link in content.find_all("a", class_="anchor-link"):
        link.decompose()
    return Heading(int(tag.name[1]), tag["id"], content.decode_contents().strip(), " ".join(content.get_text().split()))


def headings(page: str) -> list[Heading]:
    """The headings (levels 1 to 3, with an id) of the rendered ``page``, in order."""
    return [_heading(tag) for tag in BeautifulSoup(page, "html.parser").find_all(_is_heading)]


def page_outline(page: str, cell_files: dict[str, list[str]]) -> Outline:
    """The headings of the rendered ``page`` (or of its cells), and for each file stem of ``cell_files`` (cell id ->
    the stems it wrote, :func:`cell_files`) the anchor of the last heading before its cell."""
    cells = {f"cell-id={cell}": stems for cell, stems in cell_files.items()}
    found, sections, above = [], {}, None
    for tag in BeautifulSoup(str(page), "html.parser").find_all(lambda t: _is_heading(t) or t.get("id") in cells):
        if _is_heading(tag):
            found.append(_heading(tag))
            above = tag["id"]
        elif above is not None:
            for name in cells[tag["id"]]:
                sections.setdefault(name, above)
    return Outline(found, sections)


@functools.lru_cache(maxsize=256)
def _file_headings(path: str, mtime_ns: int, size: int) -> tuple[Heading, ...]:
    """:func:`headings` of the page file at ``path``, parsed once per version of the file (its modification time
    and size are part of the key): the findings and the index look up many sections of the same pages."""
    return tuple(headings(Path(path).read_text(encoding="utf-8")))


def section_anchor(page_path: Path, section: str) -> str:
    """``#anchor`` of the heading whose text is ``section`` in the rendered page at ``page_path``, or "" when the
    page or the heading is missing."""
    if not section or not Path(page_path).exists():
        return ""
    stat = Path(page_path).stat()
    found = _file_headings(str(Path(page_path).resolve()), stat.st_mtime_ns, stat.st_size)
    return next((f"#{h.anchor}" for h in found if h.text == section), "")


def page_sections(output_dir: Path, stem: str) -> dict[str, str]:
    """File stem -> section anchor of the rendered page ``executed/<stem>.html`` (empty when absent)."""
    output_dir = Path(output_dir)
    ipynb, page = output_dir / "executed" / f"{stem}.ipynb", output_dir / "executed" / f"{stem}.html"
    if not (ipynb.exists() and page.exists()):
        return {}
    written = cell_files(nbformat.read(ipynb, as_version=4), output_dir / stem)
    return page_outline(page.read_text(encoding="utf-8"), written).sections


# --- the page's data -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Link:
    href: str
    title: str


@dataclass(frozen=True)
class OutputGroup:
    """One figure or table of a notebook's folder and every file it was written as."""
    stem: str
    kind: str  # figure, table, or results (the folder's verdicts.json)
    files: list[tuple[str, str]]  # (label, href): png, pdf, csv, md, config, ...


def output_groups(folder: Path, link_prefix: str) -> list[OutputGroup]:
    """The files of a notebook's folder grouped by stem, figures first, each file linked as ``link_prefix + name``."""
    groups: dict[str, list[tuple[str, str]]] = {}
    if not folder.is_dir():
        return []
    for path in sorted(folder.iterdir()):
        if not path.is_file() or path.name.endswith(".tmp"):
            continue
        label = "config" if path.name.endswith(".config.json") else path.suffix.lstrip(".")
        groups.setdefault(path.name.split(".")[0], []).append((label, f"{link_prefix}{path.name}"))
    order = {"png": 0, "pdf": 1, "csv": 2, "md": 3, "config": 4}
    found = []
    for stem, links in groups.items():
        figure = any(label == "png" for label, _ in links)
        kind = "figure" if figure else "results" if f"{stem}.json" == verdicts.FILE else "table"
        found.append(OutputGroup(stem, kind, sorted(links, key=lambda link: order.get(link[0], 9))))
    return sorted(found, key=lambda group: (group.kind != "figure", group.stem))


def notebook_order(output_dir: Path) -> list[str]:
    return sorted(p.stem for p in (Path(output_dir) / "executed").glob("[0-9][0-9]_*.ipynb")
                  if not p.name.endswith(".failed.ipynb"))


@dataclass(frozen=True)
class Primary:
    id: str
    comparison: str
    test: str
    numbers: str  # the estimate with its interval, n, p and adjusted p, or why it is missing


@dataclass(frozen=True)
class ResultRow:
    item: str
    status: str
    headline: str
    rule: str


@dataclass(frozen=True)
class PageResults:
    """A notebook's results as its folder's results file states them, for the end of its page."""
    file: str
    source: str | None  # the link to the results file; None when computed from the files (no file yet)
    sha256: str  # the first digits of preregistration.yaml's
    primary: Primary | None
    rows: list[ResultRow]
    findings: list[tuple[str, str]]  # (label, the verdict's sentences)


def _number(value, signed: bool = False) -> str:
    if value is None:
        return "n/a"
    return (f"{value:+.3g}" if signed else f"{value:.3g}").replace("-", "−")


def page_results(output_dir: Path, stem: str) -> PageResults | None:
    """The notebook's results (``verdicts.json``, computed from the files when absent): the primary comparison as
    declared and as observed, each index row's status and headline with the rule that gave it, and the verdicts the
    README quotes. None for a notebook no claim declares."""
    try:
        data = claim_results(output_dir, claim_for(stem))
    except ValueError:
        return None
    if not data:
        return None
    primary = data.primary
    stated = None
    if primary is not None and primary.declared is not None:
        declared, observed = primary.declared, primary.observed
        numbers = (f"{_number(observed.estimate, True)} [{_number(observed.interval.low, True)}, "
                   f"{_number(observed.interval.high, True)}], n = {observed.n} {observed.units}, "
                   f"p {_number(observed.p)}, adjusted p {_number(observed.p_adjusted)}; computed as "
                   f"{observed.computed}" if observed is not None else primary.missing or "not in this run")
        stated = Primary(declared.id, declared.comparison, declared.test, numbers)
    present = (Path(output_dir) / stem / verdicts.FILE).exists()
    return PageResults(
        verdicts.FILE, f"../{stem}/{verdicts.FILE}" if present else None,
        str(data.preregistration.sha256)[:12], stated,
        [ResultRow(row.item, row.status, row.headline, "; ".join(row.declared_rule or []))
         for row in data.items if row.produced],
        [(finding.label, " ".join(finding.sentences)) for finding in data.findings])


@dataclass(frozen=True)
class Page:
    """What a notebook page shows besides the notebook (``notebook.html.j2``)."""
    stem: str
    title: str
    meta: str  # model, preset and date of the runs
    previous: Link | None
    next: Link | None
    others: list[Link]  # every other notebook's page
    results: PageResults | None
    outputs: list[OutputGroup]
    cell_files: dict[str, list[str]] = field(default_factory=dict)  # cell id -> the file stems it wrote
    paper_url: str = PAPER_URL
    paper_title: str = PAPER_TITLE


def _page(output_dir: Path, stem: str, notebook, meta: str) -> Page:
    order = notebook_order(output_dir)
    link = lambda other: Link(f"{other}.html", notebook_title(other))  # noqa: E731
    i = order.index(stem) if stem in order else -1
    return Page(stem, notebook_title(stem), meta, link(order[i - 1]) if i > 0 else None,
                link(order[i + 1]) if 0 <= i < len(order) - 1 else None,
                [link(other) for other in order if other != stem], page_results(output_dir, stem),
                output_groups(output_dir / stem, f"../{stem}/"), cell_files(notebook, output_dir / stem))


# --- the page --------------------------------------------------------------------------------------

# A script or stylesheet fetched from the network, and `import ... from "https://..."` / `import("https://...")` in
# a script's text.
_REMOTE_URL = re.compile(r"^\s*(?:https?:)?//", re.I)
_REMOTE_IMPORT = re.compile(r"""\bimport\s*(?:\(\s*|[\w{}\s,*]*?\bfrom\s*)["'](?:https?:)?//[^"']*""", re.I)


def remote_resources(page: str) -> list[str]:
    """Scripts, stylesheets and module imports that ``page`` would fetch from the network ("script URL", "link URL"
    and the import statement)."""
    soup = BeautifulSoup(page, "html.parser", parse_only=SoupStrainer(["script", "link"]))  # 4x faster on a page
    found = {f"script {tag['src']}" for tag in soup.find_all("script", src=_REMOTE_URL)}
    found |= {f"link {tag['href']}" for tag in soup.find_all("link", href=_REMOTE_URL)}
    found |= {m.group(0) for script in soup.find_all("script") for m in _REMOTE_IMPORT.finditer(script.string or "")}
    return sorted(text[:200] for text in found)


def extract_images(notebook, folder: Path, stem: str) -> list[Path]:
    """Write every PNG output of ``notebook`` that has no figure file of its own (:func:`_describe_images` points
    the others at theirs) to ``<folder>/<stem>_files/<sha256 prefix>.png`` and point the output at it, so the page
    links image files instead of embedding them as base64 (a file whose bytes did not change keeps its name, and
    git stores it once across regenerations). Files of an earlier rendering that no output shows are removed."""
    files = Path(folder) / f"{stem}_files"
    written = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            png = output.get("data", {}).get("image/png")
            metadata = output.setdefault("metadata", {})
            if not png or "image/png" in metadata.get("filenames", {}):
                continue
            data = base64.b64decode("".join(png))
            path = files / f"{_png_digest(data)[:16]}.png"
            files.mkdir(parents=True, exist_ok=True)
            if not path.exists() or path.read_bytes() != data:
                atomic_write(path, lambda handle, data=data: handle.write(data))
            metadata["filenames"] = {"image/png": f"{files.name}/{path.name}"}
            written.append(path)
    for old in (files.iterdir() if files.is_dir() else []):
        if old not in written:
            old.unlink()
    if files.is_dir() and not any(files.iterdir()):
        files.rmdir()
    return written


def render_page(executed_ipynb: Path, output_dir: Path | None = None, *, meta: str = "") -> Path:
    """Render one executed notebook to ``<same folder>/<stem>.html`` as a page of the site; returns its path.

    ``output_dir`` is the report folder (default: the notebook's folder's parent). The page loads nothing
    from the network (nbconvert's CDN scripts are left out, math is MathML); it is written atomically.
    """
    executed_ipynb = Path(executed_ipynb)
    output_dir = Path(output_dir) if output_dir is not None else executed_ipynb.parent.parent
    stem = executed_ipynb.stem
    notebook = nbformat.read(executed_ipynb, as_version=4)
    prepared = prepare_notebook(notebook, output_dir, stem)
    extract_images(prepared, executed_ipynb.parent, stem)
    exporter = page_exporter(page_outline=page_outline)
    page, _ = exporter.from_notebook_node(prepared, resources={"metadata": {"name": notebook_title(stem)},
                                                              "site": _page(output_dir, stem, prepared, meta)})
    remote = remote_resources(page)
    if remote:
        raise RuntimeError(f"The HTML rendering of {executed_ipynb.name} would load {remote} from the network; "
                           "remove them so it opens offline.")
    target = executed_ipynb.with_suffix(".html")
    atomic_write_text(target, page)
    return target


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
