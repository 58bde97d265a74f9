"""Server-Sent Events framing for the chat stream.

The stream is: `event: metadata` (sources and how retrieval ran), one `data: {json}` per
token in OpenAI's `chat.completion.chunk` shape, then `data: [DONE]`. An error after the
stream has started is `event: error` with the error envelope, then `data: [DONE]`. A client
that disconnects ends the stream: its generators are closed, which closes the upstream LLM
response and so stops generation there.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import anyio
import orjson
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

DONE = b"data: [DONE]\n\n"


async def close_quietly(iterator: AsyncIterator[Any]) -> None:
    """Close an async generator now (running its `finally` blocks), even mid-cancellation."""
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        with anyio.CancelScope(shield=True):
            await aclose()


class EventStreamResponse(StreamingResponse):
    """A `text/event-stream` response that closes its generator however the response ends.

    When the client disconnects, Starlette cancels the sending task. If the cancellation
    lands while the generator waits at a `yield` (a send was in progress), the generator is
    left suspended until the garbage collector finds it; closing it here instead runs its
    `finally` blocks at once, and those close the upstream LLM stream.
    """

    def __init__(self, content: AsyncIterator[bytes], headers: Mapping[str, str] | None = None):
        super().__init__(content, media_type="text/event-stream", headers=headers)
        self._events = content

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await close_quietly(self._events)


def encode(payload: Any) -> bytes:
    """Compact UTF-8 JSON (orjson, compiled): every frame and body the chat path sends."""
    return orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)


def event(name: str, data: Any) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + encode(data) + b"\n\n"


def data(payload: Any) -> bytes:
    return b"data: " + encode(payload) + b"\n\n"


class ChunkWriter:
    """Builds OpenAI `chat.completion.chunk` objects that share one id and timestamp."""

    def __init__(self, model: str) -> None:
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self._content_frame: tuple[bytes, bytes] | None = None

    def content_frame(self, text: str) -> bytes:
        """`data(self.chunk({"content": text}))`, byte for byte, from a template: the frame
        of every token differs only in its text."""
        if self._content_frame is None:
            marker = "\x00content\x00"
            whole = data(self.chunk({"content": marker}))
            head, _, tail = whole.partition(encode(marker))
            self._content_frame = (head, tail)
        head, tail = self._content_frame
        return head + encode(text) + tail

    def chunk(
        self, delta: dict[str, Any], finish_reason: str | None = None, **extra: Any
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }
        body.update(extra)
        return body

    def completion(
        self, text: str, finish_reason: str | None, usage: dict[str, int], **extra: Any
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": finish_reason or "stop",
                }
            ],
            "usage": usage,
        }
        body.update(extra)
        return body
