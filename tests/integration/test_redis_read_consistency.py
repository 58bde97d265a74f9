"""A search's answer carries each passage at the version it was ranked at.

A hybrid search ranks in one round trip (on a cluster, one per primary) and reads the
passages in a second. Each test runs a write exactly between the two (the store's read,
wrapped), so no timing is involved: a replace that swaps a source's content under ranked
keys, one that does so before every read, and a delete of ranked passages; on one node and
on a cluster (3 primaries, no replicas), and a dense-only search on a cluster, which reads
its passages in a second round trip too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeAlias

import numpy as np
import pytest

from chatqna.backends.protocols import SearchQuery
from chatqna.documents import ScoredChunk
from chatqna.retrieval.redis.cluster import RedisClusterHybridIndex
from chatqna.retrieval.redis.store import RedisHybridIndex
from tests.integration.redis_server import RedisClusterProcesses
from tests.integration.test_redis_write_atomicity import (
    DIM,
    cluster,
    open_cluster,
    open_single,
    version,
)

pytestmark = [pytest.mark.slow, pytest.mark.anyio]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


__all__ = ["cluster"]  # the module's cluster fixture

Store: TypeAlias = RedisHybridIndex | RedisClusterHybridIndex


@pytest.fixture(params=["one node", "cluster"])
def open_store(request: pytest.FixtureRequest) -> Callable[[], Awaitable[Store]]:
    """Opens a store of an emptied server: one node, or a cluster."""
    if request.param == "cluster":
        running: RedisClusterProcesses = request.getfixturevalue("cluster")
        running.flushall()
        return lambda: open_cluster(running)
    url: str = request.getfixturevalue("redis_url")
    return lambda: open_single(url)


def between_rounds(
    store: Store, write: Callable[[int, Sequence[str]], Awaitable[None]]
) -> list[list[str]]:
    """Run `write(call, keys)` before each of `store`'s passage reads; the keys (on a
    cluster, the chunk ids) each read was asked for."""
    read = store._read
    asked: list[list[str]] = []

    async def write_then_read(*args: Any) -> list[dict[str, Any] | None]:
        keys = args[-1]
        asked.append(list(keys))
        await write(len(asked), keys)
        return await read(*args)

    store._read = write_then_read  # type: ignore[method-assign]
    return asked


def answer(results: list[ScoredChunk]) -> list[tuple[object, dict[str, float]]]:
    return [(r.chunk, r.scores) for r in results]


def zebraone() -> SearchQuery:
    return SearchQuery("zebraone", np.ones(DIM, np.float32), 4)


async def test_a_replace_between_ranking_and_reading_ranks_again(
    open_store: Callable[[], Awaitable[Store]],
) -> None:
    writer, reader = await open_store(), await open_store()
    try:
        await writer.replace_sources([version("a.md", 8, "one")])

        async def replace_once(call: int, keys: Sequence[str]) -> None:
            if call == 1:
                await writer.replace_sources([version("a.md", 4, "two")])

        asked = between_rounds(reader, replace_once)
        results = await reader.search(zebraone())
        reads = len(asked)
        # Version two holds no `zebraone`: its passages come back by the dense leg only.
        assert [r.chunk.text for r in results if r.scores["bm25"] > 0] == []
        assert {r.chunk.text.split()[0] for r in results} == {"two"}
        assert answer(results) == answer(await reader.search(zebraone()))
        assert reads == 2  # ranked again once the first read found other versions
    finally:
        await writer.aclose()
        await reader.aclose()


async def test_passages_changed_again_before_the_second_read_are_dropped(
    open_store: Callable[[], Awaitable[Store]],
) -> None:
    writer, reader = await open_store(), await open_store()
    try:
        await writer.replace_sources([version("a.md", 8, "one")])

        async def replace_every_time(call: int, keys: Sequence[str]) -> None:
            tag = "two" if call % 2 else "one"
            await writer.replace_sources([version("a.md", 8 if tag == "one" else 4, tag)])

        asked = between_rounds(reader, replace_every_time)
        results = await reader.search(zebraone())
        reads = len(asked)
        assert [r.chunk.text for r in results] == []  # each had changed since its ranking
        assert reads == 2  # one more ranking, no more
    finally:
        await writer.aclose()
        await reader.aclose()


async def test_a_delete_between_ranking_and_reading_still_answers_k_passages(
    open_store: Callable[[], Awaitable[Store]],
) -> None:
    writer, reader = await open_store(), await open_store()
    try:
        a, b = version("a.md", 4, "one"), version("b.md", 6, "one")
        await writer.replace_sources([a, b])
        query = SearchQuery("zebraone", a.embeddings[0], 4)

        async def delete_a(call: int, keys: Sequence[str]) -> None:
            if call == 1:
                assert any(key.endswith(a.chunks[0].id) for key in keys)
                await writer.delete_sources(["a.md"])

        asked = between_rounds(reader, delete_a)
        results = await reader.search(query)
        reads = len(asked)
        assert [r.chunk.source for r in results] == ["b.md"] * 4
        assert answer(results) == answer(await reader.search(query))
        assert reads == 2
    finally:
        await writer.aclose()
        await reader.aclose()


async def test_a_dense_search_on_a_cluster_ranks_again_after_a_replace(
    cluster: RedisClusterProcesses,
) -> None:
    cluster.flushall()
    writer, reader = await open_cluster(cluster), await open_cluster(cluster)
    try:
        one, three = version("a.md", 4, "one"), version("a.md", 4, "three")
        await writer.replace_sources([one])
        query = SearchQuery("", one.embeddings[0], 4, hybrid=False)

        async def replace_once(call: int, keys: Sequence[str]) -> None:
            if call == 1:
                await writer.replace_sources([three])

        asked = between_rounds(reader, replace_once)
        results = await reader.search(query)
        reads = len(asked)
        assert {r.chunk.text.split()[0] for r in results} == {"three"}
        assert answer(results) == answer(await reader.search(query))
        assert reads == 2
    finally:
        await writer.aclose()
        await reader.aclose()
