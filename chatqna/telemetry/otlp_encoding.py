"""Ended spans as an OTLP `ExportTraceServiceRequest`, in protobuf's wire format.

The OTLP/HTTP exporter of the SDK builds one protobuf message object per span, attribute
and value, then serializes them: about 47 µs a span here. The messages a trace exporter
sends are few and fixed (opentelemetry-proto's `trace/v1/trace.proto`, `common/v1`,
`resource/v1`), so this module writes their bytes directly: field tags, lengths and values.
An attribute's key and value are encoded once and kept (most repeat on every turn: the
method, the route, the addresses, the span names), in a bounded cache cleared when full.
`tests/unit/telemetry/test_otlp_encoding.py` decodes the output with opentelemetry-proto's
own classes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson
from opentelemetry.trace import StatusCode
from opentelemetry.trace.span import DEFAULT_TRACE_STATE

from chatqna.telemetry.spans import UNSET, Event, RecordedSpan, Scope

CACHE_LIMIT = 8192
# Whole attribute sets kept encoded (most spans of a kind repeat theirs turn after turn).
ATTRIBUTE_SET_LIMIT = 4096
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
# Span.flags: the parent's is-remote bit is known (0x100) and set (0x200).
FLAG_HAS_IS_REMOTE = 0x100
FLAG_IS_REMOTE = 0x200
_REMOTE_PARENT = FLAG_HAS_IS_REMOTE | FLAG_IS_REMOTE
STATUS_CODES = {StatusCode.UNSET: 0, StatusCode.OK: 1, StatusCode.ERROR: 2}

_FIXED64 = struct.Struct("<Q")
_DOUBLE = struct.Struct("<d")
# Span fields 1, 2 and 4 (trace id, span id, parent span id: big-endian bytes).
# A field's tag and length go as one 16-bit value: fewer values to convert per span.
_IDS = struct.Struct(">HQQHQ")
_PARENT = struct.Struct(">HQ")
_IDS_PARENT = struct.Struct(">HQQHQHQ")
_TRACE_ID_TAG, _SPAN_ID_TAG, _PARENT_ID_TAG = 0x0A10, 0x1208, 0x2208
# Span fields 6-8 (kind, start, end) and 16 (flags, fixed32).
_KIND_TIMES_FLAGS = struct.Struct("<HBQBQHI")
# Span.kind (6) with its value, by the API's SpanKind value (OTLP's kinds start at 1).
_KIND_FIELDS = tuple(0x30 | (value + 1) << 8 for value in range(5))
_FLAGS_TAG = 0x0185  # field 16, fixed32, as little-endian bytes 0x85 0x01
_KIND_TIMES_FLAGS_SIZE = _KIND_TIMES_FLAGS.size
_IDS_PARENT_SIZE = _IDS_PARENT.size
_LOW64 = (1 << 64) - 1


def varint(value: int) -> bytes:
    """An unsigned protobuf varint; negative ints as their 64-bit two's complement."""
    if value < 0:
        value += 1 << 64
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# The varints of the lengths most fields have, looked up instead of computed.
_SHORT_VARINTS = tuple(varint(n) for n in range(1 << 14))


def length_delimited(tag: bytes, payload: bytes) -> bytes:
    size = len(payload)
    return tag + (_SHORT_VARINTS[size] if size < 16384 else varint(size)) + payload


def string_field(tag: bytes, text: str) -> bytes:
    return length_delimited(tag, text.encode("utf-8", "surrogatepass"))


def any_value(value: Any) -> bytes | None:
    """An `AnyValue` message (without its own tag), or None for a type OTLP has no slot for."""
    if isinstance(value, str):
        return string_field(b"\x0a", value)
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        if INT64_MIN <= value <= INT64_MAX:
            return b"\x18" + varint(value)
        return string_field(b"\x0a", str(value))  # beyond int64: its digits
    if isinstance(value, float):
        return b"\x21" + _DOUBLE.pack(value)
    if isinstance(value, bytes):
        return length_delimited(b"\x3a", value)
    if isinstance(value, Sequence):
        items = []
        for item in value:
            encoded = any_value(item)
            if encoded is not None:
                items.append(length_delimited(b"\x0a", encoded))
        return length_delimited(b"\x2a", b"".join(items))
    return None


