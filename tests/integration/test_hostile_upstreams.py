"""Upstreams that are legal but unkind, on real sockets: every answer still reaches the chat
it belongs to, or the chat fails with a typed error.

A `chatqna serve` process asks its chat LLM on a raw-socket server (`tests.standins.hostile`)
that can send `103 Early Hints` before each answer or gzip its bodies, or never finish its
answer to the readiness probe's `GET /v1/models`; embeddings, rerank and retrieval come from
the usual stand-ins. A second process reaches every upstream through a
forward proxy named by `HTTP_PROXY`. The keep-alive cases use the LLM client directly, against
a server that closes an idle connection, or closes it just as the next request arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx2
import pytest

from chatqna.backends.openai_chat import OpenAIChatLLM
from chatqna.backends.protocols import GenerationParams
from chatqna.errors import UpstreamError
from chatqna.upstream.client import UpstreamClient
from chatqna.upstream.policy import RetryPolicy, post_json
from chatqna.upstream.sessions import END_WAIT_SECONDS, KEEPALIVE_SECONDS
from tests.integration.conftest import ServerProcess, start_server
from tests.standins.hostile import ForwardProxy, HostileChat, running
from tests.standins.servers import create_standin_app, serve_in_thread
from tests.unit.api.conftest import parse_sse

pytestmark = pytest.mark.slow

LLM_TIMEOUT = 5  # seconds: LLM_TIMEOUT_SECONDS, which bounds the LLM's readiness probe


@dataclass
class Service:
    server: ServerProcess
    chat: HostileChat
    llm: str


def upstream_env(standin: str, llm: str) -> dict[str, str]:
    return {
        "TEI_EMBEDDING_ENDPOINT": standin,
        "TEI_RERANKING_ENDPOINT": standin,
        "RETRIEVER_ENDPOINT": standin,
        "LLM_ENDPOINT": llm,
        "LLM_MODEL_ID": "hostile",
        "LLM_TIMEOUT_SECONDS": str(LLM_TIMEOUT),
        "LLM_GENERATION_TIMEOUT_SECONDS": "10",
        "OTEL_TRACES_EXPORTER": "none",
    }


@pytest.fixture(scope="module")
def standin() -> Iterator[str]:
    with serve_in_thread(create_standin_app(tokens=4)) as url:
        yield url


@pytest.fixture(scope="module")
def service(standin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    root = tmp_path_factory.mktemp("hostile")
    chat = HostileChat()
    with running(chat) as llm:
        server = start_server(root / "data", root / "server.log", **upstream_env(standin, llm))
        try:
            yield Service(server, chat, llm)
        finally:
            server.stop()


@pytest.fixture
def chat(service: Service) -> Iterator[HostileChat]:
    yield service.chat
    service.chat.early_hints = service.chat.gzip = False
    service.chat.stall_models = None


def ask(url: str, marker: str, stream: bool) -> str:
    """The answer text of one chat about `marker` (asserting it succeeded)."""
    response = httpx2.post(
        f"{url}/v1/chatqna",
        json={"messages": f"Tell me about ask-{marker} please", "stream": stream},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    if not stream:
        return str(response.json()["choices"][0]["message"]["content"])
    events = parse_sse(response.text)
    assert [name for name, _ in events].count("error") == 0, events
    assert events[-1] == ("message", "[DONE]")
    return "".join(text_of(data) for name, data in events if name == "message")


def text_of(data: str) -> str:
    if data == "[DONE]":
        return ""
    choices: list[dict[str, Any]] = json.loads(data).get("choices") or []
    return "".join(str((c.get("delta") or {}).get("content") or "") for c in choices)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_early_hints_before_the_answer_leave_each_chat_its_own_answer(
    service: Service, chat: HostileChat, stream: bool
) -> None:
    chat.early_hints = True
    first = ask(service.server.url, "alpha", stream)
    second = ask(service.server.url, "beta", stream)
    assert first.strip() == "Answer for alpha."
    assert second.strip() == "Answer for beta."
    ready = httpx2.get(f"{service.server.url}/v1/ready", timeout=10)  # GET /v1/models, too
    assert ready.status_code == 200, ready.text


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_gzip_answers_are_decoded(service: Service, chat: HostileChat, stream: bool) -> None:
    chat.gzip = True
    assert ask(service.server.url, "gamma", stream).strip() == "Answer for gamma."
    chat.early_hints = True  # both at once
    assert ask(service.server.url, "delta", stream).strip() == "Answer for delta."


def test_readiness_answers_within_the_llm_timeout_when_its_probe_never_ends(
    service: Service, chat: HostileChat
) -> None:
    chat.stall_models = "hints"
    started = time.monotonic()
    ready = httpx2.get(f"{service.server.url}/v1/ready", timeout=30)
    elapsed = time.monotonic() - started
    assert ready.status_code == 503, ready.text
    llm = ready.json()["backends"]["llm"]
    assert llm == {"ready": False, "error": "llm: GET /v1/models timed out"}
    assert LLM_TIMEOUT <= elapsed < LLM_TIMEOUT + 4


async def abandon_probes(url: str, count: int) -> None:
    """`count` readiness probes at once, each given up by its client after half a second."""
    async with httpx2.AsyncClient(
        timeout=0.5, limits=httpx2.Limits(max_connections=None)
    ) as client:

        async def probe() -> None:
            with contextlib.suppress(httpx2.TimeoutException):
                await client.get(f"{url}/v1/ready")

        await asyncio.gather(*(probe() for _ in range(count)))


def test_abandoned_readiness_probes_give_back_their_upstream_connections(
    service: Service, chat: HostileChat
) -> None:
    chat.stall_models = "trickle"
    # More probes than an upstream's connection pool holds (100): were they kept, no chat
    # could reach the LLM any more.
    asyncio.run(abandon_probes(service.server.url, 110))
    deadline = time.monotonic() + LLM_TIMEOUT + 10
    while chat.stalled and time.monotonic() < deadline:
        time.sleep(0.2)
    assert chat.stalled == 0, f"{chat.stalled} probes still hold a connection"
    chat.stall_models = None
    assert ask(service.server.url, "after", False).strip() == "Answer for after."
    assert ask(service.server.url, "after", True).strip() == "Answer for after."
    assert httpx2.get(f"{service.server.url}/v1/ready", timeout=10).status_code == 200


def test_every_upstream_is_reached_through_the_proxy_in_http_proxy(
    standin: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp("proxied")
    proxy = ForwardProxy()
    with running(HostileChat()) as llm, running(proxy) as proxy_url:
        server = start_server(
            root / "data",
            root / "server.log",
            HTTP_PROXY=proxy_url,
            NO_PROXY="",
            **upstream_env(standin, llm),
        )
        try:
            assert ask(server.url, "epsilon", True).strip() == "Answer for epsilon."
        finally:
            server.stop()
    seen = {line.decode() for line in proxy.seen}
    assert f"POST {llm}/v1/chat/completions HTTP/1.1" in seen
    assert f"POST {standin}/v1/embeddings HTTP/1.1" in seen
    assert f"POST {standin}/v1/retrieval HTTP/1.1" in seen


def llm_client(url: str, read_timeout: float = 2) -> OpenAIChatLLM:
    return OpenAIChatLLM(url, "hostile", timeout_seconds=read_timeout, connect_timeout_seconds=1)


async def complete(llm: OpenAIChatLLM, marker: str) -> str:
    messages = [{"role": "user", "content": f"ask-{marker}"}]
    return (await llm.complete(messages, GenerationParams())).text


async def streamed(llm: OpenAIChatLLM, marker: str) -> str:
    messages = [{"role": "user", "content": f"ask-{marker}"}]
    return "".join([delta.text async for delta in llm.stream(messages, GenerationParams())])


async def streamed_and_held(llm: OpenAIChatLLM, marker: str) -> tuple[str, float]:
    """The streamed answer, and how long the stream went on after its last delta: the
    `[DONE]` event and the wait for the body's end."""
    messages = [{"role": "user", "content": f"ask-{marker}"}]
    pieces, last = [], time.monotonic()
    async for delta in llm.stream(messages, GenerationParams()):
        pieces.append(delta.text)
        last = time.monotonic()
    return "".join(pieces), time.monotonic() - last


