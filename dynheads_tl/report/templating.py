"""The report's HTML from Jinja2 templates kept as package data, in one nbconvert template directory
(``report/templates/dynheads_site/``: its ``conf.json`` names nbconvert's ``lab`` template as its base).

- The notebook pages (``notebook.html.j2``) extend nbconvert's lab page through nbconvert's own template directories
  (:func:`page_exporter`).
- The index (``report.html.j2``) is rendered by a plain Jinja2 environment over the same folder (:func:`render`).
- Small pieces that a page's Markdown cells and tables carry (``parts.html.j2``) are its macros (:func:`part`).
- The stylesheets are files beside them (``notebook.css``, ``report.css``), inlined by ``stylesheet(name)`` so a page
  opens on its own.

The report's own templates autoescape; nbconvert's keep their rules (they write a notebook's HTML outputs unescaped,
by design). Data goes in as structures; no Python here or in the callers assembles HTML from strings.
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from bs4 import BeautifulSoup
from jinja2 import Environment, FileSystemLoader, pass_context
from nbconvert import HTMLExporter
from nbconvert.filters.markdown_mistune import MarkdownWithMath

from dynheads_tl.report.status import STATUS_CLASS
from dynheads_tl.report.text import MathMLRenderer

TEMPLATE_NAME = "dynheads_site"
TEMPLATES = Path(__file__).resolve().parent / "templates"  # nbconvert's base directory of template directories
SITE_TEMPLATES = TEMPLATES / TEMPLATE_NAME
PAGE_TEMPLATE = "notebook.html.j2"
INDEX_TEMPLATE = "report.html.j2"
PARTS_TEMPLATE = "parts.html.j2"


def _own_template(name: str | None) -> bool:
    """Whether ``name`` is one of the report's templates (they autoescape), not one of nbconvert's."""
    return name is not None and (SITE_TEMPLATES / name).is_file()


def stylesheet(name: str) -> str:
    """The stylesheet ``name`` of the template folder (a page inlines it, so it opens without the folder)."""
    return (SITE_TEMPLATES / name).read_text(encoding="utf-8")


def status_class(status: str) -> str:
    """The CSS class that colours a status badge (``report.css``)."""
    return STATUS_CLASS.get(status, "none")


def figure_output(html: str, alt: str = "", enlarge: str = "", zoom: str = "") -> str:
    """nbconvert's rendering of an image output with what it lacks: ``alt`` as the image's alternative text
    (nbconvert writes none and then a placeholder), and a click that shows it at full size: the image becomes a link
    to its figure file ``enlarge``, or, for an image with no file of its own, to ``#<zoom>``, a span around it that
    opens over the page by CSS alone (``:target``, notebook.css), with a "Close" link back to the output
    (``<zoom>-inline``). Unchanged where none is given."""
    if not (alt or enlarge or zoom):
        return str(html)
    soup = BeautifulSoup(str(html), "html.parser")
    for image in soup.find_all("img"):
        if alt:
            image["alt"] = alt
        if not (enlarge or zoom):
            continue
        link = soup.new_tag("a", attrs={"class": "enlarge", "href": enlarge or f"#{zoom}",
                                        "title": "Show this figure at full size"})
        image.wrap(link)
        if zoom:
            link.wrap(soup.new_tag("span", attrs={"class": "zoom", "id": zoom}))
            close = soup.new_tag("a", attrs={"class": "zoom-close", "href": f"#{zoom}-inline"})
            close.string = "Close"
            link.insert_after(close)
            output = image.find_parent("div")
            if output is not None:
                output["id"] = f"{zoom}-inline"
    return str(soup)


# Inline code as a docstring (reStructuredText, Sphinx) or a note (Markdown) writes it: a role such as
# :func:`~pkg.module.name` or :data:`.config.PRIMARY`, a ``literal``, a Markdown `code span`.
_INLINE_CODE = re.compile(r":(?:py:)?[a-z]+:`(?P<role>[^`]+)`|``(?P<literal>[^`]+?)``|`(?P<span>[^`]+)`")


def _role_target(target: str) -> str:
    """A Sphinx role's target as Sphinx shows it: ``~a.b.name`` as ``name``, ``.config.PRIMARY`` as
    ``config.PRIMARY``, an explicit title (``title <target>``) as its title."""
    title = re.fullmatch(r"(.+?)\s*<[^>]+>", target)
    if title:
        return title.group(1)
    if target.startswith("~"):
        return target[1:].rsplit(".", 1)[-1]
    return target.lstrip(".")


def inline_code(text: str) -> list[tuple[str, str]]:
    """Plain text cut into ("text", …) and ("code", …) pieces: a Sphinx role (``:func:`~a.b.name```: ``name``), a
    reST ``literal`` and a Markdown `code span` are code, without their markup. The macro ``code_text`` of
    ``parts.html.j2`` draws them (code as ``<code>``, all escaped): a status rule (a docstring) and the index's notes
    would otherwise show their backticks and roles raw."""
    text, pieces, start = str(text), [], 0
    for match in _INLINE_CODE.finditer(text):
        if match.start() > start:
            pieces.append(("text", text[start:match.start()]))
        pieces.append(("code", _role_target(match.group("role")) if match.group("role") is not None
                       else match.group("literal") if match.group("literal") is not None else match.group("span")))
        start = match.end()
    if start < len(text):
        pieces.append(("text", text[start:]))
    return pieces


def _install(environment: Environment) -> Environment:
    environment.globals["stylesheet"] = stylesheet
    environment.filters["status_class"] = status_class
    environment.filters["figure_output"] = figure_output
    environment.filters["markdown"] = markdown_html
    environment.filters["inline_code"] = inline_code
    return environment


@lru_cache(maxsize=1)
def environment() -> Environment:
    """The Jinja2 environment of the index and the pieces (autoescaping on)."""
    return _install(Environment(loader=FileSystemLoader(SITE_TEMPLATES), autoescape=True, trim_blocks=True,
                                lstrip_blocks=True, keep_trailing_newline=True))


def render(template: str, **context) -> str:
    """The template ``template`` of the folder rendered with ``context``."""
    return environment().get_template(template).render(**context)


def part(name: str, *args) -> str:
    """The macro ``name`` of ``parts.html.j2`` called with ``args``: a small piece of HTML, escaped as it is built."""
    return str(getattr(environment().get_template(PARTS_TEMPLATE).module, name)(*args))


def markdown_html(source: str, **options) -> str:
    """Markdown as the site shows it: nbconvert's Markdown renderer (mistune, with its tokenising of ``$…$`` and
    ``$$…$$``) drawing math as MathML (:class:`~dynheads_tl.report.text.MathMLRenderer`); ``options`` are
    nbconvert's renderer options."""
    return MarkdownWithMath(renderer=MathMLRenderer(escape=False, **options)).render(source)


class PageExporter(HTMLExporter):
    """nbconvert's HTML exporter with the report's template directory, Markdown math as MathML, and the report's
    own templates autoescaped."""

    def _create_environment(self):
        environment = super()._create_environment()
        environment.autoescape = _own_template
        return _install(environment)

    @pass_context
    def markdown2html(self, context, source):
        """nbconvert's Markdown filter (the same options) through :func:`markdown_html`."""
        cell = context.get("cell", {})
        return markdown_html(source, attachments=cell.get("attachments", {}), embed_images=self.embed_images,
                             path=context.get("resources", {}).get("metadata", {}).get("path", ""),
                             anchor_link_text=self.anchor_link_text, exclude_anchor_links=self.exclude_anchor_links,
                             **self.lexer_options)


def page_exporter(**filters) -> PageExporter:
    """An exporter that renders a notebook as a page of the site (``notebook.html.j2``), with ``filters`` added."""
    exporter = PageExporter(template_name=TEMPLATE_NAME, extra_template_basedirs=[str(TEMPLATES)],
                            template_file=PAGE_TEMPLATE)
    for name, function in filters.items():
        exporter.register_filter(name, function)
    return exporter
