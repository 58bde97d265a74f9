"""The service's span recorder: OpenTelemetry's tracing API, recorded at a few µs a span.

`ServiceTracerProvider` implements the API's `TracerProvider`, so `trace.get_current_span`,
`use_span`, the W3C propagator and every library written against the API work unchanged.
What it leaves out of the SDK's span machinery is what the service never uses: span
processors chained per span, attribute validation and limits on every `set_attribute`,
locks per span, links. A recorded span is a plain object with an attribute dict; ending it
hands it to the provider's sink (a batch exporter, or a list in tests) with one call.
Measured apart (`tests/rag-benchmarks/span_cost.py`), that is about a tenth of the SDK's
cost per span.

Sampling follows the six `OTEL_TRACES_SAMPLER` choices with the specification's rules:
`traceidratio` compares the low 64 bits of the trace id with the ratio, as the SDK does, and
the parent-based ones follow a valid parent's sampled flag. A span the sampler drops is a
`DroppedSpan` (a `NonRecordingSpan`) with a fresh span id, so `traceparent` still goes
upstream with the sampled flag unset. Under a dropped span no child span is made: the
dropped span stands in for it (with every sampler offered the child would have been dropped
too; `always_on` drops nothing). Nine traces in ten take that path at a 10% ratio, so it is
kept short: a stage's span under a `DroppedSpan` is one type check, and the span keeps its
`traceparent` for every upstream call below it.
"""

from __future__ import annotations

import random
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from types import MappingProxyType, MethodType
from typing import Any, NamedTuple, Protocol

from opentelemetry import context as context_api
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext
from opentelemetry.trace import (
    INVALID_SPAN,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)
from opentelemetry.trace.propagation import _SPAN_KEY
from opentelemetry.trace.span import DEFAULT_TRACE_STATE, TraceState
from opentelemetry.util.types import AttributeValue

SAMPLED = TraceFlags(TraceFlags.SAMPLED)
NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)
UNSET = Status(StatusCode.UNSET)
TRACE_ID_LOW_BITS = (1 << 64) - 1
_new_tuple = tuple.__new__
_new_object = object.__new__
_getrandbits = random.getrandbits
_time_ns = time.time_ns
_NOT_CURRENT = object()  # the token of a span that `with` does not make current
SAMPLER_NAMES = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)


class Scope(NamedTuple):
    """The instrumentation scope of a tracer (`chatqna`, `chatqna.http`): a tuple of two
    strings (`""` for no version), so the exporter sorts and groups a batch's spans by it
    without a Python call per span."""

    name: str
    version: str = ""


class Event(NamedTuple):
    """A span event (`exception`, `chatqna.first_token`): a tuple, made in C (a frozen
    dataclass sets each field through `object.__setattr__`)."""

    name: str
    timestamp: int
    attributes: Mapping[str, AttributeValue] = MappingProxyType({})


class SpanSink(Protocol):
    """Where ended spans go: called once per span, on the thread that ended it."""

    def __call__(self, span: RecordedSpan) -> None: ...


# The API keeps the current context in one ContextVar (unless OTEL_PYTHON_CONTEXT names
# another runtime context); reading and setting it directly skips four layers of calls.
_runtime_context = getattr(context_api, "_RUNTIME_CONTEXT", None)
_CONTEXT_VAR = (
    _runtime_context._current_context
    if isinstance(_runtime_context, ContextVarsRuntimeContext)
    else None
)


def current_span() -> trace.Span:
    """`trace.get_current_span()`, read straight from the API's context variable."""
    if _CONTEXT_VAR is None:
        return trace.get_current_span()
    span = _CONTEXT_VAR.get().get(_SPAN_KEY)
    return INVALID_SPAN if span is None else span  # type: ignore[return-value]


def attach_span(span: trace.Span, context: Context | None = None) -> object:
    """`context.attach(trace.set_span_in_context(span, context))`: the current context (or
    `context`) with `span` in it becomes current; returns the token for `detach`."""
    if _CONTEXT_VAR is None:
        return context_api.attach(trace.set_span_in_context(span, context))
    values = Context(_CONTEXT_VAR.get() if context is None else context)
    dict.__setitem__(values, _SPAN_KEY, span)  # a Context refuses item assignment
    return _CONTEXT_VAR.set(values)


