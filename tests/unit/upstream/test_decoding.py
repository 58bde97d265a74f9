"""Bodies as httpx2 decodes them, a bounded step at a time: what comes out, in what pieces,
and that the event loop runs between them. Streamed answers (an async iterator) come in
reads, as a socket's do; an answer made from bytes is one httpx2 has decoded already."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from collections.abc import AsyncIterator

import httpx2
import pytest
from httpx2._decoders import MAX_DECODE_CHUNK_SIZE

from chatqna.upstream.decoding import DECODE_STEP_BYTES, decoded_chunks

pytestmark = pytest.mark.anyio


PLAIN = b'{"answer": "' + b"forty-two " * 300 + b'"}'


def raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


def streamed(encoding: str, *reads: bytes) -> httpx2.Response:
    async def body() -> AsyncIterator[bytes]:
        for read in reads:
            yield read

    return httpx2.Response(200, headers={"Content-Encoding": encoding}, content=body())


async def pieces(response: httpx2.Response) -> list[bytes]:
    return [piece async for piece in decoded_chunks(response)]


@pytest.mark.parametrize(
    ("encoding", "packed"),
    [
        ("identity", PLAIN),
        ("gzip", gzip.compress(PLAIN)),
        ("deflate", zlib.compress(PLAIN)),
        ("deflate", raw_deflate(PLAIN)),
        ("gzip, deflate", zlib.compress(gzip.compress(PLAIN))),
        ("GZIP , unknown", gzip.compress(PLAIN)),
    ],
    ids=["identity", "gzip", "deflate", "raw-deflate", "gzip-then-deflate", "unknown-passed"],
)
async def test_each_encoding_comes_back_as_sent_in_any_reads(encoding: str, packed: bytes) -> None:
    reads = [packed[start : start + 7] for start in range(0, len(packed), 7)]
    assert b"".join(await pieces(streamed(encoding, *reads))) == PLAIN


async def test_an_answer_made_from_bytes_comes_as_httpx2_decoded_it() -> None:
    packed = gzip.compress(PLAIN)
    answer = httpx2.Response(200, headers={"Content-Encoding": "gzip"}, content=packed)
    assert await pieces(answer) == [PLAIN]


def test_the_decoding_step_is_httpx2s_own() -> None:
    assert DECODE_STEP_BYTES == MAX_DECODE_CHUNK_SIZE


async def test_a_read_that_inflates_a_thousandfold_comes_in_bounded_pieces() -> None:
    bomb = gzip.compress(b" " * (32 << 20))  # 32 MiB of spaces, 32 KiB on the wire
    assert len(bomb) < DECODE_STEP_BYTES
    got = await pieces(streamed("gzip", bomb))
    assert max(len(piece) for piece in got) <= DECODE_STEP_BYTES
    assert sum(len(piece) for piece in got) == 32 << 20


async def test_other_requests_run_between_the_pieces_of_one_read() -> None:
    bomb = gzip.compress(b" " * (4 * DECODE_STEP_BYTES))
    ticks = 0

    async def other_request() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    other = asyncio.create_task(other_request())
    try:
        count = 0
        async for _ in decoded_chunks(streamed("gzip", bomb)):
            count += 1
    finally:
        other.cancel()
    assert count == 4
    assert ticks >= count - 1


async def test_a_body_that_is_not_its_encoding_is_a_decoding_error() -> None:
    with pytest.raises(httpx2.DecodingError):
        await pieces(streamed("gzip", b"this is not gzip at all"))
