"""The request's SERVER span, made by a small ASGI middleware.

Every HTTP request but the probes and the metrics scrape (`EXCLUDED_PATHS`) gets a SERVER
span named by its method and route template (`POST /v1/chatqna`), a child of the caller's
span when the request carries a W3C `traceparent`, else the root of a new trace. While the
span is recording it has the stable HTTP semantic-convention attributes
(`http.request.method`, `url.scheme`, `url.path` (never the query string), `http.route`,
`server.address`, `server.port`, `client.address`, `network.protocol.version`,
`user_agent.original`, `http.response.status_code`) and, for a 5xx answer or an exception,
`error.type` and the ERROR status; the request headers an operator names
(`OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_REQUEST`) are recorded as
`http.request.header.<name>`, credentials as `[REDACTED]`. The status code is read once,
from `http.response.start`, and the span ends when the app returns, after the last body
frame, so a streamed answer lies inside it. Where a middleware inside reads that message
anyway (the service's metrics middleware, with nothing between the two that answers on its
own), it hands the status to the request's `Exchange` (`report_status`) and `send` is not
wrapped a second time: a stream's every frame would otherwise pass through both.

When the sampler drops the trace, the middleware only makes the dropped span's context
current (for `X-Trace-Id` and the `traceparent` sent upstream): no attribute is built and
`send` is not wrapped.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Iterable, Mapping, Sequence

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from chatqna import __version__
from chatqna.telemetry.spans import attach_span, detach

TRACER_NAME = "chatqna.http"
# The probes and the scrape: frequent, and nobody looks for them in a trace.
EXCLUDED_PATHS = frozenset({"/metrics", "/v1/health_check", "/v1/ready"})
# Header names (regular expressions) whose values never reach a span.
SECRET_HEADERS = (
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    ".*api[-_]?key.*",
    ".*token.*",
    ".*secret.*",
)
REDACTED = ("[REDACTED]",)
KNOWN_METHODS = frozenset(
    {"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "QUERY", "TRACE"}
)
DEFAULT_PORTS = {"http": 80, "https": 443}
W3C_TRACE_CONTEXT = TraceContextTextMapPropagator()


def incoming_context(headers: Mapping[bytes, bytes]) -> Context:
    """The caller's trace from a request's W3C `traceparent` (and `tracestate`), or an empty
    context, so that the request's span is a root, when there is none or it is malformed.
    `headers` are the request's, by lower-case name (`dict(scope["headers"])`)."""
    traceparent = headers.get(b"traceparent")
    if traceparent is None:
        return Context()
    carrier = {"traceparent": traceparent.decode("latin-1")}
    tracestate = headers.get(b"tracestate")
    if tracestate is not None:
        carrier["tracestate"] = tracestate.decode("latin-1")
    return W3C_TRACE_CONTEXT.extract(carrier, Context())


