"""The OTLP encoder's bytes, decoded by opentelemetry-proto's own protobuf classes."""

from __future__ import annotations

import math

import pytest
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status as ProtoStatus
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from chatqna.telemetry.otlp_encoding import AttributeCache, SpanEncoder, encode_request, varint
from chatqna.telemetry.spans import InMemorySpans, RecordedSpan, Scope, ServiceTracerProvider

RESOURCE = {"service.name": "chatqna-test", "service.version": "1.2.3"}


def recorded() -> list[RecordedSpan]:
    store = InMemorySpans()
    provider = ServiceTracerProvider(store)
    http = provider.get_tracer("chatqna.http")
    pipeline = provider.get_tracer("chatqna", "0.9")
    server = http.start_span("POST /v1/chatqna", kind=SpanKind.SERVER)
    server.set_attributes({"http.request.method": "POST", "server.port": 8888})
    with (
        trace.use_span(server),
        pipeline.start_as_current_span("chatqna.orchestrate") as orchestrate,
    ):
        orchestrate.set_attribute("chatqna.blend.executed", True)
        orchestrate.set_attribute("chatqna.blend.alpha", 0.7)
        orchestrate.set_attribute("chatqna.kept.ids", ["a", "b"])
        orchestrate.set_attribute("chatqna.kept.scores", [0.5, -1.25])
        orchestrate.set_attribute("chatqna.offset", -3)
        orchestrate.set_attribute("chatqna.text", "é\u2603 unicode")
        orchestrate.add_event("chatqna.first_token", {"elapsed_ms": 12.5})
        orchestrate.set_status(Status(StatusCode.ERROR, "CondenseFailed"))
    server.end()
    return list(store.get_finished_spans())


def decode(body: bytes) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    return request


def value_of(any_value: AnyValue) -> object:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [value_of(v) for v in any_value.array_value.values]
    return getattr(any_value, kind)


def test_varint_matches_protobufs_own() -> None:
    for value in (0, 1, 127, 128, 300, 16383, 16384, 2**63 - 1):
        proto = AnyValue(int_value=value).SerializeToString()
        assert proto == b"\x18" + varint(value)
    assert AnyValue(int_value=-3).SerializeToString() == b"\x18" + varint(-3)


def test_a_request_decodes_with_every_field() -> None:
    spans = recorded()
    request = decode(encode_request(RESOURCE, spans))
    (resource_spans,) = request.resource_spans
    resource = {a.key: value_of(a.value) for a in resource_spans.resource.attributes}
    assert resource == RESOURCE
    scopes = {s.scope.name: s for s in resource_spans.scope_spans}
    assert set(scopes) == {"chatqna", "chatqna.http"}
    assert scopes["chatqna"].scope.version == "0.9"
    (server,) = scopes["chatqna.http"].spans
    (orchestrate,) = scopes["chatqna"].spans
    by_name = {s.name: s for s in spans}
    for proto, span in (
        (server, by_name["POST /v1/chatqna"]),
        (orchestrate, by_name["chatqna.orchestrate"]),
    ):
        assert proto.trace_id == span.context.trace_id.to_bytes(16, "big")
        assert proto.span_id == span.context.span_id.to_bytes(8, "big")
        assert proto.start_time_unix_nano == span.start_time
        assert proto.end_time_unix_nano == span.end_time
        assert proto.flags & 0x100 and proto.flags & 0xFF == 1
    assert server.kind == ProtoSpan.SPAN_KIND_SERVER
    assert server.parent_span_id == b""
    assert orchestrate.kind == ProtoSpan.SPAN_KIND_INTERNAL
    assert orchestrate.parent_span_id == server.span_id
    assert {a.key: value_of(a.value) for a in server.attributes} == {
        "http.request.method": "POST",
        "server.port": 8888,
    }
    assert {a.key: value_of(a.value) for a in orchestrate.attributes} == {
        "chatqna.blend.executed": True,
        "chatqna.blend.alpha": 0.7,
        "chatqna.kept.ids": ["a", "b"],
        "chatqna.kept.scores": [0.5, -1.25],
        "chatqna.offset": -3,
        "chatqna.text": "é\u2603 unicode",
    }
    (event,) = orchestrate.events
    assert event.name == "chatqna.first_token"
    assert {a.key: value_of(a.value) for a in event.attributes} == {"elapsed_ms": 12.5}
    assert orchestrate.status.code == ProtoStatus.STATUS_CODE_ERROR
    assert orchestrate.status.message == "CondenseFailed"
    assert server.status.code == ProtoStatus.STATUS_CODE_UNSET


