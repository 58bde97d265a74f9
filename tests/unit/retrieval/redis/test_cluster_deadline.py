"""The cluster store's search of every primary is bounded by its timeout as a whole."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest

from chatqna.backends.protocols import SearchQuery
from chatqna.errors import IndexUnavailable
from chatqna.retrieval.redis.cluster import RedisClusterHybridIndex
from chatqna.retrieval.redis.topology import Shard

pytestmark = pytest.mark.anyio

SHARDS = [
    Shard("a1", "127.0.0.1", 7000, "idx-shard-{a}", frozenset({1}), replicas=0),
    Shard("b2", "127.0.0.1", 7001, "idx-shard-{b}", frozenset({2}), replicas=0),
]


class SlowPipeline:
    """A node's pipeline that answers each round trip after `seconds` (under any socket
    timeout, so only a bound on the whole search can stop it)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def execute_command(self, *args: Any) -> None:
        return None

    async def execute(self) -> list[Any]:
        await asyncio.sleep(self.seconds)
        raise AssertionError("the search should have been stopped by then")


class SlowNode:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def pipeline(self, transaction: bool = False) -> SlowPipeline:
        return SlowPipeline(self.seconds)


async def test_a_slow_primary_fails_the_search_once_the_timeout_has_passed() -> None:
    index = RedisClusterHybridIndex(
        None,  # type: ignore[arg-type]  # the cluster client only serves opening the store
        "redis://127.0.0.1:7000",
        embedder_name="e",
        dimension=4,
        timeout_seconds=0.2,
    )
    index.topology.primaries, index.topology.stale = SHARDS, False
    index.topology.client = lambda address: SlowNode(5.0)  # type: ignore[method-assign]
    started = time.monotonic()
    with pytest.raises(IndexUnavailable, match=r"within 0\.2 s"):
        await index.search(SearchQuery("refund", np.ones(4, np.float32), 4))
    assert time.monotonic() - started < 1.0
