"""A bound on how deep an HTML page nests its elements, checked before Lexbor parses it.

An HTML5 tree builder checks "is there a `<p>` (a `<div>`, an element named so) in scope?"
for many tags by walking its stack of open elements, so a page that keeps opening
elements and never closes them (`<div>` repeated) costs time quadratic in its size:
0.1 MB of them take Lexbor a second, 0.8 MB two minutes. Browsers cap the depth of the
tree they build (Blink at 512); Lexbor has no such cap, so `check_depth` refuses a page
first, in one pass linear in its size, once its open elements would pass `MAX_DEPTH`.

The pass reads tags as the HTML standard's tokenizer does (comments, raw text such as
`<script>` and `<style>`, quoted attributes, `/>`), and keeps a stack of the elements the
tree builder would hold open. It closes an element only where the builder certainly
closes it: at its end tag when nothing that stops the builder's search lies above it, an
unclosed `<p>` at the next block, `<li>`, `<dd>`, `<dt>`, `<option>`, a table cell or row
at the next one. Anything else (misnested tags, adoption of formatting elements, a
`<table>` that closes another) it leaves open, so it never counts fewer open elements
than Lexbor keeps, and may count a few more on a page that is badly broken. Formatting
elements (`<b>`, `<font>`...) left open count twice: the builder re-opens them later.
"""

from __future__ import annotations

import re

from chatqna.errors import DocumentLoadError

__all__ = ["MAX_DEPTH", "check_depth"]

# Blink's cap on the depth of the tree its parser builds; real pages stay far below it.
MAX_DEPTH = 512

_SPACE = "\t\n\f\r "
# One tag, as the tokenizer reads it: a name, then attributes whose quoted values may
# hold `>`, then `>` or `/>`. Possessive, as the tokenizer never backs up: it fails only
# where the text ends inside the tag.
# Where the tag cannot end, no `>` follows and no other tag can either. Anything else
# that starts with `<` and a letter is text, as is a `<` followed by anything else.
_MARKUP = re.compile(
    rf"""<(/?)([A-Za-z][^{_SPACE}/>]*+)
    ((?:[{_SPACE}]++|/(?!>)|[^{_SPACE}/>][^{_SPACE}/>=]*+
       (?:[{_SPACE}]*+=[{_SPACE}]*+(?:"[^"]*+"|'[^']*+'|[^{_SPACE}>]*+))?+)*+)
    (/?)>
    |<(?:!--|[!?]|/(?![A-Za-z]))""",
    re.VERBOSE,
)
_COMMENT_END = re.compile(r"-?>|.*?--!?>", re.DOTALL)
_RAW_TEXT = frozenset(
    {"script", "style", "xmp", "iframe", "noembed", "noframes", "textarea", "title"}
)
_RAW_END = {name: re.compile(rf"</{name}[{_SPACE}/>]", re.IGNORECASE) for name in _RAW_TEXT}

_VOID = frozenset(
    {
        "area", "base", "basefont", "bgsound", "br", "col", "embed", "frame", "hr", "image",
        "img", "input", "keygen", "link", "meta", "param", "source", "track", "wbr",
        # Opened once and never again: a second one is merged into the first or ignored.
        "html", "head", "body", "frameset",
    }
)  # fmt: skip
# The namespace an open element is in, as far as the tags it takes go.
_HTML, _SVG, _MATH, _INTEGRATION_POINT = 0, 1, 2, 3
_FOREIGN_ROOTS = frozenset({"svg", "math"})
# Where markup inside SVG or MathML is read as HTML again.
_INTEGRATION = {
    _SVG: frozenset({"foreignobject", "desc", "title"}),
    _MATH: frozenset({"mi", "mo", "mn", "ms", "mtext"}),
}
_FORMATTING = frozenset(
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
    | _FORMATTING
    | _IMPLYING
    | _VOID
    | _RAW_TEXT
    | _FOREIGN_ROOTS
    | _MARKERS
    | _TABLE_PARTS
    | _HEADINGS
    | set(_KIND_OF)
    | {"plaintext", "mglyph", "malignmark"}
)
_NOT_INLINE = _NOT_PLAIN - _FORMATTING


class _OpenElements:
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
        return self.spaces[-1] if self.spaces else _HTML

    def push(self, name: str, space: int) -> None:
        position = len(self.names)
        self.names.append(name)
        self.spaces.append(space)
        self.at.setdefault(name, []).append(position)
        if space == _HTML:
            self.kinds["html"].append(position)
        if name in _KIND_OF:
            for kind in _KIND_OF[name]:
                self.kinds[kind].append(position)
            if space == _HTML and name in _MARKERS:
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
        if space == _HTML:
            self.kinds["html"].pop()
        if name in _KIND_OF:
            for kind in _KIND_OF[name]:
                self.kinds[kind].pop()
            if space == _HTML and name in _MARKERS:
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


