"""The event-stream parser, against the WHATWG "Interpreting an event stream" rules."""

from __future__ import annotations

import itertools
import json
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chatqna.api.chat_schemas import ChunkDelta
from chatqna.api.sse import DONE, ChunkWriter, data, event
from chatqna.upstream.sse import (
    EventTooLarge,
    ServerSentEvent,
    SSEDecoder,
    iter_events,
)
from tests.sse_events import parse_events

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


def test_a_retry_of_too_many_digits_is_ignored_not_an_error() -> None:
    body = "retry: 1500\ndata: a\n\nretry: " + "9" * 5000 + "\ndata: b\n\n"
    body += "retry: 12345678901\ndata: c\n\nretry: 1234567890\ndata: d\n\n"
    events = parse_events(body)
    assert [(e.data, e.retry) for e in events] == [
        ("a", 1500),
        ("b", 1500),
        ("c", 1500),
        ("d", 1234567890),
    ]


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


def test_pending_says_whether_a_stream_stopped_inside_an_event() -> None:
    decoder = SSEDecoder()
    assert not decoder.pending
    decoder.feed("data: {")
    assert decoder.pending  # half a line
    decoder.feed("}\n")
    assert decoder.pending  # a whole line, but no blank line yet
    assert pairs(decoder.feed("\n")) == [("message", "{}")]
    assert not decoder.pending


def test_an_empty_read_between_a_cr_and_its_lf_changes_nothing() -> None:
    decoder = SSEDecoder()
    reads = ["event: x\r", "", "\ndata: 1\r\n\r\n"]
    assert pairs([event for read in reads for event in decoder.feed(read)]) == [("x", "1")]


def test_a_line_that_never_ends_is_refused_once_it_passes_the_limit() -> None:
    decoder = SSEDecoder(max_event_bytes=1000)
    decoder.feed(b"data: ")
    for _ in range(9):
        decoder.feed(b"a" * 100)  # 906 bytes: still a line in the making
    with pytest.raises(EventTooLarge, match="line is longer than 1000 bytes"):
        decoder.feed(b"a" * 100)


def test_a_whole_line_past_the_limit_in_one_read_is_refused() -> None:
    with pytest.raises(EventTooLarge):
        SSEDecoder(max_event_bytes=1000).feed(b"event: " + b"e" * 1000 + b"\n")


def test_an_event_whose_data_lines_pass_the_limit_together_is_refused() -> None:
    decoder = SSEDecoder(max_event_bytes=1000)
    line = b"data: " + b"d" * 400 + b"\n"
    assert len(decoder.feed(line * 2 + b"\n")) == 1  # 802 bytes of data: it fits
    decoder.feed(line * 2)
    with pytest.raises(EventTooLarge, match="data is longer than 1000 bytes"):
        decoder.feed(line)


def test_a_long_line_in_many_reads_costs_its_length_once() -> None:
    """Only new bytes are searched for line breaks: 4 MiB in 64-byte reads takes well
    under a second (scanning the whole buffer on each read would take minutes)."""
    decoder = SSEDecoder(max_event_bytes=8 << 20)
    started = time.process_time()
    decoder.feed(b"data: ")
    piece = b"a" * 64
    for _ in range((4 << 20) // 64):
        decoder.feed(piece)
    (event,) = decoder.feed(b"\n\n")
    assert len(event.data) == 4 << 20
    assert time.process_time() - started < 2.0
