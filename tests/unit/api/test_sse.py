"""SSE framing: a token's frame from the template is the frame built from its chunk; pings
while the next token is slow to come."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Sequence

import orjson
import pytest

from chatqna.api import sse
from chatqna.api.chat_schemas import ChunkDelta
from chatqna.api.sse import ChunkWriter, data, encode, event, with_pings
from chatqna.backends.fakes import ScriptedLLM
from chatqna.backends.protocols import Delta, GenerationParams
from chatqna.errors import ClientStalled, UpstreamFailure
from chatqna.settings import Settings
from tests.unit.api.conftest import ClientFactory, make_backends, parse_sse


@pytest.mark.parametrize(
    "text",
    ["", "Hello", ' "quoted" \\ back', "é 日本 🙂", "\x00content\x00", "line\nbreak", "\u2028"],
)
def test_the_content_frame_is_the_chunk_frame_byte_for_byte(text: str) -> None:
    writer = ChunkWriter('model "x"')
    assert writer.content_frame(text) == data(writer.chunk(ChunkDelta(content=text)))
    assert writer.content_frame(text) == data(writer.chunk(ChunkDelta(content=text)))  # cached


def test_frames_are_compact_json_events() -> None:
    assert event("metadata", {"a": [1, 2]}) == b'event: metadata\ndata: {"a":[1,2]}\n\n'
    assert orjson.loads(encode({"k": "v"})) == {"k": "v"}


# --------------------------------------------------------------------------- pings

CURRENT = contextvars.ContextVar("CURRENT", default="none")


@pytest.mark.anyio
async def test_pings_fill_the_silences_and_the_items_keep_their_order() -> None:
    release = asyncio.Event()
    closed: list[str] = []

    async def source() -> AsyncIterator[str]:
        # A context variable set across yields, as a span made current is, must be reset
        # in the task that set it: a ValueError here if another task resumed the generator.
        token = CURRENT.set("inside")
        try:
            yield "first"
            await release.wait()  # the next token is slow to come
            yield "second"
        finally:
            CURRENT.reset(token)
            closed.append("closed")

    items: list[str | None] = []
    async for item in with_pings(source(), 0.01):
        items.append(item)
        if items.count(None) == 2:
            release.set()
    assert items[0] == "first" and items[-1] == "second"
    assert items[1:-1] == [None] * (len(items) - 2) and len(items) >= 4
    assert closed == ["closed"]


@pytest.mark.anyio
async def test_a_source_s_error_is_raised_to_the_reader() -> None:
    async def failing() -> AsyncIterator[str]:
        yield "first"
        raise RuntimeError("upstream broke")

    pinged = with_pings(failing(), 10)
    assert await anext(pinged) == "first"
    with pytest.raises(RuntimeError, match="upstream broke"):
        await anext(pinged)


@pytest.mark.anyio
async def test_a_source_cancelled_from_inside_ends_the_stream_at_once() -> None:
    async def cancelled() -> AsyncIterator[str]:
        yield "first"
        raise asyncio.CancelledError  # a cancellation leaking out of the source's own scope

    pinged = with_pings(cancelled(), 30)
    assert await anext(pinged) == "first"
    async with asyncio.timeout(5):  # not after the 30 s interval
        with pytest.raises(RuntimeError, match="CancelledError"):
            await anext(pinged)


@pytest.mark.anyio
async def test_closing_the_reader_closes_the_source_in_its_own_task() -> None:
    closed: list[str] = []

    async def source() -> AsyncIterator[str]:
        token = CURRENT.set("inside")
        try:
            yield "first"
            await asyncio.sleep(30)
            yield "never"
        finally:
            CURRENT.reset(token)
            closed.append("closed")

    pinged = with_pings(source(), 10)
    assert await anext(pinged) == "first"
    await pinged.aclose()  # while the source sleeps towards its second item
    assert closed == ["closed"]


@pytest.mark.anyio
async def test_closing_the_reader_returns_even_when_the_source_s_cleanup_fails() -> None:
    async def source() -> AsyncIterator[int]:
        try:
            number = 0
            while True:
                yield number
                number += 1
                await asyncio.sleep(0)
        finally:
            raise ValueError("cleanup failed")

    pinged = with_pings(source(), 10)
    async with asyncio.timeout(5):
        assert await anext(pinged) == 0
        await asyncio.sleep(0.05)  # items wait unread while the reader is busy
        await pinged.aclose()


@pytest.mark.anyio
async def test_a_reader_that_stops_reading_holds_the_source_back() -> None:
    produced = 0

    async def flood() -> AsyncIterator[int]:
        nonlocal produced
        while True:  # an upstream that never ends, each read ready at once
            produced += 1
            yield produced
            await asyncio.sleep(0)

    pinged = with_pings(flood(), 10)
    try:
        assert await anext(pinged) == 1
        for _ in range(10 * sse.QUEUED_ITEMS):  # the reader does other things meanwhile
            await asyncio.sleep(0)
        assert produced <= sse.QUEUED_ITEMS + 2
    finally:
        await pinged.aclose()


@pytest.mark.anyio
async def test_a_reader_gone_quiet_past_the_deadline_closes_the_source_as_stalled() -> None:
    ended: list[BaseException] = []
    source_ended = asyncio.Event()
    told: list[str] = []  # on_stalled's calls
    told_before_close: list[bool] = []

    async def flood() -> AsyncIterator[int]:
        number = 0
        try:
            while True:
                number += 1
                yield number
        except BaseException as exc:
            ended.append(exc)
            told_before_close.append(bool(told))
            raise
        finally:
            source_ended.set()

    pinged = with_pings(flood(), 10, deadline_seconds=0.01, on_stalled=lambda: told.append("x"))
    try:
        assert await anext(pinged) == 1
        async with asyncio.timeout(5):  # a guard, not the behaviour
            await source_ended.wait()
        # Closed (as a client that leaves closes it), not failed with an upstream error.
        assert [type(exc) for exc in ended] == [GeneratorExit]
        assert told == ["x"] and told_before_close == [True]
        queued = [item async for item in _until_error(pinged)]
        assert queued[:-1] == list(range(2, sse.QUEUED_ITEMS + 2))
        error = queued[-1]
        assert isinstance(error, ClientStalled) and not isinstance(error, UpstreamFailure)
        assert (error.status_code, error.code) == (408, "request_timeout")
    finally:
        await pinged.aclose()


async def _until_error(pinged: AsyncIterator[int | None]) -> AsyncIterator[int | Exception]:
    """The items left, then the error the reader gets (pings skipped)."""
    try:
        async for item in pinged:
            if item is not None:
                yield item
    except ClientStalled as exc:
        yield exc


class HesitantLLM(ScriptedLLM):
    """Thinks for `delay` seconds before its first token."""

    def __init__(self, delay: float) -> None:
        super().__init__("Thirty days.")
        self.delay = delay

    async def stream(
        self, messages: Sequence[dict[str, str]], params: GenerationParams
    ) -> AsyncIterator[Delta]:
        await asyncio.sleep(self.delay)
        async for delta in super().stream(messages, params):
            yield delta


@pytest.mark.anyio
async def test_a_slow_answer_s_stream_carries_pings_that_clients_skip(
    client_for: ClientFactory, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sse, "KEEPALIVE_SECONDS", 0.05)
    client = await client_for(await make_backends(settings, llm=HesitantLLM(1.0)))
    response = await client.post("/v1/chatqna", json={"messages": "How long is data kept?"})
    body = response.text
    metadata_at, answer_at = body.index("event: metadata"), body.index("Thirty")
    assert body.count(": ping\n\n", metadata_at, answer_at) >= 2
    events = parse_sse(body)
    assert events[0][0] == "metadata" and events[-1] == ("message", "[DONE]")
    assert all(": ping" not in payload for _, payload in events)
