"""The record of one turn, built once and read by every consumer.

`TurnRecord` holds how the retrieval query was made (the strategy's `QueryPlan`), the
fusion parameters, what the reranker did, the depth, the kept sources, the stage timings
and the trace id, as typed values. The API turns it into the wire models of
`chatqna.api.chat_metadata_schemas` (the SSE metadata event and a completion's
`metadata`); the telemetry observer turns it into span attributes and metrics.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from chatqna.documents import ScoredChunk
from chatqna.multiturn.strategy import QueryPlan


@dataclass(frozen=True)
class Fusion:
    """How the dense and BM25 legs were fused (reported on hybrid blend-mode turns)."""

    weights: tuple[float, float]
    rrf_k: int
    candidates: int


@dataclass(frozen=True)
class RerankRecord:
    """Whether a reranker ran (`reranker` is its name) and, if not, why."""

    reranker: str | None
    skip_reason: str


@dataclass(frozen=True)
class TurnRecord:
    """Everything the metadata event says about one turn."""

    raw_query: str
    history_messages: int
    plan: QueryPlan
    fusion: Fusion | None
    rerank: RerankRecord
    hybrid: bool
    k: int
    top_n: int
    sources: tuple[ScoredChunk, ...]
    timings_ms: Mapping[str, float]
    trace_id: str | None

    @property
    def bm25_history_ran(self) -> bool:
        """Whether the history-aware BM25 leg was searched: the plan ran it, and the
        retrieval was hybrid (a dense-only search has no BM25 leg at all)."""
        leg = self.plan.history_leg
        return leg is not None and leg.ran and self.hybrid
