"""Server-Sent Events framing for the chat stream.

The stream is: `event: metadata` (sources and how retrieval ran), one `data: {json}` per
token in OpenAI's `chat.completion.chunk` shape, then `data: [DONE]`. An error after the
stream has started is `event: error` with the error envelope, then `data: [DONE]`. While
the answer's next token is awaited, a comment line (`: ping`) goes out every
`KEEPALIVE_SECONDS`, so that a proxy's idle timeout does not cut a slow answer. A client
that stops reading holds the upstream back (`QUEUED_ITEMS`) until the answer's deadline,
where the answer is stopped as the client's doing (`ClientStalled`), not the LLM's; one
that disconnects ends the stream. Either way the answer's generators are closed, which
closes the upstream LLM response and so stops generation there.

FastAPI's own SSE support (`fastapi.sse.EventSourceResponse` with `yield` in the path
operation) does not fit, for two reasons. It applies only to an endpoint that is itself a
generator, which always answers `text/event-stream`, while both chat routes answer JSON
when `stream` is false. And when the client goes while its producer task waits to hand an
event on (tokens come faster than a slow client reads), it leaves the generator suspended
at its `yield` until the garbage collector finds it: the LLM stream stays open meanwhile,
and is then closed in another task, where the span made current cannot be reset. Here the
answer is closed at once, in the task that runs it (`with_pings`, `EventStreamResponse`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio
import orjson
from pydantic import BaseModel
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from chatqna.api.chat_metadata_schemas import TurnMetadata
from chatqna.api.chat_schemas import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChunkChoice,
    ChunkDelta,
    CompletionChoice,
    Usage,
    wire,
)
from chatqna.api.disconnects import ClientPresence
from chatqna.backends.protocols import Completion
from chatqna.errors import ClientStalled

DONE = b"data: [DONE]\n\n"
# A comment line: every SSE client skips it, and it resets a proxy's idle timer (nginx's
# and cloud load balancers' default to 60 s; a CPU model can think longer than that).
PING = b": ping\n\n"
KEEPALIVE_SECONDS = 15.0
# The most items (tokens, or the tokens of one network read) waiting for the reader of
# `with_pings`: 16 reads of 64 KiB at most. Past them the answer's task waits for the reader
# before it reads the upstream on, so an upstream that outruns a client that stopped reading
# (its socket's buffers full) is held back by TCP instead of filling memory; the chat
# stream's task waits so until `LLM_GENERATION_TIMEOUT_SECONDS`, the bound of the whole
# answer, at most, and then stops the answer as one its client stalled (`ClientStalled`).
QUEUED_ITEMS = 16
T = TypeVar("T")


@asynccontextmanager
async def closing(iterator: AsyncIterator[T]) -> AsyncIterator[AsyncIterator[T]]:
    """`iterator` for the block, closed when the block ends (`close_quietly`)."""
    try:
        yield iterator
    finally:
        await close_quietly(iterator)


async def close_quietly(iterator: AsyncIterator[Any]) -> None:
    """Close an async generator now (running its `finally` blocks), even mid-cancellation."""
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        with anyio.CancelScope(shield=True):
            await aclose()


async def with_pings(
    source: AsyncIterator[T],
    interval: float,
    deadline_seconds: float | None = None,
    on_stalled: Callable[[], None] | None = None,
) -> AsyncIterator[T | None]:
    """The items of `source`, and None whenever `interval` seconds pass without one.

    `source` runs in a task of its own from its first item to its end, so that what it
    enters across its yields (a span made current, a timeout) it leaves in that same task;
    its exceptions are raised here (one that is not an `Exception`, such as a cancellation
    from inside it, as a `RuntimeError`). Closing this iterator cancels that task, which
    closes `source` there. At most `QUEUED_ITEMS` items wait for the reader; the task waits
    for room until `deadline_seconds` from now (None: no bound), then `on_stalled` runs,
    `source` is closed, and the reader gets the items left, then `ClientStalled`.
    """
    queue: asyncio.Queue[tuple[bool, Any]] = asyncio.Queue()  # its end always fits
    room = asyncio.Semaphore(QUEUED_ITEMS)  # items the reader has not taken yet
    loop = asyncio.get_running_loop()
    deadline = None if deadline_seconds is None else loop.time() + deadline_seconds

    async def produce() -> None:
        try:
            async with closing(source) as items:
                async for item in items:
                    if not await _room_by(room, deadline):
                        raise _stalled(deadline_seconds, on_stalled)  # `closing` closes it
                    queue.put_nowait((True, item))
        except BaseException as exc:
            queue.put_nowait((False, exc))
            raise
        queue.put_nowait((False, None))

    producer = asyncio.create_task(produce())
    try:
        while True:
            try:
                more, value = queue.get_nowait()  # most tokens are waiting already
            except asyncio.QueueEmpty:
                try:
                    async with asyncio.timeout(interval):  # no task per wait, as wait_for's
                        more, value = await queue.get()
                except TimeoutError:
                    yield None
                    continue
            if more:
                room.release()
                yield value
            elif isinstance(value, Exception):
                raise value
            elif value is not None:
                raise RuntimeError(f"the answer's stream ended with {type(value).__name__}")
            else:
                return
    finally:
        producer.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.wait({producer})
        if not producer.cancelled():
            producer.exception()  # raised to the reader already, or after it stopped reading


async def _room_by(room: asyncio.Semaphore, deadline: float | None) -> bool:
    """Take a place in the queue, waiting for the reader until `deadline` (a loop time) at
    most; False when it passed first."""
    try:
        async with asyncio.timeout_at(deadline):
            await room.acquire()
    except TimeoutError:
        return False
    return True


def _stalled(
    deadline_seconds: float | None, on_stalled: Callable[[], None] | None
) -> ClientStalled:
    """The end of an answer whose reader took nothing until the deadline, once `on_stalled`
    knows (before the source is closed, so that its close is not taken for a failure).

    The source is closed, not thrown an error: nothing failed upstream, and an LLM timeout
    here would page whoever watches the LLM for a client that stopped reading."""
    if on_stalled is not None:
        on_stalled()
    return ClientStalled(
        f"the client stopped reading: the answer was not read within its "
        f"{deadline_seconds:g}s, so it was stopped"
    )


class EventStreamResponse(StreamingResponse):
    """A `text/event-stream` response that closes its generator however the response ends.

    When the client disconnects, Starlette cancels the sending task. If the cancellation
    lands while the generator waits at a `yield` (a send was in progress), the generator is
    left suspended until the garbage collector finds it; closing it here instead runs its
    `finally` blocks at once, and those close the upstream LLM stream. `on_client_left`
    runs as soon as the departure is seen, before anything is cancelled or closed.
    """

    def __init__(
        self,
        content: AsyncIterator[bytes],
        headers: Mapping[str, str] | None = None,
        on_close: Callable[[], Awaitable[None]] | None = None,
        on_client_left: Callable[[], None] | None = None,
    ):
        super().__init__(content, media_type="text/event-stream", headers=headers)
        self._events = content
        self._on_close = on_close
        self._on_client_left = on_client_left

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        presence = ClientPresence(receive, send, self._on_client_left)
        try:
            await super().__call__(scope, presence.receive, presence.send)
        finally:
            await close_quietly(self._events)
            # When the first send fails, the generator never started: what it would have
            # closed on its way out is closed here.
            if self._on_close is not None:
                with anyio.CancelScope(shield=True):
                    await self._on_close()


def _model(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return wire(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def encode(payload: Any) -> bytes:
    """Compact UTF-8 JSON (orjson, compiled): every frame and body the chat path sends; a
    response model is sent as `chatqna.api.chat_schemas.wire` gives it."""
    return orjson.dumps(payload, default=_model, option=orjson.OPT_SERIALIZE_NUMPY)


def event(name: str, data: Any) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + encode(data) + b"\n\n"


def data(payload: Any) -> bytes:
    return b"data: " + encode(payload) + b"\n\n"


class ChunkWriter:
    """Builds the stream's `chat.completion.chunk` frames (and a whole `chat.completion`)
    that share one id and timestamp, from the response models the API schema publishes."""

    def __init__(self, model: str) -> None:
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self._content_frame: tuple[bytes, bytes] | None = None

    def content_frame(self, text: str) -> bytes:
        """The frame of a chunk whose delta is `text`, byte for byte, from a template: the
        frame of every token differs only in its text."""
        if self._content_frame is None:
            marker = "\x00content\x00"
            whole = data(self.chunk(ChunkDelta(content=marker)))
            head, _, tail = whole.partition(encode(marker))
            self._content_frame = (head, tail)
        head, tail = self._content_frame
        return head + encode(text) + tail

    def opening(self) -> ChunkDelta:
        return ChunkDelta(role="assistant", content="")

    def chunk(
        self,
        delta: ChunkDelta,
        finish_reason: str | None = None,
        metadata: TurnMetadata | None = None,
    ) -> ChatCompletionChunk:
        chunk = ChatCompletionChunk(
            id=self.id,
            object="chat.completion.chunk",
            created=self.created,
            model=self.model,
            choices=[ChunkChoice(index=0, delta=delta, finish_reason=finish_reason)],
        )
        if metadata is not None:
            chunk.metadata = metadata
        return chunk

    def completion(
        self, answer: Completion, metadata: TurnMetadata | None = None
    ) -> ChatCompletion:
        usage = answer.usage
        completion = ChatCompletion(
            id=self.id,
            object="chat.completion",
            created=self.created,
            model=self.model,
            choices=[
                CompletionChoice(
                    index=0,
                    message=AssistantMessage(role="assistant", content=answer.text),
                    finish_reason=answer.finish_reason or "stop",
                )
            ],
            usage=Usage(
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens,
                total_tokens=usage.total_tokens,
            ),
        )
        if metadata is not None:
            completion.metadata = metadata
        return completion
