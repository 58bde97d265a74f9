"""The stand-in upstreams of `tests.standins.servers`, served cheaply, for benchmarks.

`python -m tests.standins.servers` runs on FastAPI and uvicorn, which costs the client core
of a benchmark more than the orchestrators it measures. This module answers the same
routes with the same bytes (`GET /health`, `GET /v1/ready`, `GET /info`, `POST /v1/embeddings`,
`POST /rerank`, `POST /v1/retrieval`, `POST /v1/dataprep/get`, `POST /v1/chat/completions`
streamed or not, `GET /v1/models`, and the `/condense` chat model) on a small HTTP/1.1
server of its own: an `asyncio.Protocol` feeding `httptools`' parser, on uvloop when it is
installed, with keep-alive (closed after 5 s idle, as uvicorn does), pipelining and
chunked request bodies.

What the orchestrators receive does not change: the bodies come from the same functions
(`hashed_vector`, `_retrieved`, `ChatModel`) encoded with the same `json.dumps` calls, the
headers are uvicorn's, in its order, and a stream goes out as uvicorn sends it, one chunk
per token frame, each in its own `transport.write`. Encoding is stdlib `json` rather than
orjson because orjson's compact output would change the bytes; the cost is kept down
instead by caching the answers of the pure routes (embeddings, rerank, retrieval) by
request body, and embedding vectors by text, in bounded dicts. Request bodies are decoded
with orjson when it is installed. Answers are computed as the request completes, without
a task, unless `--delay` or `--token-interval` asks for a wait.

There are no faults and no `/_standin/*` control routes: the FastAPI stand-ins are the ones
to use for failure tests; this one is for measuring the orchestrator. Unknown paths get
FastAPI's 404 and 405 bodies; a body that is not JSON, or lacks a field a route needs, gets
a 400 (where FastAPI answers 500). It listens on loopback only:
`python -m tests.standins.fast_servers --port N`.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, cast

import httptools

from tests.standins.servers import (
    DIMENSION,
    DOCUMENTS,
    ChatModel,
    _retrieved,
    hashed_vector,
    tei_info,
)

try:
    import orjson

    decode_json: Callable[[bytes], Any] = orjson.loads
except ImportError:  # pragma: no cover - orjson is in the test environment
    decode_json = json.loads

__all__ = ["Reply", "StandinRoutes", "start_server"]

logger = logging.getLogger(__name__)
KEEP_ALIVE_SECONDS = 5.0  # uvicorn's default: idle connections close after this
JSON_TYPE = b"application/json"
SSE_TYPE = b"text/event-stream; charset=utf-8"
END_OF_CHUNKS = b"0\r\n\r\n"


STATUS_LINES = {s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode()) for s in HTTPStatus}


def _compact(content: Any) -> bytes:
    """How FastAPI renders a returned dict or list (`JSONResponse`)."""
    return json.dumps(content, ensure_ascii=False, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class Reply:
    """One response: a body with a length, or (`chunks` not empty) a chunked event stream.

    `chunks` are chunk-encoded already; `wait` is how long to hold the answer back;
    `headers` are extra header lines that go before the length (the 405's `allow`);
    `head_only` answers a HEAD request: the head, with the length of the body unsent.
    """

    status: int
    body: bytes = b""
    content_type: bytes = JSON_TYPE
    chunks: tuple[bytes, ...] = ()
    wait: float = 0.0
    headers: bytes = b""
    head_only: bool = False


class BadRequest(Exception):
    """The request body is not JSON, or not the JSON the route needs."""


NOT_FOUND = Reply(404, _compact({"detail": "Not Found"}))


class StandinRoutes:
    """What each route answers, computed from the request body as soon as it is complete.

    The answers are those of `create_standin_app` with the same options; the pure routes
    are cached by request body, up to `cache_size` entries each (oldest out first). Build
    it with `create`, which reads the stream's frames from `model` once.
    """

    def __init__(
        self,
        model: ChatModel,
        stream_frames: Sequence[bytes],
        *,
        delay: float = 0.0,
        dimension: int = DIMENSION,
        cache_size: int = 4096,
    ) -> None:
        if delay < 0 or model.token_interval < 0 or dimension < 2 or cache_size < 1:
            raise ValueError("need delay, token_interval >= 0, dimension >= 2, cache_size >= 1")
        self.model = model
        self.delay = delay
        self.token_interval = model.token_interval
        self.dimension = dimension
        self.cache_size = cache_size
        self.stream_chunks = tuple(b"%x\r\n%s\r\n" % (len(f), f) for f in stream_frames)
        self.vectors: dict[str, list[float]] = {}
        self.answers: dict[tuple[bytes, bytes], Reply] = {}
        sources = [{"name": source, "id": source, "chunks": 1} for source, _, _ in DOCUMENTS]
        models = _compact({"object": "list", "data": [{"id": "standin", "object": "model"}]})
        self.table: dict[bytes, tuple[bytes, Callable[[bytes], Reply]]] = {
            b"/health": (b"GET", self._constant(_compact({"status": "ok"}))),
            b"/v1/ready": (b"GET", self._constant(_compact({"status": "ready"}))),
            b"/info": (b"GET", self._constant(_compact(tei_info()))),
            b"/v1/models": (b"GET", self._constant(models)),
            b"/condense/v1/models": (b"GET", self._constant(models)),
            b"/v1/dataprep/get": (b"POST", self._constant(_compact(sources))),
            b"/v1/embeddings": (b"POST", self._cached(b"embeddings", self._embeddings)),
            b"/rerank": (b"POST", self._cached(b"rerank", self._rerank)),
            b"/v1/retrieval": (b"POST", self._cached(b"retrieval", self._retrieval)),
            b"/v1/chat/completions": (b"POST", self._chat),
            b"/condense/v1/chat/completions": (b"POST", self._chat),
        }

    @classmethod
    async def create(
        cls,
        *,
        delay: float = 0.0,
        tokens: int = 20,
        token_interval: float = 0.0,
        dimension: int = DIMENSION,
        cache_size: int = 4096,
    ) -> StandinRoutes:
        """The routes for `create_standin_app`'s options."""
        frames = [frame async for frame in ChatModel(tokens, 0.0).stream()]
        model = ChatModel(tokens, token_interval)
        return cls(model, frames, delay=delay, dimension=dimension, cache_size=cache_size)

    def answer(self, method: bytes, path: bytes, body: bytes) -> Reply:
        """The reply to one request; computed now, even when it is to be sent later."""
        route = self.table.get(path)
        if route is None:
            return NOT_FOUND
        allowed, handler = route
        if method != allowed:
            detail = _compact({"detail": "Method Not Allowed"})
            return Reply(405, detail, headers=b"allow: " + allowed + b"\r\n")
        try:
            return handler(body)
        except BadRequest as exc:
            return Reply(400, _compact({"detail": str(exc)}))

    # --- the routes -------------------------------------------------------------------

    @staticmethod
    def _constant(body: bytes) -> Callable[[bytes], Reply]:
        reply = Reply(200, body)
        return lambda _: reply

    def _cached(self, route: bytes, build: Callable[[Any], bytes]) -> Callable[[bytes], Reply]:
        reply_wait = self.delay

        def handler(body: bytes) -> Reply:
            key = (route, body)
            reply = self.answers.get(key)
            if reply is None:
                reply = Reply(200, build(_parse(body)), wait=reply_wait)
                _remember(self.answers, key, reply, self.cache_size)
            return reply

        return handler

    def _embeddings(self, body: Any) -> bytes:
        sent = _field(body, "input")
        texts = [sent] if isinstance(sent, str) else sent
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise BadRequest("input must be a string or a list of strings")
        data = [
            {"object": "embedding", "index": i, "embedding": self._vector(t)}
            for i, t in enumerate(texts)
        ]
        return json.dumps({"object": "list", "model": "standin", "data": data}).encode()

    def _vector(self, text: str) -> list[float]:
        vector = self.vectors.get(text)
        if vector is None:
            vector = hashed_vector(text, self.dimension)
            _remember(self.vectors, text, vector, self.cache_size)
        return vector

    @staticmethod
    def _rerank(body: Any) -> bytes:
        query_text, texts = _field(body, "query"), _field(body, "texts")
        if not isinstance(query_text, str) or not isinstance(texts, list):
            raise BadRequest("query must be a string and texts a list")
        if not all(isinstance(t, str) for t in texts):
            raise BadRequest("texts must be strings")
        # The formula of `create_standin_app`'s /rerank route, which keeps it inline.
        query = set(query_text.lower().split())
        scores = [len(query & set(t.lower().split())) / (1 + len(query)) for t in texts]
        ranked = sorted(
            ({"index": i, "score": s} for i, s in enumerate(scores)),
            key=lambda item: -item["score"],
        )
        return json.dumps(ranked).encode()

    @staticmethod
    def _retrieval(body: Any) -> bytes:
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        try:
            k = int(body.get("k", 4))
        except (TypeError, ValueError) as exc:
            raise BadRequest("k must be an integer") from exc
        return json.dumps(_retrieved(str(body.get("text", "")), k)).encode()

    def _chat(self, raw: bytes) -> Reply:
        body = _parse(raw)
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        if body.get("stream"):
            return Reply(200, content_type=SSE_TYPE, chunks=self.stream_chunks, wait=self.delay)
        try:
            completion = self.model.completion(body)
        except (KeyError, IndexError, TypeError) as exc:  # a condense request without messages
            raise BadRequest(f"not a chat request: {exc!r}") from exc
        return Reply(200, completion, wait=self.delay)


def _parse(body: bytes) -> Any:
    try:
        return decode_json(body)
    except ValueError as exc:  # json's and orjson's decode errors are ValueErrors
        raise BadRequest("the body is not JSON") from exc


def _field(body: Any, name: str) -> Any:
    if not isinstance(body, dict) or name not in body:
        raise BadRequest(f"the body has no {name!r} field")
    return body[name]


def _remember(cache: dict[Any, Any], key: Any, value: Any, limit: int) -> None:
    if len(cache) >= limit:
        del cache[next(iter(cache))]  # dicts keep insertion order: the oldest goes
    cache[key] = value


# --------------------------------------------------------------------------- HTTP/1.1


class _Clock:
    """uvicorn's `date` header, formatted once a second."""

    def __init__(self) -> None:
        self.second = -1
        self.header = b""

    def date_header(self) -> bytes:
        now = int(time.time())
        if now != self.second:
            self.second = now
            self.header = b"date: " + formatdate(now, usegmt=True).encode() + b"\r\n"
        return self.header


class HTTPConnection(asyncio.Protocol):
    """One client connection: parse requests with httptools, answer them in order.

    An answer with no wait is written from the parser's callback; one that waits (a delay,
    or a stream with a token interval) goes to a task, and requests that arrive meanwhile
    (pipelined) queue behind it so answers keep the order of the requests.
    """

    def __init__(self, routes: StandinRoutes, clock: _Clock) -> None:
        self.routes = routes
        self.clock = clock
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []
        self.queue: deque[tuple[Reply, bool]] = deque()
        self.task: asyncio.Task[None] | None = None
        self.idle: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self._arm_idle_timer()

    def data_received(self, data: bytes) -> None:
        if self.idle is not None:
            self.idle.cancel()
            self.idle = None
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError:  # a bug here, not a bad request
            logger.exception("answering a request failed")
            self._refuse(500, "Internal Server Error")
        except httptools.HttpParserUpgrade:
            self._refuse(400, "Unsupported upgrade request.")
        except httptools.HttpParserError:
            self._refuse(400, "Invalid HTTP request received.")

    def connection_lost(self, exc: Exception | None) -> None:
        if self.idle is not None:
            self.idle.cancel()
        if self.task is not None:
            self.task.cancel()
        self.transport = None

    # --- httptools callbacks

    def on_message_begin(self) -> None:
        self.url = b""
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url += url  # the parser may hand the URL over in pieces

    def on_body(self, body: bytes) -> None:
        self.body.append(body)  # chunked request bodies arrive decoded

    def on_message_complete(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        path = self.url.partition(b"?")[0]
        method = self.parser.get_method()
        reply = self.routes.answer(method, path, b"".join(self.body))
        if method == b"HEAD":  # the head alone: FastAPI's 405 with its length, no body
            reply = replace(reply, head_only=True)
        keep_alive = self.parser.should_keep_alive() and self.parser.get_http_version() != "1.0"
        waits = reply.wait > 0 or (bool(reply.chunks) and self.routes.token_interval > 0)
        if self.task is None and not waits:
            self._write(reply, keep_alive)
            self._finished(keep_alive)
        else:
            self.queue.append((reply, keep_alive))
            if self.task is None:
                self.task = asyncio.get_running_loop().create_task(self._answer_queue())

    # --- writing

    def _head(self, reply: Reply, keep_alive: bool) -> bytes:
        # uvicorn's headers in uvicorn's order, so the client parses the same response.
        parts = [STATUS_LINES[reply.status], self.clock.date_header(), b"server: uvicorn\r\n"]
        parts.append(reply.headers)
        if not reply.chunks:
            parts.append(b"content-length: %d\r\n" % len(reply.body))
        parts.append(b"content-type: " + reply.content_type + b"\r\n")
        if not keep_alive:
            parts.append(b"connection: close\r\n")
        if reply.chunks:
            parts.append(b"transfer-encoding: chunked\r\n")
        parts.append(b"\r\n")
        return b"".join(parts)

    def _write(self, reply: Reply, keep_alive: bool) -> None:
        assert self.transport is not None
        write = self.transport.write
        write(self._head(reply, keep_alive))  # uvicorn, too, sends the head on its own
        if reply.head_only:
            return
        if not reply.chunks:
            write(reply.body)
            return
        for chunk in reply.chunks:
            write(chunk)
        write(END_OF_CHUNKS)

    async def _answer_queue(self) -> None:
        interval = self.routes.token_interval
        while self.queue:
            reply, keep_alive = self.queue.popleft()
            if reply.wait > 0:
                await asyncio.sleep(reply.wait)
            if self.transport is None or self.transport.is_closing():
                return
            if reply.chunks and interval > 0:
                await self._write_paced(reply, keep_alive, interval)
            else:
                self._write(reply, keep_alive)
            if not self._finished(keep_alive):
                return
        self.task = None
        self._arm_idle_timer()

    async def _write_paced(self, reply: Reply, keep_alive: bool, interval: float) -> None:
        """A stream `interval` seconds between tokens (the final frame has no token)."""
        assert self.transport is not None
        self.transport.write(self._head(reply, keep_alive))
        for chunk in reply.chunks[:-1]:
            self.transport.write(chunk)
            await asyncio.sleep(interval)
            if self.transport is None or self.transport.is_closing():
                return
        self.transport.write(reply.chunks[-1])
        self.transport.write(END_OF_CHUNKS)

    def _finished(self, keep_alive: bool) -> bool:
        """After a response: close the connection unless it is kept alive (then True)."""
        if self.transport is None:
            return False
        if not keep_alive:
            self.transport.close()
            return False
        if self.task is None:
            self._arm_idle_timer()
        return True

    def _arm_idle_timer(self) -> None:
        if self.transport is not None and self.idle is None:
            loop = asyncio.get_running_loop()
            self.idle = loop.call_later(KEEP_ALIVE_SECONDS, self._close_idle)

    def _close_idle(self) -> None:
        self.idle = None
        if self.transport is not None and self.task is None:
            self.transport.close()

    def _refuse(self, status: int, message: str) -> None:
        """A plain-text answer, as uvicorn gives to what it cannot parse, then close."""
        if self.transport is None or self.transport.is_closing():
            return
        body = message.encode()
        self.transport.write(
            STATUS_LINES[status]
            + self.clock.date_header()
            + b"server: uvicorn\r\ncontent-type: text/plain; charset=utf-8\r\n"
            + b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
            + body
        )
        self.transport.close()


# --------------------------------------------------------------------------- serving


async def start_server(host: str, port: int, routes: StandinRoutes) -> asyncio.Server:
    """Listen on `host:port` (loopback only) with `routes`; the caller serves it forever."""
    if not _is_loopback(host):
        raise ValueError(f"the fast stand-ins listen on loopback only, not {host!r}")
    clock = _Clock()
    loop = asyncio.get_running_loop()
    return await loop.create_server(
        lambda: HTTPConnection(routes, clock), host, port, reuse_address=True, backlog=2048
    )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def _serve(args: argparse.Namespace) -> None:
    routes = await StandinRoutes.create(
        delay=args.delay,
        tokens=args.tokens,
        token_interval=args.token_interval,
        dimension=args.dimension,
        cache_size=args.cache_size,
    )
    server = await start_server(args.host, args.port, routes)
    async with server:
        await server.serve_forever()


def _loopback_host(text: str) -> str:
    if not _is_loopback(text):
        raise argparse.ArgumentTypeError(f"a loopback address, not {text!r}")
    return text


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="TEI + OpenAI + retriever stand-in on loopback, without FastAPI (no faults)"
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", type=_loopback_host, default="127.0.0.1", help="loopback")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each answer")
    parser.add_argument("--tokens", type=int, default=20, help="pieces in a chat reply")
    parser.add_argument(
        "--token-interval", type=float, default=0.0, help="seconds between streamed pieces"
    )
    parser.add_argument("--dimension", type=int, default=DIMENSION, help="embedding width")
    parser.add_argument(
        "--cache-size", type=int, default=4096, help="answers (and vectors) kept per cache"
    )
    args = parser.parse_args(argv)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is in the test environment
        asyncio.run(_serve(args))
    else:
        uvloop.run(_serve(args))


if __name__ == "__main__":
    main()
