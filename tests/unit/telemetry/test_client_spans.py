"""Client spans of upstream calls: one per request, attributes only when recording, and the
trace context sent along (alone, in a trace the sampler dropped)."""

from __future__ import annotations

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, StatusCode

from chatqna.telemetry.client_spans import TracedTransport, url_full

pytestmark = pytest.mark.anyio


def client(status: int, seen: list[httpx.Request]) -> httpx.AsyncClient:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, json={})

    transport = TracedTransport(httpx.MockTransport(answer))
    return httpx.AsyncClient(base_url="http://tei.test:8080", transport=transport)


async def test_a_call_is_one_client_span_with_the_context_sent_along(
    spans: InMemorySpanExporter,
) -> None:
    seen: list[httpx.Request] = []
    async with client(200, seen) as upstream:
        await upstream.post("/v1/embeddings?x=1", json={"input": ["q"]})
    (span,) = spans.get_finished_spans()
    assert span.name == "POST" and span.kind == SpanKind.CLIENT
    assert dict(span.attributes or {}) == {
        "http.request.method": "POST",
        "url.full": "http://tei.test:8080/v1/embeddings",
        "server.address": "tei.test",
        "server.port": 8080,
        "http.response.status_code": 200,
    }
    trace_id = format(span.context.trace_id, "032x")
    assert trace_id in seen[0].headers["traceparent"]


async def test_an_error_status_marks_the_span(spans: InMemorySpanExporter) -> None:
    async with client(503, []) as upstream:
        await upstream.post("/rerank", json={})
    (span,) = spans.get_finished_spans()
    assert span.status.status_code == StatusCode.ERROR
    assert (span.attributes or {})["error.type"] == "503"


async def test_a_transport_failure_marks_the_span_and_propagates(
    spans: InMemorySpanExporter,
) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    upstream = httpx.AsyncClient(transport=TracedTransport(httpx.MockTransport(refuse)))
    with pytest.raises(httpx.ConnectError):
        await upstream.get("http://llm.test/v1/models")
    (span,) = spans.get_finished_spans()
    assert (span.attributes or {})["error.type"] == "ConnectError"
    assert span.status.status_code == StatusCode.ERROR


async def test_a_dropped_trace_gets_no_client_span_but_its_context_goes_along(
    spans: InMemorySpanExporter,
) -> None:
    context = SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, False)
    seen: list[httpx.Request] = []
    async with client(200, seen) as upstream:
        with trace.use_span(NonRecordingSpan(context)):
            await upstream.post("/v1/embeddings", json={"input": ["q"]})
    assert spans.get_finished_spans() == ()
    traceparent = seen[0].headers["traceparent"]
    assert traceparent == "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"


@pytest.mark.parametrize(
    ("url", "full"),
    [
        ("http://tei.test:8080/v1/embeddings?x=1", "http://tei.test:8080/v1/embeddings"),
        ("http://user:secret@[::1]:8000/a%20b?q=2", "http://[::1]:8000/a%20b"),
        ("https://llm.test/v1/chat/completions", "https://llm.test/v1/chat/completions"),
    ],
)
def test_the_full_url_has_no_credentials_and_no_query(url: str, full: str) -> None:
    assert url_full(httpx.URL(url)) == full
