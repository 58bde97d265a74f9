"""Blend mode: the vector math, the history text and its assembly (order, composition, window,
truncation), every path that skips the blend, and the earlier questions the BM25 leg adds."""

from __future__ import annotations

import inspect
import logging
from typing import Any

import numpy as np
import pytest

from chatqna.backends.fakes import HashingEmbedder
from chatqna.backends.protocols import Embedder
from chatqna.multiturn.blend import (
    BM25_HISTORY_QUESTIONS,
    MESSAGE_CHARS,
    BlendResult,
    blend_query,
    blend_vectors,
    earlier_questions,
    history_text,
    previous_question,
    question_similarity,
)
from chatqna.multiturn.history import Conversation, Message
from tests.unit.multiturn.test_strategy import chat

pytestmark = pytest.mark.anyio

# The keyword arguments `blend_query` requires, as the tests below take them unless they
# say otherwise: oldest first, both sides, no self-contained check.
PLAIN = {
    "order": "chronological",
    "roles": "user_assistant",
    "assistant_weight": 0.5,
    "self_contained": 0.0,
}

HISTORY = (
    Message("user", "How do I reset my password?"),
    Message("assistant", "Use the reset link; it is valid for one hour."),
)


async def blend(conversation: Conversation, embedder: Embedder, **values: Any) -> BlendResult:
    """`blend_query` with `PLAIN`'s arguments where `values` does not name them."""
    return await blend_query(conversation, embedder, **{**PLAIN, **values})


def test_blend_vectors_is_the_normalised_weighted_sum() -> None:
    eq = np.array([1.0, 0.0, 0.0], dtype=np.float32)
    eh = np.array([0.0, 1.0, 0.0], dtype=np.float32)
    blended = blend_vectors(eq, eh, 0.7)
    np.testing.assert_allclose(blended, np.array([0.7, 0.3, 0.0]) / np.hypot(0.7, 0.3), rtol=1e-6)
    np.testing.assert_allclose(blend_vectors(eq, eh, 1.0), eq)
    np.testing.assert_allclose(blend_vectors(eq, eh, 0.0), eh)
    with pytest.raises(ValueError):
        blend_vectors(eq, eh, 1.5)


def test_history_text_is_oldest_first_one_message_per_line() -> None:
    messages = [*HISTORY, Message("user", "  "), Message("user", " and then? ")]
    assert history_text(messages, "chronological") == (
        "How do I reset my password?\nUse the reset link; it is valid for one hour.\nand then?"
    )


async def test_executed_blend_uses_one_batch_of_two() -> None:
    embedder = HashingEmbedder()
    conversation = Conversation("Can you elaborate on this?", HISTORY)
    result = await blend(
        conversation, embedder, enabled=True, alpha=0.7, history_turns=6, translator=None
    )
    assert embedder.batches == [[conversation.query, history_text(HISTORY, "chronological")]]
    eq = embedder.vector(conversation.query)
    eh = embedder.vector(history_text(HISTORY, "chronological"))
    eq, eh = eq / np.linalg.norm(eq), eh / np.linalg.norm(eh)
    expected = 0.7 * eq + 0.3 * eh
    np.testing.assert_allclose(result.embedding, expected / np.linalg.norm(expected), rtol=1e-5)
    np.testing.assert_allclose(result.query_embedding, eq, rtol=1e-5)
    assert result.executed and result.history_messages == 2


@pytest.mark.parametrize(
    ("enabled", "turns", "history", "reason", "level"),
    [
        (False, 6, HISTORY, "disabled", logging.DEBUG),
        (True, 6, (), "no_history", logging.INFO),
        (True, 6, (Message("assistant", "Hi! How can I help?"),), "no_history", logging.INFO),
        (True, 0, HISTORY, "history_turns_zero", logging.INFO),
    ],
)
async def test_skips_take_the_baseline_single_string_call(
    caplog: pytest.LogCaptureFixture,
    enabled: bool,
    turns: int,
    history: tuple[Message, ...],
    reason: str,
    level: int,
) -> None:
    caplog.set_level(logging.DEBUG, logger="chatqna.multiturn.blend")
    embedder = HashingEmbedder()
    conversation = Conversation("Can you elaborate on this?", history)
    result = await blend(
        conversation, embedder, enabled=enabled, alpha=0.7, history_turns=turns, translator=None
    )
    assert embedder.batches == [["Can you elaborate on this?"]]
    assert not result.executed and result.reason == reason
    np.testing.assert_array_equal(result.embedding, result.query_embedding)
    records = [r for r in caplog.records if r.name == "chatqna.multiturn.blend"]
    assert len(records) == 1 and records[0].levelno == level
    expected_words = "MULTI_TURN_BLEND_ENABLED" if reason == "disabled" else reason
    assert expected_words in records[0].getMessage()


