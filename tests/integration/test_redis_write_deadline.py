"""A write is waited for as long as its size needs, and no longer.

Redis indexes a transaction's (or a cluster write script's) chunks before it answers (about
0.3-1.2 ms a chunk of 384 dimensions in HNSW, on 2 cores): the client waits up to the
store's timeout plus an allowance per chunk key, so a large write is not reported failed
while Redis applies it whole, and a server that does not answer still fails the write.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator

import pytest
import redis

from chatqna.errors import IndexUnavailable
from chatqna.retrieval.redis.cluster import RedisClusterHybridIndex
from chatqna.retrieval.redis.store import RedisHybridIndex, VectorIndexParams
from chatqna.retrieval.redis.writes import transaction_deadline
from tests.integration.redis_server import (
    RedisClusterProcesses,
    RedisStackProcess,
)
from tests.integration.test_redis_write_atomicity import DIM, cluster_count, count, version

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

TIMEOUT = 0.5  # the store's timeout: every other call here answers well within it
LARGE = 30_000  # chunks: indexing them in HNSW takes seconds, several times TIMEOUT


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def node(redis_stack: RedisStackProcess) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(redis_stack.url, protocol=2) as client:
        client.flushall()
        client.config_resetstat()
        yield client
        client.execute_command("CLIENT", "UNPAUSE")


def in_multi(client: redis.Redis) -> bool:
    """Whether some client has sent its `MULTI` and not had its `EXEC` answered."""
    return any("x" in str(c.get("flags", "")) for c in client.client_list())


def exec_seconds(client: redis.Redis) -> float:
    """The time the server spent in `EXEC`s since the stats were reset."""
    return int(client.info("commandstats").get("cmdstat_exec", {}).get("usec", 0)) / 1e6


async def test_a_transaction_longer_than_the_timeout_is_waited_for(
    redis_stack: RedisStackProcess, node: redis.Redis
) -> None:
    index = await RedisHybridIndex.open(
        redis_stack.url, embedder_name="e", dimension=DIM, timeout_seconds=TIMEOUT
    )
    try:
        await index.replace_sources([version("large.txt", LARGE, "v1")])
        assert exec_seconds(node) > 2 * TIMEOUT  # the EXEC did outlast the timeout
        assert count(node, "rag-redis", "v1") == LARGE
        (listed,) = await index.list_sources()
        assert (listed.chunks, listed.content_hash) == (LARGE, "hash-v1")
        assert await index.delete_sources(None) == LARGE
        assert count(node, "rag-redis", "v1") == 0 and await index.list_sources() == []
    finally:
        await index.aclose()


async def test_a_transaction_the_server_does_not_answer_fails_at_its_deadline(
    redis_stack: RedisStackProcess, node: redis.Redis
) -> None:
    index = await RedisHybridIndex.open(
        redis_stack.url, embedder_name="e", dimension=DIM, timeout_seconds=TIMEOUT
    )
    try:
        node.execute_command("CLIENT", "PAUSE", 10_000, "WRITE")  # EXEC waits; reads do not
        start = time.monotonic()
        with pytest.raises(IndexUnavailable, match="transaction of 3 chunk keys"):
            await index.replace_sources([version("small.txt", 3, "v2")])
        waited = time.monotonic() - start
        assert transaction_deadline(TIMEOUT, 3) <= waited < transaction_deadline(TIMEOUT, 3) + 1
        node.execute_command("CLIENT", "UNPAUSE")
        await asyncio.sleep(0.2)  # the server runs what it held
        # The EXEC was sent: Redis applies it whole or, the client gone, not at all.
        assert (count(node, "rag-redis", "v2"), len(await index.list_sources())) in [(0, 0), (3, 1)]
    finally:
        await index.aclose()


async def test_a_server_that_stops_answering_mid_transaction_fails_the_write_in_time(
    redis_stack: RedisStackProcess, node: redis.Redis
) -> None:
    """The `EXEC` is held, then the server stops (SIGSTOP) before the deadline: the write
    still fails by its deadline plus the timeout (redis-py's reset after a cancelled
    transaction sends an `UNWATCH`, on a new connection, that nothing would answer)."""
    assert redis_stack.process is not None
    index = await RedisHybridIndex.open(
        redis_stack.url, embedder_name="e", dimension=DIM, timeout_seconds=TIMEOUT
    )
    try:
        node.execute_command("CLIENT", "PAUSE", 10_000, "WRITE")
        start = time.monotonic()
        writing = asyncio.create_task(index.replace_sources([version("small.txt", 3, "v3")]))
        while not in_multi(node) and not writing.done():
            await asyncio.sleep(0.01)
        redis_stack.process.send_signal(signal.SIGSTOP)
        with pytest.raises(IndexUnavailable):
            await asyncio.wait_for(writing, 10)
        assert time.monotonic() - start < transaction_deadline(TIMEOUT, 3) + TIMEOUT + 1
    finally:
        redis_stack.process.send_signal(signal.SIGCONT)
        await index.aclose()


def script_seconds(port: int) -> float:
    """The time a node spent in `EVAL`s since its stats were reset."""
    with redis.Redis(port=port, protocol=2) as client:
        return int(client.info("commandstats").get("cmdstat_eval", {}).get("usec", 0)) / 1e6


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterProcesses]:
    # A node timeout longer than the write: a primary busy in a script answers no gossip,
    # and one silent for a node timeout would be failed over.
    directory = tmp_path_factory.mktemp("cluster")
    running = RedisClusterProcesses(directory, replicas=1, node_timeout_ms=30_000)
    try:
        running.start()
        yield running
    finally:
        running.stop()


async def test_a_cluster_write_longer_than_the_timeout_is_waited_for_and_replicated(
    cluster: RedisClusterProcesses,
) -> None:
    index = await RedisClusterHybridIndex.open(
        cluster.url,
        embedder_name="e",
        dimension=DIM,
        vector=VectorIndexParams(algorithm="HNSW"),
        timeout_seconds=TIMEOUT,
    )
    try:
        for primary in cluster.primary_nodes():
            with redis.Redis(port=primary.port, protocol=2) as client:
                client.config_resetstat()
        await index.replace_sources([version("large.txt", LARGE, "v1")])
        assert max(script_seconds(p.port) for p in cluster.primary_nodes()) > 2 * TIMEOUT
        assert cluster_count(cluster, "v1") == LARGE
        (listed,) = await index.list_sources()
        assert (listed.chunks, listed.content_hash) == (LARGE, "hash-v1")
        assert await index.delete_sources(["large.txt"]) == LARGE
        assert cluster_count(cluster, "v1") == 0
    finally:
        await index.aclose()
