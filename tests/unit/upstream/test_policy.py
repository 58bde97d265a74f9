"""Shared HTTP plumbing (`upstream/policy.py`): retries and whole-call bounds of the remote clients,
over `httpx2.MockTransport`.

Waits are recorded through the policy's injected `sleep`, never taken.
"""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx2
import pytest

from chatqna.backends.openai_chat import OpenAIChatLLM
from chatqna.backends.protocols import GenerationParams, SearchQuery
from chatqna.backends.tei import TEIEmbedder, TEIReranker
from chatqna.documents import Chunk, ScoredChunk
from chatqna.errors import BadUpstreamResponse, UpstreamError, UpstreamTimeout
from chatqna.retrieval.remote import RemoteRetriever
from chatqna.upstream.client import UpstreamClient
from chatqna.upstream.decoding import DECODE_STEP_BYTES
from chatqna.upstream.policy import (
    ERROR_BODY_BYTES,
    HTTPStatusFailure,
    RetryPolicy,
    get_reply,
    is_retryable,
    post_json,
    raise_for_status,
    retry_after_seconds,
    translate_http_error,
    with_retries,
)
from chatqna.upstream.types import Reply
from tests.unit.backends.conftest import shape

pytestmark = pytest.mark.anyio

BASE = "http://upstream.test"
PARAMS = GenerationParams(max_tokens=8)
# An answer whose bound (`answer_bytes`, 64 MiB) leaves the stream's other limits to meet.
LONG = GenerationParams(max_tokens=32768)
MESSAGES = [{"role": "user", "content": "q"}]
EMBEDDINGS = {"data": [{"index": 0, "embedding": [3.0, 4.0]}]}


