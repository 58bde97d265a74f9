"""Loaders: each format becomes a title plus (heading, text) sections."""

from __future__ import annotations

import codecs
import io

import pytest
from pypdf import PdfReader, PdfWriter
from pypdf.generic import (
    ArrayObject,
    DecodedStreamObject,
    DictionaryObject,
    IndirectObject,
    NameObject,
    NumberObject,
)

from chatqna.errors import DocumentLoadError, PayloadTooLarge, UnsupportedFileType
from chatqna.ingest.loaders import (
    MAX_HEADING_CHARS,
    SUPPORTED_SUFFIXES,
    LoadLimits,
    clip_heading,
    load_document,
)


def minimal_pdf(text: str, title: str | None = None, pages: int = 1) -> bytes:
    """A PDF whose `pages` pages all draw one content stream, `text` in Helvetica, with a
    byte-exact xref table."""
    content = f"BT /F1 18 Tf 72 720 Td ({text}) Tj ET".encode("latin-1")
    kids = " ".join(f"{number} 0 R" for number in range(5, 5 + pages)).encode()
    page = (
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792]"
        b" /Resources << /Font << /F1 3 0 R >> >> /Contents 4 0 R >>"
    )
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, pages),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream",
        *[page] * pages,
    ]
    if title is not None:
        objects.append(b"<< /Title (" + title.encode("latin-1") + b") >>")
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref_at = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for offset in offsets:
        out += b"%010d 00000 n \n" % offset
    info = b" /Info %d 0 R" % len(objects) if title is not None else b""
    out += b"trailer\n<< /Size %d /Root 1 0 R%s >>\n" % (len(objects) + 1, info)
    out += b"startxref\n%d\n%%%%EOF\n" % xref_at
    return bytes(out)


# --- markdown ---------------------------------------------------------------------------

MARKDOWN = """\
# Billing Guide

How billing works.

## Payment methods

Cards are accepted.

### Bank transfer

Only on annual plans.

## Refunds ##

Refunds take 5 days.
"""


def test_markdown_title_and_level2_sections() -> None:
    doc = load_document("guides/billing.md", MARKDOWN.encode())
    assert doc.source == "guides/billing.md"
    assert doc.title == "Billing Guide"
    assert [heading for heading, _ in doc.sections] == [
        "Billing Guide",
        "Payment methods",
        "Refunds",
    ]
    assert doc.sections[0][1] == "How billing works."
    # A level-3 heading stays inside its level-2 section.
    assert doc.sections[1][1] == "Cards are accepted.\n\n### Bank transfer\n\nOnly on annual plans."
    assert doc.sections[2][1] == "Refunds take 5 days."


def test_markdown_ignores_headings_inside_code_fences() -> None:
    text = (
        "# Shell tips\n\n## Comments\n\n"
        "```bash\n# not a title\n## not a section\necho hi\n```\n\n"
        "~~~~\n## still code\n~~~\n~~~~\n\nAfter the fences.\n"
    )
    doc = load_document("tips.markdown", text.encode())
    assert doc.title == "Shell tips"
    assert [heading for heading, _ in doc.sections] == ["Comments"]
    body = doc.sections[0][1]
    assert "## not a section" in body
    assert "# not a title" in body
    assert "## still code" in body
    assert body.endswith("After the fences.")


def test_markdown_without_h1_uses_stem_and_skips_empty_preamble() -> None:
    doc = load_document("notes/setup-guide.MD", b"## Install\n\nRun it.\n\n## Use\n\nCall it.\n")
    assert doc.title == "setup-guide"
    assert doc.sections == [("Install", "Run it."), ("Use", "Call it.")]


def test_markdown_with_bom_and_crlf() -> None:
    doc = load_document("a.md", "\ufeff# Title\r\n\r\nBody text.\r\n".encode())
    assert doc.title == "Title"
    assert doc.sections == [("Title", "Body text.")]


# --- html ---------------------------------------------------------------------------

HTML = b"""<!doctype html>
<html><head><title>Plans &amp; Pricing</title>
<style>p { color: red }</style>
<script>var secret = "<h2>not a heading</h2>";</script></head>
<body>
<nav><a href="/">Home</a><h2>Menu</h2></nav>
<p>Choose a   plan &mdash; any plan.</p>
<div>Line one<br>Line two</div>
<h2>Free <em>tier</em></h2>
<p>Up to 3 &lt;seats&gt;.</p><ul><li>one</li><li>two</li></ul>
<h2>Business</h2>
<p>SSO&nbsp;included.</p>
<script>alert("x")</script>
</body></html>"""


