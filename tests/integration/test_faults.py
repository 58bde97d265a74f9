"""Upstream faults through the real server: the documented error, in time, and recovery.

One `chatqna serve` process (condense mode, every upstream remote) talks to one stand-in
process-thread serving all the upstream roles (`tests.standins.servers`); each test puts a
fault on one route, checks what the client sees and how long it took, that the server is
still healthy, and that once the fault is cleared the same request succeeds. Timeouts are
small so the whole module runs in seconds.

What a client sees (see site/docs/resilience.md): a fault before the answer starts is an
HTTP error with the envelope (504 `upstream_timeout`, 502 `upstream_error` or
`bad_upstream_response`; 503 `condense_failed` for the rewrite); a fault of the chat LLM
after the stream began is `event: error` with the envelope, then `data: [DONE]`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx2
import pytest

from chatqna.errors import CONDENSE_FAILED_MESSAGE
from tests.integration.conftest import ServerProcess, start_server
from tests.standins.servers import Fault, FaultBook, create_standin_app, serve_in_thread
from tests.unit.api.conftest import parse_sse

pytestmark = pytest.mark.slow

TIMEOUT = 1.0  # every upstream timeout, in seconds (the stand-ins share the test process)
GENERATION_TIMEOUT = 2.0
ATTEMPTS = 2
SLACK = 1.5  # process start-up noise on a shared 2-core machine, not a feature
QUESTION = "How do I export my data?"
FOLLOW_UP = [
    {"role": "user", "content": QUESTION},
    {"role": "assistant", "content": "Open Settings and choose Export."},
    {"role": "user", "content": "Is that possible after I cancel?"},
]


@dataclass
class Stack:
    """The server under test, the stand-in's URL, and the stand-in's fault book."""

    server: ServerProcess
    standin: str
    faults: FaultBook

    @property
    def url(self) -> str:
        return self.server.url


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("faults")
    app = create_standin_app(tokens=6)
    with serve_in_thread(app) as standin:
        server = start_server(
            root / "data",
            root / "server.log",
            TEI_EMBEDDING_ENDPOINT=standin,
            TEI_RERANKING_ENDPOINT=standin,
            RETRIEVER_ENDPOINT=standin,
            LLM_ENDPOINT=standin,
            LLM_MODEL_ID="standin",
            CONDENSE_LLM_ENDPOINT=f"{standin}/condense",
            CONDENSE_LLM_MODEL_ID="standin-condense",
            MULTI_TURN_MODE="condense",
            EMBEDDING_TIMEOUT_SECONDS=str(TIMEOUT),
            RERANK_TIMEOUT_SECONDS=str(TIMEOUT),
            RETRIEVER_TIMEOUT_SECONDS=str(TIMEOUT),
            LLM_TIMEOUT_SECONDS=str(TIMEOUT),
            CONDENSE_TIMEOUT_SECONDS=str(TIMEOUT),
            LLM_GENERATION_TIMEOUT_SECONDS=str(GENERATION_TIMEOUT),
            UPSTREAM_CONNECT_TIMEOUT_SECONDS=str(TIMEOUT),
            UPSTREAM_RETRY_ATTEMPTS=str(ATTEMPTS),
            UPSTREAM_RETRY_BACKOFF_SECONDS="0.05",
            CHATQNA_MAX_CONCURRENT_CHATS="2",
            CHATQNA_QUEUE_TIMEOUT_SECONDS="0",
            OTEL_TRACES_EXPORTER="none",
        )
        try:
            yield Stack(server, standin, app.state.faults)
        finally:
            server.stop()


@pytest.fixture
def faults(stack: Stack) -> Iterator[FaultBook]:
    stack.faults.clear()
    stack.faults.reset_stats()
    yield stack.faults
    stack.faults.clear()


def ask(url: str, messages: Any = QUESTION, **extra: Any) -> httpx2.Response:
    return httpx2.post(
        f"{url}/v1/chatqna", json={"messages": messages, "max_tokens": 8, **extra}, timeout=30
    )


def assert_recovers(stack: Stack, messages: Any = QUESTION) -> None:
    """The server is alive, and with the fault cleared the same request is answered."""
    assert httpx2.get(f"{stack.url}/v1/health_check", timeout=5).status_code == 200
    stack.faults.clear()
    response = ask(stack.url, messages)
    assert response.status_code == 200, response.text
    events = parse_sse(response.text)
    assert events[0][0] == "metadata"
    assert [name for name, _ in events].count("error") == 0, response.text
    assert events[-1] == ("message", "[DONE]")


def timed(call: Any) -> tuple[httpx2.Response, float]:
    started = time.monotonic()
    response = call()
    return response, time.monotonic() - started


# Faults met before the answer starts: (fault, HTTP status, error code, what the message
# says, retried?). The message shows the fault arrived as meant (a reset, not a 500).
BEFORE_STREAM = [
    ("slow", 504, "upstream_timeout", "timed out", True),
    ("endless", 504, "upstream_timeout", "timed out", True),
    ("http_error", 502, "upstream_error", "returned HTTP 500", True),
    # httpx2's names: a reset connection, a body shorter than its Content-Length.
    ("reset", 502, "upstream_error", "(ReadError)", True),
    ("truncated", 502, "upstream_error", "(RemoteProtocolError)", True),
    ("malformed", 502, "bad_upstream_response", "not JSON", False),
]
ROLES = {"embeddings": "embedder", "rerank": "reranker", "retrieval": "retriever"}


@pytest.mark.parametrize(
    ("route", "fault", "status", "code", "detail", "retried"),
    [
        pytest.param(route, *case, id=f"{route}-{case[0]}")
        for route in ROLES
        for case in BEFORE_STREAM
    ]
    + [
        pytest.param(
            "embeddings", "wrong_dimension", 502, "bad_upstream_response", "dimension 32", False
        )
    ],
)
def test_idempotent_upstream_fault_is_a_typed_error_in_time(
    stack: Stack,
    faults: FaultBook,
    route: str,
    fault: str,
    status: int,
    code: str,
    detail: str,
    retried: bool,
) -> None:
    faults.set(route, Fault(fault))
    response, elapsed = timed(lambda: ask(stack.url))
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] == code and body["backend"] == ROLES[route]
    assert detail in body["message"]
    assert set(body) == {"error", "message", "backend"}
    # Each attempt is bounded by the timeout; retried faults are tried ATTEMPTS times.
    tries = ATTEMPTS if retried else 1
    assert faults.snapshot()["stats"][route]["faults"] == tries
    assert elapsed < tries * TIMEOUT + SLACK
    assert_recovers(stack)


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("slow", "timeout"),
        ("endless", "timeout"),
        ("http_error", "http_error"),
        ("reset", "http_error"),
        ("truncated", "http_error"),
        ("malformed", "bad_body"),
    ],
)
def test_condense_fault_fails_closed_in_time(
    stack: Stack, faults: FaultBook, fault: str, reason: str
) -> None:
    faults.set("condense", Fault(fault))
    response, elapsed = timed(lambda: ask(stack.url, FOLLOW_UP))
    assert response.status_code == 503, response.text
    assert response.json() == {
        "error": "condense_failed",
        "reason": reason,
        "message": CONDENSE_FAILED_MESSAGE,
    }
    assert faults.snapshot()["stats"]["condense"]["faults"] == 1  # the rewrite is not retried
    assert elapsed < TIMEOUT + SLACK
    assert_recovers(stack, FOLLOW_UP)


@pytest.mark.parametrize(
    ("fault", "code", "detail", "bound"),
    [
        ("slow", "upstream_timeout", "timed out", TIMEOUT),
        ("endless", "upstream_timeout", "longer than 2.0s", GENERATION_TIMEOUT),
        ("http_error", "upstream_error", "returned HTTP 500", 0.0),
        # A reset under the body: httpx2's read error.
        ("reset", "upstream_error", "(ReadError)", 0.0),
        ("truncated", "bad_upstream_response", "cut off inside an event", 0.0),
        ("malformed", "bad_upstream_response", "not JSON", 0.0),
    ],
)
def test_chat_llm_fault_after_the_stream_began_is_an_error_event(
    stack: Stack, faults: FaultBook, fault: str, code: str, detail: str, bound: float
) -> None:
    faults.set("chat", Fault(fault))
    response, elapsed = timed(lambda: ask(stack.url))
    assert response.status_code == 200  # the metadata event had already gone out
    events = parse_sse(response.text)
    assert events[0][0] == "metadata"
    assert events[-2][0] == "error"
    error = json.loads(events[-2][1])
    assert error["error"] == code and error["backend"] == "llm"
    assert detail in error["message"]
    assert events[-1] == ("message", "[DONE]")
    assert faults.snapshot()["stats"]["chat"]["calls"] == 1  # generation is never retried
    assert elapsed < bound + SLACK
    assert_recovers(stack)


@pytest.mark.parametrize(
    ("fault", "status", "code"),
    [
        ("endless", 504, "upstream_timeout"),
        ("http_error", 502, "upstream_error"),
        ("malformed", 502, "bad_upstream_response"),
    ],
)
def test_chat_llm_fault_without_streaming_is_a_typed_error(
    stack: Stack, faults: FaultBook, fault: str, status: int, code: str
) -> None:
    faults.set("chat", Fault(fault))
    response, elapsed = timed(lambda: ask(stack.url, stream=False))
    assert response.status_code == status, response.text
    assert response.json()["error"] == code
    assert elapsed < GENERATION_TIMEOUT + SLACK
    assert_recovers(stack)


def closed_early(
    faults: FaultBook, started: float, within: float
) -> tuple[float | None, dict[str, Any]]:
    """When (seconds after `started`) the chat stand-in saw its response closed early, if it
    did within `within` seconds; and the chat route's counters then."""
    while True:
        stats = faults.snapshot()["stats"]["chat"]
        elapsed = time.monotonic() - started
        if stats["streams_closed_early"] == 1:
            return elapsed, stats
        if elapsed >= within:
            return None, stats
        time.sleep(0.02)


