"""Upstreams that are legal but unkind, on raw sockets: an OpenAI-compatible chat server whose
answers can come after a `103 Early Hints`, gzip-encoded, on a keep-alive connection it
closes under the next request, or followed by a second answer nobody asked for; a
forward HTTP proxy and a SOCKS5 proxy that record what they relay.

Each runs on its own event loop in a daemon thread (`running` starts it, yields its URL and
stops it), so a test in the main thread, or a server process, can talk to it. The chat
server answers `GET /v1/models` and `POST /v1/chat/completions`; an answer names the
`ask-<word>` marker found in the request (`Answer for <word>.`), so a test can tell whose
answer arrived where.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import re
import threading
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal, Protocol

MARKER = re.compile(rb"ask-(\w+)")
EARLY_HINTS = b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, dict[bytes, bytes], bytes]:
    """One request: its request line, its headers (lower-cased names) and its body
    (`Content-Length` framed). Raises `asyncio.IncompleteReadError` at end of stream."""
    head = await reader.readuntil(b"\r\n\r\n")
    line, *lines = head[:-4].split(b"\r\n")
    headers = {}
    for header in lines:
        name, _, value = header.partition(b":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get(b"content-length", b"0")))
    return line, headers, body


def answer_for(body: bytes) -> str:
    found = MARKER.search(body)
    return f"Answer for {found.group(1).decode() if found else 'nobody'}."


def completion(text: str) -> bytes:
    return json.dumps(
        {
            "object": "chat.completion",
            "choices": [
                {"index": 0, "finish_reason": "stop", "message": {"content": text}},
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 3},
        }
    ).encode()


def sse_events(text: str) -> list[bytes]:
    """The answer as a chat stream: one chunk per word, a stop chunk, `[DONE]`."""
    events = []
    for word in text.split(" "):
        chunk = {"choices": [{"index": 0, "delta": {"content": word + " "}}]}
        events.append(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    stop = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    events.append(b"data: " + json.dumps(stop).encode() + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return events


def chunked(piece: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(piece), piece)


@dataclass
class HostileChat:
    """The chat server's manners (switch them between requests) and what it saw.

    `early_hints`: a 103 goes before every answer. `gzip`: bodies are gzip-encoded (a
    stream is compressed event by event, flushed after each). `close_reused`: a second
    request on one connection gets no answer, the connection is closed instead (an idle
    keep-alive connection closed just as the request arrived). `idle_close_seconds`: a
    connection idle that long is closed. `overrun_seconds`: that long after an answer
    (whole or streamed), a second whole answer (for `ask-intruder`) follows on the same
    connection, as a server that miscounted a `Content-Length` or wrote a response twice
    would send it. `open_after_done`: a stream's body never ends after its `[DONE]` event
    (the connection stays open until the client closes it). `close_after_stream`: the
    connection a stream went on is closed under the next request sent on it, as llama.cpp's
    server closes it just after a stream; `server` is the `Server` header of the answers.
    `stall_models`: `GET /v1/models` never ends, but no read waits long: `"trickle"` sends
    a 200 and then a byte of its body every 0.1 s, `"hints"` a `103 Early Hints` every
    0.1 s; `stalled` counts such answers still open.
    """

    early_hints: bool = False
    gzip: bool = False
    close_reused: bool = False
    idle_close_seconds: float | None = None
    overrun_seconds: float | None = None
    open_after_done: bool = False
    close_after_stream: bool = False
    server: str | None = None
    stall_models: Literal["trickle", "hints"] | None = None
    requests: list[bytes] = field(default_factory=list)
    connections: int = 0
    stalled: int = 0
    overruns: int = 0  # second answers written so far

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        streamed = False
        try:
            while True:
                try:
                    async with asyncio.timeout(self.idle_close_seconds):
                        line, _, body = await read_request(reader)
                except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
                    return
                self.requests.append(line + b" " + body)
                if served and (self.close_reused or streamed):
                    return
                served += 1
                await self.answer(line, body, writer)
                streamed = self.close_after_stream and bool(body and json.loads(body).get("stream"))
        finally:
            writer.close()

    async def answer(self, line: bytes, body: bytes, writer: asyncio.StreamWriter) -> None:
        if self.early_hints:
            writer.write(EARLY_HINTS)
            await writer.drain()
        if line.startswith(b"GET /v1/models") and self.stall_models is not None:
            await self.stall(writer, self.stall_models)
            return
        if line.startswith(b"GET /v1/models"):
            self.whole(writer, b'{"object": "list", "data": [{"id": "hostile"}]}')
        elif json.loads(body).get("stream"):
            await self.stream(writer, sse_events(answer_for(body)))
            await self.overrun(writer)
        else:
            self.whole(writer, completion(answer_for(body)))
            await self.overrun(writer)
        await writer.drain()

    async def overrun(self, writer: asyncio.StreamWriter) -> None:
        if self.overrun_seconds is not None:
            await writer.drain()
            await asyncio.sleep(self.overrun_seconds)
            self.whole(writer, completion(answer_for(b"ask-intruder")))
            await writer.drain()
            self.overruns += 1

    async def stall(self, writer: asyncio.StreamWriter, how: str) -> None:
        """Answer forever, until the client closes the connection."""
        self.stalled += 1
        try:
            if how == "trickle":
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 1000000\r\n\r\n"
                )
            piece = EARLY_HINTS if how == "hints" else b" "
            while not writer.is_closing():
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(0.1)
        except ConnectionError:
            pass
        finally:
            self.stalled -= 1
            writer.close()

    def server_header(self) -> bytes:
        return b"" if self.server is None else b"Server: %s\r\n" % self.server.encode()

    def whole(self, writer: asyncio.StreamWriter, content: bytes) -> None:
        encoding = self.server_header()
        if self.gzip:
            content, encoding = gzip.compress(content), encoding + b"Content-Encoding: gzip\r\n"
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n"
            % (encoding, len(content))
        )
        writer.write(content)

    async def stream(self, writer: asyncio.StreamWriter, events: list[bytes]) -> None:
        encoding = self.server_header() + (b"Content-Encoding: gzip\r\n" if self.gzip else b"")
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n%s"
            b"Transfer-Encoding: chunked\r\n\r\n" % encoding
        )
        compressor = zlib.compressobj(wbits=31)  # the gzip format
        for event in events:
            if self.gzip:
                event = compressor.compress(event) + compressor.flush(zlib.Z_SYNC_FLUSH)
            writer.write(chunked(event))
            await writer.drain()
            await asyncio.sleep(0.005)
        if self.open_after_done:
            return  # the body goes on; the next read waits for the client to close
        if self.gzip:
            writer.write(chunked(compressor.flush()))
        writer.write(b"0\r\n\r\n")


@dataclass
class ForwardProxy:
    """A forward HTTP proxy for `http://` URLs: each request goes to its origin on a new
    connection (`Connection: close` both ways); `seen` keeps each request line as it came."""

    seen: list[bytes] = field(default_factory=list)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line, headers, body = await read_request(reader)
        except asyncio.IncompleteReadError:
            writer.close()
            return
        self.seen.append(line)
        method, target, version = line.split(b" ")
        match = re.match(rb"http://([^/:]+):(\d+)(/.*)?$", target)
        if match is None:
            writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            writer.close()
            return
        host, port, path = match.group(1), int(match.group(2)), match.group(3) or b"/"
        origin_reader, origin_writer = await asyncio.open_connection(host.decode(), port)
        kept = [
            b"%s: %s" % (name, value)
            for name, value in headers.items()
            if name not in (b"connection", b"proxy-connection", b"keep-alive")
        ]
        head = b"\r\n".join([b" ".join([method, path, version]), *kept, b"Connection: close"])
        origin_writer.write(head + b"\r\n\r\n" + body)
        await origin_writer.drain()
        response_head = await origin_reader.readuntil(b"\r\n\r\n")
        lines = [
            kept_line
            for kept_line in response_head[:-4].split(b"\r\n")
            if not kept_line.lower().startswith((b"connection:", b"keep-alive:"))
        ]
        writer.write(b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n")
        while piece := await origin_reader.read(65536):
            writer.write(piece)
            await writer.drain()
        origin_writer.close()
        writer.close()


@dataclass
class Socks5Proxy:
    """A SOCKS5 proxy without authentication (RFC 1928) that relays `CONNECT`s to IPv4
    addresses and names; `seen` keeps each `(host, port)` it was asked for."""

    seen: list[tuple[str, int]] = field(default_factory=list)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _, methods = await reader.readexactly(2)
        await reader.readexactly(methods)
        writer.write(b"\x05\x00")  # version 5, no authentication
        _, _, _, kind = await reader.readexactly(4)  # version, CONNECT, reserved, kind
        if kind == 1:
            host = ".".join(str(octet) for octet in await reader.readexactly(4))
        else:
            host = (await reader.readexactly((await reader.readexactly(1))[0])).decode()
        port = int.from_bytes(await reader.readexactly(2), "big")
        self.seen.append((host, port))
        origin_reader, origin_writer = await asyncio.open_connection(host, port)
        writer.write(b"\x05\x00\x00\x01" + bytes(4) + bytes(2))  # succeeded
        await writer.drain()

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            while piece := await source.read(65536):
                sink.write(piece)
                await sink.drain()
            sink.close()

        await asyncio.gather(pipe(reader, origin_writer), pipe(origin_reader, writer))


class Serving(Protocol):
    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None: ...


@contextmanager
def running(server: Serving) -> Iterator[str]:
    """Serve `server` on a free loopback port in a daemon thread; yields its URL."""
    ready = threading.Event()
    port: list[int] = []
    stop: list[Callable[[], None]] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.CancelledError):  # cancelled when the loop stops
            await server.serve(reader, writer)

    async def main() -> None:
        listening = await asyncio.start_server(serve, "127.0.0.1", 0)
        stopped = asyncio.Event()
        port.append(listening.sockets[0].getsockname()[1])
        loop = asyncio.get_running_loop()
        stop.append(lambda: loop.call_soon_threadsafe(stopped.set))
        ready.set()
        await stopped.wait()
        listening.close()  # open connections end with the loop

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    if not ready.wait(10):
        raise RuntimeError("the hostile server did not start")
    try:
        yield f"http://127.0.0.1:{port[0]}"
    finally:
        stop[0]()
        thread.join(timeout=10)
