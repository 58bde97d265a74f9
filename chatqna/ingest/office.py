"""Office files: `.docx` (python-docx), `.pptx` (python-pptx), `.xlsx` (openpyxl).

Every format is a zip of XML parts, checked by `chatqna.ingest.office_package` before a
parser sees it. A Word file's paragraphs, table cells and runs are counted against
`max_cells` before any text is read from them. Word headings start sections, tables become
rows that name their columns, each slide is a section titled by its title and carries its
notes, each sheet is a section of rows.

No part's XML entities are expanded: python-docx, python-pptx and openpyxl's whole-part
reads parse with lxml without resolving them, and openpyxl streams worksheets and shared
strings through defusedxml, which refuses any entity declaration before it is used (the
standard library's parser would expand a few kilobytes of references into gigabytes).
When openpyxl is set not to use defusedxml (`OPENPYXL_DEFUSEDXML` other than exactly
`True`), spreadsheets are refused (422, reason `xml_unprotected`) and a warning is logged
at start-up; the other formats are read as ever.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterator
from typing import Any

import docx
import openpyxl
import openpyxl.xml
import pptx
from defusedxml import DefusedXmlException
from docx.table import Table as WordTable
from docx.table import _Cell as WordCell
from docx.text.paragraph import Paragraph
from pptx.util import Length

from chatqna.errors import ChatQnAError, DocumentLoadError
from chatqna.ingest.office_package import XLSX_STREAMED, open_package
from chatqna.ingest.tables import CellCounter, Counters, LoadLimits, table_rows

__all__ = ["XLSX_PROTECTED", "load_docx", "load_pptx", "load_xlsx", "startup_warnings"]

Sections = list[tuple[str, str]]

# What python-docx reads of a paragraph one Python object at a time: its runs and
# hyperlinks, and the runs of those hyperlinks.
_WORD_RUNS = "count(.//w:p/w:r | .//w:p/w:hyperlink | .//w:p/w:hyperlink/w:r)"

# openpyxl chooses its XML parsers once, when it is imported: defusedxml's when that is
# installed and OPENPYXL_DEFUSEDXML is unset or exactly "True", else the standard library's,
# which expands entities. Without the former no spreadsheet is read (`load_xlsx` refuses
# them); Word and PowerPoint files, parsed by lxml without resolving entities, still are.
XLSX_PROTECTED: bool = openpyxl.xml.DEFUSEDXML
_DEFUSEDXML_SETTING = os.environ.get("OPENPYXL_DEFUSEDXML")  # as openpyxl read it


def startup_warnings() -> list[str]:
    """What to log once when the service starts: spreadsheets refused, and why."""
    if XLSX_PROTECTED:
        return []
    return [
        "openpyxl is not reading XML through defusedxml (OPENPYXL_DEFUSEDXML="
        f"{_DEFUSEDXML_SETTING!r}; it must be unset or exactly True, "
        "and defusedxml installed): .xlsx uploads are refused with 422 document_unreadable, "
        "reason xml_unprotected"
    ]


def _parse(source: str, what: str, parse: Callable[[], Any]) -> Any:
    try:
        return parse()
    except ChatQnAError:
        raise
    except Exception as exc:
        forbidden = _forbidden_xml(exc)
        if forbidden is not None:
            raise DocumentLoadError(
                f"{source} declares XML entities ({forbidden}), which no Office file needs; "
                "it is refused without expanding them",
                reason="xml_entities",
            ) from exc
        # The parsers signal damaged input with many unrelated types (KeyError for a missing
        # part, lxml's XMLSyntaxError, ValueError, BadZipFile on a bad CRC...); to the
        # uploader they all mean "unreadable file".
        raise DocumentLoadError(
            f"{source} is not a readable {what} file: {exc}", reason="corrupt"
        ) from exc


def _forbidden_xml(exc: BaseException) -> str | None:
    """The defusedxml refusal that `exc` is or was raised from, as text (openpyxl wraps
    the ones it meets opening a workbook in a ValueError); None if there is none."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, DefusedXmlException):
            return str(current)
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


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
    if not XLSX_PROTECTED:
        raise DocumentLoadError(
            f"{source} is refused: this service reads no spreadsheets, as its XML parser "
            "would expand entities; OPENPYXL_DEFUSEDXML must be unset or exactly True",
            reason="xml_unprotected",
        )
    open_package(source, data, limits, streamed=XLSX_STREAMED)
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
