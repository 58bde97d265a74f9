"""The request's server span: names, parents, the caller's trace, statuses, attributes,
excluded paths, streamed answers, header capture, and nothing at all for a dropped trace."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import anyio
import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode
from starlette.types import Message, Receive, Scope, Send

from chatqna.app import NO_FASTAPI_TELEMETRY
from chatqna.telemetry.server_spans import (
    EXCHANGE_KEY,
    ServerSpanMiddleware,
    incoming_context,
    report_status,
    server_address,
)
from chatqna.telemetry.spans import InMemorySpans, RecordedSpan, Sampler, ServiceTracerProvider
from chatqna.telemetry.tracing import tracer
from tests.unit.conftest import TRACER_PROVIDER

pytestmark = pytest.mark.anyio

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
FRAMES = [b"data: one\n\n", b"data: two\n\n", b"data: [DONE]\n\n"]


def service(provider: ServiceTracerProvider = TRACER_PROVIDER, **options: object) -> FastAPI:
    app = FastAPI(telemetry=NO_FASTAPI_TELEMETRY)  # FastAPI's own server span off, as ours

    @app.get("/items/{item}")
    async def item(item: str) -> dict[str, str]:
        with tracer().start_as_current_span("child"):
            return {"item": item}

    @app.get("/unavailable")
    async def unavailable() -> JSONResponse:
        return JSONResponse({"error": "busy"}, status_code=503)

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("broken")

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        async def frames() -> AsyncIterator[bytes]:
            for frame in FRAMES:
                yield frame

        return StreamingResponse(frames(), media_type="text/event-stream")

    @app.get("/v1/health_check")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    app.add_middleware(ServerSpanMiddleware, tracer_provider=provider, **options)
    return app


def client(app: FastAPI) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://chatqna.test:8888")


def server_spans(spans: InMemorySpans) -> list[RecordedSpan]:
    return [s for s in spans.get_finished_spans() if s.kind == SpanKind.SERVER]


async def test_a_request_is_one_server_span_named_by_its_route_with_its_stages_inside(
    spans: InMemorySpans,
) -> None:
    async with client(service()) as http:
        response = await http.get("/items/7?q=secret", headers={"user-agent": "probe/1"})
    assert response.status_code == 200
    (server,) = server_spans(spans)
    (child,) = [s for s in spans.get_finished_spans() if s.name == "child"]
    assert server.name == "GET /items/{item}"
    assert server.parent is None, "no traceparent: a new trace"
    assert child.parent is not None and server.context is not None
    assert child.parent.span_id == server.context.span_id
    assert child.context is not None and child.context.trace_id == server.context.trace_id
    assert dict(server.attributes or {}) == {
        "http.request.method": "GET",
        "url.scheme": "http",
        "url.path": "/items/7",
        "http.route": "/items/{item}",
        "server.address": "chatqna.test",
        "server.port": 8888,
        "client.address": "127.0.0.1",
        "network.protocol.version": "1.1",
        "user_agent.original": "probe/1",
        "http.response.status_code": 200,
    }
    assert server.status.status_code == StatusCode.UNSET


async def test_each_request_records_its_own_client_and_host_though_sets_are_kept(
    spans: InMemorySpans,
) -> None:
    asked = [
        ("http://chatqna.test:8888", "probe/1"),
        ("http://chatqna.test:8888", "probe/2"),
        ("http://other.test:9000", "probe/1"),
        ("http://chatqna.test:8888", "probe/1"),
    ]
    for base_url, agent in asked:
        transport = httpx.ASGITransport(app=service(), raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url=base_url) as http:
            await http.get("/items/7", headers={"user-agent": agent})
    recorded = [
        (
            s.attributes["server.address"],
            s.attributes["server.port"],
            s.attributes["user_agent.original"],
        )
        for s in server_spans(spans)
    ]
    assert recorded == [
        ("chatqna.test", 8888, "probe/1"),
        ("chatqna.test", 8888, "probe/2"),
        ("other.test", 9000, "probe/1"),
        ("chatqna.test", 8888, "probe/1"),
    ]
    first, _, _, last = server_spans(spans)
    last.attributes["user_agent.original"] = "changed"
    assert first.attributes["user_agent.original"] == "probe/1", "each span has its own copy"


async def test_the_callers_traceparent_is_continued(spans: InMemorySpans) -> None:
    traceparent = f"00-{TRACE_ID}-{PARENT_ID}-01"
    async with client(service()) as http:
        await http.get("/items/1", headers={"traceparent": traceparent})
    (server,) = server_spans(spans)
    assert server.context is not None and server.parent is not None
    assert format(server.context.trace_id, "032x") == TRACE_ID
    assert format(server.parent.span_id, "016x") == PARENT_ID
    assert server.parent.is_remote


@pytest.mark.parametrize("traceparent", ["00-not-a-trace-01", f"00-{'0' * 32}-{PARENT_ID}-01"])
async def test_a_malformed_traceparent_starts_a_new_trace(
    spans: InMemorySpans, traceparent: str
) -> None:
    async with client(service()) as http:
        await http.get("/items/1", headers={"traceparent": traceparent})
    (server,) = server_spans(spans)
    assert server.parent is None


async def test_the_tracestate_comes_along() -> None:
    headers = [
        (b"traceparent", f"00-{TRACE_ID}-{PARENT_ID}-01".encode()),
        (b"tracestate", b"vendor=abc"),
    ]
    parent = trace.get_current_span(incoming_context(dict(headers))).get_span_context()
    assert parent.is_remote and parent.trace_state.get("vendor") == "abc"


@pytest.mark.parametrize("path", ["/v1/health_check", "/metrics", "/v1/ready"])
async def test_probes_and_the_scrape_make_no_span(spans: InMemorySpans, path: str) -> None:
    async with client(service()) as http:
        await http.get(path)
    assert spans.get_finished_spans() == ()


async def test_a_5xx_answer_marks_the_span_an_error(spans: InMemorySpans) -> None:
    async with client(service()) as http:
        await http.get("/unavailable")
    (server,) = server_spans(spans)
    assert server.status.status_code == StatusCode.ERROR
    assert (server.attributes or {})["http.response.status_code"] == 503
    assert (server.attributes or {})["error.type"] == "503"


async def test_a_4xx_answer_is_not_an_error_and_an_unknown_path_has_no_route(
    spans: InMemorySpans,
) -> None:
    async with client(service()) as http:
        await http.get("/nowhere")
    (server,) = server_spans(spans)
    assert server.name == "GET"
    assert "http.route" not in (server.attributes or {})
    assert (server.attributes or {})["http.response.status_code"] == 404
    assert server.status.status_code == StatusCode.UNSET


async def test_an_exception_is_recorded_with_a_500(spans: InMemorySpans) -> None:
    async with client(service()) as http:
        response = await http.get("/boom")
    assert response.status_code == 500
    (server,) = server_spans(spans)
    assert server.status.status_code == StatusCode.ERROR
    assert (server.attributes or {})["error.type"] == "RuntimeError"
    assert (server.attributes or {})["http.response.status_code"] == 500
    assert [event.name for event in server.events] == ["exception"]


def scope_of(path: str) -> Scope:
    return {
        "type": "http",
        "method": "GET",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "scheme": "http",
        "http_version": "1.1",
        "headers": [(b"host", b"chatqna.test")],
        "client": ("10.0.0.9", 5000),
        "server": ("10.0.0.1", 80),
    }


def requests() -> Receive:
    """The request's one empty body, then nothing: the client stays connected."""
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if delivered:
            await anyio.sleep_forever()
        delivered = True
        return {"type": "http.request", "body": b"", "more_body": False}

    return receive


