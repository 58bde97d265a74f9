"""The real server process exports its spans over OTLP/HTTP to a receiver started here."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import SAMPLE_CORPUS, ingest_cli, start_server
from tests.integration.otlp_receiver import otlp_receiver

pytestmark = pytest.mark.slow

CHAT = [
    {"role": "user", "content": "How do I reset my password?"},
    {"role": "assistant", "content": "Use the Forgot password link on the sign-in page."},
    {"role": "user", "content": "Can you elaborate on this?"},
]


def test_spans_arrive_over_otlp_with_the_service_name(tmp_path: Path) -> None:
    data = tmp_path / "data"
    ingest_cli(data, SAMPLE_CORPUS)
    with otlp_receiver() as (endpoint, received):
        server = start_server(
            data,
            tmp_path / "server.log",
            OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
            OTEL_SERVICE_NAME="chatqna-under-test",
            MULTI_TURN_BLEND_ENABLED="true",
        )
        try:
            response = httpx.post(
                f"{server.url}/v1/chatqna", json={"messages": CHAT, "max_tokens": 8}, timeout=60
            )
            assert response.status_code == 200
            trace_id = response.headers["x-trace-id"]
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                names = {s["name"] for s in received.spans() if s["trace_id"] == trace_id}
                if "chatqna.generate" in names:
                    break
                time.sleep(0.25)
        finally:
            server.stop()
        spans = [s for s in received.spans() if s["trace_id"] == trace_id]
    assert received.content_types and all(
        t == "application/x-protobuf" for t in received.content_types
    )
    assert {s["service"] for s in spans} == {"chatqna-under-test"}
    by_name = {s["name"]: s for s in spans}
    for name in (
        "chatqna.orchestrate",
        "chatqna.embed",
        "chatqna.retrieve",
        "chatqna.reranker_selection",
        "chatqna.generate",
    ):
        assert name in by_name, name
    assert "chatqna.query_condense" not in by_name
    assert "chatqna.rerank" not in by_name, "the embedded default keeps the fused order"
    selection = by_name["chatqna.reranker_selection"]["attributes"]
    assert selection["chatqna.reranker.name"].string_value == "none"
    assert selection["chatqna.reranker.query_kind"].string_value == "none"
    orchestrate = by_name["chatqna.orchestrate"]
    assert orchestrate["attributes"]["chatqna.blend.executed"].bool_value is True
    server_spans = [s for s in spans if s["span_id"] == orchestrate["parent_span_id"]]
    assert server_spans, "orchestrate hangs under the request's server span"
    # The embedded LLM is reached over loopback HTTP: its client span carries the trace.
    client_calls = [s for s in spans if s["name"].startswith("POST")]
    assert client_calls
