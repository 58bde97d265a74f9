"""Tracing set-up: which exporters the settings ask for, where they send, the resource,
nothing installed over a provider that is there already (the tests' own, here), and a
propagator for `OTEL_PROPAGATORS=none` that returns a context."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence

import pytest
import requests
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, StaticSampler
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from requests import Response

from chatqna import __version__
from chatqna.settings import Settings
from chatqna.telemetry.tracing import (
    NoPropagation,
    OwnedTracing,
    batch_processor,
    build_exporter,
    configure_propagation,
    configure_tracing,
    current_trace_id,
    dropped,
    inert,
    service_resource,
    tracer,
)
from tests.unit.conftest import TRACER_PROVIDER

COLLECTOR = "http://collector.test:4318"


@pytest.mark.parametrize(
    ("values", "names"),
    [
        ({}, []),  # nothing configured: off
        ({"otel_exporter_otlp_endpoint": COLLECTOR}, ["otlp_proto_http"]),
        ({"otel_exporter_otlp_traces_endpoint": f"{COLLECTOR}/v1/traces"}, ["otlp_proto_http"]),
        ({"otel_traces_exporter": "none", "otel_exporter_otlp_endpoint": COLLECTOR}, []),
        ({"otel_traces_exporter": "console"}, ["console"]),
        ({"otel_traces_exporter": "otlp,console"}, ["otlp_proto_http", "console"]),
        (
            {"otel_traces_exporter": "otlp", "otel_exporter_otlp_protocol": "grpc"},
            ["otlp_proto_grpc"],
        ),
        (
            {
                "otel_traces_exporter": "otlp",
                "otel_exporter_otlp_protocol": "grpc",
                "otel_exporter_otlp_traces_protocol": "http/protobuf",
            },
            ["otlp_proto_http"],
        ),
    ],
)
def test_exporters_follow_the_specifications_variables(
    values: dict[str, str], names: list[str]
) -> None:
    assert Settings(**values).span_exporter_names() == names  # type: ignore[arg-type]


def test_http_json_is_refused_when_settings_load() -> None:
    with pytest.raises(ValueError, match="otel_exporter_otlp_protocol"):
        Settings(otel_exporter_otlp_protocol="http/json")  # type: ignore[arg-type]


def posted_to(exporter: SpanExporter, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The URLs `exporter` posts one span to, caught at `requests` (the SDK's HTTP client)."""
    urls: list[str] = []

    def request(_session: requests.Session, method: str, url: str, **_: object) -> Response:
        urls.append(url)
        answer = Response()
        answer.status_code = 200
        return answer

    monkeypatch.setattr(requests.Session, "request", request)
    provider = TracerProvider()
    spans = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    provider.get_tracer("test").start_span("one").end()
    assert exporter.export(spans.get_finished_spans()) is SpanExportResult.SUCCESS
    exporter.shutdown()
    return urls


def test_the_http_exporter_sends_to_the_traces_path_of_the_base_endpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = Settings(otel_exporter_otlp_endpoint=f"{COLLECTOR}/")
    exporter = build_exporter("otlp_proto_http", settings)
    assert isinstance(exporter, HttpSpanExporter)
    assert posted_to(exporter, monkeypatch) == [f"{COLLECTOR}/v1/traces"]


def test_the_traces_endpoint_is_taken_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    full = "http://traces.test:10428/insert/opentelemetry/v1/traces"
    settings = Settings(
        otel_exporter_otlp_endpoint=COLLECTOR, otel_exporter_otlp_traces_endpoint=full
    )
    exporter = build_exporter("otlp_proto_http", settings)
    assert posted_to(exporter, monkeypatch) == [full]


def test_the_grpc_exporter_and_the_console_one_are_the_sdks() -> None:
    settings = Settings(otel_exporter_otlp_endpoint="http://collector.test:4317")
    grpc_exporter = build_exporter("otlp_proto_grpc", settings)
    assert isinstance(grpc_exporter, GrpcSpanExporter)
    grpc_exporter.shutdown()
    assert isinstance(build_exporter("console", settings), ConsoleSpanExporter)


