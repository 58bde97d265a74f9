"""Reading Server-Sent Events: the one client-side parser of `text/event-stream` bodies.

The OpenAI-compatible LLM client, the `chatqna ask` command, the tests and the load
benchmark all read event streams through `SSEDecoder` (the server side writes them with
`chatqna.api.sse`). It follows the WHATWG HTML standard, "Interpreting an event stream"
(section 9.2.6): lines end with CRLF, LF or CR; a line starting with `:` is a comment; a
field's value loses one leading space; several `data` lines join with newlines; a blank line
dispatches the event, unless it has no data; an unfinished event at the end of the stream is
dropped. Bytes may arrive split anywhere, even inside a UTF-8 character or a CRLF pair.

It is a small incremental decoder of our own rather than `httpx-sse`: it reads any source
of chunks (raw network reads, sync or async, bytes or text), and the load benchmark, which
shares the machine with the server it measures, feeds it raw reads. Measured per event on
a 200-token chat stream read one event per read, it costs about the same as httpx's
`iter_lines()` with a field loop, and less than `httpx-sse` (`benchmarks/sse_parsing.py`).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from typing import NamedTuple

_LINE_BREAK = re.compile(rb"\r\n|\r|\n")
_BOM = "\ufeff".encode()
DONE = "[DONE]"  # the data of the OpenAI-style stream's last event


class ServerSentEvent(NamedTuple):
    """One dispatched event: its type (`message` unless named), data, and last event id."""

    event: str = "message"
    data: str = ""
    id: str = ""
    retry: int | None = None

    @property
    def is_done(self) -> bool:
        """True for the `data: [DONE]` event that ends an OpenAI-style stream."""
        return self.data.strip() == DONE


class SSEDecoder:
    """Turns the chunks of one event stream, as they arrive, into `ServerSentEvent`s.

    `feed(chunk)` takes bytes (or text) and returns the events that chunk completed; a
    partial line waits in the buffer for the next chunk. Lines are split as bytes and each
    decoded whole, so a UTF-8 character split across reads is never cut (CR and LF cannot
    occur inside one).
    """

    def __init__(self) -> None:
        self._buffer = b""
        self._started = False
        self._event = ""
        self._data: list[str] = []
        self._last_id = ""
        self._retry: int | None = None

    @property
    def pending(self) -> bool:
        """True while a line or an event has begun but not ended (a stream cut off now
        would lose it)."""
        return bool(self._buffer or self._data or self._event)

    def feed(self, chunk: bytes | str) -> list[ServerSentEvent]:
        text = chunk.encode() if isinstance(chunk, str) else chunk
        if not self._started:
            if len(self._buffer) + len(text) < len(_BOM):
                self._buffer += text  # too short to tell whether it starts with a BOM
                return []
            self._started = True
            text = (self._buffer + text).removeprefix(_BOM)
            self._buffer = b""
        if self._buffer:
            text = self._buffer + text
        held = b""
        if text.endswith(b"\r"):  # maybe the first half of a CRLF: decide on the next chunk
            text, held = text[:-1], b"\r"
        lines = _LINE_BREAK.split(text) if b"\r" in text else text.split(b"\n")
        self._buffer = lines.pop() + held
        events: list[ServerSentEvent] = []
        for line in lines:
            if line.startswith(b"data:"):  # the common line, parsed here for speed
                value = line[6:] if line.startswith(b"data: ") else line[5:]
                self._data.append(value.decode("utf-8", "replace"))
            elif not line:
                if (event := self._dispatch()) is not None:
                    events.append(event)
            else:
                self.feed_line(line.decode("utf-8", "replace"))
        return events

    def feed_line(self, line: str) -> ServerSentEvent | None:
        """Interpret one complete line (without its line break); a blank line dispatches."""
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None  # a comment, often a keep-alive
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._last_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self._retry = int(value)
        return None  # other field names are ignored, as the standard says

    def end(self) -> list[ServerSentEvent]:
        """The stream is over: the events a final CR still completes (almost always none).

        Text after the last line break is not a line, and an event that no blank line
        completed is dropped, as the standard says.
        """
        tail = self._buffer
        event = (
            self.feed_line(tail[:-1].decode("utf-8", "replace")) if tail.endswith(b"\r") else None
        )
        self._buffer, self._event, self._data = b"", "", []
        return [event] if event is not None else []

    def _dispatch(self) -> ServerSentEvent | None:
        data, event = self._data, self._event
        self._data, self._event = [], ""
        if not data:
            return None
        return ServerSentEvent(event or "message", "\n".join(data), self._last_id, self._retry)


def parse_events(body: bytes | str) -> list[ServerSentEvent]:
    """Every event of a complete event-stream body."""
    decoder = SSEDecoder()
    return decoder.feed(body) + decoder.end()


def iter_events(chunks: Iterable[bytes | str]) -> Iterator[ServerSentEvent]:
    """The events of a stream read chunk by chunk (`httpx.Response.iter_bytes()`)."""
    decoder = SSEDecoder()
    for chunk in chunks:
        yield from decoder.feed(chunk)
    yield from decoder.end()


async def aiter_events(chunks: AsyncIterable[bytes | str]) -> AsyncIterator[ServerSentEvent]:
    """The events of a stream read chunk by chunk (`httpx.Response.aiter_bytes()`)."""
    decoder = SSEDecoder()
    async for chunk in chunks:
        for event in decoder.feed(chunk):
            yield event
    for event in decoder.end():
        yield event
