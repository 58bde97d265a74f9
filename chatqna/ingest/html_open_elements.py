"""The elements an HTML5 tree builder holds open, kept as `html_depth` reads a page's tags.

The rules are the HTML standard's (13.2.6, tree construction), kept only where the builder
certainly closes an element: at its end tag when nothing that stops the builder's search
lies above it, an unclosed `<p>` at the next block, `<li>`, `<dd>`, `<dt>`, `<option>`, a
table cell or row at the next one. Anything else (misnested tags, adoption of formatting
elements, a `<table>` that closes another, tags that leave SVG or MathML) leaves them
open, so `OpenElements` never holds fewer elements than the builder, and may hold a few
more on a page that is badly broken. Formatting elements (`<b>`, `<font>`...) left open
count twice: the builder opens them again later, up to three alike.
"""

from __future__ import annotations

__all__ = [
    "FORMATTING",
    "HTML",
    "MATH",
    "NOT_INLINE",
    "PAIRED",
    "RAW_TEXT",
    "SELF_REPLACING",
    "SVG",
    "OpenElements",
    "close_implied",
    "end_tag",
    "imply_table_parts",
    "start_tag",
]

RAW_TEXT = frozenset(
    {"script", "style", "xmp", "iframe", "noembed", "noframes", "textarea", "title"}
)
_VOID = frozenset(
    {
        "area", "base", "basefont", "bgsound", "br", "col", "embed", "frame", "hr", "image",
        "img", "input", "keygen", "link", "meta", "param", "source", "track", "wbr",
        # Opened once and never again: a second one is merged into the first or ignored.
        "html", "head", "body", "frameset",
    }
)  # fmt: skip
# The namespace an open element is in, as far as the tags it takes go.
HTML, SVG, MATH, _INTEGRATION_POINT = 0, 1, 2, 3
_FOREIGN_ROOTS = frozenset({"svg", "math"})
# Where markup inside SVG or MathML is read as HTML again.
_INTEGRATION = {
    SVG: frozenset({"foreignobject", "desc", "title"}),
    MATH: frozenset({"mi", "mo", "mn", "ms", "mtext"}),
}
FORMATTING = frozenset(
    {
        "a",
        "b",
        "big",
        "code",
        "em",
        "font",
        "i",
        "nobr",
        "s",
        "small",
        "strike",
        "strong",
        "tt",
        "u",
    }
)
_SPECIAL = frozenset(
    {
        "address", "applet", "area", "article", "aside", "base", "basefont", "bgsound",
        "blockquote", "body", "br", "button", "caption", "center", "col", "colgroup", "dd",
        "details", "dialog", "dir", "div", "dl", "dt", "embed", "fieldset", "figcaption",
        "figure", "footer", "form", "frame", "frameset", "h1", "h2", "h3", "h4", "h5", "h6",
        "head", "header", "hgroup", "hr", "html", "iframe", "img", "input", "keygen", "li",
        "link", "listing", "main", "marquee", "menu", "meta", "nav", "noembed", "noframes",
        "noscript", "object", "ol", "p", "param", "plaintext", "pre", "script", "search",
        "section", "select", "source", "style", "summary", "table", "tbody", "td", "template",
        "textarea", "tfoot", "th", "thead", "title", "tr", "track", "ul", "wbr", "xmp",
        "annotation-xml", "foreignobject", "mi", "mo", "mn", "ms", "mtext", "desc",
    }
)  # fmt: skip
_SCOPE = frozenset(
    {"applet", "caption", "html", "table", "td", "th", "marquee", "object", "template"}
    | {"mi", "mo", "mn", "ms", "mtext", "annotation-xml", "foreignobject", "desc", "title"}
)
_HEADINGS = frozenset({"h1", "h2", "h3", "h4", "h5", "h6"})
_CLOSES_P = frozenset(
    {
        "address", "article", "aside", "blockquote", "center", "details", "dialog", "dir",
        "div", "dl", "fieldset", "figcaption", "figure", "footer", "header", "hgroup", "main",
        "menu", "nav", "ol", "p", "search", "section", "summary", "ul", "pre", "listing",
        "form", "plaintext", "xmp", "dd", "dt", "li",
    }
    | _HEADINGS
)  # fmt: skip
_MARKERS = frozenset({"applet", "caption", "marquee", "object", "td", "th", "template"})
_TABLE_PARTS = frozenset({"table", "tbody", "thead", "tfoot", "tr", "td", "th", "caption"})
_CLOSED_IN_SCOPE = (_CLOSES_P - _HEADINGS - {"p", "li", "dd", "dt", "form", "plaintext", "xmp"}) | {
    "applet",
    "button",
    "marquee",
    "object",
    "dd",
    "dt",
}
# The kinds of element whose topmost open one stops the builder's searches: an element
# of the kind may be of either namespace, which only ever stops a search sooner.
_KINDS: dict[str, frozenset[str]] = {
    "special": _SPECIAL,
    "special_list": _SPECIAL - {"address", "div", "p"},
    "scope": _SCOPE,
    "button_scope": _SCOPE | {"button"},
    "list_scope": _SCOPE | {"ol", "ul"},
    "table_scope": frozenset({"html", "table", "template"}),
}
_KIND_OF: dict[str, tuple[str, ...]] = {}
for _kind, _names in _KINDS.items():
    for _name in _names:
        _KIND_OF[_name] = (*_KIND_OF.get(_name, ()), _kind)
