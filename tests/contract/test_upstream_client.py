"""The upstream client's contract on its real transport (httpx-aiohttp's), against one
loopback server: the bytes go out as sent, replies and streams come back whole and in order,
and each failure is an httpx exception that `chatqna.upstream.policy` retries and translates
to the right typed error (a refused connection is not a timeout)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import aiohttp
import httpx
import pytest

from chatqna.errors import UpstreamError, UpstreamTimeout
from chatqna.upstream.client import UpstreamClient
from chatqna.upstream.policy import is_retryable, translate_http_error

pytestmark = pytest.mark.anyio

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


def client(base: str) -> UpstreamClient:
    return UpstreamClient(base, timeout_seconds=0.5, connect_timeout_seconds=1.0)


@pytest.fixture
async def upstream(base: str) -> AsyncIterator[UpstreamClient]:
    built = client(base)
    yield built
    await built.aclose()


async def test_a_json_call_returns_status_and_body_as_sent(upstream: UpstreamClient) -> None:
    reply = await upstream.post("/json", {"input": "q"})
    assert reply.status == 200
    assert reply.json() == {"got": {"input": "q"}}


async def test_an_error_status_is_a_reply(upstream: UpstreamClient) -> None:
    reply = await upstream.post("/busy", {})
    assert (reply.status, reply.body) == (503, b"busy")


async def test_a_stream_gives_the_whole_body_in_order(upstream: UpstreamClient) -> None:
    stream = await upstream.open_stream("/stream", {})
    try:
        assert stream.status == 200
        assert b"".join([chunk async for chunk in stream.chunks()]) == b"".join(PIECES)
    finally:
        await stream.aclose()


async def test_an_error_stream_can_be_read_at_once(upstream: UpstreamClient) -> None:
    stream = await upstream.open_stream("/busy", {})
    try:
        assert (stream.status, await stream.read()) == (503, b"busy")
    finally:
        await stream.aclose()


async def test_a_refused_connection_is_a_retryable_upstream_error_not_a_timeout() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    refused = client(f"http://127.0.0.1:{port}")
    try:
        # httpx-aiohttp reports it as a ConnectTimeout, aiohttp's own error as the cause.
        with pytest.raises(httpx.TransportError) as caught:
            await refused.post("/json", {})
    finally:
        await refused.aclose()
    assert isinstance(caught.value.__cause__, aiohttp.ClientConnectorError)
    assert is_retryable(caught.value)
    error = translate_http_error(caught.value, backend="llm", what="POST /json")
    assert type(error) is UpstreamError and error.status_code == 502
    assert "(ClientConnectorError)" in str(error)


async def test_a_silent_upstream_is_a_read_timeout(upstream: UpstreamClient) -> None:
    with pytest.raises(httpx.ReadTimeout) as caught:
        await upstream.post("/silent", {})
    error = translate_http_error(caught.value, backend="llm", what="POST /silent")
    assert type(error) is UpstreamTimeout and error.status_code == 504


async def test_a_body_cut_short_is_a_read_error(upstream: UpstreamClient) -> None:
    with pytest.raises(httpx.ReadError) as caught:
        await upstream.post("/short", {})
    assert is_retryable(caught.value)
    error = translate_http_error(caught.value, backend="llm", what="POST /short")
    assert type(error) is UpstreamError and error.status_code == 502
