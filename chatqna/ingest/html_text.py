"""HTML: the page's main content as sections, parsed by selectolax (the Lexbor HTML5 parser).

The bytes are decoded as a browser would: a byte-order mark wins, then the charset of the
HTTP `Content-Type` header (for fetched links), then a `<meta charset>` or
`<meta http-equiv="Content-Type">` in the first 1024 bytes, else UTF-8; a label the WHATWG
Encoding Standard does not list is ignored, and bytes the encoding does not map are read as
U+FFFD. What a reader does not see is dropped: navigation, footers, banners, scripts,
styles, `<noscript>`, `<template>`, `<svg>`, and elements that are `hidden`, `aria-hidden`
or styled `display: none` / `visibility: hidden`. The main content is `<main>` (or `role="main"`, or
the page's only `<article>`), else the body. Every `<h1>`-`<h6>` starts a section named by
its text, `<pre>` keeps its text verbatim, and a table becomes rows that name their columns
(a table nested in a cell is part of that cell's text).
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterator
from typing import Any

import webencodings
from selectolax.lexbor import LexborDocumentOptions, LexborHTMLParser, LexborNode

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
# What the HTML standard reads a <meta> naming these as: the prescan that found the <meta>
# read the bytes as ASCII, which UTF-16 is not.
_META_OVERRIDES = {"utf-16le": "utf-8", "utf-16be": "utf-8", "x-user-defined": "windows-1252"}


def _encoding(label: str | None, *, from_meta: bool = False) -> webencodings.Encoding | None:
    """The encoding a charset label names in the WHATWG Encoding Standard (whose labels are
    the only ones a browser knows), or None for any other label.

    So `latin-1` and `ascii` are windows-1252, plain `utf-16` is UTF-16LE, and names only
    Python's codec registry knows (`utf-7`, `unicode_escape`, `hex`, `utf-32`...) are
    unknown. UTF-16 named by a `<meta>` is read as UTF-8, as the HTML standard says.
    """
    encoding = webencodings.lookup(label) if label else None
    if encoding is not None and from_meta and encoding.name in _META_OVERRIDES:
        return webencodings.lookup(_META_OVERRIDES[encoding.name])
    return encoding


def _refuse_replacement(source: str, label: str | None, encoding: webencodings.Encoding) -> None:
    # The standard maps ISO-2022-KR, HZ-GB-2312 and the like to "replacement": their bytes
    # are not read as text at all.
    if encoding.name == "replacement":
        raise DocumentLoadError(
            f"{source} declares the charset {label!r}, which is not read as text "
            "(the Encoding Standard maps it to 'replacement'); re-save it as UTF-8",
            reason="encoding",
        )


def decode_declared(
    source: str, data: bytes, header_charset: str | None, *, strict: bool = False
) -> str | None:
    """The text as its byte-order mark, else `header_charset` (a WHATWG Encoding Standard
    label), says it is encoded; None when neither says anything usable.

    Bytes the encoding does not map become U+FFFD, as in a browser, unless `strict`.
    Raises `DocumentLoadError` (reason `encoding`) for a strict decode that fails, or a
    label the standard reads as no text.
    """
    for bom, bom_encoding in _BOMS:
        if data.startswith(bom):
            body = data[len(bom) :]
            return _decode(source, body, codecs.lookup(bom_encoding), strict, "byte-order mark")
    encoding = _encoding(header_charset)
    if encoding is None:
        return None
    _refuse_replacement(source, header_charset, encoding)
    return _decode(source, data, encoding.codec_info, strict, f"charset {header_charset!r}")


def decode_html(source: str, data: bytes, header_charset: str | None = None) -> str:
    """The page's text, decoded by BOM, then `header_charset`, then `<meta>`, else UTF-8.

    Raises `DocumentLoadError` (reason `encoding`) when the bytes cannot be decoded.
    """
    declared = decode_declared(source, data, header_charset)
    if declared is not None:
        return declared
    match = _META_CHARSET.search(data[:1024])
    label = match.group(1).decode("ascii") if match else None
    encoding = _encoding(label, from_meta=True)
    if encoding is not None:
        _refuse_replacement(source, label, encoding)
        return _decode(source, data, encoding.codec_info, False, f"<meta> charset {label!r}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentLoadError(
            f"{source} is not valid UTF-8 and declares no charset (invalid byte at offset "
            f"{exc.start}); add <meta charset=...> or re-save it as UTF-8",
            reason="encoding",
        ) from exc


def _decode(source: str, data: bytes, codec: codecs.CodecInfo, strict: bool, said: str) -> str:
    if not strict:
        return codec.decode(data, "replace")[0]
    try:
        return codec.decode(data, "strict")[0]
    except UnicodeDecodeError as exc:
        # Replacing the bytes would index mojibake without anyone noticing.
        raise DocumentLoadError(
            f"{source} is not valid {codec.name}, as its {said} says it is (invalid byte at "
            f"offset {exc.start}); serve it with the charset it is written in, or as UTF-8",
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
    # Without mutation events: with them, Lexbor updates a `<select>`'s selected option at
    # every `<option>` it inserts, quadratic in their number (and copies the selected
    # option into a `<selectedcontent>`, whose text is then read twice).
    tree = LexborHTMLParser(text, options=LexborDocumentOptions.WO_EVENTS)
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