def test_a_batch_interleaving_scopes_carries_each_span_with_its_scope() -> None:
    store = InMemorySpans()
    provider = ServiceTracerProvider(store)
    tracers = [
        provider.get_tracer("chatqna.http"),
        provider.get_tracer("chatqna.http", "1.0"),
        provider.get_tracer("chatqna"),
    ]
    for turn in range(3):
        for tracer in tracers:
            tracer.start_span(f"span {turn}").end()
    encoder = SpanEncoder(RESOURCE)
    body = encoder.request_of([encoder.scope_spans(s) for s in store.get_finished_spans()])
    (resource_spans,) = decode(body).resource_spans
    arrived = [
        (group.scope.name, group.scope.version, span.name)
        for group in resource_spans.scope_spans
        for span in group.spans
    ]
    scopes = [Scope("chatqna.http"), Scope("chatqna.http", "1.0"), Scope("chatqna")]
    assert arrived == [
        (scope.name, scope.version, f"span {turn}") for turn in range(3) for scope in scopes
    ]
    # `span()` is the span's own field, as it sits inside its `ScopeSpans`.
    first = store.get_finished_spans()[0]
    assert encoder.scope_spans(first).endswith(encoder.span(first))
    assert ProtoSpan.FromString(encoder.span(first)[2:]).name == "span 0"


def test_a_remote_parent_and_trace_state_are_carried() -> None:
    store = InMemorySpans()
    tracer = ServiceTracerProvider(store).get_tracer("chatqna.http")
    remote = SpanContext(
        0x0AF7651916CD43DD8448EB211C80319C,
        0xB7AD6B7169203331,
        True,
        TraceFlags(TraceFlags.SAMPLED),
        TraceState([("vendor", "value")]),
    )
    with trace.use_span(NonRecordingSpan(remote)):
        span = tracer.start_span("GET", kind=SpanKind.SERVER)
    span.end()
    (proto,) = decode(encode_request(RESOURCE, [span])).resource_spans[0].scope_spans[0].spans
    assert proto.parent_span_id == remote.span_id.to_bytes(8, "big")
    assert proto.trace_id == remote.trace_id.to_bytes(16, "big")
    assert proto.trace_state == "vendor=value"
    assert proto.flags & 0x300 == 0x300, "the parent is remote"


def test_spans_alike_but_for_ids_times_parents_and_kinds_keep_their_own() -> None:
    store = InMemorySpans()
    tracer = ServiceTracerProvider(store).get_tracer("chatqna.http")
    local = tracer.start_span("root")
    remote = SpanContext(
        0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, True, TraceFlags(1)
    )
    made = []
    for turn in range(2):
        for parent, kind in (
            (local, SpanKind.CLIENT),
            (NonRecordingSpan(remote), SpanKind.CLIENT),
            (None, SpanKind.SERVER),  # a root, shaped like the others
            (local, SpanKind.SERVER),
        ):
            with trace.use_span(parent or trace.INVALID_SPAN):
                span = tracer.start_span("POST", kind=kind, start_time=1000 + turn)
            span.set_attribute("server.port", 8080)
            span.end(end_time=2000 + turn)
            made.append(span)
    local.end()
    encoder = SpanEncoder(RESOURCE)
    body = encoder.request_of([encoder.scope_spans(s) for s in made])
    decoded = [span for group in decode(body).resource_spans[0].scope_spans for span in group.spans]
    assert len(decoded) == len(made)
    for proto, span in zip(decoded, made, strict=True):
        assert proto.span_id == span.context.span_id.to_bytes(8, "big")
        assert proto.trace_id == span.context.trace_id.to_bytes(16, "big")
        parent_id = span.parent.span_id.to_bytes(8, "big") if span.parent else b""
        assert proto.parent_span_id == parent_id
        assert (proto.start_time_unix_nano, proto.end_time_unix_nano) == (
            span.start_time,
            span.end_time,
        )
        assert proto.kind == span.kind.value + 1
        assert proto.flags & 0x100  # whether the parent is remote is known
        assert bool(proto.flags & 0x200) == bool(span.parent and span.parent.is_remote)
        assert {a.key: value_of(a.value) for a in proto.attributes} == {"server.port": 8080}


