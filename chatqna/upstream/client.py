"""One upstream's HTTP client: JSON in, the status and body out, with a span per call.

Every remote backend keeps one `UpstreamClient` for its whole life. It sends JSON and
returns the status and the body (`Reply`), or opens a streamed body (`StreamReply`); what a
body means is the backend's business. The requests go through the upstream's one
`httpx2.AsyncClient` (`chatqna.upstream.sessions`), on httpx2's own transport, or on one the
caller passes (the tests: `httpx2.MockTransport`). What every upstream call does:

- `HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY` and `NO_PROXY` are honoured, read by httpx2
  once, when the client is built;
- gzip and deflate bodies are decoded, streamed or not, and a whole body is read no
  further than `max_body_bytes` once decoded;
- interim `1xx` responses (`103 Early Hints`) are skipped;
- `user:pass@` in an endpoint URL is sent as HTTP basic auth, and never shown: the client's
  `base_url` (what spans, logs and `describe()` name) has the credentials removed.

A failure is httpx2's own exception (or `ResponseTooLarge`), and `chatqna.upstream.policy`
retries and translates them. With tracing on, each call gets a CLIENT span
(`chatqna.telemetry.client_spans`), and the trace context goes along in the request
headers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx2
import orjson
from opentelemetry.util.types import AttributeValue

from chatqna.telemetry.client_spans import ClientSpans
from chatqna.upstream.sessions import MAX_BODY_BYTES, HttpxSession
from chatqna.upstream.types import Reply, StreamReply, Timeouts

NUMPY = orjson.OPT_SERIALIZE_NUMPY
JSON_HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}
# A backend calls a handful of paths; their parsed URLs are kept (httpx2 parses a URL string
# on every request otherwise), up to this many.
URLS_KEPT = 32


def without_credentials(url: str) -> str:
    """`url` without a `user:pass@` part (what may be logged or shown)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


class UpstreamClient:
    """The one client a remote backend keeps for its whole life.

    `base_url` is the upstream's root (`http://tei:80`, credentials allowed:
    `https://user:pass@llm.example`); `headers` go with every request (an API key).
    `transport` replaces httpx2's own (tests: `httpx2.MockTransport`).
    `proxies_from_env=False` ignores `HTTP_PROXY` and the like (the embedded LLM's
    loopback server, which no proxy could reach). `max_body_bytes` bounds a whole body
    (`chatqna.upstream.sessions.MAX_BODY_BYTES` says how the default is sized).
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout_seconds: float,
        connect_timeout_seconds: float,
        headers: Mapping[str, str] | None = None,
        transport: httpx2.AsyncBaseTransport | None = None,
        proxies_from_env: bool = True,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        self.base_url = without_credentials(base_url.rstrip("/"))
        self._session = HttpxSession(
            base_url,
            Timeouts(read=timeout_seconds, connect=connect_timeout_seconds),
            transport=transport,
            trust_env=proxies_from_env,
            max_body_bytes=max_body_bytes,
        )
        self._headers = {**JSON_HEADERS, **(headers or {})}
        self._bare_headers = {k: v for k, v in self._headers.items() if k != "Content-Type"}
        self._spans = ClientSpans(self.base_url)
        self._urls: dict[str, httpx2.URL] = {}
        self.is_closed = False

    def _url(self, path: str) -> httpx2.URL:
        url = self._urls.get(path)
        if url is None:
            url = httpx2.URL(self.base_url + path)
            if len(self._urls) < URLS_KEPT:
                self._urls[path] = url
        return url

    async def request(
        self,
        method: str,
        path: str,
        payload: Any = None,
        span_attributes: Mapping[str, AttributeValue] | None = None,
        *,
        max_body_bytes: int | None = None,
    ) -> Reply:
        """Send `payload` (None: no body) as JSON; the whole reply, whatever its status.
        `span_attributes` go on the call's client span. `max_body_bytes` bounds this reply's
        body below the client's own limit (`ResponseTooLarge` past it): an answer whose size
        the caller can tell is refused before it is parsed."""
        body = None if payload is None else orjson.dumps(payload, option=NUMPY)
        headers = dict(self._headers if body is not None else self._bare_headers)
        with self._spans.call(method, path, headers, span_attributes) as span:
            reply = await self._session.send(method, self._url(path), headers, body, max_body_bytes)
            span.status(reply.status)
        return reply

    async def post(
        self,
        path: str,
        payload: Any,
        span_attributes: Mapping[str, AttributeValue] | None = None,
        *,
        max_body_bytes: int | None = None,
    ) -> Reply:
        return await self.request(
            "POST", path, payload, span_attributes, max_body_bytes=max_body_bytes
        )

    async def get(self, path: str) -> Reply:
        return await self.request("GET", path)

    async def open_stream(self, path: str, payload: Any) -> StreamReply:
        """POST `payload` and return once the status and headers are in; the caller reads
        the body, `finish`es it once it has the stream's own end, and must `aclose` the
        reply."""
        headers = {**self._headers, "Accept": "text/event-stream"}
        body = orjson.dumps(payload, option=NUMPY)
        with self._spans.call("POST", path, headers) as span:
            stream = await self._session.open("POST", self._url(path), headers, body)
            span.status(stream.status)
        return stream

    async def aclose(self) -> None:
        self.is_closed = True
        await self._session.aclose()
