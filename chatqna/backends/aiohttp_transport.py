"""An httpx transport that sends over aiohttp, whose HTTP parser is compiled.

The remote backends keep their `httpx.AsyncClient` (its API, `MockTransport` in tests, the
OpenTelemetry httpx instrumentation); only the bytes go through an `aiohttp.ClientSession`.
Measured per call on the stand-ins (`tests/rag-benchmarks/http_client_cost.py`), this
costs the caller about 2.6 times less CPU than httpx's own transport. aiohttp's failures
become the httpx exceptions httpx itself raises for the same event, so
`chatqna.backends.http` retries and translates them unchanged: a refused connection is a
`ConnectError`, a reset a `ReadError`, a body cut short or a garbled reply a
`RemoteProtocolError`, a read that waits too long a `ReadTimeout`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import aiohttp
import httpx


@contextmanager
def httpx_errors(request: httpx.Request) -> Iterator[None]:
    """Re-raise aiohttp's exceptions as the matching httpx ones."""
    try:
        yield
    except aiohttp.ConnectionTimeoutError as exc:
        raise httpx.ConnectTimeout(str(exc) or "connect timed out", request=request) from exc
    except TimeoutError as exc:  # SocketTimeoutError and ServerTimeoutError are ones too
        raise httpx.ReadTimeout(str(exc) or "read timed out", request=request) from exc
    except aiohttp.ClientConnectorError as exc:
        raise httpx.ConnectError(str(exc), request=request) from exc
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as exc:
        if _reset(exc):  # the connection was reset under the body
            raise httpx.ReadError(str(exc), request=request) from exc
        raise httpx.RemoteProtocolError(str(exc), request=request) from exc
    except aiohttp.ClientResponseError as exc:  # a reply that is not valid HTTP
        raise httpx.RemoteProtocolError(str(exc), request=request) from exc
    except aiohttp.ClientOSError as exc:  # reset, broken pipe
        raise httpx.ReadError(str(exc), request=request) from exc
    except aiohttp.ClientError as exc:
        raise httpx.NetworkError(str(exc), request=request) from exc


def _reset(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    for _ in range(5):  # the reset is a cause or context a few links down at most
        if seen is None:
            return False
        if isinstance(seen, ConnectionResetError | aiohttp.ClientConnectionResetError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class _Body(httpx.AsyncByteStream):
    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request) -> None:
        self._response = response
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with httpx_errors(self._request):
            async for chunk in self._response.content.iter_any():
                yield chunk

    async def aclose(self) -> None:
        # Back to the pool when the body was read to its end; closed (ending the upstream's
        # work, e.g. a generation) when it was not.
        self._response.release()


class AiohttpTransport(httpx.AsyncBaseTransport):
    """One aiohttp session (opened on first use, in the running loop) behind httpx."""

    def __init__(self, limits: httpx.Limits) -> None:
        self._limits = limits
        self._session: aiohttp.ClientSession | None = None

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._limits.max_connections or 0,
                keepalive_timeout=self._limits.keepalive_expiry or 0.0,
            )
            # No cookies, no redirects, bytes as sent: httpx does the rest.
            self._session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeout = request.extensions.get("timeout", {})
        body = await request.aread()
        with httpx_errors(request):
            response = await self._session_now().request(
                request.method,
                str(request.url),
                headers=request.headers.multi_items(),
                data=body or None,
                allow_redirects=False,
                compress=None,
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    connect=timeout.get("pool"),
                    sock_connect=timeout.get("connect"),
                    sock_read=timeout.get("read"),
                ),
            )
        return httpx.Response(
            status_code=response.status,
            headers=response.raw_headers,
            stream=_Body(response, request),
            request=request,
            extensions={"http_version": b"HTTP/1.1"},
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
