"""The service's span recorder: sampling by the specification's rules, spans that behave as
the SDK's do where the service relies on it, and the API working on top of it."""

from __future__ import annotations

import contextlib

import pytest
from opentelemetry import trace
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.trace.span import TraceState

from chatqna.telemetry import spans as spans_module
from chatqna.telemetry.spans import (
    SAMPLER_NAMES,
    InMemorySpans,
    RecordedSpan,
    Sampler,
    ServiceTracerProvider,
    current,
    local_context,
    trace_hex,
    write_trace_context,
)

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C


def provider(sampler: str = "parentbased_always_on", ratio: float = 1.0) -> ServiceTracerProvider:
    return ServiceTracerProvider(InMemorySpans(), sampler=Sampler(sampler, ratio))


def finished(p: ServiceTracerProvider) -> tuple[RecordedSpan, ...]:
    assert isinstance(p.sink, InMemorySpans)
    return p.sink.get_finished_spans()


def remote(sampled: bool) -> NonRecordingSpan:
    flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
    return NonRecordingSpan(SpanContext(TRACE_ID, 0xB7AD6B7169203331, True, flags))


@pytest.mark.parametrize(
    ("name", "parent", "expected"),
    [
        ("always_on", None, True),
        ("always_on", False, True),
        ("always_off", None, False),
        ("always_off", True, False),
        ("parentbased_always_on", None, True),
        ("parentbased_always_on", False, False),
        ("parentbased_always_off", None, False),
        ("parentbased_always_off", True, True),
    ],
)
def test_fixed_samplers_follow_the_specification(
    name: str, parent: bool | None, expected: bool
) -> None:
    context = None if parent is None else remote(parent).get_span_context()
    assert Sampler(name).sampled(context, TRACE_ID) is expected


def test_the_ratio_sampler_keeps_the_sdks_bound() -> None:
    half = Sampler("traceidratio", 0.5)
    assert half.sampled(None, (1 << 63) - 1)  # low 64 bits just under half
    assert not half.sampled(None, 1 << 63)
    assert not half.sampled(None, (1 << 64) | (1 << 63)), "only the low 64 bits count"
    kept = sum(
        Sampler("traceidratio", 0.1).sampled(None, i * 0x9E3779B97F4A7C15) for i in range(20000)
    )
    assert 1700 < kept < 2300
    assert Sampler("parentbased_traceidratio", 0.0).sampled(
        remote(True).get_span_context(), TRACE_ID
    ), "a sampled parent wins over the ratio"


def test_every_documented_sampler_name_is_known() -> None:
    for name in SAMPLER_NAMES:
        Sampler(name)
    with pytest.raises(ValueError, match="unknown sampler"):
        Sampler("sometimes")


def test_a_span_records_what_is_set_until_it_ends() -> None:
    p = provider()
    span = p.get_tracer("chatqna", "1.0").start_span("chatqna.embed", attributes={"a": 1})
    assert isinstance(span, RecordedSpan) and span.is_recording()
    span.set_attribute("b", "two")
    span.set_attributes({"c": [1.5, 2.5]})
    span.add_event("chatqna.first_token", {"elapsed_ms": 3.0})
    span.update_name("chatqna.embedded")
    span.end()
    span.end()  # a second end is ignored
    span.set_attribute("late", True)
    span.add_event("late")
    (done,) = finished(p)
    assert done is span and not done.is_recording()
    assert done.name == "chatqna.embedded"
    assert done.attributes == {"a": 1, "b": "two", "c": [1.5, 2.5]}
    assert [e.name for e in done.events] == ["chatqna.first_token"]
    assert done.end_time is not None and done.start_time is not None
    assert done.end_time >= done.start_time
    assert done.instrumentation_scope.name == "chatqna"
    assert done.instrumentation_scope.version == "1.0"
    assert done.parent is None and done.kind is SpanKind.INTERNAL


