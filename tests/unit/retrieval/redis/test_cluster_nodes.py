"""Reading `CLUSTER NODES`: roles, slots, migrations, and a node's own line."""

from __future__ import annotations

from chatqna.retrieval.redis.cluster_nodes import own_view, parse_cluster_nodes

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