def test_html_title_sections_and_dropped_elements() -> None:
    doc = load_document("site/plans.html", HTML)
    assert doc.title == "Plans & Pricing"
    assert doc.sections == [
        ("Plans & Pricing", "Choose a plan \u2014 any plan.\n\nLine one\nLine two"),
        ("Free tier", "Up to 3 <seats>.\n\none\n\ntwo"),
        ("Business", "SSO included."),
    ]
    everything = " ".join(text for _, text in doc.sections)
    for dropped in ("secret", "alert", "color", "Home", "Menu", "not a heading"):
        assert dropped not in everything


def test_html_title_falls_back_to_first_h1() -> None:
    doc = load_document("page.htm", b"<h1>Getting started</h1><p>Hello.</p><h2>Next</h2><p>Go.</p>")
    assert doc.title == "Getting started"
    assert doc.sections == [("Getting started", "Hello."), ("Next", "Go.")]


def test_html_h1_starts_a_section_and_head_may_be_unclosed() -> None:
    doc = load_document("p.html", b"<head><title>Site</title><body><h1>Page</h1><p>Text</p>")
    assert doc.title == "Site"
    assert doc.sections == [("Page", "Text")]


# --- plain text ---------------------------------------------------------------------------


def test_txt_is_one_section_with_paragraphs_preserved() -> None:
    doc = load_document(
        "faq/refund-policy.txt", b"First paragraph\nstill first.\n\n\nSecond.  \n\n"
    )
    assert doc.title == "refund-policy"
    assert doc.sections == [("refund-policy", "First paragraph\nstill first.\n\nSecond.")]


# --- pdf ---------------------------------------------------------------------------


def test_hand_built_pdf_is_valid_in_strict_mode() -> None:
    reader = PdfReader(io.BytesIO(minimal_pdf("Strict check")), strict=True)
    assert "Strict check" in reader.pages[0].extract_text()


def test_pdf_text_and_metadata_title() -> None:
    doc = load_document("manual.pdf", minimal_pdf("Refunds take five days.", title="User Manual"))
    assert doc.title == "User Manual"
    assert doc.sections == [("User Manual (page 1)", "Refunds take five days.")]


def test_pdf_title_falls_back_to_stem() -> None:
    doc = load_document("docs/Manual.PDF", minimal_pdf("Hello PDF"))
    assert doc.title == "Manual"
    assert doc.sections[0][1] == "Hello PDF"


def test_every_page_is_a_section() -> None:
    doc = load_document("three.pdf", minimal_pdf("Same page", title="Deck", pages=3))
    assert doc.sections == [(f"Deck (page {n})", "Same page") for n in (1, 2, 3)]


def test_a_pdf_is_refused_at_the_page_that_passes_the_text_limit() -> None:
    # 200 pages that all draw one 1,000-character stream: 200,000 characters from 6 KB.
    data = minimal_pdf("word " * 200, pages=200)
    with pytest.raises(PayloadTooLarge, match="CHATQNA_DATAPREP_MAX_TEXT_CHARS") as info:
        load_document("repeat.pdf", data, limits=LoadLimits(max_text_chars=10_000))
    assert 10_000 < info.value.details["chars"] < 10_000 + 1_000


def test_a_pdf_that_draws_no_text_is_refused_once_its_pages_pass_the_unpacked_limit() -> None:
    # Every page draws one 31-byte stream of empty text: reading a page's drawing costs
    # time whether or not it yields text, so the pages are counted, not only the text.
    data = minimal_pdf("", pages=200)
    with pytest.raises(PayloadTooLarge, match="CHATQNA_DATAPREP_MAX_UNPACKED_BYTES") as info:
        load_document("empty-pages.pdf", data, limits=LoadLimits(max_unpacked_bytes=1_000))
    assert 1_000 < info.value.details["bytes"] <= 1_000 + 31
    assert info.value.details["limit"] == 1_000


def test_a_pdf_page_is_counted_before_its_text_is_read() -> None:
    data = minimal_pdf("Refunds take five days.")
    with pytest.raises(PayloadTooLarge, match="page content"):
        load_document("one-page.pdf", data, limits=LoadLimits(max_unpacked_bytes=10))
    # The same file within the limit reads as usual.
    assert load_document("one-page.pdf", data).sections[0][1] == "Refunds take five days."


