"""Chunking: sections become bounded, overlapping, deterministically identified chunks."""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import chatqna
from chatqna.documents import LoadedDocument, chunk_id_for
from chatqna.ingest import chunking
from chatqna.ingest.chunking import chunk_document
from chatqna.ingest.loaders import load_document


def sentence(n: int) -> str:
    return f"Sentence number {n} talks about refunds and invoices in some detail."


def long_paragraphs(paragraphs: int, sentences_each: int) -> str:
    return "\n\n".join(
        " ".join(sentence(p * 100 + s) for s in range(sentences_each)) for p in range(paragraphs)
    )


def squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def test_short_sections_become_one_chunk_each() -> None:
    doc = LoadedDocument("a.md", "Doc", [("Intro", "Hello."), ("Usage", "Use it.")])
    chunks = chunk_document(doc)
    assert [(c.index, c.title, c.text) for c in chunks] == [
        (0, "Intro", "Hello."),
        (1, "Usage", "Use it."),
    ]
    assert [c.id for c in chunks] == [chunk_id_for("a.md", 0), chunk_id_for("a.md", 1)]
    assert all(c.source == "a.md" for c in chunks)


def test_empty_sections_are_skipped_and_indexes_stay_contiguous() -> None:
    doc = LoadedDocument("a.txt", "Doc", [("A", "one"), ("B", "  \n "), ("", "three")])
    chunks = chunk_document(doc)
    assert [c.index for c in chunks] == [0, 1]
    # An empty heading falls back to the document title.
    assert [c.title for c in chunks] == ["A", "Doc"]


def test_long_section_respects_max_chars_and_carries_overlap() -> None:
    text = long_paragraphs(paragraphs=6, sentences_each=5)
    doc = LoadedDocument("long.md", "Long", [("Body", text)])
    chunks = chunk_document(doc, max_chars=500, overlap_chars=80)
    assert len(chunks) > 3
    assert all(len(c.text) <= 500 for c in chunks)
    assert all(c.title == "Body" for c in chunks)
    words = set(text.split())
    for previous, current in itertools.pairwise(chunks):
        # The next chunk opens with a whole-word tail of the previous one, at most 80 chars.
        overlap = max(
            (k for k in range(1, 81) if current.text.startswith(previous.text[-k:])),
            default=0,
        )
        assert 0 < overlap <= 80
        assert previous.text[-overlap - 1].isspace()
    for chunk in chunks:
        assert set(chunk.text.split()) <= words, "a word was cut in half"


def test_long_section_loses_no_text_without_overlap() -> None:
    text = long_paragraphs(paragraphs=4, sentences_each=7)
    doc = LoadedDocument("x.txt", "X", [("X", text)])
    chunks = chunk_document(doc, max_chars=300, overlap_chars=0)
    assert all(len(c.text) <= 300 for c in chunks)
    assert squash("".join(c.text for c in chunks)) == squash(text)


def test_split_prefers_paragraph_boundaries() -> None:
    paragraphs = [f"Paragraph {n}. " + "word " * 60 for n in range(5)]
    text = "\n\n".join(p.strip() for p in paragraphs)
    doc = LoadedDocument("p.txt", "P", [("P", text)])
    chunks = chunk_document(doc, max_chars=700, overlap_chars=0)
    # Each paragraph is ~320 chars: two fit per chunk, and no paragraph is broken.
    assert [c.text.count("Paragraph") for c in chunks] == [2, 2, 1]
    assert all(c.text.startswith("Paragraph") for c in chunks)


def test_paragraph_longer_than_max_splits_on_sentences() -> None:
    text = " ".join(sentence(n) for n in range(20))
    chunks = chunk_document(
        LoadedDocument("s.txt", "S", [("S", text)]), max_chars=200, overlap_chars=0
    )
    assert all(len(c.text) <= 200 for c in chunks)
    assert all(c.text.endswith("detail.") for c in chunks)


def test_text_without_spaces_is_cut_hard_at_max_chars() -> None:
    text = "x" * 1000
    chunks = chunk_document(
        LoadedDocument("b.txt", "B", [("B", text)]), max_chars=300, overlap_chars=50
    )
    assert all(len(c.text) <= 300 for c in chunks)
    assert sum(len(c.text) for c in chunks) >= 1000