def test_an_ok_status_is_final_and_error_keeps_its_description() -> None:
    span = provider().get_tracer("t").start_span("s")
    span.set_status(Status(StatusCode.ERROR, "first"))
    span.set_status(StatusCode.ERROR, "second")
    assert span.status.description == "second"  # type: ignore[attr-defined]
    span.set_status(Status(StatusCode.OK))
    span.set_status(Status(StatusCode.ERROR, "after ok"))
    assert span.status.status_code is StatusCode.OK  # type: ignore[attr-defined]


def test_an_exception_event_has_the_semantic_attributes() -> None:
    span = provider().get_tracer("t").start_span("s")
    try:
        raise KeyError("missing")
    except KeyError as exc:
        span.record_exception(exc, {"extra": 1})
    (event,) = span.events  # type: ignore[attr-defined]
    assert event.name == "exception"
    assert event.attributes["exception.type"] == "KeyError"
    assert event.attributes["exception.message"] == "'missing'"
    assert "raise KeyError" in str(event.attributes["exception.stacktrace"])
    assert event.attributes["extra"] == 1


def test_children_share_the_trace_and_name_their_parent() -> None:
    p = provider()
    tracer = p.get_tracer("chatqna")
    with tracer.start_as_current_span("parent") as parent:
        assert trace.get_current_span() is parent
        with tracer.start_as_current_span("child"):
            pass
        later = tracer.start_span("later", context=trace.set_span_in_context(parent))
        later.end()
    assert trace.get_current_span() is trace.INVALID_SPAN
    spans = {s.name: s for s in finished(p)}
    for name in ("child", "later"):
        assert spans[name].context.trace_id == spans["parent"].context.trace_id
        assert spans[name].parent == spans["parent"].context
    assert spans["parent"].parent is None


def test_a_remote_sampled_parent_is_continued() -> None:
    p = provider()
    with trace.use_span(remote(True)):
        span = p.get_tracer("chatqna.http").start_span("POST", kind=SpanKind.SERVER)
    span.end()
    (done,) = finished(p)
    assert done.context.trace_id == TRACE_ID
    assert done.parent is not None and done.parent.is_remote


def test_a_dropped_root_is_a_fresh_non_recording_span_and_gets_no_children() -> None:
    p = provider("always_off")
    tracer = p.get_tracer("chatqna")
    root = tracer.start_span("POST", kind=SpanKind.SERVER)
    assert not root.is_recording()
    context = root.get_span_context()
    assert context.is_valid and not context.trace_flags.sampled
    with trace.use_span(root):
        with tracer.start_as_current_span("chatqna.embed") as embed:
            assert embed is root
        assert tracer.start_span("chatqna.generate") is root
    assert finished(p) == ()


def test_always_on_records_a_server_span_under_a_remote_unsampled_parent() -> None:
    p = provider("always_on")
    with trace.use_span(remote(False)):
        span = p.get_tracer("chatqna.http").start_span("POST", kind=SpanKind.SERVER)
    assert span.is_recording()
    span.end()


def test_the_w3c_propagator_reads_the_current_span() -> None:
    p = provider()
    with p.get_tracer("t").start_as_current_span("s") as span:
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier)
    context = span.get_span_context()
    assert carrier["traceparent"] == f"00-{context.trace_id:032x}-{context.span_id:016x}-01"


@pytest.mark.parametrize("flags", [0x00, 0x01, 0xFF])
@pytest.mark.parametrize("trace_id", [1, TRACE_ID, (1 << 128) - 1])
def test_traceparent_is_written_as_the_w3c_propagator_writes_it(trace_id: int, flags: int) -> None:
    context = SpanContext(trace_id, 0x00F067AA0BA902B7, False, TraceFlags(flags))
    ours: dict[str, str] = {}
    write_trace_context(ours, context)
    write_trace_context(ours, context)  # the trace's digits, kept, come out the same
    theirs: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(
        theirs, trace.set_span_in_context(NonRecordingSpan(context))
    )
    assert ours == theirs


def test_trace_digits_are_kept_per_trace_and_the_store_stays_bounded() -> None:
    spans_module._trace_hex.clear()
    for trace_id in range(1, spans_module.TRACE_HEX_LIMIT + 50):
        assert trace_hex(trace_id) == format(trace_id, "032x")
        assert len(spans_module._trace_hex) <= spans_module.TRACE_HEX_LIMIT
    assert trace_hex(TRACE_ID) is trace_hex(TRACE_ID)  # formatted once