def form_pdf(draws: int, nested: int = 1) -> bytes:
    """One page whose text is drawn by a form XObject `draws` times; with `nested` > 1 the
    form draws itself `nested` levels deep through forms that each draw the next twice."""
    writer = PdfWriter()
    font = writer._add_object(
        DictionaryObject(
            {
                NameObject("/Type"): NameObject("/Font"),
                NameObject("/Subtype"): NameObject("/Type1"),
                NameObject("/BaseFont"): NameObject("/Helvetica"),
            }
        )
    )

    def form(content: bytes, resources: DictionaryObject) -> IndirectObject:
        stream = DecodedStreamObject()
        stream.set_data(content)
        stream.update(
            {
                NameObject("/Type"): NameObject("/XObject"),
                NameObject("/Subtype"): NameObject("/Form"),
                NameObject("/BBox"): ArrayObject([NumberObject(0)] * 4),
                NameObject("/Resources"): resources,
            }
        )
        return writer._add_object(stream)

    fonts = DictionaryObject({NameObject("/F1"): font})
    ref = form(
        b"BT /F1 12 Tf 10 10 Td (Refunds take five days.) Tj ET\n",
        DictionaryObject({NameObject("/Font"): fonts}),
    )
    for _ in range(nested - 1):
        inner = DictionaryObject({NameObject("/Fm0"): ref, NameObject("/Fm1"): ref})
        ref = form(b"/Fm0 Do\n/Fm1 Do\n", DictionaryObject({NameObject("/XObject"): inner}))
    page = writer.add_blank_page(612, 792)
    page[NameObject("/Resources")] = DictionaryObject(
        {NameObject("/XObject"): DictionaryObject({NameObject("/Fm0"): ref})}
    )
    content = DecodedStreamObject()
    content.set_data(b"/Fm0 Do\n" * draws)
    page[NameObject("/Contents")] = writer._add_object(content)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def test_a_form_drawn_once_is_read() -> None:
    doc = load_document("form.pdf", form_pdf(draws=1))
    assert "Refunds take five days." in doc.sections[0][1]


@pytest.mark.parametrize(("draws", "nested"), [(40, 1), (1, 6)])
def test_a_form_drawn_many_times_counts_each_time(draws: int, nested: int) -> None:
    # 40 draws of a 55-byte form, or 2**5 draws of it through forms nested 6 deep: about
    # 2 KB of drawing from a page of a few bytes.
    data = form_pdf(draws=draws, nested=nested)
    assert load_document("form.pdf", data).sections  # within the default limit
    with pytest.raises(PayloadTooLarge, match="CHATQNA_DATAPREP_MAX_UNPACKED_BYTES"):
        load_document("form.pdf", data, limits=LoadLimits(max_unpacked_bytes=1_500))


def test_encrypted_pdf_is_rejected() -> None:
    writer = PdfWriter()
    writer.add_blank_page(width=200, height=200)
    writer.encrypt("secret", algorithm="RC4-128")
    buffer = io.BytesIO()
    writer.write(buffer)
    with pytest.raises(DocumentLoadError, match="encrypted"):
        load_document("locked.pdf", buffer.getvalue())


def test_garbage_pdf_is_rejected() -> None:
    with pytest.raises(DocumentLoadError, match="not a readable PDF"):
        load_document("broken.pdf", b"%PDF-1.4\nthis is not really a pdf\n")


def test_pdf_without_text_is_rejected() -> None:
    writer = PdfWriter()
    writer.add_blank_page(width=200, height=200)
    buffer = io.BytesIO()
    writer.write(buffer)
    with pytest.raises(DocumentLoadError, match="contains no text"):
        load_document("blank.pdf", buffer.getvalue())


# --- errors ---------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["report.doc", "archive.tar.gz", "README"])
def test_unsupported_suffix(source: str) -> None:
    with pytest.raises(UnsupportedFileType) as info:
        load_document(source, b"whatever")
    message = str(info.value)
    assert source in message
    assert all(suffix in message for suffix in SUPPORTED_SUFFIXES)


def test_invalid_utf8_is_a_load_error_not_a_silent_fallback() -> None:
    with pytest.raises(DocumentLoadError, match="not valid UTF-8"):
        load_document("latin.txt", "caf\u00e9".encode("latin-1"))


