"""The parse pool: its own threads, a bounded queue, 429 beyond it, slots held to the end."""

from __future__ import annotations

import asyncio
import threading

import pytest

from chatqna.errors import TooManyRequests
from chatqna.ingest.parse_pool import ParsePool

pytestmark = pytest.mark.anyio


class Gate:
    """A job that blocks its thread until released, counting the jobs that started."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Semaphore(0)
        self.threads: list[str] = []

    def job(self, value: int) -> int:
        self.threads.append(threading.current_thread().name)
        self.started.release()
        self.release.wait(10)
        return value

    async def wait_started(self, count: int) -> None:
        for _ in range(count):
            assert await asyncio.to_thread(self.started.acquire, True, 10)


async def test_jobs_run_on_the_pool_s_own_threads() -> None:
    pool = ParsePool(workers=2, queue=0)
    try:
        assert await pool.run(lambda a, b: a + b, 2, 3) == 5
        assert await pool.run(threading.current_thread) is not threading.current_thread()
        assert (await pool.run(threading.current_thread)).name.startswith("chatqna-parse")
    finally:
        pool.close()


async def test_beyond_the_workers_and_the_queue_a_request_is_refused_with_429() -> None:
    pool, gate = ParsePool(workers=1, queue=1), Gate()
    try:
        running = asyncio.create_task(pool.run(gate.job, 1))
        await gate.wait_started(1)
        waiting = asyncio.create_task(pool.run(gate.job, 2))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # queued, not refused
        with pytest.raises(TooManyRequests) as refused:
            await pool.run(gate.job, 3)
        assert refused.value.status_code == 429
        assert refused.value.envelope()["error"] == "too_many_requests"
        assert "parsing 1 uploads with 1 more waiting" in refused.value.message
        gate.release.set()
        assert await asyncio.gather(running, waiting) == [1, 2]
        assert await pool.run(gate.job, 4) == 4  # the queue has emptied
    finally:
        gate.release.set()
        pool.close()


async def test_a_cancelled_request_holds_its_slot_until_its_thread_is_done() -> None:
    pool, gate = ParsePool(workers=1, queue=0), Gate()
    try:
        cancelled = asyncio.create_task(pool.run(gate.job, 1))
        await gate.wait_started(1)
        cancelled.cancel()  # the client left; the thread parses on
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        with pytest.raises(TooManyRequests):
            await pool.run(gate.job, 2)
        gate.release.set()
        async with asyncio.timeout(10):
            while True:  # the slot comes back once the thread has finished
                try:
                    assert await pool.run(gate.job, 3) == 3
                    break
                except TooManyRequests:
                    await asyncio.sleep(0.01)
    finally:
        gate.release.set()
        pool.close()


def test_a_pool_needs_a_worker() -> None:
    with pytest.raises(ValueError, match="workers"):
        ParsePool(workers=0)
