"""The service's tracer: one per provider, real spans in a recorded or a new trace, and no
span at all under one the sampler dropped."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.span import DEFAULT_TRACE_STATE as DEFAULT_STATE

from chatqna.settings import Settings
from chatqna.telemetry.span_export import BatchExporter, ConsoleSender, OtlpHttpSender
from chatqna.telemetry.spans import (
    NOT_SAMPLED,
    DroppedSpan,
    InMemorySpans,
    ServiceTracerProvider,
    local_context,
)
from chatqna.telemetry.tracing import (
    NO_TRACER,
    _tracer_of,
    as_current,
    build_tracer_provider,
    dropped,
    start_child,
    tracer,
)

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C


def foreign(sampled: bool, remote: bool = False) -> NonRecordingSpan:
    flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
    return NonRecordingSpan(SpanContext(TRACE_ID, 0xB7AD6B7169203331, remote, flags))


def test_one_tracer_per_provider() -> None:
    assert tracer() is tracer()


def test_dropped_is_a_real_trace_not_sampled() -> None:
    assert dropped(foreign(sampled=False))
    assert not dropped(foreign(sampled=True, remote=True))
    assert not dropped(trace.INVALID_SPAN), "no trace at all is not a dropped one"
    recording = tracer().start_span("recording")
    assert not dropped(recording)
    recording.end()


def test_under_a_dropped_span_no_span_is_made(spans: InMemorySpans) -> None:
    parent = foreign(sampled=False)
    with trace.use_span(parent):
        with tracer().start_as_current_span("chatqna.embed") as embed:
            assert embed is parent
            assert trace.get_current_span() is parent
        generate = tracer().start_span("chatqna.generate")
        generate.end()
    assert generate is parent
    context = trace.set_span_in_context(parent)
    assert tracer().start_span("chatqna.generate", context=context) is parent
    assert spans.get_finished_spans() == ()


def ours_dropped() -> DroppedSpan:
    return DroppedSpan(local_context(TRACE_ID, 0x00F067AA0BA902B7, NOT_SAMPLED, DEFAULT_STATE))


def test_a_dropped_span_of_ours_stands_in_for_its_children_by_the_short_path(
    spans: InMemorySpans,
) -> None:
    root = ours_dropped()
    assert dropped(root)
    with as_current(root) as entered:
        assert entered is root and trace.get_current_span() is root, "made current"
        with as_current(root), tracer().start_as_current_span("chatqna.embed") as embed:
            assert embed is root and trace.get_current_span() is root
        assert tracer().start_span("chatqna.generate") is root
        assert start_child(root, "chatqna.generate") is root
        server = tracer().start_span("POST", kind=SpanKind.SERVER)
        assert server is not root, "a server span is always the sampler's to decide"
    assert trace.get_current_span() is not root, "left current only inside the block"
    assert spans.get_finished_spans() == ()


def test_a_dropped_span_lets_exceptions_through(spans: InMemorySpans) -> None:
    root = ours_dropped()
    with (
        trace.use_span(root),
        pytest.raises(ValueError),
        tracer().start_as_current_span("chatqna.embed"),
    ):
        raise ValueError("not swallowed")
    assert spans.get_finished_spans() == ()


def test_start_child_makes_a_real_span_under_a_recorded_parent(spans: InMemorySpans) -> None:
    parent = tracer().start_span("chatqna.orchestrate")
    child = start_child(parent, "chatqna.generate")
    child.end()
    parent.end()
    (done, _) = spans.get_finished_spans()
    assert done.name == "chatqna.generate"
    assert done.parent is not None and done.parent.span_id == parent.get_span_context().span_id


def test_tracer_follows_the_installed_provider() -> None:
    assert _tracer_of(None) is NO_TRACER, "no provider installed: the tracer that does nothing"
    assert tracer() is _tracer_of(trace.get_tracer_provider())
    assert not isinstance(tracer(), type(NO_TRACER)), "the tests' provider is installed"


def test_under_a_recorded_span_children_are_real(spans: InMemorySpans) -> None:
    with tracer().start_as_current_span("chatqna.orchestrate") as orchestrate:
        with tracer().start_as_current_span("chatqna.embed"):
            pass
        generate = tracer().start_span(
            "chatqna.generate", context=trace.set_span_in_context(orchestrate)
        )
        generate.end()
    finished = {s.name: s for s in spans.get_finished_spans()}
    parent_id = orchestrate.get_span_context().span_id
    for name in ("chatqna.embed", "chatqna.generate"):
        parent = finished[name].parent
        assert parent is not None and parent.span_id == parent_id, name


def test_a_sampled_remote_parent_gets_real_children(spans: InMemorySpans) -> None:
    with (
        trace.use_span(foreign(sampled=True, remote=True)),
        tracer().start_as_current_span("chatqna.orchestrate"),
    ):
        pass
    (span,) = spans.get_finished_spans()
    assert span.context is not None and span.context.trace_id == TRACE_ID


def test_an_exception_is_recorded_only_when_asked(spans: InMemorySpans) -> None:
    for record in (True, False):
        with (
            pytest.raises(ValueError),
            tracer().start_as_current_span(f"record={record}", record_exception=record),
        ):
            raise ValueError("x")
    events = {s.name: [e.name for e in s.events] for s in spans.get_finished_spans()}
    assert events == {"record=True": ["exception"], "record=False": []}


def test_no_provider_when_tracing_is_off() -> None:
    assert build_tracer_provider(Settings(otel_traces_exporter="none")) is None
    assert build_tracer_provider(Settings()) is None, "no endpoint: off"


def test_an_otlp_provider_sends_where_and_how_the_settings_say() -> None:
    provider = build_tracer_provider(
        Settings(
            otel_exporter_otlp_endpoint="http://collector.test:4318/",
            otel_exporter_otlp_headers="api-key=one,x-tenant=blue",  # type: ignore[arg-type]
            otel_exporter_otlp_traces_headers="api-key=two",  # type: ignore[arg-type]
            otel_exporter_otlp_timeout=2500,
            otel_exporter_otlp_compression="gzip",
            otel_traces_sampler="traceidratio",
            otel_traces_sampler_arg=0.25,
            otel_bsp_max_export_batch_size=64,
        )
    )
    assert isinstance(provider, ServiceTracerProvider)
    exporter = provider.sink
    assert isinstance(exporter, BatchExporter)
    sender = exporter.sender
    assert isinstance(sender, OtlpHttpSender)
    assert sender.endpoint == "http://collector.test:4318/v1/traces"
    assert sender._headers["api-key"] == "two", "the traces variable wins"
    assert sender._headers["x-tenant"] == "blue"
    assert sender._headers["Content-Encoding"] == "gzip"
    assert sender._timeout == 2.5
    assert exporter._max_batch == 64
    assert provider.sampler.name == "traceidratio"
    assert provider.resource.attributes["service.name"] == "chatqna"
    provider.shutdown()


def test_the_console_exporter_needs_no_endpoint() -> None:
    provider = build_tracer_provider(Settings(otel_traces_exporter="console"))
    assert provider is not None
    assert isinstance(provider.sink, BatchExporter)
    assert isinstance(provider.sink.sender, ConsoleSender)
    provider.shutdown()
