"""HTML: main content only, <pre> verbatim, charsets as a browser reads them, h1-h6 sections."""

from __future__ import annotations

import pytest

from chatqna.errors import DocumentLoadError, PayloadTooLarge
from chatqna.ingest.html_text import decode_html
from chatqna.ingest.loaders import LoadLimits, load_document

PAGE = b"""<!doctype html>
<html><head><title>Install guide</title><style>.x { color: red }</style></head>
<body>
<header><a href="/">Larkspur</a> site banner</header>
<nav><ul><li><a href="/docs">Docs menu</a></li></ul></nav>
<main>
  <h1>Install guide</h1>
  <p>Install   the CLI first.</p>
  <h3>On Linux</h3>
  <pre><code>curl -sSL https://example.invalid/install.sh | sh
  larkspur login
    --token XYZ</code></pre>
  <noscript>Enable JavaScript to see this page.</noscript>
  <template><p>Template text</p></template>
  <svg><text>Chart label</text></svg>
  <p hidden>Hidden paragraph</p>
  <div aria-hidden="true">Decorative text</div>
  <div style="display: none">Collapsed text</div>
  <span style="VISIBILITY:hidden">Invisible text</span>
  <h4>Proxy settings</h4>
  <p>Set <em>HTTPS_PROXY</em><br>before login.</p>
  <table><tr><th>Flag</th><th>Meaning</th></tr><tr><td>--quiet</td><td>no output</td></tr></table>
</main>
<aside>Related: other guides</aside>
<footer>Copyright footer text</footer>
<script>document.write("Script text")</script>
</body></html>"""


def test_main_content_sections_and_pre_verbatim() -> None:
    doc = load_document("install.html", PAGE)
    assert doc.title == "Install guide"
    assert doc.sections == [
        ("Install guide", "Install the CLI first."),
        (
            "On Linux",
            "curl -sSL https://example.invalid/install.sh | sh\n  larkspur login\n    --token XYZ",
        ),
        ("Proxy settings", "Set HTTPS_PROXY\nbefore login.\n\nFlag: --quiet; Meaning: no output"),
    ]


@pytest.mark.parametrize(
    "dropped",
    [
        "site banner", "Docs menu", "Enable JavaScript", "Template text", "Chart label",
        "Hidden paragraph", "Decorative text", "Collapsed text", "Invisible text",
        "Copyright footer", "Script text", "color: red", "other guides",
    ],
)  # fmt: skip
def test_what_a_reader_does_not_see_is_dropped(dropped: str) -> None:
    text = " ".join(text for _, text in load_document("install.html", PAGE).sections)
    assert dropped not in text


def test_without_main_the_body_is_read_and_headings_of_every_level_start_sections() -> None:
    page = b"<body><p>Intro.</p><h2>Two</h2><p>b</p><h5>Five</h5><p>e</p><h6>Six</h6><p>f</p>"
    doc = load_document("levels.htm", page)
    assert doc.title == "levels"
    assert doc.sections == [("levels", "Intro."), ("Two", "b"), ("Five", "e"), ("Six", "f")]


def test_single_article_is_the_main_content() -> None:
    page = b"<body><div>Sidebar teaser</div><article><h2>News</h2><p>Body.</p></article></body>"
    assert load_document("news.html", page).sections == [("News", "Body.")]


def test_charset_from_meta_tag() -> None:
    page = '<html><head><meta charset="windows-1252"><title>Caf\u00e9</title></head>'
    page += "<body><p>Cr\u00e8me br\u00fbl\u00e9e \u2013 \u20ac4</p></body></html>"
    doc = load_document("menu.html", page.encode("cp1252"))
    assert doc.title == "Caf\u00e9"
    assert doc.sections == [("Caf\u00e9", "Cr\u00e8me br\u00fbl\u00e9e \u2013 \u20ac4")]


def test_charset_from_http_equiv_meta_and_latin1_label_reads_as_windows_1252() -> None:
    head = '<meta http-equiv="Content-Type" content="text/html; charset=ISO-8859-1">'
    page = (head + "<p>\u201cquoted\u201d</p>").encode("cp1252")
    assert decode_html("q.html", page).endswith("<p>\u201cquoted\u201d</p>")


def test_header_charset_beats_meta_and_bom_beats_both() -> None:
    page = '<meta charset="utf-8"><p>\u00c5re</p>'.encode("iso-8859-15")
    assert decode_html("s.html", page, header_charset="iso-8859-15").endswith("\u00c5re</p>")
    bom = b"\xef\xbb\xbf" + '<meta charset="windows-1252"><p>\u00c5re</p>'.encode()
    assert decode_html("b.html", bom, header_charset="iso-8859-15").endswith("\u00c5re</p>")
    utf16 = "\ufeff<p>\u00c5re</p>".encode("utf-16-le")
    assert decode_html("u.html", utf16) == "<p>\u00c5re</p>"


@pytest.mark.parametrize(
    ("label", "codec"),
    [("utf-16le", "utf-16-le"), ("UTF-16BE", "utf-16-be"), ("utf-16", "utf-16-le")],
)
def test_utf16_named_by_the_header_is_utf16_and_named_by_a_meta_is_utf8(
    label: str, codec: str
) -> None:
    served = "<html><body><p>Grüße aus Köln</p></body></html>".encode(codec)
    assert decode_html("p.html", served, header_charset=label).endswith("Köln</p></body></html>")
    # A <meta> the ASCII prescan could read is not UTF-16: the standard reads it as UTF-8.
    declared = f'<meta charset="{label}"><p>Grüße</p>'.encode()
    assert decode_html("m.html", declared).endswith("<p>Grüße</p>")


