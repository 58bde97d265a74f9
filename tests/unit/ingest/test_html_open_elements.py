"""The open elements as the HTML standard's tree builder keeps them, rule by rule."""

from __future__ import annotations

from chatqna.ingest.html_open_elements import OpenElements, end_tag, start_tag


def _opened(*tags: str) -> OpenElements:
    """The open elements after `tags`: `x` opens, `/x` closes, `x/` is self-closed."""
    open_ = OpenElements()
    for tag in tags:
        if tag.startswith("/"):
            end_tag(open_, tag[1:])
        else:
            start_tag(open_, tag.rstrip("/"), "", tag.endswith("/"))
    return open_


def test_a_block_closes_an_open_paragraph_and_what_is_open_in_it() -> None:
    assert _opened("div", "p", "span", "section").names == ["div", "section"]


def test_a_paragraph_behind_a_button_stays_open() -> None:
    assert _opened("p", "button", "div").names == ["p", "button", "div"]


def test_an_end_tag_does_not_reach_past_a_special_element() -> None:
    assert _opened("span", "div", "/span").names == ["span", "div"]
    assert _opened("div", "span", "/div").names == []


def test_cells_and_rows_close_the_open_ones_and_imply_the_table_body() -> None:
    assert _opened("table", "td", "td", "tr", "th").names == ["table", "tbody", "tr", "th"]


def test_self_closing_counts_in_svg_only() -> None:
    assert _opened("svg", "path/", "path/").names == ["svg"]
    assert _opened("div/", "div/").names == ["div", "div"]


def test_an_svg_cell_does_not_close_the_table_cell() -> None:
    assert _opened("table", "td", "svg", "td").names[-2:] == ["svg", "td"]


def test_formatting_elements_count_until_their_end_tag_three_alike_at_most() -> None:
    closed_out = _opened("p", "b", "/p")
    assert (closed_out.names, closed_out.depth) == ([], 1)  # opened again later
    assert _opened("b", "/b").depth == 0
    assert _opened(*["p", "b", "/p"] * 4).depth == 3
    # A table cell starts a list of its own, dropped with the cell.
    in_cell = _opened("table", "td", "b", "/td")
    assert (in_cell.names, in_cell.depth) == (["table", "tbody", "tr"], 3)
