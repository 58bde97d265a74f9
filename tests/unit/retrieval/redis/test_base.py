"""What both Redis stores do alike: their options, the meta hash, `describe()`'s report, the
write lock around the writer, and closing (a failed open closes; closing waits for a write)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from chatqna.backends.protocols import SourceBatch
from chatqna.errors import IndexUnavailable, ServiceUnavailable
from chatqna.retrieval.redis.base import RedisIndexBase, check_options
from chatqna.retrieval.redis.schema import FORMAT_VERSION, IndexInfo

pytestmark = pytest.mark.anyio


def info(documents: int, indexing: bool, percent: float) -> IndexInfo:
    return IndexInfo(documents, indexing, percent, "4", has_terms=True, sortable_digest=True)


class MetaClient:
    """A client holding one hash: `hgetall` and `hset` of the meta."""

    def __init__(self, meta: dict[bytes, bytes] | None = None) -> None:
        self.hashes: dict[str, dict[Any, Any]] = {} if meta is None else {"rag:meta": meta}

    async def hgetall(self, key: str) -> dict[Any, Any]:
        return dict(self.hashes.get(key, {}))

    async def hset(self, key: str, mapping: dict[Any, Any]) -> None:
        self.hashes.setdefault(key, {}).update(mapping)


class Writer:
    """A writer whose replacement waits for `release`, recording what happened in order."""

    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def replace_sources(self, batches: Sequence[SourceBatch]) -> None:
        self.started.set()
        await self.release.wait()
        self.events.append("replaced")

    async def delete_sources(self, sources: Sequence[str] | None) -> int:
        raise RedisConnectionError("Connection refused")


class Store(RedisIndexBase):
    def __init__(self) -> None:
        super().__init__(
            embedder_name="e",
            dimension=4,
            index_name="rag",
            vector=None,
            rrf_k=60,
            rrf_candidates=50,
            location="redis://127.0.0.1:6379",
            chunk_prefix="rag:chunk:",
        )
        self.events: list[str] = []
        self.writer = Writer(self.events)

    async def _before_replace(self) -> None:
        self.events.append("before")

    async def _close_clients(self) -> None:
        self.events.append("closed")


def batch() -> SourceBatch:
    return SourceBatch("a.md", [], np.zeros((0, 4), np.float32), "h")


def test_options_below_one_are_named_in_the_order_given() -> None:
    check_options("rag", dimension=4, rrf_k=1, rrf_candidates=1)
    with pytest.raises(ValueError) as refused:
        check_options("rag", dimension=4, write_batch=0, rrf_k=60, rrf_candidates=50)
    said = "dimension, write_batch, rrf_k and rrf_candidates must be at least 1"
    assert str(refused.value) == said
    with pytest.raises(ValueError, match=r"^dimension, rrf_k and rrf_candidates must be"):
        check_options("rag", dimension=0, rrf_k=60, rrf_candidates=50)


@pytest.mark.parametrize("name", ["", "rag redis", "rag\tindex"])
def test_an_index_name_redisearch_cannot_take_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="invalid index name"):
        check_options(name, dimension=4, rrf_k=60, rrf_candidates=50)


async def test_the_meta_is_written_for_this_embedder_and_read_back() -> None:
    store, client = Store(), MetaClient()
    assert await store._checked_meta(client) == {}  # type: ignore[arg-type]
    await store._write_meta(client)  # type: ignore[arg-type]
    assert client.hashes["rag:meta"] == {"embedder": "e", "dimension": 4, "format": FORMAT_VERSION}


async def test_a_meta_written_for_another_embedder_is_refused() -> None:
    meta = {b"embedder": b"other", b"dimension": b"4", b"format": FORMAT_VERSION.encode()}
    with pytest.raises(IndexUnavailable, match="built with embedder 'other'"):
        await Store()._checked_meta(MetaClient(meta))  # type: ignore[arg-type]


def test_one_node_is_described_as_its_one_index() -> None:
    described = Store()._description("redis", [info(7, True, 0.5)], 2)
    assert described == {
        "kind": "redis",
        "url": "redis://127.0.0.1:6379",
        "index": "rag",
        "chunks": 7,
        "sources": 2,
        "dimension": 4,
        "algorithm": "HNSW",
        "indexing": True,
        "percent_indexed": 0.5,
    }


def test_a_cluster_is_described_as_the_sum_of_its_primaries_indexes() -> None:
    infos = [info(7, False, 1.0), info(5, True, 0.25)]
    described = Store()._description("redis-cluster", infos, 3, primaries=["a:1", "b:2"])
    assert list(described)[:4] == ["kind", "url", "index", "primaries"]
    assert described["primaries"] == ["a:1", "b:2"]
    assert (described["chunks"], described["indexing"], described["percent_indexed"]) == (
        12,
        True,
        0.25,
    )


async def test_a_replacement_runs_the_stores_own_step_first() -> None:
    store = Store()
    store.writer.release.set()
    await store.replace_sources([batch()])
    assert store.events == ["before", "replaced"]


async def test_a_batch_that_does_not_fit_the_dimension_is_refused_before_any_write() -> None:
    store = Store()
    wrong = SourceBatch("a.md", [], np.zeros((0, 3), np.float32), "h")
    with pytest.raises(ValueError, match="embeddings do not match"):
        await store.replace_sources([wrong])
    assert store.events == []


async def test_a_failed_write_is_reported_as_the_index_unavailable() -> None:
    with pytest.raises(IndexUnavailable, match=r"'rag' at redis://127\.0\.0\.1:6379: deleting"):
        await Store().delete_sources(None)


async def test_closing_waits_for_the_write_in_progress_then_refuses_work() -> None:
    store = Store()
    write = asyncio.create_task(store.replace_sources([batch()]))
    await store.writer.started.wait()
    closing = asyncio.create_task(store.aclose())
    await asyncio.sleep(0)
    assert "closed" not in store.events  # the write holds the lock
    store.writer.release.set()
    await asyncio.gather(write, closing)
    assert store.events == ["before", "replaced", "closed"]
    with pytest.raises(ServiceUnavailable, match=r"'rag' is closed"):
        await store.replace_sources([batch()])


async def test_a_failed_open_closes_the_clients_and_raises() -> None:
    store = Store()
    with pytest.raises(IndexUnavailable, match="refused"):
        async with store._closed_on_failure():
            raise IndexUnavailable("refused")
    assert store.events == ["closed"]
    async with store._closed_on_failure():
        pass
    assert store.events == ["closed"]
