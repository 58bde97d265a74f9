"""Reading a whole event-stream body in tests: every event it holds, as the client parser
(`chatqna.upstream.sse.SSEDecoder`) reads them."""

from __future__ import annotations

from chatqna.upstream.sse import ServerSentEvent, SSEDecoder


def parse_events(body: bytes | str) -> list[ServerSentEvent]:
    """Every event of a complete event-stream body."""
    decoder = SSEDecoder()
    return decoder.feed(body) + decoder.end()
