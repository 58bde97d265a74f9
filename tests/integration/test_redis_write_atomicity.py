"""A failed or killed write never leaves a half-written Redis index.

One node: a replace that Redis refuses part-way (out of memory) and one whose writing
process is killed mid-transaction leave the old version whole. A cluster: two processes
replacing one source at once leave no orphan chunk, a start with the wrong dimension does
not write its meta. On both, `POST /v1/dataprep/delete` removes a source that has chunks
whatever the listing says.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import numpy as np
import pytest
import redis

from chatqna.app import create_app
from chatqna.backends.bundle import Backends
from chatqna.backends.fakes import HashingEmbedder, RecordingReranker, ScriptedLLM
from chatqna.backends.protocols import Retriever, SourceBatch
from chatqna.composition import build_translator
from chatqna.documents import Chunk, chunk_id_for
from chatqna.errors import IndexUnavailable
from chatqna.retrieval.redis.cluster import RedisClusterHybridIndex
from chatqna.retrieval.redis.cluster_layout import ClusterLayout
from chatqna.retrieval.redis.store import RedisHybridIndex, VectorIndexParams
from chatqna.retrieval.redis.writes import chunk_hash
from chatqna.settings import Settings
from tests.integration.redis_server import (
    REPO,
    RedisClusterProcesses,
    RedisStackProcess,
)
from tests.unit.conftest import TRACER_PROVIDER

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

DIM = 16
EXACT = VectorIndexParams(algorithm="FLAT")


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def version(source: str, chunks: int, tag: str, filler: int = 0) -> SourceBatch:
    """A source's version `tag`: every chunk says `zebra<tag>`, so a search counts them."""
    rng = np.random.default_rng(len(tag) + chunks)
    padding = " filler" * filler
    items = [
        Chunk(chunk_id_for(source, i), f"{tag} passage {i} zebra{tag}{padding}", source, source, i)
        for i in range(chunks)
    ]
    vectors = rng.standard_normal((chunks, DIM)).astype(np.float32)
    return SourceBatch(source, items, vectors, content_hash=f"hash-{tag}")


def count(client: Any, index: str, tag: str) -> int:
    """How many passages of version `tag` the RediSearch index `index` holds."""
    return int(client.execute_command("FT.SEARCH", index, f"@terms:zebra{tag}", "LIMIT", 0, 0)[0])


async def open_single(url: str) -> RedisHybridIndex:
    return await RedisHybridIndex.open(url, embedder_name="e", dimension=DIM, vector=EXACT)


async def dataprep(retriever: Retriever, tmp_path: Path, body: dict[str, str]) -> httpx2.Response:
    """`POST /v1/dataprep/delete` with `body`, through the app with `retriever`."""
    settings = Settings(chatqna_data_dir=tmp_path / "data", _env_file=None)
    chat = ScriptedLLM()
    backends = Backends(
        embedder=HashingEmbedder(DIM),
        retriever=retriever,
        reranker=RecordingReranker(),
        llm=chat,
        condense_llm=chat,
        translator=build_translator(settings, chat),
    )
    app = create_app(settings, backends, tracer_provider=TRACER_PROVIDER)
    async with (
        app.router.lifespan_context(app),
        httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app), base_url="http://localhost"
        ) as client,
    ):
        return await client.post("/v1/dataprep/delete", json=body)


# --- one node ------------------------------------------------------------------------------
@pytest.fixture
def node(redis_stack: RedisStackProcess) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(redis_stack.url, protocol=2) as client:
        client.flushall()
        yield client
        client.config_set("maxmemory", 0)


async def test_a_replace_refused_for_memory_part_way_leaves_the_old_version(
    redis_stack: RedisStackProcess, node: redis.Redis
) -> None:
    index = await open_single(redis_stack.url)
    try:
        await index.replace_sources([version("manual.txt", 2000, "v1")])
        # Room for a part of the new version only: the old code wrote 300-odd chunks of it.
        node.config_set("maxmemory", int(node.info("memory")["used_memory"]) + 600_000)
        with pytest.raises(IndexUnavailable):
            await index.replace_sources([version("manual.txt", 2000, "v2", filler=40)])
        node.config_set("maxmemory", 0)
        assert (count(node, "rag-redis", "v1"), count(node, "rag-redis", "v2")) == (2000, 0)
        (listed,) = await index.list_sources()
        assert (listed.chunks, listed.content_hash) == (2000, "hash-v1")
    finally:
        await index.aclose()


