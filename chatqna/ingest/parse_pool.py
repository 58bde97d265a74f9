"""Where the service parses what it ingests: a few worker threads, and a bound on the
requests in flight.

Parsing and chunking a file (a PDF, a Word file) is CPU-bound and can take seconds. Two
bounds apply, and they count different things. Admission counts requests: at most
`workers + queue` ingest requests are in flight at once, and one more is refused at once
with 429 `too_many_requests` (answered with `Retry-After`), as a chat is when every chat
slot stays taken: nothing waits in an unbounded queue. Parsing counts threads: the parse
jobs of the admitted requests run on anyio's worker threads, at most `workers` at once
under a `CapacityLimiter` of the pool's own, and a job beyond those waits for a thread in
the order it asked (the limiter hands its tokens on first come, first served). So an
admitted request that is still receiving its body, or fetching its links, holds no thread:
slow uploads never keep the others from parsing. Parse work shares no pool with asyncio's
default executor (the index's writes), with the embedded index's search threads, or with
anyio's default limiter (Starlette's threadpool): anyio starts a thread whenever none is
idle, so a slow parse never holds up a thread another caller asked for.

A request is admitted (`admit`) before it does any work: before its uploads are read and
its links fetched, so a refused request costs nothing. It keeps its place until it is
done, and until its parsing thread has finished, even when the request is cancelled (its
client left) while the thread is still parsing: the threads parsing belong to admitted
requests, never more. A request cancelled while its job still waits for a thread leaves
the line and parses nothing. The bounds hold per process: with several workers
(`CHATQNA_WORKERS`), each has a pool of its own.
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
# Requests admitted beyond those the threads can parse at once; beyond them, 429.
PARSE_QUEUE = 8
_CLOSED = "The service is shutting down and parses nothing more; retry shortly."


class ParseSlot:
    """One admitted request's place in a `ParsePool`: its jobs run on worker threads under
    the pool's limiter, in a copy of the caller's context (anyio copies it). The place goes
    back to the pool once the request has left it and its job has finished on its thread.
    A request runs one job at a time, so it never takes two threads."""

    def __init__(self, pool: ParsePool) -> None:
        self._pool = pool
        self._job: asyncio.Future[Any] | None = None

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on a worker thread, once one is free; `ServiceUnavailable` once the
        pool is closed."""
        if self._pool.closed:
            raise ServiceUnavailable(_CLOSED)
        limiter = self._pool.limiter
        job = asyncio.ensure_future(anyio.to_thread.run_sync(fn, *args, limiter=limiter))
        self._job = job
        try:
            # anyio shields the wait for the thread from anyio's cancel scopes, not from a
            # plain `task.cancel()` (a client's disconnect, `asyncio.timeout`): that one
            # would let go of the limiter's token while the thread parses on. Shielded as a
            # task of its own, the job keeps its token to the end, and `leave` keeps the
            # request's place until then.
            return await asyncio.shield(job)
        except asyncio.CancelledError:
            if job not in limiter.statistics().borrowers:
                # Still in line for a thread: nothing parses yet, so the job leaves the
                # line (the limiter passes a token just handed to it on to the next).
                job.cancel()
            raise

    def leave(self, release: Callable[[], None]) -> None:
        """The request is done with its place: `release` it now, or once its job is."""
        if self._job is None or self._job.done():
            release()
        else:
            self._job.add_done_callback(lambda _: release())


class ParsePool:
    """At most `workers + queue` requests admitted at once, one more refused with
    `TooManyRequests`; of their parse jobs, at most `workers` run at once, the others wait
    for a thread in turn."""

    def __init__(self, workers: int = PARSE_WORKERS, queue: int = PARSE_QUEUE) -> None:
        if workers < 1 or queue < 0:
            raise ValueError("workers must be at least 1 and queue at least 0")
        self.workers = workers
        self.queue = queue
        self.capacity = workers + queue
        self.closed = False
        # Of the pool's own: parse jobs never take the tokens of anyio's default limiter.
        self.limiter = anyio.CapacityLimiter(workers)
        self.admitted = 0

    @contextlib.asynccontextmanager
    async def admit(self) -> AsyncIterator[ParseSlot]:
        """A place for one request, taken at once; refused with `TooManyRequests` when
        `capacity` requests are in flight, `ServiceUnavailable` once closed."""
        if self.closed:
            raise ServiceUnavailable(_CLOSED)
        if self.admitted >= self.capacity:
            raise TooManyRequests(
                f"The service has {self.admitted} ingest requests in flight, parsing "
                f"{self.workers} at a time; retry shortly."
            )
        self.admitted += 1
        slot = ParseSlot(self)
        try:
            yield slot
        finally:
            slot.leave(self._release)

    def _release(self) -> None:
        self.admitted -= 1

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on a worker thread, admitted as a request of its own."""
        async with self.admit() as slot:
            return await slot.run(fn, *args)

    def close(self) -> None:
        """Stop taking work: admissions and jobs from now on are refused; running jobs
        finish on their own."""
        self.closed = True
