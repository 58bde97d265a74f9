"""The embedding-similarity reranker: cosine of the query vector (given, or the query text
embedded) and each passage vector, reusing the passage vectors the index returned."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from chatqna.backends.fakes import HashingEmbedder
from chatqna.backends.local_reranker import EmbeddingSimilarityReranker
from chatqna.backends.protocols import Reranker
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


async def test_a_passage_without_a_stored_vector_is_embedded_as_the_index_embeds_it() -> None:
    embedder = HashingEmbedder()
    chunk = Chunk(id="c0", text="Keys rotate every ninety days.", source="s.md", title="Security")
    pool = [ScoredChunk(chunk, 1.0, {"fusion": 1.0})]
    await EmbeddingSimilarityReranker(embedder).rerank("security", pool, 1)
    assert embedder.batches == [["security", "Security\nKeys rotate every ninety days."]]


# Unit vectors at known angles to the query [1, 0]: cosines 1.0, 0.8, 0.6, 0.0.
VECTORS = {
    "query": [1.0, 0.0],
    "same": [1.0, 0.0],
    "close": [0.8, 0.6],
    "far": [0.6, 0.8],
    "orthogonal": [0.0, 1.0],
}


class TableEmbedder:
    """Looks each text up in `VECTORS`; records every batch it was asked for."""

    name = "table"
    max_batch = 32

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.batches.append(list(texts))
        return np.array([VECTORS[text] for text in texts], dtype=np.float32)

    async def describe(self) -> dict[str, Any]:
        return {"kind": "fake"}

    async def aclose(self) -> None:
        return None


def candidate(text: str, *, stored: bool = False) -> ScoredChunk:
    vector = np.array(VECTORS[text], dtype=np.float32) if stored else None
    return ScoredChunk(
        chunk=Chunk(id=text, text=text, source="s.md", index=0),
        score=0.5,
        scores={"fusion": 0.5},
        embedding=vector,
    )


@pytest.fixture
def embedder() -> TableEmbedder:
    return TableEmbedder()


@pytest.fixture
def reranker(embedder: TableEmbedder) -> EmbeddingSimilarityReranker:
    return EmbeddingSimilarityReranker(embedder)


def test_it_is_a_reranker_named_for_its_method(reranker: EmbeddingSimilarityReranker) -> None:
    assert isinstance(reranker, Reranker)
    assert reranker.name == "embedding-similarity"


async def test_candidates_are_ordered_by_cosine_and_cut_to_top_n(
    reranker: EmbeddingSimilarityReranker,
) -> None:
    given = [candidate(t) for t in ("orthogonal", "far", "same", "close")]
    kept = await reranker.rerank("query", given, top_n=3)
    assert [c.chunk.text for c in kept] == ["same", "close", "far"]
    assert [c.score for c in kept] == pytest.approx([1.0, 0.8, 0.6])
    assert [c.scores["rerank"] for c in kept] == pytest.approx([1.0, 0.8, 0.6])
    assert all(c.scores["fusion"] == 0.5 for c in kept)  # earlier stages' scores stay


async def test_one_embedding_call_holds_the_query_and_only_the_passages_without_vectors(
    reranker: EmbeddingSimilarityReranker, embedder: TableEmbedder
) -> None:
    given = [candidate("close", stored=True), candidate("far"), candidate("same", stored=True)]
    kept = await reranker.rerank("query", given, top_n=3)
    assert embedder.batches == [["query", "far"]]
    assert [c.chunk.text for c in kept] == ["same", "close", "far"]


async def test_stored_vectors_are_used_as_they_are(
    reranker: EmbeddingSimilarityReranker, embedder: TableEmbedder
) -> None:
    # A stored vector that disagrees with what the embedder would say decides the score.
    stale = candidate("orthogonal")
    stale = ScoredChunk(stale.chunk, stale.score, stale.scores, np.array([1.0, 0.0], np.float32))
    kept = await reranker.rerank("query", [candidate("close"), stale], top_n=2)
    assert [c.chunk.text for c in kept] == ["orthogonal", "close"]


async def test_no_candidates_embed_nothing(
    reranker: EmbeddingSimilarityReranker, embedder: TableEmbedder
) -> None:
    assert await reranker.rerank("query", [], top_n=3) == []
    assert embedder.batches == []


async def test_describe_counts_the_calls(reranker: EmbeddingSimilarityReranker) -> None:
    await reranker.rerank("query", [candidate("far")], top_n=1)
    await reranker.rerank("query", [candidate("same")], top_n=1)
    details = await reranker.describe()
    assert details == {"kind": "embedded", "method": "embedding-similarity", "calls": 2}


async def test_a_given_vector_embeds_only_the_passages_without_one(
    reranker: EmbeddingSimilarityReranker, embedder: TableEmbedder
) -> None:
    given = [candidate("close", stored=True), candidate("far")]
    vector = np.array(VECTORS["query"], dtype=np.float32)
    kept = await reranker.rerank("ignored text", given, top_n=2, vector=vector)
    assert embedder.batches == [["far"]]
    assert [c.chunk.text for c in kept] == ["close", "far"]
