"""Loaders: turn the bytes of an ingested file into a `LoadedDocument`.

Each supported format is reduced to a title plus `(heading, text)` sections in reading
order, so the chunker can keep passages inside one section and label them with the nearest
heading. Everything here is a pure function of `(source, data)`; the caller reads the file
(or receives the upload, or fetches the link) and decides what `source` is called. The
format follows the suffix of `source`, or `kind` when the caller knows better (a link's
content type). `LoadLimits` bounds what one file may unpack to. A title or heading is cut
to `MAX_HEADING_CHARS` (`clip_heading`), and counts as text.
"""

from __future__ import annotations

import io
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import PurePosixPath

from pypdf import PdfReader
from pypdf.generic import DictionaryObject, StreamObject

from chatqna.documents import LoadedDocument
from chatqna.errors import ChatQnAError, DocumentLoadError, PayloadTooLarge, UnsupportedFileType
from chatqna.ingest.html_text import decode_declared, decode_html, html_sections
from chatqna.ingest.office import load_docx, load_pptx, load_xlsx
from chatqna.ingest.structured import load_csv, load_json, load_jsonl
from chatqna.ingest.tables import Counters, LoadLimits, TextCounter

# Callers import the error types from chatqna.errors, where they map to HTTP statuses.
__all__ = [
    "MAX_HEADING_CHARS",
    "SUPPORTED_SUFFIXES",
    "LoadLimits",
    "clip_heading",
    "format_of",
    "load_document",
    "text_chars",
]

# Suffix -> format. The format names are also what a fetched link's content type maps to.
FORMATS = {
    ".txt": "text", ".md": "markdown", ".markdown": "markdown", ".html": "html",
    ".htm": "html", ".pdf": "pdf", ".docx": "docx", ".pptx": "pptx", ".xlsx": "xlsx",
    ".csv": "csv", ".json": "json", ".jsonl": "jsonl",
}  # fmt: skip
SUPPORTED_SUFFIXES = tuple(FORMATS)

_MD_TITLE = re.compile(r"^#[ \t]+(.*)$")
_MD_SECTION = re.compile(r"^##[ \t]+(.*)$")
# CommonMark allows up to three spaces of indent before a fence; four would be a code block.
_MD_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_ATX_CLOSING = re.compile(r"[ \t]+#+[ \t]*$")


def format_of(source: str) -> str | None:
    """The format a file named `source` is read as, or None for an unsupported suffix."""
    return FORMATS.get(PurePosixPath(source.replace("\\", "/")).suffix.lower())


def load_document(
    source: str,
    data: bytes,
    *,
    kind: str | None = None,
    charset: str | None = None,
    limits: LoadLimits | None = None,
) -> LoadedDocument:
    """Parse `data`, the contents of the file named `source`, into a `LoadedDocument`.

    `kind` overrides the format the suffix implies; `charset` is a fetched page's declared
    charset (from its HTTP header), for HTML and the text formats. Raises
    `UnsupportedFileType` for a suffix not in `SUPPORTED_SUFFIXES`, `DocumentLoadError` for
    a supported file that cannot be read or holds no text, and `PayloadTooLarge` for one
    beyond `limits`.
    """
    # Backslashes would otherwise leave a Windows-style upload name as one long "stem".
    path = PurePosixPath(source.replace("\\", "/"))
    if kind is None:
        kind = format_of(source)
    if kind is None:
        suffix = path.suffix.lower()
        shown = suffix or "(no suffix)"
        raise UnsupportedFileType(
            f"{source}: unsupported file type {shown!r}; "
            f"supported types are {', '.join(SUPPORTED_SUFFIXES)}",
            details={"suffix": suffix, "supported": list(SUPPORTED_SUFFIXES)},
        )
    limits = limits if limits is not None else LoadLimits()
    stem = path.stem or source
    if not data.strip():
        raise DocumentLoadError(f"{source} contains no text")

    doc = _clipped(_load(kind, source, stem, data, charset, limits))
    if not doc.sections:
        raise DocumentLoadError(f"{source} contains no text")
    size = text_chars(doc)
    if size > limits.max_text_chars:
        raise PayloadTooLarge(
            f"{source} holds {size} characters of text (headings included), more than "
            f"{limits.max_text_chars} (CHATQNA_DATAPREP_MAX_TEXT_CHARS); split it into "
            "smaller files",
            details={"source": source, "chars": size},
        )
    return doc


def text_chars(doc: LoadedDocument) -> int:
    """The characters of text `doc` holds: its title, and each section's heading and text."""
    return len(doc.title) + sum(len(heading) + len(text) for heading, text in doc.sections)


