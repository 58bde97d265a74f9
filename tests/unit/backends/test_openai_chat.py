"""OpenAIChatLLM against the OpenAI `/v1/chat/completions` wire format, mocked with respx."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest
import respx

from chatqna.backends.openai_chat import (
    ANSWER_OVERHEAD_BYTES,
    BYTES_PER_TOKEN,
    OpenAIChatLLM,
    answer_bytes,
    base_url_of,
    merged,
)
from chatqna.backends.protocols import Delta, GenerationParams, Usage
from chatqna.errors import BadUpstreamResponse, ContextTooLong, UpstreamError, UpstreamTimeout
from chatqna.upstream.sessions import END_WAIT_SECONDS
from tests.unit.backends.conftest import shape

pytestmark = pytest.mark.anyio

BASE = "http://llm.test:8000"
PATH = "/v1/chat/completions"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
PARAMS = GenerationParams(max_tokens=64, temperature=0.0)


@pytest.fixture
async def llm() -> AsyncIterator[OpenAIChatLLM]:
    client = OpenAIChatLLM(f"{BASE}/v1", "qwen2.5-7b-instruct")
    yield client
    await client.aclose()


def completion_body(content: Any = "Hello there.", finish: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "qwen2.5-7b-instruct",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish,
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
    }


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "qwen2.5-7b-instruct",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def data(payload: Any) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


def sse(*events: str) -> bytes:
    return "".join(events).encode()


async def collect(llm: OpenAIChatLLM, deltas: list[Delta] | None = None) -> list[Delta]:
    out = [] if deltas is None else deltas
    async for delta in llm.stream(MESSAGES, PARAMS):
        out.append(delta)
    return out


# --------------------------------------------------------------------------- request


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("http://h:8000/v1", "http://h:8000"),
        ("http://h:8000/v1/", "http://h:8000"),
        ("http://h:8000", "http://h:8000"),
        ("http://h:8000/", "http://h:8000"),
        ("http://h/openai/v1", "http://h/openai"),
        ("http://h/v10", "http://h/v10"),
    ],
)
def test_base_url_of(endpoint: str, expected: str) -> None:
    assert base_url_of(endpoint) == expected


async def test_complete_request_payload(router: respx.MockRouter, llm: OpenAIChatLLM) -> None:
    route = router.post(PATH).respond(json=completion_body())
    await llm.complete(MESSAGES, PARAMS)
    assert route.call_count == 1
    request = route.calls[0].request
    assert str(request.url) == f"{BASE}{PATH}"  # the /v1 suffix is not doubled
    payload = json.loads(request.content)
    assert payload["model"] == "qwen2.5-7b-instruct"
    assert payload["messages"] == MESSAGES
    assert payload["max_tokens"] == 64
    assert "temperature" in payload
    assert payload["temperature"] == 0
    for unset in ("top_p", "top_k", "stop", "seed", "presence_penalty", "frequency_penalty"):
        assert unset not in payload
    assert "response_format" not in payload
    assert payload.get("stream", False) is False


async def test_authorization_header_with_api_key(router: respx.MockRouter) -> None:
    route = router.post(PATH).respond(json=completion_body())
    llm = OpenAIChatLLM(BASE, "m", api_key="sk-test-123")
    await llm.complete(MESSAGES, PARAMS)
    await llm.aclose()
    assert route.calls[0].request.headers["authorization"] == "Bearer sk-test-123"


async def test_credentials_in_the_endpoint_are_basic_auth_and_never_shown(
    router: respx.MockRouter,
) -> None:
    route = router.post(PATH).respond(json=completion_body())
    router.get("/v1/models").respond(json={"data": []})
    llm = OpenAIChatLLM("http://svc:hunter2@llm.test:8000/v1", "m")
    await llm.complete(MESSAGES, PARAMS)
    described = await llm.describe()
    await llm.aclose()
    assert route.calls[0].request.headers["authorization"].startswith("Basic ")
    assert llm.endpoint == described["endpoint"] == BASE
    assert "hunter2" not in repr(described)


async def test_no_authorization_header_without_api_key(
    router: respx.MockRouter, llm: OpenAIChatLLM
) -> None:
    route = router.post(PATH).respond(json=completion_body())
    await llm.complete(MESSAGES, PARAMS)
    assert "authorization" not in route.calls[0].request.headers


# --------------------------------------------------------------------------- complete()


async def test_complete_parses_content_finish_reason_and_usage(
    router: respx.MockRouter, llm: OpenAIChatLLM
) -> None:
    router.post(PATH).respond(json=completion_body("Export is in Settings.", finish="length"))
    completion = await llm.complete(MESSAGES, PARAMS)
    assert completion.text == "Export is in Settings."
    assert completion.finish_reason == "length"
    assert completion.usage == Usage(prompt_tokens=12, completion_tokens=5)
    assert completion.usage.total_tokens == 17


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"id": "x", "object": "chat.completion"}, id="missing-choices"),
        pytest.param({"choices": []}, id="empty-choices"),
        pytest.param({"choices": ["text"]}, id="choice-not-object"),
        pytest.param({"choices": [{"index": 0, "finish_reason": "stop"}]}, id="missing-message"),
        pytest.param(completion_body(content=42), id="int-content"),
        pytest.param(completion_body(content=["a", "b"]), id="list-content"),
        pytest.param([completion_body()], id="body-is-list"),
        pytest.param(completion_body(finish=7), id="int-finish-reason"),
        pytest.param(completion_body(finish={"why": "stop"}), id="object-finish-reason"),
    ],
)
async def test_complete_malformed_body_is_bad_response(
    router: respx.MockRouter, llm: OpenAIChatLLM, body: Any
) -> None:
    router.post(PATH).respond(json=body)
    with pytest.raises(BadUpstreamResponse) as info:
        await llm.complete(MESSAGES, PARAMS)
    assert shape(info.value) == (502, "bad_upstream_response", "llm")


async def test_a_completion_far_larger_than_max_tokens_is_refused_unparsed(
    router: respx.MockRouter, llm: OpenAIChatLLM
) -> None:
    body = completion_body()
    body["extra"] = [0.5] * (answer_bytes(PARAMS.max_tokens) // 4)  # a body of numbers
    router.post(PATH).respond(json=body)
    with pytest.raises(BadUpstreamResponse, match="larger than") as info:
        await llm.complete(MESSAGES, PARAMS)
    assert shape(info.value) == (502, "bad_upstream_response", "llm")
    router.post(PATH).respond(json=completion_body(content="x" * 64 * 16))
    assert len((await llm.complete(MESSAGES, PARAMS)).text) == 64 * 16


async def test_complete_non_json_is_bad_response(
    router: respx.MockRouter, llm: OpenAIChatLLM
) -> None:
    router.post(PATH).respond(200, text="upstream says hi")
    with pytest.raises(BadUpstreamResponse):
        await llm.complete(MESSAGES, PARAMS)


@pytest.mark.parametrize(
    "usage",
    [
        pytest.param({"prompt_tokens": "twelve", "completion_tokens": 5}, id="text"),
        pytest.param({"prompt_tokens": 2**64 - 1, "completion_tokens": 2**64 - 1}, id="2**64-1"),
        pytest.param({"prompt_tokens": 1, "completion_tokens": 2**32}, id="2**32"),
    ],
)
async def test_complete_malformed_usage_is_bad_response(
    router: respx.MockRouter, llm: OpenAIChatLLM, usage: dict[str, Any]
) -> None:
    body = completion_body()
    body["usage"] = usage
    router.post(PATH).respond(json=body)
    with pytest.raises(BadUpstreamResponse) as info:
        await llm.complete(MESSAGES, PARAMS)
    assert shape(info.value) == (502, "bad_upstream_response", "llm")


async def test_the_largest_token_counts_are_read(
    router: respx.MockRouter, llm: OpenAIChatLLM
) -> None:
    body = completion_body()
    body["usage"] = {"prompt_tokens": 2**32 - 1, "completion_tokens": 2**32 - 1}
    router.post(PATH).respond(json=body)
    completion = await llm.complete(MESSAGES, PARAMS)
    assert completion.usage.total_tokens == 2**33 - 2


@pytest.mark.parametrize("status", [500, 401])
async def test_complete_http_error_is_upstream_error(
    router: respx.MockRouter, llm: OpenAIChatLLM, status: int
) -> None:
    router.post(PATH).respond(status, json={"error": {"message": "nope"}})
    with pytest.raises(UpstreamError) as info:
        await llm.complete(MESSAGES, PARAMS)
    assert type(info.value) is UpstreamError
    assert shape(info.value) == (502, "upstream_error", "llm")


# What servers answer to a prompt longer than the model's context, as each documents it.
CONTEXT_ERRORS = {
    "llama.cpp": (
        400,
        {
            "error": {
                "code": 400,
                "message": "the request exceeds the available context size, try increasing it",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": 5210,
                "n_ctx": 4096,
            }
        },
    ),
    "openai": (
        400,
        {
            "error": {
                "message": "This model's maximum context length is 8192 tokens. However, your "
                "messages resulted in 9012 tokens. Please reduce the length of the messages.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        },
    ),
    "vllm": (
        400,
        {
            "object": "error",
            "message": "This model's maximum context length is 4096 tokens. However, you "
            "requested 5210 tokens (4698 in the messages, 512 in the completion). Please reduce "
            "the length of the messages or completion.",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        },
    ),
    "tgi": (
        422,
        {
            "error": "Input validation error: `inputs` tokens + `max_new_tokens` must be <= "
            "4096. Given: 4698 `inputs` tokens and 512 `max_new_tokens`",
            "error_type": "validation",
        },
    ),
}


@pytest.mark.parametrize("server", sorted(CONTEXT_ERRORS))
async def test_a_prompt_beyond_the_context_is_context_too_long(
    router: respx.MockRouter, llm: OpenAIChatLLM, server: str
) -> None:
    status, body = CONTEXT_ERRORS[server]
    router.post(PATH).respond(status, json=body)
    with pytest.raises(ContextTooLong) as whole:
        await llm.complete(MESSAGES, PARAMS)
    seen: list[Delta] = []
    with pytest.raises(ContextTooLong) as streamed:
        await collect(llm, seen)
    assert seen == []
    for info in (whole, streamed):
        assert (info.value.status_code, info.value.code) == (413, "context_too_long")
        assert "context window" in info.value.message and "top_n" in info.value.message
    if server == "llama.cpp":
        assert "(5210 prompt tokens, a context of 4096)" in whole.value.message


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (400, {"error": {"message": "temperature must be at most 2", "type": "invalid_value"}}),
        (400, {"error": "context"}),
        (500, {"error": {"message": "maximum context length is 4096 tokens"}}),
        (400, "not json"),
    ],
)
async def test_other_refusals_stay_upstream_errors(
    router: respx.MockRouter, llm: OpenAIChatLLM, status: int, body: Any
) -> None:
    if isinstance(body, str):
        router.post(PATH).respond(status, text=body)
    else:
        router.post(PATH).respond(status, json=body)
    with pytest.raises(UpstreamError):
        await llm.complete(MESSAGES, PARAMS)
    with pytest.raises(UpstreamError):
        await collect(llm)


async def test_complete_timeout_is_upstream_timeout(router: respx.MockRouter) -> None:
    router.post(PATH).mock(side_effect=httpx2.ReadTimeout("slow"))
    llm = OpenAIChatLLM(BASE, "m", backend="condense")
    with pytest.raises(UpstreamTimeout) as info:
        await llm.complete(MESSAGES, PARAMS)
    await llm.aclose()
    assert shape(info.value) == (504, "upstream_timeout", "condense")


# --------------------------------------------------------------------------- stream()

FULL_STREAM = sse(
    ": keep-alive comment\n\n",
    data(chunk({"role": "assistant", "content": ""})),
    "event: message\n",
    data(chunk({"content": "Hel"})),
    "\n",
    "data:" + json.dumps(chunk({"content": "lo"})) + "\n\n",
    data(chunk({}, finish="stop")),
    data(
        {
            "id": "c",
            "object": "chat.completion.chunk",
            "choices": [],
            "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9},
        }
    ),
    data("[DONE]"),
    data("this line is after [DONE] and must never be parsed"),
)


async def test_stream_request_sets_stream_true(
    router: respx.MockRouter, llm: OpenAIChatLLM
) -> None:
    route = router.post(PATH).respond(200, content=FULL_STREAM)
    await collect(llm)
    payload = json.loads(route.calls[0].request.content)
    assert payload["stream"] is True
    assert payload["model"] == "qwen2.5-7b-instruct"
    assert payload["messages"] == MESSAGES
    assert payload["temperature"] == 0


async def test_stream_parses_chunks_in_order(router: respx.MockRouter, llm: OpenAIChatLLM) -> None:
    router.post(PATH).respond(
        200, content=FULL_STREAM, headers={"content-type": "text/event-stream"}
    )
    deltas = await collect(llm)
    # The whole body arrived in one read: one delta, one piece per upstream chunk.
    (delta,) = deltas
    assert delta.pieces == ("Hel", "lo") and delta.texts() == ("Hel", "lo")
    assert delta.text == "Hello"
    assert delta.finish_reason == "stop"
    assert delta.usage == Usage(7, 2)


async def test_chunks_read_apart_are_deltas_apart(llm: OpenAIChatLLM) -> None:
    events = [
        data(chunk({"content": "Hel"})),
        data(chunk({"content": "lo"})) + data(chunk({"content": "!"})),
        data(chunk({}, finish="stop")),
        data("[DONE]"),
    ]

    async def reads() -> AsyncIterator[bytes]:
        for event in events:
            yield event.encode()

    transport = httpx2.MockTransport(lambda request: httpx2.Response(200, content=reads()))
    apart = OpenAIChatLLM(BASE, "m", transport=transport)
    deltas = await collect(apart)
    assert [d.texts() for d in deltas] == [("Hel",), ("lo", "!"), ()]
    assert [d.text for d in deltas] == ["Hel", "lo!", ""]
    assert [d.finish_reason for d in deltas] == [None, None, "stop"]


def test_merged_keeps_every_piece_and_the_last_finish_and_usage() -> None:
    together = merged(
        [
            Delta(text="a"),
            Delta(text="bc", pieces=("b", "c")),
            Delta(finish_reason="length"),
            Delta(usage=Usage(3, 4)),
        ]
    )
    assert together == Delta(
        text="abc", finish_reason="length", usage=Usage(3, 4), pieces=("a", "b", "c")
    )


async def test_stream_without_done_is_upstream_error(
    router: respx.MockRouter, llm: OpenAIChatLLM
) -> None:
    body = sse(data(chunk({"content": "partial"})), data(chunk({}, finish="stop")))
    router.post(PATH).respond(200, content=body)
    seen: list[Delta] = []
    with pytest.raises(UpstreamError) as info:
        await collect(llm, seen)
    assert type(info.value) is UpstreamError
    assert shape(info.value) == (502, "upstream_error", "llm")
    assert [d.text for d in seen if d.text] == ["partial"]


async def test_stream_non_json_data_is_bad_response(
    router: respx.MockRouter, llm: OpenAIChatLLM
) -> None:
    body = sse(data(chunk({"content": "ok"})), data("{not json"), data("[DONE]"))
    router.post(PATH).respond(200, content=body)
    with pytest.raises(BadUpstreamResponse):
        await collect(llm)


@pytest.mark.parametrize(
    "event",
    [
        pytest.param(chunk({}, finish=1), id="int-finish-reason"),
        pytest.param(chunk({}, finish=["stop"]), id="list-finish-reason"),
        pytest.param(
            {"choices": [], "usage": {"prompt_tokens": 2**64 - 1, "completion_tokens": 2**64 - 1}},
            id="usage-past-64-bits",
        ),
    ],
)
async def test_stream_malformed_finish_or_usage_is_bad_response(
    router: respx.MockRouter, llm: OpenAIChatLLM, event: dict[str, Any]
) -> None:
    body = sse(data(chunk({"content": "ok"})), data(event), data("[DONE]"))
    router.post(PATH).respond(200, content=body)
    with pytest.raises(BadUpstreamResponse) as info:
        await collect(llm)
    assert shape(info.value) == (502, "bad_upstream_response", "llm")


async def test_stream_cut_off_inside_an_event_is_bad_response(
    router: respx.MockRouter, llm: OpenAIChatLLM
) -> None:
    body = sse(data(chunk({"content": "ok"}))) + b'data: {"object": "chat.completion.chunk", "ch'
    router.post(PATH).respond(200, content=body)
    seen: list[Delta] = []
    with pytest.raises(BadUpstreamResponse, match="cut off inside an event") as info:
        await collect(llm, seen)
    assert shape(info.value) == (502, "bad_upstream_response", "llm")
    assert [d.text for d in seen] == ["ok"]


async def test_stream_error_chunk_is_upstream_error(
    router: respx.MockRouter, llm: OpenAIChatLLM
) -> None:
    body = sse(
        data(chunk({"content": "ok"})),
        "event: error\n",
        data({"error": {"message": "CUDA out of memory", "code": 500}}),
        data("[DONE]"),
    )
    router.post(PATH).respond(200, content=body)
    with pytest.raises(UpstreamError) as info:
        await collect(llm)
    assert type(info.value) is UpstreamError


async def test_stream_http_500_is_upstream_error(
    router: respx.MockRouter, llm: OpenAIChatLLM
) -> None:
    router.post(PATH).respond(500, json={"error": "boom"})
    seen: list[Delta] = []
    with pytest.raises(UpstreamError) as info:
        await collect(llm, seen)
    assert type(info.value) is UpstreamError
    assert "500" in info.value.message
    assert seen == []


async def test_stream_timeout_is_upstream_timeout(
    router: respx.MockRouter, llm: OpenAIChatLLM
) -> None:
    router.post(PATH).mock(side_effect=httpx2.ReadTimeout("slow"))
    with pytest.raises(UpstreamTimeout):
        await collect(llm)


async def test_stream_timeout_mid_body_is_upstream_timeout() -> None:
    async def body() -> AsyncIterator[bytes]:
        yield data(chunk({"content": "first"})).encode()
        raise httpx2.ReadTimeout("stalled")

    transport = httpx2.MockTransport(lambda request: httpx2.Response(200, content=body()))
    llm = OpenAIChatLLM(BASE, "m", transport=transport)
    seen: list[Delta] = []
    with pytest.raises(UpstreamTimeout):
        await collect(llm, seen)
    await llm.aclose()
    assert [d.text for d in seen] == ["first"]


async def test_a_stream_far_past_max_tokens_is_a_bad_response_and_read_no_further() -> None:
    """An upstream that ignores `max_tokens` and streams without end."""
    piece = data(chunk({"content": "x" * 4096})).encode()
    sent = 0

    async def flood() -> AsyncIterator[bytes]:
        nonlocal sent
        while True:
            sent += 1
            yield piece

    transport = httpx2.MockTransport(lambda request: httpx2.Response(200, content=flood()))
    llm = OpenAIChatLLM(BASE, "m", transport=transport)
    seen: list[Delta] = []
    with pytest.raises(BadUpstreamResponse, match="max_tokens=64") as info:
        await collect(llm, seen)
    await llm.aclose()
    assert shape(info.value) == (502, "bad_upstream_response", "llm")
    limit = answer_bytes(PARAMS.max_tokens)
    assert limit == ANSWER_OVERHEAD_BYTES + 64 * BYTES_PER_TOKEN
    assert sent == limit // len(piece) + 1  # the read that passed the bound, and no more
    assert len(seen) == sent - 1


async def test_a_stream_of_max_tokens_chunks_is_well_within_the_bound() -> None:
    """A chunk per token as vLLM sends one, with a long model name and escaped text."""
    token = data({**chunk({"content": '\\"\n\u00e9' * 3}), "model": "m" * 200}).encode()
    pieces = [token] * 64 + [data(chunk({}, finish="length")).encode(), b"data: [DONE]\n\n"]
    transport = httpx2.MockTransport(lambda request: httpx2.Response(200, content=b"".join(pieces)))
    llm = OpenAIChatLLM(BASE, "m", transport=transport)
    deltas = await collect(llm)
    await llm.aclose()
    assert sum(len(d.texts()) for d in deltas) == 64
    assert 4 * len(b"".join(pieces)) < answer_bytes(PARAMS.max_tokens)


def test_a_request_without_max_tokens_is_bounded_by_the_most_the_api_accepts() -> None:
    assert answer_bytes(None) == answer_bytes(32768)
    assert answer_bytes(1) < answer_bytes(2)


async def test_the_body_is_read_to_its_end_after_done() -> None:
    """What follows `[DONE]` is read (the connection can then be reused), never parsed."""
    read: list[bytes] = []

    async def body() -> AsyncIterator[bytes]:
        for piece in (data(chunk({"content": "ok"})), data("[DONE]"), "trailing bytes"):
            read.append(piece.encode())
            yield piece.encode()

    transport = httpx2.MockTransport(lambda request: httpx2.Response(200, content=body()))
    llm = OpenAIChatLLM(BASE, "m", transport=transport)
    assert [d.text for d in await collect(llm)] == ["ok"]
    assert read[-1] == b"trailing bytes"
    await llm.aclose()


@pytest.mark.parametrize("after_done", ["never ends", "fails"])
async def test_a_body_that_never_ends_or_fails_after_done_leaves_the_answer_whole(
    after_done: str,
) -> None:
    async def body() -> AsyncIterator[bytes]:
        yield (data(chunk({"content": "ok"})) + data("[DONE]")).encode()
        if after_done == "fails":
            raise httpx2.ReadError("reset after the answer")
        await asyncio.sleep(30)

    transport = httpx2.MockTransport(lambda request: httpx2.Response(200, content=body()))
    llm = OpenAIChatLLM(BASE, "m", transport=transport)
    started = time.monotonic()
    assert [d.text for d in await collect(llm)] == ["ok"]
    assert time.monotonic() - started < END_WAIT_SECONDS + 0.5
    await llm.aclose()


async def test_aclose_closes_the_client() -> None:
    llm = OpenAIChatLLM(BASE, "m", transport=httpx2.MockTransport(lambda r: httpx2.Response(200)))
    assert not llm._client.is_closed
    await llm.aclose()
    assert llm._client.is_closed
