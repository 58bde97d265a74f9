"""A connection goes back to httpcore2's pool the moment a body has been read to its end, and
the pool may hand it to the next call at once: whatever closes the finished response after
that must leave the connection to the call that now carries it. And a call cancelled at
any point (its deadline, a client that went away) gives its connection back or closes it:
a connection left neither would hold a pool slot for good. Real sockets on 127.0.0.1
(`tests.standins.hostile.running`), the calls made, or cancelled, in a chosen order, so no
timing decides.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from chatqna.backends.openai_chat import OpenAIChatLLM
from chatqna.backends.protocols import GenerationParams
from chatqna.errors import ChatQnAError
from chatqna.upstream.sessions import HttpxSession
from chatqna.upstream.types import Timeouts
from tests.standins.hostile import (
    answer_for,
    chunked,
    completion,
    read_request,
    running,
    sse_events,
)

pytestmark = pytest.mark.anyio

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunk(piece: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(piece), piece)


@dataclass
class HeldAnswers:
    """Keep-alive chunked answers: the first whole, in one write; every later one its head
    and first piece in one write (so the client holds that piece unread once it has the
    head), the rest only once `rest` is set."""

    rest: threading.Event = field(default_factory=threading.Event)
    connections: int = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        answered = 0
        try:
            while True:
                try:
                    await read_request(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                if answered == 0:
                    writer.write(HEAD + chunk(b"whole") + b"0\r\n\r\n")
                else:
                    writer.write(HEAD + chunk(b"first "))
                    await writer.drain()
                    await asyncio.to_thread(self.rest.wait, 10)
                    writer.write(chunk(b"second") + b"0\r\n\r\n")
                await writer.drain()
                answered += 1
        finally:
            writer.close()


async def test_closing_a_stream_after_its_connection_went_back_to_the_pool_leaves_it_alone() -> (
    None
):
    """The interleaving behind the load test's `ReadError`s: a stream read to its end (its
    connection back in the pool), the next call sent on that connection and its first bytes
    arrived, and only then the first stream closed. The second call still reads its whole
    answer, on the one connection."""
    upstream = HeldAnswers()
    with running(upstream) as url:
        session = HttpxSession(url, Timeouts(read=5, connect=1))
        try:
            first = await session.open("POST", f"{url}/v1/chat/completions", {}, b"{}")
            assert [piece async for piece in first.chunks()] == [b"whole"]
            second = await session.open("POST", f"{url}/v1/chat/completions", {}, b"{}")
            await first.aclose()
            upstream.rest.set()
            try:
                assert await second.read() == b"first second"
            finally:
                await second.aclose()
        finally:
            upstream.rest.set()
            await session.aclose()
    assert upstream.connections == 1


@dataclass
class WholeAnswers:
    """Keep-alive answers, each written whole, in one write, as soon as it is asked for, so
    where a call is cancelled depends only on the turns of the client's event loop: a
    completion, or a stream's events and its end. One asked about `ask-cut` is cut short
    by a reset of the connection instead, after its first event or its first byte."""

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    _, _, body = await read_request(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                events = sse_events(answer_for(body))
                if json.loads(body).get("stream"):
                    answer = HEAD + b"".join(map(chunked, events)) + b"0\r\n\r\n"
                    cut = len(HEAD + chunked(events[0]))
                else:
                    content = completion(answer_for(body))
                    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(content)
                    answer, cut = answer + content, len(answer) + 1
                if b"ask-cut" in body:
                    writer.write(answer[:cut])
                    await writer.drain()
                    writer.transport.abort()
                    return
                writer.write(answer)
                await writer.drain()
        finally:
            writer.close()


async def streamed(llm: OpenAIChatLLM, marker: str) -> str:
    messages = [{"role": "user", "content": f"ask-{marker}"}]
    return "".join([delta.text async for delta in llm.stream(messages, GenerationParams())])


async def complete(llm: OpenAIChatLLM, marker: str) -> str:
    messages = [{"role": "user", "content": f"ask-{marker}"}]
    return (await llm.complete(messages, GenerationParams())).text


ANSWERS = {"streamed": streamed, "whole": complete}


async def cancelled_at_every_step(
    call: Callable[[], Awaitable[object]], after: Callable[[], Awaitable[None]]
) -> int:
    """Start `call` and cancel it after 0, 1, 2, ... turns of the event loop, awaiting
    `after()` past each, until a call is over before its cancellation; how many were
    cancelled."""
    steps = 0
    while True:
        task = asyncio.ensure_future(call())
        for _ in range(steps):
            await asyncio.sleep(0)
        if task.done():
            with contextlib.suppress(ChatQnAError):
                task.result()
            return steps
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, ChatQnAError):
            await task
        await after()
        steps += 1


@pytest.mark.parametrize(
    ("kind", "marker"),
    [("streamed", "alpha"), ("whole", "alpha"), ("whole", "cut")],
    ids=["streamed", "whole", "whole-reset-mid-body"],
)
async def test_a_call_cancelled_at_any_step_leaves_its_pool_slot_free(
    monkeypatch: pytest.MonkeyPatch, kind: str, marker: str
) -> None:
    """With a pool of one connection, a call is cancelled at every step of its way in turn
    (while connecting, sending, reading, waiting for the body's end, closing), as its
    deadline or a client that went away cancels it; after each, the next call gets the one
    connection, and its answer, instead of waiting for a slot until it times out."""
    monkeypatch.setattr("chatqna.upstream.sessions.MAX_CONNECTIONS", 1)
    answer = ANSWERS[kind]
    with running(WholeAnswers()) as url:
        llm = OpenAIChatLLM(url, "whole", timeout_seconds=1, connect_timeout_seconds=1)

        async def next_call_is_answered() -> None:
            assert (await answer(llm, "next")).strip() == "Answer for next."

        try:
            for _ in range(3):
                cancelled = await cancelled_at_every_step(
                    lambda: answer(llm, marker), next_call_is_answered
                )
                assert cancelled > 3  # the steps of a call's way, not only its start
        finally:
            await llm.aclose()
