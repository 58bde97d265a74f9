"""The writer lock of an embedded index directory: any process may write, one at a time.

`filelock.FileLock` (an `flock` on `writer.lock`, left in place). Each use takes a lock of
its own, never a shared one (a `FileLock` is re-entrant per object and thread): a second
writer in this very process, even on the same thread, finds the lock held as another
process's writer does. On a file system without `flock` (some network and FUSE mounts) it
raises `OSError` (ENOSYS) instead of falling back to a lock that is the file's existence:
every data directory keeps its `writer.lock`, which would then block every write for good.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from chatqna.errors import IndexUnavailable

LOCK_FILE = "writer.lock"
WRITER_WAIT_S = 120.0  # how long a write waits for another process's write to finish


@contextmanager
def writer_lock(directory: Path, wait_seconds: float = WRITER_WAIT_S) -> Iterator[None]:
    """Hold `directory`'s writer lock, waiting up to `wait_seconds` for another process's
    write to finish; a longer wait raises `IndexUnavailable`."""
    lock = FileLock(directory / LOCK_FILE, timeout=wait_seconds, fallback_to_soft=False)
    try:
        lock.acquire()
    except Timeout as exc:
        raise IndexUnavailable(
            f"another process has been writing to {directory} for over {wait_seconds:.0f} s"
        ) from exc
    try:
        yield
    finally:
        lock.release()


@contextmanager
def writer_lock_if_free(directory: Path) -> Iterator[bool]:
    """Hold `directory`'s writer lock if no one holds it (True), else do without (False) at
    once. A write of this very process counts as held."""
    lock = FileLock(directory / LOCK_FILE, fallback_to_soft=False)
    try:
        lock.acquire(blocking=False)
    except Timeout:
        yield False
        return
    try:
        yield True
    finally:
        lock.release()
