"""The load generator's HTTP client for the overhead benchmarks: cheap, so the client core
measures the servers and not itself.

At one request in flight a closed loop measures, per request, the server's time plus the
load generator's own: every microsecond the client spends is added to both systems alike,
which pulls their requests/s ratio toward 1. An `aiohttp.ClientSession` costs about 280 µs
of CPU a call on the stdlib event loop (`http_client_cost.py`). This client is what a
closed loop needs and no more: each worker keeps one HTTP/1.1 keep-alive connection (an
`asyncio.Protocol` whose responses httptools parses), a request is one write of bytes
prepared once per path and body length, and the answer is read whole (a stream to its
last chunk). `run` drives a coroutine on uvloop.

    async with LoadSession("http://127.0.0.1:8888") as session:
        status, body = await session.post("/v1/chatqna", b'{"messages": "Hi"}')

Loopback only, plain HTTP, no redirects or retries: a failure is an exception
(`ConnectionError` for a connection closed or reset under a request, `TimeoutError` past
`timeout`, `ValueError` for bytes that are not HTTP), and the connection it happened on
is dropped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httptools
import uvloop

T = TypeVar("T")
# Idle connections older than this are closed, not reused: servers close theirs after 5 s,
# and a request written as the server closes would fail with no answer.
IDLE_SECONDS = 2.0


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run` on a uvloop event loop."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coroutine)


class _Connection(asyncio.Protocol):
    """One keep-alive connection: one request at a time, its answer gathered whole."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.idle_since = time.monotonic()
        self.reusable = False
        self._chunks: list[bytes] = []
        self._done: asyncio.Future[int] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._finish(ValueError(f"not an HTTP response: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        self._finish(ConnectionError(f"connection closed under a request: {exc}"))

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)

    def on_message_complete(self) -> None:
        self.reusable = self.parser.should_keep_alive()
        self._finish(None)

    def _finish(self, error: Exception | None) -> None:
        done = self._done
        if done is None or done.done():
            return
        if error is None:
            done.set_result(self.parser.get_status_code())
        else:
            done.set_exception(error)

    async def exchange(self, request: bytes, timeout: float) -> tuple[int, bytes]:
        assert self.transport is not None
        self._chunks = []
        self.reusable = False
        self._done = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        try:
            async with asyncio.timeout(timeout):
                status = await self._done
        finally:
            self._done = None
        chunks = self._chunks
        return status, chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None:
            self.transport.close()


class LoadSession:
    """Keep-alive connections to one `http://host:port`, as many as requests in flight."""

    def __init__(self, base_url: str, *, timeout: float = 60.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname or parts.port is None:
            raise ValueError(f"need http://host:port, not {base_url!r}")
        self._host = parts.hostname
        self._port = parts.port
        self._timeout = timeout
        self._host_header = f"Host: {parts.hostname}:{parts.port}\r\n".encode()
        self._idle: list[_Connection] = []
        self._heads: dict[tuple[str, int], bytes] = {}

    async def __aenter__(self) -> LoadSession:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle.clear()

    def _head(self, path: str, length: int) -> bytes:
        head = self._heads.get((path, length))
        if head is None:
            head = self._heads[(path, length)] = (
                f"POST {path} HTTP/1.1\r\n".encode()
                + self._host_header
                + b"Content-Type: application/json\r\n"
                + f"Content-Length: {length}\r\n\r\n".encode()
            )
        return head

    async def _connection(self) -> _Connection:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if connection.reusable and now - connection.idle_since < IDLE_SECONDS:
                return connection
            connection.close()
        _, protocol = await asyncio.get_running_loop().create_connection(
            _Connection, self._host, self._port
        )
        return protocol

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """POST `body` (JSON) to `path`; the status and the whole answer."""
        connection = await self._connection()
        try:
            answer = await connection.exchange(self._head(path, len(body)) + body, self._timeout)
        except BaseException:
            connection.close()
            raise
        if connection.reusable:
            connection.idle_since = time.monotonic()
            self._idle.append(connection)
        else:
            connection.close()
        return answer
