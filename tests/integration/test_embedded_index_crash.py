"""The embedded index after `kill -9`: a real writer process killed at several points of
its writes, the index reopened each time; every source is fully one version."""

from __future__ import annotations

import queue
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from chatqna.backends.protocols import SearchQuery
from chatqna.retrieval.embedded.chunk_store import STORE_FILE
from chatqna.retrieval.embedded.index import EmbeddedHybridIndex
from chatqna.retrieval.embedded.lock import writer_lock
from tests.integration.conftest import REPO, clean_env
from tests.integration.index_writer import DIMENSION, EMBEDDER, SOURCES, batches, chunk_count

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

# (requests begun before the kill, seconds after the last `begin`): from the very start of
# a write to well into it; the writes take a few hundred milliseconds here.
KILL_POINTS = [(1, 0.0), (1, 0.02), (2, 0.05), (1, 0.1), (2, 0.2), (1, 0.35), (3, 0.6)]


class Writer:
    """`tests.integration.index_writer` in a subprocess, its output lines in a queue."""

    def __init__(self, directory: Path, first: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.index_writer", str(directory), str(first)],
            cwd=REPO,
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.strip())

    def wait_for_begins(self, count: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while sum(line.startswith("begin ") for line in self.seen) < count:
            remaining = deadline - time.monotonic()
            assert remaining > 0 and self.process.poll() is None, self.seen
            try:
                self.seen.append(self.lines.get(timeout=remaining))
            except queue.Empty:
                continue

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)
        while not self.lines.empty():
            self.seen.append(self.lines.get())

    def versions(self, word: str) -> list[int]:
        return [int(line.split()[1]) for line in self.seen if line.startswith(f"{word} ")]


def stored_versions(directory: Path) -> dict[str, set[str]]:
    """Each source's set of version tokens, read from the store of record directly."""
    found: dict[str, set[str]] = {}
    with sqlite3.connect(directory / STORE_FILE) as db:
        for source, text in db.execute("SELECT source, text FROM chunks"):
            found.setdefault(source, set()).add(text.split()[0])
    return found


async def test_index_survives_kill_9_at_any_point_of_a_write(tmp_path: Path) -> None:
    directory = tmp_path / "index"
    first = 1
    last_done = 0
    torn = 0  # kills that landed inside a write (begun, not done)
    for begins, delay in KILL_POINTS:
        writer = Writer(directory, first)
        writer.wait_for_begins(begins)
        time.sleep(delay)
        writer.kill()
        begun, done = writer.versions("begin"), writer.versions("done")
        assert begun, writer.seen
        torn += begun[-1] not in done
        last_done = max([last_done, *done])

        index = await EmbeddedHybridIndex.open(
            directory, embedder_name=EMBEDDER, dimension=DIMENSION
        )
        sources = await index.list_sources()
        # Before the first request returns, the index may still be empty: never half full.
        assert len(sources) == SOURCES or (not sources and last_done == 0)
        on_disk = stored_versions(directory)
        for info in sources:
            version = int(info.content_hash.removeprefix("v"))
            # Fully one version: its hash, its chunk count, every chunk's text.
            assert on_disk[info.source] == {f"ver{version}"}, info
            assert info.chunks == chunk_count(version), info
            # Nothing returned as done is lost; nothing not yet begun appears.
            assert last_done <= version <= begun[-1], (info, writer.seen)
        # The BM25 leg agrees with the store: a version's word finds exactly its chunks.
        versions = {int(s.content_hash.removeprefix("v")) for s in sources}
        total = sum(s.chunks for s in sources)
        assert index.lexical.count() == total
        for version in versions:
            query = SearchQuery(
                f"ver{version}", np.ones(DIMENSION, np.float32), 5000, fusion_weights=(0.0, 1.0)
            )
            hits = [h for h in await index.search(query) if h.scores["bm25"] > 0]
            expected = sum(s.chunks for s in sources if s.content_hash == f"v{version}")
            assert len(hits) == expected
            assert {h.chunk.text.split()[0] for h in hits} == {f"ver{version}"}
        await index.aclose()
        first = begun[-1] + 1
    assert torn >= 3, "most kill points should land inside a write"


# A writer that dies of SIGKILL right after its SQLite commit, before tantivy's.
KILLED_BETWEEN_COMMITS = """
import asyncio, os, signal, sys
from pathlib import Path
from chatqna.retrieval.embedded.index import EmbeddedHybridIndex
from chatqna.retrieval.embedded.lexical import LexicalIndex
from tests.integration.index_writer import DIMENSION, EMBEDDER, batches

LexicalIndex.write = lambda *args: os.kill(os.getpid(), signal.SIGKILL)

async def main():
    index = await EmbeddedHybridIndex.open(
        Path(sys.argv[1]), embedder_name=EMBEDDER, dimension=DIMENSION
    )
    await index.replace_sources(batches(2))

asyncio.run(main())
"""


async def test_a_running_reader_repairs_what_a_killed_writer_left_behind(
    tmp_path: Path,
) -> None:
    """A process killed between its two commits leaves the lexical index a version behind;
    a process that was already reading repairs it on its next search once no other writer
    holds the lock, instead of serving BM25 from the old version until a write or restart."""
    directory = tmp_path / "index"
    reader = await EmbeddedHybridIndex.open(directory, embedder_name=EMBEDDER, dimension=DIMENSION)
    await reader.replace_sources(batches(1))
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_BETWEEN_COMMITS, str(directory)],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    generations = reader.store.generations()
    assert generations.lexical < generations.store

    def bm25_hits(word: str) -> int:
        query = SearchQuery(word, np.ones(DIMENSION, np.float32), 5000, fusion_weights=(0.0, 1.0))
        return sum(h.scores["bm25"] > 0 for h in reader.search_sync(query))

    with writer_lock(directory):  # a writer at work: the reader leaves the index to it
        assert bm25_hits("ver2") == 0
    assert bm25_hits("ver2") == SOURCES * chunk_count(2)
    assert bm25_hits("ver1") == 0
    generations = reader.store.generations()
    assert generations.lexical == generations.store
    await reader.aclose()