ANSWERS = {"whole": complete, "streamed": streamed}


@pytest.mark.anyio
async def test_a_connection_closed_while_idle_is_not_reused() -> None:
    chat = HostileChat(idle_close_seconds=0.1)
    with running(chat) as url:
        llm = llm_client(url)
        try:
            assert await complete(llm, "one") == "Answer for one."
            await asyncio.sleep(0.4)  # the server has closed the idle connection by now
            assert await complete(llm, "two") == "Answer for two."
        finally:
            await llm.aclose()
    assert chat.connections == 2


@pytest.mark.anyio
async def test_a_connection_is_reused_while_fresh_and_dropped_once_idle_too_long() -> None:
    chat = HostileChat()
    with running(chat) as url:
        llm = llm_client(url)
        try:
            for marker in ("one", "two"):
                assert await complete(llm, marker) == f"Answer for {marker}."
            assert chat.connections == 1
            await asyncio.sleep(KEEPALIVE_SECONDS + 0.3)
            assert await complete(llm, "three") == "Answer for three."
        finally:
            await llm.aclose()
    assert chat.connections == 2


@pytest.mark.anyio
@pytest.mark.parametrize("pause", [0.2, 0.0], ids=["late", "at-once"])
@pytest.mark.parametrize("kind", ANSWERS)
async def test_bytes_sent_after_an_answer_never_reach_the_next_call(
    pause: float, kind: str
) -> None:
    """The upstream follows an answer (whole, or a stream read to its end) with a second
    one nobody asked for: after a pause (the connection is back in the pool by then), or in
    the same write. The next call gets its own answer, on a new connection."""
    chat = HostileChat(overrun_seconds=pause)
    answer = ANSWERS[kind]
    with running(chat) as url:
        llm = llm_client(url)
        try:
            assert (await answer(llm, "alice")).strip() == "Answer for alice."
            async with asyncio.timeout(10):
                while chat.overruns == 0:  # the intruding answer is on its way
                    await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)  # and on loopback, arrived
            chat.overrun_seconds = None
            assert (await answer(llm, "bob")).strip() == "Answer for bob."
        finally:
            await llm.aclose()
    assert chat.connections == 2


