"""The batch exporter: batches of the configured size from one thread, a bounded queue, a
drained queue at shutdown, and a sender's failure that loses its batch but not the thread.
(The OTLP/HTTP sender itself is tested against a real receiver in the integration tests.)"""

from __future__ import annotations

import io
import json
import os
import threading
import time
from collections.abc import Sequence

import pytest

from chatqna.telemetry.span_export import BatchExporter, ConsoleSender
from chatqna.telemetry.spans import RecordedSpan, ServiceTracerProvider


class Sent:
    """A sender that keeps its batches; it can fail a number of times first."""

    def __init__(self, failures: int = 0) -> None:
        self.batches: list[list[str]] = []
        self.failures = failures
        self.threads: set[str] = set()
        self.arrived = threading.Event()
        self.closed = False

    def prepare(self, span: RecordedSpan) -> str:
        if span.name == "unencodable":
            raise ValueError("no encoding for that")
        return span.name

    def send(self, batch: Sequence[str]) -> None:
        self.threads.add(threading.current_thread().name)
        if self.failures:
            self.failures -= 1
            raise ConnectionError("collector down")
        self.batches.append(list(batch))
        self.arrived.set()

    def close(self) -> None:
        self.closed = True


def record(exporter: BatchExporter, count: int) -> None:
    tracer = ServiceTracerProvider(exporter).get_tracer("t")
    for n in range(count):
        tracer.start_span(f"s{n}").end()


def test_batches_have_the_configured_size_and_leave_from_the_export_thread() -> None:
    sent = Sent()
    exporter = BatchExporter(sent, max_batch_size=4, schedule_delay=30)
    record(exporter, 4)  # a full batch wakes the thread before the delay
    assert sent.arrived.wait(5)
    record(exporter, 3)
    exporter.shutdown()
    assert sent.batches == [["s0", "s1", "s2", "s3"], ["s0", "s1", "s2"]]
    assert sent.threads == {"chatqna-span-export"}
    assert exporter.exported == 7


class HeldFirst(Sent):
    """A sender whose first batch waits until `release` is set, so that spans pile up."""

    def __init__(self) -> None:
        super().__init__()
        self.sending = threading.Event()
        self.release = threading.Event()

    def send(self, batch: Sequence[str]) -> None:
        if not self.batches:
            self.sending.set()
            assert self.release.wait(5)
        super().send(batch)


def test_a_full_batch_sends_only_full_batches_and_the_rest_waits_for_the_delay() -> None:
    sent = HeldFirst()
    exporter = BatchExporter(sent, max_batch_size=4, schedule_delay=30)
    record(exporter, 4)
    assert sent.sending.wait(5)  # the first batch is on its way; five more arrive meanwhile
    record(exporter, 5)
    sent.release.set()
    deadline = time.monotonic() + 5
    while len(sent.batches) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # room for a trailing partial batch, which must not leave before the delay
    assert [len(b) for b in sent.batches] == [4, 4]
    exporter.shutdown()
    assert [len(b) for b in sent.batches] == [4, 4, 1]


def test_spans_short_of_a_batch_leave_after_the_schedule_delay() -> None:
    sent = Sent()
    exporter = BatchExporter(sent, max_batch_size=512, schedule_delay=0.05)
    record(exporter, 3)
    assert sent.arrived.wait(5)
    assert sent.batches == [["s0", "s1", "s2"]]
    exporter.shutdown()


def test_a_full_queue_drops_new_spans_and_counts_them(caplog: pytest.LogCaptureFixture) -> None:
    # The export thread is held inside its first send, so nothing leaves the queue while
    # the next spans arrive: the queue's bound alone decides what is dropped.
    sent = Sent()
    sending, release = threading.Event(), threading.Event()
    keep = sent.send

    def held_send(batch: Sequence[str]) -> None:
        sending.set()
        release.wait(5)
        keep(batch)

    sent.send = held_send  # type: ignore[method-assign]
    exporter = BatchExporter(sent, max_queue_size=5, max_batch_size=512, schedule_delay=30)
    tracer = ServiceTracerProvider(exporter).get_tracer("t")
    for n in range(5):
        tracer.start_span(f"s{n}").end()
    assert sending.wait(5), "a full queue wakes the thread"
    for n in range(5, 13):
        tracer.start_span(f"s{n}").end()
    release.set()
    exporter.shutdown()
    assert exporter.dropped == 3
    assert sent.batches == [["s0", "s1", "s2", "s3", "s4"], ["s5", "s6", "s7", "s8", "s9"]]
    assert "span queue full" in caplog.text


def test_a_failing_sender_loses_its_batch_not_the_thread(caplog: pytest.LogCaptureFixture) -> None:
    sent = Sent(failures=1)
    exporter = BatchExporter(sent, max_batch_size=2, schedule_delay=30)
    record(exporter, 2)
    exporter.force_flush()
    record(exporter, 2)
    assert sent.arrived.wait(5)
    exporter.shutdown()
    assert exporter.failed == 2 and exporter.exported == 2
    assert "span export failed, 2 spans lost: collector down" in caplog.text


def test_shutdown_drains_the_queue_and_closes_the_sender() -> None:
    sent = Sent()
    exporter = BatchExporter(sent, max_batch_size=512, schedule_delay=30)
    record(exporter, 3)
    exporter.shutdown()
    assert sent.batches == [["s0", "s1", "s2"]]
    assert sent.closed
    record(exporter, 1)  # after shutdown: queued, no new thread
    assert exporter._thread is not None and not exporter._thread.is_alive()


def test_a_span_that_cannot_be_encoded_is_dropped_without_raising(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sent = Sent()
    exporter = BatchExporter(sent, schedule_delay=30)
    tracer = ServiceTracerProvider(exporter).get_tracer("t")
    tracer.start_span("unencodable").end()
    tracer.start_span("fine").end()
    exporter.shutdown()
    assert sent.batches == [["fine"]]
    assert exporter.failed == 1
    assert "could not be encoded" in caplog.text


def test_the_console_writes_one_json_line_per_span() -> None:
    out = io.StringIO()
    exporter = BatchExporter(ConsoleSender(out), schedule_delay=30)
    tracer = ServiceTracerProvider(exporter).get_tracer("chatqna")
    with tracer.start_as_current_span("parent") as parent:
        parent.set_attribute("chatqna.k", 4)
        tracer.start_span("child").end()
    exporter.shutdown()
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["name"] for line in lines] == ["child", "parent"]
    child, top = lines
    assert child["parent_span_id"] == top["span_id"] and top["parent_span_id"] is None
    assert child["trace_id"] == top["trace_id"] and len(top["trace_id"]) == 32
    assert top["attributes"] == {"chatqna.k": 4} and top["kind"] == "INTERNAL"


def test_a_forked_child_starts_without_the_parents_queue_or_thread() -> None:
    sent = Sent()
    exporter = BatchExporter(sent, max_batch_size=512, schedule_delay=30)
    record(exporter, 2)
    assert exporter._thread is not None
    pid = os.fork()
    if pid == 0:  # the child: nothing of the parent's to export, and a thread of its own later
        ok = exporter._thread is None and len(exporter._queue) == 0
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    exporter.shutdown()
    assert os.waitstatus_to_exitcode(status) == 0
    assert sent.batches == [["s0", "s1"]], "the parent still exports its own spans"
