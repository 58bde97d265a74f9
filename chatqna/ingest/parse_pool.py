"""Where the service parses what it ingests: a few threads of its own and a bounded queue.

Parsing and chunking a file (a PDF, a Word file) is CPU-bound and can take seconds. On
asyncio's default thread pool, `min(32, cpus + 4)` threads, a handful of slow uploads would
hold every thread, and whatever else needs one (the embedded index's searches before they
had their own threads, a link's DNS lookup) would wait behind them. Here at most `workers`
requests parse at once, each on a thread of this pool; up to `queue` more wait their turn
in order, and a request beyond those is refused at once with 429 `too_many_requests`
(answered with `Retry-After`), as a chat is when every chat slot stays taken: nothing waits
in an unbounded queue.

A request's slot is held until its thread has finished, even when the request is cancelled
(its client left) while the thread is still parsing: the threads of the pool are the work
admitted, never more.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from chatqna.errors import TooManyRequests

__all__ = ["PARSE_QUEUE", "PARSE_WORKERS", "ParsePool"]

T = TypeVar("T")

# Parsing is Python code under the GIL for the most part: more threads than this add
# contention, not throughput, and leave the cores to the chats.
PARSE_WORKERS = 2
# Requests waiting for a parsing thread; beyond them, 429.
PARSE_QUEUE = 8


class ParsePool:
    """At most `workers` requests parse at once, on threads of their own; `queue` more
    wait; one more is refused with `TooManyRequests`."""

    def __init__(self, workers: int = PARSE_WORKERS, queue: int = PARSE_QUEUE) -> None:
        if workers < 1 or queue < 0:
            raise ValueError("workers must be at least 1 and queue at least 0")
        self.workers = workers
        self.queue = queue
        self._slots = asyncio.Semaphore(workers)
        self._waiting = 0
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="chatqna-parse")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on one of the pool's threads, once a slot is free."""
        if self._slots.locked():
            if self._waiting >= self.queue:
                raise TooManyRequests(
                    f"The service is parsing {self.workers} uploads with {self._waiting} "
                    "more waiting; retry shortly."
                )
            self._waiting += 1
            try:
                await self._slots.acquire()
            finally:
                self._waiting -= 1
        else:
            await self._slots.acquire()  # a slot is free: this does not wait
        loop = asyncio.get_running_loop()
        try:
            job = self._executor.submit(contextvars.copy_context().run, fn, *args)
        except BaseException:
            self._slots.release()
            raise

        def done(_: Future[T]) -> None:
            with contextlib.suppress(RuntimeError):  # a closed loop: no one is left to wait
                loop.call_soon_threadsafe(self._slots.release)

        job.add_done_callback(done)
        # Cancelling the wrapper cancels a job still queued; a running one finishes, and
        # releases its slot when it does.
        return await asyncio.wrap_future(job)

    def close(self) -> None:
        """Stop taking work; jobs not started are dropped, running ones finish on their own."""
        self._executor.shutdown(wait=False, cancel_futures=True)