# The longest heading or title a loader keeps. A heading is copied into every chunk of its
# section and indexed with each (`chatqna.documents.indexed_text`), so one long `## ` line,
# HTML title or PDF `/Title` would otherwise multiply into gigabytes sent to the embedder. A
# longer one is cut on a word boundary (inside a word only when its last half has none) and
# ends in "…".
MAX_HEADING_CHARS = 256
_LAST_SPACE = re.compile(r".*\s", re.DOTALL)


def clip_heading(text: str, limit: int = MAX_HEADING_CHARS) -> str:
    """`text` when it has at most `limit` characters, else its start cut to fit with "…"."""
    if len(text) <= limit:
        return text
    room = max(limit - 1, 1)
    head = text[: room + 1]
    space = _LAST_SPACE.match(head)
    cut = space.end() - 1 if space is not None and space.end() - 1 >= room // 2 else room
    return head[:cut].rstrip() + "…"


def _clipped(doc: LoadedDocument) -> LoadedDocument:
    """`doc` with its title and headings cut to `MAX_HEADING_CHARS` (`clip_heading`)."""
    sections = [(clip_heading(heading), text) for heading, text in doc.sections]
    return LoadedDocument(doc.source, clip_heading(doc.title), sections)


def _load(
    kind: str, source: str, stem: str, data: bytes, charset: str | None, limits: LoadLimits
) -> LoadedDocument:
    if kind == "pdf":
        return _load_pdf(source, stem, data, limits)
    office = {"docx": load_docx, "pptx": load_pptx, "xlsx": load_xlsx}.get(kind)
    if office is not None:
        title, sections = office(source, stem, data, limits)
        return LoadedDocument(source, title, _nonempty(sections))
    if kind == "html":
        page = decode_html(source, data, charset)
        title, sections = html_sections(page, stem, Counters(source, limits))
        return LoadedDocument(source, title, _nonempty(sections))
    text = _decode(source, data, charset)
    if kind == "markdown":
        return _load_markdown(source, stem, text)
    tabular = {"csv": load_csv, "json": load_json, "jsonl": load_jsonl}.get(kind)
    if tabular is not None:
        return LoadedDocument(source, stem, _nonempty(tabular(source, stem, text, limits)))
    return LoadedDocument(source, stem, _nonempty([(stem, _tidy(text))]))


def _decode(source: str, data: bytes, charset: str | None) -> str:
    """UTF-8, unless a link's HTTP header names another charset (a WHATWG Encoding Standard
    label) or its bytes start with a byte-order mark; decoded strictly either way."""
    declared = decode_declared(source, data, charset, strict=True) if charset else None
    try:
        text = declared if declared is not None else data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        # Guessing another encoding would index mojibake without anyone noticing; the
        # uploader can re-save the file as UTF-8.
        raise DocumentLoadError(
            f"{source} is not valid UTF-8 (invalid byte at offset {exc.start}); "
            "re-save it as UTF-8 and upload it again",
            reason="encoding",
        ) from exc
    return text.replace("\r\n", "\n").replace("\r", "\n")


# A run of blank (whitespace-only) lines: `\s*` backs off to the run's last newline, so the
# line after the run keeps its indent.
_BLANK_RUN = re.compile(r"\n\s*\n")


def _squeeze_blank_lines(text: str) -> str:
    """`text` with each run of blank lines made one empty line, the paragraph break `_tidy`
    would leave of it.

    Done in one pass before the text is split into lines: a 20 MB upload of newlines would
    otherwise become 20 million lines, each a list entry and a step of the Markdown reader
    (seconds and hundreds of megabytes), for an empty result.
    """
    return _BLANK_RUN.sub("\n\n", text)


def _tidy(text: str) -> str:
    """Drop trailing spaces and surrounding blank lines, keeping paragraph breaks."""
    lines = "\n".join(line.rstrip() for line in _squeeze_blank_lines(text).split("\n"))
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
    # Blank lines decide nothing below, and `_tidy` squeezes them the same way afterwards.
    for line in _squeeze_blank_lines(text).split("\n"):
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