def test_a_kept_shape_serves_only_spans_of_that_scope_name_and_attributes() -> None:
    # A span's encoding but its ids, kind, times and flags is kept by scope, name and
    # attribute set; spans that differ in any of those, or carry events or a status, must
    # come out as themselves.
    store = InMemorySpans()
    provider = ServiceTracerProvider(store)
    tracers = [provider.get_tracer("chatqna", "1"), provider.get_tracer("chatqna", "2")]
    root = tracers[0].start_span("root")
    expected = []
    with trace.use_span(root):
        for _ in range(2):
            for tracer in tracers:
                for name in ("chatqna.embed", "chatqna.rerank"):
                    for attributes in ({}, {"k": 1}, {"k": True}, {"k": "1"}):
                        span = tracer.start_span(name, attributes=attributes)
                        span.end()
                        expected.append((tracer, name, attributes, [], "UNSET"))
            evented = tracers[0].start_span("chatqna.embed")
            evented.add_event("first_token", {"elapsed_ms": 1.5})
            evented.end()
            expected.append((tracers[0], "chatqna.embed", {}, ["first_token"], "UNSET"))
            failed = tracers[0].start_span("chatqna.embed", attributes={"k": 1})
            failed.set_status(Status(StatusCode.ERROR, "broken"))
            failed.end()
            expected.append((tracers[0], "chatqna.embed", {"k": 1}, [], "ERROR"))
    made = [s for s in store.get_finished_spans() if s.name != "root"]
    encoder = SpanEncoder(RESOURCE)
    groups = decode(encoder.request_of([encoder.scope_spans(s) for s in made]))
    arrived = [
        (group.scope.version, span)
        for group in groups.resource_spans[0].scope_spans
        for span in group.spans
    ]
    assert len(arrived) == len(expected) == len(made)
    for (version, proto), span, (tracer, name, attributes, events, status) in zip(
        arrived, made, expected, strict=True
    ):
        assert version == tracer._scope.version
        assert proto.name == name
        assert proto.span_id == span.context.span_id.to_bytes(8, "big")
        assert proto.parent_span_id == root.get_span_context().span_id.to_bytes(8, "big")
        decoded = {
            a.key: (a.value.WhichOneof("value"), value_of(a.value)) for a in proto.attributes
        }
        assert decoded == {
            key: ({bool: "bool_value", int: "int_value", str: "string_value"}[type(v)], v)
            for key, v in attributes.items()
        }
        assert [event.name for event in proto.events] == events
        assert ProtoStatus.StatusCode.Name(proto.status.code) == f"STATUS_CODE_{status}"


def test_a_value_otlp_cannot_carry_is_left_out() -> None:
    store = InMemorySpans()
    span = ServiceTracerProvider(store).get_tracer("t").start_span("s")
    span.set_attribute("kept", "yes")
    span.set_attribute("odd", {"a": 1})  # type: ignore[arg-type]
    span.end()
    (proto,) = decode(encode_request(RESOURCE, [span])).resource_spans[0].scope_spans[0].spans
    assert [a.key for a in proto.attributes] == ["kept"]


def test_the_cache_tells_bools_from_ints_and_stays_bounded() -> None:
    cache = AttributeCache(b"\x4a", limit=4)
    assert cache.field("x", True) != cache.field("x", 1)
    for n in range(20):
        cache.field("n", n)
    assert cache._size <= 4
    assert cache.field("n", 19) == cache.field("n", 19)


@pytest.mark.parametrize("batches", [1, 3])
def test_one_encoder_encodes_batch_after_batch_the_same(batches: int) -> None:
    spans = recorded()
    encoder = SpanEncoder(RESOURCE)
    first = encoder.request(spans)
    for _ in range(batches):
        assert encoder.request(spans) == first
    assert decode(first).resource_spans[0].scope_spans


def test_an_int_beyond_int64_goes_as_its_digits() -> None:
    store = InMemorySpans()
    span = ServiceTracerProvider(store).get_tracer("t").start_span("s")
    span.set_attribute("big", 1 << 70)
    span.set_attribute("small", -(1 << 63))
    span.end()
    (proto,) = decode(encode_request(RESOURCE, [span])).resource_spans[0].scope_spans[0].spans
    values = {a.key: value_of(a.value) for a in proto.attributes}
    assert values == {"big": str(1 << 70), "small": -(1 << 63)}


