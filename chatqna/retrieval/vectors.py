"""The embedded index's dense leg: exact cosine search over a float32 matrix in memory.

The matrix mirrors the vectors of the store of record (`chatqna.retrieval.chunk_store`),
one row per live chunk, ordered by row id. A `VectorSet` is immutable: searches read one
without locks while a refresh builds the next one. Appends go to spare capacity of the
shared buffer (growing by half when full, with a quarter spare after a first load), past
the end any existing set reads, so adding rows costs their own size; removed rows are
masked, and the buffer is compacted once a quarter of it is dead.

Exact search is a matrix-vector product and a partial sort, memory-bound: about 1 ms per
10,000 rows of 384 dimensions on one core of an idle machine (see the Retrieval docs for the
measured limit). BLAS runs it on one thread (`single_threaded_blas`): a second thread buys
little on a memory-bound product, and on a busy machine waiting for it to be scheduled
costs a whole time slice (measured at 2,000 rows on 2 busy cores: p95 36 ms with two
threads, 0.15 ms with one).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from threadpoolctl import ThreadpoolController

COMPACT_DEAD_FRACTION = 0.25


@functools.cache
def single_threaded_blas() -> None:
    """Limit the process's BLAS to one thread (once; searches run on many threads)."""
    ThreadpoolController().limit(limits=1, user_api="blas")


@dataclass(frozen=True)
class VectorSet:
    buffer: np.ndarray  # (capacity, dimension) float32; rows [:size] are this set's
    size: int
    rows: np.ndarray  # (size,) int64 store row ids, ascending
    alive: np.ndarray  # (size,) bool
    live: int

    @classmethod
    def empty(cls, dimension: int) -> VectorSet:
        return cls(
            np.zeros((0, dimension), dtype=np.float32),
            0,
            np.zeros(0, dtype=np.int64),
            np.zeros(0, dtype=bool),
            0,
        )

    @property
    def matrix(self) -> np.ndarray:
        return self.buffer[: self.size]

    @property
    def last_row(self) -> int:
        return int(self.rows[-1]) if self.size else 0

    def positions(self, rows: np.ndarray) -> np.ndarray:
        """Matrix positions of these row ids; -1 for rows this set lacks or has removed."""
        if not self.size:
            return np.full(len(rows), -1, dtype=np.int64)
        found = np.minimum(np.searchsorted(self.rows, rows), self.size - 1)
        ok = (self.rows[found] == rows) & self.alive[found]
        return np.where(ok, found, -1)

    def apply(self, added: np.ndarray, vectors: np.ndarray, removed: np.ndarray) -> VectorSet:
        """The next set: `added` rows (ids above `last_row`) appended, `removed` masked."""
        alive = self.alive
        live = self.live
        if len(removed) and self.size:
            gone = self.positions(removed)
            gone = gone[gone >= 0]
            if len(gone):
                alive = alive.copy()
                alive[gone] = False
                live -= len(gone)
        buffer, size, rows = self.buffer, self.size, self.rows
        if len(added):
            if size + len(added) > len(buffer):
                # Room for a quarter more: the next requests append without copying.
                capacity = max(len(buffer) * 3 // 2, (size + len(added)) * 5 // 4, 1024)
                grown = np.empty((capacity, buffer.shape[1]), dtype=np.float32)
                grown[:size] = buffer[:size]
                buffer = grown
            buffer[size : size + len(added)] = vectors
            rows = np.concatenate([rows, added])
            alive = np.concatenate([alive, np.ones(len(added), dtype=bool)])
            size += len(added)
            live += len(added)
        result = VectorSet(buffer, size, rows, alive, live)
        if size - live > COMPACT_DEAD_FRACTION * size and size - live > 1000:
            return result.compacted()
        return result

    def compacted(self) -> VectorSet:
        keep = np.flatnonzero(self.alive)
        buffer = np.empty((max(len(keep), 1024), self.buffer.shape[1]), dtype=np.float32)
        buffer[: len(keep)] = self.buffer[keep]
        return VectorSet(buffer, len(keep), self.rows[keep], np.ones(len(keep), bool), len(keep))

    def cosine(self, vector: np.ndarray) -> np.ndarray:
        """Similarity of every position to `vector`; removed positions score -inf."""
        scores: np.ndarray = self.matrix @ vector
        if self.live != self.size:
            scores[~self.alive] = -np.inf
        return scores

    def top(self, scores: np.ndarray, k: int) -> np.ndarray:
        """Positions of the `k` best live scores, best first (ties: the lower position)."""
        k = min(k, self.live)
        if k <= 0:
            return np.zeros(0, dtype=np.int64)
        if k < len(scores):
            candidates = np.argpartition(-scores, k - 1)[:k]
        else:
            candidates = np.arange(len(scores))
        order = np.lexsort((candidates, -scores[candidates]))
        return candidates[order][:k]
