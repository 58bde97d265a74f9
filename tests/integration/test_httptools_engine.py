"""The upstream clients' httptools engine against a loopback server scripted byte by byte:
framing (length, chunked, until close), keep-alive reuse, the pool's bounds, early closes,
and each failure as the httpx exception `chatqna.backends.http` retries and translates."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Awaitable, Callable

import httpx
import pytest

from chatqna.backends import httptools_engine
from chatqna.backends.httptools_engine import HttptoolsEngine
from chatqna.backends.upstream import UpstreamClient
from chatqna.backends.upstream_types import Timeouts

pytestmark = pytest.mark.anyio

Handler = Callable[[bytes, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]
JSON = {"Content-Type": "application/json"}


async def read_request(reader: asyncio.StreamReader) -> bytes | None:
    """One request (head and Content-Length body), or None at the end of the connection."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + await reader.readexactly(length)


class Scripted:
    """A server answering each request with `handler`; counts connections and requests."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while (request := await read_request(reader)) is not None:
                self.requests.append(request)
                if not await self.handler(request, reader, writer):
                    break
        finally:
            writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()


def reply(body: bytes, status: str = "200 OK", extra: bytes = b"") -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n".encode()
    return head + extra + b"\r\n" + body


def answering(*responses: bytes) -> Handler:
    async def handle(request: bytes, _: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        for response in responses:
            writer.write(response)
            await writer.drain()
        return True

    return handle


def client(url: str, read: float = 2.0) -> UpstreamClient:
    return UpstreamClient(url, timeout_seconds=read, connect_timeout_seconds=1.0)


async def test_a_json_call_keeps_its_connection_for_the_next() -> None:
    server = Scripted(answering(reply(b'{"ok": 1}')))
    async with server as url:
        upstream = client(url + "/base")
        first = await upstream.post("/v1/embeddings", {"input": "q"})
        second = await upstream.get("/health")
        await upstream.aclose()
    assert (first.status, first.json(), second.status) == (200, {"ok": 1}, 200)
    assert server.connections == 1
    post, get = server.requests
    assert post.startswith(b"POST /base/v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"Content-Type: application/json" in post and post.endswith(b'{"input":"q"}')
    assert b"Content-Length: 13" in post
    assert get.startswith(b"GET /base/health HTTP/1.1") and b"Content-Length" not in get


async def test_a_chunked_stream_arrives_chunk_by_chunk_and_the_connection_is_reused() -> None:
    async def chunked(request: bytes, _: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for piece in (b"data: a\n\n", b"data: b\n\n"):
            w.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            await w.drain()
            await asyncio.sleep(0.02)
        w.write(b"0\r\n\r\n")
        return True

    server = Scripted(chunked)
    async with server as url:
        upstream = client(url)
        for _ in range(2):
            stream = await upstream.open_stream("/v1/chat/completions", {"stream": True})
            assert stream.status == 200
            assert [chunk async for chunk in stream.chunks()] == [b"data: a\n\n", b"data: b\n\n"]
            await stream.aclose()
        await upstream.aclose()
    assert server.connections == 1
    assert b"Accept: text/event-stream" in server.requests[0]


async def test_a_body_until_close_and_connection_close_are_not_reused() -> None:
    async def until_close(request: bytes, _: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n[1, 2]")
        return False

    server = Scripted(until_close)
    async with server as url:
        upstream = client(url)
        assert (await upstream.post("/rerank", {})).json() == [1, 2]
        assert (await upstream.post("/rerank", {})).json() == [1, 2]
        await upstream.aclose()
    assert server.connections == 2


async def test_an_error_status_is_a_reply_not_an_exception() -> None:
    async with Scripted(answering(reply(b"busy", "503 Service Unavailable"))) as url:
        upstream = client(url)
        answer = await upstream.post("/rerank", {})
        await upstream.aclose()
    assert (answer.status, answer.body) == (503, b"busy")


async def test_a_stream_closed_early_closes_its_connection() -> None:
    finished = asyncio.Event()

    async def endless(request: bytes, _: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        try:
            while True:
                w.write(b"9\r\ndata: x\n\n\r\n")
                await w.drain()
                await asyncio.sleep(0.01)
        except ConnectionError:
            finished.set()
            return False

    server = Scripted(endless)
    async with server as url:
        upstream = client(url)
        stream = await upstream.open_stream("/v1/chat/completions", {})
        async for _ in stream.chunks():
            break
        await stream.aclose()
        await asyncio.wait_for(finished.wait(), 5)  # the server saw the connection go
        await upstream.aclose()
    assert server.connections == 1


async def test_a_refused_connection_is_a_connect_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    upstream = client(f"http://127.0.0.1:{port}")
    with pytest.raises(httpx.ConnectError):
        await upstream.post("/v1/embeddings", {})


async def test_a_silent_upstream_meets_the_read_bound() -> None:
    async def silent(request: bytes, reader: asyncio.StreamReader, _: asyncio.StreamWriter) -> bool:
        await reader.read()  # never answers
        return False

    async with Scripted(silent) as url:
        upstream = client(url, read=0.2)
        with pytest.raises(httpx.ReadTimeout):
            await upstream.post("/v1/embeddings", {})
        await upstream.aclose()


async def test_a_stalled_stream_meets_the_read_bound_between_chunks() -> None:
    async def stalls(request: bytes, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: x\n\n\r\n")
        await reader.read()
        return False

    async with Scripted(stalls) as url:
        upstream = client(url, read=0.2)
        stream = await upstream.open_stream("/v1/chat/completions", {})
        reads = stream.chunks()
        assert await anext(reads) == b"data: x\n\n"
        with pytest.raises(httpx.ReadTimeout):
            await anext(reads)
        await stream.aclose()
        await upstream.aclose()


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (b'HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{"a"', httpx.RemoteProtocolError),
        (b"this is not HTTP at all\r\n\r\n", httpx.RemoteProtocolError),
        (None, httpx.ReadError),  # reset
    ],
    ids=["cut-short", "not-http", "reset"],
)
async def test_broken_answers_are_the_matching_httpx_errors(
    answer: bytes | None, expected: type[httpx.HTTPError]
) -> None:
    async def broken(request: bytes, _: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        if answer is None:
            sock = w.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            w.write(answer)
            await w.drain()
        return False

    async with Scripted(broken) as url:
        upstream = client(url)
        with pytest.raises(expected):
            await upstream.post("/v1/embeddings", {})
        await upstream.aclose()


async def test_idle_connections_expire_before_the_upstream_closes_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(httptools_engine, "KEEPALIVE_SECONDS", 0.05)
    server = Scripted(answering(reply(b"{}")))
    async with server as url:
        upstream = client(url)
        await upstream.get("/a")
        await asyncio.sleep(0.1)
        await upstream.get("/b")
        await upstream.aclose()
    assert server.connections == 2


async def test_the_pool_bounds_connections_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(httptools_engine, "MAX_CONNECTIONS", 2)
    in_flight = 0
    most = 0

    async def slow(request: bytes, _: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.05)
        in_flight -= 1
        w.write(reply(b"{}"))
        return True

    server = Scripted(slow)
    async with server as url:
        upstream = client(url)
        replies = await asyncio.gather(*(upstream.get(f"/{i}") for i in range(6)))
        await upstream.aclose()
    assert [r.status for r in replies] == [200] * 6
    assert most == 2 and server.connections == 2


async def test_a_cancelled_call_frees_its_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(httptools_engine, "MAX_CONNECTIONS", 1)
    release = asyncio.Event()

    async def held(request: bytes, _: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        if b"/first" in request:
            await release.wait()
        w.write(reply(b"{}"))
        return False

    async with Scripted(held) as url:
        upstream = client(url)
        first = asyncio.ensure_future(upstream.get("/first"))
        await asyncio.sleep(0.05)
        first.cancel()
        answer = await asyncio.wait_for(upstream.get("/second"), 2)
        release.set()
        await upstream.aclose()
    assert answer.status == 200


def test_urls_other_than_http_are_refused() -> None:
    engine = HttptoolsEngine(Timeouts(read=1, connect=1))
    with pytest.raises(httpx.UnsupportedProtocol):
        engine._target("ftp://files.test/x")


async def test_https_upstreams_get_a_tls_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}

    async def fake_connection(factory: object, host: str, port: int, ssl: object) -> object:
        seen.update(host=host, port=port, ssl=ssl)
        raise OSError("no TLS server here")

    engine = HttptoolsEngine(Timeouts(read=1, connect=1))
    loop = asyncio.get_running_loop()
    monkeypatch.setattr(loop, "create_connection", fake_connection)
    with pytest.raises(httpx.ConnectError):
        await engine.send("GET", "https://llm.test/v1/models", {}, None)
    assert seen["host"] == "llm.test" and seen["port"] == 443 and seen["ssl"] is not None
