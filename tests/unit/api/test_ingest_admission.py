"""Uploads admitted into the parse pool before their body is read (429 beyond its places,
with the connection closed), working in turn once the body is in, giving their place back
however they end, and cut off (408) when their body pauses too long."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from fastapi import FastAPI, UploadFile

from chatqna.api import dataprep as dataprep_route
from chatqna.errors import TooManyRequests
from chatqna.ingest.dataprep import IngestFile
from chatqna.ingest.links import LinkFetcher
from chatqna.ingest.parse_pool import ParsePool
from chatqna.settings import Settings
from tests.unit.api.test_guards import HeldBody, chat_scope, running
from tests.unit.api.test_observability import requests_counted

pytestmark = pytest.mark.anyio


def upload_scope() -> dict[str, Any]:
    boundary = b"b0undary"
    return chat_scope("2.3") | {
        "path": "/v1/dataprep/ingest",
        "raw_path": b"/v1/dataprep/ingest",
        "headers": [
            (b"content-type", b"multipart/form-data; boundary=" + boundary),
            (b"content-length", b"50000000"),
            (b"host", b"localhost:8888"),
        ],
    }


UPLOAD_HEAD = (
    b'--b0undary\r\nContent-Disposition: form-data; name="files"; filename="big.txt"\r\n'
    b"Content-Type: text/plain\r\n\r\n"
)


async def uploads_held_back(app: FastAPI, count: int) -> list[tuple[HeldBody, asyncio.Task[None]]]:
    """`count` uploads admitted, each waiting for the rest of its body, which never comes
    until it `leave`s."""
    held = [HeldBody(UPLOAD_HEAD) for _ in range(count)]
    tasks = [asyncio.create_task(app(upload_scope(), h.receive, h.send)) for h in held]
    while any(h.reads < 2 for h in held):
        await asyncio.sleep(0)
    return list(zip(held, tasks, strict=True))


async def test_uploads_whose_body_trickles_in_leave_the_parse_threads_free(
    settings: Settings,
) -> None:
    async with running(settings) as (app, client):
        pool: ParsePool = app.state.service.parse_pool
        stuck = await uploads_held_back(app, pool.workers)
        assert pool.admitted == pool.workers
        assert pool.limiter.borrowed_tokens == 0  # admitted, not working yet
        files = [("files", ("beside.md", b"# Beside\n\nthe slow uploads", "text/markdown"))]
        async with asyncio.timeout(10):  # parsed now, not once the slow bodies are in
            ingested = await client.post("/v1/dataprep/ingest", files=files)
        assert ingested.status_code == 200, ingested.text
        assert ingested.json()["files"] == [
            {"name": "beside.md", "status": "ingested", "chunks": 1}
        ]
        stuck += await uploads_held_back(app, pool.capacity - pool.workers)
        assert pool.admitted == pool.capacity == 10
        eleventh = HeldBody(UPLOAD_HEAD)
        await asyncio.wait_for(app(upload_scope(), eleventh.receive, eleventh.send), timeout=10)
        assert eleventh.reads == 0, "the refused upload's body was read"
        assert eleventh.answer[0]["status"] == 429
        assert (b"retry-after", b"1") in eleventh.answer[0]["headers"]
        for held, _ in stuck:
            held.gone.set()  # the slow clients give up
        await asyncio.wait_for(asyncio.gather(*(task for _, task in stuck)), timeout=10)
        assert pool.admitted == 0


async def test_at_most_workers_requests_hold_their_files_and_pages_at_once(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    read: list[str] = []
    fetching: list[str] = []
    fetched = asyncio.Event()
    read_upload = dataprep_route._read_upload

    async def counted_read(upload: UploadFile, limit: int) -> IngestFile:
        read.append(upload.filename or "")
        return await read_upload(upload, limit)

    async def held_fetch(self: LinkFetcher, urls: list[str]) -> list[IngestFile]:
        fetching.extend(urls)
        await fetched.wait()  # pages on their way in, files in memory
        return []

    monkeypatch.setattr(dataprep_route, "_read_upload", counted_read)
    monkeypatch.setattr(LinkFetcher, "fetch_all", held_fetch)
    async with running(settings) as (app, client):
        pool: ParsePool = app.state.service.parse_pool
        count = pool.workers + 3
        requests = [
            asyncio.create_task(
                client.post(
                    "/v1/dataprep/ingest",
                    files=[("files", (f"doc{n}.md", f"# Doc {n}\n\nin memory".encode()))],
                    data={"link_list": json.dumps([f"https://pages.test/{n}.html"])},
                )
            )
            for n in range(count)
        ]
        async with asyncio.timeout(10):  # every request is in: fetching, or waiting its turn
            while len(fetching) + pool.limiter.statistics().tasks_waiting < count:
                await asyncio.sleep(0.01)
        assert len(read) == len(fetching) == pool.workers
        assert pool.admitted == count
        fetched.set()
        answers = await asyncio.gather(*requests)
        assert [a.status_code for a in answers] == [200] * count, answers[0].text
        assert sorted(read) == sorted(f"doc{n}.md" for n in range(count))
        assert pool.limiter.borrowed_tokens == 0


def one_slot_pool(app: FastAPI) -> ParsePool:
    """The started app's parse pool, replaced by one that admits one request, no queue."""
    pool = ParsePool(workers=1, queue=0)
    app.state.service.parse_pool = pool
    return pool


