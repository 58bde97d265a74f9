"""HTTP client spans for the upstream calls, made by each `UpstreamClient` around its calls.

Each call to an upstream gets a CLIENT span named by its method (`POST`), with the stable
HTTP semantic-convention attributes (`http.request.method`, `url.full`, `server.address`,
`server.port`, `http.response.status_code`, `error.type`), and carries the W3C trace
context (`traceparent`, `tracestate`) to the upstream. The span ends when the response
headers have arrived, as the OpenTelemetry httpx instrumentation does; a streamed body is
read inside the caller's own span (`chatqna.generate`). In a trace the sampler dropped no
client span is made (it would be dropped too, see `chatqna.telemetry.tracing`): the
request only carries the dropped trace's context upstream, its sampled flag unset. With
tracing off (no SDK provider when the client is built), a call costs one check.

Per client, not by patching an HTTP library globally: only our upstream clients are traced.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from chatqna.telemetry.tracing import dropped, tracing_installed

TRACER_NAME = "chatqna.http"
W3C_TRACE_CONTEXT = TraceContextTextMapPropagator()


def url_full(url: str) -> str:
    """The URL without credentials or query string."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    return f"{parts.scheme}://{netloc}{parts.path}"


class _Untraced:
    """The call of a client while tracing is off: nothing to do."""

    __slots__ = ()

    def __enter__(self) -> _Untraced:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def status(self, code: int) -> None:
        return None


UNTRACED = _Untraced()


class _TracedCall:
    """One call's span; the trace context is written into `headers` on entry."""

    def __init__(self, spans: ClientSpans, method: str, path: str, headers: dict[str, str]):
        self._spans = spans
        self._method = method
        self._path = path
        self._headers = headers
        self._scope: Any = None
        self._span: trace.Span | None = None

    def __enter__(self) -> _TracedCall:
        if dropped(trace.get_current_span()):
            W3C_TRACE_CONTEXT.inject(self._headers)
            return self
        spans = self._spans
        self._scope = spans.tracer.start_as_current_span(
            self._method,
            kind=SpanKind.CLIENT,
            record_exception=False,
            set_status_on_exception=False,
        )
        span = self._scope.__enter__()
        W3C_TRACE_CONTEXT.inject(self._headers)
        if span.is_recording():
            self._span = span
            span.set_attributes(
                {
                    "http.request.method": self._method,
                    "url.full": spans.prefix + self._path.partition("?")[0],
                    "server.address": spans.host,
                    "server.port": spans.port,
                }
            )
        return self

    def status(self, code: int) -> None:
        span = self._span
        if span is None:
            return
        span.set_attribute("http.response.status_code", code)
        if code >= 400:
            span.set_attribute("error.type", str(code))
            span.set_status(Status(StatusCode.ERROR))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc_type is not None and self._span is not None and issubclass(exc_type, Exception):
            self._span.set_attribute("error.type", exc_type.__qualname__)
            self._span.set_status(Status(StatusCode.ERROR, exc_type.__qualname__))
        if self._scope is not None:
            self._scope.__exit__(exc_type, exc, traceback)


class ClientSpans:
    """The client spans of one upstream (`base_url`): its address is parsed once."""

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        self.prefix = url_full(base_url).rstrip("/")
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.tracer = trace.get_tracer(TRACER_NAME)
        # Decided once, as the client is built at start-up after tracing is set up: asking
        # the API for its provider reads the environment on every call while none is set.
        self.enabled = tracing_installed()

    def call(self, method: str, path: str, headers: dict[str, str]) -> _TracedCall | _Untraced:
        """A context for one call: a span around it, the trace context added to `headers`."""
        if not self.enabled:
            return UNTRACED
        return _TracedCall(self, method, path, headers)
