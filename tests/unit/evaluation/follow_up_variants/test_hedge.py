"""Hedged retrieval: the hybrid search with more dense legs fused in by the same RRF."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from chatqna.backends.fakes import HashingEmbedder
from chatqna.backends.protocols import SearchQuery, SourceBatch
from chatqna.documents import Chunk
from chatqna.evaluation.follow_up_variants.hedge import bm25_leg, hedged_search
from chatqna.retrieval.embedded.index import EmbeddedHybridIndex

pytestmark = pytest.mark.anyio

WORDS = "export zip plan refund cancel data kept days invoice seat admin owner sso".split()


async def corpus_index(tmp_path: Path, embedder: HashingEmbedder) -> EmbeddedHybridIndex:
    rng = random.Random(7)
    texts = [" ".join(rng.choices(WORDS, k=rng.randint(2, 6))) for _ in range(40)]
    chunks = [Chunk(id=f"p{i}", text=t, source="s", index=i) for i, t in enumerate(texts)]
    index = await EmbeddedHybridIndex.open(
        tmp_path / "index", embedder_name=embedder.name, dimension=embedder.dimension
    )
    await index.replace_sources([SourceBatch("s", chunks, await embedder.embed(texts))])
    return index


@pytest.mark.parametrize("text", ["refund after cancel", "sso owner", "days kept data export"])
async def test_without_hedging_legs_it_ranks_as_the_index_does(tmp_path: Path, text: str) -> None:
    embedder = HashingEmbedder()
    index = await corpus_index(tmp_path, embedder)
    vector = (await embedder.embed(["admin seat invoice"]))[0]
    query = SearchQuery(
        text,
        vector,
        10,
        True,
        fusion_weights=(1.0, 0.2),
        bm25_history="plan",
        bm25_history_weight=0.3,
    )
    expected = index.search_sync(query, candidates=8)
    hedged = hedged_search(index, query, (), 8)
    assert [h.chunk.id for h in hedged] == [h.chunk.id for h in expected]
    assert [h.score for h in hedged] == pytest.approx([h.score for h in expected])
    lexical = bm25_leg(index, query, 8)
    assert 0 < len(lexical) <= 8 and all(h.scores["bm25"] > 0 for h in lexical)
    await index.aclose()


async def test_a_hedging_leg_adds_its_own_hits_at_its_weight(tmp_path: Path) -> None:
    embedder = HashingEmbedder()
    index = await corpus_index(tmp_path, embedder)
    blended, own = await embedder.embed(["admin seat invoice", "refund cancel"])
    query = SearchQuery("zzz", blended, 5, True, fusion_weights=(1.0, 0.2))
    plain = [h.chunk.id for h in hedged_search(index, query, (), 5)]
    own_hits = [h.chunk.id for h in index.search_sync(SearchQuery("", own, 5, hybrid=False))]
    assert not set(own_hits[:1]) & set(plain)
    strong = [h.chunk.id for h in hedged_search(index, query, [(own, 2.0)], 5)]
    assert strong[0] == own_hits[0]
    faint = [h.chunk.id for h in hedged_search(index, query, [(own, 1e-6)], 5)]
    assert faint == plain
    await index.aclose()
