"""The depth bound on HTML: refuses what Lexbor would nest too deep, reads ordinary pages."""

from __future__ import annotations

import pytest
from selectolax.lexbor import LexborHTMLParser

from chatqna.errors import DocumentLoadError
from chatqna.ingest.html_depth import MAX_DEPTH, check_depth

N = MAX_DEPTH + 20


def _lexbor_depth(page: str) -> int:
    """The depth of the tree Lexbor builds (html and body included)."""
    deepest, stack = 0, [(LexborHTMLParser(page).root, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in node.iter())
    return deepest


# Each opens elements that Lexbor keeps open (and searches on every further tag), in
# ways that a count blind to the HTML standard's rules would take as closed or as text.
HOSTILE = {
    "blocks never closed": "<div>" * N,
    "inline never closed": "<span>" * N,
    "end tag stopped by a block": "<span><div></span>" * N,
    "slash ignored in HTML": "<div/>" * N,
    "cells in SVG are SVG": "<table><tr><td><svg>" + "<td>" * N,
    "style in SVG is not raw text": "<svg><style>" + "<g>" * N,
    "comment opener in an attribute": '<div title="<!--">' + "<div>" * N + "-->",
    "comment ending in a later tag": '<!-- <a title="-->' + "<div>" * N + '">',
    "script ending in a later tag": '<script> <a title="</script>' + "<div>" * N + '">',
    "quote in an attribute name": '<div a"b>' + "<div>" * N + '"',
    "title in MathML is not raw text": "<math><title>" + "<td>" * N,
    "formatting elements opened again": "".join(f"<p><b x{i}>x</p>" for i in range(N)),
    "blocks between closed inline elements": "<div><span>x</span><b>y</b>" * N,
    "raw text closed at once, then blocks": "<title>t</title><script></script>" + "<div>" * N,
    "nested tables": "<table><tr><td>x" * (N // 4),
    "nested lists": "<ul><li>" * (N // 2),
}


@pytest.mark.parametrize("page", HOSTILE.values(), ids=HOSTILE.keys())
def test_what_lexbor_nests_past_the_bound_is_refused(page: str) -> None:
    assert _lexbor_depth(page) > MAX_DEPTH + 2
    with pytest.raises(DocumentLoadError) as caught:
        check_depth("deep.html", page)
    assert caught.value.reason == "nesting"
    assert "more than 512 levels" in caught.value.message


ORDINARY = {
    "unclosed paragraphs": "<body>" + "<p>Para" * 5000,
    "unclosed items": "<ul>" + "<li>Item" * 5000 + "</ul>",
    "unclosed cells and rows": "<table>" + "<tr><td>a<td>b<th>c" * 3000 + "</table>",
    "unclosed options": "<select>" + "<option>o" * 3000 + "</select>" * 2,
    "unclosed definitions": "<dl>" + "<dt>t<dd>d" * 3000 + "</dl>",
    "void elements": "<p>" + "<br><img src=x><input><hr><wbr>" * 3000,
    "markup in comments and raw text": "<!--" + "<div>" * 3000 + "-->"
    + "<script>var s = '" + "<div>" * 3000 + "';</script>"
    + "<textarea>" + "<div>" * 3000 + "</textarea><title>" + "<div>" * 3000 + "</title>",
    "self-closed SVG": "<svg>" + '<path d="M0 0"/>' * 3000 + "</svg>",
    "closed nesting": ("<div><section><span><b><i>x</i></b></span></section></div>") * 3000,
    "unclosed bold in many paragraphs": "<p><b>Note:</p>" * 3000,
    "unclosed inline elements in paragraphs": "<p><span>x" * 3000,
    "unclosed paragraphs before headings": "<h2>T</h2><p>a<p>b" * 3000,
}  # fmt: skip


@pytest.mark.parametrize("page", ORDINARY.values(), ids=ORDINARY.keys())
def test_ordinary_pages_pass(page: str) -> None:
    assert _lexbor_depth(page) < 20
    check_depth("page.html", page)
