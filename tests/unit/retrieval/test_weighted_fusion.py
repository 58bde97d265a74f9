"""Per-leg RRF weights in the embedded index."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatqna.backends.fakes import HashingEmbedder
from chatqna.backends.protocols import SearchQuery
from chatqna.retrieval.dataprep import IngestFile, ingest_files
from chatqna.retrieval.memory_store import InMemoryHybridIndex

pytestmark = pytest.mark.anyio

DOCS = {
    "a.md": "# A\n\n## A\nzebra zebra zebra migration across the plains",
    "b.md": "# B\n\n## B\nlions hunt at dusk on the savannah plains",
    "c.md": "# C\n\n## C\nwildlife photography tips for the savannah",
}


async def _index(tmp_path: Path) -> tuple[InMemoryHybridIndex, HashingEmbedder]:
    embedder = HashingEmbedder()
    index = await InMemoryHybridIndex.open(tmp_path, embedder_name=embedder.name, dimension=64)
    await ingest_files([IngestFile(k, v.encode()) for k, v in DOCS.items()], embedder, index)
    return index, embedder


async def test_bm25_weight_zero_gives_the_dense_order(tmp_path: Path) -> None:
    index, embedder = await _index(tmp_path)
    vector = (await embedder.embed(["lions savannah dusk"]))[0]
    dense = await index.search(SearchQuery("zebra", vector, 3, hybrid=False))
    fused = await index.search(SearchQuery("zebra", vector, 3, fusion_weights=(1.0, 0.0)))
    assert [h.chunk.source for h in fused] == [h.chunk.source for h in dense]


async def test_fusion_scores_are_the_weighted_reciprocal_ranks(tmp_path: Path) -> None:
    index, embedder = await _index(tmp_path)
    vector = (await embedder.embed(["lions savannah dusk"]))[0]
    dense = [h.chunk.source for h in await index.search(SearchQuery("x", vector, 3, False))]
    for weights in ((1.0, 1.0), (1.0, 0.2), (0.2, 1.0)):
        hits = await index.search(SearchQuery("zebra", vector, 3, fusion_weights=weights))
        for hit in hits:
            # "zebra" occurs in a.md only: BM25 rank 1 there, no BM25 rank elsewhere.
            expected = weights[0] / (60 + dense.index(hit.chunk.source) + 1)
            if hit.chunk.source == "a.md":
                expected += weights[1] / 61
            assert hit.scores["fusion"] == pytest.approx(expected), (weights, hit.chunk.source)
        ranked = sorted(hits, key=lambda h: -h.scores["fusion"])
        assert [h.chunk.id for h in hits] == [h.chunk.id for h in ranked]
