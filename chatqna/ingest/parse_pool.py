"""Where the service parses what it ingests: a few worker threads and a bounded queue.

Parsing and chunking a file (a PDF, a Word file) is CPU-bound and can take seconds. At most
`workers` requests are admitted at once, each parsing on one of anyio's worker threads under
a `CapacityLimiter` of the pool's own; up to `queue` more wait their turn in order, and a
request beyond those is refused at once with 429 `too_many_requests` (answered with
`Retry-After`), as a chat is when every chat slot stays taken: nothing waits in an unbounded
queue. Parse work shares no pool with asyncio's default executor (the index's writes), with
the embedded index's search threads, or with anyio's default limiter (Starlette's
threadpool): anyio starts a thread whenever none is idle, so a slow parse never holds up a
thread another caller asked for.

A request is admitted (`admit`) before it does any work: before its uploads are read and
its links fetched, so a refused request costs nothing. It keeps its slot until it is done,
and until its parsing thread has finished, even when the request is cancelled (its client
left) while the thread is still parsing: the threads parsing are the work admitted, never
more. The bounds hold per process: with several workers (`CHATQNA_WORKERS`), each has a
pool of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from chatqna.errors import ServiceUnavailable, TooManyRequests

__all__ = ["PARSE_QUEUE", "PARSE_WORKERS", "ParsePool", "ParseSlot"]

T = TypeVar("T")

# Parsing is Python code under the GIL for the most part: more threads than this add
# contention, not throughput, and leave the cores to the chats.
PARSE_WORKERS = 2
# Requests waiting for a parsing thread; beyond them, 429.
PARSE_QUEUE = 8
_CLOSED = "The service is shutting down and parses nothing more; retry shortly."


class ParseSlot:
    """One admitted request's place in a `ParsePool`: its jobs run on worker threads under
    the pool's limiter, in a copy of the caller's context (anyio copies it). The slot goes
    back to the pool once the request has left it and its job has finished on its thread.
    A request runs one job at a time, so it never takes another's thread."""

    def __init__(self, pool: ParsePool) -> None:
        self._pool = pool
        self._job: asyncio.Future[Any] | None = None

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on a worker thread; `ServiceUnavailable` once the pool is closed."""
        if self._pool.closed:
            raise ServiceUnavailable(_CLOSED)
        job = asyncio.ensure_future(anyio.to_thread.run_sync(fn, *args, limiter=self._pool.limiter))
        self._job = job
        # anyio shields the wait for the thread from anyio's cancel scopes, not from a plain
        # `task.cancel()` (a client's disconnect, `asyncio.timeout`): that one would let go
        # of the limiter's token while the thread parses on. Shielded as a task of its own,
        # the job keeps its token to the end, and `leave` keeps the slot until then.
        return await asyncio.shield(job)

    def leave(self, release: Callable[[], None]) -> None:
        """The request is done with the slot: `release` it now, or once its job is."""
        if self._job is None or self._job.done():
            release()
        else:
            self._job.add_done_callback(lambda _: release())


class ParsePool:
    """At most `workers` requests admitted at once, each parsing on a thread; `queue` more
    wait; one more is refused with `TooManyRequests`."""

    def __init__(self, workers: int = PARSE_WORKERS, queue: int = PARSE_QUEUE) -> None:
        if workers < 1 or queue < 0:
            raise ValueError("workers must be at least 1 and queue at least 0")
        self.workers = workers
        self.queue = queue
        self.closed = False
        # Of the pool's own: parse jobs never take the tokens of anyio's default limiter.
        self.limiter = anyio.CapacityLimiter(workers)
        self._slots = asyncio.Semaphore(workers)
        self._waiting = 0

    @contextlib.asynccontextmanager
    async def admit(self) -> AsyncIterator[ParseSlot]:
        """A slot for one request, taken at once or after waiting in the queue; refused
        with `TooManyRequests` when the queue is full, `ServiceUnavailable` once closed."""
        await self._acquire()
        slot = ParseSlot(self)
        try:
            yield slot
        finally:
            slot.leave(self._slots.release)

    async def _acquire(self) -> None:
        if self.closed:
            raise ServiceUnavailable(_CLOSED)
        if not self._slots.locked():
            await self._slots.acquire()  # a slot is free: this does not wait
            return
        if self._waiting >= self.queue:
            raise TooManyRequests(
                f"The service is ingesting {self.workers} requests with {self._waiting} "
                "more waiting; retry shortly."
            )
        self._waiting += 1
        try:
            # A waiter woken and then cancelled passes the slot on to the next one
            # (asyncio.Semaphore does so itself).
            await self._slots.acquire()
        finally:
            self._waiting -= 1

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on a worker thread, admitted as a request of its own."""
        async with self.admit() as slot:
            return await slot.run(fn, *args)

    def close(self) -> None:
        """Stop taking work: admissions and jobs from now on are refused; running jobs
        finish on their own."""
        self.closed = True
