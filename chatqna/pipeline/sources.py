"""From a turn's query plan to its sources: the search query, then rerank or cut.

The pipeline (`Pipeline.prepare` in `chatqna.pipeline.orchestrator`, which times each step
in its span) and the benchmark harness (`retrieve` in `chatqna.evaluation.live`, which
searches the embedded index itself) both go through these two functions, so a benchmark
ranks a turn with the same query, and keeps the same sources, as the service serves it
with: the reranker's best `top_n`, or without one the retriever's first `top_n`. `hybrid` and
`fusion_weights` are the retrieval switches (`Settings` in the service, a benchmark `Mode`
in the harness); `k` is how many passages the retriever returns, `top_n` how many are kept.
"""

from __future__ import annotations

from collections.abc import Sequence

from chatqna.backends.protocols import Reranker, SearchQuery
from chatqna.documents import ScoredChunk
from chatqna.multiturn.rerank_query import RerankQuery
from chatqna.multiturn.strategy import QueryPlan


def search_query(
    plan: QueryPlan, k: int, *, hybrid: bool, fusion_weights: tuple[float, float]
) -> SearchQuery:
    """What the retriever searches with for `plan`: its embedding for the dense leg, its text
    for BM25, and its history-aware BM25 leg at the weight it ran with (none when it did
    not run)."""
    leg = plan.history_leg
    return SearchQuery(
        text=plan.text,
        embedding=plan.embedding,
        k=k,
        hybrid=hybrid,
        fusion_weights=fusion_weights,
        bm25_history=leg.questions if leg is not None else "",
        bm25_history_weight=leg.search_weight if leg is not None else 0.0,
    )


async def rerank_or_cut(
    reranker: Reranker | None,
    query: RerankQuery,
    candidates: Sequence[ScoredChunk],
    top_n: int,
) -> list[ScoredChunk]:
    """The reranker's best `top_n` of `candidates` against the plan's rerank query (its
    text, and its vector for an embedding-similarity reranker); without a reranker, the
    first `top_n` in the retriever's order."""
    if reranker is None:
        return list(candidates[:top_n])
    return await reranker.rerank(query.text, candidates, top_n, vector=query.vector)
