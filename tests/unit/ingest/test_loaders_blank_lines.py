"""Loaders: a text or Markdown file of millions of blank lines costs no more than its bytes."""

from __future__ import annotations

import tracemalloc

import pytest

from chatqna.ingest.loaders import load_document

# 3 MB: a fenced block whose blank run is followed by an indented line, then a million
# blank (or whitespace-only) lines.
DATA = (
    b"# Notes\n\nFirst.\n\n```\ncode\n\n  \n\n    indented\n```\n"
    + b"\n \n" * 1_000_000
    + b"Last.\n"
)
BODY = "First.\n\n```\ncode\n\n    indented\n```\n\nLast."


@pytest.mark.parametrize(
    ("source", "sections"),
    [
        ("notes.md", [("Notes", BODY)]),
        ("notes.txt", [("notes", "# Notes\n\n" + BODY)]),
    ],
)
def test_a_million_blank_lines_are_not_read_one_by_one(
    source: str, sections: list[tuple[str, str]]
) -> None:
    # Split into lines first, they would hold 16 MB of list entries alone.
    tracemalloc.start()
    try:
        doc = load_document(source, DATA)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert doc.sections == sections
    assert peak < 3 * len(DATA)
