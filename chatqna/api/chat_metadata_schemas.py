"""The `metadata` of a chat answer: its sources, how its retrieval ran, its stage timings.

Built from the turn's typed record (`chatqna.pipeline.record.TurnRecord`); sent as the
`event: metadata` of `/v1/chatqna`'s stream and as the `metadata` field of a completion or
its first chunk. The blocks of another mode are left out, not sent as `null`: a first turn
has no `condense` block (`chatqna.api.chat_schemas.wire`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from chatqna.documents import ScoredChunk
from chatqna.multiturn.blend import SKIP_DISABLED, BlendResult
from chatqna.multiturn.condense import CondenseOutcome
from chatqna.pipeline.record import TurnRecord


class SourceDocument(BaseModel):
    """A chunk an answer was grounded on."""

    id: str
    doc_id: str
    source: str
    title: str
    text: str
    score: float
    scores: dict[str, float]

    @classmethod
    def of(cls, item: ScoredChunk) -> SourceDocument:
        chunk = item.chunk
        return cls(
            id=chunk.id,
            doc_id=chunk.doc_id,
            source=chunk.source,
            title=chunk.title,
            text=chunk.text,
            score=item.score,
            scores=dict(item.scores),
        )


class CondenseInfo(BaseModel):
    """What the condense rewrite did (`MULTI_TURN_MODE=condense`)."""

    status: str
    standalone_query: str | None
    raw_query: str
    history_size: int
    latency_ms: float
    model: str | None

    @classmethod
    def of(cls, outcome: CondenseOutcome) -> CondenseInfo:
        return cls(
            status=outcome.status,
            standalone_query=outcome.query if outcome.rewritten else None,
            raw_query=outcome.raw_query,
            history_size=outcome.history_size,
            latency_ms=outcome.latency_ms,
            model=outcome.model,
        )


class TranslationInfo(BaseModel):
    """What translating the history did; empty when the blend did not run.

    `translated` counts the messages searched in translation, whether translated for this
    turn or remembered from an earlier one: which of the two would tell one user whether
    another had recently sent the same words.
    """

    enabled: bool | None = None
    ran: bool | None = None
    translated: int | None = None
    failed: int | None = None


class BlendInfo(BaseModel):
    """Whether the blend ran (or why not) and with which parameters (blend mode)."""

    enabled: bool
    executed: bool
    reason: str
    alpha: float
    history_turns: int
    history_messages: int
    history_order: str
    history_roles: str
    # The message's cosine with the previous user question (the self-contained check).
    question_similarity: float | None = None
    translation: TranslationInfo

    @classmethod
    def of(cls, blend: BlendResult) -> BlendInfo:
        report = blend.translation
        translation = (
            TranslationInfo(
                enabled=report.enabled,
                ran=report.ran,
                translated=report.translated + report.from_cache,
                failed=report.failed,
            )
            if report is not None
            else TranslationInfo()
        )
        return cls(
            enabled=blend.reason != SKIP_DISABLED,
            executed=blend.executed,
            reason=blend.reason,
            alpha=blend.alpha,
            history_turns=blend.history_turns,
            history_messages=blend.history_messages,
            history_order=blend.order,
            history_roles=blend.roles,
            question_similarity=blend.question_similarity,
            translation=translation,
        )


class Bm25HistoryInfo(BaseModel):
    """Whether the history-aware BM25 leg ran (never in a dense-only retrieval), and its
    configured weight."""

    ran: bool
    weight: float


class RerankInfo(BaseModel):
    """Whether a reranker ran (or why not) and which query it scored against."""

    ran: bool
    reason: str
    query_kind: str | None
    query: str | None


class RetrievalInfo(BaseModel):
    """How the turn's retrieval ran. `condense` (condense mode), `blend` and the fusion
    fields (blend mode) are present only in their mode; the fusion fields only where the
    retrieval was hybrid (`RETRIEVER_HYBRID_RETRIEVAL_ENABLED=false` fuses nothing)."""

    multi_turn_mode: Literal["blend", "condense"]
    raw_query: str
    history_messages: int
    strategy: Literal["stateless", "blend", "condense"]
    query: str
    condense: CondenseInfo | None = None
    blend: BlendInfo | None = None
    bm25_history: Bm25HistoryInfo | None = None
    fusion_weights: list[float] | None = None
    rrf_k: int | None = None
    rrf_candidates: int | None = None
    hybrid: bool
    reranker: str | None
    rerank: RerankInfo
    k: int
    top_n: int

    @classmethod
    def of(cls, record: TurnRecord) -> RetrievalInfo:
        plan = record.plan
        fields: dict[str, Any] = {}
        if plan.condense is not None:
            fields["condense"] = CondenseInfo.of(plan.condense)
        if plan.blend is not None:
            fields["blend"] = BlendInfo.of(plan.blend)
        if plan.history_leg is not None:
            fields["bm25_history"] = Bm25HistoryInfo(
                ran=record.bm25_history_ran, weight=plan.history_leg.weight
            )
        if record.fusion is not None:
            fields["fusion_weights"] = list(record.fusion.weights)
            fields["rrf_k"] = record.fusion.rrf_k
            fields["rrf_candidates"] = record.fusion.candidates
        reranker = record.rerank.reranker
        rerank = (
            RerankInfo(
                ran=True, reason="reranked", query_kind=plan.rerank.kind, query=plan.rerank.text
            )
            if reranker is not None
            else RerankInfo(
                ran=False, reason=record.rerank.skip_reason, query_kind=None, query=None
            )
        )
        return cls(
            multi_turn_mode=plan.mode,
            raw_query=record.raw_query,
            history_messages=record.history_messages,
            strategy=plan.strategy,
            query=plan.text,
            **fields,
            hybrid=record.hybrid,
            reranker=reranker,
            rerank=rerank,
            k=record.k,
            top_n=record.top_n,
        )


class TurnMetadata(BaseModel):
    """How a turn was answered: its sources, how retrieval ran, stage timings, trace id."""

    source_documents: list[SourceDocument]
    retrieval: RetrievalInfo
    timings_ms: dict[str, float]
    trace_id: str | None

    @classmethod
    def of(cls, record: TurnRecord) -> TurnMetadata:
        return cls(
            source_documents=[SourceDocument.of(item) for item in record.sources],
            retrieval=RetrievalInfo.of(record),
            timings_ms=dict(record.timings_ms),
            trace_id=record.trace_id,
        )
