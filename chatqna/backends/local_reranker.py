"""Embedded reranker: rescoring candidates by embedding similarity to the query.

No cross-encoder ships inside a package we can install offline, so the embedded
similarity reranker rescores with the embedder itself: the cosine of the query vector and
each passage vector. It is named for what it is (`embedding-similarity`). Passage vectors
come from the index when it returned them (otherwise the chunk's indexed text is embedded,
as ingestion did); the query vector is the one the pipeline passes
(on a blended follow-up the blended vector, so the rescoring hears the conversation), and
only when none is passed is the query text embedded.

It is not the embedded default: its scores are the dense leg's own cosine, so it can only
undo what BM25 and the fusion added (see the Retrieval docs for the measurement). Turn it
on with `CHATQNA_EMBEDDED_RERANKER=similarity`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from chatqna.backends.protocols import Embedder
from chatqna.documents import ScoredChunk


class EmbeddingSimilarityReranker:
    """Reranks by cosine similarity between the query and passage embeddings."""

    name = "embedding-similarity"

    def __init__(self, embedder: Embedder) -> None:
        self._embedder = embedder
        self.calls = 0

    async def rerank(
        self,
        query: str,
        candidates: Sequence[ScoredChunk],
        top_n: int,
        vector: np.ndarray | None = None,
    ) -> list[ScoredChunk]:
        if not candidates:
            return []
        missing = [i for i, c in enumerate(candidates) if c.embedding is None]
        passages = [candidates[i].chunk.indexed_text for i in missing]
        texts = ([query] if vector is None else []) + passages
        vectors = await self._embedder.embed(texts) if texts else np.zeros((0, 0), np.float32)
        self.calls += 1
        query_vector = np.asarray(vector if vector is not None else vectors[0], np.float32)
        fresh = iter(vectors[0 if vector is not None else 1 :])
        passage_vectors: list[np.ndarray] = []
        for candidate in candidates:
            stored = candidate.embedding
            passage_vectors.append(stored if stored is not None else next(fresh))
        scores = np.vstack(passage_vectors) @ query_vector.reshape(-1)
        rescored = [
            candidate.with_score("rerank", float(score))
            for candidate, score in zip(candidates, scores, strict=True)
        ]
        rescored.sort(key=lambda item: item.score, reverse=True)
        return rescored[:top_n]

    async def describe(self) -> dict[str, Any]:
        return {"kind": "embedded", "method": self.name, "calls": self.calls}

    async def aclose(self) -> None:
        return None
