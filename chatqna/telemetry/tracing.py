"""Tracing set-up from the standard `OTEL_*` variables (read through `Settings`).

Tracing is on when an OTLP endpoint is configured (`OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) or `OTEL_TRACES_EXPORTER=console`, and off with
`OTEL_TRACES_EXPORTER=none` or nothing configured. Off, the tracer does nothing and no
instrumentation is installed, so it costs nothing measurable. On, spans are recorded by the
service's own provider (`chatqna.telemetry.spans`, OpenTelemetry's API at a tenth of the
SDK's cost per span) and leave in batches from one thread (`chatqna.telemetry.span_export`),
over OTLP/HTTP (protobuf) or as JSON lines on the console.

Under a span the sampler dropped, the service's tracer makes no child span: the dropped
span stands in for it (see `chatqna.telemetry.spans`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from functools import lru_cache
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.util.types import AttributeValue

from chatqna import __version__
from chatqna.settings import Settings
from chatqna.telemetry.span_export import BatchExporter, ConsoleSender, OtlpHttpSender
from chatqna.telemetry.spans import (
    DroppedSpan,
    Sampler,
    ServiceTracerProvider,
    Tracer,
    current,
    current_span,
    trace_hex,
)

logger = logging.getLogger(__name__)
TRACER_NAME = "chatqna"


def dropped(span: trace.Span) -> bool:
    """True for a span of a real trace that the sampler did not record."""
    if span.is_recording():
        return False
    context = span.get_span_context()
    return context.is_valid and not context.trace_flags.sampled


class NoTracer(trace.NoOpTracer):
    """The tracer while no provider of the service is installed (tracing off): every span
    is the invalid one and nothing becomes current, without the API's proxy and context
    work."""

    def start_span(
        self, name: str, context: Context | None = None, *args: Any, **kwargs: Any
    ) -> trace.Span:
        return trace.INVALID_SPAN

    def start_as_current_span(  # type: ignore[override]
        self, name: str, *args: Any, **kwargs: Any
    ) -> AbstractContextManager[trace.Span]:
        return nullcontext(trace.INVALID_SPAN)


NO_TRACER = NoTracer()


def as_current(span: trace.Span) -> AbstractContextManager[Any]:
    """`use_span(span, end_on_exit=False)`; nothing to do for the invalid span of a
    service with tracing off, or for a dropped trace's span that is current already."""
    if span is trace.INVALID_SPAN:
        return nullcontext(span)
    if type(span) is DroppedSpan and current_span() is span:
        return span.entered
    return current(span)


def start_child(
    parent: trace.Span, name: str, attributes: Mapping[str, AttributeValue] | None = None
) -> trace.Span:
    """`tracer().start_span(name, context=trace.set_span_in_context(parent), attributes=...)`:
    a span under `parent` wherever the caller runs; a dropped trace's span stands in for it."""
    if type(parent) is DroppedSpan:
        return parent
    service_tracer = tracer()
    if type(service_tracer) is Tracer:  # (an ABC's isinstance is a Python call)
        return service_tracer.start_span_under(parent, name, attributes=attributes)
    return service_tracer.start_span(
        name, context=trace.set_span_in_context(parent), attributes=attributes
    )


@lru_cache(maxsize=4)
def _tracer_of(provider: trace.TracerProvider | None) -> trace.Tracer:
    if not isinstance(provider, ServiceTracerProvider):
        return NO_TRACER
    return provider.get_tracer(TRACER_NAME, __version__)


# The API's global provider. Read directly: while none is set, `get_tracer_provider` looks
# up `OTEL_PYTHON_TRACER_PROVIDER` in the environment on every call (the service's provider
# is only ever set in code, so the lookup cannot find it).
_HAS_PROVIDER_SLOT = hasattr(trace, "_TRACER_PROVIDER")


def tracer() -> trace.Tracer:
    """The service's tracer (one that does nothing until a provider is installed)."""
    if _HAS_PROVIDER_SLOT:
        return _tracer_of(trace._TRACER_PROVIDER)
    return _tracer_of(trace.get_tracer_provider())


def tracing_enabled(settings: Settings) -> bool:
    exporter = settings.otel_traces_exporter
    if exporter == "none":
        return False
    if exporter == "console":
        return True
    return bool(settings.otel_exporter_otlp_traces_endpoint or settings.otel_exporter_otlp_endpoint)


def sampler_from(settings: Settings) -> Sampler:
    return Sampler(settings.otel_traces_sampler, settings.otel_traces_sampler_arg)


def traces_endpoint(settings: Settings) -> str:
    if settings.otel_exporter_otlp_traces_endpoint:
        return settings.otel_exporter_otlp_traces_endpoint
    return f"{(settings.otel_exporter_otlp_endpoint or '').rstrip('/')}/v1/traces"


def build_tracer_provider(settings: Settings) -> ServiceTracerProvider | None:
    """A provider exporting as configured, or None when tracing is off."""
    if not tracing_enabled(settings):
        return None
    resource = Resource.create(
        {"service.name": settings.otel_service_name, "service.version": __version__}
    )
    sender: OtlpHttpSender | ConsoleSender
    if settings.otel_traces_exporter == "console":
        sender = ConsoleSender()
    else:
        sender = OtlpHttpSender(
            traces_endpoint(settings),
            dict(resource.attributes),
            headers={
                **settings.otel_exporter_otlp_headers,
                **settings.otel_exporter_otlp_traces_headers,
            },
            timeout=settings.otel_exporter_otlp_timeout / 1000,
            compression=settings.otel_exporter_otlp_compression,
            certificate=settings.otel_exporter_otlp_certificate,
        )
    exporter = BatchExporter(
        sender,
        max_queue_size=settings.otel_bsp_max_queue_size,
        max_batch_size=settings.otel_bsp_max_export_batch_size,
        schedule_delay=settings.otel_bsp_schedule_delay / 1000,
    )
    logger.info(
        "tracing on: %s exporter, service %s",
        settings.otel_traces_exporter,
        settings.otel_service_name,
    )
    return ServiceTracerProvider(
        exporter,
        sampler=sampler_from(settings),
        resource=resource,
        shutdown=lambda: exporter.shutdown(settings.otel_exporter_otlp_timeout / 1000),
    )


def install_tracer_provider(provider: trace.TracerProvider) -> None:
    """Make `provider` the global one (OpenTelemetry allows this once per process)."""
    trace.set_tracer_provider(provider)


def current_trace_id() -> str | None:
    """The 32-hex trace id of the active span, if a real (sampled or not) trace is running."""
    context = current_span().get_span_context()
    return trace_hex(context[0]) if context[5] else None  # (trace id, ..., valid)


def tracing_installed() -> bool:
    """True when the service's tracer provider is the global one."""
    return isinstance(trace.get_tracer_provider(), ServiceTracerProvider)
