"""What the cluster store knows of a Redis Cluster: its primaries, their slots, migrations.

The search module of Redis 7.4 has no coordinator, and its commands are routed by the index
name's slot: a node answers `FT.SEARCH name` only when it owns `name`'s slot (else `MOVED`).
So each primary gets its own index, named with a hash tag in a slot that primary owns
(`<name>-shard-{<n>}`, `n` the smallest integer whose slot it owns: every client derives the
same names from the same slot map), over the same key prefix: each covers that node's
passages. Resharding moves passages between primaries and each node's index follows; when
it moves the slot of a primary's index name, that primary gets an index under its next name
(a new `FT.CREATE`, which scans its keys) and the old one stays behind, unreachable, until
the node's data is flushed or the node restarts without persistence.

The view comes from `CLUSTER NODES`, which every search also asks each primary for, in the
same pipeline: a slot map that changed or a slot being migrated is seen in-band.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot


@dataclass(frozen=True)
class ClusterNode:
    """One line of `CLUSTER NODES`."""

    node_id: str
    host: str
    port: int
    primary: bool
    failed: bool
    primary_id: str | None  # a replica's primary
    slots: frozenset[int]
    migrating: bool  # this node imports or migrates a slot right now
    myself: bool

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def _slots(fields: list[str]) -> tuple[frozenset[int], bool]:
    owned: set[int] = set()
    migrating = False
    for field in fields:
        if field.startswith("["):  # [slot->-id] migrating, [slot-<-id] importing
            migrating = True
            continue
        first, _, last = field.partition("-")
        owned.update(range(int(first), int(last or first) + 1))
    return frozenset(owned), migrating


def parse_cluster_nodes(reply: bytes | str) -> list[ClusterNode]:
    """The nodes of a `CLUSTER NODES` reply (nodes still in handshake or without an
    address are left out)."""
    text = reply.decode() if isinstance(reply, bytes) else reply
    nodes = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 8:
            continue
        flags = set(fields[2].split(","))
        if flags & {"handshake", "noaddr"}:
            continue
        address = fields[1].split("@", 1)[0].split(",", 1)[0]
        host, _, port = address.rpartition(":")
        slots, migrating = _slots(fields[8:])
        nodes.append(
            ClusterNode(
                node_id=fields[0],
                host=host,
                port=int(port),
                primary="master" in flags,
                failed="fail" in flags,
                primary_id=None if fields[3] == "-" else fields[3],
                slots=slots,
                migrating=migrating,
                myself="myself" in flags,
            )
        )
    return nodes


@cache
def _tag_slot(number: int) -> int:
    return key_slot(str(number).encode())


def shard_index_name(base: str, slots: frozenset[int]) -> str:
    """The name of the index on the primary that owns `slots` (which must not be empty)."""
    if not slots:
        raise ValueError("a primary without slots holds no index")
    number = 0
    while _tag_slot(number) not in slots:
        number += 1
        if number > 50 * REDIS_CLUSTER_HASH_SLOTS:  # unreachable: some number hashes there
            raise ValueError("no hash tag found for these slots")
    return f"{base}-shard-{{{number}}}"


@dataclass(frozen=True)
class Shard:
    """A primary that owns slots, with the name of its index."""

    node_id: str
    host: str
    port: int
    index: str
    slots: frozenset[int]
    replicas: int  # live replicas: how many a write waits for (at most one)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def shards_of(nodes: list[ClusterNode], base: str) -> list[Shard]:
    """Every primary that owns slots (a failed one included: its slots have no other
    owner until its replica takes over, so searching without it would drop passages)."""
    replicas: dict[str, int] = {}
    for node in nodes:
        if not node.primary and not node.failed and node.primary_id is not None:
            replicas[node.primary_id] = replicas.get(node.primary_id, 0) + 1
    return sorted(
        (
            Shard(
                node.node_id,
                node.host,
                node.port,
                shard_index_name(base, node.slots),
                node.slots,
                replicas.get(node.node_id, 0),
            )
            for node in nodes
            if node.primary and node.slots
        ),
        key=lambda shard: shard.address,
    )


def own_view(reply: bytes | str) -> ClusterNode | None:
    """The `myself` line of one node's `CLUSTER NODES`."""
    return next((node for node in parse_cluster_nodes(reply) if node.myself), None)
