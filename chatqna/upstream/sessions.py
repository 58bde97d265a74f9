"""What an `UpstreamClient` sends its requests through: one `httpx2.AsyncClient` per upstream.

The service's calls go through httpx2's own transport (httpcore2's connection pool); the
tests hand the same session an `httpx2.MockTransport`, or let respx route it at the pool,
so what the tests check is the code that ships. httpcore2's pool drops an idle connection
whose socket has become readable instead of reusing it: bytes an upstream sends after a
response has ended (a second response behind a `Content-Length` that was too short) can
never be read as the answer to the next request (`tests/integration/test_hostile_upstreams.py`).

What httpx2 does here, by its own rules: `HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY` and
`NO_PROXY` are read once, when the client is built (`trust_env`; unless the caller turns
that off, or brings its own transport); interim `1xx` responses are read past. Bodies
are asked for as gzip or deflate only, and decoded by httpx2 (`chatqna.upstream.decoding`).
Credentials in the URL (`user:pass@`) are decoded as `httpx2.URL` decodes them and sent as
HTTP basic auth; the URLs the session is given, and so what httpx2 logs, have none.
Certificates are checked against the system's CA store (`ssl.create_default_context()`:
OpenSSL's default paths, which `SSL_CERT_FILE` and `SSL_CERT_DIR` override).

A body is read as it arrives and no further than `max_body_bytes` once decoded
(`ResponseTooLarge` beyond it), so an upstream cannot fill the service's memory with one
answer, or with a small compressed one that decodes to gigabytes, nor hold the event loop
while one decodes: httpx2 inflates gzip and deflate a bounded step at a time, and when one
network read inflates to several steps, other requests run in between
(`chatqna.upstream.decoding`).
A failure is httpx2's own exception (`ConnectError`, `ReadError`, `RemoteProtocolError`,
`ReadTimeout`, `DecodingError`, ...); `chatqna.upstream.policy` retries and translates them.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import AsyncIterator, Mapping

import httpx2

from chatqna.upstream.cancellation import scoped, to_completion
from chatqna.upstream.decoding import ACCEPT_ENCODING, decoded_chunks
from chatqna.upstream.types import Reply, ResponseTooLarge, Timeouts

# Per upstream: at most 100 connections, all kept alive; idle ones are dropped after 1 s,
# well before a uvicorn-style upstream's own 5 s keep-alive closes them under a request.
# Not longer: the surplus a burst of requests leaves behind costs every later call until it
# expires, as the pool goes through the connections it holds on each request (measured on
# httpcore 1.0's pool, which also polled each idle socket then: at 64 chat turns in flight,
# 8.3-8.5 ms of CPU a turn with 45-64 connections per upstream, 3.5-3.9 ms with the 8-9 that
# load needs; httpcore2's polls only the connection it hands out).
# Not fewer connections kept alive either (`max_keepalive_connections` below the maximum):
# httpcore 1.0 then closed idle connections under load, one it had just handed to a request
# among them (encode/httpcore#1110), which failed that request.
MAX_CONNECTIONS = 100
KEEPALIVE_SECONDS = 1.0

# The most a whole body may hold once decoded. The rule: what the largest legitimate
# answer can reach, with room to spare. That is an embeddings batch: TEI's default
# `--max-client-batch-size` of 32 inputs of a 4,096-dimension model is 32 × 4,096 floats
# at about 25 bytes of JSON each, 3.3 MB; 64 MiB leaves room for batches of 512. Rerank
# scores, retrieved passages (at most 100) and a chat completion are far smaller. Streamed
# bodies are read chunk by chunk and bounded by their event size and generation deadline
# instead (`chatqna.upstream.sse`, `chatqna.backends.openai_chat`).
MAX_BODY_BYTES = 64 * 1024 * 1024

# What a stream's reader waits for once it has the stream's own last event (`[DONE]`): the
# end of the HTTP body, which a well-behaved server sends at once, so that the connection
# goes back to the pool. Past this wait, or these bytes, the connection is closed instead.
# Reading to the end saves a new connection per streamed answer (a TCP handshake, and
# httpcore2's connection set-up, on every turn).
END_WAIT_SECONDS = 0.25
END_BYTES = 64 * 1024


def credentials(url: str) -> httpx2.BasicAuth | None:
    """Basic auth from the `user:pass@` part of `url`, decoded as httpx2 decodes it."""
    parsed = httpx2.URL(url)
    if not (parsed.username or parsed.password):
        return None
    return httpx2.BasicAuth(parsed.username, parsed.password)


async def read_body(chunks: AsyncIterator[bytes], limit: int) -> bytes:
    """The rest of a decoded body, chunk by chunk; `ResponseTooLarge` once it would pass
    `limit` bytes (the chunk that would pass it is not kept)."""
    body = bytearray()
    async for chunk in chunks:
        if len(body) + len(chunk) > limit:
            raise ResponseTooLarge(limit)
        body += chunk
    return bytes(body)


def refuse_reuse_if_bytes_trail(stream: httpx2.AsyncByteStream) -> None:
    """Mark the connection under a body `stream` just read to its end as not to be reused,
    if bytes followed the body on it.

    httpcore2's pool already drops an idle connection whose socket turns readable. But bytes
    that arrived in the same read as the end of a response stay in h11's buffer, and
    httpcore2 (2.17.0, as httpcore 1.0 before it) would reuse the connection and hand them
    to the next request as its answer (a response the upstream wrote twice, the tail of a
    miscounted `Content-Length`). Only httpcore2's private attributes reach h11's public
    `trailing_data`, so they are read here and nowhere else, defensively: httpcore2 is
    pinned in `constraints.txt`, and `tests/integration/test_hostile_upstreams.py` fails if
    this stops finding them.

    This runs before the response is closed, while the connection is still this
    response's: once closed, it is back in the pool and may carry the next request, whose
    own unread bytes a later look would take for trailing ones
    (`tests/integration/test_pooled_connections.py`). The mark is h11's `send_failed()`:
    with h11 in `ERROR`, httpcore2 closes the connection when the response is closed,
    instead of pooling it.
    """
    # httpx2's bound stream, its httpcore2 stream, the pool's stream, the connection's.
    inner: object = stream
    for name in ("_stream", "_httpcore_stream", "_stream"):
        inner = getattr(inner, name, None)
    connection = getattr(inner, "_connection", None)
    h11_state = getattr(connection, "_h11_state", None)
    if h11_state is not None and h11_state.trailing_data[0]:
        h11_state.send_failed()


class _EndCheckedStream(httpx2.AsyncByteStream):
    """A response's body stream that, at the body's end, checks for bytes after it
    (`refuse_reuse_if_bytes_trail`) before httpx2 closes the response."""

    def __init__(self, stream: httpx2.AsyncByteStream) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            yield chunk
        refuse_reuse_if_bytes_trail(self._stream)

    async def aclose(self) -> None:
        # Every close of the response comes here (httpx2's own, at the body's end, too).
        await to_completion(self._stream.aclose)


class _HttpxStream:
    def __init__(self, response: httpx2.Response, limit: int) -> None:
        self._response = response
        self._limit = limit
        self.status = response.status_code
        self.server = response.headers.get("server", "")
        self.retry_after = response.headers.get("retry-after")
        # One iterator over the body: `read` and `finish` go on where `chunks` stopped.
        self._chunks = decoded_chunks(response)

    def chunks(self) -> AsyncIterator[bytes]:
        return self._chunks

    async def read(self) -> bytes:
        return await read_body(self._chunks, self._limit)

    async def finish(self) -> None:
        # The caller has its answer; what is left only decides whether the connection can
        # be reused, so a failure to read it (a reset, a corrupt gzip trailer) is no
        # failure of the call: the connection is closed, as `aclose` would have.
        left = END_BYTES
        try:
            async with asyncio.timeout(END_WAIT_SECONDS):
                async for chunk in self._chunks:
                    left -= len(chunk)
                    if left < 0:
                        return
        except (TimeoutError, httpx2.HTTPError):
            return

    async def aclose(self) -> None:
        # Back to the pool when the body was read to its end and nothing followed it,
        # closed otherwise (httpcore2's rule, and `refuse_reuse_if_bytes_trail`'s mark).
        # The body's iterator is closed first, here, rather than left to the garbage
        # collector.
        await self._chunks.aclose()
        await self._response.aclose()


async def _nothing_to_undo(_: Reply) -> None:
    """A whole reply holds no connection: its response is closed already."""


class HttpxSession:
    """One upstream's `httpx2.AsyncClient`.

    `timeouts.read` bounds each read and write and a wait for a free pooled connection,
    `timeouts.connect` a new connection's handshake. `base_url` is only read for its
    credentials. `transport` replaces httpx2's own (tests: `httpx2.MockTransport`); proxies
    from the environment then do not apply, nor do they when `trust_env` is False (the
    embedded LLM's loopback server, which no proxy could reach).
    """

    def __init__(
        self,
        base_url: str,
        timeouts: Timeouts,
        *,
        transport: httpx2.AsyncBaseTransport | None = None,
        trust_env: bool = True,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        self._limit = max_body_bytes
        self._client = httpx2.AsyncClient(
            auth=credentials(base_url),
            timeout=httpx2.Timeout(timeouts.read, connect=timeouts.connect),
            limits=httpx2.Limits(
                max_connections=MAX_CONNECTIONS,
                max_keepalive_connections=MAX_CONNECTIONS,
                keepalive_expiry=KEEPALIVE_SECONDS,
            ),
            verify=True if transport is not None else ssl.create_default_context(),
            headers={"Accept-Encoding": ACCEPT_ENCODING},
            transport=transport,
            trust_env=trust_env,
        )

    async def send(
        self,
        method: str,
        url: str | httpx2.URL,
        headers: Mapping[str, str],
        body: bytes | None,
        max_body_bytes: int | None = None,
    ) -> Reply:
        """The whole response, whatever its status (`url` absolute, `body` encoded), read no
        further than `max_body_bytes` (the call's own bound, for an answer whose size the
        caller knows) nor than the session's limit.

        Sent, read and closed in one task that a cancellation reaches as httpcore2 expects it
        (`chatqna.upstream.cancellation.scoped`), the read included: httpcore2's cleanup
        after a failed read (a reset mid-body) is then never cut short either."""
        request = self._client.build_request(method, url, headers=headers, content=body)
        limit = self._limit if max_body_bytes is None else min(max_body_bytes, self._limit)
        return await scoped(functools.partial(self._whole, request, limit), _nothing_to_undo)

    async def _whole(self, request: httpx2.Request, limit: int) -> Reply:
        stream = self._stream(await self._client.send(request, stream=True))
        try:
            return Reply(stream.status, await read_body(stream.chunks(), limit), stream.retry_after)
        finally:
            await stream.aclose()

    async def open(
        self,
        method: str,
        url: str | httpx2.URL,
        headers: Mapping[str, str],
        body: bytes | None,
    ) -> _HttpxStream:
        """The response once its status and headers are in; the body is read by the caller."""
        request = self._client.build_request(method, url, headers=headers, content=body)
        send = functools.partial(self._client.send, request, stream=True)
        return self._stream(await scoped(send, httpx2.Response.aclose))

    def _stream(self, response: httpx2.Response) -> _HttpxStream:
        # httpx2 reads a body through `response.stream` and closes the response (giving the
        # connection back) as soon as that stream ends; the wrapper checks the end first.
        if isinstance(response.stream, httpx2.AsyncByteStream):  # always, from AsyncClient
            response.stream = _EndCheckedStream(response.stream)
        return _HttpxStream(response, self._limit)

    async def aclose(self) -> None:
        await self._client.aclose()
