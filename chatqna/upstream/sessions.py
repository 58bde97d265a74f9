"""What an `UpstreamClient` sends its requests through: an aiohttp session, or an httpx client.

The service's upstream calls go through `AiohttpSession`, an `aiohttp.ClientSession` of its
own per upstream. `HttpxSession` sends through any httpx transport instead: it is how the
tests reach the clients (`httpx.MockTransport`, or respx, which routes every httpx
client), and how a caller that brings an httpx transport of its own is served. Both give the
same `Reply` and `StreamReply`, and on real sockets they put the same request on the wire
(`tests/contract/test_upstream_client.py`), so what the tests check through httpx holds
for the aiohttp session the service uses.

Why aiohttp directly, not httpx over an aiohttp transport (`httpx-aiohttp`) or httpx's own
transport: a call costs the caller half the CPU of httpx over aiohttp and a quarter of
httpx's own (`benchmarks/http_client_cost.py`; the Resilience page), and every turn makes
four of them.

A failure is the library's own exception: aiohttp's (`ClientConnectorError`,
`ServerDisconnectedError`, `ClientPayloadError`, its timeouts, which are `TimeoutError`s)
or httpx's. `chatqna.upstream.policy` translates both trees.
"""

from __future__ import annotations

import urllib.request
from collections.abc import AsyncIterator, Mapping
from typing import Protocol
from urllib.parse import unquote, urlsplit

import aiohttp
import httpx

from chatqna.upstream.types import Reply, StreamReply, Timeouts

# Per upstream: at most 100 connections, all kept alive; idle ones are dropped after 3 s,
# before a uvicorn-style upstream's own 5 s keep-alive closes them under a request.
MAX_CONNECTIONS = 100
KEEPALIVE_SECONDS = 3.0


class Session(Protocol):
    """Sends one upstream's requests (`url` is absolute, `body` already encoded)."""

    async def send(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None
    ) -> Reply:
        """The whole response, whatever its status."""
        ...

    async def open(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes
    ) -> StreamReply:
        """The response once its status and headers are in; the body is read by the caller."""
        ...

    async def aclose(self) -> None: ...


def env_proxy(url: str) -> str | None:
    """The proxy `HTTP_PROXY`, `HTTPS_PROXY` or `ALL_PROXY` names for `url`, unless
    `NO_PROXY` exempts its host (the standard library's reading of those variables, as
    aiohttp's own `trust_env` reads them; here once per upstream, not on every request)."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies()
    if not proxies or urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return proxies.get(parts.scheme) or proxies.get("all")


def basic_auth(url: str) -> tuple[str, str] | None:
    """User and password from the `user:pass@` part of `url`, if it has one."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return None
    return unquote(parts.username or ""), unquote(parts.password or "")


class _AiohttpStream:
    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status = response.status

    def chunks(self) -> AsyncIterator[bytes]:
        return self._response.content.iter_any()

    async def read(self) -> bytes:
        return await self._response.read()

    async def aclose(self) -> None:
        # Back to the pool when the body was read to its end, closed when it was not.
        self._response.release()


class AiohttpSession:
    """An `aiohttp.ClientSession` for one upstream, made on the first call (inside the
    event loop that uses it).

    `timeouts.read` bounds each read and a wait for a free pooled connection,
    `timeouts.connect` a new connection's handshake (aiohttp has no write timeout; the
    callers' whole-call bounds cover a stalled write). Bodies sent gzip- or
    deflate-encoded are decoded, streamed or not; interim `1xx` responses are read past.
    `proxy` is the forward proxy for every request (see `env_proxy`), `auth` basic-auth
    credentials.
    """

    def __init__(
        self, timeouts: Timeouts, *, proxy: str | None, auth: tuple[str, str] | None
    ) -> None:
        self._timeout = aiohttp.ClientTimeout(
            total=None,
            connect=timeouts.read,
            sock_connect=timeouts.connect,
            sock_read=timeouts.read,
        )
        self._proxy = proxy
        self._headers = {} if auth is None else {"Authorization": aiohttp.encode_basic_auth(*auth)}
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=MAX_CONNECTIONS, keepalive_timeout=KEEPALIVE_SECONDS
                ),
                timeout=self._timeout,
                headers=self._headers,
            )
        return self._session

    async def send(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None
    ) -> Reply:
        async with self._client().request(
            method, url, headers=headers, data=body, proxy=self._proxy
        ) as response:
            return Reply(response.status, await response.read())

    async def open(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes
    ) -> StreamReply:
        response = await self._client().request(
            method, url, headers=headers, data=body, proxy=self._proxy
        )
        return _AiohttpStream(response)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


class _HttpxStream:
    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.status = response.status_code

    def chunks(self) -> AsyncIterator[bytes]:
        return self._response.aiter_bytes()

    async def read(self) -> bytes:
        return await self._response.aread()

    async def aclose(self) -> None:
        await self._response.aclose()


class HttpxSession:
    """An `httpx.AsyncClient` over `transport`, with the same timeouts, pool size and
    basic auth as `AiohttpSession`; proxies are the transport's business."""

    def __init__(
        self,
        timeouts: Timeouts,
        *,
        transport: httpx.AsyncBaseTransport,
        auth: tuple[str, str] | None,
    ) -> None:
        self._client = httpx.AsyncClient(
            auth=None if auth is None else httpx.BasicAuth(*auth),
            timeout=httpx.Timeout(timeouts.read, connect=timeouts.connect),
            limits=httpx.Limits(
                max_connections=MAX_CONNECTIONS,
                max_keepalive_connections=MAX_CONNECTIONS,
                keepalive_expiry=KEEPALIVE_SECONDS,
            ),
            transport=transport,
            trust_env=False,
        )

    async def send(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None
    ) -> Reply:
        response = await self._client.request(method, url, headers=headers, content=body)
        return Reply(response.status_code, response.content)

    async def open(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes
    ) -> StreamReply:
        request = self._client.build_request(method, url, headers=headers, content=body)
        return _HttpxStream(await self._client.send(request, stream=True))

    async def aclose(self) -> None:
        await self._client.aclose()
