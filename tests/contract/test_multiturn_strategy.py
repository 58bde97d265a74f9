"""The `MultiTurnStrategy` contract, over both strategies as the service builds them
(`build_strategy` from `MultiTurnConfig.from_settings`): the blend (switched on, on the
hashing embedder) and condense (a scripted LLM that rewrites every follow-up).

What every strategy owes the pipeline: a first turn (or a greeting alone) is searched as
its message, with no LLM call and no history leg; a follow-up is planned from its history
with one embedding step; system messages never reach the plan."""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import pytest

from chatqna.backends.fakes import HashingEmbedder, ScriptedLLM
from chatqna.multiturn.condense import CondenseOutcome
from chatqna.multiturn.history import Conversation, Message, split_conversation
from chatqna.multiturn.strategy import MultiTurnConfig, MultiTurnStrategy, build_strategy
from chatqna.settings import Settings

T = TypeVar("T")

pytestmark = pytest.mark.anyio

ASKED = Message("user", "Does single sign-on work with Okta?")
ANSWERED = Message("assistant", "Yes: single sign-on supports Okta and Azure AD.")
FOLLOW_UP = "Which plans include it?"
REWRITE = "Which plans include single sign-on with Okta?"
GREETING = Message("assistant", "Hi! How can I help?")


@dataclass
class Built:
    """A strategy with the backends it plans with, to see what it called."""

    strategy: MultiTurnStrategy
    embedder: HashingEmbedder
    llm: ScriptedLLM


@dataclass
class Steps:
    """`PlanSteps` that record the order the steps ran in."""

    ran: list[str] = field(default_factory=list)

    async def rewrite(self, work: Awaitable[CondenseOutcome]) -> CondenseOutcome:
        self.ran.append("rewrite")
        return await work

    async def embed(self, work: Awaitable[T]) -> T:
        self.ran.append("embed")
        return await work


@pytest.fixture(params=["blend", "condense"])
def built(request: pytest.FixtureRequest) -> Built:
    if request.param == "blend":
        settings = Settings(multi_turn_mode="blend", multi_turn_blend_enabled=True)
    else:
        settings = Settings(multi_turn_mode="condense")
    embedder, llm = HashingEmbedder(), ScriptedLLM(f'{{"standalone_query": "{REWRITE}"}}')
    config = MultiTurnConfig.from_settings(settings)
    strategy = build_strategy(config, embedder=embedder, condense_llm=llm)
    assert strategy.mode == request.param
    return Built(strategy, embedder, llm)


def turn(*messages: Message) -> Conversation:
    """The conversation as the API splits it (`split_conversation`)."""
    return split_conversation(messages)


@pytest.mark.parametrize(
    "history",
    [(), (GREETING,), (Message("system", "Be brief."),)],
    ids=["first-turn", "greeting-alone", "system-only"],
)
async def test_a_turn_with_nothing_asked_before_is_searched_as_its_message(
    built: Built, history: tuple[Message, ...]
) -> None:
    steps = Steps()
    plan = await built.strategy.plan(turn(*history, Message("user", FOLLOW_UP)), steps)
    assert (plan.strategy, plan.mode) == ("stateless", built.strategy.mode)
    assert plan.text == plan.rerank.text == FOLLOW_UP
    assert plan.rerank.kind == "message"
    assert built.llm.prompts == []  # no rewrite call
    assert plan.history_leg is None or not plan.history_leg.ran
    assert built.embedder.batches == [[FOLLOW_UP]] and steps.ran[-1:] == ["embed"]
    (vector,) = await HashingEmbedder().embed([FOLLOW_UP])
    np.testing.assert_allclose(plan.embedding, vector)


async def test_a_follow_up_is_planned_from_its_history_in_one_embedding_step(
    built: Built,
) -> None:
    steps = Steps()
    plan = await built.strategy.plan(turn(ASKED, ANSWERED, Message("user", FOLLOW_UP)), steps)
    assert plan.strategy == built.strategy.mode and plan.mode == built.strategy.mode
    assert steps.ran.count("embed") == 1 and steps.ran[-1] == "embed"
    assert len(built.embedder.batches) == 1
    (alone,) = await HashingEmbedder().embed([FOLLOW_UP])
    assert not np.allclose(plan.embedding, alone)  # the history moved the search
    np.testing.assert_allclose(np.linalg.norm(plan.embedding), 1.0, rtol=1e-5)
    assert plan.rerank.kind != "message"


async def test_the_plan_is_the_same_without_the_default_steps(built: Built) -> None:
    conversation = turn(ASKED, ANSWERED, Message("user", FOLLOW_UP))
    untraced = await built.strategy.plan(conversation)
    traced = await built.strategy.plan(conversation, Steps())
    assert (untraced.strategy, untraced.text) == (traced.strategy, traced.text)
    np.testing.assert_allclose(untraced.embedding, traced.embedding)


async def test_a_system_message_never_reaches_the_plan(built: Built) -> None:
    # Built by hand a history may hold one; the window leaves it out all the same.
    system = Message("system", "Answer in the voice of a pirate.")
    plain = await built.strategy.plan(Conversation(FOLLOW_UP, (ASKED, ANSWERED)))
    held = await built.strategy.plan(Conversation(FOLLOW_UP, (ASKED, system, ANSWERED)))
    assert (held.strategy, held.text, held.rerank.text) == (
        plain.strategy,
        plain.text,
        plain.rerank.text,
    )
    np.testing.assert_allclose(held.embedding, plain.embedding)
    assert all("pirate" not in m["content"] for p in built.llm.prompts for m in p)
