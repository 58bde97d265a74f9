"""A response body as it arrives, decoded a bounded step at a time.

httpx decodes a gzip or deflate body one network read at a time, in one call: a read of
64 KiB that inflates a thousand times over (a compressed "bomb") becomes 64 MiB at once,
half a second of the event loop and all that memory, before whoever reads the body can
count a byte of it. Here the raw reads (`httpx.Response.aiter_raw`) go through zlib with a
bound on each call's output (`max_length`), so no decoded piece is larger than
`DECODE_STEP_BYTES`, and the event loop runs other requests between the pieces of one read.
A reader that counts what it gets (the body limit, the event-stream line limit) stops a
bomb after the piece that passes its limit, and the call's deadline can fire in between.

The encodings are httpx's own, decoded as httpx decodes them: `gzip`, and `deflate` with
or without its zlib header; several, as listed in `Content-Encoding`, are undone last
first; `identity` and names it does not know are passed over. The session asks for exactly
these (`ACCEPT_ENCODING`). A body that is not what its encoding says is
`httpx.DecodingError`, as httpx raises it.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator, Iterable, Iterator

import httpx

ACCEPT_ENCODING = "gzip, deflate"

# The most one decoding step gives: the size of one network read (httpcore reads 64 KiB),
# so a compressed body arrives in pieces no larger than a plain one's.
DECODE_STEP_BYTES = 64 * 1024


class _Inflater:
    """One `gzip` or `deflate` layer of a body, decoded at most `step` bytes per call."""

    def __init__(self, encoding: str, step: int) -> None:
        self._step = step
        self._deflate = encoding == "deflate"
        # gzip's header; deflate starts with zlib's, and falls back to none (raw deflate)
        # when the first bytes do not have it, as servers differ.
        wbits = zlib.MAX_WBITS if self._deflate else zlib.MAX_WBITS | 16
        self._zlib = zlib.decompressobj(wbits)
        self._first = True

    def feed(self, data: bytes) -> Iterator[bytes]:
        while data:
            try:
                out = self._zlib.decompress(data, self._step)
            except zlib.error as exc:
                if not (self._deflate and self._first):
                    raise httpx.DecodingError(str(exc)) from exc
                self._zlib = zlib.decompressobj(-zlib.MAX_WBITS)
                out = self._zlib.decompress(data, self._step)
            self._first = False
            data = self._zlib.unconsumed_tail
            if out:
                yield out

    def flush(self) -> bytes:
        try:
            return self._zlib.flush()
        except zlib.error as exc:  # pragma: no cover - zlib's flush raises on no input
            raise httpx.DecodingError(str(exc)) from exc


def _layers(response: httpx.Response, step: int) -> list[_Inflater]:
    """The body's encodings, the last applied first."""
    listed = response.headers.get_list("content-encoding", split_commas=True)
    names = [name.strip().lower() for name in listed]
    return [_Inflater(name, step) for name in reversed(names) if name in ("gzip", "deflate")]


def _fed(layer: _Inflater, pieces: Iterable[bytes]) -> Iterator[bytes]:
    for piece in pieces:
        yield from layer.feed(piece)


def _through(layers: list[_Inflater], data: bytes) -> Iterator[bytes]:
    """`data` decoded through every layer, lazily: one bounded piece at a time."""
    pieces: Iterable[bytes] = (data,)
    for layer in layers:
        pieces = _fed(layer, pieces)
    return iter(pieces)


def _flushed(layers: list[_Inflater]) -> Iterator[bytes]:
    for number, layer in enumerate(layers):
        rest = layer.flush()
        if rest:
            yield from _through(layers[number + 1 :], rest)


async def decoded_chunks(
    response: httpx.Response, step: int = DECODE_STEP_BYTES
) -> AsyncIterator[bytes]:
    """`response`'s body, decoded, in pieces of at most `step` bytes once decoded (a plain
    body in its network reads). A body already read (a test's `MockTransport` answer made
    from bytes, which httpx decodes at once) comes as read."""
    if response.is_stream_consumed:
        if response.content:
            yield response.content
        return
    layers = _layers(response, step)
    if not layers:
        async for chunk in response.aiter_raw():
            yield chunk
        return
    async for raw in response.aiter_raw():
        for number, piece in enumerate(_through(layers, raw)):
            if number:
                await asyncio.sleep(0)  # one read decodes to many pieces: let others run
            yield piece
    for piece in _flushed(layers):
        yield piece