def test_undeclared_non_utf8_page_is_a_load_error() -> None:
    with pytest.raises(DocumentLoadError, match="declares no charset"):
        load_document("latin.html", "<p>caf\u00e9</p>".encode("latin-1"))


# Labels the WHATWG Encoding Standard does not list, though Python has a codec by the name:
# bytes-to-bytes codecs, codecs that raise on ordinary bytes or read escapes, UTF-7, UTF-32.
# A browser ignores such a label.
NOT_PAGE_ENCODINGS = [
    "hex", "rot13", "zlib", "base64", "bz2", "uu", "quopri", "idna", "undefined",
    "punycode", "utf-32", "utf-7", "unicode_escape", "raw_unicode_escape", "no-such-charset",
]  # fmt: skip


@pytest.mark.parametrize("label", NOT_PAGE_ENCODINGS)
def test_a_label_that_names_no_page_encoding_falls_back_to_utf8(label: str) -> None:
    page = f'<meta charset="{label}"><p>Cr\u00e8me +AGE- \\x41</p>'.encode()
    expected = [("menu", "Cr\u00e8me +AGE- \\x41")]
    assert load_document("menu.html", page).sections == expected
    fetched = "<p>Cr\u00e8me +AGE- \\x41</p>".encode()
    assert load_document("menu.html", fetched, charset=label).sections == expected


@pytest.mark.parametrize("label", ["hex", "idna", "utf-7"])
def test_a_non_utf8_page_with_such_a_label_is_a_load_error(label: str) -> None:
    page = f'<meta charset="{label}"><p>caf\u00e9</p>'.encode("latin-1")
    with pytest.raises(DocumentLoadError) as caught:
        load_document("latin.html", page)
    assert caught.value.reason == "encoding"


def test_bytes_a_declared_charset_does_not_map_are_read_as_replacement_characters() -> None:
    page = "<p>caf\u00e9</p>".encode("latin-1")
    assert decode_html("h.html", page, header_charset="utf-8") == "<p>caf\ufffd</p>"
    meta = b'<meta charset="utf-8"><p>caf\xe9</p>'
    assert decode_html("m.html", meta).endswith("<p>caf\ufffd</p>")
    bom = b"\xef\xbb\xbf<p>caf\xe9</p>"
    assert decode_html("b.html", bom) == "<p>caf\ufffd</p>"


@pytest.mark.parametrize("header", [True, False])
def test_a_charset_the_standard_maps_to_replacement_is_a_load_error(header: bool) -> None:
    body = b"<p>\x1b$)C text</p>"
    page = body if header else b'<meta charset="iso-2022-kr">' + body
    with pytest.raises(DocumentLoadError, match="replacement") as caught:
        load_document("kr.html", page, charset="ISO-2022-KR" if header else None)
    assert (caught.value.status_code, caught.value.reason) == (422, "encoding")


def test_labels_are_read_as_the_encoding_standard_reads_them() -> None:
    # latin-1 is windows-1252 (0x80 is the euro sign); x-user-defined in a <meta> too.
    assert decode_html("l.html", b"<p>\x80</p>", header_charset=" Latin1 ") == "<p>\u20ac</p>"
    page = b'<meta charset="x-user-defined"><p>\x80</p>'
    assert decode_html("x.html", page).endswith("<p>\u20ac</p>")


def test_deeply_nested_page_does_not_exhaust_the_stack() -> None:
    page = b"<div>" * 5000 + b"deep text" + b"</div>" * 5000
    assert load_document("deep.html", page).sections == [("deep", "deep text")]


def test_a_select_s_options_are_read_as_written() -> None:
    # Parsed without mutation events (whose `<select>` updates are quadratic in its
    # options), `<selectedcontent>` is not filled with a copy of the selected option.
    page = (
        b"<p>Pick</p><select><selectedcontent></selectedcontent><option>Only once</option></select>"
    )
    assert load_document("form.html", page).sections == [("form", "Pick\n\nOnly once")]


def test_a_nested_table_is_read_once_as_part_of_its_cell() -> None:
    page = (
        b"<table><thead><tr><th>Plan</th><th>Limits</th></tr></thead>"
        b"<tr><td>Pro</td><td><table><tr><td>Seats</td><td>50</td></tr></table></td></tr>"
        b"<tfoot><tr><td>Team</td><td>10</td></tr></tfoot></table>"
    )
    assert load_document("plans.html", page).sections == [
        ("plans", "Plan: Pro; Limits: Seats 50\n\nPlan: Team; Limits: 10")
    ]


def test_deeply_nested_tables_yield_their_text_once() -> None:
    # Each level used to repeat every row and cell below it: cubic in the depth.
    depth = 300
    page = ("<table><tr><td>x" * depth + "</td></tr></table>" * depth).encode()
    assert load_document("nested.html", page).sections == [("nested", " ".join(["x"] * depth))]


def test_html_table_cells_count_against_the_cell_limit() -> None:
    row = "<tr>" + "<td>v</td>" * 10 + "</tr>"
    page = f"<table>{row * 3}</table>".encode()
    assert load_document("ok.html", page, limits=LoadLimits(max_cells=30)).sections
    with pytest.raises(PayloadTooLarge, match="more than 29 cells"):
        load_document("wide.html", page, limits=LoadLimits(max_cells=29))
