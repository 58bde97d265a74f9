"""Uploads under load: parsing has threads of its own and a bound on the requests in
flight, so slow uploads never hold up a chat, and one upload too many is 429 with the
envelope, before any of its links is fetched."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest

from chatqna.ingest import dataprep
from chatqna.ingest.links import LinkFetcher
from chatqna.ingest.parse_pool import PARSE_QUEUE, PARSE_WORKERS
from tests.unit.api.conftest import ClientFactory

pytestmark = pytest.mark.anyio


async def test_slow_uploads_leave_chats_answering_and_one_too_many_is_429(
    client_for: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = await client_for()
    release, started = threading.Event(), threading.Semaphore(0)
    real_load = dataprep.load_document

    def slow_load(*args: Any, **kwargs: Any) -> Any:
        started.release()
        release.wait(30)  # a Word file that takes long to parse
        return real_load(*args, **kwargs)

    monkeypatch.setattr(dataprep, "load_document", slow_load)
    fetched: list[str] = []

    async def fetch_all(self: LinkFetcher, urls: list[str]) -> list[Any]:
        fetched.extend(urls)
        return []

    monkeypatch.setattr(LinkFetcher, "fetch_all", fetch_all)
    admitted = PARSE_WORKERS + PARSE_QUEUE
    uploads = [
        asyncio.create_task(
            client.post(
                "/v1/dataprep/ingest",
                files=[("files", (f"slow{n}.md", f"# Slow {n}\n\nparsed slowly".encode()))],
            )
        )
        for n in range(admitted + 1)
    ]
    try:
        for _ in range(PARSE_WORKERS):
            assert await asyncio.to_thread(started.acquire, True, 10)
        async with asyncio.timeout(10):
            done, _ = await asyncio.wait(uploads, return_when=asyncio.FIRST_COMPLETED)
        (refused,) = [task.result() for task in done]
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "1"
        assert refused.json() == {
            "error": "too_many_requests",
            "message": f"The service has {PARSE_WORKERS + PARSE_QUEUE} ingest requests in flight, "
            f"parsing {PARSE_WORKERS} at a time; retry shortly.",
        }
        # A request with links is refused before any of them is fetched.
        link_list = json.dumps(["https://pages.test/guide.html"])
        with_links = await client.post("/v1/dataprep/ingest", data={"link_list": link_list})
        assert with_links.status_code == 429
        assert fetched == []
        async with asyncio.timeout(10):  # not behind the parsing: the search has its threads
            answer = await client.post(
                "/v1/chatqna", json={"messages": "How do I export?", "stream": False}
            )
        assert answer.status_code == 200
    finally:
        release.set()
    statuses = sorted(r.status_code for r in await asyncio.gather(*uploads))
    assert statuses == [200] * admitted + [429]