async def test_an_upload_beyond_the_places_is_429_before_its_body_is_read(
    settings: Settings,
) -> None:
    async with running(settings) as (app, client):
        pool: ParsePool = app.state.service.parse_pool
        async with contextlib.AsyncExitStack() as stack:
            for _ in range(pool.workers):
                await stack.enter_async_context(pool.admit())
            waiting = [asyncio.create_task(pool.run(len, "queued")) for _ in range(pool.queue)]
            while pool.admitted < pool.capacity:
                await asyncio.sleep(0)
            held = HeldBody(UPLOAD_HEAD)
            await asyncio.wait_for(app(upload_scope(), held.receive, held.send), timeout=10)
            assert held.reads == 0, "the refused upload's body was read"
            start, body = held.answer[0], held.answer[1]
            assert start["status"] == 429
            assert (b"retry-after", b"1") in start["headers"]
            # Its body left unread, the connection is closed rather than read on from there.
            assert (b"connection", b"close") in start["headers"]
            assert json.loads(body["body"])["error"] == "too_many_requests"
        assert await asyncio.gather(*waiting) == [len("queued")] * pool.queue
        files = [("files", ("admitted.md", b"# Admitted\n\nonce there is room", "text/markdown"))]
        assert (await client.post("/v1/dataprep/ingest", files=files)).status_code == 200


async def test_an_upload_s_admission_is_given_back_however_it_ends(settings: Settings) -> None:
    async with running(settings) as (app, client):
        pool = one_slot_pool(app)

        async def admits_again() -> bool:
            async with contextlib.AsyncExitStack() as stack:
                await stack.enter_async_context(pool.admit())  # refused if still held
            return True

        text = ("Invoices are sent by email on the first day of the month. " * 400).encode()
        files = [("files", ("invoices.md", text, "text/markdown"))]
        request = client.build_request("POST", "/v1/dataprep/ingest", files=files)
        content = request.read()

        async def pieces() -> AsyncIterator[bytes]:
            for start in range(0, len(content), 1000):
                yield content[start : start + 1000]

        headers = {"content-type": request.headers["content-type"]}
        ingested = await client.post("/v1/dataprep/ingest", content=pieces(), headers=headers)
        assert ingested.status_code == 200, ingested.text
        assert ingested.json()["files"][0]["name"] == "invoices.md"
        assert await admits_again()
        failed = await client.post("/v1/dataprep/ingest", data={"chunk_size": "500"})
        assert failed.status_code == 400
        assert await admits_again()
        # A client that leaves mid-body, and a request cancelled while it waits for its body.
        left = HeldBody(UPLOAD_HEAD)
        left.gone.set()
        await asyncio.wait_for(app(upload_scope(), left.receive, left.send), timeout=10)
        assert left.reads == 2
        assert await admits_again()
        held = HeldBody(UPLOAD_HEAD)
        cancelled = asyncio.create_task(app(upload_scope(), held.receive, held.send))
        while held.reads < 2:
            await asyncio.sleep(0)
        with pytest.raises(TooManyRequests):
            await admits_again()  # held while its body is awaited
        cancelled.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await cancelled
        assert await admits_again()