def test_client_disconnect_closes_the_upstream_stream(stack: Stack, faults: FaultBook) -> None:
    faults.set("chat", Fault("endless"))  # tokens until someone stops listening
    started = time.monotonic()
    with httpx2.stream(
        "POST", f"{stack.url}/v1/chatqna", json={"messages": QUESTION}, timeout=30
    ) as response:
        tokens = 0
        for line in response.iter_lines():
            tokens += line.startswith("data: {") and "again" in line
            if tokens == 3:
                break
    # Leaving the block closed our connection mid-stream.
    closed_at, stats = closed_early(faults, started, GENERATION_TIMEOUT)
    assert closed_at is not None, "the upstream stream was not closed before the deadline"
    assert stats == {**stats, "streams_opened": 1, "streams_finished": 0}
    assert_recovers(stack)


def test_a_client_gone_before_its_completion_stops_the_upstream_call(
    stack: Stack, faults: FaultBook
) -> None:
    faults.set("chat", Fault("endless"))  # a completion whose body never ends
    body = {"messages": QUESTION, "max_tokens": 8}  # not streamed: OpenAI's default
    started = time.monotonic()
    with pytest.raises(httpx2.ReadTimeout):  # the client gives up and closes its connection
        httpx2.post(
            f"{stack.url}/v1/chat/completions", json=body, timeout=httpx2.Timeout(30, read=0.3)
        )
    left = time.monotonic() - started
    closed_at, _ = closed_early(faults, started, GENERATION_TIMEOUT + SLACK)
    assert closed_at is not None, "the upstream call was not closed"
    # Stopped because the client left (said in the log), not by the generation deadline.
    log = stack.server.log_path.read_text(errors="replace")
    assert "the client left before its answer was ready" in log
    assert closed_at - left < GENERATION_TIMEOUT
    assert_recovers(stack)


