"""Office files built by the tests themselves, with the libraries the loaders read them with."""

from __future__ import annotations

import io
import zipfile

import docx
import openpyxl
import pptx


def handbook_docx() -> bytes:
    """A Word handbook: a title, two headings, a table, body text."""
    document = docx.Document()
    document.add_paragraph("Employee Handbook", style="Title")
    document.add_paragraph("Welcome to the company.")
    document.add_heading("Travel expenses", level=1)
    document.add_paragraph("Train tickets are reimbursed in second class only.")
    document.add_heading("Per diem", level=2)
    table = document.add_table(rows=3, cols=2)
    rows = [("City", "Daily allowance"), ("Berlin", "42 EUR"), ("Lisbon", "37 EUR")]
    for row, values in zip(table.rows, rows, strict=True):
        for cell, value in zip(row.cells, values, strict=True):
            cell.text = value
    document.add_heading("Parental leave", level=1)
    document.add_paragraph("Parents receive sixteen weeks of paid leave.")
    buffer = io.BytesIO()
    document.save(buffer)
    return buffer.getvalue()


def word_cell(text: str, span: int = 1, merge: str | None = None) -> str:
    """A `<w:tc>` holding `text`, spanning `span` grid columns, vertically merged
    (`merge="restart"` starts a merge, `"continue"` carries on the one above) or not."""
    props = (f'<w:gridSpan w:val="{span}"/>' if span > 1 else "") + (
        f'<w:vMerge w:val="{merge}"/>' if merge else ""
    )
    return f"<w:tc><w:tcPr>{props}</w:tcPr><w:p><w:r><w:t>{text}</w:t></w:r></w:p></w:tc>"


def table_docx(rows: list[list[str]]) -> bytes:
    """A Word document holding one table whose rows are the given `word_cell`s."""
    document = docx.Document()
    document.add_table(rows=1, cols=1)
    buffer = io.BytesIO()
    document.save(buffer)
    body = _part(buffer.getvalue(), "word/document.xml")
    start, end = body.index("<w:tr"), body.rindex("</w:tr>") + len("</w:tr>")
    trs = "".join("<w:tr>" + "".join(cells) + "</w:tr>" for cells in rows)
    return with_parts(buffer.getvalue(), {"word/document.xml": body[:start] + trs + body[end:]})


def empty_paragraphs_docx(count: int, *, in_cell: bool = False) -> bytes:
    """A Word document of `count` empty paragraphs (`<w:p/>`, a few bytes each), in the
    body or all in one table cell: tiny to upload, millions of elements to read."""
    document = docx.Document()
    buffer = io.BytesIO()
    document.save(buffer)
    body = _part(buffer.getvalue(), "word/document.xml")
    paragraphs = "<w:p/>" * count
    if in_cell:
        paragraphs = f"<w:tbl><w:tr><w:tc>{paragraphs}</w:tc></w:tr></w:tbl>"
    start = body.index("<w:body>") + len("<w:body>")
    filled = body[:start] + "<w:p><w:r><w:t>Hello</w:t></w:r></w:p>" + paragraphs + body[start:]
    return with_parts(buffer.getvalue(), {"word/document.xml": filled})


def one_paragraph_docx(inner: str, *, in_cell: bool = False) -> bytes:
    """A Word document of a "Hello" paragraph and one more paragraph holding `inner` (runs,
    hyperlinks), in the body or in a table cell."""
    document = docx.Document()
    buffer = io.BytesIO()
    document.save(buffer)
    body = _part(buffer.getvalue(), "word/document.xml")
    paragraph = f"<w:p>{inner}</w:p>"
    if in_cell:
        paragraph = f"<w:tbl><w:tr><w:tc>{paragraph}</w:tc></w:tr></w:tbl>"
    start = body.index("<w:body>") + len("<w:body>")
    filled = body[:start] + "<w:p><w:r><w:t>Hello</w:t></w:r></w:p>" + paragraph + body[start:]
    return with_parts(buffer.getvalue(), {"word/document.xml": filled})


