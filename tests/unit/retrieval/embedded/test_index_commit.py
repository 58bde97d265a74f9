"""The embedded index once its store has committed: the write has happened, whatever fails
after it, and searches never answer from a BM25 index left behind."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from chatqna.errors import IndexUnavailable
from chatqna.retrieval.embedded import lexical
from chatqna.retrieval.embedded.index import EmbeddedHybridIndex
from tests.unit.retrieval.embedded.test_index import (
    HARDWARE,
    POLICIES,
    batch,
    open_index,
    query,
    texts,
)

pytestmark = pytest.mark.anyio

NEW = "Zebras get refunds now."


@pytest.fixture
async def index(tmp_path: Path) -> EmbeddedHybridIndex:
    store = await open_index(tmp_path)
    await store.replace_sources(
        [batch("policies.md", POLICIES, "hash-p"), batch("hardware.md", HARDWARE, "hash-h")]
    )
    return store


def refuse_once(monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    """Make the next BM25 commit of a write fail with `error`; later ones work."""
    write = lexical.LexicalIndex.write

    def failing(self: lexical.LexicalIndex, *args: object, **kwargs: object) -> None:
        monkeypatch.setattr(lexical.LexicalIndex, "write", write)
        raise error

    monkeypatch.setattr(lexical.LexicalIndex, "write", failing)


@pytest.mark.parametrize(
    "error",
    [OSError(28, "No space left on device"), ValueError("tantivy: IoError"), RuntimeError("x")],
)
async def test_a_failed_bm25_commit_after_the_store_committed_is_a_completed_write(
    index: EmbeddedHybridIndex,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    error: Exception,
) -> None:
    refuse_once(monkeypatch, error)
    with caplog.at_level(logging.WARNING, logger="chatqna.retrieval.embedded.index"):
        await index.replace_sources([batch("policies.md", [NEW], "p2")])
    assert [r.getMessage() for r in caplog.records if r.exc_info and r.exc_info[1] is error] == [
        "the BM25 commit failed after the store committed"
    ]
    listing = {s.source: (s.chunks, s.content_hash) for s in await index.list_sources()}
    assert listing == {"policies.md": (1, "p2"), "hardware.md": (2, "hash-h")}
    # The BM25 index is rebuilt from the store before the next search: the new text is
    # found by both legs, the old text by neither.
    for searcher in (index, await open_index(tmp_path)):
        results = await searcher.search(query("zebras refunds", k=10))
        assert NEW in texts(results) and not set(POLICIES) & set(texts(results))
        assert next(r for r in results if r.chunk.text == NEW).scores["bm25"] > 0
        assert searcher.lexical.count() == 3


async def test_a_failed_bm25_commit_of_a_delete_is_a_completed_delete(
    index: EmbeddedHybridIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    refuse_once(monkeypatch, OSError(28, "No space left on device"))
    assert await index.delete_sources(["policies.md"]) == 3
    assert [s.source for s in await index.list_sources()] == ["hardware.md"]
    assert sorted(texts(await index.search(query("refund invoice courier", k=10)))) == sorted(
        HARDWARE
    )
    assert index.lexical.count() == 2


async def test_searches_are_refused_while_the_bm25_index_cannot_be_rebuilt(
    index: EmbeddedHybridIndex, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk stays full: the write stands, and a search fails (503) rather than answer
    from the BM25 index of before it, until a search or an open rebuilds it."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(lexical.LexicalIndex, "write", refuse)
    monkeypatch.setattr(lexical.LexicalIndex, "rebuild", refuse)
    await index.replace_sources([batch("policies.md", [NEW], "p2")])
    assert {s.source: s.chunks for s in await index.list_sources()}["policies.md"] == 1
    with pytest.raises(IndexUnavailable, match="No space left"):
        await index.search(query("zebras refunds", k=10))
    monkeypatch.undo()
    reopened = await open_index(tmp_path)  # rebuilds it as it opens
    for searcher in (reopened, index):
        results = await searcher.search(query("zebras refunds", k=10))
        assert next(r for r in results if r.chunk.text == NEW).scores["bm25"] > 0
        assert not set(POLICIES) & set(texts(results))