def detach(token: Any) -> None:
    """Undo `attach_span`; a failure is the API's to report (it logs it)."""
    if _CONTEXT_VAR is None:
        context_api.detach(token)
        return
    try:
        _CONTEXT_VAR.reset(token)
    except Exception:  # a token of another context: let the API log it, as it would
        context_api.detach(token)


def local_context(
    trace_id: int, span_id: int, flags: TraceFlags, trace_state: TraceState
) -> SpanContext:
    """`SpanContext(trace_id, span_id, False, flags, trace_state)` for ids drawn here (non-zero
    and in range, so valid), without the API constructor's checks: the same tuple."""
    return _new_tuple(SpanContext, (trace_id, span_id, False, flags, trace_state, True))


class DroppedSpan(NonRecordingSpan):
    """The span of a trace the sampler dropped here: it stands in for every span below it,
    and keeps what each of them would otherwise rebuild: a context manager that leaves it
    current (it already is), and the W3C headers every upstream call carries."""

    def __init__(self, context: SpanContext) -> None:
        super().__init__(context)
        self.context = context
        self.entered = nullcontext(self)
        self._headers: dict[str, str] | None = None

    def trace_headers(self) -> dict[str, str]:
        """`traceparent` (and `tracestate`), as the API's propagator writes them."""
        headers = self._headers
        if headers is None:
            headers = self._headers = {}
            write_trace_context(headers, self.context)
        return headers


# The 32 hex digits of a trace id, kept per trace: a request writes them several times
# (`traceparent` on each upstream call, `X-Trace-Id`, the metadata event). Bounded.
TRACE_HEX_LIMIT = 1024
_trace_hex: dict[int, str] = {}
_FLAGS_HEX = tuple(f"{flags:02x}" for flags in range(256))


def trace_hex(trace_id: int) -> str:
    """`format(trace_id, "032x")`, formatted once per trace."""
    text = _trace_hex.get(trace_id)
    if text is None:
        if len(_trace_hex) >= TRACE_HEX_LIMIT:
            _trace_hex.clear()
        text = _trace_hex[trace_id] = format(trace_id, "032x")
    return text


def write_trace_context(headers: dict[str, str], context: SpanContext) -> None:
    """W3C `traceparent` (and `tracestate`) for `context`, as the API's propagator writes
    them, without its carrier and getter layers (this runs on every upstream call)."""
    trace_id, span_id, _, flags, trace_state, valid = context
    if not valid:
        return
    headers["traceparent"] = f"00-{trace_hex(trace_id)}-{span_id:016x}-{_FLAGS_HEX[flags & 0xFF]}"
    if trace_state is not DEFAULT_TRACE_STATE and trace_state:
        headers["tracestate"] = trace_state.to_header()


class Sampler:
    """The decision of one `OTEL_TRACES_SAMPLER` (with its ratio) for a new span."""

    def __init__(self, name: str, ratio: float = 1.0) -> None:
        if name not in SAMPLER_NAMES:
            raise ValueError(f"unknown sampler {name!r}")
        self.name = name
        self.parent_based = name.startswith("parentbased_")
        root = name.removeprefix("parentbased_")
        # The SDK's bound: a trace is sampled when its low 64 bits fall below it.
        self._bound = {
            "always_on": 1 << 64,
            "always_off": 0,
            "traceidratio": round(ratio * (1 << 64)),
        }[root]

    def sampled(self, parent: SpanContext | None, trace_id: int) -> bool:
        if self.parent_based and parent is not None:
            return bool(parent[3] & SAMPLED)  # the parent's trace flags
        return trace_id & TRACE_ID_LOW_BITS < self._bound


