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
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.util.types import AttributeValue

from chatqna import __version__
from chatqna.telemetry.spans import DroppedSpan, Tracer, current_span, write_trace_context
from chatqna.telemetry.tracing import tracing_installed

TRACER_NAME = "chatqna.http"
CALL_ATTRIBUTE_SETS = 256


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
    """One call's recording span: its status and its end (made by `ClientSpans.call`)."""

    __slots__ = ("_span",)

    def __init__(self, span: trace.Span) -> None:
        self._span = span

    def __enter__(self) -> _TracedCall:
        return self

    def status(self, code: int) -> None:
        span = self._span
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
        span = self._span
        if exc_type is not None and issubclass(exc_type, Exception):
            span.set_attribute("error.type", exc_type.__qualname__)
            span.set_status(Status(StatusCode.ERROR, exc_type.__qualname__))
        span.end()


class ClientSpans:
    """The client spans of one upstream (`base_url`): its address is parsed once."""

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        self.prefix = url_full(base_url).rstrip("/")
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.tracer = trace.get_tracer(TRACER_NAME, __version__)
        self._attributes: dict[tuple[str, str], dict[str, AttributeValue]] = {}
        # Decided once, as the client is built at start-up after tracing is set up: asking
        # the API for its provider reads the environment on every call while none is set.
        self.enabled = tracing_installed()

    def attributes(self, method: str, path: str) -> dict[str, AttributeValue]:
        """A call's request attributes, built once per method and path (shared: the span
        copies them). Bounded: emptied when full."""
        key = (method, path)
        attributes = self._attributes.get(key)
        if attributes is None:
            attributes = {
                "http.request.method": method,
                "url.full": self.prefix + path.partition("?")[0],
                "server.address": self.host,
                "server.port": self.port,
            }
            if len(self._attributes) >= CALL_ATTRIBUTE_SETS:
                self._attributes.clear()
            self._attributes[key] = attributes
        return attributes

    def call(self, method: str, path: str, headers: dict[str, str]) -> _TracedCall | _Untraced:
        """A context for one call: its span (started now), the trace context added to
        `headers`."""
        if not self.enabled:
            return UNTRACED
        parent = current_span()
        if type(parent) is DroppedSpan:  # a dropped trace (most, when sampled): no span
            headers.update(parent.trace_headers())
            return UNTRACED
        context = parent.get_span_context()
        if context[5] and not context[3] & TraceFlags.SAMPLED:  # valid, not sampled
            write_trace_context(headers, context)  # a dropped trace: no span
            return UNTRACED
        attributes = self._attributes.get((method, path)) or self.attributes(method, path)
        tracer = self.tracer
        if type(tracer) is Tracer:  # the service's: no second look at the current span
            span = tracer.start_span_under(parent, method, SpanKind.CLIENT, attributes)
        else:
            span = tracer.start_span(method, kind=SpanKind.CLIENT, attributes=attributes)
        write_trace_context(headers, span.get_span_context())
        if not span.is_recording():
            return UNTRACED
        return _TracedCall(span)