def _load_pdf(source: str, stem: str, data: bytes, limits: LoadLimits) -> LoadedDocument:
    text = TextCounter(source, limits.max_text_chars)
    drawn = _DrawingCounter(source, limits.max_unpacked_bytes)
    try:
        reader = PdfReader(io.BytesIO(data))
        encrypted = reader.is_encrypted
        metadata = None if encrypted else reader.metadata
        pages = [] if encrypted else list(_page_texts(reader, text, drawn))
    except ChatQnAError:
        raise
    except Exception as exc:
        # pypdf signals damaged input with many unrelated exception types (PdfReadError,
        # KeyError, ValueError, ...); to the uploader they all mean "unreadable PDF".
        raise DocumentLoadError(f"{source} is not a readable PDF: {exc}") from exc
    if encrypted:
        raise DocumentLoadError(f"{source} is an encrypted PDF; upload an unencrypted copy")

    meta_title = str(metadata.title).strip() if metadata and metadata.title else ""
    title = clip_heading(meta_title or stem)
    # One section per page keeps the page number next to each passage for citations; a long
    # title is cut before it, so the page number stays.
    sections = [(_page_heading(title, number), page) for number, page in enumerate(pages, 1)]
    return LoadedDocument(source, title, _nonempty(sections))


def _page_heading(title: str, number: int) -> str:
    page = f" (page {number})"
    return clip_heading(title, MAX_HEADING_CHARS - len(page)) + page


def _page_texts(reader: PdfReader, text: TextCounter, drawn: _DrawingCounter) -> Iterator[str]:
    """Each page's text, counted as it is extracted: many pages can draw one content
    stream, so a small PDF can hold far more text than its size suggests.

    A page's drawing instructions are counted before its text is extracted, with those of
    the form XObjects it draws (`_forms_drawn`): reading them costs about a second per
    megabyte, whether or not they draw any text, so a few kilobytes of PDF whose pages all
    draw one large stream, or one form many times, would otherwise keep a worker busy for
    hours and never reach the text limit.
    """
    for page in reader.pages:
        contents = page.get_contents()
        if contents is not None:
            content = contents.get_data()
            drawn.add(len(content))
            drawn.add(_forms_drawn(page.get("/Resources"), content, drawn))
        page_text = _tidy(page.extract_text() or "")
        text.add(len(page_text))
        yield page_text


# `/Name Do`: draw the XObject the resources name (a name may escape bytes as `#xx`).
_DRAW = re.compile(rb"/([^\s/\[\]()<>{}%]+)\s*Do(?![^\s/\[\]()<>{}%])")
_NAME_ESCAPE = re.compile(rb"#([0-9A-Fa-f]{2})")
_FORM_NESTING = 12


def _forms_drawn(
    resources: object,
    content: bytes,
    drawn: _DrawingCounter,
    depth: int = 0,
    known: dict[int, int] | None = None,
) -> int:
    """The decoded bytes of the form XObjects `content` draws, each counted every time it is
    drawn, the forms they draw in turn included (`known`: each form's own total, worked out
    once); `drawn` refuses the PDF as soon as the total passes its limit. Read from the
    bytes, without parsing the content: an estimate from above (a `Do` inside a string
    counts too), which is what a bound needs."""
    xobjects = resources.get("/XObject") if isinstance(resources, DictionaryObject) else None
    if not isinstance(xobjects, DictionaryObject) or depth > _FORM_NESTING:
        return 0
    known = {} if known is None else known
    draws = Counter(
        _NAME_ESCAPE.sub(lambda m: bytes([int(m.group(1), 16)]), m.group(1))
        for m in _DRAW.finditer(content)
    )
    total = 0
    for name, times in draws.items():
        form = xobjects.get("/" + name.decode("latin-1"))
        form = form.get_object() if form is not None else None
        if not isinstance(form, StreamObject) or form.get("/Subtype") != "/Form":
            continue
        data = form.get_data()
        drawn.check(drawn.count + total + times * len(data))
        if id(form) not in known:
            known[id(form)] = _forms_drawn(form.get("/Resources"), data, drawn, depth + 1, known)
        share = times * (len(data) + known[id(form)])
        drawn.check(drawn.count + total + share)
        total += share
    return total


class _DrawingCounter:
    """Counts the decoded bytes of page content a PDF has drawn so far (a page counts each
    time it is drawn, shared streams included) and raises `PayloadTooLarge` past the
    limit."""

    def __init__(self, source: str, limit: int) -> None:
        self._source = source
        self._limit = limit
        self.count = 0

    def add(self, size: int) -> None:
        self.count += size
        self.check(self.count)

    def check(self, count: int) -> None:
        if count > self._limit:
            raise PayloadTooLarge(
                f"{self._source} draws more than {self._limit} bytes of page content "
                "(CHATQNA_DATAPREP_MAX_UNPACKED_BYTES); split it into smaller files",
                details={"source": self._source, "bytes": count, "limit": self._limit},
            )
