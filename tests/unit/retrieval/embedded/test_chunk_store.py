"""The SQLite store of record: one transaction per request, rows and removals by generation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from chatqna.backends.protocols import SourceBatch
from chatqna.documents import Chunk
from chatqna.retrieval.embedded.chunk_store import ChunkStore


def batch(source: str, count: int, digest: str = "h") -> SourceBatch:
    chunks = [Chunk(f"{source}-{i}", f"{source} text {i}", source, "T", i) for i in range(count)]
    vectors = np.arange(count * 4, dtype=np.float32).reshape(count, 4)
    return SourceBatch(source, chunks, vectors, digest)


@pytest.fixture
def store(tmp_path: Path) -> ChunkStore:
    created = ChunkStore(tmp_path, 4)
    created.create("embedder")
    return created


def test_replace_gives_increasing_rows_and_bumps_the_generation(store: ChunkStore) -> None:
    generation, documents = store.replace([batch("a.md", 2), batch("b.md", 1)])
    assert generation == 1
    assert documents == [  # what the lexical index holds: the title line, then the text
        (1, "a.md", "T\na.md text 0"),
        (2, "a.md", "T\na.md text 1"),
        (3, "b.md", "T\nb.md text 0"),
    ]
    generation, documents = store.replace([batch("a.md", 1, "h2")])
    assert generation == 2 and documents == [(4, "a.md", "T\na.md text 0")]  # ids never reused
    assert [(s.source, s.chunks, s.content_hash) for s in store.sources()] == [
        ("a.md", 1, "h2"),
        ("b.md", 1, "h"),
    ]
    assert store.chunks([4, 1])[4] == Chunk("a.md-0", "a.md text 0", "a.md", "T", 0)
    assert 1 not in store.chunks([4, 1])


def test_the_lexical_rebuild_reads_each_title_line_and_text(store: ChunkStore) -> None:
    untitled = Chunk("c.md-0", "c.md text 0", "c.md", "", 0)
    store.replace([batch("a.md", 2), SourceBatch("c.md", [untitled], np.ones((1, 4)), "h")])
    rows = [row for part in store.texts(batch=2) for row in part]
    assert rows == [
        (1, "a.md", "T\na.md text 0"),
        (2, "a.md", "T\na.md text 1"),
        (3, "c.md", "c.md text 0"),
    ]
    assert store.chunks([1])[1].text == "a.md text 0"  # what a user sees: the text alone


def test_delta_reads_rows_added_and_removed_since(store: ChunkStore) -> None:
    store.replace([batch("a.md", 2), batch("b.md", 2)])
    first = store.delta(-1, 0)
    assert first.generation == 1 and first.added.tolist() == [1, 2, 3, 4]
    assert np.array_equal(first.vectors[2], np.arange(4, dtype=np.float32))  # b.md's first
    assert first.removed.tolist() == []
    store.replace([batch("a.md", 1)])
    store.delete(["b.md"])
    later = store.delta(first.generation, 4)
    assert later.generation == 3
    assert later.added.tolist() == [5]
    assert sorted(later.removed.tolist()) == [1, 2, 3, 4]


def test_delete_reports_what_it_removed(store: ChunkStore) -> None:
    store.replace([batch("a.md", 2), batch("b.md", 3)])
    assert store.delete(["missing.md"]) == (0, 1, [])
    assert store.delete(None) == (5, 2, ["a.md", "b.md"])
    assert store.sources() == [] and store.source_count() == 0
    assert store.content_hash("a.md") is None


def test_a_failed_request_leaves_no_trace(store: ChunkStore) -> None:
    store.replace([batch("a.md", 2)])
    broken = SourceBatch("b.md", [Chunk("b-0", None, "b.md")], np.zeros((1, 4), np.float32))  # type: ignore[arg-type]
    with pytest.raises(Exception, match="NOT NULL"):
        store.replace([batch("a.md", 5, "new"), broken])
    assert [(s.source, s.chunks, s.content_hash) for s in store.sources()] == [("a.md", 2, "h")]
    assert store.generations().store == 1
    assert store.delta(-1, 0).added.tolist() == [1, 2]


def test_lexical_generation_is_recorded(store: ChunkStore) -> None:
    generation, _ = store.replace([batch("a.md", 1)])
    assert store.generations().lexical == 0
    store.set_lexical_generation(generation)
    assert store.generations().lexical == store.generations().store == 1
    assert store.meta()["embedder"] == "embedder" and store.meta()["dimension"] == "4"