def _start_foreign(open_: _OpenElements, name: str, self_closing: bool) -> None:
    # Inside SVG or MathML every start tag opens an element there (`/>` closes it again);
    # the few tags that leave it are counted as opening one too.
    if self_closing:
        return
    space = open_.space()
    if name in _FOREIGN_ROOTS:
        space = _SVG if name == "svg" else _MATH
    elif space == _INTEGRATION_POINT:
        space = _MATH
    if name in _INTEGRATION.get(space, ()):
        space = _INTEGRATION_POINT
    open_.push(name, space)


def _close_implied(open_: _OpenElements, name: str) -> None:
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


def _imply_table_parts(open_: _OpenElements, name: str) -> None:
    # A row or cell straight in a table opens the body (and the row) it belongs in.
    sections = max(open_.topmost(section) for section in ("tbody", "thead", "tfoot"))
    if open_.topmost("table") > sections:
        open_.push("tbody", _HTML)
    if name in ("td", "th") and open_.topmost("table") >= open_.topmost("tr"):
        open_.push("tr", _HTML)


def _start(open_: _OpenElements, name: str, attributes: str, self_closing: bool) -> bool:
    """Count a start tag; True when it opens an HTML element whose content is raw text."""
    space = open_.space()
    foreign = space in (_SVG, _MATH) or (
        space == _INTEGRATION_POINT and name in ("mglyph", "malignmark")
    )
    if foreign or name in _FOREIGN_ROOTS:
        _start_foreign(open_, name, self_closing)
        return False
    if name in _IMPLYING:
        _close_implied(open_, name)
    if name in _VOID or name in _RAW_TEXT or name == "plaintext":
        return name in _RAW_TEXT or name == "plaintext"
    if name in ("tr", "td", "th"):
        _imply_table_parts(open_, name)
    open_.push(name, _HTML)
    if name in _FORMATTING:
        open_.open_formatting(name + attributes)
    return False


def _end_html(open_: _OpenElements, name: str) -> None:
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


def _end(open_: _OpenElements, name: str) -> None:
    if open_.space() == _HTML:
        _end_html(open_, name)
        return
    # Inside SVG or MathML an end tag closes the topmost element of its name there;
    # one that names an element outside it is left to the HTML rules, and not counted.
    position = open_.topmost(name)
    if position > open_.kinds["html"][-1]:
        open_.close(position)


def _skip(text: str, markup: re.Match[str], open_: _OpenElements) -> int:
    """Where `markup` ends, counted; -1 when no tag follows it."""
    start = markup.start()
    name = markup.group(2)
    if name is not None:
        name = name.lower()
        if markup.group(1):
            _end(open_, name)
        elif _start(open_, name, markup.group(3), markup.group(4) == "/"):
            # Raw text (`<script>`, `<style>`, `<title>`...) holds no tags up to its end tag.
            raw_end = _RAW_END[name].search(text, markup.end()) if name in _RAW_END else None
            return raw_end.start() if raw_end is not None else -1
        return markup.end()
    if text.startswith("<!--", start):
        comment = _COMMENT_END.match(text, start + 4)
        return comment.end() if comment is not None else -1
    if text.startswith("<![CDATA[", start) and open_.space() in (_SVG, _MATH):
        cdata_end = text.find("]]>", start)
        return cdata_end + 3 if cdata_end >= 0 else -1
    # A doctype or a bogus comment (`<?...>`, `</ ...>`) ends at the next `>`.
    end = text.find(">", start)
    return end + 1 if end >= 0 else -1


def check_depth(source: str, text: str) -> None:
    """Refuse (`DocumentLoadError`, reason `nesting`) a page whose open elements would
    pass `MAX_DEPTH` levels; linear in the page's length, and it stops at the first
    element past that depth."""
    open_ = _OpenElements()
    names, spaces, at, special = open_.names, open_.spaces, open_.at, open_.kinds["special"]
    resume = 0
    # Searched from where the last markup ended, never from inside a comment or raw text.
    while (markup := _MARKUP.search(text, resume)) is not None:
        name = markup.group(2)
        name = name.lower() if name is not None else None
        if name is None or (spaces and spaces[-1] != _HTML) or name in _NOT_INLINE:
            resume = _skip(text, markup, open_)
        elif not markup.group(1):
            # The common case, kept inline: an element that closes and implies nothing.
            open_.push(name, _HTML)
            if name in _FORMATTING:
                open_.open_formatting(name + markup.group(3))
            resume = markup.end()
        else:
            if (positions := at.get(name)) and positions[-1] > special[-1]:
                open_.close_formatting(positions[-1])
            resume = markup.end()
        if len(names) + open_.reopened > MAX_DEPTH:
            raise DocumentLoadError(
                f"{source} nests its HTML elements more than {MAX_DEPTH} levels deep "
                "(elements opened and never closed); a page so nested cannot be read",
                reason="nesting",
            )
        if resume < 0:
            return
