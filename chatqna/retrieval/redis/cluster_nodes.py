"""What `CLUSTER NODES` says: each node's address, role, slots and migrations."""

from __future__ import annotations

from dataclasses import dataclass

from chatqna.retrieval.redis.replies import parses_reply


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
    moving_to: tuple[tuple[int, str], ...] = ()  # (slot, destination id) it migrates

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def _slots(fields: list[str]) -> tuple[frozenset[int], bool, tuple[tuple[int, str], ...]]:
    owned: set[int] = set()
    migrating = False
    moving: list[tuple[int, str]] = []
    for field in fields:
        if field.startswith("["):  # [slot->-id] migrating, [slot-<-id] importing
            migrating = True
            slot, arrow, target = field.strip("[]").partition("->-")
            if arrow:
                moving.append((int(slot), target))
            continue
        first, _, last = field.partition("-")
        owned.update(range(int(first), int(last or first) + 1))
    return frozenset(owned), migrating, tuple(moving)


@parses_reply
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
        slots, migrating, moving = _slots(fields[8:])
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
                moving_to=moving,
            )
        )
    return nodes


def own_view(reply: bytes | str) -> ClusterNode | None:
    """The `myself` line of one node's `CLUSTER NODES`."""
    return next((node for node in parse_cluster_nodes(reply) if node.myself), None)