@pytest.mark.anyio
@pytest.mark.parametrize("gzip", [False, True], ids=["plain", "gzip"])
async def test_streamed_answers_read_to_their_end_reuse_the_connection(gzip: bool) -> None:
    """A stream's body ends just after its `[DONE]` event (a gzip stream's trailer comes
    after it too); the client reads that far, and the next call goes on the same
    connection instead of a new one."""
    chat = HostileChat(gzip=gzip)
    with running(chat) as url:
        llm = llm_client(url)
        try:
            for marker in ("one", "two", "three"):
                assert (await streamed(llm, marker)).strip() == f"Answer for {marker}."
        finally:
            await llm.aclose()
    assert chat.connections == 1


@pytest.mark.anyio
async def test_llama_cpps_server_which_closes_after_a_stream_gets_the_next_call_anew() -> None:
    """llama.cpp's server closes the connection just after a streamed answer; the next
    call (here the server closes it under that call) goes on a new connection instead."""
    chat = HostileChat(close_after_stream=True, server="llama.cpp")
    with running(chat) as url:
        llm = llm_client(url)
        try:
            assert (await streamed(llm, "one")).strip() == "Answer for one."
            assert await complete(llm, "two") == "Answer for two."
            assert (await streamed(llm, "three")).strip() == "Answer for three."
        finally:
            await llm.aclose()
    assert chat.connections == 2  # the whole answer's connection carries the next stream


@pytest.mark.anyio
async def test_a_body_that_goes_on_after_done_ends_the_stream_all_the_same() -> None:
    """A server that never ends the body after `[DONE]` holds the answer no longer than the
    short wait for the body's end; that connection is closed, and the next call opens one."""
    chat = HostileChat(open_after_done=True)
    read_timeout = 10  # what an answer would be held for, were the body's end awaited
    with running(chat) as url:
        llm = llm_client(url, read_timeout)
        try:
            answer, held = await streamed_and_held(llm, "one")
            assert answer.strip() == "Answer for one."
            assert held < END_WAIT_SECONDS + 1.0 < read_timeout
            assert (await streamed(llm, "two")).strip() == "Answer for two."
        finally:
            await llm.aclose()
    assert chat.connections == 2


@pytest.mark.anyio
async def test_a_connection_closed_under_a_request_is_a_typed_error_never_old_bytes() -> None:
    chat = HostileChat(close_reused=True)
    with running(chat) as url:
        llm = llm_client(url)
        try:
            assert await complete(llm, "one") == "Answer for one."
            try:
                assert await complete(llm, "two") == "Answer for two."
            except UpstreamError as exc:  # not retried: a generation is not idempotent
                assert exc.backend == "llm"
            assert await complete(llm, "three") == "Answer for three."
        finally:
            await llm.aclose()


@pytest.mark.anyio
async def test_an_idempotent_call_closed_under_it_is_retried_on_a_new_connection() -> None:
    chat = HostileChat(close_reused=True)
    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    retry = RetryPolicy(attempts=2, sleep=record)
    with running(chat) as url:
        client = UpstreamClient(url, timeout_seconds=2, connect_timeout_seconds=1)
        try:
            for marker in ("one", "two"):
                body = {"messages": [{"role": "user", "content": f"ask-{marker}"}]}
                answer = await post_json(
                    client, "/v1/chat/completions", body, backend="llm", retry=retry
                )
                assert answer["choices"][0]["message"]["content"] == f"Answer for {marker}."
        finally:
            await client.aclose()
    assert len(waits) == 1 and chat.connections == 2


@pytest.mark.anyio
@pytest.mark.parametrize("from_env", [True, False])
async def test_the_proxy_in_the_environment_is_used_unless_turned_off(
    monkeypatch: pytest.MonkeyPatch, from_env: bool
) -> None:
    proxy = ForwardProxy()
    with running(HostileChat()) as url, running(proxy) as proxy_url:
        monkeypatch.setenv("HTTP_PROXY", proxy_url)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        llm = OpenAIChatLLM(
            url, "hostile", timeout_seconds=2, proxies_from_env=from_env
        )  # the embedded LLM's client turns it off
        try:
            assert await complete(llm, "zeta") == "Answer for zeta."
        finally:
            await llm.aclose()
    assert [line.split(b" ")[1].decode() for line in proxy.seen] == (
        [f"{url}/v1/chat/completions"] if from_env else []
    )
