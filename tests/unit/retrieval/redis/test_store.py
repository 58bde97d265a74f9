"""The single-node Redis store once it is closed: work is refused as the service shutting
down, not sent over connections the closed clients would open again."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from chatqna.backends.protocols import SearchQuery, SourceBatch
from chatqna.errors import IndexUnavailable, ServiceUnavailable
from chatqna.retrieval.redis.store import RedisHybridIndex, connect

pytestmark = pytest.mark.anyio

QUERY = SearchQuery("refund", np.ones(4, np.float32), 4)


class ClosingPipeline:
    """A pipeline whose round trip is under way until its client is closed, and then fails
    as redis-py's does when its connection is cut."""

    def __init__(self, closed: asyncio.Event) -> None:
        self.closed = closed
        self.started = asyncio.Event()

    def execute_command(self, *args: Any) -> None:
        return None

    async def execute(self) -> list[Any]:
        self.started.set()
        await self.closed.wait()
        raise RedisConnectionError("Connection closed by server.")


class ClosingClient:
    """Stands in for both clients of the store; `aclose` cuts the round trip under way."""

    def __init__(self) -> None:
        self.closed = asyncio.Event()
        self.pipe = ClosingPipeline(self.closed)

    def pipeline(self, transaction: bool = False) -> ClosingPipeline:
        return self.pipe

    async def aclose(self) -> None:
        self.closed.set()


def closed_store_calls(index: RedisHybridIndex) -> dict[str, Callable[[], Awaitable[object]]]:
    return {
        "search": lambda: index.search(QUERY),
        "dense search": lambda: index.search(
            SearchQuery("refund", np.ones(4, np.float32), 4, False)
        ),
        "list_sources": index.list_sources,
        "describe": index.describe,
        "ensure_index": index.ensure_index,
        "replace_sources": lambda: index.replace_sources(
            [SourceBatch("a.md", [], np.zeros((0, 4), np.float32), "h")]
        ),
        "delete_sources": lambda: index.delete_sources(None),
    }


async def test_work_that_reaches_a_closed_store_is_refused_as_a_shutdown() -> None:
    # Clients of a port nothing listens on (and unit tests may not connect anyway): the
    # refusal must come before any connection is tried.
    url = "redis://127.0.0.1:1"
    client = connect(url, 1.0, socket_timeout=1.0)
    index = RedisHybridIndex(
        client, transactions=connect(url, 1.0, socket_timeout=None), embedder_name="e", dimension=4
    )
    await index.aclose()
    for name, call in closed_store_calls(index).items():
        with pytest.raises(ServiceUnavailable, match=r"'rag-redis' is closed") as refused:
            await call()
        assert refused.value.envelope()["error"] == "service_unavailable", name


async def test_a_search_under_way_when_the_store_closes_is_refused_as_a_shutdown() -> None:
    fake = ClosingClient()
    index = RedisHybridIndex(
        fake,  # type: ignore[arg-type]
        transactions=fake,  # type: ignore[arg-type]
        embedder_name="e",
        dimension=4,
    )
    search = asyncio.create_task(index.search(QUERY))
    await fake.pipe.started.wait()
    await index.aclose()
    with pytest.raises(ServiceUnavailable) as refused:
        await search
    assert isinstance(refused.value.__cause__, RedisConnectionError)


async def test_a_store_that_is_open_still_reports_a_lost_connection_as_unavailable() -> None:
    fake = ClosingClient()
    index = RedisHybridIndex(
        fake,  # type: ignore[arg-type]
        transactions=fake,  # type: ignore[arg-type]
        embedder_name="e",
        dimension=4,
    )
    fake.closed.set()  # the server went away; the store itself was not closed
    with pytest.raises(IndexUnavailable, match="search failed"):
        await index.search(QUERY)
