"""The upstream client's contract on real sockets, against one loopback server, over the
transport the service sends through (httpx2's own): the request on the wire is the one a
`httpx2.MockTransport` sees in the unit tests; replies and streams come back whole, in order
and decoded (gzip), past an interim `103`, and a body is read no further than its limit;
proxies from the environment are used unless `NO_PROXY` exempts the upstream; and each
failure is an exception that `chatqna.upstream.policy` retries and translates to a typed
error (a refused connection is not a timeout)."""

from __future__ import annotations

import asyncio
import gzip
import socket
from collections.abc import AsyncIterator

import httpx2
import pytest

from chatqna.errors import UpstreamError, UpstreamTimeout
from chatqna.upstream.client import UpstreamClient
from chatqna.upstream.policy import is_retryable, timed_out, translate_http_error
from chatqna.upstream.types import ResponseTooLarge
from tests.standins.hostile import ForwardProxy, Socks5Proxy, running

pytestmark = pytest.mark.anyio

PIECES = [b"data: a\n\n", b"data: b\n\n", b"data: [DONE]\n\n"]
BOMB = gzip.compress(b" " * (8 << 20))  # 8 MiB of spaces, 8 KiB on the wire
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")
SEEN: list[bytes] = []  # the request heads the server read, newest last


async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One request per connection (each answer says `Connection: close`). Route by path:
    /json echoes the body, /busy is a 503 with `Retry-After`, /stream is chunked SSE,
    /silent never answers, /short promises more body than it sends, /hints sends a
    `103 Early Hints` first, /gzip and /gzip-stream gzip their bodies, /bomb is a small
    gzip body that decodes to 8 MiB."""
    head = await reader.readuntil(b"\r\n\r\n")
    SEEN.append(head)
    lines = head.lower().split(b"\r\n")
    sizes = [int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length:")]
    length = sizes[0] if sizes else 0
    body = await reader.readexactly(length)
    path = head.split(b" ")[1]
    if path == b"/json":
        echo = b'{"got":' + body + b"}"
        writer.write(
            b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
            % (len(echo), echo)
        )
    elif path == b"/hints":
        writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n")
        writer.write(b'HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 9\r\n\r\n{"ok": 1}')
    elif path == b"/gzip":
        packed = gzip.compress(b'{"packed": true}')
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Encoding: gzip\r\n")
        writer.write(b"Content-Length: %d\r\n\r\n%s" % (len(packed), packed))
    elif path == b"/gzip-stream":
        packed = gzip.compress(b"".join(PIECES))
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Encoding: gzip\r\n")
        writer.write(b"Transfer-Encoding: chunked\r\n\r\n")
        for start in range(0, len(packed), 16):
            piece = packed[start : start + 16]
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
    elif path == b"/bomb":
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Encoding: gzip\r\n")
        writer.write(b"Content-Length: %d\r\n\r\n%s" % (len(BOMB), BOMB))
    elif path == b"/busy":
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n")
        writer.write(b"Retry-After: 30\r\nContent-Length: 4\r\n\r\nbusy")
    elif path == b"/stream":
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n")
        for piece in PIECES:
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
    elif path == b"/silent":
        await reader.read()
    elif path == b"/short":
        writer.write(b'HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 50\r\n\r\n{"cut":')
    await writer.drain()
    writer.close()


@pytest.fixture(scope="module")
async def base() -> AsyncIterator[str]:
    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    server.close()


@pytest.fixture(autouse=True)
def _no_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls go straight to the loopback server unless a test names a proxy."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


def client(base: str, transport: httpx2.AsyncBaseTransport | None = None) -> UpstreamClient:
    return UpstreamClient(
        base,
        timeout_seconds=0.5,
        connect_timeout_seconds=1.0,
        transport=transport,
        max_body_bytes=1 << 20,
    )


@pytest.fixture
async def upstream(base: str) -> AsyncIterator[UpstreamClient]:
    built = client(base)
    yield built
    await built.aclose()


WIRE_HEADERS = ("content-type", "accept", "content-length", "authorization")
WIRE_HEADERS_B = tuple(name.encode() for name in WIRE_HEADERS)


def request_head(head: bytes) -> tuple[bytes, dict[bytes, bytes]]:
    """The request line and the headers that say what is sent (lower-case names)."""
    line, *fields = head.rstrip(b"\r\n").split(b"\r\n")
    pairs = [field.split(b": ", 1) for field in fields]
    named = {name.lower(): value for name, value in pairs}
    return line, {name: named[name] for name in WIRE_HEADERS_B if name in named}


async def test_the_wire_gets_the_request_a_mock_transport_sees(base: str) -> None:
    """What the unit tests read off a `MockTransport` is what the service puts on the wire."""
    with_credentials = base.replace("http://", "http://u:p%40ss@")
    real = client(with_credentials)
    try:
        await real.post("/json", {"input": ["q"]})
    finally:
        await real.aclose()
    line, named = request_head(SEEN[-1])
    seen: list[httpx2.Request] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return httpx2.Response(200, json={})

    mocked = client(with_credentials, httpx2.MockTransport(answer))
    try:
        await mocked.post("/json", {"input": ["q"]})
    finally:
        await mocked.aclose()
    (request,) = seen
    assert line == f"{request.method} {request.url.raw_path.decode()} HTTP/1.1".encode()
    assert named == {name.encode(): request.headers[name].encode() for name in WIRE_HEADERS}
    assert line == b"POST /json HTTP/1.1"
    assert named[b"content-type"] == b"application/json"
    assert named[b"content-length"] == b"15"
    assert named[b"authorization"] == b"Basic dTpwQHNz"  # u:p@ss


async def test_an_interim_response_is_read_past(upstream: UpstreamClient) -> None:
    reply = await upstream.post("/hints", {})
    assert (reply.status, reply.json()) == (200, {"ok": 1})


async def test_gzip_bodies_come_back_decoded_whole_and_streamed(upstream: UpstreamClient) -> None:
    assert (await upstream.post("/gzip", {})).json() == {"packed": True}
    stream = await upstream.open_stream("/gzip-stream", {})
    try:
        assert b"".join([chunk async for chunk in stream.chunks()]) == b"".join(PIECES)
    finally:
        await stream.aclose()


async def test_a_json_call_returns_status_and_body_as_sent(upstream: UpstreamClient) -> None:
    reply = await upstream.post("/json", {"input": "q"})
    assert reply.status == 200
    assert reply.json() == {"got": {"input": "q"}}


async def test_an_error_status_is_a_reply_with_its_retry_after(upstream: UpstreamClient) -> None:
    reply = await upstream.post("/busy", {})
    assert (reply.status, reply.body, reply.retry_after) == (503, b"busy", "30")


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


async def test_a_body_that_decodes_past_the_limit_is_refused(upstream: UpstreamClient) -> None:
    with pytest.raises(ResponseTooLarge):
        await upstream.post("/bomb", {})


async def test_a_call_s_own_body_limit_bounds_its_answer(upstream: UpstreamClient) -> None:
    payload = {"input": "q" * 100}
    with pytest.raises(ResponseTooLarge) as info:
        await upstream.post("/json", payload, max_body_bytes=64)
    assert info.value.limit == 64
    reply = await upstream.post("/json", payload, max_body_bytes=1024)
    assert reply.json() == {"got": payload}


async def test_a_call_s_body_limit_never_lifts_the_client_s(upstream: UpstreamClient) -> None:
    with pytest.raises(ResponseTooLarge) as info:
        await upstream.post("/bomb", {}, max_body_bytes=1 << 30)
    assert info.value.limit == 1 << 20


async def test_the_proxy_in_the_environment_carries_the_call(
    base: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = ForwardProxy()
    with running(proxy) as proxy_url:
        monkeypatch.setenv("HTTP_PROXY", proxy_url)
        proxied = client(base)
        try:
            assert (await proxied.post("/json", {"q": 1})).json() == {"got": {"q": 1}}
        finally:
            await proxied.aclose()
    assert proxy.seen == [f"POST {base}/json HTTP/1.1".encode()]


async def test_a_socks_proxy_in_the_environment_carries_the_call(
    base: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = Socks5Proxy()
    with running(proxy) as proxy_url:
        monkeypatch.setenv("ALL_PROXY", proxy_url.replace("http://", "socks5://"))
        proxied = client(base)
        try:
            assert (await proxied.post("/json", {"q": 3})).json() == {"got": {"q": 3}}
        finally:
            await proxied.aclose()
    host, _, port = base.removeprefix("http://").partition(":")
    assert proxy.seen == [(host, int(port))]


async def test_no_proxy_exempts_the_upstream(base: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as probe:  # a proxy that is not there: using it would fail
        probe.bind(("127.0.0.1", 0))
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{probe.getsockname()[1]}")
    monkeypatch.setenv("NO_PROXY", "localhost,127.0.0.1")
    direct = client(base)
    try:
        assert (await direct.post("/json", {"q": 2})).json() == {"got": {"q": 2}}
    finally:
        await direct.aclose()


async def test_a_refused_connection_is_a_retryable_upstream_error_not_a_timeout() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    refused = client(f"http://127.0.0.1:{port}")
    try:
        with pytest.raises(httpx2.ConnectError) as caught:
            await refused.post("/json", {})
    finally:
        await refused.aclose()
    assert is_retryable(caught.value) and not timed_out(caught.value)
    error = translate_http_error(caught.value, backend="llm", what="POST /json")
    assert type(error) is UpstreamError and error.status_code == 502
    assert "(ConnectError)" in str(error)


async def test_a_silent_upstream_is_a_read_timeout(upstream: UpstreamClient) -> None:
    with pytest.raises(httpx2.ReadTimeout) as caught:
        await upstream.post("/silent", {})
    error = translate_http_error(caught.value, backend="llm", what="POST /silent")
    assert type(error) is UpstreamTimeout and error.status_code == 504


async def test_a_body_cut_short_is_a_retryable_error(upstream: UpstreamClient) -> None:
    with pytest.raises(httpx2.RemoteProtocolError) as caught:
        await upstream.post("/short", {})
    assert is_retryable(caught.value)
    error = translate_http_error(caught.value, backend="llm", what="POST /short")
    assert type(error) is UpstreamError and error.status_code == 502
