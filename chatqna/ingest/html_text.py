"""HTML: the page's main content as sections, parsed by selectolax (the Lexbor HTML5 parser).

The bytes are decoded as a browser would: a byte-order mark wins, then the charset of the
HTTP `Content-Type` header (for fetched links), then a `<meta charset>` or
`<meta http-equiv="Content-Type">` in the first 1024 bytes, else UTF-8. What a reader does
not see is dropped: navigation, footers, banners, scripts, styles, `<noscript>`,
`<template>`, `<svg>`, and elements that are `hidden`, `aria-hidden` or styled
`display: none` / `visibility: hidden`. The main content is `<main>` (or `role="main"`, or
the page's only `<article>`), else the body. Every `<h1>`-`<h6>` starts a section named by
its text, `<pre>` keeps its text verbatim, and a table becomes rows that name their columns
(a table nested in a cell is part of that cell's text).
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterator
from typing import Any

from selectolax.lexbor import LexborHTMLParser, LexborNode

from chatqna.errors import DocumentLoadError
from chatqna.ingest.tables import CellCounter, Counters, table_rows

__all__ = ["decode_declared", "decode_html", "html_sections"]

Sections = list[tuple[str, str]]

_DROPPED = (
    "script, style, noscript, template, svg, nav, footer, iframe, object, canvas, "
    "[hidden], [aria-hidden=true], input[type=hidden], [role=navigation], "
    "[role=contentinfo], [role=banner], body > header"
)
_INVISIBLE_STYLE = re.compile(r"display\s*:\s*none|visibility\s*:\s*hidden", re.IGNORECASE)
_HEADINGS = frozenset({"h1", "h2", "h3", "h4", "h5", "h6"})
_ROW_GROUPS = frozenset({"thead", "tbody", "tfoot"})
_CELLS = frozenset({"th", "td"})
_BLOCKS = frozenset(
    {
        "address", "article", "aside", "blockquote", "dd", "details", "div", "dl", "dt",
        "fieldset", "figcaption", "figure", "form", "header", "hr", "li", "main", "ol", "p",
        "section", "summary", "td", "th", "tr", "ul",
    }
)  # fmt: skip
_BOMS = (
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
_META_CHARSET = re.compile(
    rb"""<meta[^>]*?charset\s*=\s*["']?\s*([A-Za-z0-9._:-]+)""", re.IGNORECASE
)
# The HTML standard reads these labels as windows-1252, and a declared UTF-16 in a <meta>
# (which an ASCII-compatible prescan could not have read) as UTF-8.
_LABEL_OVERRIDES = {
    "iso-8859-1": "cp1252",
    "latin-1": "cp1252",
    "ascii": "cp1252",
    "us-ascii": "cp1252",
}


# Names Python's codec registry knows that are not encodings a page is written in. The
# bytes-to-bytes codecs (hex, zlib, base64, rot13...) are caught by `_is_text_encoding`;
# these three decode to text but raise on ordinary bytes or read them as something else.
# The Encoding standard knows no UTF-32 label, and a page whose <meta> an ASCII prescan could
# read is not UTF-32: both fall back as an unknown label does.
_NOT_PAGE_CODECS = frozenset({"idna", "undefined", "punycode"})


def _codec(label: str | None, *, from_meta: bool = False) -> str | None:
    """The Python codec for a charset label, or None for a label no browser would use.

    UTF-16 named by a `<meta>` is read as UTF-8, as the HTML standard says (the prescan
    that found it read the bytes as ASCII, which UTF-16 is not); named by the HTTP header,
    it is UTF-16, and plain `utf-16` (no byte-order mark: one would have won) is the
    little-endian form, as the Encoding standard reads that label.
    """
    if not label:
        return None
    label = label.strip().lower()
    try:
        info = codecs.lookup(_LABEL_OVERRIDES.get(label, label))
    except LookupError:
        return None
    name = info.name
    if not info._is_text_encoding or name in _NOT_PAGE_CODECS or name.startswith("utf-32"):
        return None
    if name.startswith("utf-16"):
        return "utf-8" if from_meta else {"utf-16": "utf-16-le"}.get(name, name)
    return name


def decode_declared(source: str, data: bytes, header_charset: str | None) -> str | None:
    """The text as its byte-order mark, else `header_charset` (through `_codec`) says it is
    encoded; None when neither says anything usable.

    Raises `DocumentLoadError` (reason `encoding`) when the bytes cannot be decoded.
    """
    for bom, bom_encoding in _BOMS:
        if data.startswith(bom):
            return data[len(bom) :].decode(bom_encoding, errors="replace")
    encoding = _codec(header_charset)
    return _decode_declared(source, data, encoding) if encoding is not None else None


