"""The caller's trace context, made current for a request that no server span is started for.

FastAPI's own OpenTelemetry support reads the caller's context from the request headers
(through the configured propagators, `OTEL_PROPAGATORS`) and starts the request's server
span under it, but only while a tracer provider is installed. With tracing off
(`OTEL_TRACES_EXPORTER=none`, `OTEL_SDK_DISABLED=true`, nothing configured) it does neither,
and the caller's trace would end at the service. OpenTelemetry's API without a recording SDK
passes a parent's context through unchanged (its no-op tracer hands out a non-recording span
carrying the parent's context); `CallerContext` does the same for a request. Where no span
is current when the request arrives, it extracts the caller's context with the global
propagator and makes it current until the response is sent: the upstream calls carry it on
(`chatqna.telemetry.client_spans` injects the current context), and `X-Trace-Id` names the
caller's trace, as it does with tracing on. Under a span current already (FastAPI's server
span, in a trace sampled or dropped; opentelemetry-instrumentation-fastapi's) it does
nothing, so the requests it traces are left as they are.
"""

from __future__ import annotations

from collections.abc import Callable

from opentelemetry import context, propagate, trace
from opentelemetry.propagators.textmap import Getter
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send


class HeadersGetter(Getter[Headers]):
    """Reads propagation fields from Starlette's `Headers`: every value of a repeated
    header, with the `baggage` ones joined into one (its propagator reads one value), as
    FastAPI's own extraction reads them."""

    def get(self, carrier: Headers, key: str) -> list[str] | None:
        values = carrier.getlist(key)
        if not values:
            return None
        if key.lower() == "baggage":
            return [",".join(values)]
        return values

    def keys(self, carrier: Headers) -> list[str]:
        return carrier.keys()


HEADERS_GETTER = HeadersGetter()


def span_current() -> bool:
    """Whether a span with a valid context is current (a server span, sampled or not)."""
    return trace.get_current_span().get_span_context().is_valid


class CallerContext:
    """ASGI middleware: a request that arrives with no span current runs in the context the
    global propagator extracts from its headers, laid over the current one (so what FastAPI
    keeps there stays). Requests `exclude` names (the probes and the scrape, which are never
    traced) are passed on as they are."""

    def __init__(self, app: ASGIApp, exclude: Callable[[Scope], bool]) -> None:
        self.app = app
        self.exclude = exclude

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.exclude(scope) or span_current():
            await self.app(scope, receive, send)
            return
        caller = propagate.extract(
            Headers(scope=scope), context=context.get_current(), getter=HEADERS_GETTER
        )
        token = context.attach(caller)
        try:
            await self.app(scope, receive, send)
        finally:
            context.detach(token)
