"""Client spans of upstream calls (made by `UpstreamClient`): one per request, with the
HTTP attributes, and the context sent along by the propagators (also in a trace the sampler
dropped, and with opentelemetry-instrumentation-httpx's instrumentation of httpx2 active)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx2
import pytest
import respx
from opentelemetry import baggage, context, trace
from opentelemetry.instrumentation.httpx import HTTPX2ClientInstrumentor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

from chatqna.telemetry.client_spans import untraced_calls, url_full
from chatqna.upstream.client import UpstreamClient
from tests.unit.conftest import TRACER_PROVIDER

pytestmark = pytest.mark.anyio


def upstream_on(base_url: str, transport: httpx2.AsyncBaseTransport) -> UpstreamClient:
    return UpstreamClient(
        base_url, timeout_seconds=5, connect_timeout_seconds=1, transport=transport
    )


def client(status: int, seen: list[httpx2.Request]) -> UpstreamClient:
    def answer(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return httpx2.Response(status, json={})

    return upstream_on("http://tei.test:8080", httpx2.MockTransport(answer))


async def test_a_call_is_one_client_span_with_the_context_sent_along(
    spans: InMemorySpanExporter,
) -> None:
    seen: list[httpx2.Request] = []
    upstream = client(200, seen)
    await upstream.post("/v1/embeddings?x=1", {"input": ["q"]})
    await upstream.aclose()
    (span,) = spans.get_finished_spans()
    assert span.name == "POST /v1/embeddings" and span.kind == SpanKind.CLIENT
    assert dict(span.attributes or {}) == {
        "http.request.method": "POST",
        "url.full": "http://tei.test:8080/v1/embeddings",
        "url.template": "/v1/embeddings",
        "server.address": "tei.test",
        "server.port": 8080,
        "http.response.status_code": 200,
    }
    trace_id = format(span.context.trace_id, "032x")
    assert trace_id in seen[0].headers["traceparent"]


@pytest.mark.parametrize(
    ("base_url", "method", "path", "name"),
    [
        ("http://tei.test", "POST", "/rerank", "POST /rerank"),
        ("http://llm.test/", "GET", "/v1/models", "GET /v1/models"),
        ("http://gateway.test/tei/", "POST", "/v1/embeddings", "POST /tei/v1/embeddings"),
    ],
)
async def test_a_span_is_named_by_method_and_the_path_template(
    spans: InMemorySpanExporter, base_url: str, method: str, path: str, name: str
) -> None:
    upstream = upstream_on(base_url, httpx2.MockTransport(lambda _: httpx2.Response(200)))
    await upstream.request(method, path, {} if method == "POST" else None)
    await upstream.aclose()
    (span,) = spans.get_finished_spans()
    assert span.name == name
    assert (span.attributes or {})["url.template"] == name.partition(" ")[2]


async def test_the_callers_attributes_go_on_the_span(spans: InMemorySpanExporter) -> None:
    upstream = client(200, [])
    await upstream.post("/v1/embeddings", {"input": ["q", "h"]}, {"chatqna.embedding.inputs": 2})
    (span,) = spans.get_finished_spans()
    assert (span.attributes or {})["chatqna.embedding.inputs"] == 2


async def test_an_error_status_marks_the_span(spans: InMemorySpanExporter) -> None:
    upstream = client(503, [])
    reply = await upstream.post("/rerank", {})
    assert reply.status == 503
    (span,) = spans.get_finished_spans()
    assert span.status.status_code == StatusCode.ERROR
    assert (span.attributes or {})["error.type"] == "503"


async def test_a_transport_failure_marks_the_span_and_propagates(
    spans: InMemorySpanExporter,
) -> None:
    def refuse(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ConnectError("refused", request=request)

    upstream = upstream_on("http://llm.test", httpx2.MockTransport(refuse))
    with pytest.raises(httpx2.ConnectError):
        await upstream.get("/v1/models")
    (span,) = spans.get_finished_spans()
    assert (span.attributes or {})["error.type"] == "ConnectError"
    assert span.status.status_code == StatusCode.ERROR


async def test_a_call_cut_off_by_its_whole_call_bound_marks_the_span(
    spans: InMemorySpanExporter,
) -> None:
    async def never(request: httpx2.Request) -> httpx2.Response:
        await asyncio.Event().wait()  # never set
        raise AssertionError("unreachable")  # pragma: no cover

    upstream = upstream_on("http://tei.test", httpx2.MockTransport(never))
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):  # arrives inside the call as a cancellation
            await upstream.post("/v1/embeddings", {})
    await upstream.aclose()
    (span,) = spans.get_finished_spans()
    assert (span.attributes or {})["error.type"] == "CancelledError"
    assert span.status.status_code == StatusCode.ERROR


async def test_a_dropped_trace_gets_no_recorded_span_but_its_context_goes_along(
    spans: InMemorySpanExporter,
) -> None:
    state = TraceState([("vendor", "v1")])
    parent = SpanContext(
        0x0AF7651916CD43DD8448EB211C80319C,
        0xB7AD6B7169203331,
        True,
        TraceFlags(TraceFlags.DEFAULT),
        state,
    )
    seen: list[httpx2.Request] = []
    upstream = client(200, seen)
    with trace.use_span(NonRecordingSpan(parent)):
        await upstream.post("/v1/embeddings", {"input": ["q"]})
        await upstream.post("/rerank", {"query": "q"})
    assert spans.get_finished_spans() == ()
    for request in seen:
        # No client span was started: the dropped parent's own context goes along.
        version, trace_id, parent_id, flags = request.headers["traceparent"].split("-")
        assert (version, trace_id, flags) == ("00", "0af7651916cd43dd8448eb211c80319c", "00")
        assert parent_id == "b7ad6b7169203331"
        assert request.headers["tracestate"] == "vendor=v1"


async def test_baggage_goes_along_with_the_default_propagators(
    spans: InMemorySpanExporter,
) -> None:
    seen: list[httpx2.Request] = []
    upstream = client(200, seen)
    token = context.attach(baggage.set_baggage("tenant", "blue"))
    try:
        await upstream.post("/v1/embeddings", {"input": ["q"]})
    finally:
        context.detach(token)
    assert seen[0].headers["baggage"] == "tenant=blue"
    assert "traceparent" in seen[0].headers


@pytest.mark.parametrize(
    ("url", "full"),
    [
        ("http://tei.test:8080/v1/embeddings?x=1", "http://tei.test:8080/v1/embeddings"),
        ("http://user:secret@[::1]:8000/a%20b?q=2", "http://[::1]:8000/a%20b"),
        ("https://llm.test/v1/chat/completions", "https://llm.test/v1/chat/completions"),
    ],
)
def test_the_full_url_has_no_credentials_and_no_query(url: str, full: str) -> None:
    assert url_full(url) == full


async def test_a_streamed_call_is_one_span_that_ends_with_the_headers(
    spans: InMemorySpanExporter,
) -> None:
    seen: list[httpx2.Request] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return httpx2.Response(200, content=b"data: [DONE]\n\n")

    upstream = upstream_on("http://llm.test:9000/", httpx2.MockTransport(answer))
    reply = await upstream.open_stream("/v1/chat/completions", {"stream": True})
    (span,) = spans.get_finished_spans()  # ended before the body is read
    assert [chunk async for chunk in reply.chunks()] == [b"data: [DONE]\n\n"]
    await reply.aclose()
    assert (span.attributes or {})["url.full"] == "http://llm.test:9000/v1/chat/completions"
    assert seen[0].headers["accept"] == "text/event-stream"
    assert format(span.context.span_id, "016x") in seen[0].headers["traceparent"]


async def test_without_a_tracer_provider_calls_start_no_span_and_send_no_context(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(trace, "get_tracer_provider", trace.ProxyTracerProvider)
    seen: list[httpx2.Request] = []
    upstream = client(200, seen)
    await upstream.post("/v1/embeddings", {"input": ["q"]})
    assert trace.get_current_span() is trace.INVALID_SPAN
    assert "traceparent" not in seen[0].headers


@pytest.fixture
def httpx2_instrumented() -> Iterator[None]:
    """opentelemetry-instrumentation-httpx on every httpx2 transport of the process, as
    `opentelemetry-instrument` sets it up when the package is installed (its
    `HTTPX2ClientInstrumentor`: the upstream clients are httpx2's)."""
    instrumentor = HTTPX2ClientInstrumentor()
    instrumentor.instrument(tracer_provider=TRACER_PROVIDER)
    yield
    instrumentor.uninstrument()


@pytest.mark.usefixtures("httpx2_instrumented")
async def test_under_the_httpx2_instrumentation_a_call_is_still_our_one_span(
    spans: InMemorySpanExporter,
) -> None:
    # httpcore2 is mocked, so the requests go through httpx2's own (instrumented) transport.
    with respx.mock(using="httpcore2") as router:
        route = router.route(host="tei.test").respond(200, json={})
        async with httpx2.AsyncClient() as other:  # any other client: instrumented
            await other.get("http://tei.test:8080/health")
        (theirs,) = spans.get_finished_spans()
        assert theirs.instrumentation_scope.name == "opentelemetry.instrumentation.httpx"  # type: ignore[union-attr]
        spans.clear()
        upstream = UpstreamClient(
            "http://tei.test:8080", timeout_seconds=5, connect_timeout_seconds=1
        )
        await upstream.post("/v1/embeddings", {"input": ["q"]})
        with untraced_calls():  # a readiness probe's
            await upstream.get("/info")
        await upstream.aclose()
    (span,) = spans.get_finished_spans()
    assert span.name == "POST /v1/embeddings"
    assert span.instrumentation_scope.name == "chatqna.http"  # type: ignore[union-attr]
    sent = route.calls[1].request.headers["traceparent"]
    assert sent.split("-")[2] == format(span.context.span_id, "016x")
