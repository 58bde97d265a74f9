"""Ended spans leave the process in batches, from one thread, off the request path.

`BatchExporter` is the provider's sink: ending a span hands it to the sender's `prepare`
and appends the result to a bounded queue (a full queue drops the span and counts it). A
daemon thread wakes once a schedule delay (`OTEL_BSP_SCHEDULE_DELAY`, ms) or as soon as a
batch is full (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`) and hands each batch to the sender's `send`:

- `OtlpHttpSender`: OTLP/HTTP with protobuf bodies (`otlp_encoding`). Each span is encoded
  as it ends (about 5 µs), so the queue holds bytes, not span objects: the span is freed at
  once, the garbage collector never walks a queue of them, and no export holds the
  interpreter for a whole batch's encoding. Each span is queued as a `ScopeSpans` of its
  own (its scope and itself), so a batch is one join, with no grouping per scope (a request
  may carry many `ScopeSpans` of one scope; receivers read them alike). The batches go
  over one keep-alive connection (`http.client`, TLS for https with
  `OTEL_EXPORTER_OTLP_CERTIFICATE` as the CA), with the headers of
  `OTEL_EXPORTER_OTLP_HEADERS` / `OTEL_EXPORTER_OTLP_TRACES_HEADERS`, gzip when
  `OTEL_EXPORTER_OTLP_COMPRESSION=gzip`, and `OTEL_EXPORTER_OTLP_TIMEOUT` (ms) per batch.
  Answers 429, 502, 503 and 504 and connection failures are retried with a doubling
  backoff within that time; other failures drop the batch. Failures are logged, at most
  once a minute with a count.
- `ConsoleSender`: one JSON line per span on standard output.

At shutdown the queue is drained before the thread stops (within the export timeout).
"""

from __future__ import annotations

import gzip
import http.client
import logging
import os
import ssl
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from itertools import islice
from typing import IO, Any, Protocol
from urllib.parse import urlsplit

import orjson

from chatqna import __version__
from chatqna.telemetry.otlp_encoding import SpanEncoder
from chatqna.telemetry.spans import RecordedSpan

logger = logging.getLogger(__name__)
RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})
FIRST_BACKOFF_SECONDS = 0.5
LOG_EVERY_SECONDS = 60.0
_NEVER = object()  # a sentinel `popleft` never returns


class SpanSender(Protocol):
    """What a `BatchExporter` sends with: `prepare` runs as a span ends (on that thread),
    `send` on the export thread with a batch of what `prepare` returned."""

    def prepare(self, span: RecordedSpan) -> Any: ...

    def send(self, batch: Sequence[Any]) -> None: ...

    def close(self) -> None: ...


# Every live exporter, so that a forked child can drop the parent's queue and thread.
_EXPORTERS: weakref.WeakSet[BatchExporter] = weakref.WeakSet()