def key_value(key: str, value: Any) -> bytes:
    """A `KeyValue` message (without its own tag); b"" for a value OTLP cannot carry."""
    encoded = any_value(value)
    if encoded is None:
        return b""
    return string_field(b"\x0a", key) + length_delimited(b"\x12", encoded)


class AttributeCache:
    """Encoded `KeyValue` fields (tag included) by value type, key and value: three dict
    lookups and no allocation when the attribute was seen before."""

    def __init__(self, tag: bytes, limit: int = CACHE_LIMIT) -> None:
        self._tag = tag
        self._limit = limit
        self._size = 0
        self._by_type: dict[type, dict[str, dict[Any, bytes]]] = {}
        self._double_prefixes: dict[str, bytes] = {}

    def field(self, key: str, value: Any) -> bytes:
        kind = type(value)
        if kind is float:  # mostly unique (latencies, scores): only the key is kept
            prefix = self._double_prefixes.get(key)
            if prefix is None:
                if len(self._double_prefixes) >= self._limit:
                    self._double_prefixes.clear()
                prefix = self._double_prefixes[key] = self._encode(key, 0.0)[:-8]
            return prefix + _DOUBLE.pack(value)
        if kind is list:
            value = tuple(value)
            kind = tuple
        by_key = self._by_type.get(kind)
        if by_key is None:
            by_key = self._by_type[kind] = {}
        by_value = by_key.get(key)
        if by_value is None:
            by_value = by_key[key] = {}
        try:
            return by_value[value]
        except KeyError:
            pass
        except TypeError:  # an unhashable value: encoded every time
            return self._encode(key, value)
        encoded = self._encode(key, value)
        if self._size >= self._limit:
            self._by_type.clear()
            self._size = 0
            by_value = self._by_type.setdefault(kind, {}).setdefault(key, {})
        by_value[value] = encoded
        self._size += 1
        return encoded

    def _encode(self, key: str, value: Any) -> bytes:
        kv = key_value(key, value)
        return length_delimited(self._tag, kv) if kv else b""


