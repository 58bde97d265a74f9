"""An upload whose client disconnects while it waits for a parse token, over real sockets:
uvicorn serves the app on 127.0.0.1 in this process (on the test's event loop, fake model
backends), two slow uploads hold both tokens, and a third client sends its whole upload
and closes its socket. Its place comes back at once, it is counted as 499, and once the
tokens are free nothing of it is in the index."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import uvicorn

from chatqna.app import create_app
from chatqna.ingest import dataprep
from chatqna.ingest.parse_pool import ParsePool
from chatqna.settings import Settings
from tests.unit.api.conftest import make_backends
from tests.unit.api.test_observability import requests_counted
from tests.unit.conftest import TRACER_PROVIDER

pytestmark = pytest.mark.anyio

INGEST = "/v1/dataprep/ingest"


class InLoopServer(uvicorn.Server):
    """uvicorn on the caller's event loop, leaving the process's signal handlers alone."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@contextlib.asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[tuple[str, ParsePool]]:
    """The app on a loopback socket of its own; yields its URL and its parse pool."""
    app = create_app(settings, await make_backends(settings), TRACER_PROVIDER)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    server = InLoopServer(config)
    task = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        async with asyncio.timeout(10):
            while not server.started:
                await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}", app.state.service.parse_pool
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=10)
        listener.close()


class SlowParse:
    """`load_document` held on its thread until released, counting the parses started."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.release = threading.Event()
        self.started = threading.Semaphore(0)
        real = dataprep.load_document

        def slow(*args: Any, **kwargs: Any) -> Any:
            self.started.release()
            self.release.wait(30)
            return real(*args, **kwargs)

        monkeypatch.setattr(dataprep, "load_document", slow)

    async def wait_started(self, count: int) -> None:
        for _ in range(count):
            assert await asyncio.to_thread(self.started.acquire, True, 10)


def raw_upload(url: str, name: str, text: bytes) -> bytes:
    """The bytes of a complete HTTP/1.1 multipart upload of one file."""
    request = httpx2.Request("POST", url + INGEST, files=[("files", (name, text))])
    body = request.read()
    head = (
        f"POST {INGEST} HTTP/1.1\r\nHost: {request.url.netloc.decode()}\r\n"
        f"Content-Type: {request.headers['content-type']}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def test_a_client_gone_while_waiting_for_a_token_is_dropped_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with (
        serving(Settings(chatqna_data_dir=tmp_path / "data")) as (url, pool),
        httpx2.AsyncClient(base_url=url, trust_env=False, timeout=30) as client,
    ):
        parse = SlowParse(monkeypatch)  # the handbook the index starts with is parsed already
        try:
            slow = [
                asyncio.create_task(
                    client.post(INGEST, files=[("files", (f"slow{n}.md", b"# Slow\n\nparsed"))])
                )
                for n in range(pool.workers)
            ]
            await parse.wait_started(pool.workers)  # both tokens held
            _, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
            writer.write(raw_upload(url, "abandoned.md", b"# Abandoned\n\nnobody waits for it"))
            await writer.drain()
            async with asyncio.timeout(10):  # its body read, it waits in line
                while pool.limiter.statistics().tasks_waiting < 1:
                    await asyncio.sleep(0.01)
            assert pool.admitted == pool.workers + 1
            writer.close()  # the client gives up
            await writer.wait_closed()
            async with asyncio.timeout(10):  # noticed while the tokens are still held
                while pool.admitted > pool.workers:
                    await asyncio.sleep(0.01)
            assert pool.limiter.statistics().tasks_waiting == 0
            assert pool.limiter.borrowed_tokens == pool.workers
            parse.release.set()
            answers = await asyncio.gather(*slow)
            assert [answer.status_code for answer in answers] == [200] * pool.workers
            assert not parse.started.acquire(blocking=False)  # the third was never parsed
            listed = {entry["name"] for entry in (await client.post("/v1/dataprep/get")).json()}
            assert {f"slow{n}.md" for n in range(pool.workers)} <= listed
            assert "abandoned.md" not in listed
            scrape = (await client.get("/metrics")).text
            assert requests_counted(scrape, INGEST, 499) == 1
            assert requests_counted(scrape, INGEST, 200) == pool.workers
            assert pool.admitted == 0
        finally:
            parse.release.set()  # whatever the test left blocked
