"""The embedded retriever: exact dense search on numpy + BM25 + RRF, persisted to one file.

A hybrid search fuses the best `max(k, rrf_candidates)` passages of each leg by weighted
reciprocal rank fusion and keeps the best `k`. Its BM25 is RediSearch's `BM25STD`, computed
the same way (`chatqna.retrieval.bm25`), so a Redis index over the same passages ranks
identically.

The whole index (chunk texts and metadata, per-source content hashes, the embedding matrix,
and the embedder's name) lives in `<data dir>/index/index.npz`. Every change builds a new
state off the event loop, writes it to a temporary file, fsyncs it and renames it over the
old one, and only then swaps it in memory: a crash or a failed write leaves the previous
index intact, and a restart reopens it without embedding anything again.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from chatqna.backends.protocols import SearchQuery, SourceBatch, SourceInfo
from chatqna.documents import Chunk, ScoredChunk
from chatqna.errors import IndexUnavailable
from chatqna.retrieval.bm25 import BM25Index, WeightedQuery
from chatqna.retrieval.fusion import DEFAULT_RRF_K, FUSION_CANDIDATES, reciprocal_rank_fusion

INDEX_FILE = "index.npz"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class _State:
    """One immutable version of the index; searches read it without locks."""

    chunks: tuple[Chunk, ...]
    matrix: np.ndarray
    hashes: dict[str, str]
    bm25: BM25Index

    @classmethod
    def build(cls, chunks: Sequence[Chunk], matrix: np.ndarray, hashes: dict[str, str]) -> _State:
        bm25 = BM25Index([c.text for c in chunks], keys=[c.id for c in chunks])
        return cls(tuple(chunks), matrix, dict(hashes), bm25)


class InMemoryHybridIndex:
    """Exact cosine search plus BM25, fused with reciprocal rank fusion; one file on disk."""

    supports_bm25_history = True

    def __init__(
        self,
        directory: Path,
        *,
        embedder_name: str,
        dimension: int,
        rrf_k: int = DEFAULT_RRF_K,
        rrf_candidates: int = FUSION_CANDIDATES,
    ) -> None:
        if rrf_k < 1 or rrf_candidates < 1:
            raise ValueError("rrf_k and rrf_candidates must be at least 1")
        self.directory = directory
        self.path = directory / INDEX_FILE
        self.embedder_name = embedder_name
        self.dimension = dimension
        self.rrf_k = rrf_k
        self.rrf_candidates = rrf_candidates
        self.loaded_from_disk = False
        self._state = _State.build([], np.zeros((0, dimension), dtype=np.float32), {})
        self._write_lock = asyncio.Lock()

    @classmethod
    async def open(
        cls,
        directory: Path,
        *,
        embedder_name: str,
        dimension: int,
        rrf_k: int = DEFAULT_RRF_K,
        rrf_candidates: int = FUSION_CANDIDATES,
    ) -> InMemoryHybridIndex:
        """Open the index in `directory`, loading it when a file exists there."""
        index = cls(
            directory,
            embedder_name=embedder_name,
            dimension=dimension,
            rrf_k=rrf_k,
            rrf_candidates=rrf_candidates,
        )
        if index.path.exists():
            index._state = await asyncio.to_thread(index._load)
            index.loaded_from_disk = True
        return index

    # --- persistence ----------------------------------------------------------------------
    def _load(self) -> _State:
        try:
            with np.load(self.path, allow_pickle=False) as archive:
                meta = json.loads(archive["meta"].tobytes().decode("utf-8"))
                matrix = np.asarray(archive["embeddings"], dtype=np.float32)
            chunks = [Chunk(**item) for item in meta["chunks"]]
            hashes = dict(meta.get("hashes", {}))
            version, embedder = meta.get("format"), meta.get("embedder")
            width = matrix.shape[1] if matrix.ndim == 2 else -1
        except Exception as exc:
            # A damaged file fails in many ways (zip, JSON, shapes, fields); all mean the same.
            raise IndexUnavailable(f"cannot read the index at {self.path}: {exc!r}") from exc
        if version != FORMAT_VERSION:
            raise IndexUnavailable(f"{self.path}: unknown index format {version!r}")
        if embedder != self.embedder_name or width != self.dimension:
            raise IndexUnavailable(
                f"the index at {self.path} was built with embedder {embedder!r} "
                f"({width} dimensions); the configured embedder is "
                f"{self.embedder_name!r} ({self.dimension}). Re-ingest into a new "
                "CHATQNA_DATA_DIR or switch the embedder back."
            )
        if len(chunks) != matrix.shape[0]:
            raise IndexUnavailable(f"{self.path}: chunk count does not match the embeddings")
        return _State.build(chunks, matrix, hashes)

    def _persist(self, state: _State) -> None:
        meta = {
            "format": FORMAT_VERSION,
            "embedder": self.embedder_name,
            "chunks": [
                {"id": c.id, "text": c.text, "source": c.source, "title": c.title, "index": c.index}
                for c in state.chunks
            ],
            "hashes": state.hashes,
        }
        buffer = io.BytesIO()
        np.savez(
            buffer,
            embeddings=state.matrix,
            meta=np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8),
        )
        self.directory.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=self.directory, prefix=".index-", suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as stream:
                stream.write(buffer.getvalue())
                stream.flush()
                os.fsync(stream.fileno())
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        directory_fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(directory_fd)
        finally:
            os.close(directory_fd)

    async def _commit(self, state: _State) -> None:
        try:
            await asyncio.to_thread(self._persist, state)
        except OSError as exc:
            raise IndexUnavailable(f"cannot write the index at {self.path}: {exc}") from exc
        self._state = state

    # --- writes -----------------------------------------------------------------------------
    async def replace_sources(self, batches: Sequence[SourceBatch]) -> None:
        for batch in batches:
            if batch.embeddings.shape != (len(batch.chunks), self.dimension):
                raise ValueError(f"{batch.source}: embeddings do not match its chunks")
        async with self._write_lock:
            state = self._state
            replaced = {batch.source for batch in batches}
            keep = [i for i, c in enumerate(state.chunks) if c.source not in replaced]
            chunks = [state.chunks[i] for i in keep]
            parts = [state.matrix[keep]]
            hashes = {s: h for s, h in state.hashes.items() if s not in replaced}
            for batch in batches:
                chunks.extend(batch.chunks)
                parts.append(batch.embeddings.astype(np.float32))
                hashes[batch.source] = batch.content_hash
            matrix = np.vstack(parts) if parts else state.matrix
            new_state = await asyncio.to_thread(_State.build, chunks, matrix, hashes)
            await self._commit(new_state)

    async def delete_sources(self, sources: Sequence[str] | None) -> int:
        async with self._write_lock:
            state = self._state
            doomed = set(state.hashes) if sources is None else set(sources)
            keep = [i for i, c in enumerate(state.chunks) if c.source not in doomed]
            removed = len(state.chunks) - len(keep)
            if removed == 0 and not doomed & set(state.hashes):
                return 0
            hashes = {s: h for s, h in state.hashes.items() if s not in doomed}
            new_state = await asyncio.to_thread(
                _State.build, [state.chunks[i] for i in keep], state.matrix[keep], hashes
            )
            await self._commit(new_state)
            return removed

    # --- reads ------------------------------------------------------------------------------
    async def search(self, query: SearchQuery) -> list[ScoredChunk]:
        return await asyncio.to_thread(self.search_sync, query)

    def search_sync(
        self, query: SearchQuery, *, candidates: int | None = None
    ) -> list[ScoredChunk]:
        """`search` on the calling thread; `candidates` overrides `rrf_candidates` (the
        benchmark measures other depths with it)."""
        state = self._state
        if not state.chunks:
            return []
        vector = np.asarray(query.embedding, dtype=np.float32).reshape(-1)
        if vector.shape[0] != self.dimension:
            raise IndexUnavailable(
                f"query vector has {vector.shape[0]} dimensions, the index {self.dimension}"
            )
        cosine = state.matrix @ vector
        if not query.hybrid:
            dense_ids = [int(i) for i in np.argsort(-cosine, kind="stable")[: query.k]]
            return [
                self._scored(state, i, cosine, None, float(cosine[i]), "dense") for i in dense_ids
            ]
        depth = max(query.k, self.rrf_candidates if candidates is None else candidates)
        dense_ids = [int(i) for i in np.argsort(-cosine, kind="stable")[:depth]]
        lexical = WeightedQuery.parse(query.text, query.bm25_history, query.bm25_history_weight)
        bm25_hits = dict(state.bm25.top(lexical, depth))
        fused = reciprocal_rank_fusion(
            [[str(i) for i in dense_ids], [str(i) for i in bm25_hits]],
            k=self.rrf_k,
            weights=query.fusion_weights,
        )[: query.k]
        return [
            self._scored(state, int(key), cosine, bm25_hits, score, "fusion")
            for key, score in fused
        ]

    @staticmethod
    def _scored(
        state: _State,
        row: int,
        cosine: np.ndarray,
        bm25_hits: dict[int, float] | None,
        score: float,
        stage: str,
    ) -> ScoredChunk:
        scores = {"dense": float(cosine[row])}
        if bm25_hits is not None:
            scores["bm25"] = float(bm25_hits.get(row, 0.0))
            scores["fusion"] = score
        return ScoredChunk(
            state.chunks[row], score=score, scores=scores, embedding=state.matrix[row]
        )

    async def list_sources(self) -> list[SourceInfo]:
        state = self._state
        counts: dict[str, int] = {}
        for chunk in state.chunks:
            counts[chunk.source] = counts.get(chunk.source, 0) + 1
        return [
            SourceInfo(source=s, chunks=counts.get(s, 0), content_hash=h)
            for s, h in sorted(state.hashes.items())
        ]

    def content_hash(self, source: str) -> str | None:
        return self._state.hashes.get(source)

    async def describe(self) -> dict[str, Any]:
        state = self._state
        return {
            "kind": "embedded",
            "path": str(self.path),
            "chunks": len(state.chunks),
            "sources": len(state.hashes),
            "dimension": self.dimension,
            "loaded_from_disk": self.loaded_from_disk,
        }

    async def aclose(self) -> None:
        return None
