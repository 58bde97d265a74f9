"""Loaders: turn the bytes of an ingested file into a `LoadedDocument`.

Each supported format is reduced to a title plus `(heading, text)` sections in reading
order, so the chunker can keep passages inside one section and label them with the nearest
heading. Everything here is a pure function of `(source, data)`; the caller reads the file
(or receives the upload) and decides what `source` is called.
"""

from __future__ import annotations

import io
import re
from html.parser import HTMLParser
from pathlib import PurePosixPath

from pypdf import PdfReader

from chatqna.documents import LoadedDocument
from chatqna.errors import DocumentLoadError, UnsupportedFileType

# Callers import the error types from chatqna.errors, where they map to HTTP statuses.
__all__ = ["SUPPORTED_SUFFIXES", "load_document"]

SUPPORTED_SUFFIXES = (".txt", ".md", ".markdown", ".html", ".htm", ".pdf")

_MD_TITLE = re.compile(r"^#[ \t]+(.*)$")
_MD_SECTION = re.compile(r"^##[ \t]+(.*)$")
# CommonMark allows up to three spaces of indent before a fence; four would be a code block.
_MD_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_ATX_CLOSING = re.compile(r"[ \t]+#+[ \t]*$")


def load_document(source: str, data: bytes) -> LoadedDocument:
    """Parse `data`, the contents of the file named `source`, into a `LoadedDocument`.

    Raises `UnsupportedFileType` for a suffix not in `SUPPORTED_SUFFIXES`, and
    `DocumentLoadError` for a supported file that cannot be decoded or holds no text.
    """
    # Backslashes would otherwise leave a Windows-style upload name as one long "stem".
    path = PurePosixPath(source.replace("\\", "/"))
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        shown = suffix or "(no suffix)"
        raise UnsupportedFileType(
            f"{source}: unsupported file type {shown!r}; "
            f"supported types are {', '.join(SUPPORTED_SUFFIXES)}",
            details={"suffix": suffix, "supported": list(SUPPORTED_SUFFIXES)},
        )
    stem = path.stem or source
    if not data.strip():
        raise DocumentLoadError(f"{source} contains no text")

    if suffix == ".pdf":
        doc = _load_pdf(source, stem, data)
    else:
        text = _decode(source, data)
        if suffix in (".md", ".markdown"):
            doc = _load_markdown(source, stem, text)
        elif suffix in (".html", ".htm"):
            doc = _load_html(source, stem, text)
        else:
            doc = LoadedDocument(source, stem, _nonempty([(stem, _tidy(text))]))

    if not doc.sections:
        raise DocumentLoadError(f"{source} contains no text")
    return doc


def _decode(source: str, data: bytes) -> str:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        # Guessing another encoding would index mojibake without anyone noticing; the
        # uploader can re-save the file as UTF-8.
        raise DocumentLoadError(
            f"{source} is not valid UTF-8 (invalid byte at offset {exc.start}); "
            "re-save it as UTF-8 and upload it again"
        ) from exc
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _tidy(text: str) -> str:
    """Drop trailing spaces and surrounding blank lines, keeping paragraph breaks."""
    lines = "\n".join(line.rstrip() for line in text.split("\n"))
    # Removed heading lines leave blank runs; one blank line is all a paragraph break needs.
    return re.sub(r"\n{3,}", "\n\n", lines).strip("\n")


def _nonempty(sections: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(heading, text) for heading, text in sections if text.strip()]


def _heading_text(raw: str) -> str:
    return _ATX_CLOSING.sub("", raw).strip()


def _load_markdown(source: str, stem: str, text: str) -> LoadedDocument:
    title: str | None = None
    sections: list[tuple[str | None, list[str]]] = [(None, [])]
    fence: str | None = None
    for line in text.split("\n"):
        if fence is not None:
            # A fence closes only with the same character, at least as long as the opener.
            stripped = line.strip()
            if stripped.startswith(fence) and set(stripped) == {fence[0]}:
                fence = None
            sections[-1][1].append(line)
            continue
        opener = _MD_FENCE.match(line)
        if opener:
            fence = opener.group(1)
        elif title is None and (m := _MD_TITLE.match(line)):
            title = _heading_text(m.group(1))
            continue
        elif m := _MD_SECTION.match(line):
            sections.append((_heading_text(m.group(1)), []))
            continue
        sections[-1][1].append(line)

    title = title or stem
    resolved = [(heading or title, _tidy("\n".join(lines))) for heading, lines in sections]
    return LoadedDocument(source, title, _nonempty(resolved))


