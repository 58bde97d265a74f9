"""The cluster store through faults: a primary killed during searches and writes, and a
slot migration during searches. Each test has a cluster of its own (3 primaries, 3
replicas, `cluster-node-timeout` 1 s) and random unit vectors (no embedder).

A killed primary fails searches and writes with `IndexUnavailable` (HTTP 503) until its
replica is promoted (failure detection after the node timeout, then an election), then
searches succeed again and every write acknowledged before, during or after is there. A
migration never makes a search return a passage twice or miss one.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import redis
import redis.asyncio as aioredis

from chatqna.backends.protocols import SearchQuery, SourceBatch
from chatqna.documents import Chunk, chunk_id_for
from chatqna.errors import IndexUnavailable
from chatqna.retrieval.redis.cluster import RedisClusterHybridIndex
from chatqna.retrieval.redis.cluster_layout import source_slot
from chatqna.retrieval.redis.store import VectorIndexParams
from tests.integration.redis_server import (
    CLUSTER_NODE_TIMEOUT_MS,
    RedisClusterProcesses,
    RedisStackProcess,
    migrate_slots,
    redis_cluster,
)

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

DIMENSION = 32
WORDS = [f"w{i}" for i in range(300)]
# Failure detection (the node timeout, then up to twice that for the failure reports to
# spread) plus the replica's election delay (0.5-1 s) and a few topology rereads.
FAILOVER_BOUND_SECONDS = 4 * CLUSTER_NODE_TIMEOUT_MS / 1000 + 6


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterProcesses]:
    with redis_cluster(tmp_path_factory.mktemp("cluster")) as running:
        yield running


@pytest.fixture
def slow_failover_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RedisClusterProcesses]:
    """A cluster that takes several seconds to fail a silent primary over, so calls that time
    out against it do so before the failover, also on a loaded machine."""
    with redis_cluster(tmp_path_factory.mktemp("cluster"), node_timeout_ms=5000) as running:
        yield running


def source_batch(rng: np.random.Generator, name: str, chunks: int = 10) -> SourceBatch:
    passages = [" ".join(rng.choice(WORDS, 20)) for _ in range(chunks)]
    rows = [Chunk(chunk_id_for(name, i), text, name, "", i) for i, text in enumerate(passages)]
    vectors = rng.standard_normal((chunks, DIMENSION)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return SourceBatch(name, rows, vectors, f"hash-{name}")


async def open_store(
    cluster: RedisClusterProcesses, timeout_seconds: float = 2.0
) -> RedisClusterHybridIndex:
    return await RedisClusterHybridIndex.open(
        cluster.url,
        embedder_name="random",
        dimension=DIMENSION,
        vector=VectorIndexParams(algorithm="FLAT"),
        timeout_seconds=timeout_seconds,
    )


def unit(rng: np.random.Generator) -> np.ndarray:
    vector = rng.standard_normal(DIMENSION).astype(np.float32)
    return vector / np.linalg.norm(vector)


async def test_a_primary_killed_during_searches_fails_over(
    cluster: RedisClusterProcesses,
) -> None:
    rng = np.random.default_rng(7)
    store = await open_store(cluster)
    try:
        await store.replace_sources([source_batch(rng, f"s{i:02d}.md") for i in range(20)])
        acknowledged = {f"s{i:02d}.md" for i in range(20)}
        events: list[tuple[float, str]] = []  # (time, "ok" or the error's type)
        stop = asyncio.Event()

        async def search_loop() -> None:
            while not stop.is_set():
                query = SearchQuery(" ".join(rng.choice(WORDS, 3)), unit(rng), 10)
                try:
                    results = await store.search(query)
                    assert len(results) == 10 and len({r.chunk.id for r in results}) == 10
                    events.append((time.monotonic(), "ok"))
                except IndexUnavailable as exc:
                    assert exc.status_code == 503
                    events.append((time.monotonic(), "503"))
                    await asyncio.sleep(0.05)

        async def write_loop() -> None:
            number = 0
            while not stop.is_set():
                name = f"w{number:03d}.md"
                number += 1
                try:
                    await store.replace_sources([source_batch(rng, name, 3)])
                    acknowledged.add(name)
                except IndexUnavailable:
                    await asyncio.sleep(0.05)
                await asyncio.sleep(0.01)

        tasks = [asyncio.create_task(search_loop()), asyncio.create_task(write_loop())]
        await asyncio.sleep(0.5)
        victim = next(
            n for n in cluster.primary_nodes() if n.port == store.topology.primaries[0].port
        )
        killed_at = time.monotonic()
        victim.kill()
        deadline = killed_at + FAILOVER_BOUND_SECONDS + 10
        while time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            recent = [outcome for at, outcome in events if at > time.monotonic() - 1.0]
            failed = any(at > killed_at and o != "ok" for at, o in events)
            if failed and recent.count("ok") > 20 and all(o == "ok" for o in recent):
                break
        await asyncio.sleep(1.0)
        stop.set()
        await asyncio.gather(*tasks)
        failures = [at for at, outcome in events if outcome != "ok"]
        assert failures, "killing a primary failed no search: it was not searched"
        window = max(failures) - killed_at
        print(f"failover window {window:.2f} s, {len(failures)} failed searches")
        assert min(failures) >= killed_at and window < FAILOVER_BOUND_SECONDS
        assert [o for at, o in events if at > max(failures)].count("ok") > 20
        # Nothing acknowledged is lost, on the promoted replica included.
        listed = {s.source for s in await store.list_sources()}
        assert acknowledged <= listed
        described = await store.describe()
        assert victim.url.removeprefix("redis://") not in described["primaries"]
        assert len(described["primaries"]) == 3
        everything = await store.search(SearchQuery("", unit(rng), 5000, False))
        found = {r.chunk.source for r in everything}
        assert acknowledged <= found
        assert len(everything) == len({r.chunk.id for r in everything}) == described["chunks"]
        await assert_writes_go_on_without_a_replica(cluster, store, rng)
    finally:
        await store.aclose()


def marked_failed(cluster: RedisClusterProcesses, victim: RedisStackProcess) -> bool:
    """Every other live node marks `victim` failed and has every slot served (a primary's
    replica promoted)."""
    for node in cluster.nodes:
        if node is victim or not node.alive():
            continue
        with redis.Redis(port=node.port, decode_responses=True) as client:
            state = str(client.execute_command("CLUSTER", "INFO"))
            lines = str(client.execute_command("CLUSTER", "NODES")).splitlines()
        line = next(line for line in lines if f":{victim.port}@" in line)
        if "cluster_state:ok" not in state or "fail" not in line.split()[2].split(","):
            return False
    return True


def replica_of(cluster: RedisClusterProcesses, port: int) -> RedisStackProcess:
    for node in cluster.live():
        if cluster.role(node) == "replica":
            with redis.Redis(port=node.port, decode_responses=True) as client:
                if int(client.info("replication")["master_port"]) == port:
                    return node
    raise AssertionError(f"the primary on port {port} has no live replica")


async def assert_writes_go_on_without_a_replica(
    cluster: RedisClusterProcesses, store: RedisClusterHybridIndex, rng: np.random.Generator
) -> None:
    """A primary whose only replica died takes writes, unconfirmed, once the cluster marks
    the replica failed: the write that finds no replica acknowledging rereads the topology."""
    primary = next(s for s in store.topology.primaries if s.replicas == 1)
    replica = replica_of(cluster, primary.port)
    replica.kill()
    for _ in range(300):  # node timeout 1 s: a few seconds
        if marked_failed(cluster, replica):
            break
        await asyncio.sleep(0.1)
    names = [f"r{i:03d}.md" for i in range(400) if source_slot(f"r{i:03d}.md") in primary.slots]
    for name in names[:2]:  # the first waits for WAIT's timeout, the second not at all
        await store.replace_sources([source_batch(rng, name, 3)])
    listed = {s.source for s in await store.list_sources()}
    assert set(names[:2]) <= listed


async def test_slot_migration_during_searches_never_duplicates_or_drops(
    cluster: RedisClusterProcesses,
) -> None:
    rng = np.random.default_rng(11)
    store = await open_store(cluster)
    try:
        batches = [source_batch(rng, f"m{i:02d}.md") for i in range(30)]
        await store.replace_sources(batches)
        total = sum(len(b.chunks) for b in batches)
        every_id = {c.id for b in batches for c in b.chunks}
        source, destination = store.topology.primaries[0], store.topology.primaries[1]
        # The slots of the source primary's passages, its index name's slot, and 300 more.
        tagged = {store.cluster.keyslot(store.layout.source_key(b.source)) for b in batches}
        index_slot = store.cluster.keyslot(source.index)
        slots = sorted(
            ({s for s in tagged if s in source.slots} | {index_slot})
            | set(sorted(source.slots)[:300])
        )
        moving = [s for s in slots if s in tagged]
        assert moving, "no passage lives on the source primary"
        outcome: dict[str, int] = {}

        def migrate() -> None:
            outcome["keys"] = migrate_slots(source.port, destination.port, slots)

        mover = threading.Thread(target=migrate)
        searches = 0
        mover.start()
        while mover.is_alive() or searches < 20:
            dense = await store.search(SearchQuery("", unit(rng), total, False))
            found = [r.chunk.id for r in dense]
            assert len(found) == len(set(found)), "a passage came back twice"
            assert set(found) == every_id, f"{len(every_id - set(found))} passages missing"
            hybrid = await store.search(SearchQuery(" ".join(rng.choice(WORDS, 3)), unit(rng), 20))
            assert len({r.chunk.id for r in hybrid}) == len(hybrid) == 20
            searches += 1
        mover.join()
        assert outcome["keys"] >= 10 * len(moving)
        described = await store.describe()
        assert described["chunks"] == total
        assert source.address in described["primaries"]
        # The source primary's index moved to a new name in a slot it still owns.
        assert (
            store.topology.primaries[0].index != source.index
            or store.topology.primaries[0].port != source.port
        )
        print(f"{searches} searches during a {len(slots)}-slot move of {outcome['keys']} keys")
        # A primary that joins empty, while its first slot is imported key by key: it gets
        # the index (built with ASKING) before a search reads it, and no search misses a
        # passage meanwhile.
        newcomer = cluster.add_primary()
        owned = {node.port: cluster.own_slots(node) for node in cluster.primary_nodes()}
        donor_port = next(port for port, slots in owned.items() if slots & tagged)
        slot = min(owned[donor_port] & tagged)
        first: dict[str, int] = {}

        def import_first() -> None:
            first["keys"] = migrate_slots(donor_port, newcomer.port, [slot], batch=1, pause=0.05)

        mover = threading.Thread(target=import_first)
        mover.start()
        during = 0
        while mover.is_alive() or during < 3:
            dense = await store.search(SearchQuery("", unit(rng), total, False))
            found = [r.chunk.id for r in dense]
            assert len(found) == len(set(found)) and set(found) == every_id
            during += 1
        mover.join()
        assert first["keys"] >= 10
        assert f"127.0.0.1:{newcomer.port}" in (await store.describe())["primaries"]
        print(f"{during} searches while the first slot ({first['keys']} keys) moved in")
    finally:
        await store.aclose()


async def test_readiness_and_listing_recover_after_a_failover_without_a_search(
    cluster: RedisClusterProcesses,
) -> None:
    """`describe()` (what `/v1/ready` asks) and the listing reread the topology when a
    primary is gone and try again on the node that took over: a pod without search traffic
    gets ready again once its primary failed over, instead of asking the dead one for ever."""
    rng = np.random.default_rng(11)
    store = await open_store(cluster, timeout_seconds=1.0)
    try:
        names = {f"s{i:02d}.md" for i in range(12)}
        await store.replace_sources([source_batch(rng, name, 3) for name in sorted(names)])
        await store.describe()  # the topology is current: nothing makes it stale but a fault
        victim = next(
            n for n in cluster.primary_nodes() if n.port == store.topology.primaries[0].port
        )
        victim.kill()
        for _ in range(300):  # node timeout 1 s: a few seconds
            if marked_failed(cluster, victim):
                break
            await asyncio.sleep(0.1)
        assert marked_failed(cluster, victim), "the cluster did not fail the primary over"
        described = await store.describe()  # the first, without a search before it
        assert victim.url.removeprefix("redis://") not in described["primaries"]
        assert len(described["primaries"]) == 3 and described["sources"] == len(names)
        assert {s.source for s in await store.list_sources()} == names
    finally:
        await store.aclose()


async def test_concurrent_searches_on_a_hung_primary_reread_the_topology_once(
    slow_failover_cluster: RedisClusterProcesses,
) -> None:
    """Searches that arrive while one primary hangs, after a search that timed out on it,
    share one reread of the topology (each then fails after its own round's timeout) rather
    than rereading one after another, each waiting for the one before."""
    cluster = slow_failover_cluster
    rng = np.random.default_rng(13)
    store = await open_store(cluster, timeout_seconds=1.0)
    rereads = 0
    read_nodes = store.topology._nodes_reply

    async def counted() -> bytes:
        nonlocal rereads
        rereads += 1
        return await read_nodes()

    store.topology._nodes_reply = counted  # type: ignore[method-assign]
    try:
        await store.replace_sources([source_batch(rng, f"s{i:02d}.md") for i in range(6)])
        victim = next(
            n for n in cluster.primary_nodes() if n.port == store.topology.primaries[0].port
        )
        # Asked first for the topology, as a reread that asks one node after another would.
        store.topology.nodes.sort(key=lambda node: node.port != victim.port)
        with hung(victim):
            assert await search_outcome(store, rng) == "503"  # makes the topology stale
            rereads = 0
            outcomes = await asyncio.gather(*(search_outcome(store, rng) for _ in range(8)))
        assert outcomes == ["503"] * 8
        assert rereads <= 2, rereads  # one; a second only on a stalled event loop
    finally:
        await store.aclose()


@contextmanager
def hung(node: RedisStackProcess) -> Iterator[None]:
    """The node stops answering (SIGSTOP) without closing a connection, then resumes."""
    assert node.process is not None
    node.process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        node.process.send_signal(signal.SIGCONT)


async def what_the_node_ran(node: RedisStackProcess) -> tuple[dict[str, int], int]:
    """The calls of each command the node ran since its statistics were reset, and the
    connections it accepted but this one, read once they stop changing: a node resumed first
    runs what it was sent while stopped."""
    async with aioredis.Redis.from_url(node.url, protocol=2, decode_responses=True) as client:
        seen: tuple[dict[str, int], int] | None = None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            stats = await client.info("commandstats")
            calls = {name.removeprefix("cmdstat_"): v["calls"] for name, v in stats.items()}
            calls.pop("info", None)  # this loop's own
            accepted = (await client.info("stats"))["total_connections_received"] - 1
            if (calls, accepted) == seen:
                break
            seen = (calls, accepted)
            await asyncio.sleep(0.3)
    assert seen is not None
    return seen


async def search_outcome(store: RedisClusterHybridIndex, rng: np.random.Generator) -> str:
    try:
        await store.search(SearchQuery("w1 w2", unit(rng), 10))
    except IndexUnavailable:
        return "503"
    return "ok"


async def test_a_hung_primary_fails_a_search_after_one_timeout(
    slow_failover_cluster: RedisClusterProcesses,
) -> None:
    """A primary that hangs fails searches and listings after the timeout once: a timeout is
    not retried (only a connection error is, at once). Resumed, the node runs what each call
    sent it while it hung: once, not again on another connection. Hung for good, it is
    failed over, and the search that timed out makes the next one reread the topology:
    searches succeed again instead of asking the old primary for ever."""
    cluster = slow_failover_cluster
    rng = np.random.default_rng(5)
    store = await open_store(cluster, timeout_seconds=1.0)
    try:
        await store.replace_sources([source_batch(rng, f"s{i:02d}.md") for i in range(20)])
        victim = next(
            n for n in cluster.primary_nodes() if n.port == store.topology.primaries[0].port
        )
        async with aioredis.Redis.from_url(victim.url, protocol=2) as client:
            await client.config_resetstat()
        with hung(victim):
            with pytest.raises(IndexUnavailable):
                await store.search(SearchQuery("w1 w2", unit(rng), 10))
            with pytest.raises(IndexUnavailable):
                await store.list_sources()
        calls, accepted = await what_the_node_ran(victim)
        # A retry would have sent the search's pipeline (its k-NN and BM25 FT.SEARCH) again,
        # on a new connection: the one that timed out is dropped.
        assert calls.get("FT.SEARCH") == 2, calls
        assert calls.get("eval", 0) <= 1, calls  # the listing's script, at most once
        # At most one new connection per call, and one per reread of the topology, which
        # asks every node at once, the hung one too: the listing rereads before its script
        # (the search made the topology stale) and after it.
        assert accepted <= 4, accepted
        with hung(victim):
            for _ in range(300):  # node timeout 5 s: several seconds
                if marked_failed(cluster, victim):
                    break
                await asyncio.sleep(0.1)
            assert marked_failed(cluster, victim), "the cluster did not fail the hung primary over"
            # The first search may still ask the hung primary (and time out); no later one.
            outcomes = [await search_outcome(store, rng) for _ in range(3)]
        assert outcomes[1:] == ["ok", "ok"], outcomes
    finally:
        await store.aclose()
