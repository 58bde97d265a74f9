"""From a plan to the sources: the search query and the rerank-or-cut step."""

from __future__ import annotations

import numpy as np
import pytest

from chatqna.backends.fakes import RecordingReranker
from chatqna.documents import Chunk, ScoredChunk
from chatqna.multiturn.rerank_query import RerankQuery
from chatqna.multiturn.strategy import HistoryLeg, QueryPlan
from chatqna.pipeline.sources import rerank_or_cut, search_query

pytestmark = pytest.mark.anyio

VECTOR = np.ones(4, dtype=np.float32) / 2.0
BLENDED = np.full(4, 0.5, dtype=np.float32)


def plan(leg: HistoryLeg | None) -> QueryPlan:
    rerank = RerankQuery("q\nearlier?", BLENDED, "conversation")
    return QueryPlan("blend", "blend", "q", VECTOR, rerank, history_leg=leg)


def hits(count: int) -> list[ScoredChunk]:
    return [ScoredChunk(Chunk(f"c{i}", f"text {i}", "s.md"), 1.0 / (i + 1)) for i in range(count)]


def test_the_search_query_carries_the_plan_and_the_history_leg_that_ran() -> None:
    query = search_query(
        plan(HistoryLeg(True, 0.3, "earlier?")), 7, hybrid=True, fusion_weights=(1.0, 0.2)
    )
    assert (query.text, query.k, query.hybrid, query.fusion_weights) == ("q", 7, True, (1.0, 0.2))
    assert query.embedding is VECTOR
    assert (query.bm25_history, query.bm25_history_weight) == ("earlier?", 0.3)


@pytest.mark.parametrize("leg", [None, HistoryLeg(False, 0.3)])
def test_a_leg_that_did_not_run_adds_nothing_to_bm25(leg: HistoryLeg | None) -> None:
    query = search_query(plan(leg), 4, hybrid=False, fusion_weights=(1.0, 1.0))
    assert (query.bm25_history, query.bm25_history_weight, query.hybrid) == ("", 0.0, False)


async def test_without_a_reranker_the_retrievers_order_is_cut_to_top_n() -> None:
    candidates = hits(5)
    kept = await rerank_or_cut(None, plan(None).rerank, candidates, 3)
    assert kept == candidates[:3]
    assert await rerank_or_cut(None, plan(None).rerank, candidates[:2], 3) == candidates[:2]


async def test_a_reranker_scores_against_the_plans_rerank_query() -> None:
    reranker = RecordingReranker()
    kept = await rerank_or_cut(reranker, plan(None).rerank, hits(5), 2)
    assert [hit.chunk.id for hit in kept] == ["c0", "c1"]
    assert reranker.queries == ["q\nearlier?"]
    assert reranker.vectors[0] is BLENDED
