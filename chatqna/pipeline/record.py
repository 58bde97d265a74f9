"""The record of one turn's retrieval, built once and read by every consumer.

`RetrievalReport` says how the retrieval query was made (strategy, condense or blend,
the history-aware BM25 leg, fusion). `TurnRecord` adds what the reranker did, the depth,
the kept sources, the stage timings and the trace id. The SSE metadata event and the
non-streaming body are `TurnRecord.wire()`; span attributes
(`chatqna.telemetry.attributes`) and metrics read the typed fields. The wire shape is
the one documented in the API reference (`RetrievalInfo` in `chatqna.api.schemas`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from chatqna.documents import ScoredChunk
from chatqna.multiturn.blend import BlendResult
from chatqna.multiturn.condense import CondenseOutcome
from chatqna.multiturn.rerank_query import RerankQuery


@dataclass(frozen=True)
class Fusion:
    """How the dense and BM25 legs were fused (blend and stateless turns)."""

    weights: tuple[float, float]
    rrf_k: int
    candidates: int
    bm25_history_ran: bool
    bm25_history_weight: float


@dataclass(frozen=True)
class RetrievalReport:
    """How this turn's retrieval query was made. Exactly one of `condense` and `blend`."""

    multi_turn_mode: str
    strategy: str
    raw_query: str
    query: str
    history_messages: int
    condense: CondenseOutcome | None = None
    blend: BlendResult | None = None
    fusion: Fusion | None = None

    def wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "multi_turn_mode": self.multi_turn_mode,
            "raw_query": self.raw_query,
            "history_messages": self.history_messages,
            "strategy": self.strategy,
            "query": self.query,
        }
        if self.condense is not None:
            body["condense"] = self.condense.report()
        if self.blend is not None:
            body["blend"] = self.blend.report()
        if self.fusion is not None:
            body["bm25_history"] = {
                "ran": self.fusion.bm25_history_ran,
                "weight": self.fusion.bm25_history_weight,
            }
            body["fusion_weights"] = list(self.fusion.weights)
            body["rrf_k"] = self.fusion.rrf_k
            body["rrf_candidates"] = self.fusion.candidates
        return body


@dataclass(frozen=True)
class RerankRecord:
    """Whether a reranker ran and, when it did, which query it scored against."""

    reranker: str | None
    skip_reason: str
    query: RerankQuery

    def wire(self) -> dict[str, Any]:
        if self.reranker is None:
            return {"ran": False, "reason": self.skip_reason, "query_kind": None, "query": None}
        return {
            "ran": True,
            "reason": "reranked",
            "query_kind": self.query.kind,
            "query": self.query.text,
        }


@dataclass(frozen=True)
class TurnRecord:
    """Everything the metadata event says about one turn, built once before it is sent."""

    retrieval: RetrievalReport
    rerank: RerankRecord
    hybrid: bool
    k: int
    top_n: int
    sources: tuple[ScoredChunk, ...]
    timings_ms: Mapping[str, float]
    trace_id: str | None

    def wire(self) -> dict[str, Any]:
        return {
            "source_documents": [source_document(item) for item in self.sources],
            "retrieval": {
                **self.retrieval.wire(),
                "hybrid": self.hybrid,
                "reranker": self.rerank.reranker,
                "rerank": self.rerank.wire(),
                "k": self.k,
                "top_n": self.top_n,
            },
            "timings_ms": dict(self.timings_ms),
            "trace_id": self.trace_id,
        }


def source_document(item: ScoredChunk) -> dict[str, Any]:
    chunk = item.chunk
    return {
        "id": chunk.id,
        "doc_id": chunk.doc_id,
        "source": chunk.source,
        "title": chunk.title,
        "text": chunk.text,
        "score": item.score,
        "scores": dict(item.scores),
    }