class _HTMLText(HTMLParser):
    """Collects visible text per `<h2>` section, plus the `<title>` and first `<h1>`."""

    SKIPPED = frozenset({"script", "style", "nav", "head"})
    BLOCKS = frozenset(
        {
            "address", "article", "aside", "blockquote", "dd", "details", "div", "dl",
            "dt", "fieldset", "figcaption", "figure", "footer", "form", "h1", "h2", "h3",
            "h4", "h5", "h6", "header", "hr", "li", "main", "ol", "p", "pre", "section",
            "summary", "table", "td", "th", "tr", "ul",
        }
    )  # fmt: skip
    # Private-use sentinels survive whitespace collapsing, unlike "\n"; stray ones in the
    # input are removed before parsing.
    PARA, LINE, H1_SLOT = "\ue000", "\ue001", "\ue002"

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.skipping: list[str] = []
        self.capture: str | None = None  # "title", "h1" or "h2" while inside one
        self.buffer: list[str] = []
        self.title = ""
        self.h1 = ""
        self.seen_h1 = False
        self.sections: list[tuple[str | None, list[str]]] = [(None, [])]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "body" and "head" in self.skipping:
            # </head> is optional in HTML; without this an unclosed head hides the page.
            del self.skipping[self.skipping.index("head") :]
        if tag in self.SKIPPED:
            self.skipping.append(tag)
        if tag == "title" and not self.title and self.capture is None:
            self._begin("title")
        if self.skipping:
            return
        if self.capture in ("h1", "h2") and tag in self.BLOCKS:
            self._finish()  # an unclosed heading must not swallow the page
        if tag == "h1" and not self.seen_h1:
            self.seen_h1 = True
            self.sections[-1][1].append(self.H1_SLOT)
            self._begin("h1")
        elif tag == "h2":
            self._begin("h2")
        elif tag == "br":
            self.sections[-1][1].append(self.LINE)
        elif tag in self.BLOCKS:
            self.sections[-1][1].append(self.PARA)

    def handle_endtag(self, tag: str) -> None:
        if tag == self.capture:
            self._finish()
        if tag in self.skipping:
            del self.skipping[len(self.skipping) - 1 - self.skipping[::-1].index(tag) :]
        elif not self.skipping and tag in self.BLOCKS:
            self.sections[-1][1].append(self.PARA)

    def handle_data(self, data: str) -> None:
        if self.capture == "title" or (self.capture and not self.skipping):
            self.buffer.append(data)
        elif not self.skipping:
            self.sections[-1][1].append(data)

    def _begin(self, what: str) -> None:
        self.capture, self.buffer = what, []

    def _finish(self) -> None:
        text = " ".join("".join(self.buffer).split())
        if self.capture == "title":
            self.title = text
        elif self.capture == "h1":
            self.h1 = text
        elif self.capture == "h2":
            self.sections.append((text or None, []))
        self.capture, self.buffer = None, []

    def result(self, stem: str) -> tuple[str, list[tuple[str, str]]]:
        if self.capture:
            self._finish()
        title = self.title or self.h1 or stem
        # The first <h1> is the title when there is no <title>; otherwise it is content.
        h1_text = "" if self.title == "" or self.h1 == self.title else self.PARA + self.h1
        sections = []
        for heading, parts in self.sections:
            raw = "".join(parts).replace(self.H1_SLOT, h1_text + self.PARA)
            paragraphs = (_collapse(p, self.LINE) for p in raw.split(self.PARA))
            sections.append((heading or title, "\n\n".join(p for p in paragraphs if p)))
        return title, _nonempty(sections)


def _collapse(paragraph: str, line_break: str) -> str:
    lines = (" ".join(line.split()) for line in paragraph.split(line_break))
    return "\n".join(line for line in lines if line)


def _load_html(source: str, stem: str, text: str) -> LoadedDocument:
    parser = _HTMLText()
    parser.feed(re.sub("[\ue000-\ue002]", "", text))
    parser.close()
    title, sections = parser.result(stem)
    return LoadedDocument(source, title, sections)


def _load_pdf(source: str, stem: str, data: bytes) -> LoadedDocument:
    try:
        reader = PdfReader(io.BytesIO(data))
        encrypted = reader.is_encrypted
        metadata = None if encrypted else reader.metadata
        pages = [] if encrypted else [page.extract_text() or "" for page in reader.pages]
    except Exception as exc:
        # pypdf signals damaged input with many unrelated exception types (PdfReadError,
        # KeyError, ValueError, ...); to the uploader they all mean "unreadable PDF".
        raise DocumentLoadError(f"{source} is not a readable PDF: {exc}") from exc
    if encrypted:
        raise DocumentLoadError(f"{source} is an encrypted PDF; upload an unencrypted copy")

    meta_title = str(metadata.title).strip() if metadata and metadata.title else ""
    title = meta_title or stem
    # One section per page keeps the page number next to each passage for citations.
    sections = [
        (f"{title} (page {number})", _tidy(text)) for number, text in enumerate(pages, start=1)
    ]
    return LoadedDocument(source, title, _nonempty(sections))
