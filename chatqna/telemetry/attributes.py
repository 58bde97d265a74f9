"""Span attributes built from pipeline values (kept out of the pipeline's own code).

Texts (queries, rewrites) are recorded only with `CHATQNA_TRACE_CONTENT=true`; ids, sizes,
scores and decisions always are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry.trace import Span, Status, StatusCode

from chatqna.documents import ScoredChunk
from chatqna.errors import CondenseFailed
from chatqna.multiturn.condense import CondenseOutcome
from chatqna.multiturn.rerank_query import RerankQuery
from chatqna.telemetry import names


def condense_ok(span: Span, outcome: CondenseOutcome, record_content: bool) -> None:
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
    span: Span, report: dict[str, Any], k: int, top_n: int, hybrid: bool, record_content: bool
) -> None:
    span.set_attribute(names.MULTI_TURN_MODE, str(report.get("multi_turn_mode")))
    span.set_attribute(names.RETRIEVAL_STRATEGY, str(report.get("strategy")))
    span.set_attribute(names.RETRIEVAL_K, k)
    span.set_attribute(names.RETRIEVAL_TOP_N, top_n)
    span.set_attribute(names.RETRIEVAL_HYBRID, hybrid)
    span.set_attribute(names.HISTORY_MESSAGES, int(report.get("history_messages", 0)))
    blend = report.get("blend")
    if isinstance(blend, dict):
        span.set_attribute(names.BLEND_EXECUTED, bool(blend["executed"]))
        span.set_attribute(names.BLEND_REASON, str(blend["reason"]))
        span.set_attribute(names.BLEND_ALPHA, float(blend["alpha"]))
        span.set_attribute(names.BLEND_HISTORY_TURNS, int(blend["history_turns"]))
        span.set_attribute(names.BLEND_HISTORY_MESSAGES, int(blend["history_messages"]))
        translation = blend.get("translation") or {}
        span.set_attribute(
            names.BLEND_TRANSLATED,
            int(translation.get("translated", 0)) + int(translation.get("from_cache", 0)),
        )
        span.set_attribute(names.BLEND_TRANSLATION_FAILED, int(translation.get("failed", 0)))
    history_leg = report.get("bm25_history")
    if isinstance(history_leg, dict):
        span.set_attribute(names.BM25_HISTORY_RAN, bool(history_leg["ran"]))
        span.set_attribute(names.BM25_HISTORY_WEIGHT, float(history_leg["weight"]))
    weights = report.get("fusion_weights")
    if isinstance(weights, list) and len(weights) == 2:
        span.set_attribute(names.FUSION_DENSE_WEIGHT, float(weights[0]))
        span.set_attribute(names.FUSION_BM25_WEIGHT, float(weights[1]))
    if isinstance(blend, dict) and "history_order" in blend:
        span.set_attribute(names.HISTORY_ORDER, str(blend["history_order"]))
        span.set_attribute(names.HISTORY_ROLES, str(blend["history_roles"]))
    if record_content:
        span.set_attribute(names.QUERY_TEXT, str(report.get("query", "")))


def reranker_selection(
    span: Span,
    reranker: str | None,
    candidates: int,
    kept: Sequence[ScoredChunk],
    query: RerankQuery,
    record_content: bool,
) -> None:
    span.set_attribute(names.RERANKER_NAME, reranker or "none")
    span.set_attribute(names.RERANKER_QUERY_KIND, query.kind if reranker else "none")
    if reranker and record_content:
        span.set_attribute(names.RERANKER_QUERY, query.text)
    span.set_attribute(names.RERANKER_CANDIDATES, candidates)
    span.set_attribute(names.RERANKER_KEPT_IDS, [item.chunk.id for item in kept])
    span.set_attribute(names.RERANKER_KEPT_SOURCES, [item.chunk.source for item in kept])
    span.set_attribute(names.RERANKER_KEPT_SCORES, [float(item.score) for item in kept])
