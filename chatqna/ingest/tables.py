"""Tables, records and limits shared by the loaders of structured formats.

A table becomes one line per row that names its columns (`Plan: Business; Seats: 50`),
so a row retrieved alone still says what each of its values is. Rows are separated by blank
lines: the chunker keeps paragraphs whole, so a row is never cut in two unless it alone is
longer than a chunk.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from chatqna.errors import PayloadTooLarge

__all__ = [
    "CellCounter",
    "Counters",
    "LoadLimits",
    "TextCounter",
    "cell_text",
    "flatten",
    "record_text",
    "table_rows",
]


@dataclass(frozen=True)
class LoadLimits:
    """Bounds on what one file may unpack to, so a hostile file fails fast with a 413.

    `max_unpacked_bytes` bounds the declared size of every part of an Office file (a zip)
    together, `max_xml_part_bytes` that of each of its XML parts (a parser builds a tree of
    up to some 36 times an XML part's size in memory, a bare element taking some 300
    bytes), `max_parsed_xml_bytes` that of all the XML parts a parser may build a tree of
    together (python-docx and python-pptx build one of every part they find when they open
    a file), `max_cells` the cells read from a
    spreadsheet (and the paragraphs, table cells and runs of a Word file), `max_text_chars`
    the text any file may yield.
    """

    max_unpacked_bytes: int = 100 * 1024 * 1024
    max_xml_part_bytes: int = 10 * 1024 * 1024
    max_parsed_xml_bytes: int = 12 * 1024 * 1024
    max_cells: int = 200_000
    max_text_chars: int = 10_000_000


class CellCounter:
    """Counts the cells read so far and raises `PayloadTooLarge` past the limit; `unit`
    names what is counted in the refusal."""

    def __init__(self, source: str, limit: int, unit: str = "cells") -> None:
        self._source = source
        self._limit = limit
        self._unit = unit
        self.count = 0

    def add(self, cells: int) -> None:
        self.count += cells
        if self.count > self._limit:
            raise PayloadTooLarge(
                f"{self._source} has more than {self._limit} {self._unit} "
                "(CHATQNA_DATAPREP_MAX_CELLS); split it into smaller files",
                details={"source": self._source, "limit": self._limit},
            )


class TextCounter:
    """Counts the characters of text a file has yielded so far and raises `PayloadTooLarge`
    past the limit.

    A small file can expand: a table cell repeated across every column it spans, one large
    shared string referenced by every row of a sheet, long column names repeated on every
    row, one page stream drawn on every page of a PDF. Counting while the text is produced
    refuses such a file once it passes the limit, before the rest is built.
    """

    def __init__(self, source: str, limit: int) -> None:
        self._source = source
        self._limit = limit
        self.count = 0

    def add(self, chars: int) -> None:
        self.count += chars
        if self.count > self._limit:
            raise PayloadTooLarge(
                f"{self._source} holds more than {self._limit} characters of text "
                "(CHATQNA_DATAPREP_MAX_TEXT_CHARS); split it into smaller files",
                details={"source": self._source, "chars": self.count},
            )


class Counters:
    """The cell and text counters of one file, made from its `LoadLimits`."""

    def __init__(self, source: str, limits: LoadLimits, cells: str = "cells") -> None:
        self.cells = CellCounter(source, limits.max_cells, cells)
        self.text = TextCounter(source, limits.max_text_chars)


def cell_text(value: object) -> str:
    """A cell's value as one line of text: `9.0` -> `9`, dates in ISO form, no newlines."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, dt.datetime) and value.time() == dt.time(0):
        return value.date().isoformat()
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    return " ".join(str(value).split())


def record_text(pairs: Iterable[tuple[str, object]], text: TextCounter) -> str:
    """`name: value; name: value`, leaving out empty values; each part is counted by `text`
    as it is made, so a record that would grow past the limit stops there."""
    parts: list[str] = []
    for name, value in pairs:
        value_text = cell_text(value)
        if value_text:
            part = f"{name}: {value_text}" if name else value_text
            text.add(len(part) + (2 if parts else 0))
            parts.append(part)
    return "; ".join(parts)


def table_rows(rows: Iterable[Sequence[object]], text: TextCounter) -> list[str]:
    """Each row after the header as a `record_text` line; the first non-empty row names
    the columns (a blank name becomes `Column N`). `text` counts the header's cells and
    every line as they are made."""
    header: list[str] | None = None
    lines: list[str] = []
    for row in rows:
        if header is None:
            cells = _counted_cells(row, text)
            if any(cells):
                header = [name or f"Column {i}" for i, name in enumerate(cells, start=1)]
            continue
        names = header + [f"Column {i}" for i in range(len(header) + 1, len(row) + 1)]
        line = record_text(zip(names, row, strict=False), text)
        if line:
            lines.append(line)
    if header is not None and not lines:
        # A single row has nothing to name: keep its cells as they are.
        lines.append("; ".join(name for name in header if not name.startswith("Column ")))
    return lines


def _counted_cells(row: Iterable[object], text: TextCounter) -> list[str]:
    cells = []
    for value in row:
        cell = cell_text(value)
        text.add(len(cell))
        cells.append(cell)
    return cells


class _Step(NamedTuple):
    """One step down a JSON value: a dict key (a `str`) or a list index (an `int`)."""

    parent: _Step | None
    key: str | int


def flatten(value: object, prefix: str = "") -> Iterator[tuple[str, object]]:
    """`(dotted.path, scalar)` pairs of a JSON value, in document order.

    Iterative, so a deeply nested document cannot exhaust the interpreter's stack. A path
    is written out only when a scalar is reached: children share their parent's steps, so
    a long key above many children is not copied once per child before a limit can stop it.
    """
    stack: list[tuple[_Step | None, object]] = [(None, value)]
    while stack:
        step, item = stack.pop()
        if isinstance(item, dict):
            stack.extend((_Step(step, str(key)), v) for key, v in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((_Step(step, i), item[i]) for i in reversed(range(len(item))))
        else:
            yield _path(prefix, step), item


def _path(prefix: str, step: _Step | None) -> str:
    """`prefix` followed by the steps: `.key` (or `key` first) and `[index]`."""
    keys: list[str | int] = []
    while step is not None:
        keys.append(step.key)
        step = step.parent
    parts = [prefix]
    written = bool(prefix)
    for key in reversed(keys):
        if isinstance(key, int):
            parts.append(f"[{key}]")
        else:
            parts.append(f".{key}" if written else key)
        written = written or bool(parts[-1])
    return "".join(parts)
