"""HTTP client spans for the upstream calls, made by each `UpstreamClient` around its calls.

Each call gets a CLIENT span named `{method} {url.template}` (`POST /v1/embeddings`), as
the HTTP semantic conventions name a client span whose path is a low-cardinality template:
every upstream path here is a constant of its backend, under the endpoint's own path prefix
(`http://gateway/tei` gives `/tei/v1/embeddings`). The span has the stable HTTP
semantic-convention attributes (`http.request.method`, `url.full` without credentials or
query, `url.template`, `server.address`, `server.port`, `http.response.status_code`,
`error.type`) and the caller's own (the embedder's: how many texts the call carries,
`chatqna.embedding.inputs`). The request carries the current context through the
configured propagators (`OTEL_PROPAGATORS`: W3C `traceparent`, `tracestate` and `baggage`
by default), also in a trace the sampler dropped and under a provider installed by
`opentelemetry-instrument`. The span ends when the response headers have arrived; a
streamed body is read inside the caller's span (`chatqna.generate`). Calls made inside
`untraced_calls()` (the readiness probes) start no span.

A thin wrapper on the public API rather than opentelemetry-instrumentation-httpx (whose
`HTTPX2ClientInstrumentor` is the one for httpx2, the upstream clients' library): that
instrumentation patches httpx2 for the whole process (every client in it, not only the
upstream ones) and sees the transport's requests, while these spans belong to the upstream
clients' logical calls: the batched embedding call is the one `POST /v1/embeddings` span
under `chatqna.embed`. Where that instrumentation is active all the same (`opentelemetry-instrument`
with the package installed loads it for httpx and for httpx2), the upstream calls suppress
it through opentelemetry-instrumentation's `suppress_http_instrumentation`: still one span
per call, and the `traceparent` sent names it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from urllib.parse import urlsplit

from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from chatqna import __version__
from chatqna.telemetry.tracing import inert

TRACER_NAME = "chatqna.http"
_TRACER = trace.get_tracer(TRACER_NAME, __version__)
_UNTRACED: ContextVar[bool] = ContextVar("chatqna_untraced_calls", default=False)


def _http_instrumentation_suppressor() -> Callable[[], AbstractContextManager[None]]:
    """opentelemetry-instrumentation's `suppress_http_instrumentation`, which the HTTP
    client instrumentations obey. Each of them requires that package, so where it is not
    installed there is nothing to suppress."""
    try:
        from opentelemetry.instrumentation.utils import suppress_http_instrumentation
    except ImportError:
        return nullcontext
    return suppress_http_instrumentation


_SUPPRESS_HTTP_INSTRUMENTATION = _http_instrumentation_suppressor()


@contextmanager
def untraced_calls() -> Iterator[None]:
    """Upstream calls made in the block start no client span. For the readiness probes:
    `/v1/ready` itself is not traced, and a probe every few seconds per replica would
    otherwise fill the trace view with traces of one `GET` each."""
    token = _UNTRACED.set(True)
    try:
        yield
    finally:
        _UNTRACED.reset(token)


def url_full(url: str) -> str:
    """The URL without credentials or query string."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    return f"{parts.scheme}://{netloc}{parts.path}"


def _class_name(exc: BaseException) -> str:
    return type(exc).__qualname__


class ClientCall:
    """One call's span, as the caller sees it: `status(code)` once the reply is in."""

    __slots__ = ("span",)

    def __init__(self, span: trace.Span) -> None:
        self.span = span

    def status(self, code: int) -> None:
        if not self.span.is_recording():
            return
        self.span.set_attribute("http.response.status_code", code)
        if code >= 400:
            self.span.set_attribute("error.type", str(code))
            self.span.set_status(Status(StatusCode.ERROR))


class ClientSpans:
    """The client spans of one upstream (`base_url`, parsed once)."""

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        self.prefix = url_full(base_url).rstrip("/")
        self.base_path = parts.path.rstrip("/")
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if parts.scheme == "https" else 80)

    @contextmanager
    def call(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> Iterator[ClientCall]:
        """A span for one call, current for the block; the trace context goes into
        `headers` (the dict then sent). `path` is one of the backend's constant paths
        (a query string is dropped), `attributes` the caller's own. Where a span would
        record nothing (a trace the sampler dropped, no tracer provider:
        `chatqna.telemetry.tracing.inert`) none is started, and the current context, if
        any, goes along as it is. An active HTTP client instrumentation
        (opentelemetry-instrumentation-httpx's, for httpx2) is suppressed for the call, so
        it adds no span of its own and sends no context of its own."""
        with _SUPPRESS_HTTP_INSTRUMENTATION():
            parent = trace.get_current_span()
            if inert(parent) or _UNTRACED.get():
                propagate.inject(headers)
                yield ClientCall(parent)
                return
            route = path.partition("?")[0]
            template = self.base_path + route
            span_attributes: dict[str, AttributeValue] = {
                "http.request.method": method,
                "url.full": self.prefix + route,
                "url.template": template,
                "server.address": self.host,
                "server.port": self.port,
                **(attributes or {}),
            }
            with _TRACER.start_as_current_span(
                f"{method} {template}",
                kind=SpanKind.CLIENT,
                attributes=span_attributes,
                record_exception=False,
                set_status_on_exception=False,
            ) as span:
                propagate.inject(headers)
                try:
                    yield ClientCall(span)
                except BaseException as exc:
                    # Also a cancellation: a whole-call bound (`asyncio.timeout`) that ran
                    # out arrives here as `CancelledError`, and that call failed too.
                    if span.is_recording():
                        name = _class_name(exc)
                        span.set_attribute("error.type", name)
                        span.set_status(Status(StatusCode.ERROR, name))
                    raise
