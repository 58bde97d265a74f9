"""Tracing set-up from the standard `OTEL_*` variables (read through `Settings`).

Tracing is on when an OTLP endpoint is configured (`OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) or `OTEL_TRACES_EXPORTER=console`, and off with
`OTEL_TRACES_EXPORTER=none` or nothing configured. Off, the tracer is OpenTelemetry's no-op
one and no instrumentation is installed, so it costs nothing measurable. Spans go out over
OTLP/HTTP (protobuf) in batches.

Under a span the sampler dropped, the service's tracer (`tracer()`) makes no child span:
the dropped span stands in for it. With every sampler `OTEL_TRACES_SAMPLER` offers, the
child would have been dropped too (parent-based samplers follow the parent, ratio ones
decide by the same trace id, and `always_on` drops nothing), so what a trace records is
unchanged; a sampled-out request just skips the SDK's span machinery at every stage.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager, nullcontext
from functools import lru_cache
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)

from chatqna import __version__
from chatqna.settings import Settings

logger = logging.getLogger(__name__)
TRACER_NAME = "chatqna"
# The batch processor keeps the SDK's batch and queue sizes (512 and 2048 spans, or
# OTEL_BSP_MAX_EXPORT_BATCH_SIZE and OTEL_BSP_MAX_QUEUE_SIZE) and exports at least once a
# second. With every span exported (about ten a turn), batches of 2048 measured the same
# throughput and 60 ms more p99 latency (each export holds the interpreter longer), batches
# of 128 a quarter more export CPU.
EXPORT_SCHEDULE_MILLIS = 1000


def dropped(span: trace.Span) -> bool:
    """True for a span of a real trace that the sampler did not record."""
    if span.is_recording():
        return False
    context = span.get_span_context()
    return context.is_valid and not context.trace_flags.sampled


class ServiceTracer:
    """The provider's tracer, with no child span made under a dropped one.

    Only the two calls the pipeline uses. `start_span` returns the dropped parent itself
    (ending it again does nothing) and `start_as_current_span` leaves the current context
    alone; on a recorded or a new trace both are the SDK's own.
    """

    def __init__(self, inner: trace.Tracer) -> None:
        self.inner = inner

    def start_span(self, name: str, context: Context | None = None) -> trace.Span:
        parent = trace.get_current_span(context)
        if dropped(parent):
            return parent
        return self.inner.start_span(name, context)

    def start_as_current_span(
        self, name: str, *, record_exception: bool = True
    ) -> AbstractContextManager[trace.Span]:
        parent = trace.get_current_span()
        if dropped(parent):
            return nullcontext(parent)
        return self.inner.start_as_current_span(name, record_exception=record_exception)


class NoTracer(ServiceTracer):
    """The tracer while no SDK provider is installed (tracing off): every span is the
    invalid one and nothing becomes current, without the API's proxy and context work."""

    def __init__(self) -> None:
        super().__init__(trace.NoOpTracer())

    def start_span(self, name: str, context: Context | None = None) -> trace.Span:
        return trace.INVALID_SPAN

    def start_as_current_span(
        self, name: str, *, record_exception: bool = True
    ) -> AbstractContextManager[trace.Span]:
        return nullcontext(trace.INVALID_SPAN)


NO_TRACER = NoTracer()


def as_current(span: trace.Span) -> AbstractContextManager[Any]:
    """`use_span(span, end_on_exit=False)`; nothing to do for the invalid span of a
    service with tracing off."""
    if span is trace.INVALID_SPAN:
        return nullcontext(span)
    return trace.use_span(span, end_on_exit=False)


@lru_cache(maxsize=4)
def _tracer_of(provider: trace.TracerProvider) -> ServiceTracer:
    if not isinstance(provider, TracerProvider):
        return NO_TRACER
    return ServiceTracer(provider.get_tracer(TRACER_NAME, __version__))


def tracer() -> ServiceTracer:
    """The service's tracer (a no-op one until a provider is installed).

    One per provider: the SDK builds a new tracer on every `get_tracer` call, which costs
    more than a dropped span.
    """
    return _tracer_of(trace.get_tracer_provider())


def tracing_enabled(settings: Settings) -> bool:
    exporter = settings.otel_traces_exporter
    if exporter == "none":
        return False
    if exporter == "console":
        return True
    return bool(settings.otel_exporter_otlp_traces_endpoint or settings.otel_exporter_otlp_endpoint)


def sampler_from(settings: Settings) -> Sampler:
    name = settings.otel_traces_sampler
    ratio = settings.otel_traces_sampler_arg
    samplers: dict[str, Sampler] = {
        "always_on": ALWAYS_ON,
        "always_off": ALWAYS_OFF,
        "traceidratio": TraceIdRatioBased(ratio),
        "parentbased_always_on": ParentBased(ALWAYS_ON),
        "parentbased_always_off": ParentBased(ALWAYS_OFF),
        "parentbased_traceidratio": ParentBased(TraceIdRatioBased(ratio)),
    }
    return samplers[name]


def traces_endpoint(settings: Settings) -> str:
    if settings.otel_exporter_otlp_traces_endpoint:
        return settings.otel_exporter_otlp_traces_endpoint
    return f"{(settings.otel_exporter_otlp_endpoint or '').rstrip('/')}/v1/traces"


def build_tracer_provider(settings: Settings) -> TracerProvider | None:
    """A provider exporting as configured, or None when tracing is off."""
    if not tracing_enabled(settings):
        return None
    resource = Resource.create(
        {"service.name": settings.otel_service_name, "service.version": __version__}
    )
    provider = TracerProvider(resource=resource, sampler=sampler_from(settings))
    exporter: Any
    if settings.otel_traces_exporter == "console":
        exporter = ConsoleSpanExporter()
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=traces_endpoint(settings), timeout=10)
    provider.add_span_processor(
        BatchSpanProcessor(exporter, schedule_delay_millis=EXPORT_SCHEDULE_MILLIS)
    )
    logger.info(
        "tracing on: %s exporter, service %s",
        settings.otel_traces_exporter,
        settings.otel_service_name,
    )
    return provider


def install_tracer_provider(provider: TracerProvider) -> None:
    """Make `provider` the global one (OpenTelemetry allows this once per process)."""
    trace.set_tracer_provider(provider)


def current_trace_id() -> str | None:
    """The 32-hex trace id of the active span, if a real (sampled or not) trace is running."""
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


def tracing_installed() -> bool:
    """True when a real (SDK) tracer provider is the global one."""
    return isinstance(trace.get_tracer_provider(), TracerProvider)