class Script:
    """A transport answering from a list, one entry per call; records the calls."""

    def __init__(self, *answers: httpx2.Response | Exception) -> None:
        self.answers = list(answers)
        self.calls: list[httpx2.Request] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.calls.append(request)
        answer = self.answers[min(len(self.calls), len(self.answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer

    @property
    def transport(self) -> httpx2.MockTransport:
        return httpx2.MockTransport(self)


class Waits:
    """Stands in for `asyncio.sleep`: remembers each wait instead of taking it."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.seconds.append(seconds)


def policy(attempts: int = 3, waits: Waits | None = None, jitter: float = 1.0) -> RetryPolicy:
    return RetryPolicy(
        attempts=attempts,
        backoff_seconds=0.2,
        sleep=waits if waits is not None else Waits(),
        jitter=lambda: jitter,
    )


async def post(script: Script, retry: RetryPolicy, timeout: float | None = None) -> Any:
    client = UpstreamClient(
        BASE, timeout_seconds=5, connect_timeout_seconds=1, transport=script.transport
    )
    try:
        return await post_json(
            client,
            "/v1/embeddings",
            {"input": "x"},
            backend="embedder",
            retry=retry,
            timeout_seconds=timeout,
        )
    finally:
        await client.aclose()


async def get(script: Script, retry: RetryPolicy) -> Reply:
    client = UpstreamClient(
        BASE, timeout_seconds=5, connect_timeout_seconds=1, transport=script.transport
    )
    try:
        return await get_reply(client, "/info", backend="embedder", retry=retry, timeout_seconds=5)
    finally:
        await client.aclose()


# --------------------------------------------------------------------------- the policy


def test_backoff_doubles_with_jitter_in_the_upper_half_and_is_capped() -> None:
    high = RetryPolicy(backoff_seconds=0.2, max_backoff_seconds=1.0, jitter=lambda: 1.0)
    low = RetryPolicy(backoff_seconds=0.2, max_backoff_seconds=1.0, jitter=lambda: 0.0)
    assert [high.delay(n) for n in (1, 2, 3, 4)] == pytest.approx([0.2, 0.4, 0.8, 1.0])
    assert [low.delay(n) for n in (1, 2, 3, 4)] == pytest.approx([0.1, 0.2, 0.4, 0.5])


@pytest.mark.parametrize("attempts", [0, -1])
def test_policy_needs_one_attempt(attempts: int) -> None:
    with pytest.raises(ValueError, match="attempts"):
        RetryPolicy(attempts=attempts)


def _status_error(status: int) -> httpx2.HTTPStatusError:
    request = httpx2.Request("POST", BASE)
    return httpx2.HTTPStatusError("x", request=request, response=httpx2.Response(status))


@pytest.mark.parametrize(
    ("exc", "retryable"),
    [
        (_status_error(500), True),
        (_status_error(503), True),
        (_status_error(429), True),
        (_status_error(400), False),
        (_status_error(404), False),
        (_status_error(422), False),
        (httpx2.ConnectError("refused"), True),
        (httpx2.ReadError("reset"), True),
        (httpx2.RemoteProtocolError("cut short"), True),
        (httpx2.ReadTimeout("slow"), True),
        (TimeoutError(), True),
        (httpx2.UnsupportedProtocol("ftp"), False),
        (ValueError("bad body"), False),
    ],
)
def test_what_is_retryable(exc: BaseException, retryable: bool) -> None:
    assert is_retryable(exc) is retryable


@pytest.mark.parametrize(
    ("exc", "expected", "named"),
    [
        (httpx2.ConnectTimeout("x"), UpstreamTimeout, "timed out"),
        (httpx2.ReadTimeout("x"), UpstreamTimeout, "timed out"),
        (httpx2.WriteTimeout("x"), UpstreamTimeout, "timed out"),
        (httpx2.PoolTimeout("x"), UpstreamTimeout, "timed out"),
        (httpx2.ConnectError("refused"), UpstreamError, "(ConnectError)"),
        (httpx2.ReadError("reset"), UpstreamError, "(ReadError)"),
        (httpx2.RemoteProtocolError("cut short"), UpstreamError, "(RemoteProtocolError)"),
    ],
)
def test_a_transport_failure_is_a_timeout_only_when_time_ran_out(
    exc: Exception, expected: type[Exception], named: str
) -> None:
    error = translate_http_error(exc, backend="embedder", what="POST /v1/embeddings")
    assert type(error) is expected
    assert named in str(error)
    assert is_retryable(exc)


# --------------------------------------------------------------------------- post_json


async def test_503_then_200_succeeds_on_the_second_attempt() -> None:
    script = Script(httpx2.Response(503), httpx2.Response(200, json=EMBEDDINGS))
    waits = Waits()
    body = await post(script, policy(waits=waits))
    assert body == EMBEDDINGS
    assert len(script.calls) == 2
    assert waits.seconds == pytest.approx([0.2])
    assert json.loads(script.calls[1].content) == {"input": "x"}  # the same request again


@pytest.mark.parametrize("status", [400, 401, 404, 413, 422])
async def test_a_4xx_is_not_retried(status: int) -> None:
    script = Script(httpx2.Response(status), httpx2.Response(200, json=EMBEDDINGS))
    waits = Waits()
    with pytest.raises(UpstreamError) as info:
        await post(script, policy(waits=waits))
    assert len(script.calls) == 1 and waits.seconds == []
    assert f"HTTP {status}" in info.value.message and "attempts" not in info.value.message


async def test_attempts_are_bounded_and_the_error_says_how_many() -> None:
    script = Script(httpx2.Response(503))
    waits = Waits()
    with pytest.raises(UpstreamError) as info:
        await post(script, policy(attempts=4, waits=waits))
    assert len(script.calls) == 4
    assert waits.seconds == pytest.approx([0.2, 0.4, 0.8])
    assert shape(info.value) == (502, "upstream_error", "embedder")
    assert info.value.message == (
        "embedder: POST /v1/embeddings returned HTTP 503 (after 4 attempts)"
    )


@pytest.mark.parametrize("status", [404, 405, 401])
async def test_a_get_answered_with_a_4xx_returns_it_without_a_retry(status: int) -> None:
    script = Script(httpx2.Response(status), httpx2.Response(200, json={}))
    waits = Waits()
    reply = await get(script, policy(waits=waits))
    assert reply.status == status and len(script.calls) == 1 and waits.seconds == []


@pytest.mark.parametrize("status", [429, 503])
async def test_a_get_retries_a_retryable_status_by_the_policy(status: int) -> None:
    script = Script(httpx2.Response(status), httpx2.Response(200, json={"model_id": "m"}))
    waits = Waits()
    reply = await get(script, policy(waits=waits))
    assert reply.status == 200 and reply.json() == {"model_id": "m"}
    assert [call.method for call in script.calls] == ["GET", "GET"]
    assert waits.seconds == pytest.approx([0.2])


async def test_a_get_that_spends_its_attempts_raises_the_typed_error() -> None:
    script = Script(httpx2.Response(503))
    with pytest.raises(UpstreamError) as info:
        await get(script, policy(attempts=2))
    assert len(script.calls) == 2
    assert info.value.message == "embedder: GET /info returned HTTP 503 (after 2 attempts)"


async def test_one_attempt_means_no_retry() -> None:
    script = Script(httpx2.Response(503), httpx2.Response(200, json=EMBEDDINGS))
    with pytest.raises(UpstreamError):
        await post(script, policy(attempts=1))
    assert len(script.calls) == 1


@pytest.mark.parametrize(
    "first",
    [
        httpx2.Response(429),
        httpx2.ConnectError("refused"),
        httpx2.ReadError("connection reset by peer"),
        httpx2.RemoteProtocolError("peer closed connection without sending complete body"),
        httpx2.ReadTimeout("slow"),
    ],
    ids=["429", "connect", "reset", "truncated", "read-timeout"],
)
async def test_transient_failures_are_retried(first: httpx2.Response | Exception) -> None:
    script = Script(first, httpx2.Response(200, json=EMBEDDINGS))
    assert await post(script, policy()) == EMBEDDINGS
    assert len(script.calls) == 2


async def test_a_body_larger_than_the_client_reads_is_a_bad_response_not_retried() -> None:
    script = Script(
        httpx2.Response(200, content=b" " * 2048), httpx2.Response(200, json=EMBEDDINGS)
    )
    client = UpstreamClient(
        BASE,
        timeout_seconds=5,
        connect_timeout_seconds=1,
        transport=script.transport,
        max_body_bytes=1024,
    )
    with pytest.raises(BadUpstreamResponse) as info:
        await post_json(client, "/v1/embeddings", {}, backend="embedder", retry=policy())
    await client.aclose()
    assert len(script.calls) == 1
    assert info.value.message == (
        "embedder: POST /v1/embeddings failed: the response body is larger than 1,024 bytes"
    )


async def test_a_malformed_body_is_not_retried() -> None:
    script = Script(httpx2.Response(200, text="{not json"), httpx2.Response(200, json=EMBEDDINGS))
    with pytest.raises(BadUpstreamResponse):
        await post(script, policy())
    assert len(script.calls) == 1


async def test_a_whole_call_bound_ends_a_body_that_never_ends() -> None:
    """Every chunk arrives in time, so only the whole-call bound can end this body."""
    opened: list[int] = []

    async def endless() -> AsyncIterator[bytes]:
        opened.append(1)
        yield b'{"data": ['
        while True:
            await asyncio.sleep(0.001)
            yield b" "

    calls: list[httpx2.Request] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        calls.append(request)
        return httpx2.Response(200, content=endless())

    client = UpstreamClient(
        BASE, timeout_seconds=5, connect_timeout_seconds=1, transport=httpx2.MockTransport(answer)
    )
    with pytest.raises(UpstreamTimeout) as info:
        await post_json(
            client,
            "/v1/embeddings",
            {"input": "x"},
            backend="embedder",
            retry=policy(attempts=2),
            timeout_seconds=0.05,
        )
    await client.aclose()
    assert len(calls) == len(opened) == 2
    assert info.value.message == "embedder: POST /v1/embeddings timed out (after 2 attempts)"


# --------------------------------------------------------------------------- Retry-After

NOW = datetime(2026, 5, 9, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("30", 30.0),
        (" 0 ", 0.0),
        ("Sat, 09 May 2026 12:00:45 GMT", 45.0),  # IMF-fixdate
        ("Saturday, 09-May-26 12:01:00 GMT", 60.0),  # RFC 850, obsolete but allowed
        ("Sat, 09 May 2026 12:00:10 -0000", 10.0),  # a zone parsed as "no zone": UTC
        ("Sat, 09 May 2026 11:00:00 GMT", 0.0),  # already past
        (None, None),
        ("", None),
        ("soon", None),
        ("-5", None),
        ("1.5", None),
        ("\u00b2", None),  # a digit to str.isdigit, not to RFC 9110
        ("Sat, 99 Foo 2026 12:00:00 GMT", None),
    ],
)
def test_retry_after_is_delay_seconds_or_an_http_date(
    value: str | None, seconds: float | None
) -> None:
    assert retry_after_seconds(value, NOW) == seconds


class Clock:
    """A monotonic clock that only moves when a wait is taken (the policy's `sleep`)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


def busy(status: int = 429, retry_after: str = "7") -> httpx2.Response:
    return httpx2.Response(status, headers={"Retry-After": retry_after}, json={"error": "busy"})


@pytest.mark.parametrize("status", [429, 503])
async def test_a_retry_waits_as_long_as_retry_after_asks(status: int) -> None:
    script = Script(busy(status, "7"), httpx2.Response(200, json=EMBEDDINGS))
    waits = Waits()
    assert await post(script, policy(waits=waits), timeout=30) == EMBEDDINGS
    assert len(script.calls) == 2 and waits.seconds == [7.0]


async def test_a_retry_after_given_as_an_http_date_is_waited_out() -> None:
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=20), usegmt=True)
    script = Script(busy(429, when), httpx2.Response(200, json=EMBEDDINGS))
    waits = Waits()
    assert await post(script, policy(waits=waits), timeout=30) == EMBEDDINGS
    assert len(waits.seconds) == 1 and 18.0 < waits.seconds[0] <= 20.0  # whole seconds


async def test_a_retry_after_http_date_is_counted_from_the_policy_s_wall_clock() -> None:
    """The wall clock moves with the waits taken: a second 429 naming the same date has
    nothing left to ask for, and the backoff applies."""
    clock = Clock()
    retry = RetryPolicy(
        attempts=3,
        sleep=clock.sleep,
        clock=clock,
        now=lambda: NOW + timedelta(seconds=clock.now),
        jitter=lambda: 1.0,
    )
    when = format_datetime(NOW + timedelta(seconds=20), usegmt=True)
    script = Script(busy(429, when), busy(429, when), httpx2.Response(200, json=EMBEDDINGS))
    assert await post(script, retry, timeout=30) == EMBEDDINGS
    assert clock.waits == [20.0, pytest.approx(0.4)]


@pytest.mark.parametrize("header", ["0", "soon", "-3", "1.5", "Tomorrow, 25:00"])
async def test_a_short_or_unreadable_retry_after_leaves_the_backoff(header: str) -> None:
    script = Script(busy(503, header), httpx2.Response(200, json=EMBEDDINGS))
    waits = Waits()
    assert await post(script, policy(waits=waits), timeout=30) == EMBEDDINGS
    assert waits.seconds == pytest.approx([0.2])


async def test_a_retry_after_past_the_deadline_fails_the_call_at_once() -> None:
    """Three attempts of 5 s: a retry must start within 10 s to end within 15 s."""
    script = Script(busy(429, "30"), httpx2.Response(200, json=EMBEDDINGS))
    waits = Waits()
    with pytest.raises(UpstreamError) as info:
        await post(script, policy(waits=waits), timeout=5)
    assert len(script.calls) == 1 and waits.seconds == []
    assert shape(info.value) == (502, "upstream_error", "embedder")
    assert info.value.message == (
        "embedder: POST /v1/embeddings returned HTTP 429 "
        "(Retry-After asks for 30 s, past the call's deadline)"
    )
    assert isinstance(info.value.__cause__, HTTPStatusFailure)


async def test_the_waits_already_taken_count_against_the_deadline() -> None:
    clock = Clock()
    retry = RetryPolicy(attempts=3, sleep=clock.sleep, clock=clock, jitter=lambda: 1.0)
    script = Script(busy(429, "6"), busy(429, "6"), httpx2.Response(200, json=EMBEDDINGS))
    with pytest.raises(UpstreamError) as info:
        await post(script, retry, timeout=5)
    assert len(script.calls) == 2 and clock.waits == [6.0]
    assert info.value.message.endswith(
        "(after 2 attempts; Retry-After asks for 6 s, past the call's deadline)"
    )


async def test_a_retry_after_longer_than_the_policy_waits_fails_the_call_at_once() -> None:
    script = Script(busy(503, "3600"), httpx2.Response(200, json=EMBEDDINGS))
    waits = Waits()
    with pytest.raises(UpstreamError) as info:
        await post(script, policy(waits=waits))  # no whole-call bound, so no deadline
    assert len(script.calls) == 1 and waits.seconds == []
    assert "Retry-After asks for 3600 s, more than the 60 s waited at most" in info.value.message


async def test_httpx_status_errors_carry_their_retry_after_too() -> None:
    """A caller that raises httpx2's own `HTTPStatusError` gets the same waits."""
    answers = [busy(429, "4"), httpx2.Response(200, content=b"{}")]
    waits = Waits()

    async def attempt() -> Reply:
        response = answers.pop(0)
        response.request = httpx2.Request("POST", BASE)
        response.raise_for_status()
        return Reply(response.status_code, response.content)

    reply = await with_retries(attempt, retry=policy(waits=waits), backend="embedder", what="x")
    assert reply.status == 200 and waits.seconds == [4.0]


async def test_a_retry_after_on_a_failure_not_retried_changes_nothing() -> None:
    script = Script(busy(400, "1"), httpx2.Response(200, json=EMBEDDINGS))
    with pytest.raises(UpstreamError) as info:
        await post(script, policy(), timeout=5)
    assert len(script.calls) == 1
    assert info.value.message == "embedder: POST /v1/embeddings returned HTTP 400"


# --------------------------------------------------------------------------- the clients


def candidates(n: int) -> list[ScoredChunk]:
    return [
        ScoredChunk(Chunk(id=f"c{i}", text=f"passage {i}", source="a.md", index=i), 1.0, {})
        for i in range(n)
    ]


ClientCall = Callable[[httpx2.MockTransport, RetryPolicy], Any]


async def _embed(transport: httpx2.MockTransport, retry: RetryPolicy) -> Any:
    client = TEIEmbedder(BASE, transport=transport, retry=retry)
    try:
        return await client.embed(["x"])
    finally:
        await client.aclose()


async def _rerank(transport: httpx2.MockTransport, retry: RetryPolicy) -> Any:
    client = TEIReranker(BASE, transport=transport, retry=retry)
    try:
        return await client.rerank("q", candidates(1), 1)
    finally:
        await client.aclose()


async def _search(transport: httpx2.MockTransport, retry: RetryPolicy) -> Any:
    client = RemoteRetriever(BASE, transport=transport, retry=retry)
    try:
        return await client.search(SearchQuery(text="q", embedding=[1.0, 0.0], k=2))
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    ("call", "good"),
    [
        (_embed, EMBEDDINGS),
        (_rerank, [{"index": 0, "score": 0.5}]),
        (_search, {"retrieved_docs": [{"id": "a", "text": "t", "score": 0.5}]}),
    ],
    ids=["embeddings", "rerank", "retrieval"],
)
async def test_idempotent_clients_retry_with_their_policy(call: ClientCall, good: Any) -> None:
    script = Script(httpx2.Response(503), httpx2.Response(200, json=good))
    result = await call(script.transport, policy())
    assert len(result) == 1 and len(script.calls) == 2


async def test_idempotent_clients_do_not_retry_by_default() -> None:
    script = Script(httpx2.Response(503), httpx2.Response(200, json=EMBEDDINGS))
    client = TEIEmbedder(BASE, transport=script.transport)
    with pytest.raises(UpstreamError):
        await client.embed(["x"])
    await client.aclose()
    assert len(script.calls) == 1


async def test_retriever_deletions_are_not_retried() -> None:
    script = Script(httpx2.Response(503), httpx2.Response(200, json={"removed_chunks": 1}))
    client = RemoteRetriever(BASE, transport=script.transport, retry=policy())
    with pytest.raises(UpstreamError):
        await client.delete_sources(["a.md"])
    await client.aclose()
    assert len(script.calls) == 1


# --------------------------------------------------------------------------- the chat LLM


def _chunk(text: str) -> bytes:
    body = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    return f"data: {json.dumps(body)}\n\n".encode()


async def test_chat_generation_is_not_retried() -> None:
    script = Script(httpx2.Response(503))
    llm = OpenAIChatLLM(BASE, "m", transport=script.transport)
    with pytest.raises(UpstreamError):
        async for _ in llm.stream(MESSAGES, PARAMS):
            pass
    with pytest.raises(UpstreamError):
        await llm.complete(MESSAGES, PARAMS)
    await llm.aclose()
    assert len(script.calls) == 2  # one per call, none repeated


class EndlessStream(httpx2.AsyncByteStream):
    """A streamed chat body that never ends; records whether the client closed it.

    `aclose` is what closing an `httpx2` response calls; on a real connection it is what
    tells the LLM server to stop generating.
    """

    def __init__(self) -> None:
        self.closed = False
        self.sent = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            yield _chunk("again ")
            self.sent += 1
            await asyncio.sleep(0.001)

    async def aclose(self) -> None:
        self.closed = True

    def transport(self) -> httpx2.MockTransport:
        return httpx2.MockTransport(lambda request: httpx2.Response(200, stream=self))


async def test_a_stream_that_never_ends_meets_the_generation_deadline() -> None:
    endless = EndlessStream()
    llm = OpenAIChatLLM(BASE, "m", generation_timeout_seconds=0.05, transport=endless.transport())
    seen = 0
    with pytest.raises(UpstreamTimeout) as info:
        async for _ in llm.stream(MESSAGES, PARAMS):
            seen += 1
    await llm.aclose()
    assert seen > 0 and endless.closed
    assert shape(info.value) == (504, "upstream_timeout", "llm")
    assert "longer than 0.05s" in info.value.message


async def test_a_stream_whose_reads_never_wait_meets_the_deadline_and_lets_others_run() -> None:
    async def flood() -> AsyncIterator[bytes]:
        while True:  # never awaits: every read is ready at once
            yield _chunk("again ")

    ticks = 0

    async def other_request() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    transport = httpx2.MockTransport(lambda request: httpx2.Response(200, content=flood()))
    llm = OpenAIChatLLM(BASE, "m", generation_timeout_seconds=0.05, transport=transport)
    other = asyncio.create_task(other_request())
    try:
        with pytest.raises(UpstreamTimeout):
            async for _ in llm.stream(MESSAGES, LONG):
                pass
    finally:
        other.cancel()
        await llm.aclose()
    assert ticks > 10


async def test_a_streamed_gzip_bomb_is_a_bad_response_and_never_holds_the_loop() -> None:
    bomb = gzip.compress(b"data: " + b"a" * (64 << 20))  # one read of 64 KiB: 64 MiB of line

    async def body() -> AsyncIterator[bytes]:
        yield bomb

    ticks = 0

    async def other_request() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    headers = {"Content-Encoding": "gzip"}
    transport = httpx2.MockTransport(
        lambda r: httpx2.Response(200, headers=headers, content=body())
    )
    llm = OpenAIChatLLM(BASE, "m", transport=transport)
    other = asyncio.create_task(other_request())
    try:
        with pytest.raises(BadUpstreamResponse, match="line is longer than 1048576 bytes"):
            async for _ in llm.stream(MESSAGES, LONG):
                pass
    finally:
        other.cancel()
        await llm.aclose()
    # The line limit stops the decoding after its first 1 MiB, in steps, others running.
    assert ticks >= 1 + (1 << 20) // DECODE_STEP_BYTES


@pytest.mark.parametrize(
    "body",
    [b"data: " + b"a" * (2 << 20), b": " + b"c" * (2 << 20) + b"\n"],
    ids=["unended-line", "long-comment"],
)
async def test_a_stream_line_past_the_limit_is_a_bad_response(body: bytes) -> None:
    transport = httpx2.MockTransport(lambda request: httpx2.Response(200, content=body))
    llm = OpenAIChatLLM(BASE, "m", transport=transport)
    with pytest.raises(BadUpstreamResponse) as info:
        async for _ in llm.stream(MESSAGES, LONG):
            pass
    await llm.aclose()
    assert info.value.message == "llm: an event-stream line is longer than 1048576 bytes"


async def test_a_streamed_error_answer_too_large_to_read_is_a_bad_response() -> None:
    answer = httpx2.Response(500, content=b"e" * (65 << 20))
    llm = OpenAIChatLLM(BASE, "m", transport=httpx2.MockTransport(lambda request: answer))
    with pytest.raises(BadUpstreamResponse, match="larger than 64 MiB"):
        async for _ in llm.stream(MESSAGES, PARAMS):
            pass
    await llm.aclose()


async def test_a_stalled_stream_meets_the_read_timeout() -> None:
    async def stalled() -> AsyncIterator[bytes]:
        yield _chunk("first")
        await asyncio.Event().wait()  # never set
        yield b""  # pragma: no cover

    transport = httpx2.MockTransport(lambda request: httpx2.Response(200, content=stalled()))
    llm = OpenAIChatLLM(BASE, "m", generation_timeout_seconds=0.05, transport=transport)
    with pytest.raises(UpstreamTimeout):
        async for _ in llm.stream(MESSAGES, PARAMS):
            pass
    await llm.aclose()


@pytest.fixture
def endless() -> Iterator[EndlessStream]:
    yield EndlessStream()


async def test_closing_the_stream_early_closes_the_upstream_response(
    endless: EndlessStream,
) -> None:
    llm = OpenAIChatLLM(BASE, "m", transport=endless.transport())
    stream = llm.stream(MESSAGES, PARAMS)
    assert (await anext(stream)).text == "again "
    assert not endless.closed
    await stream.aclose()  # what a disconnected client's response does
    assert endless.closed
    await llm.aclose()


async def test_cancelling_the_consumer_closes_the_upstream_response(
    endless: EndlessStream,
) -> None:
    llm = OpenAIChatLLM(BASE, "m", transport=endless.transport())

    async def consume() -> None:
        async for _ in llm.stream(MESSAGES, PARAMS):
            pass

    task = asyncio.create_task(consume())
    while endless.sent < 3:
        await asyncio.sleep(0.001)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert endless.closed
    await llm.aclose()


def test_an_error_status_keeps_the_start_of_what_the_upstream_said() -> None:
    assert raise_for_status(Reply(200, b"{}")) == Reply(200, b"{}")
    said = b'{"error": "' + b"x" * (2 * ERROR_BODY_BYTES) + b'"}'
    with pytest.raises(HTTPStatusFailure) as info:
        raise_for_status(Reply(400, said))
    assert info.value.status == 400 and info.value.body == said[:ERROR_BODY_BYTES]
