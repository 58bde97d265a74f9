"""HTTP client spans for the upstream calls, made by a thin wrapper around the transport.

Each call to an upstream gets a CLIENT span named by its method (`POST`), with the stable
HTTP semantic-convention attributes (`http.request.method`, `url.full`, `server.address`,
`server.port`, `http.response.status_code`, `error.type`), and carries the trace context
(`traceparent`) to the upstream. The span ends when the response headers have arrived, as
the OpenTelemetry httpx instrumentation does; a streamed body is read inside the caller's
own span (`chatqna.generate`). When the span is not recording (a trace the sampler
dropped), only the context is propagated: no attribute is built.
"""

from __future__ import annotations

import httpx
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

TRACER_NAME = "chatqna.http"


class TracedTransport(httpx.AsyncBaseTransport):
    """`inner`, with a client span around every request."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self._tracer = trace.get_tracer(TRACER_NAME)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        method = request.method
        with self._tracer.start_as_current_span(
            method, kind=SpanKind.CLIENT, record_exception=False, set_status_on_exception=False
        ) as span:
            propagate.inject(request.headers)
            recording = span.is_recording()
            if recording:
                url = request.url
                span.set_attributes(
                    {
                        "http.request.method": method,
                        "url.full": str(url.copy_with(username=None, password=None, query=None)),
                        "server.address": url.host,
                        "server.port": url.port or (443 if url.scheme == "https" else 80),
                    }
                )
            try:
                response = await self.inner.handle_async_request(request)
            except Exception as exc:
                if recording:
                    span.set_attribute("error.type", type(exc).__qualname__)
                    span.set_status(Status(StatusCode.ERROR, type(exc).__qualname__))
                raise
            if recording:
                status = response.status_code
                span.set_attribute("http.response.status_code", status)
                if status >= 400:
                    span.set_attribute("error.type", str(status))
                    span.set_status(Status(StatusCode.ERROR))
            return response

    async def aclose(self) -> None:
        await self.inner.aclose()