def decode_html(source: str, data: bytes, header_charset: str | None = None) -> str:
    """The page's text, decoded by BOM, then `header_charset`, then `<meta>`, else UTF-8.

    Raises `DocumentLoadError` (reason `encoding`) when the bytes cannot be decoded.
    """
    declared = decode_declared(source, data, header_charset)
    if declared is not None:
        return declared
    match = _META_CHARSET.search(data[:1024])
    encoding = _codec(match.group(1).decode("ascii"), from_meta=True) if match else None
    if encoding is not None:
        return _decode_declared(source, data, encoding)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentLoadError(
            f"{source} is not valid UTF-8 and declares no charset (invalid byte at offset "
            f"{exc.start}); add <meta charset=...> or re-save it as UTF-8",
            reason="encoding",
        ) from exc


def _decode_declared(source: str, data: bytes, encoding: str) -> str:
    try:
        return data.decode(encoding, errors="replace")
    except (UnicodeError, LookupError) as exc:
        # `errors="replace"` covers bad bytes in every codec `_codec` lets through; a codec
        # that still fails is the page's fault, not the service's.
        raise DocumentLoadError(
            f"{source} cannot be decoded as its declared charset {encoding!r}: {exc}",
            reason="encoding",
        ) from exc


def _collapse(text: str) -> str:
    return " ".join(text.split())


class _Sections:
    """Accumulates paragraphs per section while the tree is walked."""

    def __init__(self) -> None:
        self.sections: list[tuple[str | None, list[str]]] = [(None, [])]
        self.inline: list[str] = []

    def text(self, text: str) -> None:
        self.inline.append(text)

    def line_break(self) -> None:
        self.inline.append("\n")

    def paragraph(self) -> None:
        lines = (_collapse(line) for line in "".join(self.inline).split("\n"))
        text = "\n".join(line for line in lines if line)
        if text:
            self.sections[-1][1].append(text)
        self.inline = []

    def verbatim(self, text: str) -> None:
        self.paragraph()
        kept = "\n".join(line.rstrip() for line in text.split("\n")).strip("\n")
        if kept.strip():
            self.sections[-1][1].append(kept)

    def heading(self, text: str) -> None:
        self.paragraph()
        self.sections.append((text, []))


def _drop_invisible(tree: LexborHTMLParser) -> None:
    for node in tree.css(_DROPPED):
        node.decompose()
    for node in tree.css("[style]"):
        if _INVISIBLE_STYLE.search(node.attributes.get("style") or ""):
            node.decompose()


def _main_content(tree: LexborHTMLParser) -> LexborNode | None:
    for selector in ("main", "[role=main]"):
        found = tree.css_first(selector)
        if found is not None:
            return found
    articles = tree.css("article")
    if len(articles) == 1:
        return articles[0]
    return tree.body if tree.body is not None else tree.root


def _own_rows(table: LexborNode) -> Iterator[LexborNode]:
    """The table's own `<tr>`s (its children, or its row groups' children): a nested
    table's rows are not this table's."""
    for child in table.iter():
        if child.tag == "tr":
            yield child
        elif child.tag in _ROW_GROUPS:
            yield from (row for row in child.iter() if row.tag == "tr")


def _cell_texts(table: LexborNode, cells: CellCounter) -> Iterator[list[str]]:
    for row in _own_rows(table):
        own = [cell for cell in row.iter() if cell.tag in _CELLS]
        cells.add(len(own))
        # A nested table is read as part of the cell that holds it, so its text is taken
        # once, not again at every level it is nested in.
        yield [cell.text(deep=True, separator=" ") for cell in own]


def _table(node: LexborNode, out: _Sections, counters: Counters) -> None:
    out.paragraph()
    for line in table_rows(_cell_texts(node, counters.cells), counters.text):
        out.text(line)
        out.paragraph()


def _walk(root: LexborNode, out: _Sections, counters: Counters) -> None:
    # An explicit stack: a page nested thousands of levels deep must not exhaust recursion.
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, leaving = stack.pop()
        tag = node.tag
        if leaving:
            out.paragraph()
        elif tag == "-text":
            out.text(node.text_content or "")
        elif not node.is_element_node:
            continue
        elif tag in _HEADINGS:
            heading = _collapse(node.text(deep=True, separator=" "))
            if heading:
                out.heading(heading)
        elif tag == "pre":
            out.verbatim(node.text(deep=True))
        elif tag == "table":
            _table(node, out, counters)
        elif tag == "br":
            out.line_break()
        else:
            if tag in _BLOCKS:
                out.paragraph()
                stack.append((node, True))
            children = list(node.iter(include_text=True))
            stack.extend((child, False) for child in reversed(children))
    out.paragraph()


def html_sections(text: str, stem: str, counters: Counters) -> tuple[str, Sections]:
    """The page's title and its `(heading, text)` sections; `counters` bound its tables."""
    tree = LexborHTMLParser(text)
    title_node = tree.css_first("head > title") or tree.css_first("title")
    title = _collapse(title_node.text()) if title_node is not None else ""
    _drop_invisible(tree)
    if not title:
        first_h1 = tree.css_first("h1")
        title = _collapse(first_h1.text(deep=True, separator=" ")) if first_h1 else ""
    title = title or stem
    out = _Sections()
    root = _main_content(tree)
    if root is not None:
        _walk(root, out, counters)
    return title, [(heading or title, "\n\n".join(parts)) for heading, parts in out.sections]
