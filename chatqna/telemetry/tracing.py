"""Tracing set-up from the standard `OTEL_*` variables (read through `Settings`).

Tracing is on when an OTLP endpoint is configured (`OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) or `OTEL_TRACES_EXPORTER=console`, and off with
`OTEL_TRACES_EXPORTER=none` or nothing configured. Off, the tracer is OpenTelemetry's no-op
one and no instrumentation is installed, so it costs nothing measurable. Spans go out over
OTLP/HTTP (protobuf) in batches.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
from opentelemetry import trace
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


def tracer() -> trace.Tracer:
    """The service's tracer (a no-op one until a provider is installed)."""
    return trace.get_tracer(TRACER_NAME, __version__)


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
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=1000))
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


def traced(transport: httpx.AsyncBaseTransport) -> httpx.AsyncBaseTransport:
    """An upstream client's transport, with client spans and trace-context headers when
    tracing is on (`chatqna.telemetry.client_spans`); unchanged when it is off.

    Per client, not by patching httpx globally: only our upstream clients are traced.
    """
    if not tracing_installed():
        return transport
    from chatqna.telemetry.client_spans import TracedTransport

    return TracedTransport(transport)
