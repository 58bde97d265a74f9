"""The checks of an Office zip before a parser sees it: the bound on each XML part, by
content type and by what the relationships lead to."""

from __future__ import annotations

import io
import tracemalloc
import zipfile
from collections.abc import Callable, Iterator

import pytest
from openpyxl.chartsheet import Chartsheet

from chatqna.errors import PayloadTooLarge
from chatqna.ingest import office_package
from chatqna.ingest.loaders import LoadLimits, load_document
from chatqna.ingest.office_package import XLSX_STREAMED
from tests.unit.ingest.office_files import (
    RELATIONSHIPS,
    SHEET_NS,
    declared_part,
    empty_paragraphs_docx,
    handbook_docx,
    headers_docx,
    million_cell_xlsx,
    onboarding_pptx,
    price_list_xlsx,
    renamed_part,
    shared_string_xlsx,
    sheet_target_xlsx,
    with_parts,
    zip_bomb,
)


def test_an_xml_part_beyond_its_bound_is_refused_before_it_is_parsed() -> None:
    bomb = empty_paragraphs_docx(200_000)  # 1.2 MB of XML that packs to a few KiB
    tracemalloc.start()
    try:
        with pytest.raises(PayloadTooLarge, match=r"word/document\.xml unpacks to") as info:
            load_document("bomb.docx", bomb, limits=LoadLimits(max_xml_part_bytes=1 << 20))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.details["part"] == "word/document.xml"
    assert info.value.details["bytes"] > 1 << 20
    assert peak < 5_000_000  # parsed, the tree would take some 40 MB


