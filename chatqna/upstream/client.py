"""One upstream's HTTP client: an `httpx.AsyncClient` over aiohttp (`httpx-aiohttp`).

Every remote backend keeps one `UpstreamClient` for its whole life. It sends JSON and
returns the status and the body (`Reply`), or opens a streamed body (`StreamReply`); what a
body means is the backend's business. `http_client` is the one place the `httpx.AsyncClient`
of every upstream is built, so what it does is what every upstream call does:

- `HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY` and `NO_PROXY` are honoured: httpx reads them
  once, when the client is built (`trust_env`), and mounts an aiohttp transport with that
  proxy for the URLs it covers;
- gzip and deflate bodies are decoded, streamed or not (by httpx: the transport hands the
  bytes on as sent);
- interim `1xx` responses (`103 Early Hints`) are skipped (aiohttp reads past them);
- `user:pass@` in an endpoint URL is sent as HTTP basic auth, and never shown: the client's
  `base_url` (what spans, logs and `describe()` name) has the credentials removed.

Why `httpx-aiohttp`'s transport under httpx, not httpx's own: per call it costs the caller
well under httpx's own transport (`benchmarks/http_client_cost.py`, the
Resilience page), and the caller keeps httpx's API, its exceptions and its test seam
(tests pass `transport=`: `httpx.MockTransport`; respx with its `httpx` mocker). The
proxies come from httpx, not from aiohttp's own `trust_env`: that looks up `~/.netrc` and
the proxy variables on a worker thread for every request, two thread hand-offs a call. The
transport reports every aiohttp connection failure, a refused connection too, as
`httpx.ConnectTimeout`; `chatqna.upstream.policy` undoes that where failures are translated.

A failure is an httpx exception (`ConnectError`, `ReadTimeout`, `ReadError`, ...; the
aiohttp one it came from as its `__cause__`), so `chatqna.upstream.policy` retries and
translates one tree. With tracing on, each call gets a CLIENT span
(`chatqna.telemetry.client_spans`), and the trace context goes along in the request headers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import aiohttp
import httpx
import orjson
from httpx_aiohttp import HttpxAiohttpClient

from chatqna.telemetry.client_spans import ClientSpans
from chatqna.upstream.types import Reply, StreamReply, Timeouts

NUMPY = orjson.OPT_SERIALIZE_NUMPY
JSON_HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}
# Per upstream: at most 100 connections, all kept alive; idle ones are dropped after 3 s,
# before a uvicorn-style upstream's own 5 s keep-alive closes them under a request.
LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=100, keepalive_expiry=3.0)


def failure_type(exc: BaseException) -> str:
    """A transport failure's name: its class, or for an aiohttp connection failure that the
    transport calls `httpx.ConnectTimeout` without time having run out (a refused or dropped
    connection), the aiohttp exception's (its `__cause__`)."""
    cause = exc.__cause__
    if (
        isinstance(exc, httpx.TimeoutException)
        and isinstance(cause, aiohttp.ClientError)
        and not isinstance(cause, TimeoutError)
    ):
        return type(cause).__name__
    return type(exc).__name__


def without_credentials(url: str) -> str:
    """`url` without a `user:pass@` part (what may be logged or shown)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def credentials(url: str) -> httpx.BasicAuth | None:
    """HTTP basic auth from the `user:pass@` part of `url`, if it has one."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return None
    return httpx.BasicAuth(unquote(parts.username or ""), unquote(parts.password or ""))


def http_client(
    timeouts: Timeouts,
    *,
    auth: httpx.BasicAuth | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    proxies_from_env: bool = True,
) -> httpx.AsyncClient:
    """The `httpx.AsyncClient` of one upstream: the one place every upstream client is built.

    `timeouts.read` bounds each read and a wait for a free pooled connection,
    `timeouts.connect` a new connection's handshake (the transport hands them to aiohttp as
    `sock_read`, `connect` and `sock_connect`; aiohttp has no write timeout, the callers'
    whole-call bounds cover a stalled write). Without `transport`, `httpx-aiohttp`'s
    (`HttpxAiohttpClient`: an `httpx.AsyncClient` whose transports are aiohttp sessions of
    `LIMITS`' size and idle expiry), with the proxies the environment names unless
    `proxies_from_env` is off; a given `transport` (the tests') is used as it is.
    """
    return HttpxAiohttpClient(
        auth=auth,
        timeout=httpx.Timeout(timeouts.read, connect=timeouts.connect),
        limits=LIMITS,
        transport=transport,
        trust_env=proxies_from_env,
    )


class _Stream:
    """A streamed response (`StreamReply`): its body decoded as it arrives."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.status = response.status_code

    def chunks(self) -> AsyncIterator[bytes]:
        return self._response.aiter_bytes()

    async def read(self) -> bytes:
        return await self._response.aread()

    async def aclose(self) -> None:
        await self._response.aclose()


class UpstreamClient:
    """The one client a remote backend keeps for its whole life.

    `base_url` is the upstream's root (`http://tei:80`, credentials allowed:
    `https://user:pass@llm.example`); `headers` go with every request (an API key).
    `transport` replaces the aiohttp one (tests: `httpx.MockTransport`, respx).
    `proxies_from_env=False` ignores `HTTP_PROXY` and the like (the embedded LLM's
    loopback server, which no proxy could reach).
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout_seconds: float,
        connect_timeout_seconds: float,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        proxies_from_env: bool = True,
    ) -> None:
        self.base_url = without_credentials(base_url.rstrip("/"))
        timeouts = Timeouts(read=timeout_seconds, connect=connect_timeout_seconds)
        self._client = http_client(
            timeouts,
            auth=credentials(base_url),
            transport=transport,
            proxies_from_env=proxies_from_env,
        )
        self._headers = {**JSON_HEADERS, **(headers or {})}
        self._bare_headers = {k: v for k, v in self._headers.items() if k != "Content-Type"}
        self._spans = ClientSpans(self.base_url, error_type=failure_type)
        self.is_closed = False

    async def request(self, method: str, path: str, payload: Any = None) -> Reply:
        """Send `payload` (None: no body) as JSON; the whole reply, whatever its status."""
        body = None if payload is None else orjson.dumps(payload, option=NUMPY)
        headers = dict(self._headers if body is not None else self._bare_headers)
        with self._spans.call(method, path, headers) as span:
            response = await self._client.request(
                method, self.base_url + path, headers=headers, content=body
            )
            span.status(response.status_code)
        return Reply(response.status_code, response.content)

    async def post(self, path: str, payload: Any) -> Reply:
        return await self.request("POST", path, payload)

    async def get(self, path: str) -> Reply:
        return await self.request("GET", path)

    async def open_stream(self, path: str, payload: Any) -> StreamReply:
        """POST `payload` and return once the status and headers are in; the caller reads
        the body and must `aclose` the reply."""
        headers = {**self._headers, "Accept": "text/event-stream"}
        body = orjson.dumps(payload, option=NUMPY)
        with self._spans.call("POST", path, headers) as span:
            request = self._client.build_request(
                "POST", self.base_url + path, headers=headers, content=body
            )
            response = await self._client.send(request, stream=True)
            span.status(response.status_code)
        return _Stream(response)

    async def aclose(self) -> None:
        self.is_closed = True
        await self._client.aclose()
