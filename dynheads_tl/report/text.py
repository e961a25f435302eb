"""The Markdown a report page shows, as text: TeX turned into MathML (drawn by browsers offline, no script), raw TeX
found where it was left, and verdict paragraphs split into sentences and bullets (the sentences untouched). The site
(:mod:`dynheads_tl.report.site`) and the README's findings (:mod:`dynheads_tl.report.findings`) use them."""
from __future__ import annotations

import html as _html
import re

from dynheads_tl.claim import sentences

LONG_PARAGRAPH = 300  # characters: a verdict paragraph longer than this becomes one bullet per sentence


# --- TeX to MathML ---------------------------------------------------------------------------------

_CODE_SPAN = re.compile(r"(```.*?```|`[^`\n]*`)", re.S)
_DISPLAY_MATH = re.compile(r"\$\$(.+?)\$\$", re.S)
_INLINE_MATH = re.compile(r"(?<![\\$])\$(?!\s)([^$\n]+?)(?<![\s\\])\$(?!\$)")


def tex_to_mathml(tex: str, display: bool = False) -> str:
    """One TeX formula as a MathML element (``latex2mathml``); a formula it cannot parse is shown as
    plain text in a ``<code>`` element rather than as raw TeX between dollars."""
    from latex2mathml.converter import convert

    try:
        mathml = convert(tex.strip(), display="block" if display else "inline")
        # latex2mathml writes \setminus as U+29F5, which few fonts have; U+2216 is the usual set minus.
        return mathml.replace("&#x029F5;", "&#x02216;")
    except Exception:  # an unsupported command: readable, never a dollar-delimited source
        return f'<code class="tex">{_html.escape(tex)}</code>'


def markdown_math_to_mathml(text: str) -> str:
    """Replace ``$$…$$`` and ``$…$`` in Markdown (outside code spans and fences) with MathML."""
    parts = _CODE_SPAN.split(text)
    for i in range(0, len(parts), 2):  # even parts are outside code
        part = _DISPLAY_MATH.sub(lambda m: tex_to_mathml(m.group(1), display=True), parts[i])
        parts[i] = _INLINE_MATH.sub(lambda m: tex_to_mathml(m.group(1)), part)
    return "".join(parts)


# Raw TeX a reader would see: $…$ around a backslash command, sub/superscript or a single letter.
_RAW_TEX = re.compile(r"\$[^$\n<>]{0,80}?(\\[A-Za-z]+|[_^|{}]|\b[A-Za-z]\b)[^$\n<>]{0,80}?\$")


def raw_tex(text: str) -> list[str]:
    """Dollar-delimited TeX left in the visible text of an HTML page (scripts and styles left out)."""
    visible = re.sub(r"<(script|style)\b.*?</\1>", " ", text, flags=re.S | re.I)
    visible = re.sub(r"<[^>]+>", " ", visible)
    return sorted(set(m.group(0) for m in _RAW_TEX.finditer(_html.unescape(visible))))


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