def declaring_entity(like: bytes, part: str, before: str) -> bytes:
    """The zip `like` whose `part` declares the internal entity `e` ("EXPANDED") and refers
    to it just before the text `before`."""
    body = _part(like, part)
    root = body[body.index("?>") + 2 :].lstrip()[1:].split(" ", 1)[0]
    start = body.index("?>") + 2
    body = f'{body[:start]}<!DOCTYPE {root} [<!ENTITY e "EXPANDED">]>{body[start:]}'
    return with_parts(like, {part: body.replace(before, "&e;" + before, 1)})


def onboarding_pptx() -> bytes:
    """A deck: a title slide, a bulleted slide with speaker notes, a slide with a table."""
    deck = pptx.Presentation()
    first = deck.slides.add_slide(deck.slide_layouts[0])
    first.shapes.title.text = "Onboarding"
    first.placeholders[1].text = "Your first week"
    second = deck.slides.add_slide(deck.slide_layouts[1])
    second.shapes.title.text = "Laptop setup"
    second.placeholders[1].text = "Collect your laptop from the IT desk on floor three."
    second.notes_slide.notes_text_frame.text = "Remind them the VPN token expires after 90 days."
    third = deck.slides.add_slide(deck.slide_layouts[5])
    third.shapes.title.text = "Contacts"
    shape = third.shapes.add_table(
        2, 2, pptx.util.Inches(1), pptx.util.Inches(2), pptx.util.Inches(6), pptx.util.Inches(1)
    )
    for (row, col), value in {
        (0, 0): "Team",
        (0, 1): "Extension",
        (1, 0): "Payroll",
        (1, 1): "4471",
    }.items():
        shape.table.cell(row, col).text = value
    buffer = io.BytesIO()
    deck.save(buffer)
    return buffer.getvalue()


def price_list_xlsx(extra_rows: int = 0) -> bytes:
    """A workbook: a price sheet (with a formula) and a contacts sheet."""
    workbook = openpyxl.Workbook()
    prices = workbook.active
    prices.title = "Prices"
    prices.append(["Product", "Monthly price (EUR)", "Seats"])
    prices.append(["Starter", 9, 3])
    prices.append(["Business", 49.0, 50])
    prices.append(["Enterprise", 199, 500])
    for number in range(extra_rows):
        prices.append([f"Item {number}", number, number])
    contacts = workbook.create_sheet("Contacts")
    contacts.append(["Region", "Sales contact"])
    contacts.append(["Nordics", "Astrid Berg"])
    buffer = io.BytesIO()
    workbook.save(buffer)
    return buffer.getvalue()


def zip_bomb(like: bytes, part: str, size: int) -> bytes:
    """`like` with one more part that inflates to `size` zero bytes."""
    buffer = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(like)) as source,
        zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as target,
    ):
        for item in source.infolist():
            target.writestr(item, source.read(item))
        with target.open(part, "w") as stream:
            chunk = b"\0" * (1 << 20)
            for _ in range(size // len(chunk)):
                stream.write(chunk)
    return buffer.getvalue()


SHEET_NS = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"


def with_parts(like: bytes, parts: dict[str, str]) -> bytes:
    """The zip `like` with the named parts' contents replaced, or added."""
    buffer = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(like)) as source,
        zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as target,
    ):
        for item in source.infolist():
            body = parts[item.filename].encode() if item.filename in parts else source.read(item)
            target.writestr(item.filename, body)
        for name in parts.keys() - set(source.namelist()):
            target.writestr(name, parts[name])
    return buffer.getvalue()


def renamed_part(like: bytes, old: str, new: str) -> bytes:
    """The zip `like` with its part `old` (and that part's relationships) stored as `new`,
    and every relationship and content type that named it pointing at the new name: the
    same package to an Office reader, which finds parts by relationship."""
    buffer = io.BytesIO()
    old_rels, new_rels = (
        f"{n.rpartition('/')[0]}/_rels/{n.rpartition('/')[2]}.rels" for n in (old, new)
    )
    with (
        zipfile.ZipFile(io.BytesIO(like)) as source,
        zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as target,
    ):
        for item in source.infolist():
            body = source.read(item)
            if item.filename.endswith((".rels", "[Content_Types].xml")):
                body = body.replace(old.encode(), new.encode())
            name = {old: new, old_rels: new_rels}.get(item.filename, item.filename)
            target.writestr(name, body)
    return buffer.getvalue()