def test_chunking_is_deterministic_and_ids_follow_the_source() -> None:
    text = long_paragraphs(paragraphs=5, sentences_each=6)
    doc = LoadedDocument("guide.md", "Guide", [("One", text), ("Two", "short")])
    first, second = chunk_document(doc, 400, 60), chunk_document(doc, 400, 60)
    assert first == second
    assert [c.id for c in first] == [chunk_id_for("guide.md", i) for i in range(len(first))]
    assert [c.index for c in first] == list(range(len(first)))
    renamed = chunk_document(LoadedDocument("other.md", "Guide", doc.sections), 400, 60)
    assert {c.id for c in renamed}.isdisjoint(c.id for c in first)


@pytest.mark.parametrize(
    ("max_chars", "overlap_chars"), [(100, 100), (100, 150), (100, -1), (0, 0)]
)
def test_invalid_sizes_are_rejected(max_chars: int, overlap_chars: int) -> None:
    doc = LoadedDocument("a.txt", "A", [("A", "text")])
    with pytest.raises(ValueError, match="max_chars"):
        chunk_document(doc, max_chars=max_chars, overlap_chars=overlap_chars)


def test_loaded_markdown_chunks_carry_section_headings() -> None:
    body = " ".join(sentence(n) for n in range(40))
    data = f"# Guide\n\nIntro.\n\n## Long part\n\n{body}\n\n## End\n\nBye.\n".encode()
    chunks = chunk_document(load_document("guide.md", data), max_chars=600, overlap_chars=100)
    titles = [c.title for c in chunks]
    assert titles[0] == "Guide" and titles[-1] == "End"
    assert titles.count("Long part") >= 4
    assert chunks[0].text == "Intro." and chunks[-1].text == "Bye."


def _hard_split_by_slicing(sentence: str, limit: int) -> list[tuple[str, str]]:
    """The hard split as it was written before it walked by index (quadratic on a long
    text without breaks): the reference its output must match exactly."""
    pieces: list[tuple[str, str]] = []
    separator = ""
    rest = sentence
    while len(rest) > limit:
        window = rest[: limit + 1]
        cut = max((m.start() for m in re.finditer(r"\s", window)), default=0)
        if cut > 0:
            pieces.append((separator, rest[:cut].rstrip()))
            rest, separator = rest[cut:].lstrip(), " "
        else:
            pieces.append((separator, rest[:limit]))
            rest, separator = rest[limit:], ""
    if rest:
        pieces.append((separator, rest))
    return pieces


# Words, runs of assorted white space (a no-break and an ideographic space among them),
# full stops and blank lines: every boundary the chunker looks for.
TEXT = st.lists(
    st.sampled_from(
        ["a", "word", "longerword", " ", "  ", "\t", "\n", "\u00a0", "\u3000", ". ", "\n\n"]
    ),
    max_size=80,
).map("".join)


@given(TEXT, st.integers(min_value=1, max_value=30))
def test_the_hard_split_matches_the_slicing_reference(text: str, limit: int) -> None:
    sentence = text.strip()
    assert list(chunking._hard_split(sentence, limit)) == _hard_split_by_slicing(sentence, limit)


