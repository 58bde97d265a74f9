"""The writer lock of an embedded index directory: any process may write, one at a time."""

from __future__ import annotations

import fcntl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from chatqna.errors import IndexUnavailable

LOCK_FILE = "writer.lock"
WRITER_WAIT_S = 120.0  # how long a write waits for another process's write to finish


@contextmanager
def writer_lock(directory: Path, wait_seconds: float = WRITER_WAIT_S) -> Iterator[None]:
    """Hold `directory`'s writer lock, waiting up to `wait_seconds` for another process's
    write to finish; a longer wait raises `IndexUnavailable`."""
    with open(directory / LOCK_FILE, "a+b") as handle:
        deadline = time.monotonic() + wait_seconds
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise IndexUnavailable(
                        f"another process has been writing to {directory} for over "
                        f"{wait_seconds:.0f} s"
                    ) from None
                time.sleep(0.01)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