def server_address(host: str | None, scope: Scope) -> tuple[str | None, int | None]:
    """`server.address` and `server.port` from the `Host` header, else the listening socket."""
    if host is None:
        server = scope.get("server")
        return (server[0], server[1]) if server else (None, None)
    if host.startswith("["):  # [IPv6]:port
        address, _, rest = host[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        address, _, port = host.partition(":")
    return address, int(port) if port.isdigit() else DEFAULT_PORTS.get(scope.get("scheme", ""))


class HeaderCapture:
    """Which request headers go on the span (`http.request.header.<name>`), and which of
    those are credentials, recorded as `[REDACTED]`. Both are lists of regular expressions
    matched against the whole lower-case header name."""

    def __init__(self, names: Sequence[str], secrets: Sequence[str] = SECRET_HEADERS) -> None:
        self._wanted = re.compile("|".join(f"(?:{n})" for n in names), re.I) if names else None
        self._secret = re.compile("|".join(f"(?:{s})" for s in secrets), re.I)

    def __bool__(self) -> bool:
        return self._wanted is not None

    def attributes(self, headers: Iterable[tuple[bytes, bytes]]) -> dict[str, AttributeValue]:
        if self._wanted is None:
            return {}
        values: dict[str, list[str]] = {}
        for raw_name, raw_value in headers:
            name = raw_name.decode("latin-1").lower()
            if self._wanted.fullmatch(name):
                values.setdefault(name, []).append(raw_value.decode("latin-1"))
        return {
            f"http.request.header.{name}": REDACTED if self._secret.fullmatch(name) else tuple(v)
            for name, v in values.items()
        }


# Request attributes by what they are built from: a client sends the same ones request
# after request. Bounded: emptied when full.
REQUEST_ATTRIBUTE_SETS = 1024
_request_attribute_sets: dict[tuple[object, ...], dict[str, AttributeValue]] = {}


def request_attributes(
    scope: Scope, method: str, headers: Mapping[bytes, bytes]
) -> dict[str, AttributeValue]:
    """The request's attributes, built only for a recording span (kept, and shared: the
    caller copies them). `headers` as for `incoming_context`."""
    host = headers.get(b"host")
    user_agent = headers.get(b"user-agent")
    client = scope.get("client")
    server = scope.get("server")
    key = (
        method,
        scope["method"],
        scope.get("scheme"),
        scope["path"],
        host,
        user_agent,
        client[0] if client else None,
        scope.get("http_version"),
        tuple(server) if server else None,
    )
    attributes = _request_attribute_sets.get(key)
    if attributes is None:
        attributes = build_request_attributes(scope, method, host, user_agent)
        if len(_request_attribute_sets) >= REQUEST_ATTRIBUTE_SETS:
            _request_attribute_sets.clear()
        _request_attribute_sets[key] = attributes
    return attributes


def build_request_attributes(
    scope: Scope, method: str, host: bytes | None, user_agent: bytes | None
) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {
        "http.request.method": method,
        "url.scheme": scope.get("scheme", "http"),
        "url.path": scope["path"],
    }
    if method != scope["method"]:
        attributes["http.request.method_original"] = scope["method"]
    address, port = server_address(None if host is None else host.decode("latin-1"), scope)
    if address:
        attributes["server.address"] = address
    if port is not None:
        attributes["server.port"] = port
    client = scope.get("client")
    if client:
        attributes["client.address"] = client[0]
    if scope.get("http_version"):
        attributes["network.protocol.version"] = scope["http_version"]
    if user_agent:
        attributes["user_agent.original"] = user_agent.decode("latin-1")
    return attributes


# Where the request's `Exchange` waits in the ASGI scope for `report_status`.
EXCHANGE_KEY = "chatqna.exchange"


def report_status(scope: Scope, status: int) -> None:
    """Give a recorded request's span its response status (from `http.response.start`)."""
    exchange = scope.get(EXCHANGE_KEY)
    if exchange is not None:
        exchange.status = status


class ServerSpanMiddleware:
    """A SERVER span around every HTTP request but those to `excluded_paths`.

    With `status_reported_inside`, a middleware inside calls `report_status` for every
    response (so nothing between the two answers a request itself), and `send` is passed
    on unwrapped."""

    def __init__(
        self,
        app: ASGIApp,
        tracer_provider: trace.TracerProvider,
        *,
        excluded_paths: Iterable[str] = EXCLUDED_PATHS,
        capture_request_headers: Sequence[str] = (),
        status_reported_inside: bool = False,
    ) -> None:
        self.app = app
        self._status_reported_inside = status_reported_inside
        self._tracer = tracer_provider.get_tracer(TRACER_NAME, __version__)
        self._excluded = frozenset(excluded_paths)
        self._capture = HeaderCapture(capture_request_headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self._excluded:
            await self.app(scope, receive, send)
            return
        method = scope["method"] if scope["method"] in KNOWN_METHODS else "_OTHER"
        # By name, in one pass in C (a repeated name keeps its last value, as the W3C
        # propagator and the attributes would).
        headers = dict(scope["headers"])
        parent = incoming_context(headers)
        name = "HTTP" if method == "_OTHER" else method
        span = self._tracer.start_span(name, parent, SpanKind.SERVER)
        token = attach_span(span, parent)
        # One coroutine for both cases: every step of a streamed answer resumes each
        # coroutine it is awaited through.
        try:
            if not span.is_recording():
                await self.app(scope, receive, send)
                return
            span.set_attributes(request_attributes(scope, method, headers))
            if self._capture:
                span.set_attributes(self._capture.attributes(scope["headers"]))
            exchange = Exchange(span, name, scope)
            if self._status_reported_inside:
                scope[EXCHANGE_KEY] = exchange
                inner_send = send
            else:
                # A plain function handing back `send`'s awaitable: no coroutine of its own
                # for each of a stream's frames.
                def send_reading_status(message: Message) -> Awaitable[None]:
                    if message["type"] == "http.response.start":
                        exchange.status = message["status"]
                    return send(message)

                inner_send = send_reading_status
            try:
                await self.app(scope, receive, inner_send)
            except Exception as exc:
                exchange.failed(exc)
                raise
            finally:
                exchange.end()  # the app returns after its last body frame (or failed)
                scope.pop(EXCHANGE_KEY, None)  # no cycle left between scope and exchange
        finally:
            detach(token)


class Exchange:
    """One recorded request: the status code it answered, and its span's end (once)."""

    def __init__(self, span: Span, name: str, scope: Scope) -> None:
        self.span = span
        self.name = name
        self.scope = scope
        self.status = 0
        self.error_type: str | None = None
        self.ended = False

    def failed(self, exc: Exception) -> None:
        if self.ended:
            return
        self.error_type = type(exc).__qualname__
        self.span.record_exception(exc)
        self.span.set_status(Status(StatusCode.ERROR, self.error_type))
        if self.status == 0:  # nothing sent yet: Starlette's error middleware answers 500
            self.status = 500

    def end(self) -> None:
        if self.ended:
            return
        self.ended = True
        span = self.span
        route = getattr(self.scope.get("route"), "path", None)
        if route:
            span.update_name(f"{self.name} {route}")
            span.set_attribute("http.route", route)
        if self.status:
            span.set_attribute("http.response.status_code", self.status)
        if self.error_type is None and self.status >= 500:
            self.error_type = str(self.status)
            span.set_status(Status(StatusCode.ERROR))
        if self.error_type is not None:
            span.set_attribute("error.type", self.error_type)
        span.end()
