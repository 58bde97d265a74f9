"""Tracing set-up: OpenTelemetry's SDK, configured from the standard `OTEL_*` variables.

The SDK reads its own variables: the sampler (`OTEL_TRACES_SAMPLER`, `..._ARG`), span
limits, `OTEL_RESOURCE_ATTRIBUTES` and `OTEL_SERVICE_NAME`, the batch processor's
`OTEL_BSP_*`, each exporter's headers, certificates, client keys, compression and timeout,
`OTEL_PROPAGATORS` (read by `opentelemetry.propagate`). What the service decides itself,
from the few variables `Settings` reads:

- tracing is off with `OTEL_SDK_DISABLED=true`, with `OTEL_TRACES_EXPORTER=none`, and when
  `OTEL_TRACES_EXPORTER` is unset and no OTLP endpoint is given (a bare `chatqna serve`
  exports nothing rather than failing against `localhost`);
- `otlp` speaks `http/protobuf` unless `OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL` says `grpc`
  (the specification's default; the Python SDK's own configurator picks gRPC);
- every other name in `OTEL_TRACES_EXPORTER` (`console`, `otlp_proto_grpc`, an installed
  third-party exporter) is the exporter registered under that name;
- `service.name` is `chatqna` unless `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES`
  names another.

When a tracer provider is installed already (`opentelemetry-instrument`, a distro, an
application embedding the service), it is used as it is and nothing is installed. When
opentelemetry-instrumentation-fastapi has instrumented the app (`opentelemetry-bootstrap -a
install` installs it), FastAPI's own tracing steps aside for it; `contrib_instrumented` tells,
and `tracing_recorded` whether spans are recorded at all.

`OTEL_PROPAGATORS=none` takes no context from the request headers and sends none upstream
(`NoPropagation` stands in for what opentelemetry-api builds for it). Any other passes the
caller's context on also with tracing off (`chatqna.telemetry.caller_context`).

At shutdown the spans still batched get `SHUTDOWN_TIMEOUT_SECONDS` to reach the collector
(`OwnedTracing.shutdown`); an unreachable one costs no more than that.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators import textmap
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from chatqna import __version__
from chatqna.settings import OTLP_BY_PROTOCOL, TRACES_EXPORTER_GROUP, Settings

logger = logging.getLogger(__name__)
TRACER_NAME = "chatqna"
DEFAULT_SERVICE_NAME = "chatqna"
EXPORTER_GROUP = TRACES_EXPORTER_GROUP
# How long the spans still batched at shutdown may take to reach the collector. The SDK's
# own bound is 30 s per processor (and an OTLP export may take OTEL_EXPORTER_OTLP_TIMEOUT,
# 10 s, per batch), past the 10 s a container gets between SIGTERM and SIGKILL by default
# (`docker compose stop`), which the rest of the shutdown shares. What is not out by then is
# dropped.
SHUTDOWN_TIMEOUT_SECONDS = 5.0


def dropped(parent: trace.Span) -> bool:
    """Whether `parent` belongs to a trace the sampler dropped: a valid context whose
    sampled flag is off. The SDK's samplers record no span under it (a parent-based one
    follows the parent; a ratio one decides by the trace id, the parent's)."""
    context = parent.get_span_context()
    return context.is_valid and not context.trace_flags.sampled


def inert(parent: trace.Span) -> bool:
    """Whether a span started under `parent` would record nothing, so the service starts
    none: `parent` records nothing itself and either its trace was dropped (`dropped`) or
    no tracer provider is installed (OpenTelemetry's proxy would hand out a no-op span).
    Each span started there would cost CPU on most requests, for nothing; instead the
    parent stays current and its context, if any, goes upstream."""
    if parent.is_recording():
        return False
    return dropped(parent) or isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


class ServiceTracer:
    """The service's tracer: the installed provider's (through OpenTelemetry's proxy, so
    a provider installed later is used), except where a span would record nothing
    (`inert`): a span asked for there is the parent itself, already current."""

    def __init__(self, delegate: trace.Tracer) -> None:
        self._delegate = delegate

    def start_span(
        self, name: str, context: Context | None = None, *args: Any, **kwargs: Any
    ) -> trace.Span:
        parent = trace.get_current_span(context)
        if inert(parent):
            return parent
        return self._delegate.start_span(name, context, *args, **kwargs)

    @contextmanager
    def start_as_current_span(
        self, name: str, context: Context | None = None, *args: Any, **kwargs: Any
    ) -> Iterator[trace.Span]:
        parent = trace.get_current_span(context)
        if inert(parent):
            if context is None:  # the parent is the current span already
                yield parent
                return
            with trace.use_span(parent, end_on_exit=False):
                yield parent
            return
        with self._delegate.start_as_current_span(name, context, *args, **kwargs) as span:
            yield span


