"""The multi-turn strategies: what the retriever and the reranker are asked for, per mode."""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import MISSING, fields
from typing import TypeVar

import numpy as np
import pytest

from chatqna.backends.fakes import HashingEmbedder, ScriptedLLM
from chatqna.backends.protocols import Embedder
from chatqna.errors import CondenseFailed
from chatqna.multiturn.condense import CondenseOutcome
from chatqna.multiturn.history import Conversation, Message
from chatqna.multiturn.strategy import (
    BlendStrategy,
    CondenseStrategy,
    MultiTurnConfig,
    QueryPlan,
    build_strategy,
)
from chatqna.multiturn.translate import HistoryTranslator
from chatqna.retrieval.remote import RemoteRetriever
from chatqna.settings import Settings

T = TypeVar("T")

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


async def plan_retrieval(
    conversation: Conversation,
    embedder: Embedder,
    settings: Settings,
    *,
    bm25_history_supported: bool = True,
) -> QueryPlan:
    strategy = build_strategy(
        MultiTurnConfig.from_settings(settings),
        embedder=embedder,
        bm25_history_supported=bm25_history_supported,
    )
    return await strategy.plan(conversation)


async def test_turn_1_is_exactly_the_stateless_plan() -> None:
    embedder = HashingEmbedder()
    question = "How long is data kept after cancellation?"
    first = Conversation(question, ())
    blended = await plan_retrieval(first, embedder, blend_settings())
    stateless = await plan_retrieval(first, embedder, Settings(multi_turn_blend_enabled=False))
    assert blended.text == stateless.text == question
    np.testing.assert_array_equal(blended.embedding, stateless.embedding)
    assert blended.history_leg is not None
    assert blended.history_leg.questions == "" and blended.history_leg.search_weight == 0.0
    assert blended.strategy == "stateless" and blended.mode == "blend"
    assert (blended.history_leg.ran, blended.history_leg.weight) == (False, 0.3)
    # The skipped blend still reports the configured history composition.
    assert blended.blend is not None and blended.blend.reason == "no_history"
    assert blended.blend.order == "newest_first"
    assert blended.condense is None


async def test_follow_up_bm25_hears_all_earlier_questions_not_only_the_window() -> None:
    embedder = HashingEmbedder()
    conversation = Conversation("And for annual plans?", chat("Refund policy?", "How long?"))
    plan = await plan_retrieval(conversation, embedder, blend_settings())
    assert plan.strategy == "blend"
    # The blend window holds 4 messages; the BM25 leg hears both questions.
    assert plan.blend is not None and plan.blend.history_messages == 4
    assert plan.history_leg is not None and plan.history_leg.ran
    assert plan.history_leg.questions == "Refund policy?\nHow long?"
    assert plan.history_leg.search_weight == 0.3
    # One call: the query, the history, and the previous question (the self-contained check).
    assert embedder.batches[-1] == [
        "And for annual plans?",
        "answer 2\nHow long?\nanswer 1\nRefund policy?",
        "How long?",
    ]


async def test_bm25_and_the_reranker_hear_the_translated_history_like_the_embedding() -> None:
    spanish = "¿Cómo puedo exportar mis datos después de cancelar la suscripción?"
    english = "How can I export my data after cancelling the subscription?"
    translator = HistoryTranslator(ScriptedLLM(english), cache_size=8)
    config = MultiTurnConfig.from_settings(blend_settings(multi_turn_self_contained_similarity=0))
    strategy = build_strategy(config, embedder=HashingEmbedder(), translator=translator)
    history = (Message("user", spanish), Message("assistant", "Open Settings > Export."))
    plan = await strategy.plan(Conversation("And how long do I have?", history))
    assert plan.strategy == "blend" and plan.blend is not None
    assert english in plan.blend.history
    assert plan.history_leg is not None and plan.history_leg.questions == english
    assert plan.rerank.text == f"And how long do I have?\n{english}"