WRITER = """
import asyncio, sys
sys.path.insert(0, {repo!r})
from tests.integration.test_redis_write_atomicity import open_single, version

async def main() -> None:
    index = await open_single(sys.argv[1])
    await index.replace_sources([version(sys.argv[2], {chunks}, sys.argv[3])])
    await index.aclose()

asyncio.run(main())
"""
KILLED_CHUNKS = 20_000


def in_transaction(client: redis.Redis) -> bool:
    """Whether some client has commands queued in a `MULTI`."""
    return any(int(c.get("multi", -1)) > 0 for c in client.client_list())


def kill_mid_write(url: str, client: redis.Redis, source: str, tag: str) -> bool:
    """Start a process replacing `source` with version `tag` and SIGKILL it once its
    transaction is being queued or a passage of `tag` is searchable; whether it was the
    former."""
    code = WRITER.format(repo=str(REPO), chunks=KILLED_CHUNKS)
    child = subprocess.Popen([sys.executable, "-c", code, url, source, tag], cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while child.poll() is None and time.monotonic() < deadline:
            queued = in_transaction(client)
            if queued or count(client, "rag-redis", tag) > 0:
                child.send_signal(signal.SIGKILL)
                child.wait(timeout=10)
                return queued
            time.sleep(0.001)
        raise AssertionError(f"the writer ended before it was killed ({child.returncode})")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)


async def test_a_killed_writer_leaves_every_source_whole(
    redis_stack: RedisStackProcess, node: redis.Redis
) -> None:
    index = await open_single(redis_stack.url)
    try:
        await index.replace_sources([version("manual.txt", KILLED_CHUNKS, "v1")])
        replaced_mid_write = kill_mid_write(redis_stack.url, node, "manual.txt", "v2")
        added_mid_write = kill_mid_write(redis_stack.url, node, "new.txt", "v3")
        await asyncio.sleep(0.2)  # the server notices the closed connections
        old, new = count(node, "rag-redis", "v1"), count(node, "rag-redis", "v2")
        listed = {s.source: (s.chunks, s.content_hash) for s in await index.list_sources()}
        whole_old = (old, new, listed["manual.txt"]) == (
            KILLED_CHUNKS,
            0,
            (KILLED_CHUNKS, "hash-v1"),
        )
        whole_new = (old, new, listed["manual.txt"]) == (
            0,
            KILLED_CHUNKS,
            (KILLED_CHUNKS, "hash-v2"),
        )
        assert whole_old or whole_new, (old, new, listed)
        added = count(node, "rag-redis", "v3")
        assert (added, listed.get("new.txt")) in [
            (0, None),
            (KILLED_CHUNKS, (KILLED_CHUNKS, "hash-v3")),
        ]
        assert replaced_mid_write and added_mid_write  # killed inside the transaction
    finally:
        await index.aclose()


async def test_delete_removes_a_source_that_is_not_listed(
    redis_stack: RedisStackProcess, node: redis.Redis, tmp_path: Path
) -> None:
    index = await open_single(redis_stack.url)
    try:
        await index.replace_sources([version("kept.txt", 3, "v1"), version("lost.txt", 5, "v2")])
        node.srem("rag-redis:sources", "lost.txt")  # the listing the delete reads lacks it
        assert [s.source for s in await index.list_sources()] == ["kept.txt"]
        reply = await dataprep(index, tmp_path, {"file_path": "lost.txt"})
        assert (reply.status_code, reply.json()["removed_chunks"]) == (200, 5)
        assert count(node, "rag-redis", "v2") == 0 and not node.keys("*lost.txt*")
        missing = await dataprep(index, tmp_path, {"file_path": "lost.txt"})
        assert missing.status_code == 404
        assert count(node, "rag-redis", "v1") == 3
    finally:
        await index.aclose()


