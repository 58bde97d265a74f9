"""What a response body is asked for in, and how it is read decoded: by httpx2, with the
event loop let run while one network read inflates.

httpx2 decodes `gzip` and `deflate` (with or without its zlib header; several, as listed
in `Content-Encoding`, undone last first; `identity` and names it does not know passed
over) in bounded steps: zlib is asked for at most `DECODE_STEP_BYTES` per call, so a read
of 64 KiB that inflates a thousandfold (a compressed "bomb") is 64 pieces, each decoded
only when the reader asks for it. A reader that counts what it gets (the body limit, the
event-stream line limit) stops a bomb after the piece that passes its limit, and a call's
deadline can fire in between. A body that is not what its encoding says is
`httpx2.DecodingError`. The service asks for exactly these encodings (`ACCEPT_ENCODING`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import httpx2

# What bodies are asked for in: what httpx2 inflates in bounded steps here. httpx2's own
# default would add `br` and `zstd` whenever their packages happen to be installed.
ACCEPT_ENCODING = "gzip, deflate"

# The most one decoding step gives: httpx2's bound on one gzip or deflate piece
# (`httpx2._decoders.MAX_DECODE_CHUNK_SIZE`; `tests/unit/upstream/test_decoding.py` holds
# the two equal).
DECODE_STEP_BYTES = 1024 * 1024


async def decoded_chunks(response: httpx2.Response) -> AsyncGenerator[bytes]:
    """`response`'s body as httpx2 decodes it: a plain body in its network reads, a gzip
    or deflate one in pieces of at most `DECODE_STEP_BYTES`, with the event loop let run
    between two pieces of one read. A body already read (a test's `MockTransport` answer
    made from bytes, which httpx2 decodes at once) comes as read."""
    read_so_far = -1
    async for piece in response.aiter_bytes():
        if response.num_bytes_downloaded == read_so_far:
            await asyncio.sleep(0)  # one read decodes to many pieces: let others run
        read_so_far = response.num_bytes_downloaded
        yield piece