def test_xml_parts_within_their_bound_but_beyond_it_together_are_refused_unparsed() -> None:
    # Three headers of 0.9 MiB, each under the part bound: python-docx would parse all of
    # them when it opens the file (the loader reads only the main document).
    bomb = headers_docx(3, 900 << 10)
    limits = LoadLimits(max_xml_part_bytes=1 << 20, max_parsed_xml_bytes=2 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(PayloadTooLarge, match="XML parts unpack to") as info:
            load_document("headers.docx", bomb, limits=limits)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.status_code == 413
    assert info.value.details["xml_bytes"] > 3 * (900 << 10)
    assert peak < 5_000_000  # parsed, the trees would take some 100 MB


def test_the_default_budget_refuses_headers_that_would_take_gigabytes() -> None:
    # Two headers just under the 10 MiB part bound, 50 KB packed: parsed, some 700 MB.
    bomb = headers_docx(2, (10 << 20) - 4096)
    assert len(bomb) < 100_000
    with pytest.raises(PayloadTooLarge) as info:
        load_document("headers.docx", bomb)
    assert info.value.details["xml_bytes"] > LoadLimits().max_parsed_xml_bytes


def test_the_xml_budget_counts_every_part_a_presentation_may_parse() -> None:
    notes = '<p:notes xmlns:p="http://schemas.openxmlformats.org/presentationml/2006/main">'
    body = notes + "<a/>" * (300 << 10) + "</p:notes>"
    deck = with_parts(onboarding_pptx(), {f"ppt/notesSlides/extra{i}.xml": body for i in range(3)})
    with pytest.raises(PayloadTooLarge, match="XML parts unpack to"):
        load_document("deck.pptx", deck, limits=LoadLimits(max_parsed_xml_bytes=3 << 20))
    assert load_document("deck.pptx", deck).sections


def test_the_xml_budget_leaves_streamed_spreadsheet_parts_to_the_total() -> None:
    data = big_shared_strings()  # 1.25 MB of shared strings, read string by string
    limits = LoadLimits(max_xml_part_bytes=1 << 20, max_parsed_xml_bytes=1 << 20)
    assert load_document("strings.xlsx", data, limits=limits).sections


def test_the_xml_part_bound_leaves_media_and_spreadsheet_rows_to_the_total() -> None:
    limits = LoadLimits(max_xml_part_bytes=1 << 20)
    picture = zip_bomb(handbook_docx(), "word/media/photo.png", 2 << 20)
    assert load_document("photo.docx", picture, limits=limits).title == "Employee Handbook"
    rows = million_cell_xlsx(rows=20_000, columns=5)  # a 1.6 MB sheet, read row by row
    assert load_document("rows.xlsx", rows, limits=limits).sections[0][1].count("\n\n") > 19_000


def test_an_xml_part_is_bounded_by_its_content_type_not_its_name() -> None:
    # The main document stored as `word/document.bin`: python-docx finds it through the
    # package's relationships and reads it as XML all the same.
    main = ("word/document.xml", "word/document.bin")
    assert (
        load_document("h.docx", renamed_part(handbook_docx(), *main)).title == "Employee Handbook"
    )
    renamed = renamed_part(empty_paragraphs_docx(200_000), *main)
    with pytest.raises(PayloadTooLarge, match=r"word/document\.bin unpacks to") as info:
        load_document("renamed.docx", renamed, limits=LoadLimits(max_xml_part_bytes=1 << 20))
    assert info.value.details["part"] == "word/document.bin"


STYLES_TYPE = "application/vnd.openxmlformats-officedocument.spreadsheetml.styles+xml"
WORKSHEET_TYPE = "application/vnd.openxmlformats-officedocument.spreadsheetml.worksheet+xml"


def test_only_worksheets_and_shared_strings_are_exempt_by_their_content_type() -> None:
    limits = LoadLimits(max_xml_part_bytes=1 << 20)
    big = f'<styleSheet xmlns="{SHEET_NS}">' + "<x/>" * 300_000 + "</styleSheet>"
    # Named like a sheet, declared as styles: bounded.
    styles = declared_part(price_list_xlsx(), "xl/worksheets/sheet9.xml", STYLES_TYPE, big)
    with pytest.raises(PayloadTooLarge, match=r"xl/worksheets/sheet9\.xml unpacks to"):
        load_document("styles.xlsx", styles, limits=limits)
    # Declared a worksheet, but openpyxl opens `xl/styles.xml` by name as the styles: bounded.
    disguised = declared_part(price_list_xlsx(), "xl/styles.xml", WORKSHEET_TYPE, big)
    with pytest.raises(PayloadTooLarge, match=r"xl/styles\.xml unpacks to"):
        load_document("disguised.xlsx", disguised, limits=limits)
    # A sheet stored under another name is still a sheet, read row by row.
    rows = renamed_part(
        million_cell_xlsx(rows=20_000, columns=5),
        "xl/worksheets/sheet1.xml",
        "xl/worksheets/data.bin",
    )
    assert load_document("rows.xlsx", rows, limits=limits).sections[0][1].count("\n\n") > 19_000


def part_text(data: bytes, name: str) -> str:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return archive.read(name).decode()


SHARED_STRINGS_TYPE = (
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sharedStrings+xml"
)


def big_shared_strings(spelling: Callable[[str], str] = str) -> bytes:
    """A workbook of 1.25 MB of shared strings (one string), their content type spelled
    `spelling(SHARED_STRINGS_TYPE)`."""
    data = shared_string_xlsx(rows=1, text="word " * 250_000)
    types = part_text(data, "[Content_Types].xml")
    new_types = types.replace(SHARED_STRINGS_TYPE, spelling(SHARED_STRINGS_TYPE))
    return with_parts(data, {"[Content_Types].xml": new_types})


def test_shared_strings_beyond_the_part_bound_are_read_as_a_stream() -> None:
    # Over a 1 MiB part bound, but openpyxl reads them string by string: only the total
    # bounds them.
    data = big_shared_strings()
    assert len(part_text(data, "xl/sharedStrings.xml")) > 1 << 20
    doc = load_document("strings.xlsx", data, limits=LoadLimits(max_xml_part_bytes=1 << 20))
    assert doc.sections[0][1] == "Name: " + ("word " * 250_000).strip()


@pytest.mark.parametrize("spelling", [str.lower, str.upper])
def test_streamed_content_types_compare_case_insensitively(
    spelling: Callable[[str], str],
) -> None:
    limits = LoadLimits(max_xml_part_bytes=1 << 20)
    office_package.open_package("s.xlsx", big_shared_strings(spelling), limits, XLSX_STREAMED)
    upper = frozenset(t.upper() for t in XLSX_STREAMED)
    office_package.open_package("s.xlsx", big_shared_strings(spelling), limits, upper)
    with pytest.raises(PayloadTooLarge, match=r"xl/sharedStrings\.xml unpacks to"):
        office_package.open_package("s.xlsx", big_shared_strings(spelling), limits)


def test_shared_strings_reached_otherwise_keep_the_part_bound() -> None:
    # The same part, but the workbook's relationships also lead to it as a drawing.
    data = big_shared_strings()
    rels = part_text(data, "xl/_rels/workbook.xml.rels").replace(
        "</Relationships>",
        f'<Relationship Id="rId98" Type="{RELATIONSHIPS}/drawing" Target="sharedStrings.xml"/>'
        "</Relationships>",
    )
    data = with_parts(data, {"xl/_rels/workbook.xml.rels": rels})
    with pytest.raises(PayloadTooLarge, match=r"xl/sharedStrings\.xml unpacks to"):
        load_document("strings.xlsx", data, limits=LoadLimits(max_xml_part_bytes=1 << 20))


class ChartsheetReads:
    """Counts the chartsheets openpyxl builds from a parsed tree."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        build = Chartsheet.from_tree.__func__  # type: ignore[attr-defined]

        def counted(cls: type[Chartsheet], node: object) -> Chartsheet:
            self.count += 1
            return build(cls, node)  # type: ignore[no-any-return]

        monkeypatch.setattr(Chartsheet, "from_tree", classmethod(counted))


@pytest.mark.parametrize("also_sheet", [False, True])
def test_a_worksheet_part_reached_as_a_chartsheet_is_bounded(
    also_sheet: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Declared a worksheet (read row by row, so exempt from the part bound), but the
    # workbook's relationship makes it a chartsheet: openpyxl parses it whole.
    reads = ChartsheetReads(monkeypatch)
    big = f'<chartsheet xmlns="{SHEET_NS}">' + "<x/>" * 300_000 + "</chartsheet>"
    data = sheet_target_xlsx(
        "xl/worksheets/sheet9.xml", big, WORKSHEET_TYPE, "chartsheet", also_sheet=also_sheet
    )
    with pytest.raises(PayloadTooLarge, match=r"xl/worksheets/sheet9\.xml unpacks to") as info:
        load_document("chart.xlsx", data, limits=LoadLimits(max_xml_part_bytes=1 << 20))
    assert info.value.details["part"] == "xl/worksheets/sheet9.xml"
    assert reads.count == 0  # refused before openpyxl built a tree of it


def test_a_worksheet_part_a_drawing_relationship_leads_to_is_bounded() -> None:
    # The relationship is another part's (a chartsheet's drawing), its target relative to
    # that part's folder: `../worksheets/sheet9.xml` from `xl/chartsheets/`.
    big = f'<worksheet xmlns="{SHEET_NS}">' + "<x/>" * 300_000 + "</worksheet>"
    rels = (
        '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
        f'<Relationship Id="rId1" Type="{RELATIONSHIPS}/drawing" '
        'Target="../worksheets/sheet9.xml"/></Relationships>'
    )
    data = with_parts(
        declared_part(price_list_xlsx(), "xl/worksheets/sheet9.xml", WORKSHEET_TYPE, big),
        {"xl/chartsheets/_rels/sheet1.xml.rels": rels},
    )
    with pytest.raises(PayloadTooLarge, match=r"xl/worksheets/sheet9\.xml unpacks to"):
        load_document("drawn.xlsx", data, limits=LoadLimits(max_xml_part_bytes=1 << 20))


def test_a_big_worksheet_reached_as_a_worksheet_is_still_read_row_by_row() -> None:
    rows = "".join(f'<row r="{r}"><c r="A{r}"><v>{r}</v></c></row>' for r in range(1, 40_000))
    big = f'<worksheet xmlns="{SHEET_NS}"><sheetData>{rows}</sheetData></worksheet>'
    data = sheet_target_xlsx("xl/worksheets/sheet9.xml", big, WORKSHEET_TYPE, "worksheet")
    doc = load_document("rows.xlsx", data, limits=LoadLimits(max_xml_part_bytes=1 << 20))
    assert doc.sections[-1][0] == "rows: Chart"
    assert doc.sections[-1][1].count("\n\n") == 39_997  # every row after the header


def test_an_oversized_relationships_part_is_refused_before_any_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The exemption of worksheets hangs on the relationships, but a `.rels` part's own
    # bound does not: a huge one is refused before any relationship is parsed.
    parsed: list[str] = []
    read = office_package._relationships

    def counted(source: str, archive: zipfile.ZipFile, rels: str) -> Iterator[tuple[str, str]]:
        parsed.append(rels)
        return read(source, archive, rels)

    monkeypatch.setattr(office_package, "_relationships", counted)
    many = "".join(
        f'<Relationship Id="r{i}" Type="{RELATIONSHIPS}/image" Target="p/{i}"/>'
        for i in range(30_000)
    )
    package = "http://schemas.openxmlformats.org/package/2006/relationships"
    rels = f'<Relationships xmlns="{package}">{many}</Relationships>'
    data = with_parts(price_list_xlsx(), {"xl/_rels/workbook.xml.rels": rels})
    with pytest.raises(PayloadTooLarge, match=r"xl/_rels/workbook\.xml\.rels unpacks to"):
        load_document("rels.xlsx", data, limits=LoadLimits(max_xml_part_bytes=1 << 20))
    assert parsed == []
