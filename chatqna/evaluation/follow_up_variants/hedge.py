"""Hedged retrieval: more dense legs beside the blend, fused by the same reciprocal rank fusion.

A blended follow-up whose history misleads (a wrong earlier answer) drags the dense leg off
topic. A hedge searches with one more vector as a leg of its own, fused at a fixed share of
the dense leg's RRF weight: the follow-up's own vector keeps its hits when the history
misleads, the previous answer's vector adds the passages it was drawn from. The indexes fuse
a dense and a BM25 leg; `hedged_search` ranks the same two legs through the embedded index's
own search (each leg's best `candidates`, as the index takes them) and fuses them with the
hedging legs by `reciprocal_rank_fusion`. With no hedging leg it ranks exactly as
`EmbeddedHybridIndex.search_sync`: the same lists, in the same order, fused by the same
function. `hedge_legs` plans the legs of a blended follow-up (the benchmark's
`query_leg_weight` and `answer_leg_weight`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from chatqna.backends.protocols import Embedder, SearchQuery
from chatqna.documents import ScoredChunk
from chatqna.evaluation.follow_up_variants.candidates import previous_answer
from chatqna.multiturn.history import Conversation
from chatqna.multiturn.strategy import QueryPlan
from chatqna.retrieval.embedded.index import EmbeddedHybridIndex
from chatqna.retrieval.fusion import reciprocal_rank_fusion


async def hedge_legs(
    weights: tuple[float, float], conversation: Conversation, planned: QueryPlan, embedder: Embedder
) -> tuple[tuple[np.ndarray, float], ...]:
    """The hedging dense legs of a blended follow-up, each with its RRF weight as a share of
    the dense leg's (`weights`: the query leg's, the answer leg's; 0 leaves a leg out): the
    follow-up's own vector `EQ` (the blend already computed it) and the previous assistant
    message's vector (a third input of the blend's batched call in a service, here a call of
    its own, which ranks alike). None on a turn the blend did not run, so a first turn
    stays stateless."""
    blend = planned.blend
    if blend is None or not blend.executed:
        return ()
    query_share, answer_share = weights
    legs: list[tuple[np.ndarray, float]] = []
    if query_share > 0.0:
        legs.append((blend.query_embedding, query_share))
    answer = previous_answer(conversation).strip()
    if answer_share > 0.0 and answer:
        legs.append(((await embedder.embed([answer]))[0], answer_share))
    return tuple(legs)


def dense_leg(index: EmbeddedHybridIndex, vector: np.ndarray, depth: int) -> list[ScoredChunk]:
    """The dense leg's best `depth` passages for `vector`, best first."""
    return index.search_sync(SearchQuery("", vector, depth, hybrid=False))


def bm25_leg(index: EmbeddedHybridIndex, query: SearchQuery, depth: int) -> list[ScoredChunk]:
    """The BM25 leg's best `depth` passages for `query`, best first: the index's hybrid
    search with the dense leg at RRF weight 0, so every passage BM25 found scores above
    every passage only the dense leg found, in BM25's order."""
    muted = SearchQuery(
        query.text,
        query.embedding,
        depth,
        True,
        fusion_weights=(0.0, 1.0),
        bm25_history=query.bm25_history,
        bm25_history_weight=query.bm25_history_weight,
    )
    hits = index.search_sync(muted, candidates=depth)
    return [hit for hit in hits if hit.scores.get("fusion", 0.0) > 0.0]


def hedged_search(
    index: EmbeddedHybridIndex,
    query: SearchQuery,
    legs: Sequence[tuple[np.ndarray, float]],
    candidates: int,
) -> list[ScoredChunk]:
    """The hybrid search of `query` with the hedging dense `legs` (vector, share of the
    dense leg's weight) fused in; each leg contributes its best `max(k, candidates)`."""
    depth = max(query.k, candidates)
    dense_weight, bm25_weight = query.fusion_weights
    lists = [dense_leg(index, query.embedding, depth), bm25_leg(index, query, depth)]
    lists += [dense_leg(index, vector, depth) for vector, _ in legs]
    weights = [dense_weight, bm25_weight, *(dense_weight * share for _, share in legs)]
    chunks = {hit.chunk.id: hit.chunk for hits in lists for hit in hits}
    rankings = [[hit.chunk.id for hit in hits] for hits in lists]
    fused = reciprocal_rank_fusion(rankings, k=index.rrf_k, weights=weights)[: query.k]
    return [ScoredChunk(chunks[i], score=score, scores={"fusion": score}) for i, score in fused]
