"""The embedded index's approximate dense leg: an HNSW graph (usearch) beyond the exact size.

Up to `CHATQNA_EMBEDDED_EXACT_MAX_CHUNKS` live chunks the dense leg scans every vector
(`chatqna.retrieval.embedded.vectors`). Past it, each process builds a usearch HNSW graph over int8
copies of the vectors, keyed by the store's row ids, on a background thread: searches stay
exact until the graph is ready, then ask the graph for the `scan_candidates(k)` nearest rows
and rescore those with the exact float32 vectors. Later writes are added to (and removed
from) the graph as each process catches up with the store.

The graph lives in memory only (about 0.8 KB per chunk at 384 dimensions and usearch's
default connectivity of 16), so a process that opens a large index serves exact results for
the build's duration (on this project's 2-core machine, two threads, random vectors: 100k
chunks in 29 s, 1M in 763 s; one thread, ClapNQ's 4,841 passages in 0.4 s). Its
recall, measured on ClapNQ's MiniLM embeddings against exact search (`dense_recall.py`, the
Retrieval docs), is what decides the defaults below; recall on random vectors is no guide
(it is far lower: random vectors have no neighbourhood structure).
"""

from __future__ import annotations

import threading

import numpy as np
from usearch.index import Index

from chatqna.retrieval.embedded.vectors import VectorSet

CONNECTIVITY = 16
EXPANSION_ADD = 128
EXPANSION_SEARCH = 64
BUILD_BATCH = 8192


class VectorGraph:
    """An HNSW graph over row ids; safe to search while another thread adds."""

    def __init__(self, dimension: int, *, threads: int = 1) -> None:
        self._index = Index(
            ndim=dimension,
            metric="ip",
            dtype="i8",
            connectivity=CONNECTIVITY,
            expansion_add=EXPANSION_ADD,
            expansion_search=EXPANSION_SEARCH,
        )
        self._threads = threads
        self._lock = threading.Lock()

    @classmethod
    def over(cls, snapshot: VectorSet, *, threads: int = 1) -> VectorGraph:
        """A graph of the live rows of `snapshot`."""
        graph = cls(snapshot.matrix.shape[1], threads=threads)
        keep = np.flatnonzero(snapshot.alive)
        graph.add(snapshot.rows[keep], snapshot.matrix[keep])
        return graph

    def catch_up(self, snapshot: VectorSet, current: VectorSet) -> None:
        """Bring a graph built `over(snapshot)` up to `current`, a later state of the
        same vectors: add the live rows written since, remove those deleted since."""
        newer = np.flatnonzero(current.rows > snapshot.last_row)
        newer = newer[current.alive[newer]]
        self.add(current.rows[newer], current.matrix[newer])
        kept = snapshot.rows[snapshot.alive]
        self.remove(kept[current.positions(kept) < 0])

    def __len__(self) -> int:
        return len(self._index)

    @property
    def memory_bytes(self) -> int:
        return int(self._index.memory_usage)

    def add(self, rows: np.ndarray, vectors: np.ndarray) -> None:
        """Add these rows, in batches (a search waits for one batch at most)."""
        for start in range(0, len(rows), BUILD_BATCH):
            batch_rows = np.ascontiguousarray(rows[start : start + BUILD_BATCH], dtype=np.uint64)
            batch = np.ascontiguousarray(vectors[start : start + BUILD_BATCH], dtype=np.float32)
            with self._lock:
                self._index.add(batch_rows, batch, threads=self._threads)

    def remove(self, rows: np.ndarray) -> None:
        if not len(rows):
            return
        with self._lock:
            present = [int(row) for row in rows if int(row) in self._index]
            if present:
                self._index.remove(np.asarray(present, dtype=np.uint64))

    def search(self, vector: np.ndarray, count: int) -> np.ndarray:
        """Row ids of about the `count` nearest rows (unordered; rescore them exactly)."""
        with self._lock:
            if not len(self._index):
                return np.zeros(0, dtype=np.int64)
            matches = self._index.search(vector.astype(np.float32), count, threads=1)
        return np.asarray(matches.keys, dtype=np.int64)
