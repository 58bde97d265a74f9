"""Office loaders: headings, tables as named rows, slides with notes, and hostile files."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tracemalloc
import zipfile
from pathlib import Path

import defusedxml.ElementTree
import docx
import openpyxl.xml.functions
import pytest
from docx.oxml.text.run import CT_R

from chatqna.errors import DocumentLoadError, PayloadTooLarge
from chatqna.ingest import office
from chatqna.ingest.loaders import LoadLimits, load_document
from chatqna.ingest.tables import TextCounter, table_rows
from tests.unit.ingest.office_files import (
    declaring_entity,
    empty_paragraphs_docx,
    entity_xlsx,
    far_row_xlsx,
    handbook_docx,
    million_cell_xlsx,
    ole_file,
    onboarding_pptx,
    one_paragraph_docx,
    price_list_xlsx,
    shared_string_xlsx,
    table_docx,
    word_cell,
    zip_bomb,
)


def test_docx_headings_start_sections_and_tables_name_their_columns() -> None:
    doc = load_document("hr/handbook.docx", handbook_docx())
    assert doc.title == "Employee Handbook"
    assert doc.sections == [
        ("Employee Handbook", "Welcome to the company."),
        ("Travel expenses", "Train tickets are reimbursed in second class only."),
        (
            "Per diem",
            "City: Berlin; Daily allowance: 42 EUR\n\nCity: Lisbon; Daily allowance: 37 EUR",
        ),
        ("Parental leave", "Parents receive sixteen weeks of paid leave."),
    ]


MERGED = [
    [word_cell("Team", merge="restart"), word_cell("Contact", span=2), word_cell("Room")],
    [word_cell("", merge="continue"), word_cell("Astrid"), word_cell("Berg"), word_cell("4.1")],
    [word_cell("Payroll"), word_cell("Noor Haddad", span=2), word_cell("", merge="restart")],
    [word_cell("", merge="restart"), word_cell("Ivo"), word_cell("Petrov"), word_cell("")],
    [word_cell("", merge="continue"), word_cell("Lea Vogel", span=3)],
]


def test_docx_merged_cells_read_as_python_docx_lays_them_out() -> None:
    data = table_docx(MERGED)
    table = docx.Document(io.BytesIO(data)).tables[0]
    laid_out = [[cell.text for cell in row.cells] for row in table.rows]
    expected = "\n\n".join(table_rows(laid_out, TextCounter("merged.docx", 10**9)))
    assert load_document("merged.docx", data).sections == [("merged", expected)]
    assert expected == (
        "Team: Team; Contact: Astrid; Contact: Berg; Room: 4.1\n\n"
        "Team: Payroll; Contact: Noor Haddad; Contact: Noor Haddad\n\n"
        "Contact: Ivo; Contact: Petrov\n\n"
        "Contact: Lea Vogel; Contact: Lea Vogel; Room: Lea Vogel"
    )


def test_docx_merged_cells_are_found_without_searching_the_rows_above(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # python-docx searches row by row for the cell above a merged one (minutes for a tall
    # merged column); the loader must not depend on it.
    def search_above(tc: object) -> object:
        raise AssertionError("searched the rows above")

    monkeypatch.setattr(docx.oxml.table.CT_Tc, "_tc_above", property(search_above))
    assert load_document("merged.docx", table_docx(MERGED)).sections[0][1].endswith("Lea Vogel")


def test_a_docx_cell_spanning_a_huge_grid_is_refused_before_it_is_expanded() -> None:
    rows = [[word_cell("Name")], [word_cell("word " * 200, span=100_000)]]
    tracemalloc.start()
    try:
        with pytest.raises(PayloadTooLarge, match="more than 1000 cells"):
            load_document("wide.docx", table_docx(rows), limits=LoadLimits(max_cells=1000))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20_000_000  # a million-character cell repeated 100,000 times is 100 GB


def test_a_docx_cell_spanning_many_columns_stops_at_the_text_limit() -> None:
    rows = [[word_cell("Name")], [word_cell("word " * 200, span=5000)]]
    limits = LoadLimits(max_text_chars=100_000)
    with pytest.raises(PayloadTooLarge, match="CHATQNA_DATAPREP_MAX_TEXT_CHARS") as info:
        load_document("span.docx", table_docx(rows), limits=limits)
    assert 100_000 < info.value.details["chars"] < 100_000 + 1_020


@pytest.mark.parametrize("in_cell", [False, True])
def test_a_docx_of_empty_paragraphs_is_refused_at_the_cell_limit(in_cell: bool) -> None:
    # Each paragraph costs its text's look-up even when empty: counted before it is read.
    with pytest.raises(PayloadTooLarge, match="more than 1000 cells, paragraphs and runs") as info:
        load_document(
            "empty.docx",
            empty_paragraphs_docx(50_000, in_cell=in_cell),
            limits=LoadLimits(max_cells=1000),
        )
    assert info.value.status_code == 413
    assert "CHATQNA_DATAPREP_MAX_CELLS" in info.value.message


def test_a_docx_within_the_cell_limit_still_reads_its_paragraphs() -> None:
    doc = load_document("few.docx", empty_paragraphs_docx(900), limits=LoadLimits(max_cells=1000))
    assert doc.sections[0][1] == "Hello"


class RunReads:
    """Counts the runs whose text python-docx reads (`CT_R.text`)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        read = CT_R.text.fget

        def counted(run: CT_R) -> str:
            self.count += 1
            return read(run)  # type: ignore[no-any-return,misc]

        monkeypatch.setattr(CT_R, "text", property(counted))


