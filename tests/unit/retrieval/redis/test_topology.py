"""The primaries and their index names hashed into owned slots, and rereading the topology."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import BlockingConnectionPool
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from chatqna.errors import IndexUnavailable
from chatqna.retrieval.redis.cluster_nodes import parse_cluster_nodes
from chatqna.retrieval.redis.schema import IndexSchema, VectorIndexParams
from chatqna.retrieval.redis.topology import ClusterTopology, Shard, shard_index_name, shards_of
from tests.unit.retrieval.redis.test_cluster_nodes import NODES


def test_shards_are_primaries_with_slots_and_count_live_replicas() -> None:
    nodes = parse_cluster_nodes(NODES)
    assert dict(next(n for n in nodes if n.node_id == "b2").moving_to) == {6000: "g7"}
    shards = shards_of(nodes, "rag")
    # g7 owns nothing yet but imports slot 6000: searched with ASKING, named after it.
    assert [s.node_id for s in shards] == ["a1", "b2", "c3", "g7"]
    assert [s.replicas for s in shards] == [1, 1, 0, 0]  # c3's replica failed too
    assert [s.asking for s in shards] == [False, False, False, True]
    for shard in shards[:3]:
        assert key_slot(shard.index.encode()) in shard.slots
        assert shard.index.startswith("rag-shard-{")
    assert key_slot(shards[3].index.encode()) == 6000 and not shards[3].slots


def test_index_names_are_the_smallest_tag_in_an_owned_slot() -> None:
    everything = frozenset(range(16384))
    assert shard_index_name("rag", everything) == "rag-shard-{0}"
    without_zero = everything - {key_slot(b"0")}
    assert shard_index_name("rag", without_zero) == "rag-shard-{1}"
    one = frozenset({1234})
    name = shard_index_name("rag", one)
    assert key_slot(name.encode()) == 1234
    with pytest.raises(ValueError, match="without slots"):
        shard_index_name("rag", frozenset())


@pytest.mark.anyio
async def test_each_nodes_search_pool_waits_for_a_connection_up_to_the_timeout() -> None:
    """redis-py's default pool fails at once past 100 connections; a node's search pool
    holds `max_connections` and makes the next caller wait up to the timeout."""
    schema = IndexSchema("rag", "rag:chunk:", "e", 8, VectorIndexParams())
    topology = ClusterTopology("redis://127.0.0.1:7000", schema, 2.5, max_connections=7)
    pool = topology.client("127.0.0.1:7001").connection_pool
    assert isinstance(pool, BlockingConnectionPool)
    assert (pool.max_connections, pool.timeout) == (7, 2.5)
    await topology.aclose()


class IndexedNode:
    """A primary's search client that answers `FT.INFO` with an index of the given
    `digest` attribute (and counts `FT.CREATE`: it must not be asked)."""

    def __init__(self, digest: list[bytes]) -> None:
        self.digest = digest

    async def execute_command(self, *args: Any) -> Any:
        assert args[0] == "FT.INFO", args
        terms = [b"identifier", b"terms", b"attribute", b"terms", b"type", b"TEXT"]
        vector = [b"identifier", b"embedding", b"attribute", b"embedding", b"type", b"VECTOR"]
        return [
            b"num_docs", b"3", b"indexing", b"0", b"percent_indexed", b"1",
            b"attributes", [terms, [*vector, b"dim", b"8"], self.digest],
        ]  # fmt: skip

    async def aclose(self) -> None:
        pass


DIGEST = [b"identifier", b"digest", b"attribute", b"digest", b"type", b"TAG"]
ONE_PRIMARY = b"a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-16383\n"


@pytest.mark.anyio
async def test_an_index_of_other_fields_is_refused_at_every_refresh() -> None:
    """A primary's index was replaced by one that does not hold `digest` while this store
    runs: the next check refuses it with the way out, as at start-up, until it is dropped."""
    schema = IndexSchema("rag", "rag:chunk:", "e", 8, VectorIndexParams())
    topology = ClusterTopology("redis://127.0.0.1:7000", schema, 2.5)
    topology.meta = {b"embedder": b"e", b"dimension": b"8", b"format": b"3"}
    topology._clients["127.0.0.1:7000"] = IndexedNode([*DIGEST, b"NOINDEX"])  # type: ignore[assignment]
    for _ in range(2):
        with pytest.raises(IndexUnavailable, match=r"no sortable `digest` field; .*DD") as raised:
            await topology.refresh(ONE_PRIMARY)
        assert raised.value.status_code == 503
        assert topology.primaries == []  # nothing searched meanwhile
    current = [*DIGEST, b"CASESENSITIVE", b"SORTABLE", b"UNF", b"NOINDEX"]
    topology._clients["127.0.0.1:7000"] = IndexedNode(current)  # type: ignore[assignment]
    await topology.refresh(ONE_PRIMARY)
    assert [shard.address for shard in topology.primaries] == ["127.0.0.1:7000"]


THREE_PRIMARIES = b"""\
a1 127.0.0.1:7000@17000 master - 0 0 1 connected 0-5460
b2 127.0.0.1:7001@17001 myself,master - 0 1 2 connected 5461-10922
c3 127.0.0.1:7002@17002 master - 0 1 3 connected 10923-16383
"""
FAILED_OVER = b"""\
a1 127.0.0.1:7000@17000 master,fail - 0 0 1 connected
b2 127.0.0.1:7001@17001 myself,master - 0 1 2 connected 5461-10922
c3 127.0.0.1:7002@17002 master - 0 1 3 connected 10923-16383
d4 127.0.0.1:7003@17003 master - 0 1 4 connected 0-5460
"""


class Node:
    """A node's search client: answers `CLUSTER NODES` with `view`, or hangs until its
    socket timeout (then raises redis' `TimeoutError`), or is gone."""

    def __init__(self, *, hangs: bool = False, gone: bool = False) -> None:
        self.view, self.hangs, self.gone = THREE_PRIMARIES, hangs, gone
        self.asked = 0
        self.timed_out = False

    async def execute_command(self, *args: Any) -> Any:
        assert args == ("CLUSTER", "NODES"), args
        self.asked += 1
        if self.gone:
            raise RedisConnectionError("Connection refused")
        if self.hangs:
            await asyncio.sleep(0.2)  # the socket timeout
            self.timed_out = True
            raise RedisTimeoutError("Timeout reading from socket")
        return self.view

    async def aclose(self) -> None:
        pass


def topology_of(nodes: dict[str, Node]) -> ClusterTopology:
    """A topology over the fake `nodes` (the first is the URL's, and the first known),
    their indexes all built."""
    schema = IndexSchema("rag", "rag:chunk:", "e", 8, VectorIndexParams())
    topology = ClusterTopology(f"redis://{next(iter(nodes))}", schema, 2.5)
    topology._clients.update(nodes)  # type: ignore[arg-type]
    topology.nodes = [n for n in parse_cluster_nodes(THREE_PRIMARIES) if n.address in nodes]
    topology.nodes.sort(key=lambda node: list(nodes).index(node.address))
    for view in (THREE_PRIMARIES, FAILED_OVER):
        shards = shards_of(parse_cluster_nodes(view), "rag")
        topology._ready |= {(shard.address, shard.index) for shard in shards}
    return topology


def addresses(*ports: int) -> list[str]:
    return [f"127.0.0.1:{port}" for port in ports]


@pytest.mark.anyio
async def test_concurrent_rereads_share_one_that_a_hung_node_does_not_hold_up() -> None:
    """Searches that all find the topology stale reread it once between them, and that
    reread takes the first answer: a node that hangs (asked first) delays none of them."""
    nodes = {address: Node() for address in addresses(7000, 7001, 7002)}
    nodes["127.0.0.1:7000"].hangs = True
    topology = topology_of(nodes)
    found = await asyncio.gather(*(topology.shards() for _ in range(8)))
    assert not nodes["127.0.0.1:7000"].timed_out  # answered before the hung node's timeout
    assert [node.asked for node in nodes.values()] == [1, 1, 1]  # one reread, not eight
    assert all([s.address for s in shards] == list(nodes) for shards in found)
    await topology.aclose()


@pytest.mark.anyio
async def test_callers_that_waited_for_a_failed_reread_share_its_error() -> None:
    nodes = {address: Node(gone=True) for address in addresses(7000, 7001)}
    topology = topology_of(nodes)
    outcomes = await asyncio.gather(*(topology.shards() for _ in range(4)), return_exceptions=True)
    assert all(isinstance(o, RedisConnectionError) for o in outcomes), outcomes
    assert [node.asked for node in nodes.values()] == [1, 1]  # one reread, not four
    assert topology.stale  # the next call asks again
    await topology.aclose()


@pytest.mark.anyio
async def test_a_call_on_a_primary_gone_is_tried_again_once_another_took_over() -> None:
    """Listing and describing (the readiness check) reread the topology when a primary is
    gone or hangs, and try again at once when another node took over its slots."""
    nodes = {address: Node() for address in addresses(7001, 7000, 7002, 7003)}
    nodes["127.0.0.1:7000"].gone = True
    topology = topology_of(nodes)
    await topology.shards()
    seen: list[list[str]] = []

    async def call(shards: list[Shard]) -> str:
        seen.append([shard.address for shard in shards])
        if "127.0.0.1:7000" in seen[-1]:
            raise RedisConnectionError("Connection refused")
        return "answered"

    with pytest.raises(RedisConnectionError):  # not failed over yet: tried once
        await topology.on_primaries(call)
    assert seen == [addresses(7000, 7001, 7002)]
    assert topology.stale  # the reread found the same primaries: the next call rereads
    await topology.shards()
    for node in nodes.values():
        node.view = FAILED_OVER
    assert await topology.on_primaries(call) == "answered"
    assert seen[1:] == [addresses(7000, 7001, 7002), addresses(7001, 7002, 7003)]
    assert not topology.stale
    await topology.aclose()
