"""The OTLP/HTTP sender against a real receiver on loopback: protobuf that opentelemetry-proto
decodes, the configured headers and gzip, retries on the statuses that ask for them, and no
hang when the collector is gone."""

from __future__ import annotations

import socket
import time

import pytest

from chatqna.telemetry.span_export import ExportFailed, OtlpHttpSender
from chatqna.telemetry.spans import InMemorySpans, RecordedSpan, ServiceTracerProvider
from tests.integration.otlp_receiver import otlp_receiver

RESOURCE = {"service.name": "chatqna-under-test"}


def send(sender: OtlpHttpSender, batch: list[RecordedSpan]) -> None:
    sender.send([sender.prepare(span) for span in batch])


def spans(count: int = 3) -> list[RecordedSpan]:
    store = InMemorySpans()
    tracer = ServiceTracerProvider(store).get_tracer("chatqna")
    with tracer.start_as_current_span("chatqna.orchestrate") as top:
        top.set_attribute("chatqna.retrieval.k", 4)
        for n in range(count - 1):
            tracer.start_span(f"stage-{n}").end()
    return list(store.get_finished_spans())


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_a_batch_arrives_decoded_with_its_headers(compression: str) -> None:
    with otlp_receiver() as (endpoint, received):
        sender = OtlpHttpSender(
            f"{endpoint}/v1/traces",
            RESOURCE,
            headers={"x-tenant": "blue"},
            compression=compression,
        )
        send(sender, spans())
        send(sender, spans(2))
        sender.close()
    got = received.spans()
    assert [s["name"] for s in got] == [
        "stage-0",
        "stage-1",
        "chatqna.orchestrate",
        "stage-0",
        "chatqna.orchestrate",
    ]
    assert {s["service"] for s in got} == {"chatqna-under-test"}
    assert got[2]["attributes"]["chatqna.retrieval.k"].int_value == 4
    assert got[0]["parent_span_id"] == got[2]["span_id"]
    for headers in received.headers:
        assert headers["content-type"] == "application/x-protobuf"
        assert headers["x-tenant"] == "blue"
        assert headers["user-agent"].startswith("chatqna/")
        assert (headers.get("content-encoding") == "gzip") is (compression == "gzip")


def test_batches_share_one_keep_alive_connection() -> None:
    with otlp_receiver() as (endpoint, received):
        sender = OtlpHttpSender(f"{endpoint}/v1/traces", RESOURCE)
        for _ in range(3):
            send(sender, spans())
        sender.close()
        send(sender, spans())  # a closed sender connects again
        sender.close()
    assert len(received.spans()) == received.span_count() == 12
    assert received.connections == 2


def test_retryable_answers_are_retried_until_one_lands() -> None:
    with otlp_receiver(refuse_with=[503, 429]) as (endpoint, received):
        sender = OtlpHttpSender(f"{endpoint}/v1/traces", RESOURCE, timeout=10)
        send(sender, spans())
        sender.close()
    assert received.refused == 2
    assert len(received.spans()) == 3


def test_a_rejected_batch_is_not_retried() -> None:
    with otlp_receiver(refuse_with=[400, 400]) as (endpoint, received):
        sender = OtlpHttpSender(f"{endpoint}/v1/traces", RESOURCE, timeout=10)
        with pytest.raises(ExportFailed, match="HTTP 400") as failure:
            send(sender, spans())
        sender.close()
    assert not failure.value.retryable
    assert received.refused == 1


def test_a_collector_that_is_gone_fails_within_the_timeout() -> None:
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sender = OtlpHttpSender(f"http://127.0.0.1:{port}/v1/traces", RESOURCE, timeout=1.5)
    started = time.monotonic()
    with pytest.raises(ExportFailed) as failure:
        send(sender, spans())
    assert failure.value.retryable
    assert time.monotonic() - started < 5


def test_a_silent_collector_times_out() -> None:
    with socket.socket() as listener:  # accepts, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        sender = OtlpHttpSender(f"http://127.0.0.1:{port}/v1/traces", RESOURCE, timeout=1.0)
        started = time.monotonic()
        with pytest.raises(ExportFailed, match=r"timed out|TimeoutError"):
            send(sender, spans())
        assert time.monotonic() - started < 5


def test_an_endpoint_that_is_not_http_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="http"):
        OtlpHttpSender("grpc://collector:4317", RESOURCE)