def declared_part(like: bytes, part: str, content_type: str, body: str) -> bytes:
    """The zip `like` with `part` holding `body`, declared of `content_type` by an Override."""
    types = _part(like, "[Content_Types].xml").replace(
        "</Types>", f'<Override PartName="/{part}" ContentType="{content_type}"/></Types>'
    )
    return with_parts(like, {part: body, "[Content_Types].xml": types})


WORD_NS = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
HEADER_TYPE = "application/vnd.openxmlformats-officedocument.wordprocessingml.header+xml"
HEADER_RELATIONSHIP = "http://schemas.openxmlformats.org/officeDocument/2006/relationships/header"


def headers_docx(count: int, part_bytes: int) -> bytes:
    """The handbook with `count` header parts of `part_bytes` of bare elements each, every
    one a relationship of the main document: python-docx parses them all when it opens
    the file, whether any section shows them or not; they pack to a few KiB each."""
    like = handbook_docx()
    head, tail = f'<w:hdr xmlns:w="{WORD_NS}">', "</w:hdr>"
    header = head + "<a/>" * ((part_bytes - len(head) - len(tail)) // 4) + tail
    rels_name = "word/_rels/document.xml.rels"
    rels = _part(like, rels_name).replace(
        "</Relationships>",
        "".join(
            f'<Relationship Id="rIdH{i}" Type="{HEADER_RELATIONSHIP}" Target="header{i}.xml"/>'
            for i in range(count)
        )
        + "</Relationships>",
    )
    types = _part(like, "[Content_Types].xml").replace(
        "</Types>",
        "".join(
            f'<Override PartName="/word/header{i}.xml" ContentType="{HEADER_TYPE}"/>'
            for i in range(count)
        )
        + "</Types>",
    )
    parts = {f"word/header{i}.xml": header for i in range(count)}
    return with_parts(like, {**parts, rels_name: rels, "[Content_Types].xml": types})


def _part(data: bytes, name: str) -> str:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return archive.read(name).decode()


def million_cell_xlsx(rows: int = 50_000, columns: int = 20, dimension: bool = True) -> bytes:
    """A workbook whose first sheet holds `rows * columns` numeric cells (written as XML
    directly: building a million cells through openpyxl takes far longer), declaring its
    size in a `<dimension>` as Excel does, or not."""
    row_xml = "<row>" + "<c><v>7</v></c>" * columns + "</row>"
    sheet = (
        '<?xml version="1.0" encoding="UTF-8"?>'
        f'<worksheet xmlns="{SHEET_NS}">'
        + (f'<dimension ref="A1:{chr(64 + columns)}{rows}"/>' if dimension else "")
        + "<sheetData>"
        + row_xml * rows
        + "</sheetData></worksheet>"
    )
    return with_parts(price_list_xlsx(), {"xl/worksheets/sheet1.xml": sheet})


def shared_string_xlsx(rows: int, text: str) -> bytes:
    """A workbook whose first sheet is a `Name` header and `rows` cells that all point at
    one shared string, `text`: a few bytes per row, `len(text)` characters each."""
    body = "".join(f'<row r="{r}"><c r="A{r}" t="s"><v>1</v></c></row>' for r in range(2, rows + 2))
    sheet = (
        f'<worksheet xmlns="{SHEET_NS}"><sheetData>'
        f'<row r="1"><c r="A1" t="s"><v>0</v></c></row>{body}</sheetData></worksheet>'
    )
    strings = f'<sst xmlns="{SHEET_NS}"><si><t>Name</t></si><si><t>{text}</t></si></sst>'
    like = price_list_xlsx()  # openpyxl writes its strings inline: declare the new part
    rels = _part(like, "xl/_rels/workbook.xml.rels").replace(
        "</Relationships>",
        '<Relationship Id="rId99" Target="sharedStrings.xml" Type="http://schemas.openxmlformats'
        '.org/officeDocument/2006/relationships/sharedStrings"/></Relationships>',
    )
    types = _part(like, "[Content_Types].xml").replace(
        "</Types>",
        '<Override PartName="/xl/sharedStrings.xml" ContentType="application/vnd.openxmlformats'
        '-officedocument.spreadsheetml.sharedStrings+xml"/></Types>',
    )
    return with_parts(
        like,
        {
            "xl/worksheets/sheet1.xml": sheet,
            "xl/sharedStrings.xml": strings,
            "xl/_rels/workbook.xml.rels": rels,
            "[Content_Types].xml": types,
        },
    )


def entity_xlsx(part: str, refs: int) -> bytes:
    """`shared_string_xlsx` whose worksheet (`part="worksheet"`) or shared strings
    (`part="sst"`) declares an internal entity of 250 characters and refers to it `refs`
    times in the second row's cell: four bytes per reference, 250 characters each if the
    parser expanded them."""
    like = shared_string_xlsx(rows=1, text="x")
    doctype = f'<!DOCTYPE {part} [<!ENTITY e "{"A" * 250}">]>'
    if part == "worksheet":
        name = "xl/worksheets/sheet1.xml"
        body = (
            f'{doctype}<worksheet xmlns="{SHEET_NS}"><sheetData>'
            '<row r="1"><c r="A1" t="s"><v>0</v></c></row>'
            f'<row r="2"><c r="A2" t="inlineStr"><is><t>{"&e;" * refs}</t></is></c></row>'
            "</sheetData></worksheet>"
        )
    else:
        name = "xl/sharedStrings.xml"
        body = (
            f'{doctype}<sst xmlns="{SHEET_NS}"><si><t>Name</t></si>'
            f"<si><t>{'&e;' * refs}</t></si></sst>"
        )
    return with_parts(like, {name: body})


RELATIONSHIPS = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"


def sheet_target_xlsx(
    part: str, body: str, content_type: str, relationship: str, *, also_sheet: bool = False
) -> bytes:
    """`price_list_xlsx` with one more sheet, `part`, holding `body` and declared of
    `content_type`: the target of a workbook relationship of type `relationship`
    (`chartsheet`, `worksheet`...) that a `<sheet>` of the workbook names. With
    `also_sheet`, the workbook's first worksheet relationship targets `part` too."""
    like = price_list_xlsx()
    rels = _part(like, "xl/_rels/workbook.xml.rels").replace(
        "</Relationships>",
        f'<Relationship Id="rId90" Target="/{part}" Type="{RELATIONSHIPS}/{relationship}"/>'
        "</Relationships>",
    )
    if also_sheet:
        rels = rels.replace('Target="/xl/worksheets/sheet1.xml"', f'Target="/{part}"')
    workbook = _part(like, "xl/workbook.xml").replace(
        "</sheets>",
        f'<sheet xmlns:r="{RELATIONSHIPS}" name="Chart" sheetId="9" r:id="rId90"/></sheets>',
    )
    types = _part(like, "[Content_Types].xml").replace(
        "</Types>", f'<Override PartName="/{part}" ContentType="{content_type}"/></Types>'
    )
    return with_parts(
        like,
        {
            part: body,
            "xl/_rels/workbook.xml.rels": rels,
            "xl/workbook.xml": workbook,
            "[Content_Types].xml": types,
        },
    )


def far_row_xlsx(last_row: int) -> bytes:
    """A workbook whose first sheet holds two rows and then names only row `last_row`,
    empty: a few bytes that openpyxl reads as `last_row` rows."""
    sheet = (
        f'<worksheet xmlns="{SHEET_NS}"><sheetData>'
        '<row r="1"><c r="A1" t="inlineStr"><is><t>Name</t></is></c></row>'
        '<row r="2"><c r="A2" t="inlineStr"><is><t>x</t></is></c></row>'
        f'<row r="{last_row}"/></sheetData></worksheet>'
    )
    return with_parts(price_list_xlsx(), {"xl/worksheets/sheet1.xml": sheet})


def ole_file(streams: list[str]) -> bytes:
    """The header and directory names of an OLE2 compound file, as Office encrypts into."""
    header = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\0" * 504
    names = b"".join(name.encode("utf-16-le") + b"\0" * (128 - 2 * len(name)) for name in streams)
    return header + names
