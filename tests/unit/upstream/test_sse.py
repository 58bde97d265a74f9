"""The event-stream parser, against the WHATWG "Interpreting an event stream" rules."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chatqna.api.chat_models import ChunkDelta
from chatqna.api.sse import DONE, ChunkWriter, data, event
from chatqna.upstream.sse import (
    ServerSentEvent,
    SSEDecoder,
    aiter_events,
    iter_events,
    parse_events,
)

# As the service writes it (its framing produces bytes), read back as text.
CHAT_STREAM = (
    event("metadata", {"source_documents": [{"source": "café.md"}]})
    + b": keep-alive\n\n"
    + data(ChunkWriter("m").chunk(ChunkDelta(content="Hé")))
    + data(ChunkWriter("m").chunk(ChunkDelta(content="llo"), "stop"))
    + DONE
).decode()


def pairs(events: list[ServerSentEvent]) -> list[tuple[str, str]]:
    return [(e.event, e.data) for e in events]


def test_a_chat_stream_as_the_service_writes_it() -> None:
    events = parse_events(CHAT_STREAM)
    assert [e.event for e in events] == ["metadata", "message", "message", "message"]
    assert json.loads(events[0].data)["source_documents"][0]["source"] == "café.md"
    assert json.loads(events[1].data)["choices"][0]["delta"]["content"] == "Hé"
    assert [e.is_done for e in events] == [False, False, False, True]


def test_several_data_lines_join_with_newlines() -> None:
    assert pairs(parse_events("data: first\ndata:second\ndata\ndata:  indented\n\n")) == [
        ("message", "first\nsecond\n\n indented")
    ]


def test_comments_and_unknown_fields_are_ignored() -> None:
    body = ": hello\n:\nfoo: bar\ndata: x\n: inside\n\n: only a comment\n\n"
    assert pairs(parse_events(body)) == [("message", "x")]


def test_a_blank_line_without_data_dispatches_nothing_and_forgets_the_event_name() -> None:
    assert pairs(parse_events("event: error\n\ndata: plain\n\n")) == [("message", "plain")]


def test_the_event_name_applies_to_one_event_only() -> None:
    body = "event: metadata\ndata: {}\n\ndata: next\n\n"
    assert pairs(parse_events(body)) == [("metadata", "{}"), ("message", "next")]


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_every_line_ending_is_a_line_ending(newline: str) -> None:
    body = f"event: a{newline}data: 1{newline}data: 2{newline}{newline}data: 3{newline}{newline}"
    assert pairs(parse_events(body)) == [("a", "1\n2"), ("message", "3")]


def test_an_event_the_stream_did_not_finish_is_dropped() -> None:
    assert pairs(parse_events("data: whole\n\ndata: cut sh")) == [("message", "whole")]
    assert pairs(parse_events("data: no blank line\n")) == []


def test_a_final_cr_still_ends_the_last_event() -> None:
    assert pairs(parse_events("data: x\n\r")) == [("message", "x")]


def test_ids_persist_and_retry_must_be_digits() -> None:
    body = "id: 7\nretry: 1500\ndata: a\n\ndata: b\n\nid: bad\0id\nretry: soon\ndata: c\n\n"
    events = parse_events(body)
    assert [(e.id, e.retry) for e in events] == [("7", 1500), ("7", 1500), ("7", 1500)]


def test_a_leading_byte_order_mark_is_skipped() -> None:
    assert pairs(parse_events("\ufeffdata: x\n\n".encode())) == [("message", "x")]


def test_done_tolerates_surrounding_spaces() -> None:
    (done,) = parse_events("data:  [DONE] \n\n")
    assert done.is_done and not ServerSentEvent(data="[DONE]x").is_done


def test_chunks_split_inside_a_character_and_a_crlf_give_the_same_events() -> None:
    body = "data: Hé\r\n\r\nevent: x\r\ndata: ☃\r\n\r\n".encode()
    decoder = SSEDecoder()
    fed = [event for i in range(len(body)) for event in decoder.feed(body[i : i + 1])]
    assert pairs(fed + decoder.end()) == [("message", "Hé"), ("x", "☃")]


@given(st.lists(st.integers(min_value=0, max_value=len(CHAT_STREAM.encode())), max_size=12))
def test_any_split_of_a_stream_gives_the_events_of_the_whole(cuts: list[int]) -> None:
    body = (CHAT_STREAM.replace("\n", "\r\n")).encode()
    bounds = [0, *sorted(cuts), len(body)]
    chunks = [body[start:end] for start, end in itertools.pairwise(bounds)]
    assert list(iter_events(chunks)) == parse_events(body)


@pytest.mark.anyio
async def test_aiter_events_reads_an_async_byte_stream() -> None:
    async def reads() -> AsyncIterator[bytes]:
        body = CHAT_STREAM.encode()
        for start in range(0, len(body), 7):
            yield body[start : start + 7]

    events = [event async for event in aiter_events(reads())]
    assert events == parse_events(CHAT_STREAM)


def test_pending_says_whether_a_stream_stopped_inside_an_event() -> None:
    decoder = SSEDecoder()
    assert not decoder.pending
    decoder.feed("data: {")
    assert decoder.pending  # half a line
    decoder.feed("}\n")
    assert decoder.pending  # a whole line, but no blank line yet
    assert pairs(decoder.feed("\n")) == [("message", "{}")]
    assert not decoder.pending
