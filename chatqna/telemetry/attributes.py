"""Span attributes built from a turn's typed values (for `chatqna.telemetry.observer`).

Texts (queries, rewrites) are recorded only with `CHATQNA_TRACE_CONTENT=true`; ids, sizes,
scores and decisions always are. Nothing is built for a span that is not recording (a trace
the sampler dropped, or tracing off).
"""

from __future__ import annotations

from opentelemetry.trace import Span, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from chatqna.backends.protocols import GenerationParams, Usage
from chatqna.errors import CondenseFailed
from chatqna.multiturn.condense import STATUS_FAILED, CondenseOutcome
from chatqna.pipeline.record import TurnRecord
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
    span.set_attribute(names.CONDENSE_STATUS, STATUS_FAILED)
    span.set_attribute(names.CONDENSE_REASON, failure.reason or "")
    span.set_attribute(names.CONDENSE_LATENCY_MS, failure.latency_ms)
    span.set_attribute(names.CONDENSE_HISTORY_SIZE, failure.history_size)
    if failure.model:
        span.set_attribute(names.GEN_AI_REQUEST_MODEL, failure.model)
        span.set_attribute(names.GEN_AI_OPERATION, "chat")
    span.set_status(Status(StatusCode.ERROR, f"condense failed: {failure.reason}"))


def orchestrate(span: Span, record: TurnRecord, record_content: bool) -> None:
    if not span.is_recording():
        return
    plan = record.plan
    values: dict[str, AttributeValue] = {
        names.MULTI_TURN_MODE: plan.mode,
        names.RETRIEVAL_STRATEGY: plan.strategy,
        names.RETRIEVAL_K: record.k,
        names.RETRIEVAL_TOP_N: record.top_n,
        names.RETRIEVAL_HYBRID: record.hybrid,
        names.HISTORY_MESSAGES: record.history_messages,
    }
    blend = plan.blend
    if blend is not None:
        translation = blend.translation
        values[names.BLEND_EXECUTED] = blend.executed
        values[names.BLEND_REASON] = blend.reason
        values[names.BLEND_ALPHA] = float(blend.alpha)
        values[names.BLEND_HISTORY_TURNS] = blend.history_turns
        values[names.BLEND_HISTORY_MESSAGES] = blend.history_messages
        if blend.question_similarity is not None:
            values[names.BLEND_QUESTION_SIMILARITY] = blend.question_similarity
        values[names.BLEND_TRANSLATED] = (
            translation.translated + translation.from_cache if translation else 0
        )
        values[names.BLEND_TRANSLATION_FAILED] = translation.failed if translation else 0
        values[names.HISTORY_ORDER] = blend.order
        values[names.HISTORY_ROLES] = blend.roles
    leg, fusion = plan.history_leg, record.fusion
    if leg is not None:
        values[names.BM25_HISTORY_RAN] = record.bm25_history_ran
        values[names.BM25_HISTORY_WEIGHT] = float(leg.weight)
    if fusion is not None:
        values[names.FUSION_DENSE_WEIGHT] = float(fusion.weights[0])
        values[names.FUSION_BM25_WEIGHT] = float(fusion.weights[1])
    if record_content:
        values[names.QUERY_TEXT] = plan.text
    span.set_attributes(values)


def reranker_selection(
    span: Span, record: TurnRecord, candidates: int, record_content: bool
) -> None:
    if not span.is_recording():
        return
    reranker = record.rerank.reranker
    query = record.plan.rerank
    kept = record.sources
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


def generation_result(span: Span, usage: Usage | None, finish_reason: str | None) -> None:
    if usage is not None:
        span.set_attribute(names.GEN_AI_INPUT_TOKENS, usage.prompt_tokens)
        span.set_attribute(names.GEN_AI_OUTPUT_TOKENS, usage.completion_tokens)
    if finish_reason:
        span.set_attribute(names.GEN_AI_FINISH_REASON, [finish_reason])