# Start tags that close or imply something before they open their element.
_IMPLYING = _CLOSES_P | {"li", "dd", "dt", "td", "th", "tr", "option"}
# Tags for which the builder does no more than open (or at their end tag, close) an
# element: every name not listed above, a custom element's too.
_NOT_PLAIN = (
    _SPECIAL
    | FORMATTING
    | _IMPLYING
    | _VOID
    | RAW_TEXT
    | _FOREIGN_ROOTS
    | _MARKERS
    | _TABLE_PARTS
    | _HEADINGS
    | set(_KIND_OF)
    | {"plaintext", "mglyph", "malignmark"}
)
NOT_INLINE = _NOT_PLAIN - FORMATTING
SELF_REPLACING = frozenset({"p", "li", "option", "dd", "dt"})
# Start tags whose element the end tag of its name, right after it, certainly closes.
PAIRED = (_CLOSES_P - _HEADINGS - {"plaintext", "xmp", "form"}) | {"td", "th", "tr", "option"}


class OpenElements:
    """The elements a page's tree builder holds open, as far as the pass can tell, with
    the positions of the topmost of each name and kind at hand, so that every question
    the builder asks of its stack is answered without walking it."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.spaces: list[int] = []
        self.at: dict[str, list[int]] = {}
        self.kinds: dict[str, list[int]] = {kind: [-1] for kind in (*_KINDS, "html")}
        # Formatting elements opened and not closed by their end tag, per table cell (or
        # other marker), by tag and attributes: the builder keeps them in a list, up to
        # three alike, and opens them again after the element they were in is closed.
        self.formatting: list[dict[str, int]] = [{}]
        self.formatting_at: dict[int, str] = {}
        self.reopened = 0

    @property
    def depth(self) -> int:
        return len(self.names) + self.reopened

    def space(self) -> int:
        return self.spaces[-1] if self.spaces else HTML

    def push(self, name: str, space: int) -> None:
        position = len(self.names)
        self.names.append(name)
        self.spaces.append(space)
        self.at.setdefault(name, []).append(position)
        if space == HTML:
            self.kinds["html"].append(position)
        if name in _KIND_OF:
            for kind in _KIND_OF[name]:
                self.kinds[kind].append(position)
            if space == HTML and name in _MARKERS:
                self.formatting.append({})

    def open_formatting(self, tag: str) -> None:
        """Note the formatting element just pushed, `tag` being its name and attributes."""
        counts = self.formatting[-1]
        self.formatting_at[len(self.names) - 1] = tag
        if counts.get(tag, 0) < 3:
            counts[tag] = counts.get(tag, 0) + 1
            self.reopened += 1

    def close_formatting(self, position: int) -> None:
        """Close the element at `position` by its end tag, dropping it from the list."""
        tag = self.formatting_at.get(position)
        self.close(position)
        counts = self.formatting[-1]
        if tag is not None and counts.get(tag):
            counts[tag] -= 1
            self.reopened -= 1

    def pop(self) -> None:
        if self.formatting_at:
            self.formatting_at.pop(len(self.names) - 1, None)
        name, space = self.names.pop(), self.spaces.pop()
        self.at[name].pop()
        if space == HTML:
            self.kinds["html"].pop()
        if name in _KIND_OF:
            for kind in _KIND_OF[name]:
                self.kinds[kind].pop()
            if space == HTML and name in _MARKERS:
                self.reopened -= sum(self.formatting.pop().values())

    def close(self, position: int) -> None:
        """Pop the element at `position` and all above it (none when it is -1)."""
        if position >= 0:
            for _ in range(len(self.names) - position):
                self.pop()

    def topmost(self, name: str) -> int:
        positions = self.at.get(name)
        return positions[-1] if positions else -1

    def in_scope(self, name: str, kind: str) -> int:
        """The topmost `name`'s position when no element of `kind` lies above it, else -1."""
        position = self.topmost(name)
        return position if position >= self.kinds[kind][-1] else -1


