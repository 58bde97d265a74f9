"""Unit tests never touch the network, and record every span in memory.

Any attempt to open an internet socket fails. Upstream clients send through httpx's own
transport, as the service does, and respx routes them, so the tests read the documented
wire formats; proxy variables are cleared (`_no_proxies`), so no upstream call is routed
to a proxy from the environment the tests run in. The SDK's tracer provider, handing every
ended span to an in-memory exporter, is the process's global provider for the whole run
(OpenTelemetry allows one), so every test sees the same instrumented code paths; `spans`
hands a test a cleared exporter.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from chatqna.settings import Settings
from chatqna.telemetry.tracing import service_resource

SPAN_EXPORTER = InMemorySpanExporter()
TRACER_PROVIDER = TracerProvider(resource=service_resource())
TRACER_PROVIDER.add_span_processor(SimpleSpanProcessor(SPAN_EXPORTER))
trace.set_tracer_provider(TRACER_PROVIDER)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    SPAN_EXPORTER.clear()
    yield SPAN_EXPORTER
    SPAN_EXPORTER.clear()


PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


@pytest.fixture(autouse=True)
def _no_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


class NetworkBlocked(RuntimeError):
    """Raised when a unit test tries to open a network connection."""


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    real_connect = socket.socket.connect

    def guarded(self: socket.socket, address: object) -> None:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            raise NetworkBlocked(f"unit tests must not open network connections ({address!r})")
        real_connect(self, address)  # type: ignore[arg-type]

    monkeypatch.setattr(socket.socket, "connect", guarded)
    yield


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings read the environment: start every test from the documented defaults."""
    for name in Settings.model_fields:
        monkeypatch.delenv(name.upper(), raising=False)
