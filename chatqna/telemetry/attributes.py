"""Span attributes built from pipeline values (kept out of the pipeline's own code).

Texts (queries, rewrites) are recorded only with `CHATQNA_TRACE_CONTENT=true`; ids, sizes,
scores and decisions always are. Nothing is built for a span that is not recording (a trace
the sampler dropped, or tracing off).
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.trace import Span, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from chatqna.backends.protocols import GenerationParams
from chatqna.documents import ScoredChunk
from chatqna.errors import CondenseFailed
from chatqna.multiturn.condense import CondenseOutcome
from chatqna.multiturn.rerank_query import RerankQuery
from chatqna.pipeline.record import RetrievalReport
from chatqna.telemetry import names


def condense_ok(span: Span, outcome: CondenseOutcome, record_content: bool) -> None:
    if not span.is_recording():
        return
    span.set_attribute(names.CONDENSE_STATUS, outcome.status)
    span.set_attribute(names.CONDENSE_LATENCY_MS, outcome.latency_ms)
    span.set_attribute(names.CONDENSE_HISTORY_SIZE, outcome.history_size)
    if outcome.model:
        span.set_attribute(names.GEN_AI_REQUEST_MODEL, outcome.model)
        span.set_attribute(names.GEN_AI_OPERATION, "chat")
    if record_content and outcome.rewritten:
        span.set_attribute(names.CONDENSE_STANDALONE_QUERY, outcome.query)


def condense_failed(span: Span, failure: CondenseFailed) -> None:
    span.set_attribute(names.CONDENSE_STATUS, "failed")
    span.set_attribute(names.CONDENSE_REASON, failure.reason or "")
    span.set_attribute(names.CONDENSE_LATENCY_MS, failure.latency_ms)
    span.set_attribute(names.CONDENSE_HISTORY_SIZE, failure.history_size)
    if failure.model:
        span.set_attribute(names.GEN_AI_REQUEST_MODEL, failure.model)
        span.set_attribute(names.GEN_AI_OPERATION, "chat")
    span.set_status(Status(StatusCode.ERROR, f"condense failed: {failure.reason}"))


def orchestrate(
    span: Span, report: RetrievalReport, k: int, top_n: int, hybrid: bool, record_content: bool
) -> None:
    if not span.is_recording():
        return
    values: dict[str, AttributeValue] = {
        names.MULTI_TURN_MODE: report.multi_turn_mode,
        names.RETRIEVAL_STRATEGY: report.strategy,
        names.RETRIEVAL_K: k,
        names.RETRIEVAL_TOP_N: top_n,
        names.RETRIEVAL_HYBRID: hybrid,
        names.HISTORY_MESSAGES: report.history_messages,
    }
    blend = report.blend
    if blend is not None:
        translation = blend.translation
        values[names.BLEND_EXECUTED] = blend.executed
        values[names.BLEND_REASON] = blend.reason
        values[names.BLEND_ALPHA] = float(blend.alpha)
        values[names.BLEND_HISTORY_TURNS] = blend.history_turns
        values[names.BLEND_HISTORY_MESSAGES] = blend.history_messages
        values[names.BLEND_TRANSLATED] = int(translation.get("translated", 0)) + int(
            translation.get("from_cache", 0)
        )
        values[names.BLEND_TRANSLATION_FAILED] = int(translation.get("failed", 0))
        values[names.HISTORY_ORDER] = blend.order
        values[names.HISTORY_ROLES] = blend.roles
    fusion = report.fusion
    if fusion is not None:
        values[names.BM25_HISTORY_RAN] = fusion.bm25_history_ran
        values[names.BM25_HISTORY_WEIGHT] = float(fusion.bm25_history_weight)
        values[names.FUSION_DENSE_WEIGHT] = float(fusion.weights[0])
        values[names.FUSION_BM25_WEIGHT] = float(fusion.weights[1])
    if record_content:
        values[names.QUERY_TEXT] = report.query
    span.set_attributes(values)


def reranker_selection(
    span: Span,
    reranker: str | None,
    candidates: int,
    kept: Sequence[ScoredChunk],
    query: RerankQuery,
    record_content: bool,
) -> None:
    if not span.is_recording():
        return
    values: dict[str, AttributeValue] = {
        names.RERANKER_NAME: reranker or "none",
        names.RERANKER_QUERY_KIND: query.kind if reranker else "none",
    }
    if reranker and record_content:
        values[names.RERANKER_QUERY] = query.text
    values[names.RERANKER_CANDIDATES] = candidates
    # Tuples, as a span keeps a list it is given.
    values[names.RERANKER_KEPT_IDS] = tuple([item.chunk.id for item in kept])
    values[names.RERANKER_KEPT_SOURCES] = tuple([item.chunk.source for item in kept])
    values[names.RERANKER_KEPT_SCORES] = tuple([float(item.score) for item in kept])
    span.set_attributes(values)


def generation(
    parent: Span, model: str, params: GenerationParams
) -> dict[str, AttributeValue] | None:
    """The attributes `chatqna.generate` starts with (GenAI conventions), or None when
    `parent` records nothing (no span will be made to hold them)."""
    if not parent.is_recording():
        return None
    values: dict[str, AttributeValue] = {
        names.GEN_AI_OPERATION: "chat",
        names.GEN_AI_REQUEST_MODEL: model,
    }
    if params.max_tokens is not None:
        values[names.GEN_AI_REQUEST_MAX_TOKENS] = params.max_tokens
    if params.temperature is not None:
        values[names.GEN_AI_REQUEST_TEMPERATURE] = params.temperature
    return values