async def test_alpha_zero_searches_with_the_history_alone() -> None:
    embedder = HashingEmbedder()
    conversation = Conversation("Can you elaborate on this?", HISTORY)
    result = await blend(
        conversation, embedder, enabled=True, alpha=0.0, history_turns=6, translator=None
    )
    eh = embedder.vector(history_text(HISTORY, "chronological"))
    np.testing.assert_allclose(result.embedding, eh / np.linalg.norm(eh), rtol=1e-5)


# --- history assembly ----------------------------------------------------------------
EXCHANGES = (
    Message("user", "q1 refunds"),
    Message("assistant", "a1 refunds take days"),
    Message("user", "q2 export"),
    Message("assistant", "a2 export zip"),
)


def test_newest_first_puts_the_latest_message_first() -> None:
    assert history_text(EXCHANGES, "newest_first").splitlines() == [
        "a2 export zip",
        "q2 export",
        "a1 refunds take days",
        "q1 refunds",
    ]
    assert history_text(EXCHANGES, "chronological").splitlines()[0] == "q1 refunds"


async def test_blend_uses_the_configured_assembly() -> None:
    embedder = HashingEmbedder()
    conversation = Conversation("and then?", EXCHANGES)
    await blend(
        conversation,
        embedder,
        enabled=True,
        alpha=0.7,
        history_turns=2,
        translator=None,
        order="newest_first",
        roles="user",
    )
    assert embedder.batches == [["and then?", "q2 export\nq1 refunds"]]


@pytest.mark.slow  # loads the packaged ONNX model
def test_newest_first_keeps_the_recent_subject_when_the_embedder_truncates() -> None:
    from chatqna.backends.local_embedder import OnnxMiniLMEmbedder

    embedder = OnnxMiniLMEmbedder()
    old = [
        Message("assistant", "Billing happens monthly on the signup date. " * 60),
        Message("assistant", "Invoices list every seat and its monthly price. " * 60),
    ]
    recent = Message("user", "How do I reset my password?")
    subject = embedder.embed_sync(["resetting a forgotten password"])[0]
    chronological, newest = embedder.embed_sync(
        [
            history_text([*old, recent], "chronological"),
            history_text([*old, recent], "newest_first"),
        ]
    )
    # 256 tokens fit: two answers of 800 characters push the recent question out of
    # chronological order.
    assert float(newest @ subject) > float(chronological @ subject) + 0.1
    np.testing.assert_allclose(np.linalg.norm(newest), 1.0, rtol=1e-5)


def test_a_long_answer_is_cut_so_the_previous_question_stays_in_the_history() -> None:
    answer = Message("assistant", "Billing happens monthly on the signup date. " * 60)
    question = Message("user", "How do I reset my password?")
    text = history_text([question, answer], "newest_first")
    first, second = text.splitlines()
    assert first == answer.content.strip()[:MESSAGE_CHARS].rstrip()
    assert second == question.content


@pytest.mark.slow  # loads the packaged ONNX model
def test_the_previous_question_reaches_the_history_vector_past_a_whole_answer() -> None:
    from chatqna.backends.local_embedder import OnnxMiniLMEmbedder

    embedder = OnnxMiniLMEmbedder()
    # An answer as long as LLM_MAX_TOKENS allows, sent back by a chat UI.
    answer = Message("assistant", "Billing happens monthly on the signup date. " * 60)
    question = Message("user", "How do I reset my password?")
    with_question, answer_alone = embedder.embed_sync(
        [history_text([question, answer], "newest_first"), history_text([answer], "newest_first")]
    )
    assert float(with_question @ answer_alone) < 0.99


