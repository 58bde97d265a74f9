"""Office files: `.docx` (python-docx), `.pptx` (python-pptx), `.xlsx` (openpyxl).

Every format is a zip of XML parts. Before a parser sees one, `open_package` checks that it
is a zip at all (a password-protected Office file is an OLE compound file instead), that
its parts' declared sizes add up to at most `LoadLimits.max_unpacked_bytes` and that no XML
part declares more than `LoadLimits.max_xml_part_bytes` (the parsers build a tree of each
part in memory, many times its size; a spreadsheet's sheets and strings, read as a stream,
are bounded by the total alone): Python's zip reader never inflates a part beyond its
declared size, so those bounds hold for a zip bomb too. A part is XML by the content type
`[Content_Types].xml` gives it, as the parsers find parts by relationship and content
type, not by name (`word/document.bin` can be the main document); a name ending `.xml`
or `.rels` counts as XML too, as some parts are opened by their fixed name whatever they
are declared as. A Word file's paragraphs, table cells and runs are counted against
`max_cells` before any text is read from them. Word headings
start sections, tables become rows that name their columns, each slide is a section titled
by its title and carries its notes, each sheet is a section of rows.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable, Iterator
from typing import Any

import docx
import openpyxl
import pptx
from docx.table import Table as WordTable
from docx.table import _Cell as WordCell
from docx.text.paragraph import Paragraph
from lxml import etree
from pptx.util import Length

from chatqna.errors import ChatQnAError, DocumentLoadError, PayloadTooLarge
from chatqna.ingest.tables import CellCounter, Counters, LoadLimits, table_rows

__all__ = ["load_docx", "load_pptx", "load_xlsx"]

Sections = list[tuple[str, str]]

# The signature of an OLE2 compound file: what an encrypted .docx/.pptx/.xlsx (and the
# legacy .doc/.ppt/.xls formats) are stored as.
_OLE_SIGNATURE = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
_ENCRYPTION_STREAM = "EncryptionInfo".encode("utf-16-le")
_CONTENT_TYPES = "[Content_Types].xml"
_CONTENT_TYPES_NS = "{http://schemas.openxmlformats.org/package/2006/content-types}"
# No DTD, no entity expansion, no network: the content types are read before any bound
# but their own size is known to hold.
_SAFE_XML = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False)
# Named parts parsed as XML whatever their content type says (images and other media are
# not parsed, so not bounded alone).
_XML_SUFFIXES = (".xml", ".rels")
_SPREADSHEET = "application/vnd.openxmlformats-officedocument.spreadsheetml."
# What openpyxl's read-only mode parses as a stream of rows or strings, never as one tree,
# by content type (ECMA-376 Part 1, 12.3.24 and 12.3.15).
_XLSX_STREAMED = frozenset({_SPREADSHEET + "worksheet+xml", _SPREADSHEET + "sharedStrings+xml"})
# The parts openpyxl opens by name and parses whole, however they are declared.
_XLSX_READ_BY_NAME = frozenset(
    {"xl/workbook.xml", "xl/styles.xml", "docprops/core.xml", "docprops/custom.xml"}
)
# What python-docx reads of a paragraph one Python object at a time: its runs and
# hyperlinks, and the runs of those hyperlinks.
_WORD_RUNS = "count(.//w:p/w:r | .//w:p/w:hyperlink | .//w:p/w:hyperlink/w:r)"


class _PartTypes:
    """The content type of each part of a package, as `[Content_Types].xml` gives them:
    an `Override` by part name, else a `Default` by extension (ECMA-376 Part 2, 10.1.2).
    Names and extensions compare case-insensitively, as OPC part names do."""

    def __init__(self, source: str, xml: bytes) -> None:
        try:
            root = etree.fromstring(xml, _SAFE_XML)
        except etree.XMLSyntaxError as exc:
            raise DocumentLoadError(
                f"{source} is not a readable Office file ({_CONTENT_TYPES}: {exc})",
                reason="corrupt",
            ) from exc
        self.defaults: dict[str, str] = {}
        self.overrides: dict[str, str] = {}
        for entry in root:
            content_type = entry.get("ContentType")
            if content_type is None:
                continue
            if entry.tag == _CONTENT_TYPES_NS + "Default" and entry.get("Extension"):
                self.defaults[entry.get("Extension").lower()] = content_type.lower()
            elif entry.tag == _CONTENT_TYPES_NS + "Override" and entry.get("PartName"):
                name = entry.get("PartName").lstrip("/").lower()
                self.overrides[name] = content_type.lower()

    def of(self, name: str) -> str | None:
        """The content type of the zip entry `name` (lowercased), None when none is given."""
        name = name.lower()
        if name in self.overrides:
            return self.overrides[name]
        _, dot, extension = name.rpartition("/")[2].rpartition(".")
        return self.defaults.get(extension) if dot else None


def _is_xml(content_type: str) -> bool:
    media_type = content_type.split(";", 1)[0].strip()
    return media_type.endswith(("/xml", "+xml"))


def _read_part_types(source: str, archive: zipfile.ZipFile, limits: LoadLimits) -> _PartTypes:
    try:
        info = archive.getinfo(_CONTENT_TYPES)
    except KeyError:
        raise DocumentLoadError(
            f"{source} is not a readable Office file (it has no {_CONTENT_TYPES})",
            reason="corrupt",
        ) from None
    _check_xml_part(source, info, limits)
    return _PartTypes(source, archive.read(info))


def _check_xml_part(source: str, info: zipfile.ZipInfo, limits: LoadLimits) -> None:
    if info.file_size > limits.max_xml_part_bytes:
        raise PayloadTooLarge(
            f"{source}: its part {info.filename} unpacks to {info.file_size} bytes of "
            f"XML, more than the {limits.max_xml_part_bytes} one part may; split the "
            "file into smaller ones",
            details={"source": source, "part": info.filename, "bytes": info.file_size},
        )


def _parsed_whole(info: zipfile.ZipInfo, types: _PartTypes, streamed: frozenset[str]) -> bool:
    """Whether a parser may build a tree of the whole part: any XML part but those of a
    `streamed` content type (unless the parser also opens it by name as something else)."""
    name = info.filename.lower()
    content_type = types.of(name)
    if content_type is not None and content_type in streamed:
        return name.endswith(".rels") or name in _XLSX_READ_BY_NAME
    return name.endswith(_XML_SUFFIXES) or (content_type is not None and _is_xml(content_type))


def open_package(
    source: str, data: bytes, limits: LoadLimits, streamed: frozenset[str] = frozenset()
) -> None:
    """Refuse what is not a sane Office zip before a parser unpacks anything; the parts
    of a content type in `streamed` are read a piece at a time (not as one tree), so they
    are bounded by `max_unpacked_bytes` alone."""
    if data.startswith(_OLE_SIGNATURE):
        if _ENCRYPTION_STREAM in data:
            raise DocumentLoadError(
                f"{source} is password-protected; save a copy without a password and upload that",
                reason="encrypted",
            )
        raise DocumentLoadError(
            f"{source} is a legacy binary Office file; save it as .docx, .pptx or .xlsx",
            reason="legacy_format",
        )
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            parts = archive.infolist()
            declared = sum(info.file_size for info in parts)
            if declared > limits.max_unpacked_bytes:
                raise PayloadTooLarge(
                    f"{source} unpacks to {declared} bytes, more than "
                    f"{limits.max_unpacked_bytes} (CHATQNA_DATAPREP_MAX_UNPACKED_BYTES)",
                    details={"source": source, "unpacked_bytes": declared},
                )
            types = _read_part_types(source, archive, limits)
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise DocumentLoadError(
            f"{source} is not a readable Office file (not a valid zip: {exc})", reason="corrupt"
        ) from exc
    for info in parts:
        if _parsed_whole(info, types, streamed):
            _check_xml_part(source, info, limits)


def _parse(source: str, what: str, parse: Callable[[], Any]) -> Any:
    try:
        return parse()
    except ChatQnAError:
        raise
    except Exception as exc:
        # The parsers signal damaged input with many unrelated types (KeyError for a missing
        # part, lxml's XMLSyntaxError, ValueError, BadZipFile on a bad CRC...); to the
        # uploader they all mean "unreadable file".
        raise DocumentLoadError(
            f"{source} is not a readable {what} file: {exc}", reason="corrupt"
        ) from exc


# --- Word ------------------------------------------------------------------------------


def load_docx(source: str, stem: str, data: bytes, limits: LoadLimits) -> tuple[str, Sections]:
    open_package(source, data, limits)
    result: tuple[str, Sections] = _parse(
        source, "Word", lambda: _read_docx(docx.Document(io.BytesIO(data)), stem, source, limits)
    )
    return result


def _heading_level(paragraph: Paragraph) -> int | None:
    """0 for the Title style, n for "Heading n", None for body text."""
    name = paragraph.style.name if paragraph.style is not None else ""
    if name == "Title":
        return 0
    if name.startswith("Heading"):
        level = name.removeprefix("Heading").strip()
        return int(level) if level.isdigit() else 1
    return None


def _read_docx(document: Any, stem: str, source: str, limits: LoadLimits) -> tuple[str, Sections]:
    title = (document.core_properties.title or "").strip()
    sections: list[tuple[str | None, list[str]]] = [(None, [])]
    counters = Counters(source, limits, cells="cells, paragraphs and runs")
    # python-docx reads a paragraph's text run by run, some 15 µs each: a paragraph of a
    # million empty runs (`<w:r/>`, six bytes each) would take half a minute to yield
    # nothing. libxml2 counts them all first, without a Python object for any.
    counters.cells.add(int(document.element.xpath(_WORD_RUNS)))
    for block in document.iter_inner_content():
        if isinstance(block, WordTable):
            sections[-1][1].extend(table_rows(_word_rows(block, counters.cells), counters.text))
            continue
        # Counted before its text is read: a few bytes of XML each, empty paragraphs by the
        # million would otherwise cost minutes of reading nothing.
        counters.cells.add(1)
        text = block.text.strip()
        if not text:
            continue
        level = _heading_level(block)
        if level == 0 and not title:
            title = text
        elif level is not None:
            sections.append((text, []))
        else:
            sections[-1][1].append(text)
    title = title or stem
    return title, [(heading or title, "\n\n".join(parts)) for heading, parts in sections]


def _word_rows(table: WordTable, cells: CellCounter) -> list[list[str]]:
    """The table's cell texts, row by row, as python-docx's `row.cells` gives them: a cell
    once for each grid column it spans, a vertically merged cell on every row it covers.

    The spans are counted against the cell limit before any is expanded: one `gridSpan` of
    a million would otherwise repeat a cell a million times first. python-docx finds the
    cell above a merged one by searching the rows above one by one, which takes minutes on
    a tall merged column; the texts of the previous row, by starting grid column, take one
    look-up. A repeated cell is the same string, not a copy.
    """
    body = table._tbl
    # A cell's paragraphs beyond its first count too: its text reads every one.
    cells.add(
        sum(tc.grid_span + max(len(tc.p_lst) - 1, 0) for tr in body.tr_lst for tc in tr.tc_lst)
    )
    rows: list[list[str]] = []
    above: dict[int, str] = {}
    for tr in body.tr_lst:
        row: list[str] = []
        starts: dict[int, str] = {}
        column = tr.grid_before
        for tc in tr.tc_lst:
            merged = tc.vMerge == "continue"
            text = above.get(column, "") if merged else WordCell(tc, table).text
            starts[column] = text
            row.extend([text] * tc.grid_span)
            column += tc.grid_span
        rows.append(row)
        above = starts
    return rows


# --- PowerPoint ------------------------------------------------------------------------


def load_pptx(source: str, stem: str, data: bytes, limits: LoadLimits) -> tuple[str, Sections]:
    open_package(source, data, limits)
    result: tuple[str, Sections] = _parse(
        source,
        "PowerPoint",
        lambda: _read_pptx(pptx.Presentation(io.BytesIO(data)), stem, source, limits),
    )
    return result


def _shape_texts(shapes: Any, counters: Counters) -> Iterator[str]:
    # Reading order on a slide: top to bottom, then left to right.
    def position(shape: Any) -> tuple[Length, Length]:
        return (shape.top or Length(0), shape.left or Length(0))

    for shape in sorted(shapes, key=position):
        if shape.shape_type is not None and hasattr(shape, "shapes"):  # a group
            yield from _shape_texts(shape.shapes, counters)
        elif getattr(shape, "has_table", False) and shape.has_table:
            rows = [[cell.text for cell in row.cells] for row in shape.table.rows]
            counters.cells.add(sum(len(row) for row in rows))
            yield from table_rows(rows, counters.text)
        elif getattr(shape, "has_text_frame", False) and shape.has_text_frame:
            text = shape.text_frame.text.strip()
            if text:
                yield text


def _read_pptx(deck: Any, stem: str, source: str, limits: LoadLimits) -> tuple[str, Sections]:
    title = (deck.core_properties.title or "").strip()
    counters = Counters(source, limits)
    sections: Sections = []
    for number, slide in enumerate(deck.slides, start=1):
        title_shape = slide.shapes.title
        slide_title = title_shape.text.strip() if title_shape is not None else ""
        others = [
            s for s in slide.shapes if title_shape is None or s.shape_id != title_shape.shape_id
        ]
        parts = list(_shape_texts(others, counters))
        if slide.has_notes_slide:
            notes = slide.notes_slide.notes_text_frame
            if notes is not None and notes.text.strip():
                parts.append("Notes: " + notes.text.strip())
        heading = f"Slide {number}: {slide_title}" if slide_title else f"Slide {number}"
        # The title stays in the text too, so a passage retrieved alone names its slide.
        body = "\n\n".join(([slide_title] if slide_title else []) + parts)
        sections.append((heading, body))
        if number == 1 and not title and slide_title:
            title = slide_title
    return title or stem, sections


# --- Excel -----------------------------------------------------------------------------


def load_xlsx(source: str, stem: str, data: bytes, limits: LoadLimits) -> tuple[str, Sections]:
    open_package(source, data, limits, streamed=_XLSX_STREAMED)
    result: tuple[str, Sections] = _parse(
        source, "Excel", lambda: _read_xlsx(data, stem, source, limits)
    )
    return result


def _read_xlsx(data: bytes, stem: str, source: str, limits: LoadLimits) -> tuple[str, Sections]:
    # read_only streams rows instead of building every cell object; data_only reads the
    # values formulas last computed to, which is what a reader of the sheet sees.
    workbook = openpyxl.load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    try:
        title = (workbook.properties.title or "").strip() or stem
        counters = Counters(source, limits)
        sections: Sections = []
        for sheet in workbook.worksheets:
            # The declared dimension lets a huge sheet be refused before a row is parsed;
            # the count while reading still holds when the declaration is missing or lies.
            if sheet.max_row is not None and sheet.max_column is not None:
                CellCounter(source, limits.max_cells).add(sheet.max_row * sheet.max_column)
            rows = table_rows(_rows(sheet, counters.cells), counters.text)
            sections.append((f"{title}: {sheet.title}", "\n\n".join(rows)))
        return title, sections
    finally:
        workbook.close()


def _rows(sheet: Any, cells: CellCounter) -> Iterator[tuple[object, ...]]:
    for row in sheet.iter_rows(values_only=True):
        # openpyxl yields every row up to the last one named, empty ones as `()`: a sheet
        # that names row 1,048,576 alone must still run into the limit.
        cells.add(max(len(row), 1))
        yield row
