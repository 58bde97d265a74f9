"""Merging what the primaries of a Redis Cluster returned for one search round."""

from __future__ import annotations

import numpy as np

from chatqna.backends.protocols import SearchQuery
from chatqna.retrieval.redis.cluster_search import Round
from chatqna.retrieval.redis.consistency import DISAGREED
from chatqna.retrieval.redis.topology import Shard

A = Shard("a1", "127.0.0.1", 7000, "idx{a}", frozenset({1}), replicas=0)
B = Shard("b2", "127.0.0.1", 7001, "idx{b}", frozenset({2}), replicas=0)
A_NODES = b"a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 1\n"
B_NODES = b"b2 127.0.0.1:7001@17001 myself,master - 0 0 2 connected 2 [3->-a1]\n"


def chunk_id_of(key: str) -> str:
    return key.rsplit(":", 1)[-1]


def test_each_passage_keeps_its_best_score_and_where_it_was_found() -> None:
    found = Round.merged(
        [A, B],
        [
            (
                [("p:c1", 0.9), ("p:c2", 0.5)],
                {"p:c2": 3.0},
                {"p:c1": b"1", "p:c2": b"2"},
                A_NODES,
                False,
            ),
            (
                [("q:c2", 0.7)],
                {"q:c3": 1.0, "q:c2": 2.0},
                {"q:c2": b"2", "q:c3": b"3"},
                B_NODES,
                False,
            ),
        ],
        chunk_id_of,
    )
    assert found.dense == {"c1": 0.9, "c2": 0.7}
    assert found.bm25 == {"c2": 3.0, "c3": 1.0}
    assert found.where == {"c1": A.address, "c2": B.address, "c3": B.address}
    assert found.keys == {"c1": "p:c1", "c2": "q:c2", "c3": "q:c3"}
    assert found.digests == {"c1": b"1", "c2": b"2", "c3": b"3"}
    views = [view.node_id if view else None for view in found.views]
    assert views == ["a1", "b2"]
    assert found.views[1] is not None and found.views[1].migrating
    assert found.nodes_reply == A_NODES


def test_a_second_round_adds_best_scores_and_newer_locations() -> None:
    first = Round.merged(
        [A], [([("p:c1", 0.4)], {"p:c1": 1.0}, {"p:c1": b"1"}, A_NODES, False)], chunk_id_of
    )
    again = Round.merged(
        [B],
        [([("q:c1", 0.3), ("q:c9", 0.8)], {}, {"q:c1": b"1", "q:c9": b"9"}, B_NODES, False)],
        chunk_id_of,
    )
    first.add(again)
    assert first.dense == {"c1": 0.4, "c9": 0.8}
    assert first.bm25 == {"c1": 1.0}
    assert first.where == {"c1": B.address, "c9": B.address}
    assert first.keys == {"c1": "q:c1", "c9": "q:c9"}
    assert first.digests == {"c1": b"1", "c9": b"9"}


def test_a_passage_two_primaries_saw_at_two_versions_has_no_digest_to_match() -> None:
    # A slot in migration, and a write between the two primaries' searches.
    found = Round.merged(
        [A, B],
        [
            ([("p:c1", 0.9)], {}, {"p:c1": b"old"}, A_NODES, False),
            ([("p:c1", 0.9)], {}, {"p:c1": b"new"}, B_NODES, False),
        ],
        chunk_id_of,
    )
    assert found.digests == {"c1": DISAGREED}


def test_a_ranking_fuses_both_legs_or_keeps_the_dense_one() -> None:
    found = Round.merged(
        [A],
        [([("p:c1", 0.9), ("p:c2", 0.8)], {"p:c2": 2.0, "p:c3": 1.0}, {}, A_NODES, False)],
        chunk_id_of,
    )
    vector = np.ones(2, np.float32)
    hybrid = found.ranking(SearchQuery("q", vector, 2), depth=3, rrf_k=60)
    assert hybrid.keys == ["c2", "c1"]  # in both legs, then first in one
    assert hybrid.dense == {"c1": 0.9, "c2": 0.8} and hybrid.bm25 == {"c2": 2.0, "c3": 1.0}
    dense = found.ranking(SearchQuery("q", vector, 1, hybrid=False), depth=1, rrf_k=60)
    assert dense.fused == [("c1", 0.9)] and dense.bm25 == {}


def test_a_primary_whose_knn_hits_lacked_their_distance_is_named() -> None:
    found = Round.merged(
        [A, B],
        [
            ([("p:c1", 0.9)], {}, {"p:c1": b"1"}, A_NODES, False),
            ([("q:c2", -1.0)], {}, {"q:c2": None}, B_NODES, True),
        ],
        chunk_id_of,
    )
    assert found.unscored == [B.address]
    again = Round.merged([A], [([("p:c1", 0.9)], {}, {}, A_NODES, True)], chunk_id_of)
    found.add(again)
    assert found.unscored == [B.address, A.address]
