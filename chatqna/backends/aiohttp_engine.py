"""The upstream clients' default engine: one `aiohttp.ClientSession` per upstream.

aiohttp's HTTP parser is compiled; measured per call on the stand-ins
(`tests/rag-benchmarks/http_client_cost.py`) it costs the caller about a fifth of httpx's
CPU with its own transport. Its failures become the httpx exceptions httpx itself raises
for the same event, so `chatqna.backends.http` retries and translates one tree whichever
engine ran: a refused connection is a `ConnectError`, a reset a `ReadError`, a body cut
short or a garbled reply a `RemoteProtocolError`, a read that waits too long a
`ReadTimeout`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import contextmanager

import aiohttp
import httpx

from chatqna.backends.upstream import Reply, StreamReply, Timeouts

MAX_CONNECTIONS = 100  # per upstream


@contextmanager
def httpx_errors() -> Iterator[None]:
    """Re-raise aiohttp's exceptions as the matching httpx ones."""
    try:
        yield
    except aiohttp.ConnectionTimeoutError as exc:
        raise httpx.ConnectTimeout(str(exc) or "connect timed out") from exc
    except TimeoutError as exc:  # SocketTimeoutError and ServerTimeoutError are ones too
        raise httpx.ReadTimeout(str(exc) or "read timed out") from exc
    except aiohttp.ClientConnectorError as exc:
        raise httpx.ConnectError(str(exc)) from exc
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as exc:
        if _reset(exc):  # the connection was reset under the body
            raise httpx.ReadError(str(exc)) from exc
        raise httpx.RemoteProtocolError(str(exc)) from exc
    except aiohttp.ClientResponseError as exc:  # a reply that is not valid HTTP
        raise httpx.RemoteProtocolError(str(exc)) from exc
    except aiohttp.ClientOSError as exc:  # reset, broken pipe
        raise httpx.ReadError(str(exc)) from exc
    except aiohttp.ClientError as exc:
        raise httpx.NetworkError(str(exc)) from exc


def _reset(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    for _ in range(5):  # the reset is a cause or context a few links down at most
        if seen is None:
            return False
        if isinstance(seen, ConnectionResetError | aiohttp.ClientConnectionResetError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class _AiohttpStream:
    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status = response.status

    async def chunks(self) -> AsyncIterator[bytes]:
        with httpx_errors():
            async for chunk in self._response.content.iter_any():
                yield chunk

    async def read(self) -> bytes:
        with httpx_errors():
            return await self._response.read()

    async def aclose(self) -> None:
        # Back to the pool when the body was read to its end; closed (ending the upstream's
        # work, e.g. a generation) when it was not.
        self._response.release()


class AiohttpEngine:
    """One aiohttp session (opened on first use, in the running loop) for one upstream."""

    def __init__(self, timeouts: Timeouts) -> None:
        # Keep every pooled connection alive (fewer reconnects under load), but drop idle
        # ones before a uvicorn-style upstream's 5 s keep-alive closes them under a request.
        self._timeout = aiohttp.ClientTimeout(
            total=None,
            connect=timeouts.read,  # waiting for a free connection of the pool
            sock_connect=timeouts.connect,
            sock_read=timeouts.read,
        )
        self._session: aiohttp.ClientSession | None = None

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=MAX_CONNECTIONS, keepalive_timeout=3.0)
            # No cookies, no redirects, no decompression: the bytes as sent.
            self._session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
                timeout=self._timeout,
            )
        return self._session

    async def _response(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None
    ) -> aiohttp.ClientResponse:
        return await self._session_now().request(
            method, url, headers=headers, data=body, allow_redirects=False, compress=None
        )

    async def send(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None
    ) -> Reply:
        with httpx_errors():
            async with await self._response(method, url, headers, body) as response:
                return Reply(response.status, await response.read())

    async def open(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None
    ) -> StreamReply:
        with httpx_errors():
            return _AiohttpStream(await self._response(method, url, headers, body))

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
