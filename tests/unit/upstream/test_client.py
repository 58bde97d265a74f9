"""`UpstreamClient` over a `MockTransport`: what goes out for each call, what comes back."""

from __future__ import annotations

import base64
import gzip
import json
import zlib
from collections.abc import Callable

import httpx2
import numpy as np
import pytest

from chatqna.upstream.client import URLS_KEPT, UpstreamClient, without_credentials
from chatqna.upstream.types import Reply

pytestmark = pytest.mark.anyio


def recording(seen: list[httpx2.Request], answer: httpx2.Response) -> httpx2.MockTransport:
    def handle(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return answer

    return httpx2.MockTransport(handle)


def client(
    seen: list[httpx2.Request], answer: httpx2.Response, headers: dict[str, str] | None = None
) -> UpstreamClient:
    return UpstreamClient(
        "http://tei.test:8080/base/",
        timeout_seconds=5,
        connect_timeout_seconds=1,
        headers=headers,
        transport=recording(seen, answer),
    )


async def test_a_post_sends_compact_json_with_json_headers_under_the_base_path() -> None:
    seen: list[httpx2.Request] = []
    upstream = client(seen, httpx2.Response(200, json={"ok": True}))
    reply = await upstream.post("/v1/embeddings", {"input": ["a"], "v": np.float32(0.5)})
    (request,) = seen
    assert str(request.url) == "http://tei.test:8080/base/v1/embeddings"
    assert request.content == b'{"input":["a"],"v":0.5}'
    assert request.headers["content-type"] == "application/json"
    assert request.headers["accept"] == "application/json"
    assert (reply.status, reply.json()) == (200, {"ok": True})


async def test_a_get_has_no_body_and_no_content_type_and_headers_go_with_every_call() -> None:
    seen: list[httpx2.Request] = []
    upstream = client(seen, httpx2.Response(204), headers={"Authorization": "Bearer k"})
    await upstream.get("/health")
    await upstream.post("/x", {})
    get, post = seen
    assert get.content == b"" and "content-type" not in get.headers
    assert get.headers["authorization"] == post.headers["authorization"] == "Bearer k"


async def test_a_stream_asks_for_an_event_stream_and_reads_as_it_comes() -> None:
    seen: list[httpx2.Request] = []
    upstream = client(seen, httpx2.Response(200, content=b"data: [DONE]\n\n"))
    stream = await upstream.open_stream("/v1/chat/completions", {"stream": True})
    assert stream.status == 200
    assert b"".join([chunk async for chunk in stream.chunks()]) == b"data: [DONE]\n\n"
    await stream.aclose()
    assert seen[0].headers["accept"] == "text/event-stream"
    assert json.loads(seen[0].content) == {"stream": True}


async def test_parsed_urls_are_kept_for_a_few_paths_and_every_call_goes_to_its_own() -> None:
    seen: list[httpx2.Request] = []
    upstream = client(seen, httpx2.Response(204))
    paths = [f"/v1/p{n}?q={n}" for n in range(URLS_KEPT + 3)]
    for path in [*paths, *paths]:
        await upstream.get(path)
    expected = [f"http://tei.test:8080/base{path}" for path in paths]
    assert [str(request.url) for request in seen] == expected * 2
    assert len(upstream._urls) == URLS_KEPT


async def test_aclose_marks_the_client_closed() -> None:
    upstream = client([], httpx2.Response(200))
    assert not upstream.is_closed
    await upstream.aclose()
    assert upstream.is_closed


def test_a_reply_that_is_not_json_raises_the_json_error() -> None:
    with pytest.raises(json.JSONDecodeError):
        Reply(200, b"<html>").json()


async def test_credentials_in_the_url_are_basic_auth_and_left_out_of_base_url() -> None:
    seen: list[httpx2.Request] = []
    upstream = UpstreamClient(
        "https://svc%40corp:p%3Ass@llm.test/v1",
        timeout_seconds=5,
        connect_timeout_seconds=1,
        transport=recording(seen, httpx2.Response(200, json={})),
    )
    await upstream.post("/chat/completions", {})
    assert upstream.base_url == "https://llm.test/v1"
    assert str(seen[0].url) == "https://llm.test/v1/chat/completions"
    basic = base64.b64encode(b"svc@corp:p:ss").decode()
    assert seen[0].headers["authorization"] == f"Basic {basic}"


def test_without_credentials_keeps_everything_but_the_userinfo() -> None:
    assert without_credentials("http://u:p@tei:80/x?y=1") == "http://tei:80/x?y=1"
    assert without_credentials("http://tei:80/a@b") == "http://tei:80/a@b"


@pytest.mark.parametrize(
    ("encoding", "compress"), [("gzip", gzip.compress), ("deflate", zlib.compress)]
)
async def test_compressed_bodies_come_back_decoded_whole_and_streamed(
    encoding: str, compress: Callable[[bytes], bytes]
) -> None:
    plain = b'{"answer": "' + b"forty-two " * 200 + b'"}'
    answer = httpx2.Response(200, headers={"Content-Encoding": encoding}, content=compress(plain))
    upstream = client([], answer)
    assert (await upstream.post("/x", {})).body == plain
    stream = await upstream.open_stream("/x", {})
    assert b"".join([chunk async for chunk in stream.chunks()]) == plain
    await stream.aclose()