@pytest.mark.parametrize("source", ["empty.txt", "empty.md", "empty.html", "empty.pdf"])
@pytest.mark.parametrize("data", [b"", b"  \n\t\n"])
def test_empty_file_contains_no_text(source: str, data: bytes) -> None:
    with pytest.raises(DocumentLoadError, match="contains no text"):
        load_document(source, data)


@pytest.mark.parametrize(
    ("source", "data"),
    [
        ("bom.txt", b"\xef\xbb\xbf \n"),
        ("headings.md", b"# Title only\n\n## Empty\n"),
        (
            "script.html",
            b"<html><head><title>T</title></head><script>x()</script></html>",
        ),
    ],
)
def test_no_extracted_text_is_rejected(source: str, data: bytes) -> None:
    with pytest.raises(DocumentLoadError, match="contains no text"):
        load_document(source, data)


# --- headings and titles -------------------------------------------------------------------


def test_a_heading_up_to_the_cap_is_kept_as_it_is() -> None:
    heading = "word " * (MAX_HEADING_CHARS // 5 - 1) + "last"
    assert len(heading) <= MAX_HEADING_CHARS
    assert clip_heading(heading) == heading
    assert clip_heading("x" * MAX_HEADING_CHARS) == "x" * MAX_HEADING_CHARS


def test_a_long_heading_is_cut_on_a_word_boundary() -> None:
    heading = "refunds and returns " * 100
    clipped = clip_heading(heading)
    assert len(clipped) <= MAX_HEADING_CHARS
    assert clipped.endswith("…")
    kept = clipped[:-1]
    assert heading.startswith(kept)
    assert heading[len(kept)] == " "  # the cut falls between words
    assert len(kept) > MAX_HEADING_CHARS - len("returns ") - 2


def test_a_long_heading_without_spaces_is_cut_at_the_cap() -> None:
    assert clip_heading("h" * 10_000) == "h" * (MAX_HEADING_CHARS - 1) + "…"
    assert clip_heading("word " + "h" * 10_000) == "word " + "h" * (MAX_HEADING_CHARS - 6) + "…"


def test_long_markdown_headings_are_cut_where_they_are_loaded() -> None:
    long = "Refund policy " * 100_000
    data = f"# {long}\n\n## {long}\n\nRefunds take five days.\n\n## Short\n\nOk.\n".encode()
    doc = load_document("notes.md", data)
    clipped = clip_heading(long.strip())
    assert doc.title == clipped
    assert doc.sections == [(clipped, "Refunds take five days."), ("Short", "Ok.")]


def test_a_long_html_title_and_heading_are_cut() -> None:
    long = "Plans " * 10_000
    page = f"<title>{long}</title><p>Intro.</p><h2>{long}</h2><p>Seats.</p>".encode()
    doc = load_document("plans.html", page)
    assert len(doc.title) <= MAX_HEADING_CHARS
    assert [len(heading) <= MAX_HEADING_CHARS for heading, _ in doc.sections] == [True, True]
    assert [text for _, text in doc.sections] == ["Intro.", "Seats."]


def test_a_long_pdf_title_is_cut_before_the_page_number() -> None:
    doc = load_document("m.pdf", minimal_pdf("Hello PDF", title="Manual " * 200, pages=2))
    assert len(doc.title) <= MAX_HEADING_CHARS
    headings = [heading for heading, _ in doc.sections]
    assert [h.endswith(f"… (page {n})") for n, h in enumerate(headings, 1)] == [True, True]
    assert all(len(h) <= MAX_HEADING_CHARS for h in headings)


def test_a_text_links_name_is_cut_as_its_title() -> None:
    doc = load_document("https://example.test/" + "a" * 1_000_000, b"Body.", kind="text")
    assert doc.title == "a" * (MAX_HEADING_CHARS - 1) + "…"
    assert doc.sections == [(doc.title, "Body.")]


def test_headings_count_against_the_text_limit() -> None:
    data = b"# T\n\n## " + b"h" * 200 + b"\n\n" + b"b" * 90 + b"\n"
    assert len(load_document("a.md", data, limits=LoadLimits(max_text_chars=400)).sections) == 1
    with pytest.raises(PayloadTooLarge, match="headings included") as raised:
        load_document("a.md", data, limits=LoadLimits(max_text_chars=250))
    assert raised.value.details == {"source": "a.md", "chars": 1 + 200 + 90}


# --- a fetched page's charset ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["text", "markdown", "csv", "json"])
def test_the_text_formats_are_decoded_with_the_charset_a_link_declares(kind: str) -> None:
    text = {
        "text": "Größe: 5 €",
        "markdown": "# Größe\n\nFünf €",
        "csv": "Größe,Preis\nM,5 €",
        "json": '{"Größe": "5 €"}',
    }[kind]
    doc = load_document(
        "https://docs.test/page", text.encode("utf-16-le"), kind=kind, charset="utf-16"
    )
    every = doc.title + " ".join(f"{heading} {body}" for heading, body in doc.sections)
    assert "Größe" in every and "€" in every
    latin = load_document(
        "https://docs.test/l",
        "Größe".encode("latin-1"),
        kind=kind if kind != "json" else "text",
        charset="ISO-8859-1",
    )
    assert "Größe" in latin.sections[0][1]


def test_a_charset_no_text_codec_names_leaves_the_text_formats_to_utf8() -> None:
    doc = load_document("https://docs.test/p", "Größe".encode(), kind="text", charset="base64")
    assert doc.sections[0][1] == "Größe"
    with pytest.raises(DocumentLoadError, match="not valid UTF-8"):
        load_document(
            "https://docs.test/p", "Größe".encode("utf-16-le"), kind="text", charset="x-bogus"
        )


def test_an_upload_without_a_charset_is_still_strict_utf8() -> None:
    with pytest.raises(DocumentLoadError, match="not valid UTF-8") as caught:
        load_document("notes.txt", "Größe".encode("latin-1"))
    assert (caught.value.status_code, caught.value.reason) == (422, "encoding")


@pytest.mark.parametrize("kind", ["text", "markdown", "csv", "json"])
@pytest.mark.parametrize(
    "data",
    [
        '{"a": "caf\u00e9 cr\u00e8me"}'.encode("latin-1"),
        bytes(range(128, 256)) * 4,
    ],
    ids=["latin-1", "random"],
)
def test_bytes_the_declared_charset_cannot_decode_are_a_load_error(kind: str, data: bytes) -> None:
    with pytest.raises(DocumentLoadError, match="charset 'utf-8'") as caught:
        load_document("https://docs.test/n", data, kind=kind, charset="utf-8")
    assert (caught.value.status_code, caught.value.reason) == (422, "encoding")


@pytest.mark.parametrize(
    "data",
    [
        b"\xef\xbb\xbf" + "caf\u00e9".encode("latin-1"),
        b"\xff\xfe" + b"odd length utf-8 text",
        b"\xff\xfe" + "\ud800".encode("utf-16-le", "surrogatepass") + b"a\x00",
    ],
    ids=["utf-8", "utf-16-odd", "utf-16-lone-surrogate"],
)
def test_bytes_their_byte_order_mark_cannot_decode_are_a_load_error(data: bytes) -> None:
    with pytest.raises(DocumentLoadError, match="byte-order mark") as caught:
        load_document("https://docs.test/b", data, kind="text", charset="utf-8")
    assert caught.value.reason == "encoding"


@pytest.mark.parametrize("label", ["utf-7", "unicode_escape", "raw_unicode_escape", "hex"])
def test_a_label_the_encoding_standard_does_not_list_is_no_label(label: str) -> None:
    text = "a+b=c, +AGE-, C:\\new\\x41 Gr\u00f6\u00dfe"
    doc = load_document("https://docs.test/u", text.encode(), kind="text", charset=label)
    assert doc.sections[0][1] == text
    with pytest.raises(DocumentLoadError, match="not valid UTF-8") as caught:
        load_document("https://docs.test/u", text.encode("latin-1"), kind="text", charset=label)
    assert caught.value.reason == "encoding"


def test_a_charset_the_encoding_standard_reads_as_no_text_is_a_load_error() -> None:
    with pytest.raises(DocumentLoadError, match="replacement") as caught:
        load_document("https://docs.test/k", b"\x1b$)C text", kind="text", charset="hz-gb-2312")
    assert caught.value.reason == "encoding"


def test_a_text_link_declared_as_utf16_with_a_byte_order_mark_decodes() -> None:
    data = codecs.BOM_UTF16_BE + "Gr\u00fc\u00dfe \u20ac".encode("utf-16-be")
    doc = load_document("https://docs.test/w", data, kind="text", charset="utf-16")
    assert doc.sections[0][1] == "Gr\u00fc\u00dfe \u20ac"
