"""The writer lock of an embedded index directory: any process may write, one at a time."""

from __future__ import annotations

import fcntl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from chatqna.errors import IndexUnavailable

LOCK_FILE = "writer.lock"
WRITER_WAIT_S = 120.0  # how long a write waits for another process's write to finish


@contextmanager
def writer_lock(directory: Path, wait_seconds: float = WRITER_WAIT_S) -> Iterator[None]:
    """Hold `directory`'s writer lock, waiting up to `wait_seconds` for another process's
    write to finish; a longer wait raises `IndexUnavailable`."""
    with open(directory / LOCK_FILE, "a+b") as handle:
        deadline = time.monotonic() + wait_seconds
        while not _take(handle):
            if time.monotonic() > deadline:
                raise IndexUnavailable(
                    f"another process has been writing to {directory} for over {wait_seconds:.0f} s"
                )
            time.sleep(0.01)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


@contextmanager
def writer_lock_if_free(directory: Path) -> Iterator[bool]:
    """Hold `directory`'s writer lock if no one holds it (True), else do without (False) at
    once. The lock is per open file: a write of this very process counts as held."""
    with open(directory / LOCK_FILE, "a+b") as handle:
        if not _take(handle):
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _take(handle: IO[bytes]) -> bool:
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
