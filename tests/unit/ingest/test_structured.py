"""CSV, JSON and JSON Lines loaders: rows and records keep their field names."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator

import pytest

from chatqna.errors import DocumentLoadError, PayloadTooLarge
from chatqna.ingest.loaders import LoadLimits, load_document


def test_csv_rows_name_their_columns_and_the_delimiter_is_sniffed() -> None:
    data = "\ufeffCountry;VAT rate;Invoice language\nGermany;19 %;German\nFrance;20 %;French\n"
    doc = load_document("exports/vat.csv", data.encode())
    assert doc.title == "vat"
    assert doc.sections == [
        (
            "vat",
            "Country: Germany; VAT rate: 19 %; Invoice language: German\n\n"
            "Country: France; VAT rate: 20 %; Invoice language: French",
        )
    ]


def test_csv_with_quoted_newlines_and_blank_header_cells() -> None:
    data = b'Name,,Note\r\nAda,1815,"first line\r\nsecond line"\r\n'
    doc = load_document("people.csv", data)
    assert doc.sections[0][1] == "Name: Ada; Column 2: 1815; Note: first line second line"


@pytest.fixture
def default_csv_field_limit() -> Iterator[None]:
    """The csv module's own field limit, restored afterwards: it is process-wide."""
    saved = csv.field_size_limit()
    csv.field_size_limit(131_072)
    yield
    csv.field_size_limit(saved)


@pytest.mark.usefixtures("default_csv_field_limit")
def test_a_csv_field_beyond_the_csv_modules_default_limit_is_read() -> None:
    data = ("Note\n" + "x" * 200_000).encode()
    assert load_document("long.csv", data).sections == [("long", "Note: " + "x" * 200_000)]
    assert csv.field_size_limit() == 10_000_000  # raised to the text limit


@pytest.mark.usefixtures("default_csv_field_limit")
def test_the_csv_field_limit_is_never_lowered() -> None:
    csv.field_size_limit(50_000_000)
    load_document("small.csv", b"a,b\n1,2\n", limits=LoadLimits(max_text_chars=1000))
    assert csv.field_size_limit() == 50_000_000


@pytest.mark.usefixtures("default_csv_field_limit")
@pytest.mark.parametrize("field", [5_000, 200_000])
def test_a_csv_field_beyond_the_text_limit_is_413(field: int) -> None:
    # 5,000 characters: read, then refused by the text count; 200,000: past the csv
    # module's limit (kept at 131,072 here, as another setting could leave it).
    data = ("Note\n" + "x" * field).encode()
    with pytest.raises(PayloadTooLarge, match="CHATQNA_DATAPREP_MAX_TEXT_CHARS") as info:
        load_document("long.csv", data, limits=LoadLimits(max_text_chars=1000))
    assert info.value.status_code == 413


def test_json_list_of_records_flattens_nested_fields() -> None:
    records = [
        {"plan": "Starter", "price": {"monthly": 9, "currency": "EUR"}, "sso": False},
        {"plan": "Business", "price": {"monthly": 49, "currency": "EUR"}, "sso": True},
    ]
    doc = load_document("plans.json", json.dumps(records).encode())
    assert doc.sections == [
        (
            "plans",
            "plan: Starter; price.monthly: 9; price.currency: EUR; sso: false\n\n"
            "plan: Business; price.monthly: 49; price.currency: EUR; sso: true",
        )
    ]


def test_json_object_fields_holding_containers_become_sections() -> None:
    value = {
        "product": "Larkspur",
        "version": "4.2",
        "limits": {"workspaces": 10, "storage_gb": 100},
        "regions": [{"name": "eu-west", "city": "Dublin"}, {"name": "us-east"}],
    }
    doc = load_document("about.json", json.dumps(value).encode())
    assert doc.sections == [
        ("about", "product: Larkspur; version: 4.2"),
        ("limits", "workspaces: 10; storage_gb: 100"),
        ("regions", "name: eu-west; city: Dublin\n\nname: us-east"),
    ]


def test_jsonl_one_record_per_line() -> None:
    lines = [{"q": "How do I reset my password?", "a": "Use the sign-in page link."}, "a note"]
    data = "\n".join(json.dumps(line) for line in lines) + "\n\n"
    doc = load_document("faq.jsonl", data.encode())
    assert doc.sections == [
        ("faq", "q: How do I reset my password?; a: Use the sign-in page link.\n\na note")
    ]


@pytest.mark.parametrize(
    ("source", "data", "message"),
    [
        ("bad.json", b'{"a": ', "not valid JSON"),
        ("bad.jsonl", b'{"a": 1}\n{"b": \n', "line 2 is not valid JSON"),
        ("deep.json", b"[" * 100_000 + b"]" * 100_000, "nests too deeply"),
    ],
)
def test_unreadable_json_is_a_load_error(source: str, data: bytes, message: str) -> None:
    with pytest.raises(DocumentLoadError, match=message):
        load_document(source, data)


def test_json_that_is_one_huge_string_is_413() -> None:
    data = json.dumps("word " * 400_000).encode()
    with pytest.raises(PayloadTooLarge, match="characters of text") as info:
        load_document("huge.json", data, limits=LoadLimits(max_text_chars=1_000_000))
    assert info.value.status_code == 413
    assert info.value.details == {"source": "huge.json", "chars": 1_999_999}


def test_a_long_key_above_many_fields_is_refused_once_the_text_passes_the_limit() -> None:
    # Every field's path repeats the 10,000-character key: 20 MB of text from 30 KB.
    data = json.dumps([{"k" * 10_000: {str(i): 1 for i in range(2000)}}]).encode()
    with pytest.raises(PayloadTooLarge, match="CHATQNA_DATAPREP_MAX_TEXT_CHARS") as info:
        load_document("paths.json", data, limits=LoadLimits(max_text_chars=100_000))
    assert 100_000 < info.value.details["chars"] < 100_000 + 10_010


@pytest.mark.parametrize("shape", ["object", "list of one record"])
def test_an_objects_top_level_fields_count_against_the_cell_limit(shape: str) -> None:
    fields = {f"k{i}": i for i in range(30)}
    data = json.dumps(fields if shape == "object" else [fields]).encode()
    assert load_document("ok.json", data, limits=LoadLimits(max_cells=30)).sections
    with pytest.raises(PayloadTooLarge, match="more than 29 cells"):
        load_document("wide.json", data, limits=LoadLimits(max_cells=29))


def test_blank_csv_lines_count_as_rows_against_the_cell_limit() -> None:
    # A blank line is a row of no cells: counted as one, as an empty spreadsheet row is.
    assert load_document("one.csv", b"a,b\n\n1,2\n", limits=LoadLimits(max_cells=5)).sections
    with pytest.raises(PayloadTooLarge, match="more than 10 cells") as info:
        load_document("blank.csv", b"a,b\n1,2\n" + b"\n" * 1000, limits=LoadLimits(max_cells=10))
    assert info.value.status_code == 413


def test_jsonl_is_refused_at_the_record_that_passes_the_cell_limit() -> None:
    # Refused at line 11, before the unreadable last line is parsed.
    data = b"[]\n" * 1000 + b"{not json\n"
    with pytest.raises(PayloadTooLarge, match="more than 10 cells"):
        load_document("empty.jsonl", data, limits=LoadLimits(max_cells=10))


def test_blank_jsonl_lines_count_against_the_cell_limit() -> None:
    data = b'{"a": 1}\n' + b"\n" * 1000
    with pytest.raises(PayloadTooLarge, match="more than 10 cells"):
        load_document("blank.jsonl", data, limits=LoadLimits(max_cells=10))