class ExportFailed(Exception):
    """A batch could not be delivered; `retryable` when trying again may help."""

    def __init__(self, message: str, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


class RateLimitedLog:
    """A warning at most once per `every` seconds, with how many were held back."""

    def __init__(self, every: float = LOG_EVERY_SECONDS) -> None:
        self._every = every
        self._last = -every
        self._held = 0

    def warning(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last < self._every:
            self._held += 1
            return
        held, self._held, self._last = self._held, 0, now
        suffix = f" ({held} more since the last report)" if held else ""
        logger.warning(message + suffix, *args)


class OtlpHttpSender:
    """POSTs batches to an OTLP/HTTP traces endpoint (`.../v1/traces`)."""

    def __init__(
        self,
        endpoint: str,
        resource_attributes: Mapping[str, Any],
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float = 10.0,
        compression: str = "none",
        certificate: str | None = None,
    ) -> None:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"the OTLP traces endpoint must be an http(s) URL, got {endpoint!r}")
        self.endpoint = endpoint
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._timeout = timeout
        self._gzip = compression == "gzip"
        self._ssl = ssl.create_default_context(cafile=certificate) if self._https else None
        self._headers = {
            "Content-Type": "application/x-protobuf",
            "User-Agent": f"chatqna/{__version__}",
            **({"Content-Encoding": "gzip"} if self._gzip else {}),
            **(headers or {}),
        }
        self._encoder = SpanEncoder(resource_attributes)
        self._connection: http.client.HTTPConnection | None = None
        # The encoder's own method, not a wrapper: one call less per span.
        self.prepare: Callable[[RecordedSpan], bytes] = self._encoder.scope_spans

    def send(self, batch: Sequence[bytes]) -> None:
        body = self._encoder.request_of(batch)
        if self._gzip:
            body = gzip.compress(body, compresslevel=6)
        deadline = time.monotonic() + self._timeout
        backoff = FIRST_BACKOFF_SECONDS
        while True:
            try:
                self._post(body, max(deadline - time.monotonic(), 0.1))
                return
            except ExportFailed as failure:
                if not failure.retryable or time.monotonic() + backoff > deadline:
                    raise
            time.sleep(backoff)
            backoff *= 2

    def _post(self, body: bytes, timeout: float) -> None:
        try:
            connection = self._connect(timeout)
            connection.request("POST", self._path, body=body, headers=self._headers)
            response = connection.getresponse()
            response.read()
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise ExportFailed(f"{type(exc).__name__}: {exc}", retryable=True) from exc
        if response.will_close:
            self.close()
        if 200 <= response.status < 300:
            return
        raise ExportFailed(f"HTTP {response.status}", response.status in RETRYABLE_STATUSES)

    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        if self._connection is None:
            if self._https:
                self._connection = http.client.HTTPSConnection(
                    self._host, self._port, timeout=timeout, context=self._ssl
                )
            else:
                self._connection = http.client.HTTPConnection(
                    self._host, self._port, timeout=timeout
                )
        else:
            self._connection.timeout = timeout
            if self._connection.sock is not None:
                self._connection.sock.settimeout(timeout)
        return self._connection

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


class ConsoleSender:
    """One JSON object per span and line (`OTEL_TRACES_EXPORTER=console`)."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self._stream = stream

    def prepare(self, span: RecordedSpan) -> bytes:
        return orjson.dumps(span_json(span), default=str)

    def send(self, batch: Sequence[bytes]) -> None:
        stream = self._stream or sys.stdout
        stream.write(b"\n".join(batch).decode() + "\n")
        stream.flush()

    def close(self) -> None:
        return None


def span_json(span: RecordedSpan) -> dict[str, Any]:
    """A span as JSON (the console exporter's line)."""
    context = span.context
    resource = getattr(span.resource, "attributes", None) or {}
    return {
        "name": span.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_span_id": f"{span.parent.span_id:016x}" if span.parent else None,
        "kind": span.kind.name,
        "start_time_unix_nano": span.start_time,
        "end_time_unix_nano": span.end_time,
        "status": {"code": span.status.status_code.name, "description": span.status.description},
        "attributes": dict(span.attributes),
        "events": [
            {"name": e.name, "time_unix_nano": e.timestamp, "attributes": dict(e.attributes)}
            for e in span.events
        ],
        "scope": span.instrumentation_scope.name,
        "resource": dict(resource),
    }


class BatchExporter:
    """The sink of a provider: a bounded queue, emptied in batches by one daemon thread."""

    def __init__(
        self,
        sender: SpanSender,
        *,
        max_queue_size: int = 2048,
        max_batch_size: int = 512,
        schedule_delay: float = 1.0,
    ) -> None:
        self.sender = sender
        self._prepare = sender.prepare
        self._max_queue = max_queue_size
        self._max_batch = min(max_batch_size, max_queue_size)
        self._delay = schedule_delay
        self._queue: deque[Any] = deque()
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._room = 0  # none until the thread runs: the first span starts it
        self._start_lock = threading.Lock()
        self._send_lock = threading.Lock()
        self.dropped = 0
        self.exported = 0
        self.failed = 0
        self._log = RateLimitedLog()
        _EXPORTERS.add(self)

    def __call__(self, span: RecordedSpan) -> None:
        queue = self._queue
        if len(queue) < self._room:  # the usual case: the thread runs, no batch is full
            try:
                queue.append(self._prepare(span))
            except Exception as exc:  # ending a span never fails the request
                self._not_encoded(exc)
            return
        if len(queue) >= self._max_queue:
            self.dropped += 1
            self._log.warning("span queue full (%d): spans dropped", self._max_queue)
            return
        try:
            queue.append(self._prepare(span))
        except Exception as exc:
            self._not_encoded(exc)
            return
        if self._thread is None:
            self._start()
        if len(queue) >= self._max_batch:
            self._wake.set()

    def _not_encoded(self, exc: Exception) -> None:
        self.failed += 1
        self._log.warning("a span could not be encoded and was dropped: %r", exc)

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is None and not self._stopping:
                thread = threading.Thread(target=self._run, name="chatqna-span-export", daemon=True)
                thread.start()
                self._thread = thread
                # Below this many queued spans, a span is queued with no further check.
                self._room = min(self._max_batch, self._max_queue) - 1

    def forget_thread(self) -> None:
        # A forked worker has the queue but not the thread: it starts its own.
        self._thread = None
        self._room = 0
        self._start_lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._queue.clear()

    def _run(self) -> None:
        # Woken by a full batch, only full batches leave: what is left waits for the next
        # one or for the delay. (Emptying the queue each time sent a full batch followed by
        # a trail of tiny ones, each a POST of its own, as spans kept arriving.)
        last_export = time.monotonic()
        while True:
            self._wake.wait(max(last_export + self._delay - time.monotonic(), 0))
            self._wake.clear()
            if self._stopping:
                self._drain()
                return
            if time.monotonic() - last_export >= self._delay:
                self._drain()
                last_export = time.monotonic()
            else:
                self._drain(full_only=True)

    def _drain(self, full_only: bool = False) -> None:
        with self._send_lock:
            while not full_only or len(self._queue) >= self._max_batch:
                batch = self._next_batch()
                if not batch:
                    break
                try:
                    self.sender.send(batch)
                    self.exported += len(batch)
                except Exception as exc:  # never let the thread die
                    self.failed += len(batch)
                    self._log.warning("span export failed, %d spans lost: %s", len(batch), exc)

    def _next_batch(self) -> list[Any]:
        # Only this thread takes from the queue, so `count` items are there: `popleft`
        # called from C, not once per span from Python.
        queue = self._queue
        count = min(len(queue), self._max_batch)
        return list(islice(iter(queue.popleft, _NEVER), count))

    def force_flush(self) -> None:
        """Export what is queued now, on the calling thread."""
        self._drain()

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self._wake.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        else:
            self._drain()
        self.sender.close()


def _after_fork_in_child() -> None:
    for exporter in list(_EXPORTERS):
        exporter.forget_thread()


os.register_at_fork(after_in_child=_after_fork_in_child)
