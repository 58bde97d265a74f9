"""The parse pool: a bound on the requests in flight, 429 beyond it; tokens to work taken
in turn, whether or not a thread parses; its own threads; places and tokens held to the
end of the thread; admission before any work, 503 once closed."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import threading
from collections.abc import AsyncIterator, Awaitable

import anyio
import anyio.to_thread
import pytest
from starlette.types import Message

from chatqna.api.disconnects import while_connected
from chatqna.errors import ServiceUnavailable, TooManyRequests
from chatqna.ingest.parse_pool import ParsePool

pytestmark = pytest.mark.anyio


class Gate:
    """A job that blocks its thread until released, counting the jobs that started."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Semaphore(0)
        self.threads: list[str] = []
        self.values: list[int] = []

    def job(self, value: int) -> int:
        self.threads.append(threading.current_thread().name)
        self.values.append(value)
        self.started.release()
        self.release.wait(10)
        return value

    async def wait_started(self, count: int) -> None:
        for _ in range(count):
            assert await asyncio.to_thread(self.started.acquire, True, 10)


@contextlib.asynccontextmanager
async def gated_pool(*, queue: int) -> AsyncIterator[tuple[ParsePool, Gate]]:
    """A one-worker pool and a gate for its jobs; at the end the gate is opened and the
    pool closed, whatever the test left blocked."""
    pool, gate = ParsePool(workers=1, queue=queue), Gate()
    try:
        yield pool, gate
    finally:
        gate.release.set()
        pool.close()


async def once_a_slot_is_back(pool: ParsePool, gate: Gate) -> int:
    """A job run as soon as the pool admits one: a place comes back once its thread is done."""
    async with asyncio.timeout(10):
        while True:
            try:
                return await pool.run(gate.job, 3)
            except TooManyRequests:
                await asyncio.sleep(0.01)


async def test_jobs_run_off_the_event_loop_s_thread() -> None:
    pool = ParsePool(workers=2, queue=0)
    try:
        assert await pool.run(lambda a, b: a + b, 2, 3) == 5
        assert await pool.run(threading.current_thread) is not threading.current_thread()
    finally:
        pool.close()


async def test_a_parsing_job_leaves_the_other_threads_free() -> None:
    pool, gate = ParsePool(workers=1, queue=0), Gate()
    shared = anyio.to_thread.current_default_thread_limiter()
    try:
        parsing = asyncio.create_task(pool.run(gate.job, 1))
        await gate.wait_started(1)
        # The parse takes none of the shared limiter's tokens, and other callers still get
        # a thread of anyio's and of asyncio's default pool while it parses.
        assert shared.borrowed_tokens == 0
        assert pool.limiter.borrowed_tokens == 1
        assert await anyio.to_thread.run_sync(lambda: 7) == 7
        assert await asyncio.to_thread(lambda: 8) == 8
        assert not parsing.done()
        gate.release.set()
        assert await parsing == 1
    finally:
        gate.release.set()
        pool.close()


async def test_beyond_the_workers_and_the_queue_a_request_is_refused_with_429() -> None:
    async with gated_pool(queue=1) as (pool, gate):
        running = asyncio.create_task(pool.run(gate.job, 1))
        await gate.wait_started(1)
        waiting = asyncio.create_task(pool.run(gate.job, 2))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # queued, not refused
        with pytest.raises(TooManyRequests) as refused:
            await pool.run(gate.job, 3)
        assert refused.value.status_code == 429
        assert refused.value.envelope()["error"] == "too_many_requests"
        assert "2 ingest requests in flight, parsing 1 at a time" in refused.value.message
        gate.release.set()
        assert await asyncio.gather(running, waiting) == [1, 2]
        assert await pool.run(gate.job, 4) == 4  # the queue has emptied


async def test_a_cancelled_request_holds_its_slot_until_its_thread_is_done() -> None:
    async with gated_pool(queue=0) as (pool, gate):
        cancelled = asyncio.create_task(pool.run(gate.job, 1))
        await gate.wait_started(1)
        cancelled.cancel()  # the client left; the thread parses on
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        with pytest.raises(TooManyRequests):
            await pool.run(gate.job, 2)
        gate.release.set()
        assert await once_a_slot_is_back(pool, gate) == 3


def test_a_pool_needs_a_worker() -> None:
    with pytest.raises(ValueError, match="workers"):
        ParsePool(workers=0)


async def test_a_request_refused_at_admission_does_no_work() -> None:
    worked: list[str] = []
    async with gated_pool(queue=0) as (pool, gate):
        running = asyncio.create_task(pool.run(gate.job, 1))
        await gate.wait_started(1)
        with pytest.raises(TooManyRequests):
            async with pool.admit():
                worked.append("fetched links")  # never reached
        assert worked == []
        gate.release.set()
        assert await running == 1
        async with pool.admit() as slot, slot.working():  # admitted: it may work, then parse
            worked.append("fetched links")
            assert await slot.run(lambda: 5) == 5
        assert worked == ["fetched links"]


