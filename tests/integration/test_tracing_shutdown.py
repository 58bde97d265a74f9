"""The bounded tracing shutdown against a collector on a closed loopback port: every export
is refused at once, so the SDK's exporter sits in its retry back-off when the bound passes.
The exporter is shut down then, and the batch processor shuts it down again once its worker
stops; it is shut down once, and nothing is logged of the second call."""

from __future__ import annotations

import logging
import socket
import threading

import pytest
from opentelemetry.sdk.trace import TracerProvider

from chatqna.settings import Settings
from chatqna.telemetry.tracing import OwnedTracing, batch_processor, build_exporter


def closed_port() -> int:
    """A loopback port nothing listens on (bound once, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_an_unreachable_collector_is_given_up_on_without_a_second_exporter_shutdown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = Settings(otel_exporter_otlp_endpoint=f"http://127.0.0.1:{closed_port()}")
    processor = batch_processor(
        build_exporter("otlp_proto_http", settings), schedule_delay_millis=60_000
    )
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(processor)
    for name in ("first", "second"):
        provider.get_tracer("test").start_span(name).end()
    with caplog.at_level(logging.WARNING):
        assert OwnedTracing(provider, (processor,)).shutdown(timeout_seconds=2) is False
        # The provider's shutdown goes on in its thread until the processor's worker stops
        # (its retry is cut short) and the processor has shut its exporter down.
        for thread in threading.enumerate():
            if thread.name == "chatqna-tracing-shutdown":
                thread.join()
    assert "Connection refused" in caplog.text, "the collector was tried"
    assert "spans not exported within 2 s of shutdown were dropped" in caplog.text
    assert "already shutdown" not in caplog.text
