"""Retrieval as the pipeline asks for it: fused depth, and the BM25 leg's earlier questions."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatqna.backends.fakes import HashingEmbedder
from chatqna.backends.protocols import SearchQuery
from chatqna.ingest.dataprep import IngestFile, ingest_files
from chatqna.multiturn.blend import BM25_HISTORY_QUESTIONS, earlier_questions
from chatqna.multiturn.history import Conversation
from chatqna.retrieval.embedded.index import EmbeddedHybridIndex
from tests.unit.multiturn.test_strategy import chat

pytestmark = pytest.mark.anyio


def test_earlier_questions_keep_the_most_recent_and_skip_blank_ones() -> None:
    questions = [f"question {i}" for i in range(12)]
    conversation = Conversation("now?", chat(*questions[:5], "   ", *questions[5:]))
    kept = earlier_questions(conversation)
    assert len(kept) == BM25_HISTORY_QUESTIONS
    assert kept == tuple(questions[-BM25_HISTORY_QUESTIONS:])
    assert earlier_questions(conversation, 2) == ("question 10", "question 11")
    assert earlier_questions(conversation, 0) == ()
    assert earlier_questions(Conversation("first", ())) == ()


async def test_hybrid_fuses_deeper_legs_and_keeps_k(tmp_path: Path) -> None:
    embedder = HashingEmbedder()
    index = await EmbeddedHybridIndex.open(
        tmp_path, embedder_name=embedder.name, dimension=64, rrf_candidates=6
    )
    files = [
        IngestFile(f"doc{i}.md", f"# D{i}\n\nrefund topic {i} plans {'refund ' * (i % 3)}".encode())
        for i in range(8)
    ]
    await ingest_files(files, embedder, index)
    vector = (await embedder.embed(["refund plans"]))[0]
    hits = await index.search(SearchQuery("refund plans", vector, 3))
    # The best 3 of the fusion of each leg's best 6, not the fusion of each leg's best 3.
    deep = await index.search(SearchQuery("refund plans", vector, 6))
    assert [h.chunk.id for h in hits] == [h.chunk.id for h in deep[:3]]
    shallow = index.search_sync(SearchQuery("refund plans", vector, 3), candidates=3)
    assert len(hits) == len(shallow) == 3
    # Dense-only search has no fusion: the top 3 by cosine either way.
    dense = await index.search(SearchQuery("refund plans", vector, 3, hybrid=False))
    assert [h.scores["dense"] for h in dense] == sorted(
        (h.scores["dense"] for h in dense), reverse=True
    )
    with pytest.raises(ValueError):
        EmbeddedHybridIndex(tmp_path, embedder_name="x", dimension=4, rrf_candidates=0)