class RecordedSpan(trace.Span):
    """A span being recorded, and once ended the finished record the sink keeps.

    Its fields read like the SDK's `ReadableSpan` (`name`, `context`, `parent`, `kind`,
    `attributes`, `events`, `status`, `start_time`, `end_time`, `resource`,
    `instrumentation_scope`). Changes after `end` are ignored, as the SDK ignores them.
    """

    __slots__ = (
        "_provider",
        "_token",
        "attributes",
        "context",
        "end_time",
        "events",
        "instrumentation_scope",
        "kind",
        "name",
        "parent",
        "start_time",
        "status",
    )

    def __init__(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        kind: SpanKind,
        scope: Scope,
        provider: ServiceTracerProvider,
        attributes: Mapping[str, AttributeValue] | None = None,
        start_time: int | None = None,
    ) -> None:
        self.name = name
        self.context = context
        self.parent = parent
        self.kind = kind
        self.attributes: dict[str, AttributeValue] = dict(attributes) if attributes else {}
        self.events: tuple[Event, ...] = ()  # a tuple, as the SDK's: no list for most spans
        self.status = UNSET
        self.start_time = start_time or time.time_ns()
        self.end_time: int | None = None
        self.instrumentation_scope = scope
        self._provider = provider  # its resource, and its sink for the ended span
        self._token: Any = _NOT_CURRENT

    @property
    def resource(self) -> Any:
        return self._provider.resource

    def get_span_context(self) -> SpanContext:
        return self.context

    def is_recording(self) -> bool:
        return self.end_time is None

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        if self.end_time is None:
            # A list is kept as a tuple, as the SDK keeps it: immutable, and hashable for the
            # encoder's cache.
            self.attributes[key] = tuple(value) if type(value) is list else value

    def set_attributes(self, attributes: Mapping[str, AttributeValue]) -> None:
        if self.end_time is None:
            self.attributes.update(attributes)

    def add_event(
        self,
        name: str,
        attributes: Mapping[str, AttributeValue] | None = None,
        timestamp: int | None = None,
    ) -> None:
        if self.end_time is None:
            event = Event(name, timestamp or time.time_ns(), dict(attributes or {}))
            self.events = (*self.events, event)

    def add_link(self, context: SpanContext, attributes: Any = None) -> None:
        return None  # the service makes no links

    def update_name(self, name: str) -> None:
        if self.end_time is None:
            self.name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        # An OK status is final, as in the SDK; a description goes with ERROR only.
        if self.end_time is not None or self.status.status_code is StatusCode.OK:
            return
        if isinstance(status, StatusCode):
            status = Status(status, description)
        self.status = status

    def record_exception(
        self,
        exception: BaseException,
        attributes: Mapping[str, AttributeValue] | None = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        kind = type(exception)
        module = kind.__module__
        values: dict[str, AttributeValue] = {
            "exception.type": f"{module}.{kind.__qualname__}"
            if module and module != "builtins"
            else kind.__qualname__,
            "exception.message": str(exception),
            "exception.stacktrace": "".join(traceback.format_exception(exception)),
            "exception.escaped": str(escaped),
        }
        values.update(attributes or {})
        self.add_event("exception", values, timestamp)

    def end(self, end_time: int | None = None) -> None:
        if self.end_time is not None:
            return
        self.end_time = end_time or time.time_ns()
        self._provider.span_ended(self)

    def __enter__(self) -> RecordedSpan:
        # A span of `start_as_current_span` (with the API's defaults) is its own context
        # manager: current for the block. Any other is the API's `with span:` (ended on
        # exit, not made current).
        if self._token is not _NOT_CURRENT:
            if _CONTEXT_VAR is None:
                self._token = attach_span(self)
            else:  # `attach_span`, inlined
                values = Context(_CONTEXT_VAR.get())
                dict.__setitem__(values, _SPAN_KEY, self)
                self._token = _CONTEXT_VAR.set(values)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, traceback_: Any) -> None:
        token = self._token
        if token is not _NOT_CURRENT:
            self._token = _NOT_CURRENT
            if _CONTEXT_VAR is None:
                detach(token)
            else:  # `detach`, inlined
                try:
                    _CONTEXT_VAR.reset(token)
                except Exception:
                    context_api.detach(token)
            if isinstance(exc, Exception) and self.end_time is None:
                self.record_exception(exc)
                self.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        if self.end_time is None:  # `end()`, inlined
            self.end_time = _time_ns()
            self._provider.span_ended(self)

    def __repr__(self) -> str:
        return f"RecordedSpan({self.name!r}, span_id={self.context.span_id:016x})"