async def test_separate_roles_are_three_inputs_of_one_call_mixed_by_their_weight() -> None:
    embedder = HashingEmbedder()
    history = (*HISTORY, Message("user", "And on mobile?"), Message("assistant", "Same link."))
    conversation = Conversation("Does it expire?", history)
    result = await blend(
        conversation,
        embedder,
        enabled=True,
        alpha=0.7,
        history_turns=4,
        translator=None,
        order="newest_first",
        roles="separate",
        assistant_weight=0.25,
    )
    users = "And on mobile?\nHow do I reset my password?"
    answers = "Same link.\nUse the reset link; it is valid for one hour."
    assert embedder.batches == [[conversation.query, users, answers]]

    def unit(text: str) -> np.ndarray:
        vector = embedder.vector(text)
        return vector / np.linalg.norm(vector)

    eh = 0.75 * unit(users) + 0.25 * unit(answers)
    expected = 0.7 * unit(conversation.query) + 0.3 * eh / np.linalg.norm(eh)
    np.testing.assert_allclose(result.embedding, expected / np.linalg.norm(expected), rtol=1e-5)
    assert result.roles == "separate"


async def test_separate_roles_with_one_side_only_use_that_side() -> None:
    embedder = HashingEmbedder()
    conversation = Conversation("Does it expire?", (Message("user", "Reset my password"),))
    result = await blend(
        conversation,
        embedder,
        enabled=True,
        alpha=0.7,
        history_turns=4,
        translator=None,
        roles="separate",
        assistant_weight=0.9,
    )
    assert embedder.batches == [[conversation.query, "Reset my password"]]
    single = await blend(
        conversation, HashingEmbedder(), enabled=True, alpha=0.7, history_turns=4, translator=None
    )
    np.testing.assert_allclose(result.embedding, single.embedding, rtol=1e-6)


def test_previous_question_prefers_the_window_then_the_history() -> None:
    asked = Conversation("And then?", (*HISTORY, Message("assistant", "Anything else?")))
    assert previous_question(asked, ()) == "How do I reset my password?"
    translated = (Message("user", "How do I reset my password? (translated)"),)
    assert previous_question(asked, translated) == translated[0].content
    assert previous_question(Conversation("Hi", (Message("assistant", "Hello"),)), ()) == ""


def test_question_similarity_is_the_cosine() -> None:
    a = np.array([3.0, 0.0], dtype=np.float32)
    b = np.array([1.0, 1.0], dtype=np.float32)
    assert question_similarity(a, b) == pytest.approx(np.sqrt(0.5), rel=1e-6)
    assert question_similarity(a, a) == pytest.approx(1.0, rel=1e-6)


@pytest.mark.parametrize(("threshold", "executed"), [(0.0, True), (0.95, True), (0.2, False)])
async def test_self_contained_check_embeds_the_question_in_the_same_call(
    threshold: float, executed: bool
) -> None:
    embedder = HashingEmbedder()
    conversation = Conversation("How do I reset my password quickly?", HISTORY)
    result = await blend(
        conversation,
        embedder,
        enabled=True,
        alpha=0.7,
        history_turns=2,
        translator=None,
        self_contained=threshold,
    )
    similarity = question_similarity(
        embedder.vector(conversation.query), embedder.vector(HISTORY[0].content)
    )
    assert 0.2 <= similarity < 0.95
    inputs = [conversation.query, history_text(HISTORY, "chronological")]
    assert embedder.batches == [[*inputs, HISTORY[0].content] if threshold else inputs]
    assert result.executed is executed
    assert result.reason == ("executed" if executed else "self_contained")
    assert result.question_similarity == (
        pytest.approx(similarity, rel=1e-5) if threshold else None
    )
    if not executed:
        np.testing.assert_allclose(result.embedding, result.query_embedding)
        assert result.history == ""


def test_earlier_questions_keep_the_most_recent_and_skip_blank_ones() -> None:
    questions = [f"question {i}" for i in range(12)]
    conversation = Conversation("now?", chat(*questions[:5], "   ", *questions[5:]))
    kept = earlier_questions(conversation)
    assert len(kept) == BM25_HISTORY_QUESTIONS
    assert kept == tuple(questions[-BM25_HISTORY_QUESTIONS:])
    assert earlier_questions(conversation, 2) == ("question 10", "question 11")
    assert earlier_questions(conversation, 0) == ()
    assert earlier_questions(Conversation("first", ())) == ()


def test_every_setting_of_the_blend_is_a_required_argument() -> None:
    # The defaults live in `Settings` alone; a call names each value (`MultiTurnConfig`).
    keywords = [
        p
        for p in inspect.signature(blend_query).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    assert {p.name for p in keywords} >= {"order", "roles", "assistant_weight", "self_contained"}
    assert all(p.default is inspect.Parameter.empty for p in keywords)
