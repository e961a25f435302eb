"""The Markdown a report page shows, as text: TeX drawn as MathML (browsers draw it offline, no script), raw TeX
found where it was left, and verdict paragraphs split into sentences and bullets (the sentences untouched). The site
(:mod:`dynheads_tl.report.site`) and the findings page (:mod:`dynheads_tl.report.findings`) use them."""
from __future__ import annotations

import re
from urllib.parse import quote

from bs4 import BeautifulSoup
from latex2mathml.converter import convert
from nbconvert.filters.markdown_mistune import IPythonRenderer

from dynheads_tl.claim import sentences

LONG_PARAGRAPH = 300  # characters: a verdict paragraph longer than this becomes one bullet per sentence


# --- TeX to MathML ---------------------------------------------------------------------------------

def tex_to_mathml(tex: str, display: bool = False) -> str:
    """One TeX formula as a MathML element (``latex2mathml``); a formula it cannot parse is shown as
    plain text in a ``<code>`` element rather than as raw TeX between dollars."""
    try:
        mathml = convert(tex.strip(), display="block" if display else "inline")
        # latex2mathml writes \setminus as U+29F5, which few fonts have; U+2216 is the usual set minus.
        return mathml.replace("&#x029F5;", "&#x02216;")
    except Exception:  # an unsupported command: readable, never a dollar-delimited source
        code = BeautifulSoup("", "html.parser").new_tag("code", attrs={"class": "tex"})
        code.string = tex
        return str(code)


def heading_anchor(text: str) -> str:
    """The id of a heading whose text is ``text``, by nbconvert's rule (spaces to dashes, URL-quoted): a section's
    address is the one nbconvert gives it."""
    return quote(text.replace(" ", "-"), safe="?/:@!$&'()*+,;=")


class MathMLRenderer(IPythonRenderer):
    """nbconvert's Markdown renderer, whose parser already tokenises ``$…$`` and ``$$…$$`` (outside code spans and
    fences), with the math drawn as MathML instead of left as TeX for MathJax.

    Headings get nbconvert's id and pilcrow link, added through BeautifulSoup: nbconvert's own round trip through
    ElementTree writes MathML in a heading with a namespace prefix (``<ns0:math>``) that browsers do not draw."""

    def inline_math(self, body: str) -> str:
        return tex_to_mathml(body)

    def block_math(self, body: str) -> str:
        return tex_to_mathml(body, display=True)

    def heading(self, text: str, level: int, **attrs) -> str:
        html = super(IPythonRenderer, self).heading(text, level, **attrs)  # mistune's, without nbconvert's anchor
        if self.exclude_anchor_links:
            return html
        heading = BeautifulSoup(html, "html.parser").find(f"h{level}")
        anchor = heading_anchor(heading.get_text())
        heading["id"] = anchor
        link = BeautifulSoup("", "html.parser").new_tag("a", attrs={"class": "anchor-link", "href": f"#{anchor}"})
        link.string = self.anchor_link_text
        heading.append(link)
        return str(heading)


# Raw TeX a reader would see: $…$ around a backslash command, sub/superscript or a single letter.
_RAW_TEX = re.compile(r"\$[^$\n<>]{0,80}?(\\[A-Za-z]+|[_^|{}]|\b[A-Za-z]\b)[^$\n<>]{0,80}?\$")


def raw_tex(text: str) -> list[str]:
    """Dollar-delimited TeX left in the visible text of an HTML page or of a page's text (scripts and styles left
    out)."""
    soup = BeautifulSoup(text, "html.parser")
    for hidden in soup.find_all(["script", "style"]):
        hidden.decompose()
    return sorted(set(m.group(0) for m in _RAW_TEX.finditer(soup.get_text(" "))))


# --- sentences and verdicts ------------------------------------------------------------------------



def verdict_bullets(markdown: str) -> str:
    """Long paragraphs of a verdict as bullets, one sentence each; a leading ``**Verdict.**`` or a bold
    wrapper stays as the list's bold lead. Bullets and short paragraphs are left as they are."""
    blocks = re.split(r"\n\s*\n", markdown.strip())
    out = []
    for block in blocks:
        lines = block.split("\n")
        if len(block) <= LONG_PARAGRAPH or any(l.lstrip().startswith(("-", "*", "|", "#")) and
                                                not l.lstrip().startswith("**") for l in lines):
            out.append(_bullet_long_list_items(block))
            continue
        text = " ".join(l.strip() for l in lines)
        lead = ""
        m = re.match(r"^\*\*(Verdict\.|[^*]{1,40}:)\*\*\s*", text)
        if m:
            lead, text = f"**{m.group(1)}**", text[m.end():]
        elif text.startswith("**") and text.endswith("**") and text.count("**") == 2:
            text = text[2:-2]
        items = "\n".join(f"- {s}" for s in sentences(text))
        out.append((lead + "\n\n" if lead else "") + items)
    return "\n\n".join(out)


def _bullet_long_list_items(block: str) -> str:
    """A bullet longer than :data:`LONG_PARAGRAPH` keeps its first sentence and nests the rest."""
    lines = []
    for line in block.split("\n"):
        stripped = line.lstrip()
        if stripped.startswith("- ") and len(stripped) > LONG_PARAGRAPH:
            first, *rest = sentences(stripped[2:])
            lines.append(f"- {first}")
            lines += [f"    - {s}" for s in rest]
        else:
            lines.append(line)
    return "\n".join(lines)