async def test_a_request_cancelled_while_waiting_for_a_token_parses_nothing() -> None:
    async with gated_pool(queue=1) as (pool, gate):
        running = asyncio.create_task(pool.run(gate.job, 1))
        await gate.wait_started(1)
        queued = asyncio.create_task(pool.run(gate.job, 2))
        while pool.limiter.statistics().tasks_waiting < 1:
            await asyncio.sleep(0)
        queued.cancel()  # its client left while it waited for a token
        with pytest.raises(asyncio.CancelledError):
            await queued
        assert pool.limiter.statistics().tasks_waiting == 0
        # Its place is free again: another request may wait there.
        waiting = asyncio.create_task(pool.run(gate.job, 3))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        gate.release.set()
        assert await asyncio.gather(running, waiting) == [1, 3]
        assert gate.values == [1, 3]  # the cancelled request's job never ran


async def test_requests_take_the_tokens_in_the_order_they_asked() -> None:
    async with gated_pool(queue=3) as (pool, gate):
        running = asyncio.create_task(pool.run(gate.job, 1))
        await gate.wait_started(1)
        waiting = []
        for value in (2, 3, 4):
            waiting.append(asyncio.create_task(pool.run(gate.job, value)))
            while pool.limiter.statistics().tasks_waiting < value - 1:
                await asyncio.sleep(0)
        gate.release.set()
        assert await asyncio.gather(running, *waiting) == [1, 2, 3, 4]
        assert gate.values == [1, 2, 3, 4]


async def test_admitted_requests_still_receiving_their_body_hold_no_token() -> None:
    pool = ParsePool(workers=2, queue=8)
    try:
        async with contextlib.AsyncExitStack() as stack:
            # Two requests admitted and still receiving their bodies.
            for _ in range(2):
                await stack.enter_async_context(pool.admit())
            assert pool.limiter.borrowed_tokens == 0
            async with asyncio.timeout(10):  # a third parses at once, not after them
                assert await pool.run(lambda: 5) == 5
            for _ in range(pool.capacity - 2):
                await stack.enter_async_context(pool.admit())
            assert pool.admitted == 10
            with pytest.raises(TooManyRequests):
                await pool.run(lambda: 6)  # the eleventh request in flight
        assert pool.admitted == 0
        assert await pool.run(lambda: 7) == 7
    finally:
        pool.close()


async def test_a_request_that_leaves_keeps_its_slot_until_its_thread_is_done() -> None:
    async def request(pool: ParsePool, gate: Gate) -> int:
        async with pool.admit() as slot, slot.working():
            return await slot.run(gate.job, 1)

    async with gated_pool(queue=1) as (pool, gate):
        cancelled = asyncio.create_task(request(pool, gate))
        await gate.wait_started(1)
        cancelled.cancel()  # the request leaves its token and its place; its thread parses on
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert pool.limiter.borrowed_tokens == 1
        assert pool.admitted == 1
        # Admitted in the queue's place, a request waits for the token the thread holds.
        waiting = asyncio.create_task(pool.run(gate.job, 2))
        while pool.limiter.statistics().tasks_waiting < 1:
            await asyncio.sleep(0)
        with pytest.raises(TooManyRequests):
            await pool.run(gate.job, 3)
        gate.release.set()
        assert await waiting == 2
        assert gate.values == [1, 2]
        assert await once_a_slot_is_back(pool, gate) == 3


async def test_a_failing_job_of_a_request_that_left_reports_no_lost_exception() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _, context: reported.append(context))

    def bad_file(gate: Gate) -> None:
        gate.job(1)
        raise ValueError("a file that cannot be parsed")

    async def request(pool: ParsePool, gate: Gate) -> None:
        async with pool.admit() as slot, slot.working():
            await slot.run(bad_file, gate)

    try:
        async with gated_pool(queue=0) as (pool, gate):
            cancelled = asyncio.create_task(request(pool, gate))
            await gate.wait_started(1)
            cancelled.cancel()  # the client left; its file fails to parse after that
            with pytest.raises(asyncio.CancelledError):
                await cancelled
            gate.release.set()
            assert await once_a_slot_is_back(pool, gate) == 3
        del cancelled
        gc.collect()  # a task whose exception nobody retrieved reports it when collected
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
    assert [context["message"] for context in reported] == []


TAG: contextvars.ContextVar[str] = contextvars.ContextVar("tag", default="")


async def test_jobs_run_in_a_copy_of_the_caller_s_context() -> None:
    pool = ParsePool(workers=1, queue=0)
    try:
        TAG.set("request-7")
        assert await pool.run(TAG.get) == "request-7"
    finally:
        pool.close()


async def test_a_closed_pool_refuses_with_503_and_gives_its_places_back() -> None:
    pool = ParsePool(workers=1, queue=0)
    async with pool.admit() as slot:
        pool.close()  # the service stops while a request waits for its body
        with pytest.raises(ServiceUnavailable) as refused:
            async with slot.working():
                pass
    assert refused.value.status_code == 503
    assert refused.value.envelope()["error"] == "service_unavailable"
    with pytest.raises(ServiceUnavailable):
        await pool.run(lambda: 1)
    assert pool.admitted == 0
    working = ParsePool(workers=1, queue=0)
    async with working.admit() as slot, slot.working():
        working.close()  # ... or while it works
        with pytest.raises(ServiceUnavailable):
            await slot.run(lambda: 1)
    assert working.admitted == 0
    assert working.limiter.borrowed_tokens == 0


