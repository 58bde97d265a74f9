"""The embedded index directory's writer lock: one writing process at a time."""

from __future__ import annotations

import fcntl
from pathlib import Path

import pytest

from chatqna.errors import IndexUnavailable
from chatqna.retrieval.embedded.lock import LOCK_FILE, writer_lock


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