async def test_a_streamed_answers_span_ends_after_its_last_frame(
    spans: InMemorySpans,
) -> None:
    sent: list[tuple[bytes, int, int]] = []  # frame, when, server spans finished by then

    async def send(message: Message) -> None:
        if message["type"] == "http.response.body":
            sent.append((message["body"], time.time_ns(), len(server_spans(spans))))

    await service()(scope_of("/stream"), requests(), send)
    assert [frame for frame, _, _ in sent if frame] == FRAMES
    assert all(finished == 0 for _, _, finished in sent), "the span was open for every frame"
    (server,) = server_spans(spans)
    assert server.end_time is not None and server.end_time >= sent[-1][1]
    assert (server.attributes or {})["http.response.status_code"] == 200


async def test_a_stream_cut_short_still_ends_its_span(spans: InMemorySpans) -> None:
    async def cut_short(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: one\n\n", "more_body": True})

    async def send(message: Message) -> None:
        pass

    middleware = ServerSpanMiddleware(cut_short, TRACER_PROVIDER)
    await middleware(scope_of("/v1/chatqna"), requests(), send)
    (server,) = server_spans(spans)
    assert (server.attributes or {})["http.response.status_code"] == 200
    assert (server.attributes or {})["server.address"] == "chatqna.test"
    assert (server.attributes or {})["client.address"] == "10.0.0.9"


async def test_a_dropped_trace_exports_nothing_and_leaves_send_alone(
    spans: InMemorySpans,
) -> None:
    dropped = InMemorySpans()
    provider = ServiceTracerProvider(dropped, sampler=Sampler("always_off"))
    seen: dict[str, object] = {}

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen["send"] = send
        seen["trace"] = trace.get_current_span().get_span_context()
        with tracer().start_as_current_span("chatqna.orchestrate"):  # the always-on provider
            pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def send(message: Message) -> None:
        pass

    await ServerSpanMiddleware(app, provider)(scope_of("/v1/chatqna"), requests(), send)
    assert seen["send"] is send, "send is not wrapped"
    context = seen["trace"]
    assert isinstance(context, trace.SpanContext)
    assert context.is_valid and not context.trace_flags.sampled, "a trace id all the same"
    assert dropped.get_finished_spans() == ()
    assert spans.get_finished_spans() == (), "no stage span under a dropped request"


async def test_captured_headers_are_recorded_and_credentials_redacted(
    spans: InMemorySpans,
) -> None:
    app = service(capture_request_headers=["user-agent", "authorization", "x-.*"])
    headers = {
        "authorization": "Bearer ck-live-1",
        "x-api-key": "ck-live-2",
        "x-request-id": "r-17",
        "accept": "text/plain",
    }
    async with client(app) as http:
        await http.get("/items/1", headers=headers)
    (server,) = server_spans(spans)
    attributes = server.attributes or {}
    assert attributes["http.request.header.authorization"] == ("[REDACTED]",)
    assert attributes["http.request.header.x-api-key"] == ("[REDACTED]",)
    assert attributes["http.request.header.x-request-id"] == ("r-17",)
    assert "http.request.header.user-agent" in attributes
    assert "http.request.header.accept" not in attributes, "only the headers asked for"


async def test_no_header_is_recorded_unless_asked_for(spans: InMemorySpans) -> None:
    async with client(service()) as http:
        await http.get("/items/1", headers={"authorization": "Bearer ck-live-1"})
    (server,) = server_spans(spans)
    assert not any(key.startswith("http.request.header.") for key in server.attributes or {})


@pytest.mark.parametrize(
    ("host", "address", "port"),
    [
        ("chatqna.test:8888", "chatqna.test", 8888),
        ("chatqna.test", "chatqna.test", 80),
        ("[::1]:9000", "::1", 9000),
        ("[::1]", "::1", 80),
        (None, "10.0.0.1", 80),
    ],
)
def test_server_address_from_the_host_header_or_the_socket(
    host: str | None, address: str, port: int
) -> None:
    assert server_address(host, scope_of("/")) == (address, port)


async def test_a_status_reported_inside_reaches_the_span_and_send_is_not_wrapped(
    spans: InMemorySpans,
) -> None:
    seen: dict[str, object] = {}

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen["send"] = send
        report_status(scope, 429)  # as the metrics middleware does on `http.response.start`
        await send({"type": "http.response.start", "status": 429, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def send(message: Message) -> None:
        pass

    scope = scope_of("/v1/chatqna")
    middleware = ServerSpanMiddleware(app, TRACER_PROVIDER, status_reported_inside=True)
    await middleware(scope, requests(), send)
    assert seen["send"] is send, "send is passed on as it came"
    (server,) = server_spans(spans)
    assert (server.attributes or {})["http.response.status_code"] == 429
    assert EXCHANGE_KEY not in scope, "the scope keeps no reference to the ended exchange"


async def test_without_a_report_inside_the_middleware_reads_the_status_itself(
    spans: InMemorySpans,
) -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def send(message: Message) -> None:
        pass

    await ServerSpanMiddleware(app, TRACER_PROVIDER)(scope_of("/v1/chatqna"), requests(), send)
    (server,) = server_spans(spans)
    assert (server.attributes or {})["http.response.status_code"] == 404
