"""The overhead benchmarks' load generator client (`benchmarks/load_client.py`):
against the fast stand-ins and against raw servers that misbehave, in this process."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType

import pytest

from tests.standins import fast_servers

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
TOKENS = 5


@pytest.fixture(scope="module")
def load_client() -> ModuleType:
    spec = importlib.util.spec_from_file_location("load_client", BENCHMARKS / "load_client.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["load_client"] = module
    spec.loader.exec_module(module)
    return module


@asynccontextmanager
async def standins() -> AsyncIterator[tuple[str, list[int]]]:
    """The fast stand-ins on a free loopback port; the list counts accepted connections."""
    routes = await fast_servers.StandinRoutes.create(tokens=TOKENS)
    accepted: list[int] = []
    made = fast_servers.HTTPConnection.connection_made

    def counting(self: fast_servers.HTTPConnection, transport: asyncio.BaseTransport) -> None:
        accepted.append(1)
        made(self, transport)

    fast_servers.HTTPConnection.connection_made = counting  # type: ignore[method-assign]
    server = await fast_servers.start_server("127.0.0.1", 0, routes)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", accepted
    finally:
        fast_servers.HTTPConnection.connection_made = made  # type: ignore[method-assign]
        server.close()


@asynccontextmanager
async def raw_server(
    on_request: Callable[[asyncio.StreamReader, asyncio.StreamWriter], object],
) -> AsyncIterator[str]:
    """A loopback server that answers each connection with `on_request`."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        result = on_request(reader, writer)
        if asyncio.iscoroutine(result):
            await result
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()


def test_a_json_answer_is_read_whole_and_the_connection_kept(load_client: ModuleType) -> None:
    async def scenario() -> None:
        async with standins() as (url, accepted):
            async with load_client.LoadSession(url) as session:
                bodies = []
                for text in ("one", "two", "one"):
                    status, body = await session.post(
                        "/v1/embeddings", json.dumps({"input": text}).encode()
                    )
                    assert status == 200
                    bodies.append(json.loads(body))
            assert len(accepted) == 1  # three requests, one keep-alive connection
        assert bodies[0] == bodies[2] != bodies[1]
        assert len(bodies[0]["data"][0]["embedding"]) == fast_servers.DIMENSION

    load_client.run(scenario())


def test_a_stream_is_read_to_its_last_chunk(load_client: ModuleType) -> None:
    async def scenario() -> bytes:
        async with standins() as (url, _), load_client.LoadSession(url) as session:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            status, answer = await session.post(
                "/v1/chat/completions", json.dumps(body | {"stream": True}).encode()
            )
        assert status == 200
        return answer

    answer = load_client.run(scenario())
    assert answer.endswith(b"data: [DONE]\n\n")
    assert answer.count(b"data: {") == TOKENS + 1  # the tokens and the closing chunk


def test_requests_in_flight_get_a_connection_each(load_client: ModuleType) -> None:
    async def scenario() -> list[int]:
        async with standins() as (url, accepted):
            async with load_client.LoadSession(url) as session:

                async def embed(text: str) -> int:
                    status, _ = await session.post(
                        "/v1/embeddings", json.dumps({"input": text}).encode()
                    )
                    return status

                statuses = await asyncio.gather(*(embed(str(n)) for n in range(4)))
                statuses += await asyncio.gather(*(embed(str(n)) for n in range(4)))
            assert len(accepted) == 4  # the second wave reused the first wave's four
        return statuses

    assert load_client.run(scenario()) == [200] * 8


def test_an_error_status_comes_back_as_it_is(load_client: ModuleType) -> None:
    async def scenario() -> tuple[int, bytes]:
        async with standins() as (url, _), load_client.LoadSession(url) as session:
            return await session.post("/v1/embeddings", b"not json")  # type: ignore[no-any-return]

    status, body = load_client.run(scenario())
    assert status == 400 and json.loads(body)["detail"]


def test_a_connection_idle_too_long_is_not_reused(
    load_client: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(load_client, "IDLE_SECONDS", 0.0)

    async def scenario() -> int:
        async with standins() as (url, accepted):
            async with load_client.LoadSession(url) as session:
                for text in ("one", "two"):
                    await session.post("/v1/embeddings", json.dumps({"input": text}).encode())
            return len(accepted)

    assert load_client.run(scenario()) == 2


def test_a_connection_closed_under_a_request_is_a_connection_error(
    load_client: ModuleType,
) -> None:
    async def scenario() -> None:
        hang_up = raw_server(lambda reader, writer: None)  # reads the request, then closes
        async with hang_up as url, load_client.LoadSession(url) as session:
            with pytest.raises(ConnectionError):
                await session.post("/v1/embeddings", b"{}")
            assert session._idle == []

    load_client.run(scenario())


def test_bytes_that_are_not_http_are_a_value_error(load_client: ModuleType) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"SMTP ready\r\n\r\n")
        await writer.drain()

    async def scenario() -> None:
        async with raw_server(answer) as url, load_client.LoadSession(url) as session:
            with pytest.raises(ValueError, match="not an HTTP response"):
                await session.post("/v1/embeddings", b"{}")

    load_client.run(scenario())


def test_an_upstream_that_never_answers_times_out(load_client: ModuleType) -> None:
    async def scenario() -> None:
        silent = raw_server(lambda reader, writer: asyncio.sleep(5))
        async with silent as url, load_client.LoadSession(url, timeout=0.2) as session:
            with pytest.raises(TimeoutError):
                await session.post("/v1/embeddings", b"{}")

    load_client.run(scenario())


def test_a_refused_port_is_an_os_error(load_client: ModuleType) -> None:
    from tests.standins.servers import free_port

    async def scenario() -> None:
        async with load_client.LoadSession(f"http://127.0.0.1:{free_port()}") as session:
            with pytest.raises(OSError):
                await session.post("/v1/embeddings", b"{}")

    load_client.run(scenario())


@pytest.mark.parametrize("url", ["https://127.0.0.1:1", "http://127.0.0.1", "127.0.0.1:80"])
def test_only_plain_http_with_a_port(load_client: ModuleType, url: str) -> None:
    with pytest.raises(ValueError, match="http://host:port"):
        load_client.LoadSession(url)