async def test_a_working_request_holds_its_token_whether_or_not_it_parses() -> None:
    pool = ParsePool(workers=1, queue=1)
    try:
        steps: list[str] = []

        async def request(name: str, done: asyncio.Event) -> None:
            async with pool.admit() as slot, slot.working():
                steps.append(f"{name} reads its uploads")
                await done.wait()  # reading, fetching links: no thread of its own
                steps.append(f"{name} parsed {await slot.run(len, name)}")

        first_done, second_done = asyncio.Event(), asyncio.Event()
        first = asyncio.create_task(request("first", first_done))
        while not steps:
            await asyncio.sleep(0)
        second = asyncio.create_task(request("second", second_done))
        while pool.limiter.statistics().tasks_waiting < 1:
            await asyncio.sleep(0)
        assert steps == ["first reads its uploads"]  # the second waits for the token
        second_done.set()
        first_done.set()
        await asyncio.gather(first, second)
        assert steps == [
            "first reads its uploads",
            "first parsed 5",
            "second reads its uploads",
            "second parsed 6",
        ]
        assert pool.limiter.borrowed_tokens == 0
    finally:
        pool.close()


async def test_a_slot_runs_its_jobs_only_under_its_token() -> None:
    pool = ParsePool(workers=1, queue=0)
    try:
        async with pool.admit() as slot:
            with pytest.raises(RuntimeError, match="working"):
                await slot.run(lambda: 1)
            async with slot.working():
                assert await slot.run(lambda: 2) == 2
            with pytest.raises(RuntimeError, match="working"):
                await slot.run(lambda: 3)
    finally:
        pool.close()


class Left(Exception):
    """What a wait for a token raises when it is stopped (its client left)."""


async def test_a_request_whose_wait_is_stopped_leaves_the_line_and_its_place() -> None:
    async with gated_pool(queue=1) as (pool, gate):
        running = asyncio.create_task(pool.run(gate.job, 1))
        await gate.wait_started(1)
        stop = asyncio.Event()
        worked: list[str] = []

        async def until_stopped(taking: Awaitable[None]) -> None:
            wait = asyncio.ensure_future(taking)
            await stop.wait()  # the client leaves before a token comes
            wait.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await wait
            raise Left

        async def request() -> None:
            async with pool.admit() as slot, slot.working(until_stopped):
                worked.append("read its uploads")

        queued = asyncio.create_task(request())
        while pool.limiter.statistics().tasks_waiting < 1:
            await asyncio.sleep(0)
        assert pool.admitted == 2
        stop.set()
        with pytest.raises(Left):
            await queued
        assert pool.admitted == 1  # its place is back at once
        assert pool.limiter.statistics().tasks_waiting == 0
        gate.release.set()
        assert await running == 1
        assert worked == []
        assert pool.limiter.borrowed_tokens == 0  # the token it never took is not given back
        assert await pool.run(gate.job, 2) == 2


async def test_a_wait_that_lets_the_token_come_works_as_ever() -> None:
    async with gated_pool(queue=1) as (pool, gate):
        seen: list[str] = []

        async def watched(taking: Awaitable[None]) -> None:
            seen.append("waiting")
            await taking

        gate.release.set()
        async with pool.admit() as slot, slot.working(watched):
            assert pool.limiter.borrowed_tokens == 1
            assert await slot.run(gate.job, 7) == 7
        assert seen == ["waiting"]
        assert pool.limiter.borrowed_tokens == 0
        assert pool.admitted == 0


async def test_a_request_cancelled_just_as_its_token_comes_gives_the_token_back() -> None:
    async with gated_pool(queue=1) as (pool, gate):
        running = asyncio.create_task(pool.run(gate.job, 1))
        await gate.wait_started(1)
        worked: list[str] = []

        async def stays_connected() -> Message:
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

        async def granted_then_cancelled(taking: Awaitable[None]) -> None:
            await taking
            # The token is the request's, and the request is cancelled (the server's
            # graceful-shutdown timeout) before `while_connected` hands it over.
            queued.cancel()

        async def watched(taking: Awaitable[None]) -> None:
            await while_connected(stays_connected, granted_then_cancelled(taking))

        async def request() -> None:
            async with pool.admit() as slot, slot.working(watched):
                worked.append("read its uploads")

        queued = asyncio.create_task(request())
        while pool.limiter.statistics().tasks_waiting < 1:
            await asyncio.sleep(0)
        gate.release.set()  # the running job ends and its token goes to the queued request
        with pytest.raises(asyncio.CancelledError):
            await queued
        assert await running == 1
        assert worked == []
        assert pool.admitted == 0
        assert pool.limiter.borrowed_tokens == 0
        async with asyncio.timeout(10):  # guards against a hang; the pool's one token is free
            assert await pool.run(gate.job, 2) == 2
