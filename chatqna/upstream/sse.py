"""Reading Server-Sent Events: the one client-side parser of `text/event-stream` bodies.

The OpenAI-compatible LLM client, the `chatqna ask` command, the tests and the load
benchmark all read event streams through `SSEDecoder` (the server side writes them with
`chatqna.api.sse`). It follows the WHATWG HTML standard, "Interpreting an event stream"
(section 9.2.6): lines end with CRLF, LF or CR; a line starting with `:` is a comment; a
field's value loses one leading space; several `data` lines join with newlines; a blank line
dispatches the event, unless it has no data; an unfinished event at the end of the stream is
dropped. Bytes may arrive split anywhere, even inside a UTF-8 character or a CRLF pair.

It is a small incremental decoder of our own rather than `httpx-sse`, for two reasons:
`httpx-sse`'s line decoder holds a line however long it grows, while an upstream's line or
event here is bounded (a stream that never sends a line break fails at the bound instead of
filling memory); and it reads any source of chunks (raw network reads, sync or async, bytes
or text). Per event of a 200-token chat stream read one event per read it costs 2.5 µs,
against 2.0 µs for httpx's `iter_lines()` with a field loop and 2.9 µs for `httpx-sse`
(`benchmarks/sse_parsing.py`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
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


class EventTooLarge(ValueError):
    """A line, or the data of one event, passed `MAX_EVENT_BYTES`: the stream is not one a
    well-behaved server sends, and reading on would hold it all in memory."""


# The most one line or one event's data may hold. A chat chunk is a few hundred bytes; the
# service's own metadata event (the source documents of a turn) is tens of kilobytes.
MAX_EVENT_BYTES = 1024 * 1024
# The most digits of a `retry` field read as a reconnection time: ten digits of milliseconds
# are over 115 days. A longer value is ignored, as a value that is not digits is (Python's
# `int` refuses a string of more than 4,300 digits).
MAX_RETRY_DIGITS = 10


class SSEDecoder:
    """Turns the chunks of one event stream, as they arrive, into `ServerSentEvent`s.

    `feed(chunk)` takes bytes (or text) and returns the events that chunk completed; a
    partial line waits in the buffer for the next chunk. Only the new chunk is searched for
    line breaks, so a line that arrives in many reads costs its length once, not once per
    read. Lines are split as bytes and each decoded whole, so a UTF-8 character split
    across reads is never cut (CR and LF cannot occur inside one). A CR ends its line at
    once; an LF right after it, in the same read or the next, is the rest of that line
    break. A line or an event's data longer than `max_event_bytes` raises `EventTooLarge`.
    """

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self.max_event_bytes = max_event_bytes
        self._buffer = bytearray()  # the line begun, without a line break
        self._started = False
        self._after_cr = False  # the last read ended with a CR: an LF next belongs to it
        self._event = ""
        self._data: list[str] = []
        self._data_bytes = 0
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
            text = (bytes(self._buffer) + text).removeprefix(_BOM)
            self._buffer.clear()
        if not text:
            return []
        if self._after_cr and text.startswith(b"\n"):
            text = text[1:]
        self._after_cr = text.endswith(b"\r")
        lines = _LINE_BREAK.split(text) if b"\r" in text else text.split(b"\n")
        rest = lines.pop()  # after the last line break: the start of a line
        if lines and self._buffer:
            lines[0] = bytes(self._buffer) + lines[0]
            self._buffer.clear()
        self._buffer += rest
        if len(self._buffer) > self.max_event_bytes:
            raise self._too_long()
        events: list[ServerSentEvent] = []
        for line in lines:
            if len(line) > self.max_event_bytes:
                raise self._too_long()
            if line.startswith(b"data:"):  # the common line, parsed here for speed
                value = line[6:] if line.startswith(b"data: ") else line[5:]
                self._add_data(value.decode("utf-8", "replace"))
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
            self._add_data(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._last_id = value
        elif name == "retry" and _is_retry_time(value):
            self._retry = int(value)
        return None  # other field names are ignored, as the standard says

    def end(self) -> list[ServerSentEvent]:
        """The stream is over. Text after the last line break is not a line, and an event
        that no blank line completed is dropped, as the standard says; so no event is
        left to give (the list is kept for callers that read one)."""
        self._buffer.clear()
        self._event, self._data, self._data_bytes = "", [], 0
        return []

    def _too_long(self) -> EventTooLarge:
        return EventTooLarge(f"an event-stream line is longer than {self.max_event_bytes} bytes")

    def _add_data(self, value: str) -> None:
        self._data_bytes += len(value) + 1
        if self._data_bytes > self.max_event_bytes:
            raise EventTooLarge(f"an event's data is longer than {self.max_event_bytes} bytes")
        self._data.append(value)

    def _dispatch(self) -> ServerSentEvent | None:
        data, event = self._data, self._event
        self._data, self._event, self._data_bytes = [], "", 0
        if not data:
            return None
        return ServerSentEvent(event or "message", "\n".join(data), self._last_id, self._retry)


def _is_retry_time(value: str) -> bool:
    """Whether a `retry` field's value is a reconnection time: ASCII digits, at most
    `MAX_RETRY_DIGITS` of them."""
    return value.isascii() and value.isdigit() and len(value) <= MAX_RETRY_DIGITS


def iter_events(chunks: Iterable[bytes | str]) -> Iterator[ServerSentEvent]:
    """The events of a stream read chunk by chunk (`httpx2.Response.iter_bytes()`)."""
    decoder = SSEDecoder()
    for chunk in chunks:
        yield from decoder.feed(chunk)
    yield from decoder.end()
