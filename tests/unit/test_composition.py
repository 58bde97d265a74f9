"""`build_backends`: which implementation it picks per role (the reranker's choices here),
and that a start-up failing part-way closes every backend it already built."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import respx

from chatqna import composition
from chatqna.backends.fakes import HashingEmbedder
from chatqna.backends.local_reranker import EmbeddingSimilarityReranker
from chatqna.backends.tei import TEIEmbedder, TEIReranker
from chatqna.composition import build_reranker
from chatqna.errors import BadUpstreamResponse
from chatqna.settings import Settings

pytestmark = pytest.mark.anyio


async def test_the_embedded_default_keeps_the_fused_order() -> None:
    settings = Settings()
    assert settings.rerank_skip_reason == "embedded_default"
    assert build_reranker(settings, HashingEmbedder()) is None


async def test_similarity_rescoring_is_opt_in() -> None:
    settings = Settings(chatqna_embedded_reranker="similarity")
    assert settings.rerank_skip_reason is None
    assert isinstance(build_reranker(settings, HashingEmbedder()), EmbeddingSimilarityReranker)


async def test_a_tei_endpoint_reranks_and_rerank_enabled_false_turns_every_reranker_off() -> None:
    settings = Settings(tei_reranking_endpoint="http://127.0.0.1:9")
    reranker = build_reranker(settings, HashingEmbedder())
    assert isinstance(reranker, TEIReranker)
    await reranker.aclose()
    for extra in ({}, {"chatqna_embedded_reranker": "similarity"}):
        off = Settings(tei_reranking_endpoint="http://127.0.0.1:9", rerank_enabled=False, **extra)  # type: ignore[arg-type]
        assert off.rerank_skip_reason == "disabled"
        assert build_reranker(off, HashingEmbedder()) is None


class Closable:
    """A stand-in backend that records when it is closed."""

    def __init__(self, role: str, closed: list[str]) -> None:
        self.role = role
        self.name = role
        self.model = role
        self._closed = closed

    async def aclose(self) -> None:
        self._closed.append(self.role)


@pytest.fixture
def closed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every role builds a `Closable`; the returned list is the order they were closed in."""
    order: list[str] = []

    async def embedder(settings: Settings) -> Closable:
        return Closable("embedder", order)

    async def retriever(settings: Settings, embedder: Any) -> Closable:
        return Closable("retriever", order)

    def reranker(settings: Settings, embedder: Any) -> Closable:
        return Closable("reranker", order)

    monkeypatch.setattr(composition, "build_embedder", embedder)
    monkeypatch.setattr(composition, "build_retriever", retriever)
    monkeypatch.setattr(composition, "build_reranker", reranker)
    return order


async def test_a_failing_llm_closes_the_reranker_retriever_and_embedder(
    closed: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken_llm(settings: Settings) -> Any:
        raise FileNotFoundError("no such GGUF")

    monkeypatch.setattr(composition, "build_llm", broken_llm)
    with pytest.raises(FileNotFoundError, match="no such GGUF"):
        await composition.build_backends(Settings())
    assert closed == ["reranker", "retriever", "embedder"]


async def test_a_failing_condense_llm_also_closes_the_llm(
    closed: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def llm(settings: Settings) -> Closable:
        return Closable("llm", closed)

    def broken_condense(settings: Settings, llm: Any) -> Any:
        raise ValueError("bad condense endpoint")

    monkeypatch.setattr(composition, "build_llm", llm)
    monkeypatch.setattr(composition, "build_condense_llm", broken_condense)
    with pytest.raises(ValueError, match="bad condense endpoint"):
        await composition.build_backends(Settings())
    assert closed == ["llm", "reranker", "retriever", "embedder"]


async def test_a_failing_retriever_closes_the_embedder(
    closed: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken_retriever(settings: Settings, embedder: Any) -> Any:
        raise ConnectionError("redis is down")

    monkeypatch.setattr(composition, "build_retriever", broken_retriever)
    with pytest.raises(ConnectionError):
        await composition.build_backends(Settings())
    assert closed == ["embedder"]


async def test_without_a_reranker_the_clean_up_skips_it(
    closed: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken_llm(settings: Settings) -> Any:
        raise RuntimeError("llm failed")

    monkeypatch.setattr(composition, "build_reranker", lambda settings, embedder: None)
    monkeypatch.setattr(composition, "build_llm", broken_llm)
    with pytest.raises(RuntimeError):
        await composition.build_backends(Settings())
    assert closed == ["retriever", "embedder"]


async def test_a_tei_embedder_is_held_to_the_width_of_the_embedded_index(
    tmp_path: Path,
) -> None:
    settings = Settings(tei_embedding_endpoint="http://tei.test", chatqna_data_dir=tmp_path)
    embedder = await composition.build_embedder(settings)
    assert isinstance(embedder, TEIEmbedder)
    with respx.mock(using="httpx") as router:
        route = router.post("http://tei.test/v1/embeddings")
        route.respond(json={"data": [{"index": 0, "embedding": [0.6, 0.8]}]})
        index = await composition.build_retriever(settings, embedder)
        try:
            assert embedder.dimension == 2
            route.respond(json={"data": [{"index": 0, "embedding": [1.0, 0.0, 0.0]}]})
            with pytest.raises(BadUpstreamResponse, match="dimension 3, expected 2"):
                await embedder.embed(["a query"])
        finally:
            await index.aclose()
            await embedder.aclose()


async def test_with_a_retriever_service_the_embedder_width_is_left_open() -> None:
    settings = Settings(
        tei_embedding_endpoint="http://tei.test", retriever_endpoint="http://retriever.test"
    )
    embedder = await composition.build_embedder(settings)
    retriever = await composition.build_retriever(settings, embedder)
    try:
        assert isinstance(embedder, TEIEmbedder) and embedder.dimension is None
    finally:
        await retriever.aclose()
        await embedder.aclose()