@pytest.mark.parametrize("in_cell", [False, True])
def test_a_paragraph_of_empty_runs_is_refused_before_a_run_is_read(
    in_cell: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 250,000 `<w:r/>`: 1.5 MB of XML, under the part bound, and past the default budget
    # of 200,000 cells, paragraphs and runs. Read one by one they cost seconds.
    reads = RunReads(monkeypatch)
    data = one_paragraph_docx("<w:r/>" * 250_000, in_cell=in_cell)
    with pytest.raises(PayloadTooLarge, match="cells, paragraphs and runs") as info:
        load_document("runs.docx", data)
    assert info.value.status_code == 413
    assert "CHATQNA_DATAPREP_MAX_CELLS" in info.value.message
    assert reads.count == 0  # refused before python-docx read the text of any run


def test_the_runs_of_hyperlinks_count_too(monkeypatch: pytest.MonkeyPatch) -> None:
    reads = RunReads(monkeypatch)
    link = "<w:hyperlink>" + "<w:r/>" * 1200 + "</w:hyperlink>"
    with pytest.raises(PayloadTooLarge, match="more than 1000 cells, paragraphs and runs"):
        load_document("links.docx", one_paragraph_docx(link), limits=LoadLimits(max_cells=1000))
    assert reads.count == 0


def test_a_docx_of_many_runs_within_the_budget_is_read_in_full(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reads = RunReads(monkeypatch)
    words = "".join(f'<w:r><w:t xml:space="preserve">w{i} </w:t></w:r>' for i in range(990))
    data = one_paragraph_docx(words, in_cell=False)
    # Two paragraphs and 991 runs: 993 of the 1,000.
    doc = load_document("words.docx", data, limits=LoadLimits(max_cells=1000))
    assert doc.sections[0][1] == "Hello\n\n" + " ".join(f"w{i}" for i in range(990))
    assert reads.count == 991


def test_pptx_slides_keep_titles_notes_and_tables() -> None:
    doc = load_document("onboarding.pptx", onboarding_pptx())
    assert doc.title == "Onboarding"
    headings = [heading for heading, _ in doc.sections]
    assert headings == ["Slide 1: Onboarding", "Slide 2: Laptop setup", "Slide 3: Contacts"]
    laptop = doc.sections[1][1]
    assert laptop.startswith("Laptop setup\n\nCollect your laptop")
    assert laptop.endswith("Notes: Remind them the VPN token expires after 90 days.")
    assert doc.sections[2][1] == "Contacts\n\nTeam: Payroll; Extension: 4471"


def test_xlsx_sheets_become_sections_of_named_rows() -> None:
    doc = load_document("prices.xlsx", price_list_xlsx())
    assert doc.sections == [
        (
            "prices: Prices",
            "Product: Starter; Monthly price (EUR): 9; Seats: 3\n\n"
            "Product: Business; Monthly price (EUR): 49; Seats: 50\n\n"
            "Product: Enterprise; Monthly price (EUR): 199; Seats: 500",
        ),
        ("prices: Contacts", "Region: Nordics; Sales contact: Astrid Berg"),
    ]


def test_a_spreadsheet_beyond_the_cell_limit_is_413() -> None:
    with pytest.raises(PayloadTooLarge, match="more than 300 cells"):
        load_document("big.xlsx", price_list_xlsx(extra_rows=200), limits=LoadLimits(max_cells=300))


def test_a_million_cells_is_refused_by_its_declared_size() -> None:
    with pytest.raises(PayloadTooLarge) as info:
        load_document("million.xlsx", million_cell_xlsx())
    assert info.value.status_code == 413 and "CHATQNA_DATAPREP_MAX_CELLS" in info.value.message


def test_an_undeclared_sheet_is_refused_once_the_limit_is_read() -> None:
    data = million_cell_xlsx(rows=5000, dimension=False)
    with pytest.raises(PayloadTooLarge, match="more than 5000 cells"):
        load_document("undeclared.xlsx", data, limits=LoadLimits(max_cells=5000))


def test_one_shared_string_on_every_row_is_refused_once_the_text_passes_the_limit() -> None:
    # 1,000 rows of 10,000 characters each from a workbook of a few kilobytes.
    data = shared_string_xlsx(rows=1000, text="word " * 2000)
    with pytest.raises(PayloadTooLarge, match="CHATQNA_DATAPREP_MAX_TEXT_CHARS") as info:
        load_document("shared.xlsx", data, limits=LoadLimits(max_text_chars=100_000))
    # Stopped at the row that passed the limit, not once all ten million were built.
    assert 100_000 < info.value.details["chars"] < 100_000 + 10_010


def test_empty_rows_count_against_the_cell_limit() -> None:
    # An empty row counts as one cell: 900 rows and the 4 cells of the second sheet fit.
    limits = LoadLimits(max_cells=1000)
    near = load_document("near.xlsx", far_row_xlsx(last_row=900), limits=limits)
    assert near.sections[0][1] == "Name: x"
    with pytest.raises(PayloadTooLarge, match="more than 1000 cells"):
        load_document("far.xlsx", far_row_xlsx(last_row=100_000), limits=limits)


@pytest.mark.parametrize("part", ["worksheet", "sst"])
def test_xml_entities_in_a_spreadsheet_are_refused_unexpanded(part: str) -> None:
    # 40,001 references to 250 characters: past the text limit, were they expanded.
    data = entity_xlsx(part, 40_001)
    assert len(data) < 20_000
    tracemalloc.start()
    try:
        with pytest.raises(DocumentLoadError) as info:
            load_document("entities.xlsx", data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    error = info.value
    assert (error.status_code, error.code, error.reason) == (
        422,
        "document_unreadable",
        "xml_entities",
    )
    assert "entities.xlsx declares XML entities (EntitiesForbidden(name='e'" in error.message
    assert peak < 5_000_000  # expanded, the cell's text alone would take 10 MB


def test_openpyxl_streams_spreadsheets_through_defusedxml() -> None:
    # openpyxl picks its streaming parser once, when imported: without defusedxml it would
    # be the standard library's, which expands entities.
    assert openpyxl.xml.DEFUSEDXML is True
    assert openpyxl.xml.functions.iterparse is defusedxml.ElementTree.iterparse


# Run with OPENPYXL_DEFUSEDXML=false (openpyxl takes only "True"): the service starts and
# warns, a spreadsheet is refused, a Word file is read.
UNPROTECTED_SERVICE = """
import asyncio, logging
from chatqna import app as app_module
from chatqna.errors import DocumentLoadError, StartupFailed
from chatqna.ingest.loaders import load_document
from chatqna.settings import Settings
from tests.unit.ingest.office_files import handbook_docx, price_list_xlsx

logging.basicConfig(level=logging.WARNING, format="logged %(levelname)s %(message)s")

async def stop(settings):
    raise StartupFailed("stop after the warnings")

async def start() -> None:
    app_module.build_backends = stop
    app = app_module.create_app(Settings())
    try:
        async with app.router.lifespan_context(app):
            pass
    except StartupFailed:
        pass

asyncio.run(start())
print("docx:", load_document("handbook.docx", handbook_docx()).title)
try:
    load_document("prices.xlsx", price_list_xlsx())
except DocumentLoadError as error:
    print("xlsx:", error.status_code, error.code, error.reason, error.message)
"""


def test_without_defusedxml_the_service_starts_warns_and_refuses_spreadsheets() -> None:
    result = subprocess.run(
        [sys.executable, "-c", UNPROTECTED_SERVICE],
        env={**os.environ, "OPENPYXL_DEFUSEDXML": "false"},
        cwd=Path(__file__).resolve().parents[3],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "docx: Employee Handbook" in lines
    (refused,) = [line for line in lines if line.startswith("xlsx:")]
    assert refused.startswith("xlsx: 422 document_unreadable xml_unprotected prices.xlsx")
    assert "OPENPYXL_DEFUSEDXML must be unset or exactly True" in refused
    warned = [line for line in result.stderr.splitlines() if "OPENPYXL_DEFUSEDXML=" in line]
    assert len(warned) == 1 and warned[0].startswith("logged WARNING")
    assert "OPENPYXL_DEFUSEDXML='false'" in warned[0] and "xml_unprotected" in warned[0]


def test_with_defusedxml_nothing_is_warned_about_spreadsheets() -> None:
    assert office.startup_warnings() == []


def test_spreadsheets_are_refused_before_they_are_opened_when_unprotected(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    opened: list[str] = []
    monkeypatch.setattr(office, "XLSX_PROTECTED", False)
    monkeypatch.setattr(office.openpyxl, "load_workbook", lambda *a, **k: opened.append("xlsx"))
    with pytest.raises(DocumentLoadError) as info:
        load_document("prices.xlsx", price_list_xlsx())
    assert (info.value.status_code, info.value.code, info.value.reason) == (
        422,
        "document_unreadable",
        "xml_unprotected",
    )
    assert opened == []
    assert load_document("hr/handbook.docx", handbook_docx()).title == "Employee Handbook"


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("entity.docx", declaring_entity(handbook_docx(), "word/document.xml", "Welcome")),
        ("entity.pptx", declaring_entity(onboarding_pptx(), "ppt/slides/slide2.xml", "Collect")),
    ],
)
def test_word_and_powerpoint_leave_xml_entities_unexpanded(name: str, data: bytes) -> None:
    # python-docx and python-pptx parse with lxml, resolve_entities=False.
    doc = load_document(name, data)
    assert doc.sections and not any("EXPANDED" in body for _, body in doc.sections)


@pytest.mark.parametrize(
    ("name", "build", "part"),
    [
        ("bomb.xlsx", price_list_xlsx, "xl/media/zeros.bin"),
        ("bomb.docx", handbook_docx, "word/media/zeros.bin"),
    ],
)
def test_zip_bomb_is_refused_before_it_is_inflated(name: str, build: object, part: str) -> None:
    assert callable(build)
    bomb = zip_bomb(build(), part, 64 << 20)
    assert len(bomb) < 1 << 20  # 64 MiB of zeros packs to well under a megabyte
    with pytest.raises(PayloadTooLarge, match="unpacks to"):
        load_document(name, bomb, limits=LoadLimits(max_unpacked_bytes=32 << 20))


@pytest.mark.parametrize("name", ["broken.docx", "broken.pptx", "broken.xlsx"])
def test_corrupt_office_files_are_unreadable(name: str) -> None:
    with pytest.raises(DocumentLoadError, match="not a readable"):
        load_document(name, b"PK\x03\x04 this is not really a zip")


def test_a_zip_without_the_office_parts_is_unreadable() -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("hello.txt", "hi")
    with pytest.raises(DocumentLoadError, match=r"it has no \[Content_Types\]\.xml") as info:
        load_document("empty.docx", buffer.getvalue())
    assert info.value.reason == "corrupt"


def test_password_protected_office_file_is_named_as_such() -> None:
    data = ole_file(["Root Entry", "EncryptionInfo", "EncryptedPackage"])
    with pytest.raises(DocumentLoadError, match="password-protected") as info:
        load_document("secret.xlsx", data)
    assert info.value.reason == "encrypted" and info.value.status_code == 422


def test_legacy_binary_office_file_is_named_as_such() -> None:
    with pytest.raises(DocumentLoadError, match="legacy binary"):
        load_document("old.docx", ole_file(["Root Entry", "WordDocument"]))
