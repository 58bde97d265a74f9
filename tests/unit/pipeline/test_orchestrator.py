"""What the retriever is asked for: blend plans, the history-aware BM25 leg, fused depth."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from chatqna.backends.fakes import HashingEmbedder
from chatqna.backends.protocols import SearchQuery
from chatqna.ingest.dataprep import IngestFile, ingest_files
from chatqna.multiturn.blend import BM25_HISTORY_QUESTIONS, earlier_questions
from chatqna.multiturn.history import Conversation, Message
from chatqna.pipeline.orchestrator import plan_retrieval
from chatqna.retrieval.embedded.index import EmbeddedHybridIndex
from chatqna.retrieval.remote import RemoteRetriever
from chatqna.settings import Settings

pytestmark = pytest.mark.anyio


def chat(*questions: str) -> tuple[Message, ...]:
    """User questions, each answered by the assistant."""
    history: list[Message] = []
    for number, question in enumerate(questions, start=1):
        history += [Message("user", question), Message("assistant", f"answer {number}")]
    return tuple(history)


def blend_settings(**overrides: object) -> Settings:
    values: dict[str, object] = {
        "multi_turn_blend_enabled": True,
        "multi_turn_bm25_history_weight": 0.3,
        "multi_turn_history_turns": 4,
        "multi_turn_history_roles": "user_assistant",
        "multi_turn_history_order": "newest_first",
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


async def test_turn_1_is_exactly_the_stateless_plan() -> None:
    embedder = HashingEmbedder()
    question = "How long is data kept after cancellation?"
    first = Conversation(question, ())
    blended = await plan_retrieval(first, embedder, blend_settings())
    stateless = await plan_retrieval(first, embedder, Settings(multi_turn_blend_enabled=False))
    assert blended.text == stateless.text == question
    np.testing.assert_array_equal(blended.embedding, stateless.embedding)
    assert blended.bm25_history == "" and blended.bm25_history_weight == 0.0
    assert blended.report.wire()["strategy"] == "stateless"
    assert blended.report.wire()["bm25_history"] == {"ran": False, "weight": 0.3}
    # The skipped blend still reports the configured history composition.
    assert blended.report.wire()["blend"]["reason"] == "no_history"
    assert blended.report.wire()["blend"]["history_order"] == "newest_first"


async def test_follow_up_bm25_hears_all_earlier_questions_not_only_the_window() -> None:
    embedder = HashingEmbedder()
    conversation = Conversation("And for annual plans?", chat("Refund policy?", "How long?"))
    plan = await plan_retrieval(conversation, embedder, blend_settings())
    assert plan.report.wire()["strategy"] == "blend"
    # The blend window holds 4 messages; the BM25 leg hears both questions.
    assert plan.report.wire()["blend"]["history_messages"] == 4
    assert plan.bm25_history == "Refund policy?\nHow long?"
    assert plan.bm25_history_weight == 0.3
    assert plan.report.wire()["bm25_history"] == {"ran": True, "weight": 0.3}
    assert plan.report.wire()["fusion_weights"] == [1.0, Settings().rrf_bm25_weight]
    assert embedder.batches[-1] == [
        "And for annual plans?",
        "answer 2\nHow long?\nanswer 1\nRefund policy?",
    ]


async def test_history_leg_off_at_weight_zero_and_when_the_blend_is_off() -> None:
    embedder = HashingEmbedder()
    conversation = Conversation("And then?", chat("Refund policy?"))
    off = await plan_retrieval(
        conversation, embedder, blend_settings(multi_turn_bm25_history_weight=0.0)
    )
    assert off.bm25_history == "" and off.report.wire()["bm25_history"]["ran"] is False
    no_blend = await plan_retrieval(
        conversation, embedder, blend_settings(multi_turn_blend_enabled=False)
    )
    assert no_blend.bm25_history == "" and no_blend.bm25_history_weight == 0.0


async def test_no_history_leg_through_the_retriever_service() -> None:
    # OPEA's /v1/retrieval has no history field: the leg cannot run, and says so.
    remote = RemoteRetriever("http://127.0.0.1:9")
    supported = remote.supports_bm25_history
    await remote.aclose()
    assert supported is False
    conversation = Conversation("And then?", chat("Refund policy?"))
    plan = await plan_retrieval(
        conversation, HashingEmbedder(), blend_settings(), bm25_history_supported=supported
    )
    assert plan.report.wire()["strategy"] == "blend"
    assert plan.bm25_history == "" and plan.report.wire()["bm25_history"]["ran"] is False


async def test_blended_follow_up_reranks_against_the_conversation() -> None:
    embedder = HashingEmbedder()
    conversation = Conversation("Which plans include it?", chat("Single sign-on with Okta?"))
    plan = await plan_retrieval(conversation, embedder, blend_settings())
    # BM25 keeps the isolated follow-up; the reranker gets the follow-up and the newest
    # earlier question, and the blended vector rather than the follow-up's own.
    assert plan.text == "Which plans include it?"
    assert plan.rerank.kind == "conversation"
    assert plan.rerank.text == "Which plans include it?\nSingle sign-on with Okta?"
    assert plan.rerank.vector is not None
    np.testing.assert_array_equal(plan.rerank.vector, plan.embedding)
    own = (await embedder.embed(["Which plans include it?"]))[0]
    assert not np.allclose(plan.rerank.vector, own)


async def test_first_turns_and_the_message_setting_rerank_against_the_message() -> None:
    embedder = HashingEmbedder()
    own = (await embedder.embed(["Which plans include it?"]))[0]
    first = await plan_retrieval(
        Conversation("Which plans include it?", ()), embedder, blend_settings()
    )
    follow = Conversation("Which plans include it?", chat("Single sign-on with Okta?"))
    message = await plan_retrieval(
        follow, embedder, blend_settings(multi_turn_rerank_query="message")
    )
    stateless = await plan_retrieval(follow, embedder, Settings(multi_turn_blend_enabled=False))
    for plan in (first, message, stateless):
        assert plan.rerank.kind == "message"
        assert plan.rerank.text == "Which plans include it?"
        assert plan.rerank.vector is not None
        np.testing.assert_allclose(plan.rerank.vector, own, rtol=1e-6)
    # The message setting keeps the blend on the dense leg; only the reranker's query changes.
    assert message.report.wire()["strategy"] == "blend"
    assert not np.allclose(message.embedding, own)


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