def test_an_unknown_exporter_name_is_refused() -> None:
    with pytest.raises(ValueError, match="zipkin-nope"):
        build_exporter("zipkin-nope", Settings())


def test_the_service_name_defaults_to_chatqna(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
    attributes = service_resource().attributes
    assert attributes["service.name"] == "chatqna"
    assert attributes["service.version"] == __version__
    assert attributes["deployment.environment"] == "test"


@pytest.mark.parametrize(
    ("variables", "name"),
    [
        ({"OTEL_RESOURCE_ATTRIBUTES": "service.name=rag-eu,team=search"}, "rag-eu"),
        ({"OTEL_SERVICE_NAME": "rag-us", "OTEL_RESOURCE_ATTRIBUTES": "service.name=x"}, "rag-us"),
    ],
)
def test_a_service_name_from_the_environment_is_kept(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], name: str
) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    for key, value in variables.items():
        monkeypatch.setenv(key, value)
    assert service_resource().attributes["service.name"] == name


def test_nothing_is_installed_over_a_provider_already_there() -> None:
    settings = Settings(otel_traces_exporter="console")
    assert configure_tracing(settings) is None
    assert trace.get_tracer_provider() is TRACER_PROVIDER


def test_nothing_is_installed_when_the_sdk_is_disabled() -> None:
    settings = Settings(otel_sdk_disabled=True, otel_exporter_otlp_endpoint=COLLECTOR)
    assert configure_tracing(settings) is None


def test_the_trace_id_is_the_current_spans(spans: InMemorySpanExporter) -> None:
    assert current_trace_id() is None
    with tracer().start_as_current_span("work") as span:
        assert current_trace_id() == format(span.get_span_context().trace_id, "032x")
    (finished,) = spans.get_finished_spans()
    assert finished.instrumentation_scope is not None
    assert finished.instrumentation_scope.name == "chatqna"


DROPPED = SpanContext(
    0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, False, TraceFlags(TraceFlags.DEFAULT)
)


def test_in_a_dropped_trace_no_span_is_started_and_the_parent_stays(
    spans: InMemorySpanExporter,
) -> None:
    parent = NonRecordingSpan(DROPPED)
    with trace.use_span(parent):
        assert tracer().start_span("child") is parent
        with tracer().start_as_current_span("work") as span:
            assert span is parent and trace.get_current_span() is parent
            assert current_trace_id() == "0af7651916cd43dd8448eb211c80319c"
    assert tracer().start_span("child", context=trace.set_span_in_context(parent)) is parent
    assert spans.get_finished_spans() == ()


