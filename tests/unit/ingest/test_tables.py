"""Tables and records of the structured loaders: cell text, named rows, flattening, limits."""

from __future__ import annotations

import datetime as dt
import itertools
import tracemalloc
from collections.abc import Iterator, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chatqna.errors import PayloadTooLarge
from chatqna.ingest.tables import (
    CellCounter,
    TextCounter,
    cell_text,
    flatten,
    record_text,
    table_rows,
)


def unbounded() -> TextCounter:
    return TextCounter("t.csv", limit=10**9)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, ""),
        (True, "true"),
        (9.0, "9"),
        (9.5, "9.5"),
        (dt.datetime(2024, 3, 1), "2024-03-01"),
        (dt.datetime(2024, 3, 1, 12, 30), "2024-03-01T12:30:00"),
        (dt.time(8, 15), "08:15:00"),
        ("two\nlines  and   spaces", "two lines and spaces"),
    ],
)
def test_a_cell_becomes_one_line_of_text(value: object, text: str) -> None:
    assert cell_text(value) == text


def test_a_record_names_its_values_and_leaves_out_empty_ones() -> None:
    pairs = [("Plan", "Business"), ("Seats", 50.0), ("Notes", None), ("", "x")]
    text = unbounded()
    assert record_text(pairs, text) == "Plan: Business; Seats: 50; x"
    assert text.count == len("Plan: Business; Seats: 50; x")


def test_each_row_names_its_columns_from_the_first_non_empty_row() -> None:
    rows = [[None, None], ["Plan", ""], ["Business", 50, "extra"], [None, None]]
    assert table_rows(rows, unbounded()) == ["Plan: Business; Column 2: 50; Column 3: extra"]


def test_a_lone_header_row_keeps_its_cells() -> None:
    assert table_rows([["Plan", "", "Seats"]], unbounded()) == ["Plan; Seats"]
    assert table_rows([], unbounded()) == []


def test_flatten_gives_dotted_paths_in_document_order() -> None:
    value = {"plan": {"name": "Pro", "seats": [5, 10]}, "active": True}
    assert list(flatten(value)) == [
        ("plan.name", "Pro"),
        ("plan.seats[0]", 5),
        ("plan.seats[1]", 10),
        ("active", True),
    ]


def _flatten_recursively(value: object, path: str = "") -> Iterator[tuple[str, object]]:
    """The definition `flatten` follows, written the obvious way."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _flatten_recursively(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _flatten_recursively(item, f"{path}[{i}]" if path else f"[{i}]")
    else:
        yield path, value


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=20,
)


@given(JSON, st.sampled_from(["", "p"]))
def test_flatten_gives_the_paths_of_the_recursive_definition(value: object, prefix: str) -> None:
    assert list(flatten(value, prefix)) == list(_flatten_recursively(value, prefix))


def test_a_long_key_is_not_copied_for_every_child_without_a_value() -> None:
    # 2,000 empty lists under a 100,000-character key, then one value: only that value's
    # path is written out (copying the key per child would take 200 MB).
    value = {"k" * 100_000: [[] for _ in range(2000)] + ["x"]}
    tracemalloc.start()
    try:
        ((path, leaf),) = list(flatten(value))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (len(path), leaf) == (100_000 + len("[2000]"), "x")
    assert peak < 5_000_000


def test_flatten_survives_deep_nesting() -> None:
    deep: object = "bottom"
    for _ in range(5000):
        deep = [deep]
    ((path, leaf),) = list(flatten(deep))
    assert leaf == "bottom" and path.count("[0]") == 5000


def test_the_cell_counter_refuses_past_its_limit() -> None:
    counter = CellCounter("sheet.xlsx", limit=10)
    counter.add(10)
    with pytest.raises(PayloadTooLarge, match="more than 10 cells"):
        counter.add(1)


def test_the_text_counter_refuses_past_its_limit() -> None:
    counter = TextCounter("page.html", limit=10)
    counter.add(10)
    with pytest.raises(PayloadTooLarge, match="more than 10 characters") as info:
        counter.add(1)
    assert info.value.details == {"source": "page.html", "chars": 11}


def test_a_record_stops_at_the_text_limit_before_it_is_built() -> None:
    seen: list[int] = []

    def pairs() -> Iterator[tuple[str, object]]:
        for i in itertools.count():
            seen.append(i)
            yield f"field{i}", "v" * 100

    with pytest.raises(PayloadTooLarge):
        record_text(pairs(), TextCounter("r.json", limit=1000))
    assert len(seen) == 10  # 108 characters a field: the tenth passes 1,000


def test_long_column_names_repeated_on_every_row_stop_at_the_text_limit() -> None:
    read: list[int] = []

    def rows() -> Iterator[Sequence[object]]:
        yield ["n" * 1000, "m" * 1000]  # 2,000 characters of names, repeated on every row
        for i in itertools.count():
            read.append(i)
            yield ["x", "y"]

    text = TextCounter("wide.csv", limit=50_000)
    with pytest.raises(PayloadTooLarge):
        table_rows(rows(), text)
    assert len(read) == 24  # 2,000 + 24 rows of 2,008: the 24th row passes 50,000
    assert text.count < 50_000 + 2_008


def test_one_long_value_in_every_row_stops_at_the_text_limit() -> None:
    shared = "word " * 20_000  # one 100,000-character string, referenced by every row
    read: list[int] = []

    def rows() -> Iterator[Sequence[object]]:
        yield ["Name"]
        for i in range(1000):
            read.append(i)
            yield [shared]

    with pytest.raises(PayloadTooLarge):
        table_rows(rows(), TextCounter("s.xlsx", limit=1_000_000))
    assert len(read) == 10  # 100,005 characters a row: the tenth passes 1,000,000
