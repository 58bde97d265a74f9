"""Which implementation `build_backends` picks per role (the reranker's choices here)."""

from __future__ import annotations

import pytest

from chatqna.backends.factory import build_reranker
from chatqna.backends.fakes import HashingEmbedder
from chatqna.backends.local_reranker import EmbeddingSimilarityReranker
from chatqna.backends.tei import TEIReranker
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