async def test_history_leg_off_at_weight_zero_and_when_the_blend_is_off() -> None:
    embedder = HashingEmbedder()
    conversation = Conversation("And then?", chat("Refund policy?"))
    off = await plan_retrieval(
        conversation, embedder, blend_settings(multi_turn_bm25_history_weight=0.0)
    )
    assert off.history_leg is not None
    assert off.history_leg.questions == "" and off.history_leg.ran is False
    no_blend = await plan_retrieval(
        conversation, embedder, blend_settings(multi_turn_blend_enabled=False)
    )
    assert no_blend.history_leg is not None and no_blend.history_leg.search_weight == 0.0
    assert no_blend.history_leg.questions == ""


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
    assert plan.strategy == "blend"
    assert plan.history_leg is not None
    assert plan.history_leg.questions == "" and plan.history_leg.ran is False


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
    assert message.strategy == "blend"
    assert not np.allclose(message.embedding, own)


class Steps:
    """`PlanSteps` that record the order of the steps they ran."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    async def rewrite(self, work: Awaitable[CondenseOutcome]) -> CondenseOutcome:
        self.ran.append("rewrite")
        return await work

    async def embed(self, work: Awaitable[T]) -> T:
        self.ran.append("embed")
        return await work


def test_the_mode_picks_the_strategy_once() -> None:
    embedder, llm = HashingEmbedder(), ScriptedLLM()
    condense = MultiTurnConfig.from_settings(Settings(multi_turn_mode="condense"))
    blend = MultiTurnConfig.from_settings(Settings(multi_turn_blend_enabled=True))
    chosen = build_strategy(condense, embedder=embedder, condense_llm=llm)
    assert isinstance(chosen, CondenseStrategy) and chosen.mode == "condense"
    assert isinstance(build_strategy(blend, embedder=embedder), BlendStrategy)
    with pytest.raises(ValueError, match="condense"):
        build_strategy(condense, embedder=embedder)
    # Condense wins over the blend flag (the settings warn about the pair).
    both = Settings(multi_turn_mode="condense", multi_turn_blend_enabled=True)
    assert MultiTurnConfig.from_settings(both).blend_enabled is False


async def test_condense_rewrites_then_embeds_the_standalone_query() -> None:
    embedder = HashingEmbedder()
    llm = ScriptedLLM('{"standalone_query": "Which plans include single sign-on?"}')
    config = MultiTurnConfig.from_settings(Settings(multi_turn_mode="condense"))
    strategy = build_strategy(config, embedder=embedder, condense_llm=llm)
    steps = Steps()
    follow = Conversation("Which plans include it?", chat("Single sign-on with Okta?"))
    plan = await strategy.plan(follow, steps)
    assert steps.ran == ["rewrite", "embed"]
    assert plan.strategy == "condense" and plan.mode == "condense"
    assert plan.text == plan.rerank.text == "Which plans include single sign-on?"
    assert plan.rerank.kind == "standalone"
    assert embedder.batches[-1] == ["Which plans include single sign-on?"]
    assert plan.condense is not None and plan.condense.rewritten
    assert plan.blend is None and plan.history_leg is None
    # A first turn is not rewritten: the message itself, reranked as a message.
    first = await strategy.plan(Conversation("Refund policy?", ()), Steps())
    assert (first.strategy, first.text, first.rerank.kind) == (
        "stateless",
        "Refund policy?",
        "message",
    )


async def test_a_failed_rewrite_fails_the_plan_before_any_embedding() -> None:
    embedder = HashingEmbedder()
    config = MultiTurnConfig.from_settings(Settings(multi_turn_mode="condense"))
    strategy = build_strategy(config, embedder=embedder, condense_llm=ScriptedLLM("not json"))
    steps = Steps()
    follow = Conversation("Which plans include it?", chat("Single sign-on with Okta?"))
    with pytest.raises(CondenseFailed) as failure:
        await strategy.plan(follow, steps)
    assert failure.value.reason == "bad_body"
    assert steps.ran == ["rewrite"] and embedder.batches == []


def test_a_config_holds_no_defaults_of_its_own() -> None:
    # `Settings` is the one place for the multi-turn defaults: a config names every value.
    assert all(f.default is MISSING for f in fields(MultiTurnConfig))
    with pytest.raises(TypeError):
        MultiTurnConfig(mode="blend")  # type: ignore[call-arg]
    served = MultiTurnConfig.from_settings(Settings())
    assert (served.blend_enabled, served.alpha, served.history_order) == (
        False,
        0.7,
        "newest_first",
    )
