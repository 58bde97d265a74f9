"""A connection goes back to httpcore2's pool the moment a body has been read to its end, and
the pool may hand it to the next call at once: whatever closes the finished response after
that must leave the connection to the call that now carries it. Real sockets on 127.0.0.1
(`tests.standins.hostile.running`), the calls made in a chosen order, so no timing decides.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

import pytest

from chatqna.upstream.sessions import HttpxSession
from chatqna.upstream.types import Timeouts
from tests.standins.hostile import read_request, running

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
