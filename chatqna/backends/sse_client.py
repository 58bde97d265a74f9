"""Reading Server-Sent Events: the one client-side parser of `text/event-stream` bodies.

The OpenAI-compatible LLM client, the `chatqna ask` command, the tests and the load
benchmark all read event streams through `SSEDecoder` (the server side writes them with
`chatqna.api.sse`). It follows the WHATWG HTML standard, "Interpreting an event stream"
(section 9.2.6): lines end with CRLF, LF or CR; a line starting with `:` is a comment; a
field's value loses one leading space; several `data` lines join with newlines; a blank line
dispatches the event, unless it has no data; an unfinished event at the end of the stream is
dropped. Bytes may arrive split anywhere, even inside a UTF-8 character or a CRLF pair.

It is a small incremental decoder rather than a dependency because the load benchmark shares
the machine with the server it measures: fed raw network reads, it costs less CPU per event
than an `aiter_lines()` loop (see `tests/rag-benchmarks/sse_parsing.py`).
"""

from __future__ import annotations

import codecs
import re
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from dataclasses import dataclass

_LINE_BREAK = re.compile(r"\r\n|\r|\n")
DONE = "[DONE]"  # the data of the OpenAI-style stream's last event


@dataclass(frozen=True, slots=True)
class ServerSentEvent:
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

    `feed(chunk)` takes bytes (decoded as UTF-8 across chunk boundaries) or text and returns
    the events that chunk completed; a partial line waits in the buffer for the next chunk.
    """

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buffer = ""
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
        text = self._utf8.decode(chunk) if isinstance(chunk, bytes) else chunk
        if not self._started and text:
            self._started = True
            text = text.removeprefix("\ufeff")
        text = self._buffer + text
        held = ""
        if text.endswith("\r"):  # maybe the first half of a CRLF: decide on the next chunk
            text, held = text[:-1], "\r"
        lines = _LINE_BREAK.split(text) if "\r" in text else text.split("\n")
        self._buffer = lines.pop() + held
        events: list[ServerSentEvent] = []
        for line in lines:
            event = self.feed_line(line)
            if event is not None:
                events.append(event)
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
        tail = self._buffer + self._utf8.decode(b"", final=True)
        event = self.feed_line(tail[:-1]) if tail.endswith("\r") else None
        self._buffer, self._event, self._data = "", "", []
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
