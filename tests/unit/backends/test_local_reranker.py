"""The embedding-similarity reranker: cosine of the query vector and each passage vector."""

from __future__ import annotations

import numpy as np
import pytest

from chatqna.backends.fakes import HashingEmbedder
from chatqna.backends.local_reranker import EmbeddingSimilarityReranker
from chatqna.documents import Chunk, ScoredChunk

pytestmark = pytest.mark.anyio

PASSAGES = ["refunds take ten business days", "export your workspace", "single sign-on plans"]


async def candidates(embedder: HashingEmbedder, stored: bool) -> list[ScoredChunk]:
    vectors = await embedder.embed(PASSAGES)
    return [
        ScoredChunk(
            Chunk(id=f"c{i}", text=text, source=f"{i}.md"),
            1.0 / (i + 1),
            {"fusion": 1.0 / (i + 1)},
            vectors[i] if stored else None,
        )
        for i, text in enumerate(PASSAGES)
    ]


async def test_a_given_vector_is_scored_and_the_query_text_is_not_embedded() -> None:
    embedder = HashingEmbedder()
    pool = await candidates(embedder, stored=True)
    embedder.batches.clear()
    # A vector pointing at the sign-on passage wins whatever the query text says.
    target = (await HashingEmbedder().embed([PASSAGES[2]]))[0]
    kept = await EmbeddingSimilarityReranker(embedder).rerank("refunds", pool, 2, vector=target)
    assert [item.chunk.id for item in kept] == ["c2", kept[1].chunk.id]
    assert kept[0].scores["rerank"] == pytest.approx(1.0, abs=1e-5)
    assert embedder.batches == [], "stored passages and a given vector need no embedding call"


async def test_without_a_vector_the_query_is_embedded_with_missing_passages() -> None:
    embedder = HashingEmbedder()
    pool = await candidates(embedder, stored=False)
    embedder.batches.clear()
    kept = await EmbeddingSimilarityReranker(embedder).rerank(PASSAGES[0], pool, 3)
    assert embedder.batches == [[PASSAGES[0], *PASSAGES]], "one batched call"
    assert kept[0].chunk.id == "c0"
    scores = [item.scores["rerank"] for item in kept]
    assert scores == sorted(scores, reverse=True)
    expected = (await HashingEmbedder().embed(PASSAGES)) @ (
        await HashingEmbedder().embed([PASSAGES[0]])
    )[0]
    assert scores == pytest.approx(sorted(expected.tolist(), reverse=True), abs=1e-5)
    assert np.isclose(kept[0].score, kept[0].scores["rerank"])
    assert await EmbeddingSimilarityReranker(embedder).rerank("q", [], 3) == []
