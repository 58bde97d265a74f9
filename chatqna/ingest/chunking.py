"""Chunking: cut a `LoadedDocument` into the `Chunk`s the index stores.

A section that fits in `max_chars` stays whole, so a passage never mixes two headings. A
longer section is cut at the coarsest boundary that works (paragraph, then sentence, then
word, and only as a last resort inside a word), and each piece after the first starts with
up to `overlap_chars` of the previous piece's end, so a fact that straddles a cut is still
retrievable with its context. The output depends only on the input, so ids are stable
across re-ingestion.

Pieces are cut one at a time, so a bound on their number (`max_chunks`: what is left of an
ingest request's chunk budget) stops the cutting as soon as it is passed, before a small
stride over a long text has built millions of them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from chatqna.documents import Chunk, LoadedDocument, chunk_id_for

__all__ = ["TooManyChunks", "chunk_document"]

_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n\s*")
# A sentence ends at . ! or ? (optionally followed by a closing quote or bracket) before
# whitespace; CJK full stops need no following space.
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|(?<=[.!?][\"'”’)\]])\s+|(?<=[。！？])")
_WHITESPACE = re.compile(r"\s")
_NON_SPACE = re.compile(r"\S")
# Each regular-expression call scans at most about this many characters: a scan holds the GIL
# from start to end, so one over a paragraph of megabytes would stall the server's event loop.
_SCAN_CHARS = 64 * 1024

# A unit is an unbreakable run of text plus the separator that joins it to the previous one.
_Unit = tuple[str, str]


class TooManyChunks(Exception):
    """`doc` is cut into more than `limit` chunks: `count` (= `limit + 1`) were cut when
    the cutting stopped."""

    def __init__(self, count: int, limit: int) -> None:
        super().__init__(f"more than {limit} chunks")
        self.count = count
        self.limit = limit


def chunk_document(
    doc: LoadedDocument,
    max_chars: int = 1200,
    overlap_chars: int = 150,
    *,
    max_chunks: int | None = None,
) -> list[Chunk]:
    """Split `doc` into chunks of at most `max_chars` characters, indexed 0..n-1.

    Each chunk's `title` is its section heading (or the document title when the heading is
    empty). Raises `ValueError` unless `max_chars > overlap_chars >= 0`, and
    `TooManyChunks` as soon as a piece past the first `max_chunks` is cut (no bound when
    `None`).
    """
    if not max_chars > overlap_chars >= 0:
        raise ValueError(
            f"need max_chars > overlap_chars >= 0, got max_chars={max_chars}, "
            f"overlap_chars={overlap_chars}"
        )
    chunks: list[Chunk] = []
    for heading, text in doc.sections:
        text = text.strip()
        if not text:
            continue
        pieces = (text,) if len(text) <= max_chars else _split(text, max_chars, overlap_chars)
        for piece in pieces:
            index = len(chunks)
            if max_chunks is not None and index >= max_chunks:
                raise TooManyChunks(index + 1, max_chunks)
            chunks.append(
                Chunk(
                    id=chunk_id_for(doc.source, index),
                    text=piece,
                    source=doc.source,
                    title=heading or doc.title,
                    index=index,
                )
            )
    return chunks


def _split(text: str, max_chars: int, overlap_chars: int) -> Iterator[str]:
    """The pieces of `text`, one at a time: none is cut before the one ahead is taken."""
    # Units are kept short enough that a full overlap still fits in front of any of them.
    units = _units(text, max_chars - overlap_chars)
    current = ""
    for separator, unit in units:
        if not current:
            current = unit
        elif len(current) + len(separator) + len(unit) <= max_chars:
            current += separator + unit
        else:
            yield current
            room = min(overlap_chars, max_chars - len(separator) - len(unit))
            tail = _tail(current, room)
            current = tail + separator + unit if tail else unit
    if current:
        yield current


def _units(text: str, limit: int) -> Iterator[_Unit]:
    """Break `text` into pieces of at most `limit` chars, as coarsely as possible. (The
    first one's separator is "", and `_split` does not read it.)"""
    started = False  # a paragraph has been given; every paragraph gives a piece
    for paragraph in _paragraphs(text):
        paragraph = paragraph.strip()
        if not paragraph:
            continue
        separator = "\n\n" if started else ""
        started = True
        if len(paragraph) <= limit:
            yield (separator, paragraph)
            continue
        for sentence_sep, sentence in _sentences(paragraph):
            sep = separator or sentence_sep
            separator = ""
            if len(sentence) <= limit:
                yield (sep, sentence)
                continue
            for word_sep, piece in _hard_split(sentence, limit):
                yield (sep or word_sep, piece)
                sep = ""


def _paragraphs(text: str) -> Iterator[str]:
    """`_PARAGRAPH_BREAK.split(text)`, scanned a window at a time.

    A window ends before a non-space character, which no break contains or reads past, so
    each window finds exactly the breaks a scan of the whole text finds there. (A window is
    longer across a long run of white space, which this pattern crosses at memory speed.)
    """
    piece, window, size = 0, 0, len(text)
    while window < size:
        stop = _next_non_space(text, window + _SCAN_CHARS)
        for match in _PARAGRAPH_BREAK.finditer(text, window, stop):
            yield text[piece : match.start()]
            piece = match.end()
        window = stop
    yield text[piece:]


def _sentence_breaks(paragraph: str) -> Iterator[tuple[int, int]]:
    """The spans of `_SENTENCE_BREAK.finditer(paragraph)`, scanned a window at a time.

    A break is a run of whitespace, or empty, and only looks behind it, so a window finds the
    breaks a whole scan finds, except that one reaching the window's end may go on past it:
    a run of whitespace is followed to its end, and an empty break is left to the next window.
    """
    start, size = 0, len(paragraph)
    while True:
        stop = min(start + _SCAN_CHARS, size)
        following = stop
        for match in _SENTENCE_BREAK.finditer(paragraph, start, stop):
            begin, end = match.span()
            if end == stop < size:
                if begin < end:
                    following = _next_non_space(paragraph, end)
                    yield begin, following
                break
            yield begin, end
        if stop == size:
            return
        start = following


def _sentences(paragraph: str) -> Iterator[_Unit]:
    start = 0
    separator = ""
    for begin, end in _sentence_breaks(paragraph):
        sentence = paragraph[start:begin].strip()
        if sentence:
            yield (separator, sentence)
            # Keep "" after a CJK full stop; any run of whitespace reads the same as one space.
            separator = " " if end > begin else ""
        start = end
    if paragraph[start:].strip():
        yield (separator, paragraph[start:].strip())


def _hard_split(sentence: str, limit: int) -> Iterator[_Unit]:
    """Cut at the last whitespace before `limit`; inside a word only if there is none.

    Walks `sentence` by index: slicing off the rest at every cut would copy it each time,
    quadratic in a long text without sentence or paragraph breaks.
    """
    separator = ""
    start, end = 0, len(sentence)
    while end - start > limit:
        spaces = _WHITESPACE.finditer(sentence, start, start + limit + 1)
        cut = max((m.start() for m in spaces), default=start)
        if cut > start:
            yield (separator, sentence[start:cut].rstrip())
            start, separator = _next_non_space(sentence, cut), " "
        else:
            yield (separator, sentence[start : start + limit])
            start, separator = start + limit, ""
    if start < end:
        yield (separator, sentence[start:])


def _next_non_space(text: str, start: int) -> int:
    """Where `text[start:].lstrip()` begins (`\\S` is exactly what `str.isspace` is not)."""
    size = len(text)
    while start < size:
        match = _NON_SPACE.search(text, start, start + _SCAN_CHARS)
        if match is not None:
            return match.start()
        start += _SCAN_CHARS
    return size


def _tail(text: str, size: int) -> str:
    """The last `size` chars of `text` or fewer, starting at a word boundary if there is one."""
    if size <= 0:
        return ""
    if len(text) <= size:
        return text
    start = len(text) - size
    window = text[start:]
    if not (text[start - 1].isspace() or window[0].isspace()):
        # Starting mid-word would carry a fragment like "ment of the"; skip to the next word.
        match = _WHITESPACE.search(window)
        if match is None:
            return window  # one token longer than the overlap: no boundary to respect
        window = window[match.end() :]
    return window.lstrip()
