"""Tracing as an operator runs it: real server processes exporting over OTLP/HTTP and
OTLP/gRPC to receivers started here, `OTEL_SDK_DISABLED`, `OTEL_RESOURCE_ATTRIBUTES`,
`OTEL_PROPAGATORS=none`, the caller's context passed on with tracing off, and the service
under `opentelemetry-instrument` (with opentelemetry-instrumentation-httpx installed, as the
test extra has it), with an LLM stand-in that records the `traceparent` it is sent; and a
shutdown whose collector never answers."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.integration.conftest import SAMPLE_CORPUS, ingest_cli, start_server
from tests.integration.otlp_receiver import (
    ReceivedSpans,
    otlp_black_hole,
    otlp_grpc_receiver,
    otlp_receiver,
)

pytestmark = pytest.mark.slow

CHAT = [
    {"role": "user", "content": "How do I reset my password?"},
    {"role": "assistant", "content": "Use the Forgot password link on the sign-in page."},
    {"role": "user", "content": "Can you elaborate on this?"},
]
PIPELINE_SPANS = (
    "chatqna.orchestrate",
    "chatqna.embed",
    "chatqna.retrieve",
    "chatqna.reranker_selection",
    "chatqna.generate",
)
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "200"}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tracing") / "data"
    ingest_cli(path, SAMPLE_CORPUS)
    return path


@contextmanager
def llm_stand_in() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """An OpenAI-compatible chat server answering every completion at once; yields its URL
    and the headers of each request it got."""
    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # the readiness probe's /v1/models
            self.answer(b'{"object": "list", "data": [{"id": "standin", "object": "model"}]}')

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            seen.append({k.lower(): v for k, v in self.headers.items()})
            self.answer(self.completion())

        def completion(self) -> bytes:
            return json.dumps(
                {
                    "id": "c1",
                    "object": "chat.completion",
                    "model": "standin",
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "stop",
                            "message": {"role": "assistant", "content": "Use the link."},
                        }
                    ],
                }
            ).encode()

        def answer(self, reply: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def ask(url: str, headers: dict[str, str] | None = None) -> httpx2.Response:
    response = httpx2.post(
        f"{url}/v1/chatqna",
        json={"messages": CHAT, "max_tokens": 8, "stream": False},
        headers=headers,
        timeout=60,
    )
    assert response.status_code == 200, response.text
    return response


def spans_of(received: ReceivedSpans, trace_id: str, until: str) -> list[dict[str, Any]]:
    """The trace's spans, once the span named `until` has arrived (or 20 s have passed)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        found = [s for s in received.spans() if s["trace_id"] == trace_id]
        if until in {s["name"] for s in found}:
            return found
        time.sleep(0.2)
    return [s for s in received.spans() if s["trace_id"] == trace_id]


