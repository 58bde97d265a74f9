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

from chatqna.errors import PayloadTooLarge

__all__ = ["LoadLimits", "cell_text", "flatten", "record_text", "table_rows"]


@dataclass(frozen=True)
class LoadLimits:
    """Bounds on what one file may unpack to, so a hostile file fails fast with a 413.

    `max_unpacked_bytes` bounds the declared size of every part of an Office file (a zip),
    `max_cells` the cells read from a spreadsheet, `max_text_chars` the text any file may
    yield.
    """

    max_unpacked_bytes: int = 100 * 1024 * 1024
    max_cells: int = 200_000
    max_text_chars: int = 10_000_000


class CellCounter:
    """Counts the cells read so far and raises `PayloadTooLarge` past the limit."""

    def __init__(self, source: str, limit: int) -> None:
        self._source = source
        self._limit = limit
        self.count = 0

    def add(self, cells: int) -> None:
        self.count += cells
        if self.count > self._limit:
            raise PayloadTooLarge(
                f"{self._source} has more than {self._limit} cells "
                "(CHATQNA_DATAPREP_MAX_CELLS); split it into smaller files",
                details={"source": self._source, "limit": self._limit},
            )


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


def record_text(pairs: Iterable[tuple[str, object]]) -> str:
    """`name: value; name: value`, leaving out empty values."""
    parts = []
    for name, value in pairs:
        text = cell_text(value)
        if text:
            parts.append(f"{name}: {text}" if name else text)
    return "; ".join(parts)


def table_rows(rows: Iterable[Sequence[object]]) -> list[str]:
    """Each row after the header as a `record_text` line; the first non-empty row names
    the columns (a blank name becomes `Column N`)."""
    header: list[str] | None = None
    lines: list[str] = []
    for row in rows:
        cells = [cell_text(value) for value in row]
        if not any(cells):
            continue
        if header is None:
            header = [name or f"Column {i}" for i, name in enumerate(cells, start=1)]
            continue
        names = header + [f"Column {i}" for i in range(len(header) + 1, len(cells) + 1)]
        line = record_text(zip(names, cells, strict=False))
        if line:
            lines.append(line)
    if header is not None and not lines:
        # A single row has nothing to name: keep its cells as they are.
        lines.append("; ".join(name for name in header if not name.startswith("Column ")))
    return lines


def flatten(value: object, prefix: str = "") -> Iterator[tuple[str, object]]:
    """`(dotted.path, scalar)` pairs of a JSON value, in document order.

    Iterative, so a deeply nested document cannot exhaust the interpreter's stack.
    """
    stack: list[tuple[str, object]] = [(prefix, value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, dict):
            children = [(f"{path}.{key}" if path else str(key), v) for key, v in item.items()]
            stack.extend(reversed(children))
        elif isinstance(item, list):
            children = [(f"{path}[{i}]" if path else f"[{i}]", v) for i, v in enumerate(item)]
            stack.extend(reversed(children))
        else:
            yield path, item
