"""Reading `CLUSTER NODES`, and the per-primary index names hashed into owned slots."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import BlockingConnectionPool
from redis.crc import key_slot

from chatqna.errors import IndexUnavailable
from chatqna.retrieval.redis.schema import IndexSchema, VectorIndexParams
from chatqna.retrieval.redis.topology import (
    ClusterTopology,
    own_view,
    parse_cluster_nodes,
    shard_index_name,
    shards_of,
)

NODES = """\
a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460 [5461->-b2]
b2 127.0.0.1:7001@17001 master - 0 1 2 connected 5461-10922 [5461-<-a1] [6000->-g7]
c3 127.0.0.1:7002@17002,host-c master,fail - 0 1 3 connected 10923-16383
d4 127.0.0.1:7003@17003 slave a1 0 1 1 connected
e5 127.0.0.1:7004@17004 slave b2 0 1 2 connected
f6 127.0.0.1:7005@17005 slave,fail c3 0 1 3 connected
g7 127.0.0.1:7006@17006 master - 0 1 0 connected
h8 :0@0 master,noaddr - 0 1 0 disconnected
"""


def test_parse_reads_roles_slots_and_migrations() -> None:
    nodes = {node.node_id: node for node in parse_cluster_nodes(NODES.encode())}
    assert set(nodes) == {"a1", "b2", "c3", "d4", "e5", "f6", "g7"}  # no address: left out
    a1 = nodes["a1"]
    assert a1.myself and a1.primary and not a1.failed and a1.migrating
    assert a1.slots == frozenset(range(5461)) and a1.address == "127.0.0.1:7000"
    assert nodes["b2"].migrating and 5461 in nodes["b2"].slots
    assert nodes["c3"].failed and nodes["c3"].host == "127.0.0.1"  # hostname dropped
    assert nodes["d4"].primary_id == "a1" and not nodes["d4"].primary
    assert nodes["g7"].primary and not nodes["g7"].slots
    assert own_view(NODES) == a1


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
async def test_an_index_another_version_built_is_refused_at_every_refresh() -> None:
    """An old worker rebuilt a primary's index (format 2: `digest` not held in the index)
    while this one runs: the next check refuses it with the way out, as at start-up, until it
    is dropped."""
    schema = IndexSchema("rag", "rag:chunk:", "e", 8, VectorIndexParams())
    topology = ClusterTopology("redis://127.0.0.1:7000", schema, 2.5)
    topology.meta = {b"embedder": b"e", b"dimension": b"8", b"format": b"3"}
    topology._clients["127.0.0.1:7000"] = IndexedNode([*DIGEST, b"NOINDEX"])  # type: ignore[assignment]
    for _ in range(2):
        with pytest.raises(IndexUnavailable, match=r"format 2; .*stop every process") as raised:
            await topology.refresh(ONE_PRIMARY)
        assert raised.value.status_code == 503
        assert topology.primaries == []  # nothing searched meanwhile
    current = [*DIGEST, b"CASESENSITIVE", b"SORTABLE", b"UNF", b"NOINDEX"]
    topology._clients["127.0.0.1:7000"] = IndexedNode(current)  # type: ignore[assignment]
    await topology.refresh(ONE_PRIMARY)
    assert [shard.address for shard in topology.primaries] == ["127.0.0.1:7000"]
