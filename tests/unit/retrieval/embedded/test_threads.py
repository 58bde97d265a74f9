"""The embedded index's threads: reads in the caller's context, refused once closed."""

from __future__ import annotations

import asyncio
import threading

import pytest

from chatqna.errors import ServiceUnavailable
from chatqna.retrieval.embedded.threads import IndexThreads

pytestmark = pytest.mark.anyio


async def test_a_read_queued_when_the_pool_closes_is_refused_not_cancelled() -> None:
    threads = IndexThreads("the index at /data/index", workers=1)
    started, release = threading.Event(), threading.Event()

    def running() -> str:
        started.set()
        release.wait(10)
        return "read"

    first = asyncio.create_task(threads.run(running))
    assert await asyncio.to_thread(started.wait, 10)
    queued = asyncio.create_task(threads.run(lambda: "never run"))
    await asyncio.sleep(0)  # the second read is submitted, behind the first
    closing = asyncio.create_task(threads.close())
    await asyncio.sleep(0)  # closed: the queued read is dropped
    release.set()
    async with asyncio.timeout(10):
        assert await first == "read"  # a running read finishes
        with pytest.raises(ServiceUnavailable, match="/data/index is closed"):
            await queued
        await closing
    with pytest.raises(ServiceUnavailable):
        await threads.run(lambda: "after")


async def test_a_caller_that_is_cancelled_is_still_cancelled() -> None:
    threads = IndexThreads("the index", workers=1)
    release = threading.Event()
    first = asyncio.create_task(threads.run(release.wait, 10))
    queued = asyncio.create_task(threads.run(lambda: "never run"))
    await asyncio.sleep(0)
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    release.set()
    assert await first is True
    await threads.close()


async def test_a_caller_cancelled_while_the_pool_closes_is_still_cancelled() -> None:
    # Its read is dropped from the queue by close() and its task is cancelled as well:
    # the caller's cancellation wins over the refusal.
    threads = IndexThreads("the index", workers=1)
    started, release = threading.Event(), threading.Event()

    def running() -> bool:
        started.set()
        return release.wait(10)

    first = asyncio.create_task(threads.run(running))
    assert await asyncio.to_thread(started.wait, 10)
    queued = asyncio.create_task(threads.run(lambda: "never run"))
    await asyncio.sleep(0)  # the second read is submitted, behind the first
    closing = asyncio.create_task(threads.close())
    await asyncio.sleep(0)  # closed: the queued read is dropped
    queued.cancel()
    release.set()
    async with asyncio.timeout(10):
        with pytest.raises(asyncio.CancelledError):
            await queued
        assert await first is True
        await closing
