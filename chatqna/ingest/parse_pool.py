"""Where the service parses what it ingests: a few threads of its own and a bounded queue.

Parsing and chunking a file (a PDF, a Word file) is CPU-bound and can take seconds. On
asyncio's default thread pool, `min(32, cpus + 4)` threads, a handful of slow uploads would
hold every thread, and whatever else needs one (the embedded index's searches before they
had their own threads, a link's DNS lookup) would wait behind them. Here at most `workers`
requests are admitted at once, each parsing on a thread of this pool; up to `queue` more
wait their turn in order, and a request beyond those is refused at once with 429
`too_many_requests` (answered with `Retry-After`), as a chat is when every chat slot stays
taken: nothing waits in an unbounded queue.

A request is admitted (`admit`) before it does any work: before its uploads are read and
its links fetched, so a refused request costs nothing. It keeps its slot until it is done,
and until its parsing thread has finished, even when the request is cancelled (its client
left) while the thread is still parsing: the threads of the pool are the work admitted,
never more. The bounds hold per process: with several workers (`CHATQNA_WORKERS`), each
has a pool of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

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
    """One admitted request's place in a `ParsePool`: its jobs run on the pool's threads.

    The slot goes back to the pool once the request has left it and every job it started
    has finished on its thread; a job still queued when the request is cancelled is
    dropped. A request runs one job at a time, so it never takes another's thread.
    """

    def __init__(
        self,
        executor: ThreadPoolExecutor,
        loop: asyncio.AbstractEventLoop,
        release: Callable[[], None],
    ) -> None:
        self._executor = executor
        self._loop = loop
        self._release = release
        self._holds = 1  # the request itself, and each of its jobs not finished

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on one of the pool's threads, in a copy of the caller's context."""
        try:
            job = self._executor.submit(contextvars.copy_context().run, fn, *args)
        except RuntimeError as exc:  # the pool has been shut down
            raise ServiceUnavailable(_CLOSED) from exc
        self._holds += 1

        def done(_: Future[T]) -> None:
            with contextlib.suppress(RuntimeError):  # a closed loop: no one is left to wait
                self._loop.call_soon_threadsafe(self._drop)

        job.add_done_callback(done)
        # Cancelling the wrapper cancels a job still queued; a running one finishes, and
        # lets go of the slot when it does.
        return await asyncio.wrap_future(job)

    def leave(self) -> None:
        """The request is done with the slot (its running jobs may not be yet)."""
        self._drop()

    def _drop(self) -> None:
        # Only ever called on the event loop's thread: no lock needed.
        self._holds -= 1
        if self._holds == 0:
            self._release()


class ParsePool:
    """At most `workers` requests admitted at once, parsing on threads of their own;
    `queue` more wait; one more is refused with `TooManyRequests`."""

    def __init__(self, workers: int = PARSE_WORKERS, queue: int = PARSE_QUEUE) -> None:
        if workers < 1 or queue < 0:
            raise ValueError("workers must be at least 1 and queue at least 0")
        self.workers = workers
        self.queue = queue
        self._slots = asyncio.Semaphore(workers)
        self._waiting = 0
        self._closed = False
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="chatqna-parse")

    @contextlib.asynccontextmanager
    async def admit(self) -> AsyncIterator[ParseSlot]:
        """A slot for one request, taken at once or after waiting in the queue; refused
        with `TooManyRequests` when the queue is full, `ServiceUnavailable` once closed."""
        await self._acquire()
        slot = ParseSlot(self._executor, asyncio.get_running_loop(), self._slots.release)
        try:
            yield slot
        finally:
            slot.leave()

    async def _acquire(self) -> None:
        if self._closed:
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
        """`fn(*args)` on one of the pool's threads, admitted as a request of its own."""
        async with self.admit() as slot:
            return await slot.run(fn, *args)

    def close(self) -> None:
        """Stop taking work; jobs not started are dropped, running ones finish on their own."""
        self._closed = True
        self._executor.shutdown(wait=False, cancel_futures=True)