_TRACER = ServiceTracer(trace.get_tracer(TRACER_NAME, __version__))


def tracer() -> ServiceTracer:
    """The service's tracer (`ServiceTracer`)."""
    return _TRACER


def current_trace_id() -> str | None:
    """The 32 hex digits of the current trace (sampled or not), if one is running."""
    context = trace.get_current_span().get_span_context()
    return trace.format_trace_id(context.trace_id) if context.is_valid else None


class NoPropagation(textmap.TextMapPropagator):
    """The propagator of `OTEL_PROPAGATORS=none`: nothing is read from a carrier or written
    to one, and `extract` returns the context it is given (an empty one when given none).

    For `none`, opentelemetry-api (since open-telemetry/opentelemetry-python#4553) installs
    an empty `CompositePropagator`, whose `extract` returns the context argument as it is:
    None when none is given. FastAPI's telemetry attaches that None as the request's
    context, and every traced request then fails (`AttributeError` on the context).
    open-telemetry/opentelemetry-python#1765 (open) is the issue on what `extract` owes
    when it finds nothing.
    """

    def extract(
        self,
        carrier: textmap.CarrierT,
        context: Context | None = None,
        getter: textmap.Getter[textmap.CarrierT] = textmap.default_getter,
    ) -> Context:
        return context if context is not None else Context()

    def inject(
        self,
        carrier: textmap.CarrierT,
        context: Context | None = None,
        setter: textmap.Setter[textmap.CarrierT] = textmap.default_setter,
    ) -> None:
        return None

    @property
    def fields(self) -> set[str]:
        return set()


def configure_propagation() -> None:
    """Install `NoPropagation` as the global propagator where the configured one would
    return no context from `extract` (`OTEL_PROPAGATORS=none`); any other is left as it is.
    Run before the app serves, as FastAPI's telemetry extracts with the global one."""
    extracted: Context | None = propagate.extract({})
    if extracted is None:
        propagate.set_global_textmap(NoPropagation())


def build_exporter(name: str, settings: Settings) -> SpanExporter:
    """The exporter registered as `name`; it reads its own `OTEL_EXPORTER_*` variables.
    The endpoint is passed when given, so a blank variable counts as unset."""
    found = entry_points(group=EXPORTER_GROUP, name=name)
    if not found:
        raise ValueError(f"OTEL_TRACES_EXPORTER: no span exporter named {name!r} is installed")
    exporter_class = next(iter(found)).load()
    endpoint = settings.otel_exporter_otlp_traces_endpoint
    if name == "otlp_proto_http" and endpoint is None and settings.otel_exporter_otlp_endpoint:
        endpoint = f"{settings.otel_exporter_otlp_endpoint.rstrip('/')}/v1/traces"
    elif name == "otlp_proto_grpc" and endpoint is None:
        endpoint = settings.otel_exporter_otlp_endpoint
    if name in OTLP_BY_PROTOCOL.values() and endpoint is not None:
        exporter: SpanExporter = exporter_class(endpoint=endpoint)
    else:
        exporter = exporter_class()
    return exporter


def service_resource() -> Resource:
    """The SDK's resource, with `service.name` `chatqna` unless the environment names one."""
    defaults = Resource.create(
        {"service.name": DEFAULT_SERVICE_NAME, "service.version": __version__}
    )
    return defaults.merge(OTELResourceDetector().detect())


# opentelemetry-instrumentation-fastapi wraps an app's middleware stack in this ASGI
# middleware (module, class); FastAPI's own tracing steps aside when it finds it there.
CONTRIB_MIDDLEWARE = ("opentelemetry.instrumentation.asgi", "OpenTelemetryMiddleware")
CONTRIB_WARNING = (
    "tracing: opentelemetry-instrumentation-fastapi has instrumented the app, and FastAPI's "
    "own tracing steps aside for it: a streamed answer makes a span per event and the probes "
    "and /metrics are traced. Set OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=fastapi (or "
    "uninstall the package) to keep the service's own request spans."
)