@pytest.mark.parametrize("record", [True, False])
def test_current_records_an_exception_leaving_the_block(record: bool) -> None:
    span = provider().get_tracer("t").start_span("s")
    with pytest.raises(ValueError), current(span, record_exception=record):
        raise ValueError("boom")
    assert [e.name for e in span.events] == (["exception"] if record else [])  # type: ignore[attr-defined]
    assert span.status.status_code is StatusCode.ERROR  # type: ignore[attr-defined]
    assert span.status.description == "ValueError: boom"  # type: ignore[attr-defined]
    assert span.is_recording(), "current() does not end the span unless asked"


def test_a_cancellation_is_not_recorded_as_an_error() -> None:
    span = provider().get_tracer("t").start_span("s")
    with pytest.raises(KeyboardInterrupt), current(span):
        raise KeyboardInterrupt
    assert span.events == () and span.status.status_code is StatusCode.UNSET  # type: ignore[attr-defined]


@pytest.mark.parametrize("failure", [None, ValueError("boom"), KeyboardInterrupt()])
def test_start_as_current_span_is_current_for_the_block_and_ends_with_it(
    failure: BaseException | None,
) -> None:
    p = provider()
    tracer = p.get_tracer("t")
    outer = trace.get_current_span()
    with (
        contextlib.suppress(ValueError, KeyboardInterrupt),
        tracer.start_as_current_span("s") as span,
    ):
        assert trace.get_current_span() is span
        with tracer.start_as_current_span("child") as child:
            assert trace.get_current_span() is child
        assert trace.get_current_span() is span, "the child's block restored its parent"
        if failure is not None:
            raise failure
    assert trace.get_current_span() is outer
    assert not span.is_recording() and not child.is_recording(), "both ended"
    assert child.parent == span.get_span_context()  # type: ignore[attr-defined]
    recorded = isinstance(failure, Exception)
    assert [e.name for e in span.events] == (["exception"] if recorded else [])  # type: ignore[attr-defined]
    expected = StatusCode.ERROR if recorded else StatusCode.UNSET
    assert span.status.status_code is expected  # type: ignore[attr-defined]


def test_with_a_started_span_ends_it_without_making_it_current() -> None:
    # The API's `with span:` for a span of `start_span`: ended on exit, never current.
    tracer = provider().get_tracer("t")
    outer = trace.get_current_span()
    with tracer.start_span("s") as span:
        assert trace.get_current_span() is outer
    assert not span.is_recording()


def test_one_tracer_per_scope() -> None:
    p = provider()
    assert p.get_tracer("a", "1") is p.get_tracer("a", "1")
    assert p.get_tracer("a", "1") is not p.get_tracer("a", "2")


def test_shutdown_calls_the_exporters_shutdown_once_given() -> None:
    calls: list[str] = []
    ServiceTracerProvider(InMemorySpans(), shutdown=lambda: calls.append("x")).shutdown()
    ServiceTracerProvider(InMemorySpans()).shutdown()
    assert calls == ["x"]


def test_a_local_context_is_the_api_s_span_context_and_unpacks_in_its_field_order() -> None:
    # The recorder and the encoder read a SpanContext by unpacking its tuple; this fails
    # if a new API release changes the layout.
    state = TraceState([("vendor", "x")])
    built = local_context(TRACE_ID, 0x00F067AA0BA902B7, TraceFlags(TraceFlags.SAMPLED), state)
    made = SpanContext(TRACE_ID, 0x00F067AA0BA902B7, False, TraceFlags(TraceFlags.SAMPLED), state)
    assert built == made and type(built) is SpanContext
    assert built.is_valid and not built.is_remote and built.trace_flags.sampled
    remote = SpanContext(1, 2, True, TraceFlags(TraceFlags.DEFAULT), state)
    assert tuple(remote) == (1, 2, True, TraceFlags.DEFAULT, state, True)
    assert tuple(SpanContext(0, 0, False))[5] is False
