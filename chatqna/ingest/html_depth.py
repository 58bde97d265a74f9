"""A bound on how deep an HTML page nests its elements, checked before Lexbor parses it.

An HTML5 tree builder checks "is there a `<p>` (a `<div>`, an element named so) in scope?"
for many tags by walking its stack of open elements, so a page that keeps opening
elements and never closes them (`<div>` repeated) costs time quadratic in its size:
0.1 MB of them take Lexbor a second, 0.8 MB two minutes. Browsers cap the depth of the
tree they build (Blink at 512); Lexbor has no such cap, so `check_depth` refuses a page
first, in one pass linear in its size, once its open elements would pass `MAX_DEPTH`.

The pass reads tags as the HTML standard's tokenizer does (comments, raw text such as
`<script>` and `<style>`, quoted attributes, `/>`), and keeps the elements the tree
builder would hold open (`html_open_elements`), never fewer than Lexbor keeps: ordinary
pages, unclosed `<p>`, `<li>` and `<td>` included, stay a few dozen levels deep.
"""

from __future__ import annotations

import re

from chatqna.errors import DocumentLoadError
from chatqna.ingest.html_open_elements import (
    FORMATTING,
    HTML,
    MATH,
    NOT_INLINE,
    PAIRED,
    RAW_TEXT,
    SELF_REPLACING,
    SVG,
    OpenElements,
    close_implied,
    end_tag,
    imply_table_parts,
    start_tag,
)

__all__ = ["MAX_DEPTH", "check_depth"]

# Blink's cap on the depth of the tree its parser builds; real pages stay far below it.
MAX_DEPTH = 512

_SPACE = "\t\n\f\r "
# One tag, as the tokenizer reads it: a name, then attributes whose quoted values may
# hold `>`, then `>` or `/>` (groups 1 to 4); a start tag takes along the text and end
# tag that close it straight away, if they do (group 5), so that the commonest markup
# costs one match. Possessive, as the tokenizer never backs up: a tag fails only where
# the text ends inside it, and then no other tag can follow. Else a comment, a doctype
# or a bogus comment starts; any other `<` is text.
_MARKUP = re.compile(
    rf"""<(/)?([A-Za-z][^{_SPACE}/>]*+)
    ((?:[{_SPACE}]++|/(?!>)|[^{_SPACE}/>][^{_SPACE}/>=]*+
       (?:[{_SPACE}]*+=[{_SPACE}]*+(?:"[^"]*+"|'[^']*+'|[^{_SPACE}>]*+))?+)*+)
    (/?)>(?(1)|([^<]*+</\2>)?)
    |<(?:!--|[!?]|/(?![A-Za-z]))""",
    re.VERBOSE,
)
_COMMENT_END = re.compile(r"-?>|.*?--!?>", re.DOTALL)
_RAW_END = {name: re.compile(rf"</{name}[{_SPACE}/>]", re.IGNORECASE) for name in RAW_TEXT}


def _skip(text: str, markup: re.Match[str], open_: OpenElements) -> int:
    """Where `markup` ends, counted; -1 when no tag follows it."""
    start = markup.start()
    name = markup.group(2)
    if name is not None:
        name = name.lower()
        paired = markup.group(5) is not None
        if markup.group(1):
            end_tag(open_, name)
        elif start_tag(open_, name, markup.group(3), markup.group(4) == "/"):
            # Raw text (`<script>`, `<style>`, `<title>`...) holds no tags up to its end tag.
            after = markup.start(5) if paired else markup.end()
            raw_end = _RAW_END[name].search(text, after) if name in _RAW_END else None
            return raw_end.start() if raw_end is not None else -1
        elif paired:
            end_tag(open_, name)
        return markup.end()
    if text.startswith("<!--", start):
        comment = _COMMENT_END.match(text, start + 4)
        return comment.end() if comment is not None else -1
    if text.startswith("<![CDATA[", start) and open_.space() in (SVG, MATH):
        cdata_end = text.find("]]>", start)
        return cdata_end + 3 if cdata_end >= 0 else -1
    # A doctype or a bogus comment (`<?...>`, `</ ...>`) ends at the next `>`.
    end = text.find(">", start)
    return end + 1 if end >= 0 else -1


def _shortcut(open_: OpenElements, markup: re.Match[str], name: str) -> bool:
    """Count the commonest markup in HTML content without the full rules; False for
    markup that needs them."""
    names = open_.names
    if name in NOT_INLINE:
        if markup[5] and name in PAIRED:
            # Opened and closed at once: only what its start tag closes or implies stays.
            close_implied(open_, name)
            if name in ("tr", "td", "th"):
                imply_table_parts(open_, name)
            return True
        # `<p>` (`<li>`, `<option>`...) where one is the current element closes it and
        # opens another: no change.
        return name in SELF_REPLACING and bool(names) and names[-1] == name and not markup[5]
    if markup[1]:
        positions = open_.at.get(name)
        if positions and positions[-1] > open_.kinds["special"][-1]:
            open_.close_formatting(positions[-1])
    elif markup[5] is None:
        # An element that closes and implies nothing.
        open_.push(name, HTML)
        if name in FORMATTING:
            open_.open_formatting(name + markup[3])
    elif name in FORMATTING:
        # Closed at once, it leaves the list of formatting elements as it found it, but
        # for one of three alike it pushed out (the builder keeps three).
        counts = open_.formatting[-1]
        if counts.get(key := name + markup[3]) == 3:
            counts[key] = 2
            open_.reopened -= 1
    return True


def check_depth(source: str, text: str) -> None:
    """Refuse (`DocumentLoadError`, reason `nesting`) a page whose open elements would
    pass `MAX_DEPTH` levels; linear in the page's length, and it stops at the first
    element past that depth."""
    open_ = OpenElements()
    spaces = open_.spaces
    resume = 0
    # Searched from where the last markup ended, never from inside a comment or raw text.
    while (markup := _MARKUP.search(text, resume)) is not None:
        name = markup[2].lower() if markup[2] is not None else None
        resume = markup.end()
        if name is None or (spaces and spaces[-1] != HTML) or not _shortcut(open_, markup, name):
            resume = _skip(text, markup, open_)
        if open_.depth > MAX_DEPTH:
            raise DocumentLoadError(
                f"{source} nests its HTML elements more than {MAX_DEPTH} levels deep "
                "(elements opened and never closed); a page so nested cannot be read",
                reason="nesting",
            )
        if resume < 0:
            return