@given(TEXT, st.integers(min_value=2, max_value=40), st.data())
def test_chunks_match_those_of_the_slicing_reference(
    text: str, max_chars: int, data: st.DataObject
) -> None:
    overlap = data.draw(st.integers(min_value=0, max_value=max_chars - 1))
    doc = LoadedDocument("g.txt", "G", [("G", text)])
    chunks = [c.text for c in chunk_document(doc, max_chars, overlap)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(chunking, "_hard_split", _hard_split_by_slicing)
        reference = [c.text for c in chunk_document(doc, max_chars, overlap)]
    assert chunks == reference


def test_a_long_text_of_short_lines_is_cut_like_the_reference() -> None:
    text = "word\n" * 20_000  # no blank line, no sentence end: one long hard split
    doc = LoadedDocument("log.txt", "log", [("log", text)])
    chunks = [c.text for c in chunk_document(doc, 100, 10)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(chunking, "_hard_split", _hard_split_by_slicing)
        assert chunks == [c.text for c in chunk_document(doc, 100, 10)]
    assert len(chunks) == 1112 and all(len(c) <= 100 for c in chunks)


# Every kind of sentence and paragraph break, and the characters around them, in short runs:
# with windows of a few characters, breaks straddle window edges in every way.
BREAKY_TEXT = st.lists(
    st.sampled_from(
        ["a", "wo", ".", "!", "?", ")", "”", "'", "。", "！", " ", "\t", "\n", "\u3000", "\x1c"]
    ),
    max_size=60,
).map("".join)


@given(BREAKY_TEXT, st.integers(min_value=1, max_value=9))
@example("ab\n \ncd", 3)  # a paragraph break across a window edge
@example("ab.   cd", 4)  # a sentence break's whitespace across a window edge
@example("ab。cd", 3)  # an empty sentence break on a window edge
@example("a.)  b\x1c", 4)  # a break looking behind across a window edge
def test_windowed_scans_find_what_a_whole_scan_finds(text: str, window: int) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(chunking, "_SCAN_CHARS", window)
        paragraphs = list(chunking._paragraphs(text))
        breaks = list(chunking._sentence_breaks(text))
        starts = [chunking._next_non_space(text, i) for i in range(len(text) + 2)]
    assert paragraphs == chunking._PARAGRAPH_BREAK.split(text)
    assert breaks == [m.span() for m in chunking._SENTENCE_BREAK.finditer(text)]
    assert starts == [len(text) - len(text[i:].lstrip()) for i in range(len(text) + 2)]


@given(BREAKY_TEXT, st.integers(min_value=1, max_value=9), st.integers(2, 30), st.data())
def test_chunks_do_not_depend_on_the_scan_window(
    text: str, window: int, max_chars: int, data: st.DataObject
) -> None:
    overlap = data.draw(st.integers(min_value=0, max_value=max_chars - 1))
    doc = LoadedDocument("w.txt", "W", [("W", text)])
    whole = [c.text for c in chunk_document(doc, max_chars, overlap)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(chunking, "_SCAN_CHARS", window)
        assert [c.text for c in chunk_document(doc, max_chars, overlap)] == whole


def test_a_paragraph_longer_than_the_scan_window_is_cut_as_by_one_scan() -> None:
    edge = chunking._SCAN_CHARS
    # Breaks placed on and around the window edges, and a stretch with no break at all.
    text = ("lorem ipsum " * 20_000)[: edge - 2] + ".  \t Next" + "x" * (edge - 3) + "。Then"
    text += ' "quoted."\n\n\n  ' + ("dolor " * 30_000) + "end!" + " " * (edge + 5) + "Last"
    doc = LoadedDocument("long.txt", "long", [("long", text)])
    chunks = [c.text for c in chunk_document(doc, 1200, 150)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(chunking, "_SCAN_CHARS", len(text) + 1)  # one scan of the whole text
        assert chunks == [c.text for c in chunk_document(doc, 1200, 150)]
    assert chunks[-1].endswith("end! Last")


# --- a bound on the number of chunks --------------------------------------------------------------


def counting_split(patch: pytest.MonkeyPatch) -> list[str]:
    """Make `chunk_document` cut through a spy; returns the pieces it drew, as it draws them."""
    drawn: list[str] = []
    split = chunking._split

    def spy(text: str, max_chars: int, overlap_chars: int) -> Iterator[str]:
        for piece in split(text, max_chars, overlap_chars):
            drawn.append(piece)
            yield piece

    patch.setattr(chunking, "_split", spy)
    return drawn


def test_the_cutting_stops_as_soon_as_the_bound_is_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    # A stride of one character: unbounded, this body is cut into about 20,000 chunks.
    doc = LoadedDocument("big.txt", "Big", [("Intro", "Short."), ("Body", "x" * 20_000)])
    assert len(chunk_document(doc, 100, 99)) > 19_000
    drawn = counting_split(monkeypatch)
    with pytest.raises(chunking.TooManyChunks) as stopped:
        chunk_document(doc, 100, 99, max_chunks=10)
    assert (stopped.value.count, stopped.value.limit) == (11, 10)
    assert 1 + len(drawn) == 11  # the short section, then body pieces up to the eleventh


@pytest.mark.parametrize(("max_chars", "overlap"), [(200, 40), (100, 99)])
def test_a_bound_that_is_not_passed_changes_nothing(max_chars: int, overlap: int) -> None:
    doc = LoadedDocument("p.txt", "P", [("A", "Short."), ("B", long_paragraphs(3, 4))])
    unbounded = chunk_document(doc, max_chars, overlap)
    assert chunk_document(doc, max_chars, overlap, max_chunks=len(unbounded)) == unbounded
    with pytest.raises(chunking.TooManyChunks) as stopped:
        chunk_document(doc, max_chars, overlap, max_chunks=len(unbounded) - 1)
    assert stopped.value.count == len(unbounded)


def test_a_bound_of_zero_refuses_any_chunk_but_not_an_empty_document() -> None:
    assert chunk_document(LoadedDocument("e.txt", "E", [("E", " \n ")]), max_chunks=0) == []
    with pytest.raises(chunking.TooManyChunks):
        chunk_document(LoadedDocument("a.txt", "A", [("A", "a")]), max_chunks=0)


# --- the chunks themselves, as released ---------------------------------------------------------

SAMPLE_CORPUS = Path(chatqna.__file__).parent / "sample_corpus"


def golden_documents(case: str) -> list[LoadedDocument]:
    if case == "sample":
        return [load_document(p.name, p.read_bytes()) for p in sorted(SAMPLE_CORPUS.glob("*.md"))]
    texts = {
        "paragraphs": long_paragraphs(paragraphs=6, sentences_each=5),
        "log": "word\n" * 2_000,
        "cjk": "".join(
            f"第{n}句讲的是退款和发票。" + ("真的吗？" if n % 3 else "") for n in range(80)
        ),
        "nospace": "x" * 1_000 + " y",
        "mixed": 'He said "stop." Then\u00a0left!\t(Really.)  Yes\u3000no\n \n' * 40,
    }
    if case in texts:
        return [LoadedDocument(f"{case}.txt", case.title(), [(case, texts[case])])]
    sections = [("One", sentence(1)), ("", "  \n "), ("", long_paragraphs(2, 4)), ("Two", "ok")]
    return [LoadedDocument("sections.md", "Sections", sections)]


# The chunks' ids, indexes, titles and texts as released (a digest of them, and their number):
# retrieval results, and the benchmarks measured on them, depend on every byte.
GOLDEN = {
    ("sample", 1200, 150): ("8b5dfebc056bef37", 36),
    ("sample", 300, 60): ("fabe1e292fee10ae", 109),
    ("sample", 100, 99): ("07efbbd25645ff43", 2846),
    ("sample", 40, 0): ("11599d33d23662d3", 594),
    ("paragraphs", 500, 80): ("100916b7d9c9b70d", 6),
    ("paragraphs", 200, 199): ("3a581a78f232e485", 299),
    ("log", 100, 10): ("b6767b0ff9632efd", 112),
    ("cjk", 60, 20): ("32286dd17b9cc765", 39),
    ("cjk", 7, 6): ("474fce0677238bc1", 1236),
    ("nospace", 300, 50): ("5413ef97723adf23", 5),
    ("mixed", 80, 30): ("a99ec8a1cd6cd7ca", 40),
    ("mixed", 12, 11): ("45ddbec819be6959", 319),
    ("sections", 120, 40): ("295bdaf520d61502", 10),
}


@pytest.mark.parametrize(("case", "max_chars", "overlap"), sorted(GOLDEN))
def test_chunks_are_those_released(case: str, max_chars: int, overlap: int) -> None:
    chunks = [
        chunk for doc in golden_documents(case) for chunk in chunk_document(doc, max_chars, overlap)
    ]
    rows = [[c.id, c.index, c.title, c.text, c.source] for c in chunks]
    digest = hashlib.sha256(json.dumps(rows, ensure_ascii=False).encode()).hexdigest()[:16]
    assert (digest, len(chunks)) == GOLDEN[case, max_chars, overlap]
