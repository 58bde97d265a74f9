"""The turn observer: span attributes and metrics from a turn's typed record."""

from __future__ import annotations

import numpy as np
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import generate_latest

from chatqna.errors import CondenseFailed, UpstreamError, UpstreamTimeout
from chatqna.multiturn.blend import BlendResult
from chatqna.multiturn.condense import CondenseOutcome
from chatqna.multiturn.rerank_query import RerankQuery
from chatqna.multiturn.strategy import HistoryLeg, QueryPlan
from chatqna.multiturn.translate import TranslationReport
from chatqna.pipeline.record import Fusion, RerankRecord, TurnRecord
from chatqna.telemetry import names
from chatqna.telemetry.metrics import ServiceMetrics
from chatqna.telemetry.observer import TurnTelemetry
from chatqna.telemetry.tracing import tracer

VECTOR = np.ones(4, dtype=np.float32)


def record(plan: QueryPlan, fusion: Fusion | None = None) -> TurnRecord:
    return TurnRecord(
        raw_query="And then?",
        history_messages=2,
        plan=plan,
        fusion=fusion,
        rerank=RerankRecord(None, "disabled"),
        hybrid=True,
        k=4,
        top_n=2,
        sources=(),
        timings_ms={"embed": 2.0, "total": 10.0},
        trace_id=None,
    )


def blend_plan() -> QueryPlan:
    translation = TranslationReport(True, True, translated=1, from_cache=2, failed=1)
    blend = BlendResult(VECTOR, VECTOR, True, "executed", 0.7, 2, 2, translation=translation)
    return QueryPlan(
        mode="blend",
        strategy="blend",
        text="And then?",
        embedding=VECTOR,
        rerank=RerankQuery("And then?", VECTOR, "conversation"),
        blend=blend,
        history_leg=HistoryLeg(True, 0.3, "Refunds?"),
    )


def metrics_text(metrics: ServiceMetrics) -> str:
    return generate_latest(metrics.registry).decode()


def test_the_plan_becomes_orchestrate_attributes_and_the_blend_metric(
    spans: InMemorySpanExporter,
) -> None:
    metrics = ServiceMetrics()
    observer = TurnTelemetry(metrics, record_content=False)
    span = tracer().start_span(names.SPAN_ORCHESTRATE)
    observer.planned(span, record(blend_plan(), Fusion((1.0, 0.2), 60, 50)))
    span.end()
    (finished,) = spans.get_finished_spans()
    values = finished.attributes or {}
    assert values[names.BLEND_TRANSLATED] == 3 and values[names.BLEND_TRANSLATION_FAILED] == 1
    assert values[names.HISTORY_MESSAGES] == 2 and values[names.BM25_HISTORY_RAN] is True
    assert values[names.FUSION_BM25_WEIGHT] == 0.2
    assert names.QUERY_TEXT not in values
    assert 'chatqna_blend_total{executed="true",reason="executed"} 1.0' in metrics_text(metrics)


def test_outcomes_failures_and_timings_become_metrics() -> None:
    metrics = ServiceMetrics()
    observer = TurnTelemetry(metrics, record_content=True)
    span = tracer().start_span(names.SPAN_QUERY_CONDENSE)
    observer.condensed(span, CondenseOutcome("skipped_no_history", "q", "q", 0))
    observer.condense_failed(span, CondenseFailed("timeout"))
    span.end()
    observer.failed(CondenseFailed("timeout"))
    observer.failed(UpstreamError("down", backend="embedder"))
    observer.failed(ValueError("not a service error"))
    plan = QueryPlan("blend", "stateless", "q", VECTOR, RerankQuery("q", VECTOR, "message"))
    observer.answered(record(plan))
    text = metrics_text(metrics)
    assert 'chatqna_condense_total{reason="",status="skipped_no_history"} 1.0' in text
    assert 'chatqna_condense_total{reason="timeout",status="failed"} 1.0' in text
    assert 'chatqna_upstream_errors_total{backend="embedder",error="upstream_error"} 1.0' in text
    assert 'chatqna_stage_seconds_count{stage="total"} 1.0' in text


@pytest.mark.parametrize("backend", ["condense_llm", "rewrite_llm", "llm"])
def test_a_rewrite_failed_by_its_llm_counts_as_that_upstreams_error(backend: str) -> None:
    metrics = ServiceMetrics()
    observer = TurnTelemetry(metrics, record_content=False)
    try:
        try:
            raise UpstreamTimeout("slow", backend=backend)
        except UpstreamTimeout as exc:
            raise CondenseFailed("timeout", "no reply") from exc
    except CondenseFailed as failure:
        observer.failed(failure)
    observer.failed(CondenseFailed("empty_query", "blank"))  # the LLM answered: no error
    text = metrics_text(metrics)
    assert 'chatqna_condense_total{reason="timeout",status="failed"} 1.0' in text
    assert 'chatqna_condense_total{reason="empty_query",status="failed"} 1.0' in text
    line = f'chatqna_upstream_errors_total{{backend="{backend}",error="upstream_timeout"}} 1.0'
    assert line in text
    assert text.count("chatqna_upstream_errors_total{") == 1
