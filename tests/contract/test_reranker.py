"""The `Reranker` contract, over the embedded embedding-similarity reranker (on the hashing
embedder, and on MiniLM: slow), TEI's `/rerank`, and the recording stand-in the unit tests
rerank with."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx2
import pytest

from chatqna.backends.fakes import HashingEmbedder, RecordingReranker
from chatqna.backends.local_reranker import EmbeddingSimilarityReranker
from chatqna.backends.protocols import Reranker
from chatqna.backends.tei import TEIReranker
from chatqna.documents import Chunk, ScoredChunk
from tests.contract import wire

pytestmark = pytest.mark.anyio

QUERY = "how long do refunds for annual plans take"
PASSAGES = [
    "Two-factor authentication uses an authenticator app.",
    "Refunds for annual plans take five to ten business days.",
    "Invoices are emailed to the billing contact every month.",
    "Exports are Markdown files in a zip archive.",
]
RELEVANT = 1


def candidates() -> list[ScoredChunk]:
    return [
        ScoredChunk(
            chunk=Chunk(id=f"c{i}", text=text, source="handbook.md", index=i),
            score=1.0 / (i + 1),
            scores={"fusion": 1.0 / (i + 1)},
        )
        for i, text in enumerate(PASSAGES)
    ]


@pytest.fixture(
    scope="module",
    params=["tei", "local-hashing", "fake", pytest.param("local-minilm", marks=pytest.mark.slow)],
)
async def reranker(request: pytest.FixtureRequest, anyio_backend: str) -> AsyncIterator[Reranker]:
    built: Reranker
    if request.param == "tei":
        built = TEIReranker("http://tei.test", transport=httpx2.MockTransport(wire.tei))
    elif request.param == "local-hashing":
        built = EmbeddingSimilarityReranker(HashingEmbedder(wire.DIMENSION))
    elif request.param == "fake":
        built = RecordingReranker()
    else:
        from chatqna.backends.local_embedder import OnnxMiniLMEmbedder

        built = EmbeddingSimilarityReranker(OnnxMiniLMEmbedder())
    yield built
    await built.aclose()


def test_it_is_a_reranker(reranker: Reranker) -> None:
    assert isinstance(reranker, Reranker) and reranker.name


async def test_the_relevant_passage_comes_first(reranker: Reranker) -> None:
    kept = await reranker.rerank(QUERY, candidates(), top_n=2)
    assert kept[0].chunk.text == PASSAGES[RELEVANT]


async def test_at_most_top_n_of_the_given_candidates_best_first(reranker: Reranker) -> None:
    given = candidates()
    kept = await reranker.rerank(QUERY, given, top_n=3)
    assert len(kept) == 3
    assert {c.chunk.id for c in kept} <= {c.chunk.id for c in given}
    assert len({c.chunk.id for c in kept}) == 3
    assert [c.score for c in kept] == sorted((c.score for c in kept), reverse=True)


async def test_the_score_is_recorded_as_rerank_beside_earlier_stages(reranker: Reranker) -> None:
    kept = await reranker.rerank(QUERY, candidates(), top_n=4)
    fusion = {c.chunk.id: c.scores["fusion"] for c in candidates()}
    for item in kept:
        assert item.scores["rerank"] == item.score
        assert item.scores["fusion"] == fusion[item.chunk.id]


async def test_a_top_n_beyond_the_candidates_keeps_them_all(reranker: Reranker) -> None:
    kept = await reranker.rerank(QUERY, candidates(), top_n=10)
    assert sorted(c.chunk.id for c in kept) == sorted(c.chunk.id for c in candidates())


async def test_no_candidates_give_none(reranker: Reranker) -> None:
    assert await reranker.rerank(QUERY, [], top_n=3) == []


DESCRIBED: dict[type, dict[str, str]] = {
    TEIReranker: {"kind": "tei", "endpoint": "http://tei.test"},
    EmbeddingSimilarityReranker: {"kind": "embedded", "method": "embedding-similarity"},
    RecordingReranker: {"kind": "fake"},
}


async def test_describe_says_what_kind_it_is(reranker: Reranker) -> None:
    described = await reranker.describe()
    expected = DESCRIBED[type(reranker)]
    assert {key: described.get(key) for key in expected} == expected
    assert isinstance(described["calls"], int)
