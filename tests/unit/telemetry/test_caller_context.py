"""`CallerContext`: the caller's context made current where no span is, through the global
propagator; a current span, an excluded path and the context after the request left alone."""

from __future__ import annotations

from collections.abc import Iterator

import httpx2
import pytest
from opentelemetry import baggage, propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.types import Receive, Scope, Send

from chatqna.telemetry.caller_context import CallerContext
from chatqna.telemetry.tracing import NoPropagation
from tests.unit.conftest import TRACER_PROVIDER

pytestmark = pytest.mark.anyio

CALLER_TRACE = 0x0AF7651916CD43DD8448EB211C80319C
CALLER_SPAN = 0xB7AD6B7169203331
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class Seen:
    """An ASGI app that records the current span's context and baggage, and answers 204."""

    def __init__(self) -> None:
        self.spans: list[trace.SpanContext] = []
        self.baggage: list[dict[str, object]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.spans.append(trace.get_current_span().get_span_context())
        self.baggage.append(dict(baggage.get_all()))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})


def excluded(scope: Scope) -> bool:
    return scope["path"] == "/v1/ready"


@pytest.fixture
def w3c_propagators() -> Iterator[None]:
    configured = propagate.get_global_textmap()
    propagate.set_global_textmap(
        CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])
    )
    yield
    propagate.set_global_textmap(configured)


async def get(app: CallerContext, path: str, headers: list[tuple[str, str]]) -> int:
    transport = httpx2.ASGITransport(app=app)
    async with httpx2.AsyncClient(transport=transport, base_url="http://localhost") as client:
        return (await client.get(path, headers=headers)).status_code


@pytest.mark.usefixtures("w3c_propagators")
async def test_with_no_span_current_the_callers_context_is_current_for_the_request() -> None:
    seen = Seen()
    app = CallerContext(seen, exclude=excluded)
    headers = [("traceparent", TRACEPARENT), ("baggage", "tenant=acme"), ("baggage", "tier=gold")]
    assert await get(app, "/v1/chatqna", headers) == 204
    (span,) = seen.spans
    assert (span.trace_id, span.span_id) == (CALLER_TRACE, CALLER_SPAN)
    assert span.is_remote and span.trace_flags.sampled
    assert seen.baggage == [{"tenant": "acme", "tier": "gold"}], "every baggage header is read"
    assert not trace.get_current_span().get_span_context().is_valid, "detached afterwards"


@pytest.mark.usefixtures("w3c_propagators")
async def test_a_current_span_and_an_excluded_path_are_left_as_they_are(
    spans: InMemorySpanExporter,
) -> None:
    seen = Seen()
    app = CallerContext(seen, exclude=excluded)
    assert await get(app, "/v1/ready", [("traceparent", TRACEPARENT)]) == 204
    with TRACER_PROVIDER.get_tracer("test").start_as_current_span("server") as server:
        assert await get(app, "/v1/chatqna", [("traceparent", TRACEPARENT)]) == 204
    assert not seen.spans[0].is_valid, "the probe runs in no trace"
    assert seen.spans[1] == server.get_span_context()


async def test_with_otel_propagators_none_nothing_is_taken() -> None:
    configured = propagate.get_global_textmap()
    propagate.set_global_textmap(NoPropagation())
    try:
        seen = Seen()
        await get(CallerContext(seen, exclude=excluded), "/", [("traceparent", TRACEPARENT)])
    finally:
        propagate.set_global_textmap(configured)
    assert not seen.spans[0].is_valid
