"""One search round on a Redis Cluster: each primary's best passages per leg, merged by id.

`search_shard` asks one primary for its KNN and BM25 hits (ids, scores and digests) and its
`CLUSTER NODES` view, in one pipelined round trip; `Round` merges what the primaries
returned. A passage found twice (a slot in migration) keeps its best score, and its digest
when both saw the same (`consistency.seen_digests`). A primary whose KNN hits came back
without their distance is named in `Round.unscored`: its index lacks the fields this version
returns (something else built it), which the store checks before trusting it again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from chatqna.backends.protocols import SearchQuery
from chatqna.retrieval.fusion import reciprocal_rank_fusion
from chatqna.retrieval.redis.cluster_nodes import ClusterNode, own_view
from chatqna.retrieval.redis.consistency import Ranking, seen_digests
from chatqna.retrieval.redis.query import bm25_search, knn_search
from chatqna.retrieval.redis.replies import (
    digest_hits,
    knn_hits,
    straddles,
    top_bm25,
    unscored,
)
from chatqna.retrieval.redis.topology import Shard

# A primary's KNN hits, BM25 hits, the digest each hit was seen at, its CLUSTER NODES, and
# whether a KNN hit came back without its distance.
ShardHits = tuple[list[tuple[str, float]], dict[str, float], dict[str, Any], bytes, bool]


def _keep_best(into: dict[str, float], chunk_id: str, score: float) -> None:
    into[chunk_id] = max(score, into.get(chunk_id, score))


@dataclasses.dataclass
class Round:
    """What one search round found on the primaries, merged, by chunk id."""

    dense: dict[str, float]  # id: cosine similarity
    bm25: dict[str, float]
    keys: dict[str, str]  # id: key
    where: dict[str, str]  # id: the address of the primary that returned it
    views: list[ClusterNode | None]
    nodes_reply: bytes
    digests: dict[str, Any] = dataclasses.field(default_factory=dict)  # id: digest seen
    # Addresses of the primaries whose KNN hits came back without their distance.
    unscored: list[str] = dataclasses.field(default_factory=list)

    @classmethod
    def merged(
        cls,
        shards: Sequence[Shard],
        replies: Sequence[ShardHits],
        chunk_id_of: Callable[[str], str],
    ) -> Round:
        """The primaries' replies (in the order of `shards`) merged into one round."""
        found = cls({}, {}, {}, {}, [], b"")
        for shard, (dense, bm25, digests, nodes_reply, no_distance) in zip(
            shards, replies, strict=True
        ):
            if no_distance:
                found.unscored.append(shard.address)
            for key in [key for key, _ in dense] + list(bm25):
                found.where[chunk_id_of(key)] = shard.address
            seen = {chunk_id_of(key): digest for key, digest in digests.items()}
            found.digests = seen_digests(found.digests, seen)
            for key, similarity in dense:
                found.keys[chunk_id_of(key)] = key
                _keep_best(found.dense, chunk_id_of(key), similarity)
            for key, score in bm25.items():
                found.keys[chunk_id_of(key)] = key
                _keep_best(found.bm25, chunk_id_of(key), score)
            found.views.append(own_view(nodes_reply))
            found.nodes_reply = found.nodes_reply or nodes_reply
        return found

    def add(self, again: Round) -> None:
        """Merge a later round in: best scores, and the later round's locations."""
        for chunk_id, similarity in again.dense.items():
            _keep_best(self.dense, chunk_id, similarity)
        for chunk_id, score in again.bm25.items():
            _keep_best(self.bm25, chunk_id, score)
        self.keys.update(again.keys)
        self.where.update(again.where)
        self.digests = seen_digests(self.digests, again.digests)
        self.unscored += again.unscored

    def ranking(self, query: SearchQuery, depth: int, rrf_k: int) -> Ranking:
        """Each leg's best `depth` over the primaries (ties by id, as one node orders them)
        and the top `query.k`: fused by RRF, or the dense leg's for a dense-only search."""
        dense = dict(sorted(self.dense.items(), key=lambda hit: (-hit[1], hit[0]))[:depth])
        if not query.hybrid:
            return Ranking(list(dense.items())[: query.k], dense, {}, self.digests)
        bm25 = dict(sorted(self.bm25.items(), key=lambda hit: (-hit[1], hit[0]))[:depth])
        fused = reciprocal_rank_fusion(
            [list(dense), list(bm25)], k=rrf_k, weights=query.fusion_weights
        )[: query.k]
        return Ranking(fused, dense, bm25, self.digests)


async def search_shard(
    client: Any,
    shard: Shard,
    vector: np.ndarray,
    depth: int,
    text_query: str | None,
    order_key: Callable[[str], str],
) -> ShardHits:
    """One primary's best `depth` per leg (BM25 ties by `order_key`), the digests of the
    hits, and its view.

    Ids, scores and digests only: in cluster mode this build of the search module cannot
    load a document's fields (they come back empty, from FT.AGGREGATE's LOAD too) unless
    the index holds them (`digest`, sortable), so passages are read with HMGET, and a BM25
    tie that straddles the cut is resolved by asking that primary for more hits until the
    tie ends, then sorting by chunk id."""
    pipe = client.pipeline(transaction=False)
    commands = [knn_search(shard.index, vector, depth, fields=False)]
    if text_query is not None:
        commands.append(bm25_search(shard.index, text_query, depth))
    for command in commands:
        if shard.asking:  # its first slot is still being imported
            pipe.execute_command("ASKING")
        pipe.execute_command(*command)
    pipe.execute_command("CLUSTER", "NODES")
    replies = await pipe.execute()
    if shard.asking:
        replies = [*replies[1:-1:2], replies[-1]]
    knn = knn_hits(replies[0])
    legs = [{key: fields.get("digest") for key, _, fields in knn}]
    bm25: dict[str, float] = {}
    if text_query is not None:
        hits, digests = digest_hits(replies[1])
        legs.append(digests)
        wanted = depth
        while straddles(hits, depth) and len(hits) > wanted:
            wanted *= 2  # the tie goes on past the cut: ask for more of it
            more = client.pipeline(transaction=False)
            if shard.asking:
                more.execute_command("ASKING")
            more.execute_command(*bm25_search(shard.index, text_query, wanted))
            hits, digests = digest_hits((await more.execute())[-1])
            legs.append(digests)
            if hits[-1][1] != hits[depth][1]:
                break
        bm25 = top_bm25(hits, depth, None, order_key=order_key)
    dense = [(key, similarity) for key, similarity, _ in knn]
    return dense, bm25, seen_digests(*legs), cast(bytes, replies[-1]), unscored(knn)