def assert_one_tree(spans: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every pipeline span, orchestrate under the server span, and one root."""
    by_name = {s["name"]: s for s in spans}
    for name in PIPELINE_SPANS:
        assert name in by_name, name
    ids = {s["span_id"] for s in spans}
    roots = [s for s in spans if s["parent_span_id"] not in ids]
    assert len(roots) == 1 and roots[0]["name"] == "POST /v1/chatqna", roots
    assert by_name["chatqna.orchestrate"]["parent_span_id"] == roots[0]["span_id"]
    return by_name


def test_spans_arrive_over_otlp_http_with_the_resource_attributes_given(
    tmp_path: Path, data: Path
) -> None:
    with otlp_receiver() as (endpoint, received):
        server = start_server(
            data,
            tmp_path / "server.log",
            OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
            OTEL_RESOURCE_ATTRIBUTES="service.name=chatqna-eu,deployment.environment=test",
            MULTI_TURN_BLEND_ENABLED="true",
            **FAST_EXPORT,
        )
        try:
            trace_id = ask(server.url).headers["x-trace-id"]
            spans = spans_of(received, trace_id, "chatqna.generate")
        finally:
            server.stop()
    assert set(received.content_types) == {"application/x-protobuf"}
    assert {s["service"] for s in spans} == {"chatqna-eu"}
    by_name = assert_one_tree(spans)
    assert by_name["chatqna.orchestrate"]["attributes"]["chatqna.blend.executed"].bool_value
    selection = by_name["chatqna.reranker_selection"]["attributes"]
    assert selection["chatqna.reranker.name"].string_value == "none"
    # The embedded LLM is reached over loopback HTTP: its client span is in the trace.
    assert any(s["name"] == "POST /v1/chat/completions" for s in spans)


def test_spans_arrive_over_otlp_grpc(tmp_path: Path, data: Path) -> None:
    with otlp_grpc_receiver() as (endpoint, received):
        server = start_server(
            data,
            tmp_path / "server.log",
            OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
            OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
            **FAST_EXPORT,
        )
        try:
            trace_id = ask(server.url).headers["x-trace-id"]
            spans = spans_of(received, trace_id, "chatqna.generate")
        finally:
            server.stop()
    assert set(received.content_types) == {"application/grpc"}
    assert {s["service"] for s in spans} == {"chatqna"}
    assert_one_tree(spans)


def test_with_otel_propagators_none_no_context_is_taken_or_sent(tmp_path: Path, data: Path) -> None:
    caller = "0af7651916cd43dd8448eb211c80319c"
    with otlp_receiver() as (endpoint, received), llm_stand_in() as (llm, seen):
        server = start_server(
            data,
            tmp_path / "server.log",
            OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
            OTEL_PROPAGATORS="none",
            LLM_ENDPOINT=llm,
            LLM_MODEL_ID="standin",
            **FAST_EXPORT,
        )
        try:
            response = ask(server.url, {"traceparent": f"00-{caller}-b7ad6b7169203331-01"})
            trace_id = response.headers["x-trace-id"]
            spans = spans_of(received, trace_id, "chatqna.generate")
        finally:
            log = server.stop()
    assert trace_id != caller, "the caller's context is not taken"
    by_name = assert_one_tree(spans)
    assert by_name["POST /v1/chatqna"]["parent_span_id"] == "", log
    assert seen and all("traceparent" not in headers for headers in seen)


def test_a_collector_that_never_answers_does_not_hold_up_the_shutdown(
    tmp_path: Path, data: Path
) -> None:
    """The export at shutdown would wait 60 s (OTEL_EXPORTER_OTLP_TIMEOUT) on this collector,
    past the 20 s `stop` gives before it kills the server; the service gives up on the
    spans after its own bound and exits cleanly."""
    with otlp_black_hole() as (endpoint, accepted):
        server = start_server(
            data,
            tmp_path / "server.log",
            OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
            OTEL_EXPORTER_OTLP_TIMEOUT="60",
            CHATQNA_LOG_LEVEL="INFO",
        )
        try:
            assert "x-trace-id" in ask(server.url).headers
        finally:
            log = server.stop()
        assert accepted, "the spans were sent at shutdown"
    # uvicorn ends by raising the signal it was stopped with again: not killed.
    assert server.process.returncode == -signal.SIGTERM, log
    assert "spans not exported within 5 s of shutdown were dropped" in log
    assert "Application shutdown complete" in log


def test_a_disabled_sdk_exports_nothing(tmp_path: Path, data: Path) -> None:
    with otlp_receiver() as (endpoint, received):
        server = start_server(
            data,
            tmp_path / "server.log",
            OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
            OTEL_SDK_DISABLED="true",
            **FAST_EXPORT,
        )
        try:
            response = ask(server.url)
            time.sleep(1.5)  # several export intervals
        finally:
            log = server.stop()
    assert "x-trace-id" not in response.headers
    assert received.requests == [] and received.connections == 0, log


@pytest.mark.parametrize(
    "off",
    [{"OTEL_TRACES_EXPORTER": "none"}, {"OTEL_SDK_DISABLED": "true"}],
    ids=["none", "disabled"],
)
def test_with_tracing_off_the_callers_context_is_passed_on(
    tmp_path: Path, data: Path, off: dict[str, str]
) -> None:
    caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with llm_stand_in() as (llm, seen):
        server = start_server(
            data, tmp_path / "server.log", LLM_ENDPOINT=llm, LLM_MODEL_ID="standin", **off
        )
        try:
            response = ask(server.url, {"traceparent": caller, "baggage": "tenant=acme"})
        finally:
            log = server.stop()
    assert response.headers["x-trace-id"] == "0af7651916cd43dd8448eb211c80319c", log
    assert [(h.get("traceparent"), h.get("baggage")) for h in seen] == [(caller, "tenant=acme")]


def test_under_opentelemetry_instrument_the_whole_tree_is_one_trace(
    tmp_path: Path, data: Path
) -> None:
    instrument = Path(sys.executable).with_name("opentelemetry-instrument")
    with otlp_receiver() as (endpoint, received), llm_stand_in() as (llm, seen):
        server = start_server(
            data,
            tmp_path / "server.log",
            launcher=[str(instrument)],
            OTEL_TRACES_EXPORTER="otlp",
            OTEL_METRICS_EXPORTER="none",
            OTEL_LOGS_EXPORTER="none",
            OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
            OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
            OTEL_SERVICE_NAME="chatqna-instrumented",
            LLM_ENDPOINT=llm,
            LLM_MODEL_ID="standin",
            **FAST_EXPORT,
        )
        try:
            trace_id = ask(server.url).headers["x-trace-id"]
            spans = spans_of(received, trace_id, "chatqna.generate")
        finally:
            log = server.stop()
    assert {s["service"] for s in spans} == {"chatqna-instrumented"}, log
    by_name = assert_one_tree(spans)
    # Ours are `POST /v1/chat/completions`; the instrumentation of httpx2 would add `POST`.
    client_calls = [
        s for s in spans if s["name"].split(" ")[0] == "POST" and s["name"] != "POST /v1/chatqna"
    ]
    # The instrumentation of httpx2, active here, adds no second span to an upstream call.
    assert len(client_calls) == len(seen)
    generate = by_name["chatqna.generate"]
    (llm_call,) = [s for s in client_calls if s["parent_span_id"] == generate["span_id"]]
    sent = [headers["traceparent"].split("-") for headers in seen]
    assert [(trace_id, llm_call["span_id"])] == [(ids, span) for _, ids, span, _ in sent]
    assert all(int(flags, 16) & 1 for *_, flags in sent), "sampled"
