"""SSE framing: a token's frame from the template is the frame built from its chunk; pings
while the next token is slow to come."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Sequence

import orjson
import pytest

from chatqna.api import sse
from chatqna.api.chat_models import ChunkDelta
from chatqna.api.sse import ChunkWriter, data, encode, event, with_pings
from chatqna.backends.fakes import ScriptedLLM
from chatqna.backends.protocols import Delta, GenerationParams
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


async def slow_items(delays: Sequence[float], closed: list[str]) -> AsyncIterator[str]:
    """Yields `item-N` after each delay, with a context variable set across its yields (as a
    span made current is), which must be reset in the task that set it."""
    token = CURRENT.set("inside")
    try:
        for number, delay in enumerate(delays):
            await asyncio.sleep(delay)
            yield f"item-{number}"
    finally:
        CURRENT.reset(token)  # ValueError if another task resumed the generator
        closed.append("closed")


async def collect(source: AsyncIterator[str | None]) -> list[str | None]:
    return [item async for item in source]


@pytest.mark.anyio
async def test_pings_fill_the_silences_and_the_items_keep_their_order() -> None:
    closed: list[str] = []
    items = await collect(with_pings(slow_items([0.0, 0.35, 0.0], closed), 0.1))
    assert [i for i in items if i is not None] == ["item-0", "item-1", "item-2"]
    between = items[items.index("item-0") + 1 : items.index("item-1")]
    assert len(between) >= 2 and set(between) == {None}
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
async def test_closing_the_reader_closes_the_source_in_its_own_task() -> None:
    closed: list[str] = []
    pinged = with_pings(slow_items([0.0, 30.0], closed), 10)
    assert await anext(pinged) == "item-0"
    await pinged.aclose()  # while the source sleeps towards its second item
    assert closed == ["closed"]


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
    monkeypatch.setattr(sse, "KEEPALIVE_SECONDS", 0.1)
    client = await client_for(await make_backends(settings, llm=HesitantLLM(0.45)))
    response = await client.post("/v1/chatqna", json={"messages": "How long is data kept?"})
    body = response.text
    metadata_at, answer_at = body.index("event: metadata"), body.index("Thirty")
    assert body.count(": ping\n\n", metadata_at, answer_at) >= 2
    events = parse_sse(body)
    assert events[0][0] == "metadata" and events[-1] == ("message", "[DONE]")
    assert all(": ping" not in payload for _, payload in events)