# --- a cluster -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterProcesses]:
    running = RedisClusterProcesses(tmp_path_factory.mktemp("cluster"), replicas=0)
    try:
        running.start()
        yield running
    finally:
        running.stop()


async def open_cluster(
    cluster: RedisClusterProcesses, dimension: int = DIM
) -> RedisClusterHybridIndex:
    return await RedisClusterHybridIndex.open(
        cluster.url, embedder_name="e", dimension=dimension, vector=EXACT
    )


def cluster_count(cluster: RedisClusterProcesses, tag: str) -> int:
    total = 0
    for primary in cluster.primary_nodes():
        with redis.Redis(port=primary.port, protocol=2) as client:
            (name,) = client.execute_command("FT._LIST")
            total += count(client, name, tag)
    return total


def chunk_keys(cluster: RedisClusterProcesses) -> int:
    total = 0
    for primary in cluster.primary_nodes():
        with redis.Redis(port=primary.port, protocol=2) as client:
            total += len(client.keys("rag-redis:chunk:*"))
    return total


async def test_concurrent_replacers_on_a_cluster_leave_no_orphan(
    cluster: RedisClusterProcesses,
) -> None:
    cluster.flushall()
    one, other = await open_cluster(cluster), await open_cluster(cluster)
    try:
        await one.replace_sources([version("race.txt", 10, "v0")])
        # Two workers, each with its own write lock, replace the same source at once.
        await asyncio.gather(
            one.replace_sources([version("race.txt", 300, "big")]),
            other.replace_sources([version("race.txt", 100, "small")]),
        )
        (listed,) = await one.list_sources()
        assert chunk_keys(cluster) == listed.chunks
        big, small = cluster_count(cluster, "big"), cluster_count(cluster, "small")
        assert (big, small) in [(300, 0), (0, 100)]
        assert listed.content_hash == ("hash-big" if big else "hash-small")
        assert await one.delete_sources(["race.txt"]) == listed.chunks
        assert chunk_keys(cluster) == 0 and await one.list_sources() == []
    finally:
        await one.aclose()
        await other.aclose()


async def test_delete_on_a_cluster_removes_a_source_that_is_not_listed(
    cluster: RedisClusterProcesses, tmp_path: Path
) -> None:
    cluster.flushall()
    index = await open_cluster(cluster)
    try:
        await index.replace_sources([version("kept.txt", 3, "v1"), version("lost.txt", 5, "v2")])
        layout = ClusterLayout("rag-redis")
        await index.cluster.srem(layout.membership_key("lost.txt"), "lost.txt")
        assert [s.source for s in await index.list_sources()] == ["kept.txt"]
        reply = await dataprep(index, tmp_path, {"file_path": "lost.txt"})
        assert (reply.status_code, reply.json()["removed_chunks"]) == (200, 5)
        assert cluster_count(cluster, "v2") == 0 and chunk_keys(cluster) == 3
        assert (await dataprep(index, tmp_path, {"file_path": "lost.txt"})).status_code == 404
    finally:
        await index.aclose()


async def test_a_misconfigured_start_on_a_cluster_writes_no_meta(
    cluster: RedisClusterProcesses,
) -> None:
    cluster.flushall()
    index = await open_cluster(cluster)
    await index.aclose()
    with redis.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port, protocol=2) as client:
        client.delete("rag-redis:meta")  # the meta's primary lost its data
        with pytest.raises(IndexUnavailable, match="16 dimensions"):
            await open_cluster(cluster, dimension=2 * DIM)
        assert client.hgetall("rag-redis:meta") == {}
        index = await open_cluster(cluster)
        await index.aclose()
        assert client.hgetall("rag-redis:meta")[b"dimension"] == str(DIM).encode()