def test_saturated_chats_get_429_with_retry_after(stack: Stack, faults: FaultBook) -> None:
    faults.set("chat", Fault("endless"))
    body = {"messages": QUESTION}
    with (
        httpx2.stream("POST", f"{stack.url}/v1/chatqna", json=body, timeout=30) as first,
        httpx2.stream("POST", f"{stack.url}/v1/chatqna", json=body, timeout=30) as second,
    ):
        assert first.status_code == second.status_code == 200
        refused = httpx2.post(f"{stack.url}/v1/chat/completions", json=body, timeout=30)
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "1"
        envelope = refused.json()
        assert envelope["error"] == "too_many_requests"
        assert "CHATQNA_MAX_CONCURRENT_CHATS" in envelope["message"]
        # Health checks are not chats: they still answer.
        assert httpx2.get(f"{stack.url}/v1/health_check", timeout=5).status_code == 200
    assert_recovers(stack)


def test_retries_are_logged_and_no_fault_leaves_a_traceback(
    stack: Stack, faults: FaultBook
) -> None:
    faults.set("embeddings", Fault("http_error", status=503))
    assert ask(stack.url).status_code == 502
    log = stack.server.log_path.read_text(errors="replace")
    assert "embedder: POST /v1/embeddings failed (HTTP 503), attempt 1 of 2" in log
    assert "Traceback" not in log
