"""The embedded retriever: SQLite store of record, tantivy BM25, exact dense search in memory.

Files in the index directory (`<CHATQNA_DATA_DIR>/index/`):

- `chunks.sqlite3` (+ `-wal`, `-shm`): chunks, their vectors and the sources' content hashes,
  the store of record (`chunk_store`); one transaction per write request.
- `lexical/`: the tantivy index of the BM25 leg (`lexical`), derived from the store and
  rebuilt from it whenever it is found behind with no writer at work (a writer killed
  between its two commits, or whose BM25 commit failed): by the next open, write or search
  of any process.
- `writer.lock`: the lock a writing process holds (`lock`; any process may write, one at a time).

The vectors are also held in memory (`vectors`): exact search (an int8 scan rescored in
float32) up to `exact_max` live chunks, an HNSW graph built in the background beyond it
(`vector_graph`); the modules named are this package's. A hybrid search fuses the best
`max(k, rrf_candidates)` passages of each leg by weighted reciprocal rank fusion and keeps
the best `k`. Searches run on threads of their own (`threads`); closing waits for the
running ones and a write in progress, and later work is refused with `ServiceUnavailable`.

Several processes may open one directory. Each search first reads the store's generation
counter (one indexed SQLite read); when another process has committed since, it loads just
the rows added and removed and reopens the lexical index's last commit. A write is thus
visible to every process's next search once the writing request has returned.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from chatqna.backends.protocols import SearchQuery, SourceBatch, SourceInfo
from chatqna.documents import ScoredChunk
from chatqna.errors import IndexUnavailable
from chatqna.retrieval.embedded.chunk_store import (
    REBUILD_HINT,
    STORE_FILE,
    ChunkStore,
    Generations,
)
from chatqna.retrieval.embedded.lexical import LexicalIndex
from chatqna.retrieval.embedded.lock import writer_lock, writer_lock_if_free
from chatqna.retrieval.embedded.threads import IndexThreads
from chatqna.retrieval.embedded.vector_graph import VectorGraph
from chatqna.retrieval.embedded.vectors import VectorSet, scan_candidates, single_threaded_blas
from chatqna.retrieval.fusion import DEFAULT_RRF_K, FUSION_CANDIDATES, reciprocal_rank_fusion
from chatqna.retrieval.query import WeightedQuery

EXACT_MAX_CHUNKS = 1_000_000  # live chunks searched exactly; an HNSW graph beyond
log = logging.getLogger(__name__)


class EmbeddedHybridIndex:
    """Dense search (exact, or HNSW past `exact_max`) plus tantivy BM25, fused by RRF."""

    supports_bm25_history = True

    def __init__(
        self,
        directory: Path,
        *,
        embedder_name: str,
        dimension: int,
        rrf_k: int = DEFAULT_RRF_K,
        rrf_candidates: int = FUSION_CANDIDATES,
        exact_max: int = EXACT_MAX_CHUNKS,
        graph_threads: int = 1,
    ) -> None:
        if rrf_k < 1 or rrf_candidates < 1:
            raise ValueError("rrf_k and rrf_candidates must be at least 1")
        if exact_max < 0 or graph_threads < 1:
            raise ValueError("exact_max must be at least 0 and graph_threads at least 1")
        self.directory = directory
        self.path = directory / STORE_FILE
        self.embedder_name = embedder_name
        self.dimension = dimension
        self.rrf_k = rrf_k
        self.rrf_candidates = rrf_candidates
        self.exact_max = exact_max
        self.graph_threads = graph_threads
        self.loaded_from_disk = False
        self.store = ChunkStore(directory, dimension)
        self._lexical: LexicalIndex | None = None
        self._vectors = VectorSet.empty(dimension)
        self._graph: VectorGraph | None = None
        self._graph_build: threading.Thread | None = None
        self._generation = -1
        self._lexical_seen = -1
        self._refresh_lock = threading.Lock()
        self._write_lock = asyncio.Lock()
        self._threads = IndexThreads(f"the index at {directory}")

    @classmethod
    async def open(
        cls,
        directory: Path,
        *,
        embedder_name: str,
        dimension: int,
        rrf_k: int = DEFAULT_RRF_K,
        rrf_candidates: int = FUSION_CANDIDATES,
        exact_max: int = EXACT_MAX_CHUNKS,
        graph_threads: int = 1,
    ) -> EmbeddedHybridIndex:
        """Open (or create) the index in `directory`."""
        index = cls(
            directory,
            embedder_name=embedder_name,
            dimension=dimension,
            rrf_k=rrf_k,
            rrf_candidates=rrf_candidates,
            exact_max=exact_max,
            graph_threads=graph_threads,
        )
        single_threaded_blas()
        await asyncio.to_thread(index._open)
        return index

    @property
    def lexical(self) -> LexicalIndex:
        if self._lexical is None:
            raise IndexUnavailable(f"the index at {self.directory} is not open")
        return self._lexical

    # --- opening ----------------------------------------------------------------------------
    def _open(self) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            existed = self.path.exists()
            with writer_lock(self.directory):
                self.store.create(self.embedder_name)
                self.store.check_meta(self.embedder_name)
                self._lexical = LexicalIndex(self.directory)
                self._repair()
            self.loaded_from_disk = existed
            self._refresh()
        except (sqlite3.Error, OSError, ValueError) as exc:
            raise IndexUnavailable(
                f"cannot open the index at {self.directory}: {exc}; {REBUILD_HINT}"
            ) from exc

    def _repair(self) -> None:
        """Rebuild the lexical index when it is behind the store (a write died between)."""
        generations = self.store.generations()
        if generations.lexical != generations.store:
            log.warning(
                "lexical index at generation %d, store at %d: rebuilding it",
                generations.lexical,
                generations.store,
            )
            self.lexical.rebuild(self.store.texts())
            self.store.set_lexical_generation(generations.store)

    def _repair_if_abandoned(self, generations: Generations) -> Generations:
        """Repair a lexical index behind the store that no writer is working on.

        A writer commits the store, then the lexical index, holding the writer lock
        throughout: a lexical index found behind while the lock is free was left so by a
        writer that died between its two commits or whose BM25 commit failed, and would
        answer BM25 from the older version until the next write or open. The lock is only
        tried: held, a writer is at work and will commit the lexical index itself.
        """
        with writer_lock_if_free(self.directory) as free:
            if not free:
                return generations
            self._repair()
            return self.store.generations()

    # --- keeping up with the store ----------------------------------------------------------
    def _refresh(self) -> None:
        """Catch up with commits made since the last look (by this or another process)."""
        generations = self.store.generations()
        if generations.lexical != generations.store:
            generations = self._repair_if_abandoned(generations)
        if generations.store == self._generation and generations.lexical == self._lexical_seen:
            return
        with self._refresh_lock:
            if generations.store != self._generation:
                current = self._vectors
                delta = self.store.delta(self._generation, current.last_row)
                if self._generation < 0:
                    current = VectorSet.empty(self.dimension)
                if self._graph is not None:
                    self._graph.add(delta.added, delta.vectors)
                    self._graph.remove(delta.removed)
                self._vectors = current.apply(delta.added, delta.vectors, delta.removed)
                self._generation = delta.generation
                if self._vectors.live > self.exact_max and self._graph_build is None:
                    self._graph_build = threading.Thread(
                        target=self._build_graph,
                        args=(self._vectors,),
                        name="chatqna-vector-graph",
                        daemon=True,
                    )
                    self._graph_build.start()
            if generations.lexical != self._lexical_seen:
                self.lexical.reload()
                self._lexical_seen = generations.lexical

    def _build_graph(self, snapshot: VectorSet) -> None:
        """Build the HNSW graph over `snapshot`, then catch it up and publish it; should
        that fail, searches stay exact and the failure is logged."""
        try:
            self._build_and_publish_graph(snapshot)
        except Exception:
            log.exception("building the vector graph failed: dense search stays exact")

    def _build_and_publish_graph(self, snapshot: VectorSet) -> None:
        started = time.perf_counter()
        log.info(
            "%d chunks is past the exact-search size (%d): building the vector graph",
            snapshot.live,
            self.exact_max,
        )
        graph = VectorGraph.over(snapshot, threads=self.graph_threads)
        with self._refresh_lock:
            graph.catch_up(snapshot, self._vectors)
            self._graph = graph
        log.info(
            "vector graph ready: %d chunks in %.1f s, %.0f MiB",
            len(graph),
            time.perf_counter() - started,
            graph.memory_bytes / 2**20,
        )

    def describe_engine(self) -> str:
        """How the dense leg searches now."""
        return ("usearch HNSW" if self._graph else "int8 scan") + " (rescored exactly)"

    def wait_for_graph(self, timeout: float | None = None) -> bool:
        """Wait for a graph build in progress (benchmarks and tests); True once one is used."""
        if self._graph_build is not None:
            self._graph_build.join(timeout)
        return self._graph is not None

    # --- writes -----------------------------------------------------------------------------
    async def replace_sources(self, batches: Sequence[SourceBatch]) -> None:
        for batch in batches:
            if batch.embeddings.shape != (len(batch.chunks), self.dimension):
                raise ValueError(f"{batch.source}: embeddings do not match its chunks")
        if not batches:
            return
        async with self._write_lock:
            self._threads.check()
            await asyncio.to_thread(self._replace, batches)

    def _replace(self, batches: Sequence[SourceBatch]) -> None:
        with self._failures("write"), writer_lock(self.directory):
            self._repair()
            generation, documents = self.store.replace(batches)
            with self._after_commit("the BM25 commit"):
                self.lexical.write([b.source for b in batches], documents)
                self.store.set_lexical_generation(generation)
        with self._after_commit("catching up with the write"):
            self._refresh()

    async def delete_sources(self, sources: Sequence[str] | None) -> int:
        async with self._write_lock:
            self._threads.check()
            return await asyncio.to_thread(self._delete, sources)

    def _delete(self, sources: Sequence[str] | None) -> int:
        with self._failures("write"), writer_lock(self.directory):
            self._repair()
            removed, generation, deleted = self.store.delete(sources)
            if deleted:
                with self._after_commit("the BM25 commit"):
                    self.lexical.write(deleted, [])
                    self.store.set_lexical_generation(generation)
        with self._after_commit("catching up with the write"):
            self._refresh()
        return removed

    @contextmanager
    def _failures(self, action: str) -> Iterator[None]:
        try:
            yield
        except (sqlite3.Error, OSError, ValueError) as exc:
            raise IndexUnavailable(f"cannot {action} the index at {self.directory}: {exc}") from exc

    @contextmanager
    def _after_commit(self, step: str) -> Iterator[None]:
        """Log, not raise, a failure of `step` once the store (the store of record) has
        committed: the write has happened. The lexical index it leaves behind is rebuilt by
        `_refresh`, after the write or before the next search (which fails with 503 if it
        cannot). Any exception: tantivy picks its error types, and none undoes the commit."""
        try:
            yield
        except Exception:
            log.warning("%s failed after the store committed", step, exc_info=True)

    # --- reads ------------------------------------------------------------------------------
    async def search(self, query: SearchQuery) -> list[ScoredChunk]:
        return await self._threads.run(self.search_sync, query)

    def search_sync(
        self, query: SearchQuery, *, candidates: int | None = None
    ) -> list[ScoredChunk]:
        """`search` on the calling thread; `candidates` overrides `rrf_candidates` (the
        benchmark measures other depths with it)."""
        vector = np.asarray(query.embedding, dtype=np.float32).reshape(-1)
        if vector.shape[0] != self.dimension:
            raise IndexUnavailable(
                f"query vector has {vector.shape[0]} dimensions, the index {self.dimension}"
            )
        with self._failures("read"):
            self._refresh()
        vectors = self._vectors
        if not vectors.live:
            return []
        if not query.hybrid:
            positions, cosines = self._dense(vectors, vector, query.k)
            cosine = dict(zip(positions.tolist(), cosines.tolist(), strict=True))
            return self._results(vectors, cosine, list(cosine.items()))
        depth = max(query.k, self.rrf_candidates if candidates is None else candidates)
        positions, cosines = self._dense(vectors, vector, depth)
        cosine = dict(zip(positions.tolist(), cosines.tolist(), strict=True))
        lexical = WeightedQuery.parse(query.text, query.bm25_history, query.bm25_history_weight)
        rows, scores = self.lexical.top(lexical, depth)
        found = vectors.positions(rows)
        bm25 = {int(p): float(s) for p, s in zip(found, scores, strict=True) if p >= 0}
        fused = reciprocal_rank_fusion(
            [[str(p) for p in cosine], [str(p) for p in bm25]],
            k=self.rrf_k,
            weights=query.fusion_weights,
        )[: query.k]
        ranked = [(int(p), s) for p, s in fused]
        lexical_only = np.asarray([p for p, _ in ranked if p not in cosine], dtype=np.int64)
        lexical_cosines = vectors.similarity(vector, lexical_only).tolist()
        cosine.update(zip(lexical_only.tolist(), lexical_cosines, strict=True))
        return self._results(vectors, cosine, ranked, bm25)

    def _dense(
        self, vectors: VectorSet, vector: np.ndarray, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        graph = self._graph
        if graph is None:
            return vectors.search(vector, k)
        return vectors.rescore(vector, graph.search(vector, scan_candidates(k)), k)

    def _results(
        self,
        vectors: VectorSet,
        cosine: dict[int, float],
        ranked: list[tuple[int, float]],
        bm25: dict[int, float] | None = None,
    ) -> list[ScoredChunk]:
        chunks = self.store.chunks(int(vectors.rows[p]) for p, _ in ranked)
        results = []
        for position, score in ranked:
            chunk = chunks.get(int(vectors.rows[position]))
            if chunk is None:  # removed by another process since this search began
                continue
            scores = {"dense": cosine[position]}
            if bm25 is not None:
                scores["bm25"] = bm25.get(position, 0.0)
                scores["fusion"] = score
            embedding = vectors.matrix[position]
            results.append(ScoredChunk(chunk, score=score, scores=scores, embedding=embedding))
        return results

    async def list_sources(self) -> list[SourceInfo]:
        return await self._threads.run(self.store.sources)

    def content_hash(self, source: str) -> str | None:
        self._threads.check()
        return self.store.content_hash(source)

    async def describe(self) -> dict[str, Any]:
        await self._threads.run(self._refresh)
        return {
            "kind": "embedded",
            "engine": "sqlite + tantivy + " + self.describe_engine(),
            "exact_max_chunks": self.exact_max,
            "path": str(self.directory),
            "chunks": self._vectors.live,
            "sources": await self._threads.run(self.store.source_count),
            "dimension": self.dimension,
            "generation": self._generation,
            "loaded_from_disk": self.loaded_from_disk,
            "pid": os.getpid(),
        }

    async def aclose(self) -> None:
        """Refuse new work, let the running reads and a write in progress end, close the store."""
        await self._threads.close()
        async with self._write_lock:
            self.store.close()