class SpanEncoder:
    """Encodes batches of ended spans for one resource."""

    def __init__(self, resource_attributes: Mapping[str, Any]) -> None:
        self._span_attributes = AttributeCache(b"\x4a")  # Span.attributes = 9
        self._event_attributes = AttributeCache(b"\x1a")  # Event.attributes = 3
        self._attribute_sets: dict[bytes, bytes] = {}
        self._names: dict[str, bytes] = {}
        self._event_names: dict[str, bytes] = {}
        self._shapes: dict[tuple[Scope, str, bytes], tuple[bytes, bytes]] = {}
        self._root_shapes: dict[tuple[Scope, str, bytes], tuple[bytes, bytes]] = {}  # no parent
        self._scopes: dict[Scope, bytes] = {}
        resource = b"".join(
            length_delimited(b"\x0a", key_value(k, v)) for k, v in resource_attributes.items()
        )
        self._resource = length_delimited(b"\x0a", resource)  # ResourceSpans.resource = 1

    def request(self, spans: Iterable[RecordedSpan]) -> bytes:
        """An `ExportTraceServiceRequest` holding `spans`."""
        return self.request_of([self.scope_spans(span) for span in spans])

    def request_of(self, scope_spans: Sequence[bytes]) -> bytes:
        """The request for spans encoded one by one (`scope_spans(...)`): one join."""
        total = len(self._resource) + sum(map(len, scope_spans))
        # ExportTraceServiceRequest.resource_spans = 1
        return b"".join([b"\x0a", varint(total), self._resource, *scope_spans])

    def _scope(self, scope: Scope) -> bytes:
        encoded = self._scopes.get(scope)
        if encoded is None:
            body = string_field(b"\x0a", scope.name)
            if scope.version:
                body += string_field(b"\x12", scope.version)
            encoded = self._scopes[scope] = length_delimited(b"\x0a", body)
        return encoded

    def _name(self, name: str) -> bytes:
        encoded = self._names.get(name)
        if encoded is None:
            if len(self._names) >= CACHE_LIMIT:
                self._names.clear()
            encoded = self._names[name] = string_field(b"\x2a", name)
        return encoded

    def span(self, span: RecordedSpan) -> bytes:
        """One `Span`, tagged as a field of `ScopeSpans` (spans = 2)."""
        field = self.scope_spans(span)
        at = 1  # past the tag, then past the length's varint and the scope field
        while field[at] & 0x80:
            at += 1
        return field[at + 1 + len(self._scope(span.instrumentation_scope)) :]

    def scope_spans(self, span: RecordedSpan) -> bytes:
        """A `ScopeSpans` field of `ResourceSpans` (scope_spans = 2) holding `span` and its
        scope: what the exporter queues as the span ends, so that a batch is one join with
        no grouping (a request may hold many `ScopeSpans` of one scope). The span's fields
        are written in the order that packs best, which protobuf readers accept: the ids,
        then kind, times and flags in one pack, the name, the attributes, events and
        status.

        Most spans repeat a shape turn after turn: the same scope, name and attribute set
        (keyed by its JSON text, see `_attribute_set`), no trace state or status.
        Everything of such a span but its ids, kind, times and flags is kept encoded,
        lengths included (roots, with no parent id, apart), so it is two packs and one
        join; a child's events are encoded apart and its lengths written around them."""
        # A SpanContext is a tuple: (trace id, span id, remote, flags, state, valid).
        trace_id, span_id, _, trace_flags, trace_state, _ = span.context
        parent = span.parent
        attributes = span.attributes
        if trace_state is DEFAULT_TRACE_STATE and span.status is UNSET:
            try:
                key = orjson.dumps(attributes) if attributes else b""
            except TypeError:  # orjson's JSONEncodeError: bytes, big ints, surrogates
                return self._any_scope_spans(span)
            start = span.start_time
            events = span.events
            if parent is None:  # a root: the request's server span, mostly
                if events:
                    return self._any_scope_spans(span)
                head, tail = self._root_shapes.get(
                    (span.instrumentation_scope, span.name, key)
                ) or self._shape(span, key)
                return b"".join(
                    (
                        head,
                        _IDS.pack(
                            _TRACE_ID_TAG, trace_id >> 64, trace_id & _LOW64, _SPAN_ID_TAG,
                            span_id,
                        ),
                        _KIND_TIMES_FLAGS.pack(
                            _KIND_FIELDS[span.kind._value_], 0x39, start, 0x41,
                            span.end_time or start, _FLAGS_TAG, trace_flags | FLAG_HAS_IS_REMOTE,
                        ),
                        tail,
                    )
                )  # fmt: skip
            head, tail = self._shapes.get(
                (span.instrumentation_scope, span.name, key)
            ) or self._shape(span, key)
            ids = _IDS_PARENT.pack(
                _TRACE_ID_TAG, trace_id >> 64, trace_id & _LOW64, _SPAN_ID_TAG, span_id,
                _PARENT_ID_TAG, parent[1],
            )  # fmt: skip
            kind_times_flags = _KIND_TIMES_FLAGS.pack(
                _KIND_FIELDS[span.kind._value_], 0x39, start, 0x41, span.end_time or start,
                _FLAGS_TAG, trace_flags | (_REMOTE_PARENT if parent[2] else FLAG_HAS_IS_REMOTE),
            )  # fmt: skip
            if not events:
                return b"".join((head, ids, kind_times_flags, tail))
            # Events (`chatqna.first_token`) change the lengths the kept head holds: the
            # span's tags and lengths are written here, around the kept name and attributes.
            encoded = self._events(events)
            size = _IDS_PARENT_SIZE + _KIND_TIMES_FLAGS_SIZE + len(tail) + len(encoded)
            size_varint = _SHORT_VARINTS[size] if size < 16384 else varint(size)
            scope = self._scopes.get(span.instrumentation_scope) or self._scope(
                span.instrumentation_scope
            )
            outer = len(scope) + 1 + len(size_varint) + size
            return b"".join(
                (
                    b"\x12",
                    _SHORT_VARINTS[outer] if outer < 16384 else varint(outer),
                    scope,
                    b"\x12",  # ScopeSpans.spans = 2
                    size_varint,
                    ids,
                    kind_times_flags,
                    tail,
                    encoded,
                )
            )
        return self._any_scope_spans(span)

    def _shape(self, span: RecordedSpan, key: bytes) -> tuple[bytes, bytes]:
        """The kept bytes of a span's shape (see `scope_spans`): what goes before its ids
        (the tags and lengths, the scope) and after its kind, times and flags (the name and
        attributes). Not kept for a set JSON cannot tell apart (`null`)."""
        attributes = (
            (self._attribute_sets.get(key) or self._attribute_set(key, span.attributes))
            if key
            else b""
        )
        tail = self._name(span.name) + attributes
        root = span.parent is None
        size = (_IDS if root else _IDS_PARENT).size + _KIND_TIMES_FLAGS_SIZE + len(tail)
        size_varint = varint(size)
        scope = self._scope(span.instrumentation_scope)
        outer = len(scope) + 1 + len(size_varint) + size
        shape = (b"\x12" + varint(outer) + scope + b"\x12" + size_varint, tail)
        if b"null" not in key:
            shapes = self._root_shapes if root else self._shapes
            if len(shapes) >= CACHE_LIMIT:
                shapes.clear()
            shapes[(span.instrumentation_scope, span.name, key)] = shape
        return shape

    def _any_scope_spans(self, span: RecordedSpan) -> bytes:
        """`scope_spans` for any span: a root, one with trace state, events or a status."""
        trace_id, span_id, _, trace_flags, trace_state, _ = span.context
        parent = span.parent
        if parent is not None and trace_state is DEFAULT_TRACE_STATE:  # the usual span
            ids = _IDS_PARENT.pack(
                _TRACE_ID_TAG, trace_id >> 64, trace_id & _LOW64, _SPAN_ID_TAG, span_id,
                _PARENT_ID_TAG, parent[1],
            )  # fmt: skip
            flags = trace_flags | (_REMOTE_PARENT if parent[2] else FLAG_HAS_IS_REMOTE)
        else:
            ids, flags = self._ids_and_flags(span)
        start = span.start_time
        # `_value_` skips Enum's property.
        kind_times_flags = _KIND_TIMES_FLAGS.pack(
            _KIND_FIELDS[span.kind._value_], 0x39, start, 0x41, span.end_time or start,
            _FLAGS_TAG, flags,
        )  # fmt: skip
        name = self._names.get(span.name) or self._name(span.name)
        attributes = span.attributes
        if attributes:
            # A set seen before is one lookup by its JSON text (see `_attribute_set`).
            try:
                key = orjson.dumps(attributes)
            except TypeError:  # orjson's JSONEncodeError: bytes, big ints, surrogates
                encoded = self._each_attribute(attributes)
            else:
                encoded = self._attribute_sets.get(key) or self._attribute_set(key, attributes)
        else:
            encoded = b""
        if span.events or span.status is not UNSET:
            encoded += self._events_and_status(span)
        size = len(ids) + _KIND_TIMES_FLAGS_SIZE + len(name) + len(encoded)
        size_varint = _SHORT_VARINTS[size] if size < 16384 else varint(size)
        scope = self._scopes.get(span.instrumentation_scope) or self._scope(
            span.instrumentation_scope
        )
        outer = len(scope) + 1 + len(size_varint) + size
        return b"".join(
            (
                b"\x12",
                _SHORT_VARINTS[outer] if outer < 16384 else varint(outer),
                scope,
                b"\x12",  # ScopeSpans.spans = 2
                size_varint,
                ids,
                kind_times_flags,
                name,
                encoded,
            )
        )

    @staticmethod
    def _ids_and_flags(span: RecordedSpan) -> tuple[bytes, int]:
        """The ids (with the trace state) and flags of a root span, or of one with state."""
        trace_id, span_id, _, trace_flags, trace_state, _ = span.context
        ids = _IDS.pack(_TRACE_ID_TAG, trace_id >> 64, trace_id & _LOW64, _SPAN_ID_TAG, span_id)
        if trace_state is not DEFAULT_TRACE_STATE and trace_state:
            ids += string_field(b"\x1a", trace_state.to_header())
        parent = span.parent
        if parent is None:
            return ids, trace_flags | FLAG_HAS_IS_REMOTE
        ids += _PARENT.pack(_PARENT_ID_TAG, parent[1])
        return ids, trace_flags | (_REMOTE_PARENT if parent[2] else FLAG_HAS_IS_REMOTE)

    def _events_and_status(self, span: RecordedSpan) -> bytes:
        parts = [self._events(span.events)] if span.events else []
        status = span.status
        if status.status_code is not StatusCode.UNSET:
            body = b""
            if status.description:
                body = string_field(b"\x12", status.description)
            body += b"\x18" + bytes((STATUS_CODES[status.status_code],))
            parts.append(length_delimited(b"\x7a", body))
        return b"".join(parts)

    def _attribute_set(self, key: bytes, attributes: Mapping[str, Any]) -> bytes:
        """A span's attribute fields, encoded one by one and kept by the set's JSON text
        (orjson, in C): the same keys, values and value types, in order (`true`, `1` and
        `1.0` differ as their encodings do). A set JSON cannot tell apart (a non-finite
        float and None are both `null`) is not kept; one JSON cannot write (bytes, an int
        beyond 64 bits) never gets here."""
        encoded = self._each_attribute(attributes)
        if b"null" not in key:
            if len(self._attribute_sets) >= ATTRIBUTE_SET_LIMIT:
                self._attribute_sets.clear()
            self._attribute_sets[key] = encoded
        return encoded

    def _each_attribute(self, attributes: Mapping[str, Any]) -> bytes:
        field = self._span_attributes.field
        return b"".join([field(key, value) for key, value in attributes.items()])

    def _events(self, events: Sequence[Event]) -> bytes:
        """A span's `events` fields (Span.events = 11), each with its timestamp, name and
        attributes (a name is encoded once and kept)."""
        field = self._event_attributes.field
        names = self._event_names
        parts = []
        for name, timestamp, attributes in events:
            body = b"".join(
                [
                    b"\x09",
                    _FIXED64.pack(timestamp),
                    names.get(name) or self._event_name(name),
                    *[field(key, value) for key, value in attributes.items()],
                ]
            )
            size = len(body)
            parts.append(b"\x5a" + (_SHORT_VARINTS[size] if size < 16384 else varint(size)))
            parts.append(body)
        return b"".join(parts)

    def _event_name(self, name: str) -> bytes:
        if len(self._event_names) >= CACHE_LIMIT:
            self._event_names.clear()
        encoded = self._event_names[name] = string_field(b"\x12", name)
        return encoded


def encode_request(resource_attributes: Mapping[str, Any], spans: Sequence[RecordedSpan]) -> bytes:
    """One-off encoding (tests, the console): a fresh encoder for `spans`."""
    return SpanEncoder(resource_attributes).request(spans)
