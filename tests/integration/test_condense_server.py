"""Condense end to end: an unreachable LLM fails follow-ups closed; first turns need no rewrite."""

from __future__ import annotations

import json
from pathlib import Path

import httpx2
import pytest

from chatqna.errors import CONDENSE_FAILED_MESSAGE
from tests.integration.conftest import SAMPLE_CORPUS, free_port, ingest_cli, start_server
from tests.unit.api.conftest import parse_sse

pytestmark = pytest.mark.slow

CHAT = [
    {"role": "user", "content": "How do I export my data?"},
    {"role": "assistant", "content": "Open Settings > Workspace > Export."},
    {"role": "user", "content": "Is that possible after I cancel?"},
]


def test_unreachable_llm_fails_closed_and_first_turns_make_no_rewrite(tmp_path: Path) -> None:
    data = tmp_path / "data"
    ingest_cli(data, SAMPLE_CORPUS)
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    server = start_server(
        data,
        tmp_path / "server.log",
        ready_path="/v1/health_check",
        MULTI_TURN_MODE="condense",
        LLM_ENDPOINT=closed,
        LLM_MODEL_ID="any",
        CONDENSE_TIMEOUT_SECONDS="3",
    )
    try:
        for stream in (True, False):
            failed = httpx2.post(
                f"{server.url}/v1/chatqna", json={"messages": CHAT, "stream": stream}, timeout=30
            )
            assert failed.status_code == 503
            body = failed.json()
            assert body["error"] == "condense_failed"
            assert body["reason"] in {"timeout", "http_error"}
            assert body["message"] == CONDENSE_FAILED_MESSAGE
            assert set(body) == {"error", "reason", "message"}

        # A first turn needs no rewrite: retrieval runs and the stream starts; only the
        # answer, which needs the unreachable LLM, fails, as an error event.
        single = httpx2.post(
            f"{server.url}/v1/chatqna", json={"messages": "How do I export my data?"}, timeout=30
        )
        assert single.status_code == 200
        events = parse_sse(single.text)
        metadata = json.loads(events[0][1])
        assert metadata["retrieval"]["condense"]["status"] == "skipped_no_history"
        assert metadata["source_documents"][0]["source"] == "export.md"
        assert events[-2][0] == "error"
        assert json.loads(events[-2][1])["backend"] == "llm"
        assert events[-1] == ("message", "[DONE]")
    finally:
        log = server.stop()
    assert "condense failed (reason=" in log
