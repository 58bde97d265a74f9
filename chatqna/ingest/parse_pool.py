"""Where the service parses what it ingests: a few worker threads, and a bound on the
requests in flight.

Parsing and chunking a file (a PDF, a Word file) is CPU-bound and can take seconds, and an
upload read into memory can take up to `CHATQNA_MAX_UPLOAD_REQUEST_BYTES`. Two bounds
apply, and they count different things. Admission counts requests: at most
`workers + queue` ingest requests are in flight at once, and one more is refused at once
with 429 `too_many_requests` (answered with `Retry-After`), as a chat is when every chat
slot stays taken: nothing waits in an unbounded queue. Work counts tokens: at most
`workers` admitted requests work at once, each holding one of the tokens of a
`CapacityLimiter` of the pool's own from the moment its body is in until it is done
(`ParseSlot.working`): reading its uploads into memory, fetching its links, parsing on
one of anyio's worker threads, embedding and writing. A request beyond those waits for a
token in the order it asked (the limiter hands its tokens on first come, first served).
So the files and pages held in memory are those of `workers` requests at most, and an
admitted request that is still receiving its body (spooled to disk by the form parser)
holds no token: slow uploads never keep the others from working. Parse work shares no
pool with asyncio's default executor (the index's writes), with the embedded index's
search threads, or with anyio's default limiter (Starlette's threadpool): anyio starts a
thread whenever none is idle, so a slow parse never holds up a thread another caller
asked for.

A request is admitted (`admit`) before it does any work: before its uploads are read and
its links fetched, so a refused request costs nothing. It keeps its place, and its token,
until it is done, and until its parsing thread has finished, even when the request is
cancelled (its client left) while the thread is still parsing: the threads parsing belong
to working requests, never more. A request cancelled while it waits for a token leaves
the line and does nothing more, and so does one whose wait is stopped (the upload route
stops it when the client disconnects, and gives its place back). Once a request holds its
token, nothing watches its client: it reads, parses and writes to the end. The bounds
hold per process: with several workers (`CHATQNA_WORKERS`), each has a pool of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from chatqna.errors import ServiceUnavailable, TooManyRequests

__all__ = ["PARSE_QUEUE", "PARSE_WORKERS", "ParsePool", "ParseSlot", "Waiting"]

T = TypeVar("T")
# Runs a request's wait for its token, and may stop it (see `ParseSlot.working`).
Waiting = Callable[[Awaitable[None]], Awaitable[None]]

# Parsing is Python code under the GIL for the most part: more threads than this add
# contention, not throughput, and leave the cores to the chats.
PARSE_WORKERS = 2
# Requests admitted beyond those working at once; beyond them, 429.
PARSE_QUEUE = 8
_CLOSED = "The service is shutting down and parses nothing more; retry shortly."


class ParseSlot:
    """One admitted request's place in a `ParsePool`. Its work in memory (reading its
    uploads, fetching its links, parsing, embedding, writing) runs under `working()`, which
    holds one of the pool's `workers` tokens; its parse jobs (`run`) run on worker threads
    in a copy of the caller's context (anyio copies it). The token, and then the place, go
    back to the pool once the request has let go of them and its job has finished on its
    thread. A request runs one job at a time, so it never takes two threads."""

    def __init__(self, pool: ParsePool) -> None:
        self._pool = pool
        self._job: asyncio.Future[Any] | None = None
        self._working = False

    @contextlib.asynccontextmanager
    async def working(self, waiting: Waiting | None = None) -> AsyncIterator[None]:
        """Hold one of the pool's tokens, waiting in turn for one (first come, first
        served); `ServiceUnavailable` once the pool is closed. A request cancelled while it
        waits leaves the line (the limiter passes a token just handed to it on to the
        next) and does nothing more. `waiting`, when given, runs the wait for the token
        and may stop it (the API's `while_connected` does when the client leaves): what it
        raises then leaves the line the same way, holding no token, also when it is
        stopped just as the token comes (a cancelled request gives a token granted to it
        back at once). A `waiting` that raises has ended the wait it runs."""
        if self._pool.closed:
            raise ServiceUnavailable(_CLOSED)
        limiter = self._pool.limiter
        # The slot borrows the token, not the task: `run` hands the work to a job of its
        # own, and a cancelled request's token stays borrowed until that job is done.
        taking = limiter.acquire_on_behalf_of(self)
        try:
            await (taking if waiting is None else waiting(taking))
        except BaseException:
            # Stopped (cancelled) just as the token came: the wait itself finished, so the
            # limiter did not take the token back, and the request will never release it.
            if self in limiter.statistics().borrowers:
                limiter.release_on_behalf_of(self)
            raise
        self._working = True
        try:
            yield
        finally:
            self._working = False
            self._after_job(lambda: limiter.release_on_behalf_of(self))

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on a worker thread, under `working()`; `ServiceUnavailable` once the
        pool is closed."""
        if self._pool.closed:
            raise ServiceUnavailable(_CLOSED)
        if not self._working:
            raise RuntimeError("a parse slot runs its jobs under its working() token")
        threads = self._pool.threads
        job = asyncio.ensure_future(anyio.to_thread.run_sync(fn, *args, limiter=threads))
        self._job = job
        # anyio shields the wait for the thread from anyio's cancel scopes, not from a plain
        # `task.cancel()` (a client's disconnect, `asyncio.timeout`): that one would end the
        # job while its thread parses on. Shielded as a task of its own, the job ends with
        # its thread, and `working` and `leave` keep the token and the place until then.
        return await asyncio.shield(job)

    def leave(self, release: Callable[[], None]) -> None:
        """The request is done with its place: `release` it now, or once its job is."""
        self._after_job(release)

    def _after_job(self, release: Callable[[], None]) -> None:
        def after(job: asyncio.Future[Any]) -> None:
            # The request that ran the job may have left (cancelled) and so never hears of
            # its failure: taken here, it is not reported as lost when the job is collected.
            if not job.cancelled():
                job.exception()
            release()

        if self._job is None:
            release()
        elif self._job.done():
            after(self._job)
        else:
            self._job.add_done_callback(after)


class ParsePool:
    """At most `workers + queue` requests admitted at once, one more refused with
    `TooManyRequests`; of those, at most `workers` work (and parse) at once, the others
    wait for a token in turn."""

    def __init__(self, workers: int = PARSE_WORKERS, queue: int = PARSE_QUEUE) -> None:
        if workers < 1 or queue < 0:
            raise ValueError("workers must be at least 1 and queue at least 0")
        self.workers = workers
        self.queue = queue
        self.capacity = workers + queue
        self.closed = False
        # The requests working at once: from reading their uploads into memory and
        # fetching their links to parsing them and writing their chunks.
        self.limiter = anyio.CapacityLimiter(workers)
        # The threads parse jobs run on, as many as `limiter` lets work; a limiter of the
        # pool's own, so they never take the tokens of anyio's default one.
        self.threads = anyio.CapacityLimiter(math.inf)
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
        async with self.admit() as slot, slot.working():
            return await slot.run(fn, *args)

    def close(self) -> None:
        """Stop taking work: admissions and jobs from now on are refused; running jobs
        finish on their own."""
        self.closed = True
