"""CSV, JSON and JSON Lines: rows and records that keep their field names.

A CSV row or a JSON record becomes one `name: value; name: value` line (nested fields as
dotted paths, `plan.price`), so a passage retrieved alone still says what its values are.
A JSON object's top-level fields that hold objects or lists become sections named by the
field; scalars stay in the document's first section.
"""

from __future__ import annotations

import csv
import json
from typing import Any

from chatqna.errors import DocumentLoadError
from chatqna.ingest.tables import (
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


def load_csv(source: str, stem: str, text: str, limits: LoadLimits) -> Sections:
    sample = text[:8192]
    try:
        dialect: Any = csv.Sniffer().sniff(sample, delimiters=_DELIMITERS)
    except csv.Error:
        dialect = csv.excel  # one column, or nothing to tell the delimiter by
    counters = Counters(source, limits)
    rows: list[list[str]] = []
    try:
        for row in csv.reader(text.splitlines(keepends=True), dialect):
            counters.cells.add(len(row))
            rows.append(row)
    except csv.Error as exc:
        raise DocumentLoadError(f"{source} is not readable CSV: {exc}", reason="corrupt") from exc
    return [(stem, "\n\n".join(table_rows(rows, counters.text)))]


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


def _records(values: list[Any], counters: Counters) -> str:
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
    values = []
    for number, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            values.append(_parse_json(source, line, f" line {number}"))
    return [(stem, _records(values, Counters(source, limits)))]