async def test_an_upload_whose_body_stalls_is_408_and_gives_its_place_back(
    settings: Settings,
) -> None:
    quick = settings.model_copy(update={"chatqna_body_timeout_seconds": 0.05})
    async with running(quick) as (app, client):
        pool = one_slot_pool(app)
        stalled = HeldBody(UPLOAD_HEAD)
        await asyncio.wait_for(app(upload_scope(), stalled.receive, stalled.send), timeout=10)
        start, body = stalled.answer[0], stalled.answer[1]
        assert start["status"] == 408
        assert (b"connection", b"close") in start["headers"]
        assert json.loads(body["body"]) == {
            "error": "request_timeout",
            "message": "The upload's body paused for more than 0.05 seconds "
            "(CHATQNA_BODY_TIMEOUT_SECONDS); send it again.",
        }
        assert len(stalled.answer) == 2  # the route's own answer to the cut body is dropped
        assert pool.admitted == 0
        files = [("files", ("next.md", b"# Next\n\nin the place given back", "text/markdown"))]
        assert (await client.post("/v1/dataprep/ingest", files=files)).status_code == 200


async def test_a_slow_but_steady_upload_is_not_cut_off(settings: Settings) -> None:
    deadline = 0.5
    steady = settings.model_copy(update={"chatqna_body_timeout_seconds": deadline})
    async with running(steady) as (app, client):
        one_slot_pool(app)
        text = ("Refunds are paid back to the card used within ten days. " * 200).encode()
        request = client.build_request(
            "POST", "/v1/dataprep/ingest", files=[("files", ("refunds.md", text))]
        )
        content = request.read()
        pieces = 15  # one every tenth of the deadline: the whole takes three times as long

        async def trickle() -> AsyncIterator[bytes]:
            size = -(-len(content) // pieces)
            for start in range(0, len(content), size):
                await asyncio.sleep(deadline / 10)
                yield content[start : start + size]

        headers = {"content-type": request.headers["content-type"]}
        ingested = await client.post("/v1/dataprep/ingest", content=trickle(), headers=headers)
        assert ingested.status_code == 200, ingested.text
        assert ingested.json()["files"][0]["name"] == "refunds.md"


class WholeBodyThenGone:
    """A client that sends its whole body, then leaves when the test says so."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.gone = asyncio.Event()
        self.reads = 0
        self.answer: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        self.reads += 1
        if self.reads == 1:
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.answer.append(message)


async def test_a_client_gone_while_its_upload_waits_for_a_token_gets_nothing_written(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    fetched = asyncio.Event()
    fetching: list[str] = []

    async def held_fetch(self: LinkFetcher, urls: list[str]) -> list[IngestFile]:
        fetching.extend(urls)
        await fetched.wait()  # holding a token
        return []

    monkeypatch.setattr(LinkFetcher, "fetch_all", held_fetch)
    async with running(settings) as (app, client):
        pool: ParsePool = app.state.service.parse_pool
        working = [
            asyncio.create_task(
                client.post(
                    "/v1/dataprep/ingest",
                    data={"link_list": json.dumps([f"https://pages.test/{n}.html"])},
                )
            )
            for n in range(pool.workers)
        ]
        while len(fetching) < pool.workers:
            await asyncio.sleep(0.01)
        files = [("files", ("abandoned.md", b"# Abandoned\n\nnobody waits for it"))]
        request = client.build_request("POST", "/v1/dataprep/ingest", files=files)
        leaving = WholeBodyThenGone(request.read())
        scope = upload_scope()
        scope["headers"] = [
            (b"content-type", request.headers["content-type"].encode()),
            (b"content-length", str(len(leaving.body)).encode()),
            (b"host", b"localhost:8888"),
        ]
        waiting = asyncio.create_task(app(scope, leaving.receive, leaving.send))
        while pool.limiter.statistics().tasks_waiting < 1:
            await asyncio.sleep(0.01)
        assert pool.admitted == pool.workers + 1
        leaving.gone.set()
        await asyncio.wait_for(waiting, timeout=10)
        assert leaving.answer[0]["status"] == 499
        assert pool.admitted == pool.workers  # its place is back while the others still work
        assert pool.limiter.statistics().tasks_waiting == 0
        fetched.set()
        answers = await asyncio.gather(*working)
        assert [a.status_code for a in answers] == [200] * pool.workers
        listed = (await client.post("/v1/dataprep/get")).json()
        assert "abandoned.md" not in {entry["name"] for entry in listed}
        scrape = (await client.get("/metrics")).text
        assert requests_counted(scrape, "/v1/dataprep/ingest", 499) == 1
        assert pool.admitted == 0
