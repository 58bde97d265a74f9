"""The embedded index's dense leg: exact cosine search over the vectors in memory.

The set mirrors the vectors of the store of record (`chatqna.retrieval.embedded.chunk_store`), one
row per live chunk, ordered by row id, twice: as float32 (the exact values) and as int8
codes with one scale per row (a quarter of the bytes). A search scans the codes with
numkong's int8 dot-product kernels (VNNI / AMX where the CPU has them), keeps the best
`SCAN_OVERSAMPLE` times as many positions as asked for (at least `SCAN_MIN_CANDIDATES`),
rescores those with the float32 vectors and returns the best by their exact cosine. Sets of
at most that many rows are scored in float32 outright.

Measured on this project's 2-core machine (Retrieval docs, `index_scale.py`,
`dense_recall.py`): the int8 scan reads 100,000 rows of 384 dimensions in about 3-4 ms on
one core against 8-13 ms for a float32 matrix-vector product, and 1,000,000 in about 50 ms;
its rescored top 50 matches the float32 top 50 (score recall 1.000 on random vectors and
0.999 on ClapNQ's MiniLM embeddings, where the misses are ties).

A `VectorSet` is immutable: searches read one without locks while a refresh builds the next
one. Appends go to spare capacity of the shared buffers (growing by half when full, with a
quarter spare after a first load), past the end any existing set reads, so adding rows costs
their own size; removed rows are masked, and the buffers are compacted once a quarter of
them is dead.

BLAS (the float32 products) runs on one thread (`single_threaded_blas`): a second thread
buys little on a memory-bound product, and on a busy machine waiting for it to be scheduled
costs a whole time slice (measured at 2,000 rows on 2 busy cores: p95 36 ms with two
threads, 0.15 ms with one).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numkong
import numpy as np
from threadpoolctl import ThreadpoolController

COMPACT_DEAD_FRACTION = 0.25
SCAN_OVERSAMPLE = 4
SCAN_MIN_CANDIDATES = 200


@functools.cache
def single_threaded_blas() -> None:
    """Limit the process's BLAS to one thread (once; searches run on many threads)."""
    ThreadpoolController().limit(limits=1, user_api="blas")


def quantize(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 codes, one scale per row: `vectors ~= codes * scales[:, None]`."""
    peak = np.abs(vectors).max(axis=1) if len(vectors) else np.zeros(0, np.float32)
    peak = np.where(peak > 0, peak, 1.0).astype(np.float32)
    codes = np.rint(vectors * (127.0 / peak)[:, None]).astype(np.int8)
    return codes, peak / np.float32(127.0)


def scan_candidates(k: int) -> int:
    """How many positions the int8 scan keeps for exact rescoring when `k` are asked for."""
    return max(k * SCAN_OVERSAMPLE, SCAN_MIN_CANDIDATES)


@dataclass(frozen=True)
class VectorSet:
    buffer: np.ndarray  # (capacity, dimension) float32; rows [:size] are this set's
    codes: np.ndarray  # (capacity, dimension) int8 codes of `buffer`
    scales: np.ndarray  # (capacity,) float32 scale of each code row
    size: int
    rows: np.ndarray  # (size,) int64 store row ids, ascending
    alive: np.ndarray  # (size,) bool
    live: int

    @classmethod
    def empty(cls, dimension: int) -> VectorSet:
        return cls(
            np.zeros((0, dimension), dtype=np.float32),
            np.zeros((0, dimension), dtype=np.int8),
            np.zeros(0, dtype=np.float32),
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
        buffer, codes, scales, size, rows = (
            self.buffer,
            self.codes,
            self.scales,
            self.size,
            self.rows,
        )
        if len(added):
            if size + len(added) > len(buffer):
                # Room for a quarter more: the next requests append without copying.
                capacity = max(len(buffer) * 3 // 2, (size + len(added)) * 5 // 4, 1024)
                buffer, codes, scales = _grown(buffer, codes, scales, size, capacity)
            buffer[size : size + len(added)] = vectors
            codes[size : size + len(added)], scales[size : size + len(added)] = quantize(
                np.asarray(vectors, dtype=np.float32)
            )
            rows = np.concatenate([rows, added])
            alive = np.concatenate([alive, np.ones(len(added), dtype=bool)])
            size += len(added)
            live += len(added)
        result = VectorSet(buffer, codes, scales, size, rows, alive, live)
        if size - live > COMPACT_DEAD_FRACTION * size and size - live > 1000:
            return result.compacted()
        return result

    def compacted(self) -> VectorSet:
        keep = np.flatnonzero(self.alive)
        capacity = max(len(keep), 1024)
        buffer, codes, scales = _grown(self.buffer, self.codes, self.scales, 0, capacity)
        buffer[: len(keep)] = self.buffer[keep]
        codes[: len(keep)] = self.codes[keep]
        scales[: len(keep)] = self.scales[keep]
        return VectorSet(
            buffer, codes, scales, len(keep), self.rows[keep], np.ones(len(keep), bool), len(keep)
        )

    def similarity(self, vector: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Exact cosine of these positions to `vector` (float32)."""
        if not len(positions):
            return np.zeros(0, dtype=np.float32)
        scores: np.ndarray = self.buffer[positions] @ vector
        return scores

    def search(self, vector: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Positions of the `k` live rows nearest `vector` and their exact cosines, best
        first (ties: the lower position)."""
        k = min(k, self.live)
        if k <= 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        wanted = scan_candidates(k)
        if self.size <= wanted:
            positions = np.arange(self.size)
            exact: np.ndarray = self.matrix @ vector
        else:
            positions = self._scan(vector, wanted)
            exact = self.similarity(vector, positions)
        if self.live != self.size:
            exact = np.where(self.alive[positions], exact, -np.inf)
        return self.best(positions, exact, k)

    def rescore(
        self, vector: np.ndarray, rows: np.ndarray, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """The best `k` of these row ids (another index's candidates) by exact cosine,
        as `search` returns them; rows this set lacks or has removed are dropped."""
        positions = self.positions(rows)
        positions = np.unique(positions[positions >= 0])
        return self.best(positions, self.similarity(vector, positions), min(k, len(positions)))

    @staticmethod
    def best(positions: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if k < len(scores):
            keep = np.argpartition(-scores, k - 1)[:k]
            positions, scores = positions[keep], scores[keep]
        order = np.lexsort((positions, -scores))[:k]
        return positions[order].astype(np.int64), scores[order].astype(np.float32)

    def _scan(self, vector: np.ndarray, wanted: int) -> np.ndarray:
        """The `wanted` positions best by the int8 codes (removed rows excluded)."""
        query, _ = quantize(vector.reshape(1, -1).astype(np.float32))
        dots = numkong.cdist(query, self.codes[: self.size], metric="dot", out_dtype="float32")
        approximate = np.asarray(dots, dtype=np.float32).reshape(-1) * self.scales[: self.size]
        if self.live != self.size:
            approximate[~self.alive] = -np.inf
        return np.argpartition(-approximate, wanted - 1)[:wanted]


def _grown(
    buffer: np.ndarray, codes: np.ndarray, scales: np.ndarray, size: int, capacity: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Buffers of `capacity` rows holding the first `size` rows of these."""
    dimension = buffer.shape[1]
    new_buffer = np.empty((capacity, dimension), dtype=np.float32)
    new_codes = np.empty((capacity, dimension), dtype=np.int8)
    new_scales = np.empty(capacity, dtype=np.float32)
    new_buffer[:size] = buffer[:size]
    new_codes[:size] = codes[:size]
    new_scales[:size] = scales[:size]
    return new_buffer, new_codes, new_scales
