"""CSV, JSON and JSON Lines: rows and records that keep their field names.

A CSV row or a JSON record becomes one `name: value; name: value` line (nested fields as
dotted paths, `plan.price`), so a passage retrieved alone still says what its values are.
A JSON object's top-level fields that hold objects or lists become sections named by the
field; scalars stay in the document's first section.

Rows and lines are read one at a time and counted against `max_cells` as they are read, a
blank one as one cell: a file of millions of blank lines or empty records is refused once it
passes the limit, before the rest of it is split or parsed.
"""

from __future__ import annotations

import csv
import io
import json
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from chatqna.errors import DocumentLoadError, PayloadTooLarge
from chatqna.ingest.tables import (
    CellCounter,
    Counters,
    LoadLimits,
    TextCounter,
    flatten,
    record_text,
    table_rows,
)

__all__ = ["load_csv", "load_json", "load_jsonl"]

Sections = list[tuple[str, str]]

_DELIMITERS = ",;\t|"
_FIELD_TOO_LARGE = "field larger than field limit"
_FIELD_LIMIT_LOCK = threading.Lock()


def load_csv(source: str, stem: str, text: str, limits: LoadLimits) -> Sections:
    sample = text[:8192]
    try:
        dialect: Any = csv.Sniffer().sniff(sample, delimiters=_DELIMITERS)
    except csv.Error:
        dialect = csv.excel  # one column, or nothing to tell the delimiter by
    counters = Counters(source, limits)
    _allow_fields_of(limits.max_text_chars)
    rows = _csv_rows(source, text, dialect, counters.cells, limits.max_text_chars)
    return [(stem, "\n\n".join(table_rows(rows, counters.text)))]


def _csv_rows(
    source: str, text: str, dialect: Any, cells: CellCounter, max_chars: int
) -> Iterator[list[str]]:
    """The rows of `text`, each counted by `cells` as it is read. A blank line is a row of
    no cells and counts as one, as an empty spreadsheet row does (`office._rows`)."""
    try:
        for row in csv.reader(io.StringIO(text, newline=""), dialect):
            cells.add(max(len(row), 1))
            yield row
    except csv.Error as exc:
        if _FIELD_TOO_LARGE in str(exc):
            raise PayloadTooLarge(
                f"{source} has a field longer than {max_chars} characters "
                "(CHATQNA_DATAPREP_MAX_TEXT_CHARS); split it into smaller files",
                details={"source": source, "limit": max_chars},
            ) from exc
        raise DocumentLoadError(f"{source} is not readable CSV: {exc}", reason="corrupt") from exc


def _allow_fields_of(chars: int) -> None:
    """Let the csv module read fields of up to `chars` characters, so a long field is read,
    or refused by the text limit, rather than reported as corrupt.

    The csv module's limit (131,072 by default) is process-wide: it is only ever raised,
    under a lock, so a larger one set elsewhere stays.
    """
    with _FIELD_LIMIT_LOCK:
        if csv.field_size_limit() < chars:
            csv.field_size_limit(chars)


def _parse_json(source: str, text: str, where: str = "") -> Any:
    try:
        return json.loads(text)
    except RecursionError as exc:
        raise DocumentLoadError(
            f"{source}{where} nests too deeply to read", reason="too_deep"
        ) from exc
    except ValueError as exc:
        raise DocumentLoadError(
            f"{source}{where} is not valid JSON: {exc}", reason="corrupt"
        ) from exc


def _record(value: Any, text: TextCounter) -> str:
    if isinstance(value, dict | list):
        return record_text(flatten(value), text)
    return record_text([("", value)], text)


def _records(values: Iterable[Any], counters: Counters) -> str:
    lines = []
    for value in values:
        line = _record(value, counters.text)
        counters.cells.add(line.count("; ") + 1)
        if line:
            lines.append(line)
    return "\n\n".join(lines)


def load_json(source: str, stem: str, text: str, limits: LoadLimits) -> Sections:
    value = _parse_json(source, text)
    counters = Counters(source, limits)
    if isinstance(value, list):
        return [(stem, _records(value, counters))]
    if not isinstance(value, dict):
        return [(stem, _record(value, counters.text))]
    scalars: list[tuple[str, object]] = []
    sections: Sections = []
    for key, item in value.items():
        if isinstance(item, list):
            sections.append((str(key), _records(item, counters)))
        elif isinstance(item, dict):
            sections.append((str(key), _records([item], counters)))
        else:
            # A top-level scalar is a field like a record's, and counts as a cell the same.
            counters.cells.add(1)
            scalars.append((str(key), item))
    return [(stem, record_text(scalars, counters.text)), *sections]


def load_jsonl(source: str, stem: str, text: str, limits: LoadLimits) -> Sections:
    counters = Counters(source, limits)
    return [(stem, _records(_jsonl_values(source, text, counters.cells), counters))]


def _jsonl_values(source: str, text: str, cells: CellCounter) -> Iterator[Any]:
    """Each line's value, parsed only once the record before it has been counted
    (`_records` counts it); a blank line holds no record and counts as one cell."""
    for number, line in enumerate(io.StringIO(text, newline="\n"), start=1):
        if line.strip():
            yield _parse_json(source, line.removesuffix("\n"), f" line {number}")
        else:
            cells.add(1)