def source_state(
    cluster: RedisClusterProcesses, listed: dict[str, tuple[int, str]], source: str, tag: str
) -> str:
    """`whole` (listed, its chunk set, chunks and searchable passages all version `tag`'s),
    `gone` (no key of it anywhere, nothing searchable, not listed), or what it is instead."""
    layout = ClusterLayout("rag-redis")
    chunk_prefix = layout.chunk_key_prefix(source)
    chunks = 0
    for primary in cluster.primary_nodes():
        with redis.Redis(port=primary.port, protocol=2) as client:
            chunks += len(client.keys(chunk_prefix + "*"))
    with redis.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port, protocol=2) as client:
        members = int(client.scard(layout.source_chunks_key(source)))
        hashed = int(client.exists(layout.source_key(source)))
    entry = listed.get(source)
    found = (entry, chunks, members, hashed, cluster_count(cluster, tag))
    if found == (None, 0, 0, 0, 0):
        return "gone"
    if found == ((chunks, f"hash-{tag}"), chunks, chunks, 1, chunks) and chunks > 0:
        return "whole"
    return repr(found)


RACE_ROUNDS = 8
LOST_SOURCES = 60


async def plant_unlisted(index: RedisClusterHybridIndex, layout: ClusterLayout) -> None:
    """Chunks no listing names, as an earlier version's cut-off writes left them: sources
    `lost-<n>.txt` (version `lost`) not listed, and a chunk of `race.txt` (version `old`) that
    its chunk set does not name."""
    lost = [version(f"lost-{n}.txt", 5, "lost") for n in range(LOST_SOURCES)]
    await index.replace_sources(lost)
    for batch in lost:
        await index.cluster.srem(layout.membership_key(batch.source), batch.source)
    stray = version("race.txt", 201, "old")
    chunk, vector = stray.chunks[-1], stray.embeddings[-1].tobytes()
    fields = chunk_hash(chunk, vector, "stray")
    await index.cluster.hset(layout.chunk_key("race.txt", chunk.id), mapping=fields)


async def race_delete_all(cluster: RedisClusterProcesses, wait_for: int | None) -> tuple[str, str]:
    """On an emptied cluster: unlisted chunks (`plant_unlisted`), and `race.txt`. One worker
    deletes everything while another replaces `race.txt` and adds `added.txt`: at once, or
    once the delete has swept the chunks of `lost-<wait_for>.txt` (the sweep's order is the
    SCAN's). What became of the two, by `source_state`."""
    cluster.flushall()
    deleter, writer = await open_cluster(cluster), await open_cluster(cluster)
    layout = ClusterLayout("rag-redis")
    try:
        await writer.replace_sources([version("race.txt", 200, "old")])
        await plant_unlisted(writer, layout)
        deleting = asyncio.create_task(deleter.delete_sources(None))
        if wait_for is not None:
            lost = version(f"lost-{wait_for}.txt", 5, "lost").chunks
            watched = [layout.chunk_key(c.source, c.id) for c in lost]
            while await writer.cluster.exists(*watched) and not deleting.done():
                await asyncio.sleep(0.0005)
        await asyncio.gather(
            writer.replace_sources([version("race.txt", 150, "new")]),
            writer.replace_sources([version("added.txt", 120, "added")]),
        )
        await deleting
        listed = {s.source: (s.chunks, s.content_hash) for s in await writer.list_sources()}
    finally:
        await deleter.aclose()
        await writer.aclose()
    assert set(listed) <= {"race.txt", "added.txt"}
    assert (cluster_count(cluster, "old"), cluster_count(cluster, "lost")) == (0, 0)
    return (
        source_state(cluster, listed, "race.txt", "new"),
        source_state(cluster, listed, "added.txt", "added"),
    )


async def test_delete_all_racing_writers_on_a_cluster_leaves_each_source_whole_or_gone(
    cluster: RedisClusterProcesses,
) -> None:
    """Deleting everything while other workers replace one source and add another: each of
    the two ends listed with exactly its new version's chunks (the write came last), or with
    no key left at all (the delete did); never searchable but unlisted, or listed but short.
    Unlisted chunks make the delete sweep for a while, so most writes land in the middle of
    that."""
    outcomes = [
        await race_delete_all(cluster, None if n % 4 == 0 else n * 7) for n in range(RACE_ROUNDS)
    ]
    assert all(set(outcome) <= {"whole", "gone"} for outcome in outcomes), outcomes