def _start_foreign(open_: OpenElements, name: str, self_closing: bool) -> None:
    # Inside SVG or MathML every start tag opens an element there (`/>` closes it again);
    # the few tags that leave it are counted as opening one too.
    if self_closing:
        return
    space = open_.space()
    if name in _FOREIGN_ROOTS:
        space = SVG if name == "svg" else MATH
    elif space == _INTEGRATION_POINT:
        space = MATH
    if name in _INTEGRATION.get(space, ()):
        space = _INTEGRATION_POINT
    open_.push(name, space)


def close_implied(open_: OpenElements, name: str) -> None:
    """Close what a start tag `name` closes: an open `<li>`, `<dd>`/`<dt>`, `<p>`,
    heading, table cell or row, `<option>`."""
    if name == "li":
        open_.close(open_.in_scope("li", "special_list"))
    elif name in ("dd", "dt"):
        open_.close(max(open_.in_scope("dd", "special_list"), open_.in_scope("dt", "special_list")))
    if name in _CLOSES_P:
        open_.close(open_.in_scope("p", "button_scope"))
    current = open_.names[-1] if open_.names else ""
    if (name in _HEADINGS and current in _HEADINGS) or (name == "option" == current):
        open_.pop()
    elif name in ("td", "th", "tr"):
        cell = max(open_.in_scope("td", "table_scope"), open_.in_scope("th", "table_scope"))
        open_.close(open_.in_scope("tr", "table_scope") if name == "tr" else cell)


def imply_table_parts(open_: OpenElements, name: str) -> None:
    # A row or cell straight in a table opens the body (and the row) it belongs in.
    sections = max(open_.topmost(section) for section in ("tbody", "thead", "tfoot"))
    if open_.topmost("table") > sections:
        open_.push("tbody", HTML)
    if name in ("td", "th") and open_.topmost("table") >= open_.topmost("tr"):
        open_.push("tr", HTML)


def start_tag(open_: OpenElements, name: str, attributes: str, self_closing: bool) -> bool:
    """Count a start tag; True when it opens an HTML element whose content is raw text."""
    space = open_.space()
    foreign = space in (SVG, MATH) or (
        space == _INTEGRATION_POINT and name in ("mglyph", "malignmark")
    )
    if foreign or name in _FOREIGN_ROOTS:
        _start_foreign(open_, name, self_closing)
        return False
    if name in _IMPLYING:
        close_implied(open_, name)
    if name in _VOID or name in RAW_TEXT or name == "plaintext":
        return name in RAW_TEXT or name == "plaintext"
    if name in ("tr", "td", "th"):
        imply_table_parts(open_, name)
    open_.push(name, HTML)
    if name in FORMATTING:
        open_.open_formatting(name + attributes)
    return False


def _end_html(open_: OpenElements, name: str) -> None:
    if name == "p":
        open_.close(open_.in_scope("p", "button_scope"))
    elif name == "li":
        open_.close(open_.in_scope("li", "list_scope"))
    elif name in _HEADINGS:
        open_.close(max(open_.in_scope(heading, "scope") for heading in _HEADINGS))
    elif name in _CLOSED_IN_SCOPE:
        open_.close(open_.in_scope(name, "scope"))
    elif name in _TABLE_PARTS:
        open_.close(open_.in_scope(name, "table_scope"))
    elif name == "template":
        open_.close(open_.topmost("template"))
    elif name == "select":
        # Closed when only options lie above it (a few at most: `<option>` closes one).
        position = open_.topmost("select")
        above = open_.names[position + 1 :]
        if position >= 0 and len(above) <= 2 and set(above) <= {"option", "optgroup"}:
            open_.close(position)
    elif name not in _SPECIAL:
        # Any other end tag closes the topmost element of its name, unless a special
        # element lies above it; a formatting element above which a special one lies is
        # moved, not closed (the adoption agency algorithm), so it stays counted.
        position = open_.topmost(name)
        if position > open_.kinds["special"][-1]:
            open_.close_formatting(position)


def end_tag(open_: OpenElements, name: str) -> None:
    if open_.space() == HTML:
        _end_html(open_, name)
        return
    # Inside SVG or MathML an end tag closes the topmost element of its name there;
    # one that names an element outside it is left to the HTML rules, and not counted.
    position = open_.topmost(name)
    if position > open_.kinds["html"][-1]:
        open_.close(position)
