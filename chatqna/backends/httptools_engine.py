"""The upstream clients' default engine: HTTP/1.1 keep-alive connections parsed by httptools.

Each connection is an `asyncio.Protocol` whose responses are parsed by httptools (the
compiled llhttp parser uvicorn uses); a request is one write of its head and body. An
upstream keeps a pool of idle connections (last used first, dropped after
`KEEPALIVE_SECONDS` idle, before a uvicorn-style upstream's 5 s keep-alive closes them
under a request) and at most `MAX_CONNECTIONS` open. Measured per embeddings call on the
stand-ins, with the JSON handling around it, it costs the caller about 90 µs of CPU against
about 280 µs for an `aiohttp.ClientSession` and 1.1 ms for httpx
(`tests/rag-benchmarks/http_client_cost.py`); the four calls of a chat turn were the
largest part of the service's CPU per request.

Bounds: `Timeouts.read` for a free connection of the pool and for every wait on the
upstream (the response head, then each chunk of the body), `Timeouts.connect` for opening a
connection; the callers bound whole calls. Failures are the httpx exceptions httpx raises
for the same event, so `chatqna.backends.http` retries and translates one tree: a refused
or unreachable upstream is a `ConnectError` (`ConnectTimeout` past the bound), a reset a
`ReadError`, a connection closed before the response ended or bytes that are not HTTP a
`RemoteProtocolError`, a wait past the read bound a `ReadTimeout`. A connection that was
not read to the end is closed, never reused: closing a stream early ends the upstream's
work (a generation).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from urllib.parse import urlsplit

import httptools
import httpx

from chatqna.backends.upstream_types import Reply, StreamReply, Timeouts

MAX_CONNECTIONS = 100  # per upstream
KEEPALIVE_SECONDS = 3.0


class _Connection(asyncio.Protocol):
    """One connection: at most one request in flight, its response fed to the waiters."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers_done = False
        self.framed = False  # a Content-Length or chunked body; otherwise it ends at close
        self.complete = False
        self.reusable = False
        self.lost = False
        self.idle_since = 0.0
        self._chunks: list[bytes] = []
        self._waiter: asyncio.Future[None] | None = None
        self._error: Exception | None = None

    # --- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"malformed HTTP response: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.reusable = False
        if self.headers_done and not self.framed and exc is None and not self.complete:
            self.complete = True  # a body without framing ends with the connection
            self._wake()
        if self.complete:
            return
        if isinstance(exc, ConnectionResetError):
            self._fail(httpx.ReadError(f"connection reset: {exc}"))
        else:
            self._fail(httpx.RemoteProtocolError("connection closed before the response ended"))

    # --- httptools callbacks ------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-length" or (
            name == b"transfer-encoding" and b"chunked" in value.lower()
        ):
            self.framed = True

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self.reusable = self.parser.should_keep_alive()
        self._wake()

    # --- the client's side --------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: Exception) -> None:
        if self._error is None:
            self._error = error
        self._wake()

    def begin(self, request: bytes) -> None:
        assert self.transport is not None
        self.status, self.headers_done, self.framed = 0, False, False
        self.complete = self.reusable = False
        self._chunks, self._error = [], None
        self.transport.write(request)

    async def wait(self, read_timeout: float) -> None:
        """Until something arrives (or the connection fails or the read bound passes)."""
        if self._error is not None:
            raise self._error
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(read_timeout):
                await self._waiter
        except TimeoutError:
            self.close()
            raise httpx.ReadTimeout(f"no response within {read_timeout}s") from None
        finally:
            self._waiter = None
        if self._error is not None:
            raise self._error

    def take(self) -> bytes:
        chunks, self._chunks = self._chunks, []
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def has_data(self) -> bool:
        return bool(self._chunks)

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None and not self.lost:
            self.transport.close()


class _Stream:
    """A streamed response on a connection held until `aclose`."""

    def __init__(self, engine: HttptoolsEngine, connection: _Connection, read: float):
        self._engine = engine
        self._connection = connection
        self._read = read
        self.status = connection.status
        self._released = False

    async def chunks(self) -> AsyncIterator[bytes]:
        connection = self._connection
        while True:
            if connection.has_data():
                yield connection.take()
            elif connection.complete:
                return
            else:
                await connection.wait(self._read)

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    async def aclose(self) -> None:
        if not self._released:
            self._released = True
            self._engine.release(self._connection)


