"""Markdown: a title and level-2 sections, found by markdown-it-py's CommonMark block parser.

The document's first level-1 heading (`# Title`, or `Title` underlined with `===`) is its
title; every top-level level-2 heading (`## Part`, or `Part` underlined with `---`) starts a
section named by its text. Deeper headings, and anything that only looks like a heading
inside a code block, a fence, a block quote or a list, stay in the section's text. A
section's text is the Markdown source as written, with the heading lines taken out.
"""

from __future__ import annotations

import itertools
import re

from markdown_it import MarkdownIt

__all__ = ["markdown_sections"]

# Only the block structure matters here; the inline rules (emphasis, links) are not run.
_PARSER = MarkdownIt("commonmark").disable("inline")
_NEWLINES = re.compile(r"\r\n?")


def markdown_sections(text: str) -> tuple[str | None, list[tuple[str | None, str]]]:
    """The first level-1 heading (None if there is none) and `(heading, text)` sections.

    The first section has no heading when text comes before the first level-2 heading.
    """
    text = _NEWLINES.sub("\n", text)
    lines = text.split("\n")
    tokens = _PARSER.parse(text)
    title: str | None = None
    sections: list[tuple[str | None, list[str]]] = [(None, [])]
    taken = 0
    for opener, inline in itertools.pairwise(tokens):
        if opener.type != "heading_open" or opener.level != 0 or opener.map is None:
            continue
        name = " ".join(inline.content.split())
        if opener.tag == "h1" and title is None:
            title = name
        elif opener.tag != "h2":
            continue
        start, end = opener.map
        sections[-1][1].extend(lines[taken:start])
        if opener.tag == "h2":
            sections.append((name, []))
        taken = end
    sections[-1][1].extend(lines[taken:])
    return title, [(heading, "\n".join(body)) for heading, body in sections]
