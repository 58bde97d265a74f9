"""The embedded index's threads: its searches and reads run here, not on asyncio's pool.

Work queued on asyncio's default pool (uploads being parsed, say) never delays a search,
and closing the index waits for the reads running here before the store is closed. Once
closed, the pool refuses work with `ServiceUnavailable` (503 `service_unavailable`), not
with the bare `RuntimeError` of a shut-down executor: a read submitted after the close,
and one still queued when the close dropped it, alike; so does `check()`, for the index's
writes.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from chatqna.errors import ServiceUnavailable

__all__ = ["IndexThreads"]

T = TypeVar("T")


class IndexThreads:
    """A thread pool of the index's own for its reads, each run in its caller's context;
    once closed, work is refused with `ServiceUnavailable` naming `what`. `workers`
    defaults to `ThreadPoolExecutor`'s own (`min(32, cpus + 4)`)."""

    def __init__(self, what: str, workers: int | None = None) -> None:
        self.what = what
        self.closed = False
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="chatqna-search")

    def check(self) -> None:
        """Raise `ServiceUnavailable` once the pool is closed."""
        if self.closed:
            raise ServiceUnavailable.closed(self.what)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on one of the pool's threads, in a copy of the caller's context."""
        self.check()
        try:
            job = self._executor.submit(contextvars.copy_context().run, fn, *args)
        except RuntimeError as exc:  # the pool shut down since the check
            raise ServiceUnavailable.closed(self.what) from exc
        try:
            return await asyncio.wrap_future(job)
        except asyncio.CancelledError:
            # Dropped from the queue by `close()`, not cancelled by its caller: refused.
            task = asyncio.current_task()
            if job.cancelled() and self.closed and not (task and task.cancelling()):
                raise ServiceUnavailable.closed(self.what) from None
            raise

    async def close(self) -> None:
        """Refuse new work and wait for the running reads; the queued ones are dropped
        (and refused)."""
        self.closed = True
        self._executor.shutdown(wait=False, cancel_futures=True)  # drops the queue at once
        await asyncio.to_thread(self._executor.shutdown, wait=True)
