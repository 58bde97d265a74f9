"""The embedded index directory's writer lock: one writer at a time, across processes and
within one."""

from __future__ import annotations

import errno
import fcntl
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from chatqna.errors import IndexUnavailable
from chatqna.retrieval.embedded.lock import LOCK_FILE, writer_lock, writer_lock_if_free

HOLDER = """
import sys
from pathlib import Path
from chatqna.retrieval.embedded.lock import writer_lock
with writer_lock(Path(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_the_lock_is_released_after_the_write(tmp_path: Path) -> None:
    with writer_lock(tmp_path):
        assert (tmp_path / LOCK_FILE).exists()
    with open(tmp_path / LOCK_FILE, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again


def test_a_held_lock_makes_the_next_writer_give_up_after_its_wait(tmp_path: Path) -> None:
    with open(tmp_path / LOCK_FILE, "a+b") as other:
        fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        with (
            pytest.raises(IndexUnavailable, match="another process has been writing"),
            writer_lock(tmp_path, wait_seconds=0.0),
        ):
            pass


def test_two_writers_of_one_process_exclude_each_other(tmp_path: Path) -> None:
    refused: list[BaseException] = []

    def other_thread() -> None:
        try:
            with writer_lock(tmp_path, wait_seconds=0.0):
                pass
        except IndexUnavailable as exc:
            refused.append(exc)

    with writer_lock(tmp_path):
        with pytest.raises(IndexUnavailable), writer_lock(tmp_path, wait_seconds=0.0):
            pass  # the same thread
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        assert len(refused) == 1
        with writer_lock_if_free(tmp_path) as free:
            assert not free  # a write of this very process counts as held
    with writer_lock_if_free(tmp_path) as free:
        assert free
        with writer_lock_if_free(tmp_path) as again:
            assert not again
    with writer_lock(tmp_path, wait_seconds=0.0):
        pass  # released by the one that held it


def test_another_process_s_writer_holds_the_lock_until_it_is_killed(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        with writer_lock_if_free(tmp_path) as free:
            assert not free
        with pytest.raises(IndexUnavailable), writer_lock(tmp_path, wait_seconds=0.0):
            pass
        holder.send_signal(signal.SIGKILL)  # a writer killed mid-write leaves no lock behind
        holder.wait(timeout=10)
        with writer_lock(tmp_path, wait_seconds=10.0), writer_lock_if_free(tmp_path) as free:
            assert not free
    finally:
        holder.kill()
        holder.wait(timeout=10)


def _without_flock(fd: int, operation: int) -> None:
    raise OSError(errno.ENOSYS, "Function not implemented")


@pytest.mark.parametrize(
    "take",
    [lambda d: writer_lock(d, wait_seconds=0.0), writer_lock_if_free],
    ids=["writer_lock", "writer_lock_if_free"],
)
def test_a_file_system_without_flock_fails_at_once_instead_of_locking_by_the_file(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    take: Callable[[Path], AbstractContextManager[Any]],
) -> None:
    # Every data directory keeps its lock file: a lock that is the file's existence would
    # find it "held" for ever.
    (tmp_path / LOCK_FILE).touch()
    monkeypatch.setattr(fcntl, "flock", _without_flock)
    with pytest.raises(OSError, match="Function not implemented") as raised, take(tmp_path):
        pass
    assert raised.value.errno == errno.ENOSYS