def contrib_instrumented(app: object) -> bool:
    """Whether `app`'s built middleware stack (Starlette's `middleware_stack`) runs in
    `CONTRIB_MIDDLEWARE`, as opentelemetry-instrumentation-fastapi leaves it. The stack is
    built on the first ASGI call, the lifespan's included."""
    layer = getattr(app, "middleware_stack", None)
    seen: set[int] = set()
    while layer is not None and id(layer) not in seen:
        seen.add(id(layer))
        if (type(layer).__module__, type(layer).__name__) == CONTRIB_MIDDLEWARE:
            return True
        layer = getattr(layer, "app", None)
    return False


def tracing_recorded() -> bool:
    """Whether the process's tracer provider records spans, as the instrumentation would
    get its tracer from it: not while none is installed (the API's proxy), nor with a no-op
    one, nor with the SDK's under `OTEL_SDK_DISABLED=true` (it hands out no-op tracers),
    all of which `opentelemetry-instrument` may leave while it still instruments."""
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider):
        return False
    return not isinstance(provider.get_tracer(CONTRIB_MIDDLEWARE[0]), trace.NoOpTracer)


class ShutdownOnceExporter(SpanExporter):
    """A span exporter that is shut down once, however often it is told to.

    Past its bound, `OwnedTracing.shutdown` shuts the exporters down (an OTLP exporter then
    stops retrying), and the SDK's batch processor shuts its exporter down again once its
    worker stops: the OTLP exporters log "Exporter already shutdown" for that second call,
    and for each batch the worker still hands them. Here the second call does nothing, and
    a batch after the shutdown fails without reaching the exporter (`OwnedTracing.shutdown`
    has logged that those spans are dropped)."""

    def __init__(self, exporter: SpanExporter) -> None:
        self.exporter = exporter
        self._lock = threading.Lock()
        self._shut_down = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._shut_down:
            return SpanExportResult.FAILURE
        return self.exporter.export(spans)

    def shutdown(self) -> None:
        with self._lock:
            if self._shut_down:
                return
            self._shut_down = True
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.exporter.force_flush(timeout_millis)


def batch_processor(exporter: SpanExporter, **options: Any) -> BatchSpanProcessor:
    """The SDK's batch processor on `exporter`, shut down once (`ShutdownOnceExporter`);
    `options` are `BatchSpanProcessor`'s, the unset ones read from `OTEL_BSP_*`."""
    return BatchSpanProcessor(ShutdownOnceExporter(exporter), **options)


@dataclass(frozen=True)
class OwnedTracing:
    """The tracer provider `configure_tracing` installed and its batch processors (built
    with `batch_processor`, so that their exporters are shut down once)."""

    provider: TracerProvider
    processors: tuple[BatchSpanProcessor, ...]

    def shutdown(self, timeout_seconds: float | None = None) -> bool:
        """Export the spans still batched and shut the provider down, waiting at most
        `timeout_seconds` (`SHUTDOWN_TIMEOUT_SECONDS` unless given). Blocks: run it off the
        event loop. Returns whether everything was exported in time.

        Past the bound, each exporter is shut down (no more retries; later batches fail at
        once) and the remaining spans are dropped. The SDK's threads are daemons, so an
        export still waiting on the network does not keep the process alive.
        """
        bound = SHUTDOWN_TIMEOUT_SECONDS if timeout_seconds is None else timeout_seconds
        worker = threading.Thread(
            target=self.provider.shutdown, name="chatqna-tracing-shutdown", daemon=True
        )
        worker.start()
        worker.join(bound)
        if not worker.is_alive():
            return True
        for processor in self.processors:
            processor.span_exporter.shutdown()
        logger.warning(
            "tracing: the spans not exported within %g s of shutdown were dropped "
            "(is the collector at OTEL_EXPORTER_OTLP_ENDPOINT answering?)",
            bound,
        )
        return False


def configure_tracing(settings: Settings) -> OwnedTracing | None:
    """Install the SDK's tracer provider as the global one, exporting as configured.

    Returns the provider installed here with its processors (to flush at shutdown), or
    None: tracing off, or a provider already installed by someone else (used as it is).
    """
    if settings.otel_sdk_disabled:
        return None
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        logger.info("tracing: using the tracer provider already installed")
        return None
    names = settings.span_exporter_names()
    if not names:
        return None
    provider = TracerProvider(resource=service_resource())
    processors = tuple(batch_processor(build_exporter(name, settings)) for name in names)
    for processor in processors:
        provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    logger.info(
        "tracing on: %s, service %s",
        ",".join(names),
        provider.resource.attributes.get("service.name"),
    )
    return OwnedTracing(provider, processors)