class HttptoolsEngine:
    """The connections to one upstream (one scheme, host and port)."""

    def __init__(self, timeouts: Timeouts) -> None:
        self._timeouts = timeouts
        self._idle: list[_Connection] = []
        self._slots: asyncio.Semaphore | None = None
        self._ssl: ssl.SSLContext | None = None
        self._heads: dict[str, tuple[str, int, bool, bytes, bytes]] = {}

    def _target(self, url: str) -> tuple[str, int, bool, bytes, bytes]:
        """Host, port, TLS, the request line's target and the Host header, per URL."""
        known = self._heads.get(url)
        if known is None:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise httpx.UnsupportedProtocol(f"not an http(s) URL: {url!r}")
            tls = parts.scheme == "https"
            port = parts.port or (443 if tls else 80)
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
            default = port == (443 if tls else 80)
            host_header = host if default else f"{host}:{port}"
            known = (parts.hostname, port, tls, target.encode(), host_header.encode())
            if len(self._heads) < 64:
                self._heads[url] = known
        return known

    async def _connect(self, host: str, port: int, tls: bool) -> _Connection:
        loop = asyncio.get_running_loop()
        if tls and self._ssl is None:
            self._ssl = ssl.create_default_context()
        try:
            async with asyncio.timeout(self._timeouts.connect):
                _, connection = await loop.create_connection(
                    _Connection, host, port, ssl=self._ssl if tls else None
                )
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {host}:{port} timed out") from None
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {host}:{port}: {exc}") from exc
        return connection

    async def _acquire(self, host: str, port: int, tls: bool) -> _Connection:
        if self._slots is None:
            self._slots = asyncio.Semaphore(MAX_CONNECTIONS)
        if self._slots.locked():
            try:
                async with asyncio.timeout(self._timeouts.read):
                    await self._slots.acquire()
            except TimeoutError:
                raise httpx.PoolTimeout("no free upstream connection in time") from None
        else:
            await self._slots.acquire()
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if not connection.lost and now - connection.idle_since < KEEPALIVE_SECONDS:
                return connection
            self._drop(connection)
        try:
            return await self._connect(host, port, tls)
        except BaseException:
            self._slots.release()
            raise

    def _drop(self, connection: _Connection) -> None:
        connection.close()

    def release(self, connection: _Connection) -> None:
        """Back to the pool when its response was read to the end, else closed."""
        if connection.complete and connection.reusable and not connection.lost:
            connection.idle_since = time.monotonic()
            self._idle.append(connection)
        else:
            connection.close()
        if self._slots is not None:
            self._slots.release()

    def _request(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None
    ) -> tuple[str, int, bool, bytes]:
        host, port, tls, target, host_header = self._target(url)
        lines = [method.encode(), b" ", target, b" HTTP/1.1\r\nHost: ", host_header, b"\r\n"]
        for name, value in headers.items():
            lines += [name.encode("latin-1"), b": ", value.encode("latin-1"), b"\r\n"]
        if body is not None:
            lines += [b"Content-Length: ", str(len(body)).encode(), b"\r\n\r\n", body]
        else:
            lines.append(b"\r\n")
        return host, port, tls, b"".join(lines)

    async def _start(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None
    ) -> _Connection:
        """A connection whose response head has arrived (held: release it)."""
        host, port, tls, request = self._request(method, url, headers, body)
        connection = await self._acquire(host, port, tls)
        try:
            connection.begin(request)
            while not connection.headers_done:
                await connection.wait(self._timeouts.read)
        except BaseException:
            connection.close()
            self.release(connection)
            raise
        return connection

    async def send(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None
    ) -> Reply:
        connection = await self._start(method, url, headers, body)
        try:
            while not connection.complete:
                await connection.wait(self._timeouts.read)
            return Reply(connection.status, connection.take())
        finally:
            self.release(connection)

    async def open(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None
    ) -> StreamReply:
        connection = await self._start(method, url, headers, body)
        return _Stream(self, connection, self._timeouts.read)

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
