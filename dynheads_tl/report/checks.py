"""The checks a committed report must pass: ``report_problems`` lists what keeps an output folder from being a report
to commit (failed notebooks, machine paths, dead links, stale numbers, pages that load from the network)."""
from __future__ import annotations

import json as _json
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

from dynheads_tl.report.items import _rel, index_items, ours_text
from dynheads_tl.report.legend import enclosing_reports
from dynheads_tl.report.results import is_model_report, model_reports, preset_reports, read_runs
from dynheads_tl.report.site import remote_resources
from dynheads_tl.verdicts import FILE, RECORDED, recorded_outputs

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


def _link_problem(target: str, source: str, output_dir: Path, up: frozenset[Path] = frozenset()) -> str | None:
    """What is wrong with one link of ``source``, or None. A link may leave the folder only to ``up``: the index
    (index.html, README.md) of a report that holds this one (:func:`~dynheads_tl.report.legend.enclosing_reports`),
    published with it."""
    if target.startswith("#"):
        return None
    if target.lower().startswith("file:") or target.startswith("/") or _WINDOWS_PATH.match(target):
        return f"{source} links to the absolute path {target}"
    if _SCHEME.match(target):  # http(s), mailto, data: not files of the folder
        return None
    relative = unquote(target.split("#", 1)[0].split("?", 1)[0])
    resolved = (output_dir / relative).resolve()
    if not resolved.is_relative_to(output_dir.resolve()) and resolved not in up:
        return f"{source} links to {target}, outside the folder"
    if not resolved.is_file():
        return f"{source} links to {target}, which does not exist"
    return None


def link_problems(output_dir: Path) -> list[str]:
    """Links in ``index.html`` (href, src) and ``README.md`` (Markdown links) that are absolute, leave
    the folder (other than back up to the index of a report that holds it), or point to a file that does not
    exist."""
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
    up = frozenset(folder / name for _, folder in enclosing_reports(output_dir) for name in ("index.html", "README.md"))
    problems = [_link_problem(target, source, output_dir, up) for source, target in targets]
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
    items = {item.item for _, item in index_items()}
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
    expected = {item.item: ours_text(output_dir, item.item) for _, item in index_items()}
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


NOT_OUTPUTS = frozenset({RECORDED, FILE, "hotpot_questions.csv"})  # a notebook folder's files that no cell records


def stale_output_problems(output_dir: Path) -> list[str]:
    """Files in a notebook folder that its run did not record as an output (:func:`~dynheads_tl.verdicts.record_output`):
    an earlier run's, which the pages would list beside this run's as if this run had written them."""
    problems = []
    for record in sorted(Path(output_dir).glob(f"*/{RECORDED}")):
        stems = set(recorded_outputs(record.parent))
        stale = sorted(p.name for p in record.parent.iterdir()
                       if p.is_file() and p.name not in NOT_OUTPUTS and p.name.split(".")[0] not in stems)
        if stale:
            problems.append(f"{record.parent.name}/ holds files its run did not write (an earlier run's): "
                            f"{', '.join(stale)}")
    return problems


def report_problems(output_dir: Path) -> list[str]:
    """Everything that keeps ``output_dir`` from being a report to commit; empty when it is one. A folder that lists
    reports (the report's root, a preset's folder) is checked whole: its own indexes' links, and every model's report
    under it as one report (notebooks, links, headlines), each problem prefixed with its folder."""
    output_dir = Path(output_dir)
    listing = [] if is_model_report(output_dir) else [p.folder for p in preset_reports(output_dir)] + [output_dir]
    reports = [report.folder for folder in listing for report in model_reports(folder)]
    if not reports:
        return (notebook_problems(output_dir) + path_problems(output_dir) + link_problems(output_dir)
                + headline_problems(output_dir) + offline_problems(output_dir) + stale_output_problems(output_dir))
    problems = path_problems(output_dir) + offline_problems(output_dir)
    for folder in listing:
        problems += [f"{_rel(folder, output_dir)}/: {problem}" if folder != output_dir else problem
                     for problem in link_problems(folder)]
    for folder in reports:
        problems += [f"{_rel(folder, output_dir)}/: {problem}" for problem in
                     notebook_problems(folder) + link_problems(folder) + headline_problems(folder)
                     + stale_output_problems(folder)]
    return problems