def test_without_a_tracer_provider_no_span_is_started_and_nothing_is_attached(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(trace, "get_tracer_provider", trace.ProxyTracerProvider)
    assert inert(trace.INVALID_SPAN)
    assert tracer().start_span("child") is trace.INVALID_SPAN
    remote = NonRecordingSpan(
        SpanContext(DROPPED.trace_id, DROPPED.span_id, True, TraceFlags(TraceFlags.SAMPLED))
    )
    with trace.use_span(remote):
        before = trace.get_current_span()
        with tracer().start_as_current_span("work") as span:
            # The incoming context stays current, so it still goes upstream.
            assert span is remote and trace.get_current_span() is before
    given = trace.set_span_in_context(remote)
    with tracer().start_as_current_span("work", context=given) as span:
        assert span is remote and trace.get_current_span() is remote
    assert trace.get_current_span() is trace.INVALID_SPAN


def test_a_recording_parent_is_never_handed_out_as_a_new_span(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sampler may record a span it does not sample (RECORD_ONLY); such a parent is not
    inert, so the service's spans under it are real ones, never the parent ended early."""
    provider = TracerProvider(sampler=StaticSampler(Decision.RECORD_ONLY))
    parent = provider.get_tracer("test").start_span("server")
    assert parent.is_recording() and dropped(parent) and not inert(parent)
    monkeypatch.setattr(trace, "get_tracer_provider", trace.ProxyTracerProvider)
    with trace.use_span(parent):
        child = tracer().start_span("child")
        assert child is not parent
        child.end()
    assert parent.is_recording()
    parent.end()


def test_in_a_sampled_trace_spans_are_started_under_the_parent(
    spans: InMemorySpanExporter,
) -> None:
    with tracer().start_as_current_span("turn") as turn:
        assert not dropped(turn)
        with tracer().start_as_current_span("work") as work:
            assert work is not turn
    work_span, turn_span = spans.get_finished_spans()
    assert work_span.parent is not None
    assert work_span.parent.span_id == turn_span.context.span_id


def test_an_ended_sampled_span_still_gets_children(spans: InMemorySpanExporter) -> None:
    turn = tracer().start_span("turn")
    turn.end()
    child = tracer().start_span("late", context=trace.set_span_in_context(turn))
    child.end()
    assert [span.name for span in spans.get_finished_spans()] == ["turn", "late"]


@pytest.fixture
def global_propagator() -> Iterator[None]:
    configured = propagate.get_global_textmap()
    yield
    propagate.set_global_textmap(configured)


@pytest.mark.usefixtures("global_propagator")
def test_the_empty_propagator_of_otel_propagators_none_is_replaced() -> None:
    propagate.set_global_textmap(CompositePropagator([]))  # what `none` gets from the API
    configure_propagation()
    assert isinstance(propagate.get_global_textmap(), NoPropagation)
    headers = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    assert propagate.extract(headers) == Context()
    given = Context({"key": "value"})
    assert propagate.extract(headers, context=given) is given
    sent: dict[str, str] = {}
    with tracer().start_as_current_span("parent"):
        propagate.inject(sent)
    assert sent == {}


@pytest.mark.usefixtures("global_propagator")
def test_a_working_propagator_is_left_as_it_is() -> None:
    configured = propagate.get_global_textmap()
    configure_propagation()
    assert propagate.get_global_textmap() is configured


# ----------------------------------------------------------------------- shutdown


class CollectorStandIn(SpanExporter):
    """Exports by waiting for `answer` (a collector that answers, or never does); `shutdown`
    records the call and ends a wait still pending, as the OTLP exporters' shutdown does."""

    def __init__(self, answers: bool) -> None:
        self.answer = threading.Event()
        if answers:
            self.answer.set()
        self.exported: list[str] = []
        self.shut_down = threading.Event()
        self.shutdowns = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.answer.wait()
        if self.shut_down.is_set():
            return SpanExportResult.FAILURE
        self.exported.extend(span.name for span in spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.shutdowns += 1
        self.shut_down.set()
        self.answer.set()


def owned(exporter: SpanExporter) -> OwnedTracing:
    """A provider of its own (not the global one) with a batch processor on `exporter`,
    holding two ended spans."""
    processor = batch_processor(exporter, schedule_delay_millis=60_000)
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(processor)
    for name in ("first", "second"):
        provider.get_tracer("test").start_span(name).end()
    return OwnedTracing(provider, (processor,))


def test_shutdown_exports_the_spans_still_batched() -> None:
    exporter = CollectorStandIn(answers=True)
    assert owned(exporter).shutdown(timeout_seconds=30) is True
    assert sorted(exporter.exported) == ["first", "second"]
    assert exporter.shutdowns == 1


def test_a_collector_that_never_answers_costs_the_bound_and_the_spans(
    caplog: pytest.LogCaptureFixture,
) -> None:
    exporter = CollectorStandIn(answers=False)
    with caplog.at_level(logging.WARNING, logger="chatqna.telemetry.tracing"):
        assert owned(exporter).shutdown(timeout_seconds=0.2) is False
    # The exporter was told to stop: its pending export ends, and exports nothing.
    assert exporter.shut_down.is_set()
    assert exporter.exported == []
    assert "dropped" in caplog.text and "OTEL_EXPORTER_OTLP_ENDPOINT" in caplog.text
    # The provider's shutdown ends in its thread once the processor's worker has stopped,
    # and the processor shuts its exporter down too: that second call does not reach it.
    for thread in threading.enumerate():
        if thread.name == "chatqna-tracing-shutdown":
            thread.join()
    assert exporter.shutdowns == 1