class Tracer(trace.Tracer):
    """The tracer of one instrumentation scope."""

    def __init__(self, provider: ServiceTracerProvider, scope: Scope) -> None:
        self._provider = provider
        self._scope = scope
        # A parent-based sampler follows a parent recorded here (so sampled) without a call.
        self._follows_parent = provider.sampler.parent_based

    def start_span(
        self,
        name: str,
        context: Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Mapping[str, AttributeValue] | None = None,
        links: Sequence[trace.Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> trace.Span:
        parent = current_span() if context is None else trace.get_current_span(context)
        if type(parent) is DroppedSpan and kind is not SpanKind.SERVER:
            return parent  # what `_start` decides for it, without the call
        return self._start(name, parent, kind, attributes, start_time)

    def start_span_under(
        self,
        parent: trace.Span,
        name: str,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> trace.Span:
        """`start_span(name, context=set_span_in_context(parent), kind=kind, ...)` for a
        parent at hand, without building a context to read it back from."""
        if type(parent) is DroppedSpan and kind is not SpanKind.SERVER:
            return parent
        return self._start(name, parent, kind, attributes, None)

    def _start(
        self,
        name: str,
        parent_span: trace.Span,
        kind: SpanKind,
        attributes: Mapping[str, AttributeValue] | None,
        start_time: int | None,
    ) -> trace.Span:
        if type(parent_span) is RecordedSpan and self._follows_parent:
            # The usual span: a child of one recorded here. Its trace id and state are the
            # parent's; sampled, as the parent is. Its fields are set here, as `__init__`
            # sets them: calling the class goes through its type's call and `__init__`
            # slot, which costs more than the stores.
            context = parent_span.context
            span = _new_object(RecordedSpan)
            span.name = name
            span.context = _new_tuple(
                SpanContext, (context[0], _getrandbits(64) or 1, False, SAMPLED, context[4], True)
            )
            span.parent = context
            span.kind = kind
            span.attributes = dict(attributes) if attributes else {}
            span.events = ()
            span.status = UNSET
            span.start_time = start_time or _time_ns()
            span.end_time = None
            span.instrumentation_scope = self._scope
            span._provider = self._provider
            span._token = _NOT_CURRENT
            return span
        parent: SpanContext | None = parent_span.get_span_context()
        provider = self._provider
        # A SpanContext is a tuple: one unpacking instead of a property call per field.
        sampler = provider.sampler
        if parent is not None and parent[5]:  # (trace id, span id, remote, flags, state, valid)
            trace_id, _, _, flags, trace_state, _ = parent
            if not flags & SAMPLED:
                if kind is not SpanKind.SERVER:
                    return parent_span  # a dropped trace: no child span
                sampled = sampler.sampled(parent, trace_id)
            else:  # a parent-based sampler follows a sampled parent without asking
                sampled = sampler.parent_based or sampler.sampled(parent, trace_id)
        else:
            parent = None
            trace_id = provider.new_trace_id()
            trace_state = DEFAULT_TRACE_STATE
            sampled = sampler.sampled(None, trace_id)
        span_id = _getrandbits(64) or 1
        if not sampled:
            return DroppedSpan(local_context(trace_id, span_id, NOT_SAMPLED, trace_state))
        return RecordedSpan(
            name,
            _new_tuple(SpanContext, (trace_id, span_id, False, SAMPLED, trace_state, True)),
            parent,
            kind,
            self._scope,
            provider,
            attributes,
            start_time,
        )

    def start_as_current_span(  # type: ignore[override]
        self,
        name: str,
        context: Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Mapping[str, AttributeValue] | None = None,
        links: Sequence[trace.Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> AbstractContextManager[trace.Span]:
        if context is None:
            # `current_span()`, inlined: this runs for every stage span.
            parent_span: trace.Span = (
                _CONTEXT_VAR.get().get(_SPAN_KEY, INVALID_SPAN)  # type: ignore[assignment]
                if _CONTEXT_VAR is not None
                else trace.get_current_span()
            )
            if type(parent_span) is DroppedSpan and kind is not SpanKind.SERVER:
                return parent_span.entered  # a dropped trace's span, already current
        else:
            parent_span = trace.get_current_span(context)
        span = self._start(name, parent_span, kind, attributes, start_time)
        if (
            type(span) is RecordedSpan
            and record_exception
            and set_status_on_exception
            and end_on_exit
        ):
            span._token = None  # its own context manager: current on entry
            return span
        if span is parent_span and context is None:
            return nullcontext(span)  # a dropped trace's span, already current
        return current(span, record_exception, set_status_on_exception, end_on_exit)


class current:
    """Make `span` current for a block, as the API's `use_span` does: an exception leaving
    the block is recorded on a recording span and sets its status; with `end_on_exit` the
    span ends with the block."""

    __slots__ = ("_end", "_record", "_set_status", "_span", "_token")

    def __init__(
        self,
        span: trace.Span,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = False,
    ) -> None:
        self._span = span
        self._record = record_exception
        self._set_status = set_status_on_exception
        self._end = end_on_exit

    def __enter__(self) -> trace.Span:
        span = self._span
        if _CONTEXT_VAR is None:
            self._token = attach_span(span)
        else:  # `attach_span`, inlined: this runs for every span made current
            values = Context(_CONTEXT_VAR.get())
            dict.__setitem__(values, _SPAN_KEY, span)
            self._token = _CONTEXT_VAR.set(values)
        return span

    def __exit__(self, exc_type: Any, exc: BaseException | None, traceback_: Any) -> None:
        if _CONTEXT_VAR is None:
            detach(self._token)
        else:  # `detach`, inlined
            try:
                _CONTEXT_VAR.reset(self._token)  # type: ignore[arg-type]
            except Exception:
                context_api.detach(self._token)  # type: ignore[arg-type]
        span = self._span
        if isinstance(exc, Exception) and span.is_recording():
            if self._record:
                span.record_exception(exc)
            if self._set_status:
                span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        if self._end:
            span.end()


class ServiceTracerProvider(trace.TracerProvider):
    """The provider: one sampler, one resource, one sink for every ended span."""

    def __init__(
        self,
        sink: SpanSink,
        *,
        sampler: Sampler | None = None,
        resource: Any = None,
        shutdown: Callable[[], None] | None = None,
    ) -> None:
        self.sink = sink
        # What ending a span calls: a sink object's bound `__call__`, since calling the
        # object goes through its type's call slot (about twice a method's overhead).
        call = sink.__call__
        self.span_ended: SpanSink = call if isinstance(call, MethodType) else sink
        self.sampler = sampler or Sampler("parentbased_always_on")
        self.resource = resource
        self._shutdown = shutdown
        self._tracers: dict[Scope, Tracer] = {}

    @staticmethod
    def new_trace_id() -> int:
        return _getrandbits(128) or 1

    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: Any = None,
    ) -> Tracer:
        scope = Scope(instrumenting_module_name, instrumenting_library_version or "")
        tracer = self._tracers.get(scope)
        if tracer is None:
            tracer = self._tracers[scope] = Tracer(self, scope)
        return tracer

    def shutdown(self) -> None:
        """Flush and stop the exporter (at the app's shutdown)."""
        if self._shutdown is not None:
            self._shutdown()


class InMemorySpans:
    """A sink keeping every ended span, for tests (`get_finished_spans`, `clear`)."""

    def __init__(self) -> None:
        self._spans: list[RecordedSpan] = []

    def __call__(self, span: RecordedSpan) -> None:
        self._spans.append(span)

    def get_finished_spans(self) -> tuple[RecordedSpan, ...]:
        return tuple(self._spans)

    def clear(self) -> None:
        self._spans.clear()
