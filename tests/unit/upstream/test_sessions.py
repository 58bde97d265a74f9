"""One upstream's httpx2 session over a `MockTransport`: the credentials it sends, and how much
of a body it reads. Proxies and the pool run on real sockets in
`tests/contract/test_upstream_client.py` and `tests/integration/test_hostile_upstreams.py`."""

from __future__ import annotations

import base64
import gzip
import zlib
from collections.abc import AsyncIterator, Callable

import httpx2
import pytest

from chatqna.upstream.decoding import ACCEPT_ENCODING, DECODE_STEP_BYTES
from chatqna.upstream.sessions import HttpxSession, credentials
from chatqna.upstream.types import ResponseTooLarge, Timeouts

pytestmark = pytest.mark.anyio

LIMIT = 64 * 1024
TIMEOUTS = Timeouts(read=5, connect=1)


def test_credentials_come_decoded_from_the_url() -> None:
    auth = credentials("https://us%40er:p%3Ass@llm.example/v1")
    assert auth is not None
    request = next(auth.auth_flow(httpx2.Request("GET", "https://llm.example/v1")))
    basic = base64.b64encode(b"us@er:p:ss").decode()
    assert request.headers["authorization"] == f"Basic {basic}"
    assert credentials("https://llm.example/v1") is None


def session(answer: httpx2.Response) -> HttpxSession:
    return HttpxSession(
        "http://tei.test",
        TIMEOUTS,
        transport=httpx2.MockTransport(lambda request: answer),
        max_body_bytes=LIMIT,
    )


async def test_a_body_up_to_the_limit_is_read_whole() -> None:
    reply = await session(httpx2.Response(200, content=b"x" * LIMIT)).send(
        "POST", "http://tei.test/x", {}, b"{}"
    )
    assert (reply.status, len(reply.body)) == (200, LIMIT)


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [("identity", bytes), ("gzip", gzip.compress), ("deflate", zlib.compress)],
)
async def test_a_body_past_the_limit_once_decoded_is_too_large(
    encoding: str, compress: Callable[[bytes], bytes]
) -> None:
    # 16 MiB of spaces: 16 KiB on the wire when compressed.
    body = compress(b" " * (256 * LIMIT))
    upstream = session(httpx2.Response(200, headers={"Content-Encoding": encoding}, content=body))
    with pytest.raises(ResponseTooLarge, match="larger than 65,536 bytes"):
        await upstream.send("POST", "http://tei.test/x", {}, b"{}")


async def streamed(data: bytes) -> AsyncIterator[bytes]:
    yield data  # one network read, as a socket's would come


@pytest.mark.parametrize(
    ("encoding", "compress"), [("gzip", gzip.compress), ("deflate", zlib.compress)]
)
async def test_a_streamed_bomb_is_refused_and_never_decoded_past_a_step(
    encoding: str, compress: Callable[[bytes], bytes]
) -> None:
    bomb = compress(b" " * (256 * LIMIT))  # one read of 16 KiB that decodes to 16 MiB
    headers = {"Content-Encoding": encoding}
    upstream = session(httpx2.Response(200, headers=headers, content=streamed(bomb)))
    with pytest.raises(ResponseTooLarge):
        await upstream.send("POST", "http://tei.test/x", {}, b"{}")
    upstream = session(httpx2.Response(200, headers=headers, content=streamed(bomb)))
    stream = await upstream.open("POST", "http://tei.test/x", {}, b"{}")
    try:
        sizes = [len(chunk) async for chunk in stream.chunks()]
    finally:
        await stream.aclose()
    assert sum(sizes) == 256 * LIMIT and max(sizes) <= DECODE_STEP_BYTES


async def test_bodies_are_asked_for_in_the_encodings_decoded() -> None:
    seen: list[httpx2.Request] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return httpx2.Response(204)

    upstream = HttpxSession("http://tei.test", TIMEOUTS, transport=httpx2.MockTransport(answer))
    await upstream.send("GET", "http://tei.test/x", {}, None)
    assert seen[0].headers["accept-encoding"] == ACCEPT_ENCODING == "gzip, deflate"


async def test_a_streamed_error_body_is_read_up_to_the_limit_too() -> None:
    upstream = session(httpx2.Response(500, content=b"e" * (LIMIT + 1)))
    stream = await upstream.open("POST", "http://tei.test/x", {}, b"{}")
    try:
        with pytest.raises(ResponseTooLarge):
            await stream.read()
    finally:
        await stream.aclose()


def test_the_limit_is_named_in_mebibytes_when_it_is_whole_ones() -> None:
    assert str(ResponseTooLarge(64 << 20)) == "the response body is larger than 64 MiB"
