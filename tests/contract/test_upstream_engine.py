"""The upstream `Engine` contract, over the service's httptools engine and the httpx engine
the tests swap in (on httpx's own transport), against one loopback server: the same bytes
go out, the same replies and streams come back, and a failure is the same httpx exception."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import httpx
import pytest

from chatqna.backends.httptools_engine import HttptoolsEngine
from chatqna.backends.upstream import HttpxEngine
from chatqna.backends.upstream_types import Engine, Timeouts

pytestmark = pytest.mark.anyio

TIMEOUTS = Timeouts(read=0.5, connect=1.0)
HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}
PIECES = [b"data: a\n\n", b"data: b\n\n", b"data: [DONE]\n\n"]


async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Route by path: /json echoes the body, /busy is a 503, /stream is chunked SSE,
    /silent never answers, /short promises more body than it sends."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.lower().split(b"\r\n")
    sizes = [int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length:")]
    length = sizes[0] if sizes else 0
    body = await reader.readexactly(length)
    path = head.split(b" ")[1]
    if path == b"/json":
        echo = b'{"got":' + body + b"}"
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(echo), echo))
    elif path == b"/busy":
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy")
    elif path == b"/stream":
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for piece in PIECES:
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
    elif path == b"/silent":
        await reader.read()
    elif path == b"/short":
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{"cut":')
    await writer.drain()
    writer.close()


@pytest.fixture(scope="module")
async def base() -> AsyncIterator[str]:
    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    server.close()


@pytest.fixture(params=["httptools", "httpx"])
async def engine(request: pytest.FixtureRequest) -> AsyncIterator[Engine]:
    built: Engine = (
        HttptoolsEngine(TIMEOUTS)
        if request.param == "httptools"
        else HttpxEngine(httpx.AsyncHTTPTransport(), TIMEOUTS)
    )
    yield built
    await built.aclose()


async def test_a_json_call_returns_status_and_body_as_sent(engine: Engine, base: str) -> None:
    reply = await engine.send("POST", base + "/json", HEADERS, b'{"input":"q"}')
    assert reply.status == 200
    assert reply.json() == {"got": {"input": "q"}}


async def test_an_error_status_is_a_reply(engine: Engine, base: str) -> None:
    reply = await engine.send("POST", base + "/busy", HEADERS, b"{}")
    assert (reply.status, reply.body) == (503, b"busy")


async def test_a_stream_gives_the_whole_body_in_order(engine: Engine, base: str) -> None:
    stream = await engine.open("POST", base + "/stream", HEADERS, b"{}")
    try:
        assert stream.status == 200
        assert b"".join([chunk async for chunk in stream.chunks()]) == b"".join(PIECES)
    finally:
        await stream.aclose()


async def test_an_error_stream_can_be_read_at_once(engine: Engine, base: str) -> None:
    stream = await engine.open("POST", base + "/busy", HEADERS, b"{}")
    try:
        assert (stream.status, await stream.read()) == (503, b"busy")
    finally:
        await stream.aclose()


async def test_a_refused_connection_is_a_connect_error(engine: Engine) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(httpx.ConnectError):
        await engine.send("POST", f"http://127.0.0.1:{port}/json", HEADERS, b"{}")


async def test_a_silent_upstream_is_a_read_timeout(engine: Engine, base: str) -> None:
    with pytest.raises(httpx.ReadTimeout):
        await engine.send("POST", base + "/silent", HEADERS, b"{}")


async def test_a_body_cut_short_is_a_protocol_error(engine: Engine, base: str) -> None:
    with pytest.raises(httpx.RemoteProtocolError):
        await engine.send("POST", base + "/short", HEADERS, b"{}")
