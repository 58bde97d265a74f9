"""Bodies decoded a bounded step at a time: what comes out, in what pieces, and that the
event loop runs between them. Streamed answers (an async iterator) take the raw path, as
a socket's do; an answer made from bytes is one httpx has decoded already."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from collections.abc import AsyncIterator

import httpx
import pytest

from chatqna.upstream.decoding import DECODE_STEP_BYTES, decoded_chunks

pytestmark = pytest.mark.anyio

PLAIN = b'{"answer": "' + b"forty-two " * 300 + b'"}'


def raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


def streamed(encoding: str, *reads: bytes) -> httpx.Response:
    async def body() -> AsyncIterator[bytes]:
        for read in reads:
            yield read

    return httpx.Response(200, headers={"Content-Encoding": encoding}, content=body())


async def pieces(response: httpx.Response) -> list[bytes]:
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


async def test_an_answer_made_from_bytes_comes_as_httpx_decoded_it() -> None:
    answer = httpx.Response(200, headers={"Content-Encoding": "gzip"}, content=gzip.compress(PLAIN))
    assert await pieces(answer) == [PLAIN]


async def test_a_read_that_inflates_a_thousandfold_comes_in_bounded_pieces() -> None:
    bomb = gzip.compress(b" " * (32 << 20))  # 32 MiB of spaces, 32 KiB on the wire
    assert len(bomb) < DECODE_STEP_BYTES
    got = await pieces(streamed("gzip", bomb))
    assert max(len(piece) for piece in got) <= DECODE_STEP_BYTES
    assert sum(len(piece) for piece in got) == 32 << 20


async def test_other_requests_run_between_the_pieces_of_one_read() -> None:
    bomb = gzip.compress(b" " * (4 << 20))
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
    assert count == (4 << 20) // DECODE_STEP_BYTES
    assert ticks >= count - 1


async def test_a_body_that_is_not_its_encoding_is_a_decoding_error() -> None:
    with pytest.raises(httpx.DecodingError):
        await pieces(streamed("gzip", b"this is not gzip at all"))
