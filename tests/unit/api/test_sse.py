"""SSE framing: a token's frame from the template is the frame built from its chunk."""

from __future__ import annotations

import orjson
import pytest

from chatqna.api.chat_models import ChunkDelta
from chatqna.api.sse import ChunkWriter, data, encode, event


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
