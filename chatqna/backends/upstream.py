"""One upstream's HTTP client: our httptools engine in the service, an httpx transport in tests.

Every remote backend keeps one `UpstreamClient` for its whole life. It sends JSON and
returns the status and the raw body (`Reply`), or opens a streamed body (`StreamReply`);
what a body means is the backend's business. Underneath is an `Engine`:

- `HttptoolsEngine` (the default, `chatqna.backends.httptools_engine`): keep-alive HTTP/1.1
  connections whose responses httptools (the compiled parser uvicorn uses) parses. Per call
  it costs the caller about a third of the CPU of an `aiohttp.ClientSession` and under a
  tenth of httpx with its own transport (`tests/rag-benchmarks/http_client_cost.py`);
  the upstream calls were the largest part of the megaservice's CPU per request.
- `HttpxEngine`: an `httpx.AsyncClient` over any httpx transport. Passing `transport=`
  (an `httpx.MockTransport`, respx's router) is the seam the unit and contract tests use;
  the byte-moving engine is all they swap, the backends' wire handling is the same code.
  The integration tests run the default engine against real servers.

Both engines raise the httpx exception for a failure (`ConnectError`, `ReadTimeout`,
`RemoteProtocolError`, ...), so `chatqna.backends.http` retries and translates one tree.
With tracing on, each call gets a CLIENT span (`chatqna.telemetry.client_spans`), and the
trace context goes along in the request headers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
import orjson

from chatqna.backends.httptools_engine import HttptoolsEngine
from chatqna.backends.upstream_types import Engine, Reply, StreamReply, Timeouts
from chatqna.telemetry.client_spans import ClientSpans

NUMPY = orjson.OPT_SERIALIZE_NUMPY
JSON_HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}


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


class HttpxEngine:
    """An `httpx.AsyncClient` over `transport` (tests' `MockTransport`, respx)."""

    def __init__(self, transport: httpx.AsyncBaseTransport, timeouts: Timeouts) -> None:
        self._client = httpx.AsyncClient(
            transport=transport,
            timeout=httpx.Timeout(timeouts.read, connect=timeouts.connect),
        )

    async def send(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None
    ) -> Reply:
        response = await self._client.request(method, url, headers=headers, content=body)
        return Reply(response.status_code, response.content)

    async def open(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None
    ) -> StreamReply:
        request = self._client.build_request(method, url, headers=headers, content=body)
        return _HttpxStream(await self._client.send(request, stream=True))

    async def aclose(self) -> None:
        await self._client.aclose()


def default_engine(timeouts: Timeouts) -> Engine:
    """The engine of a client built without a transport: httptools (see the module)."""
    return HttptoolsEngine(timeouts)


class UpstreamClient:
    """The one client a remote backend keeps for its whole life.

    `base_url` is the upstream's root (`http://tei:80`); `headers` go with every request
    (an API key). Without a `transport`, `default_engine` moves the bytes.
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout_seconds: float,
        connect_timeout_seconds: float,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        timeouts = Timeouts(read=timeout_seconds, connect=connect_timeout_seconds)
        self._engine = (
            default_engine(timeouts) if transport is None else HttpxEngine(transport, timeouts)
        )
        self._headers = {**JSON_HEADERS, **(headers or {})}
        self._bare_headers = {k: v for k, v in self._headers.items() if k != "Content-Type"}
        self._spans = ClientSpans(self.base_url)
        self.is_closed = False

    async def request(self, method: str, path: str, payload: Any = None) -> Reply:
        """Send `payload` (None: no body) as JSON; the whole reply, whatever its status."""
        body = None if payload is None else orjson.dumps(payload, option=NUMPY)
        url = self.base_url + path
        headers = dict(self._headers if body is not None else self._bare_headers)
        with self._spans.call(method, path, headers) as span:
            reply = await self._engine.send(method, url, headers, body)
            span.status(reply.status)
        return reply

    async def post(self, path: str, payload: Any) -> Reply:
        return await self.request("POST", path, payload)

    async def get(self, path: str) -> Reply:
        return await self.request("GET", path)

    async def open_stream(self, path: str, payload: Any) -> StreamReply:
        """POST `payload` and return once the status and headers are in; the caller reads
        the body and must `aclose` the reply."""
        url = self.base_url + path
        headers = {**self._headers, "Accept": "text/event-stream"}
        body = orjson.dumps(payload, option=NUMPY)
        with self._spans.call("POST", path, headers) as span:
            reply = await self._engine.open("POST", url, headers, body)
            span.status(reply.status)
        return reply

    async def aclose(self) -> None:
        self.is_closed = True
        await self._engine.aclose()
