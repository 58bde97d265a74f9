"""Giving freed heap memory back to the operating system.

Under load the service's live memory stays level, but glibc's allocator keeps the pages that
requests freed: socket buffers, JSON bodies and vectors come and go, a few long-lived
allocations land among them, and the heap can only shrink from its top. The resident size
then creeps up by about a kilobyte per chat, with nothing in it. `malloc_trim(0)` hands the
free pages inside the heap back (Linux `madvise`), which keeps the resident size level.

`HeapTrimmer` does that in the background: once the last request in flight has finished,
and at most every `CHATQNA_HEAP_TRIM_SECONDS` while requests keep coming. When nothing is in
flight it first runs a full garbage collection, so memory held only by reference cycles
(exceptions with their tracebacks, finished tasks) is freed before the trim rather than at
whatever moment the collector's counters next reach its oldest generation. Nothing happens
without requests, with the setting at 0, or on a C library without `malloc_trim` (musl,
macOS), where the trimmer reports itself unavailable and does not start.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import os
import time
from collections.abc import Callable
from functools import cache

from chatqna.activity import RequestActivity

logger = logging.getLogger("chatqna.heap")

POLL_SECONDS = 1.0  # how often the trimmer looks at the request counters
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    # glibc's soname first: `find_library` may need `ldconfig`, which slim images can lack.
    for name in ("libc.so.6", ctypes.util.find_library("c")):
        if name is None:
            continue
        try:
            trim = ctypes.CDLL(name).malloc_trim
        except (OSError, AttributeError):
            continue
        trim.argtypes = [ctypes.c_size_t]
        trim.restype = ctypes.c_int
        return trim
    return None


def trim_available() -> bool:
    """True when the C library has `malloc_trim` (glibc)."""
    return _malloc_trim() is not None


def resident_bytes() -> int | None:
    """This process's resident set size, from `/proc/self/statm` (Linux only)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * _PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return None


def release_free_heap() -> int | None:
    """Return the heap's free pages to the OS; the resident bytes that freed, if measurable.

    None when `malloc_trim` is missing. Blocks for as long as glibc walks its free lists
    (about a millisecond for a heap of tens of megabytes); run it in a worker thread.
    """
    trim = _malloc_trim()
    if trim is None:
        return None
    before = resident_bytes()
    trim(0)
    after = resident_bytes()
    if before is None or after is None:
        return 0
    return max(0, before - after)


def freeze_startup_objects() -> int:
    """Collect once, then move every object alive now (modules, the app, the backends and
    the index) out of the collector's reach for good (`gc.freeze`); returns how many.

    Full collections then walk only what requests created, so the one before an idle trim,
    and those the collector starts under load, take a few milliseconds instead of tens.
    Frozen objects are still freed when nothing refers to them; only reference cycles among
    them are never collected, which start-up state does not form.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class HeapTrimmer:
    """Trims the heap when the service falls idle after requests (after a full collection),
    or every `interval_seconds` under steady load. `run()` loops until cancelled.
    """

    def __init__(
        self,
        activity: RequestActivity,
        interval_seconds: float,
        *,
        release: Callable[[], int | None] = release_free_heap,
        collect: Callable[[], object] = gc.collect,
        on_trim: Callable[[int], None] | None = None,
        poll_seconds: float = POLL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval_seconds <= 0:
            raise ValueError("interval_seconds must be positive")
        self.activity = activity
        self.interval_seconds = interval_seconds
        self.poll_seconds = min(poll_seconds, interval_seconds)
        self._release = release
        self._collect = collect
        self._on_trim = on_trim
        self._clock = clock
        self._finished_at_last_trim = activity.finished
        self._last_trim = clock()
        self.trims = 0

    def due(self) -> bool:
        """Requests have finished since the last trim, and either none is in flight or the
        interval has passed."""
        if self.activity.finished == self._finished_at_last_trim:
            return False
        if self.activity.in_flight == 0:
            return True
        return self._clock() - self._last_trim >= self.interval_seconds

    async def trim(self) -> int | None:
        """Trim now, in a worker thread, after a full collection if nothing is in flight;
        returns what `release_free_heap` returned."""
        self._finished_at_last_trim = self.activity.finished
        self._last_trim = self._clock()
        if self.activity.in_flight == 0:
            self._collect()  # on the event loop's thread: the collector stops every thread
        released = await asyncio.to_thread(self._release)
        self.trims += 1
        if released is not None and self._on_trim is not None:
            self._on_trim(released)
        logger.debug("heap trimmed: %s bytes back to the OS", released)
        return released

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.poll_seconds)
            if self.due():
                await self.trim()