def test_attribute_sets_equal_in_value_but_not_in_type_keep_their_own_encodings() -> None:
    # `{"x": 1}`, `{"x": True}` and `{"x": 1.0}` are equal dicts; the set cache must not
    # hand one's bytes to another.
    store = InMemorySpans()
    tracer = ServiceTracerProvider(store).get_tracer("t")
    values: list[object] = [1, True, 1.0, 1, True, ("a",), ["a"]]
    for value in values:
        span = tracer.start_span("s")
        span.attributes["x"] = value  # as set directly, lists included
        span.end()
    encoder = SpanEncoder(RESOURCE)
    decoded = []
    for span in store.get_finished_spans():
        (proto,) = decode(encoder.request([span])).resource_spans[0].scope_spans[0].spans
        (attribute,) = proto.attributes
        decoded.append((attribute.value.WhichOneof("value"), value_of(attribute.value)))
    assert decoded == [
        ("int_value", 1),
        ("bool_value", True),
        ("double_value", 1.0),
        ("int_value", 1),
        ("bool_value", True),
        ("array_value", ["a"]),
        ("array_value", ["a"]),
    ]


def test_sets_json_writes_alike_keep_their_own_encodings() -> None:
    # JSON writes None, NaN and the infinities all as null: the set cache, keyed by JSON
    # text, must not hand one's bytes to another.
    store = InMemorySpans()
    tracer = ServiceTracerProvider(store).get_tracer("t")
    values: list[object] = [None, float("nan"), None, float("inf"), float("-inf")]
    for value in values:
        span = tracer.start_span("s")
        span.attributes["x"] = value  # type: ignore[assignment]
        span.attributes["y"] = "null"
        span.end()
    encoder = SpanEncoder(RESOURCE)
    decoded = []
    for span in store.get_finished_spans():
        (proto,) = decode(encoder.request([span])).resource_spans[0].scope_spans[0].spans
        decoded.append({a.key: value_of(a.value) for a in proto.attributes})
    assert [sorted(d) for d in decoded] == [["y"], ["x", "y"], ["y"], ["x", "y"], ["x", "y"]]
    assert math.isnan(decoded[1]["x"])
    assert decoded[3]["x"] == math.inf and decoded[4]["x"] == -math.inf


def test_a_list_attribute_is_kept_as_a_tuple() -> None:
    span = ServiceTracerProvider(InMemorySpans()).get_tracer("t").start_span("s")
    span.set_attribute("ids", ["a", "b"])
    assert span.attributes["ids"] == ("a", "b")  # type: ignore[union-attr]


def test_events_on_a_span_of_a_kept_shape_carry_their_times_names_and_attributes() -> None:
    store = InMemorySpans()
    tracer = ServiceTracerProvider(store).get_tracer("chatqna")
    root = tracer.start_span("root")
    made = []
    with trace.use_span(root):
        for turn in range(3):  # the shape is kept after the first
            span = tracer.start_span(
                "chatqna.generate", attributes={"gen_ai.operation.name": "chat"}
            )
            span.add_event("chatqna.first_token", {"elapsed_ms": 12.5 + turn}, timestamp=10 + turn)
            if turn:
                span.add_event("chatqna.done", timestamp=20 + turn)
            span.end(end_time=100 + turn)
            made.append(span)
    encoder = SpanEncoder(RESOURCE)
    groups = decode(encoder.request_of([encoder.scope_spans(s) for s in made]))
    arrived = [span for group in groups.resource_spans[0].scope_spans for span in group.spans]
    assert len(arrived) == len(made)
    for proto, span in zip(arrived, made, strict=True):
        assert proto.span_id == span.context.span_id.to_bytes(8, "big")
        assert proto.parent_span_id == root.get_span_context().span_id.to_bytes(8, "big")
        assert proto.end_time_unix_nano == span.end_time
        assert {a.key: value_of(a.value) for a in proto.attributes} == {
            "gen_ai.operation.name": "chat"
        }
        assert [
            (e.name, e.time_unix_nano, {a.key: value_of(a.value) for a in e.attributes})
            for e in proto.events
        ] == [(e.name, e.timestamp, dict(e.attributes)) for e in span.events]
