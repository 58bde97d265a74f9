"""The `SpanSender` contract, run over both senders: the OTLP/HTTP one against a receiver on
loopback (decoded with opentelemetry-proto), the console one into a buffer (parsed as JSON).
What `prepare` made of each ended span arrives, batch by batch, with its name, ids, parent
and attribute values; `close` may be called twice; behind a `BatchExporter`, shutdown
delivers what was queued."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from chatqna.telemetry.span_export import BatchExporter, ConsoleSender, OtlpHttpSender, SpanSender
from chatqna.telemetry.spans import InMemorySpans, RecordedSpan, ServiceTracerProvider
from tests.integration.otlp_receiver import otlp_receiver

ATTRIBUTES: dict[str, Any] = {
    "text": "blend",
    "count": 4,
    "flag": True,
    "ratio": 0.7,
    "ids": ["a", "b"],
}


@dataclass
class Delivered:
    """A sender, and what has reached the other side as `(name, span id, parent id, attributes)`."""

    sender: SpanSender
    received: Callable[[], list[tuple[str, str, str | None, dict[str, Any]]]]


@contextmanager
def otlp() -> Iterator[Delivered]:
    with otlp_receiver() as (endpoint, received):

        def spans() -> list[tuple[str, str, str | None, dict[str, Any]]]:
            return [
                (
                    s["name"],
                    s["span_id"],
                    s["parent_span_id"] or None,
                    {k: plain(v) for k, v in s["attributes"].items()},
                )
                for s in received.spans()
            ]

        yield Delivered(OtlpHttpSender(f"{endpoint}/v1/traces", {"service.name": "t"}), spans)


@contextmanager
def console() -> Iterator[Delivered]:
    out = io.StringIO()

    def spans() -> list[tuple[str, str, str | None, dict[str, Any]]]:
        lines = [json.loads(line) for line in out.getvalue().splitlines()]
        return [(s["name"], s["span_id"], s["parent_span_id"], s["attributes"]) for s in lines]

    yield Delivered(ConsoleSender(out), spans)


def plain(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [plain(v) for v in value.array_value.values]
    return getattr(value, kind)


SENDERS = {"otlp-http": otlp, "console": console}


@pytest.fixture(params=sorted(SENDERS))
def delivered(request: pytest.FixtureRequest) -> Iterator[Delivered]:
    with SENDERS[request.param]() as found:
        yield found


def ended(names: list[str], parent: bool = True) -> list[RecordedSpan]:
    store = InMemorySpans()
    tracer = ServiceTracerProvider(store).get_tracer("chatqna")
    with tracer.start_as_current_span("root") as root:
        root.set_attributes(ATTRIBUTES)
        for name in names:
            tracer.start_span(name).end()
    return list(store.get_finished_spans())


def hex_ids(span: RecordedSpan) -> tuple[str, str | None]:
    parent = span.parent
    return f"{span.context.span_id:016x}", f"{parent.span_id:016x}" if parent else None


def test_a_batch_arrives_whole_with_ids_parents_and_values(delivered: Delivered) -> None:
    spans = ended(["chatqna.embed", "chatqna.retrieve"])
    delivered.sender.send([delivered.sender.prepare(s) for s in spans])
    delivered.sender.close()
    got = delivered.received()
    assert [(name, span_id, parent) for name, span_id, parent, _ in got] == [
        (s.name, *hex_ids(s)) for s in spans
    ]
    assert got[-1][3] == ATTRIBUTES
    assert got[0][3] == {}


def test_batches_arrive_in_order(delivered: Delivered) -> None:
    first, second = ended(["one"]), ended(["two", "three"])
    for batch in (first, second):
        delivered.sender.send([delivered.sender.prepare(s) for s in batch])
    delivered.sender.close()
    delivered.sender.close()  # a second close is harmless
    assert [name for name, *_ in delivered.received()] == ["one", "root", "two", "three", "root"]


def test_behind_a_batch_exporter_shutdown_delivers_the_queue(delivered: Delivered) -> None:
    exporter = BatchExporter(delivered.sender, max_batch_size=2, schedule_delay=30)
    tracer = ServiceTracerProvider(exporter).get_tracer("chatqna")
    for n in range(5):
        tracer.start_span(f"s{n}").end()
    exporter.shutdown()
    assert sorted(name for name, *_ in delivered.received()) == [f"s{n}" for n in range(5)]
    assert exporter.exported == 5 and exporter.failed == 0
