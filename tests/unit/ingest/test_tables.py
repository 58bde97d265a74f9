"""Tables and records of the structured loaders: cell text, named rows, flattening, limits."""

from __future__ import annotations

import datetime as dt

import pytest

from chatqna.errors import PayloadTooLarge
from chatqna.ingest.tables import CellCounter, cell_text, flatten, record_text, table_rows


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
    assert record_text([("Plan", "Business"), ("Seats", 50.0), ("Notes", None), ("", "x")]) == (
        "Plan: Business; Seats: 50; x"
    )


def test_each_row_names_its_columns_from_the_first_non_empty_row() -> None:
    rows = [[None, None], ["Plan", ""], ["Business", 50, "extra"], [None, None]]
    assert table_rows(rows) == ["Plan: Business; Column 2: 50; Column 3: extra"]


def test_a_lone_header_row_keeps_its_cells() -> None:
    assert table_rows([["Plan", "", "Seats"]]) == ["Plan; Seats"]
    assert table_rows([]) == []


def test_flatten_gives_dotted_paths_in_document_order() -> None:
    value = {"plan": {"name": "Pro", "seats": [5, 10]}, "active": True}
    assert list(flatten(value)) == [
        ("plan.name", "Pro"),
        ("plan.seats[0]", 5),
        ("plan.seats[1]", 10),
        ("active", True),
    ]


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
