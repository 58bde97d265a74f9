"""Condense: reply parsing, the output guard, and the failure reasons."""

from __future__ import annotations

import inspect
import json

import pytest

from chatqna.backends.fakes import ScriptedLLM
from chatqna.errors import (
    CONDENSE_FAILED_MESSAGE,
    BadUpstreamResponse,
    CondenseFailed,
    UpstreamError,
    UpstreamTimeout,
)
from chatqna.multiturn.condense import (
    STATUS_OK,
    STATUS_SKIPPED,
    clean_rewrite,
    condense_follow_up,
    guard_violation,
    parse_reply,
    reply_tokens,
    transcript,
)
from chatqna.multiturn.history import CUT_MARK, Conversation, Message

pytestmark = pytest.mark.anyio

HISTORY = (
    Message("user", "How do I export my data?"),
    Message("assistant", "Open Settings > Workspace > Export."),
)
FOLLOW_UP = Conversation("Is that possible after I cancel?", HISTORY)


@pytest.mark.parametrize(
    ("raw", "cleaned"),
    [
        ('"Can I export my data after I cancel?"', "Can I export my data after I cancel?"),
        ("Standalone question: Can I export after cancelling?", "Can I export after cancelling?"),
        ('Query: "refund window for annual plans"', "refund window for annual plans"),
        ("  How   long\nis data kept? ", "How long is data kept?"),
    ],
)
def test_clean_rewrite(raw: str, cleaned: str) -> None:
    assert clean_rewrite(raw, 500) == cleaned


def test_clean_rewrite_caps_on_a_word_boundary() -> None:
    assert clean_rewrite("alpha beta gamma delta", 13) == "alpha beta"


@pytest.mark.parametrize(
    "text",
    [
        "How long is my data kept after I cancel my plan?",
        "Can I get a refund on an annual plan?",
        "refund window annual plan",
        "What does the Business plan cost per user per month?",
    ],
)
def test_guard_accepts_standalone_questions(text: str) -> None:
    assert guard_violation(text) is None


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("Here is the standalone question: can I export?", "meta-text"),
        ("I cannot rewrite this message.", "meta-text"),
        ("Yes, you can export after cancelling.", "yes/no"),
        ("You can export for 30 days. After that the data is deleted.", "several sentences"),
        (" ".join(["word"] * 61), "60 words"),
    ],
)
def test_guard_rejects_meta_text_and_answers(text: str, why: str) -> None:
    violation = guard_violation(text)
    assert violation is not None and why in violation


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("Sure! Can I export after cancelling?", "bad_body"),
        ('["Can I export?"]', "bad_body"),
        ('{"query": "Can I export?"}', "missing_field"),
        ('{"standalone_query": "   "}', "empty_query"),
        ('{"standalone_query": null}', "empty_query"),
        ('{"standalone_query": 42}', "bad_body"),
        ('{"standalone_query": "Yes, you can."}', "bad_body"),
        ('{"standalone_query": "export\\u0000data after cancel?"}', "bad_body"),
        ('{"standalone_query": "export\\u007fdata after cancel?"}', "bad_body"),
    ],
)
def test_parse_reply_failures(content: str, reason: str) -> None:
    with pytest.raises(CondenseFailed) as caught:
        parse_reply(content, 500)
    assert caught.value.reason == reason
    assert caught.value.envelope() == {
        "error": "condense_failed",
        "reason": reason,
        "message": CONDENSE_FAILED_MESSAGE,
    }


def test_parse_reply_accepts_fenced_json() -> None:
    fenced = '```json\n{"standalone_query": "Can I export after I cancel?"}\n```'
    assert parse_reply(fenced, 500) == "Can I export after I cancel?"


def test_transcript_names_roles_and_the_latest_message() -> None:
    assert transcript(HISTORY, "And then?") == (
        "Conversation:\nUser: How do I export my data?\n"
        "Assistant: Open Settings > Workspace > Export.\nLatest message: And then?"
    )


async def test_no_history_makes_no_call() -> None:
    llm = ScriptedLLM('{"standalone_query": "never used"}')
    outcome = await condense_follow_up(
        Conversation("How do I export?", ()), llm, history_turns=6, timeout_seconds=1, max_chars=500
    )
    assert outcome.status == STATUS_SKIPPED and outcome.query == "How do I export?"
    assert llm.prompts == []


async def test_a_greeting_alone_is_no_history() -> None:
    llm = ScriptedLLM('{"standalone_query": "never used"}')
    greeting = (Message("assistant", "Hi! Ask me anything about your account."),)
    conversation = Conversation("How do I export?", greeting)
    outcome = await condense_follow_up(
        conversation, llm, history_turns=6, timeout_seconds=1, max_chars=500
    )
    assert outcome.status == STATUS_SKIPPED and outcome.query == "How do I export?"
    assert llm.prompts == []


async def test_follow_up_is_rewritten_with_the_window() -> None:
    llm = ScriptedLLM('{"standalone_query": "Can I export my data after I cancel?"}')
    outcome = await condense_follow_up(
        FOLLOW_UP, llm, history_turns=6, timeout_seconds=1, max_chars=500
    )
    assert outcome.status == STATUS_OK
    assert outcome.query == "Can I export my data after I cancel?"
    assert outcome.raw_query == FOLLOW_UP.query and outcome.history_size == 2
    (prompt,) = llm.prompts
    assert "Never answer the question" in prompt[0]["content"]
    assert prompt[1]["content"].endswith("Latest message: Is that possible after I cancel?")
    params = llm.params[0]
    assert params.temperature == 0.0
    assert params.response_format is not None and params.response_format["type"] == "json_schema"


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (UpstreamTimeout("t", backend="llm"), "timeout"),
        (TimeoutError(), "timeout"),
        (UpstreamError("500", backend="llm"), "http_error"),
        (BadUpstreamResponse("no choices", backend="llm"), "bad_body"),
    ],
)
async def test_upstream_failures_map_to_reasons(error: Exception, reason: str) -> None:
    llm = ScriptedLLM(error=error)
    with pytest.raises(CondenseFailed) as caught:
        await condense_follow_up(FOLLOW_UP, llm, history_turns=6, timeout_seconds=1, max_chars=500)
    assert caught.value.reason == reason
    assert caught.value.history_size == 2 and caught.value.model == "scripted"


async def test_slow_rewrite_times_out() -> None:
    class Slow(ScriptedLLM):
        async def complete(self, messages, params):  # type: ignore[no-untyped-def]
            import asyncio

            await asyncio.sleep(5)
            return await super().complete(messages, params)

    with pytest.raises(CondenseFailed) as caught:
        await condense_follow_up(
            FOLLOW_UP, Slow(), history_turns=6, timeout_seconds=0.05, max_chars=500
        )
    assert caught.value.reason == "timeout"
    assert caught.value.latency_ms < 1000


def test_a_question_rewritten_as_a_statement_is_an_answer() -> None:
    statement = "The Patriots coach is a former quarterback"
    assert guard_violation(statement) is None
    violation = guard_violation(statement, latest="Who is the Patriots coach?")
    assert violation is not None and "statement" in violation
    with pytest.raises(CondenseFailed) as caught:
        reply = '{"standalone_query": "' + statement + '"}'
        parse_reply(reply, 500, "Who is the coach?")
    assert caught.value.reason == "bad_body"


def test_transcript_shortens_long_messages() -> None:
    long_answer = Message("assistant", "word " * 300)
    text = transcript([long_answer], "And then?", message_chars=40)
    line = text.splitlines()[1]
    assert line == "Assistant: word word word word word word word" + CUT_MARK
    assert len(line.removeprefix("Assistant: ")) <= 40


LONG_FOLLOW_UP = (
    "I am on the annual plan, my workspace has about forty members, we use single sign-on "
    "through our identity provider, and our legal team needs every file, comment and audit "
    "log kept for seven years, so before we decide anything I would like to know whether "
    "that export still works for us once the subscription has been cancelled and the "
    "workspace is closed?"
)
VERY_LONG_FOLLOW_UP = "x" * 10 + " " + ("please tell me more " * 30).strip() + "?"


@pytest.mark.parametrize(
    "latest",
    [
        "I can't find that button, where is it?",
        "I cannot see the Export option, is it hidden after I cancel?",
        "No, I meant after I cancel?",
        "Yes, and is that possible after I cancel?",
        "Sure, and what about comments?",
        "Is the rewritten invoice included in it?",
        LONG_FOLLOW_UP,
        VERY_LONG_FOLLOW_UP,
    ],
)
def test_the_users_own_words_pass_the_guard(latest: str) -> None:
    with_subject = latest.rstrip("?") + " when I export my data?"
    for rewrite in (latest, with_subject):
        reply = json.dumps({"standalone_query": rewrite})
        assert parse_reply(reply, 500, latest) == rewrite


def test_a_rewrite_containing_the_message_is_accepted() -> None:
    latest = "I need the invoice. And the receipt."
    rewrite = "For my annual plan: I need the invoice. And the receipt."
    assert guard_violation(latest, latest) is None
    assert guard_violation(rewrite, latest) is None


@pytest.mark.parametrize(
    ("latest", "accepted", "refused", "why"),
    [
        (
            "No, I meant after I cancel?",
            "No, I meant exporting my data after I cancel?",
            "Yes, you can export after cancelling.",
            "yes/no",
        ),
        (
            "I can't find that button, where is it?",
            "I can't find the Export button, where is it?",
            "I cannot rewrite this message.",
            "meta-text",
        ),
        (
            "Is the rewritten invoice included in it?",
            "Is the rewritten invoice included in the data export?",
            "Here is the rewritten question: Is the invoice included?",
            "meta-text",
        ),
        (
            "Is that possible after I cancel?",
            "Is that possible after I cancel (exporting my data)?",
            "Is that possible after I cancel? Yes, you can.",
            "after the question",
        ),
        (
            "Is that possible after I cancel?",
            "Regarding data export: is that possible after I cancel?",
            "Is that possible after I cancel? You can export for 30 days.",
            "after the question",
        ),
        (
            LONG_FOLLOW_UP,
            LONG_FOLLOW_UP.replace("that export", "the data export"),
            " ".join(["word"] * 127),
            "126 words",
        ),
    ],
)
def test_the_guard_refuses_only_what_the_user_did_not_write(
    latest: str, accepted: str, refused: str, why: str
) -> None:
    assert guard_violation(accepted, latest) is None
    violation = guard_violation(refused, latest)
    assert violation is not None and why in violation


@pytest.mark.parametrize(
    ("latest", "rewrite"),
    [
        ("Why?", "Why? Because exports are limited to 10 MB"),
        ("How much?", "How much? The Enterprise plan costs 40 dollars per user"),
        (
            "What about the price?",
            "What about the price? The Enterprise plan costs 40 dollars per user per month",
        ),
        ("I cannot log in after the update", "I cannot rewrite this message"),
        ("no", "No, the Enterprise plan does not include it"),
        ("How much?", "The Enterprise plan costs 40 dollars. How much?"),
        ("How much?", "How much? How much does the Enterprise plan cost?"),
        ("I need the invoice", "I need the invoice, it is under Billing"),
        ("I need the invoice", "I need the invoice for 2023. It is under Billing."),
        ("Is that possible after I cancel?", "Yes, is that possible after I cancel?"),
        ("I cannot log in, what now?", "What now? I cannot log in. I cannot help with that."),
    ],
)
def test_an_answer_or_a_refusal_around_the_message_is_refused(latest: str, rewrite: str) -> None:
    with pytest.raises(CondenseFailed) as caught:
        parse_reply(json.dumps({"standalone_query": rewrite}), 500, latest)
    assert caught.value.reason == "bad_body"


@pytest.mark.parametrize(
    ("latest", "rewrite"),
    [
        ("Is it possible after I cancel?", "Is it possible after I cancel my Enterprise plan?"),
        ("I need the invoice", "I need the invoice for my annual plan"),
        ("I need the invoice", "I need the invoice."),
        ("How much?", "Regarding the Enterprise plan: how much?"),
        ("no", "no"),
        ("I cannot log in after the update", "I cannot log in to ChatQnA after the update"),
    ],
)
def test_a_qualifier_inside_the_message_is_accepted(latest: str, rewrite: str) -> None:
    assert parse_reply(json.dumps({"standalone_query": rewrite}), 500, latest) == rewrite


def test_a_long_follow_up_gets_room_to_be_restated() -> None:
    assert reply_tokens("Is that possible after I cancel?") == 64
    assert reply_tokens(VERY_LONG_FOLLOW_UP) >= len(VERY_LONG_FOLLOW_UP) // 2
    reply = json.dumps({"standalone_query": VERY_LONG_FOLLOW_UP})
    assert parse_reply(reply, 500, VERY_LONG_FOLLOW_UP).endswith("?")


def test_a_reply_far_longer_than_a_rewrite_is_rejected_before_it_is_parsed() -> None:
    rewrite = "Can I export my data after I cancel?"
    padded = json.dumps({"standalone_query": rewrite, "padding": [0.5] * 2000})
    with pytest.raises(CondenseFailed) as info:
        parse_reply(padded, 500, "Can I export it after I cancel?")
    assert info.value.reason == "bad_body"
    assert "longer than 4256 characters" in info.value.detail
    # The same rewrite without the padding, and one escaped to the full, are read.
    assert parse_reply(json.dumps({"standalone_query": rewrite}), 500) == rewrite
    escaped = json.dumps({"standalone_query": "é" * 499 + "?"})  # six characters each
    assert parse_reply(escaped, 500).endswith("?")


async def test_the_rewrite_call_scales_max_tokens_with_the_message() -> None:
    llm = ScriptedLLM(json.dumps({"standalone_query": LONG_FOLLOW_UP}))
    conversation = Conversation(LONG_FOLLOW_UP, HISTORY)
    outcome = await condense_follow_up(
        conversation, llm, history_turns=6, timeout_seconds=1, max_chars=500
    )
    assert outcome.query == LONG_FOLLOW_UP
    assert llm.params[0].max_tokens > len(LONG_FOLLOW_UP) // 2
    short = ScriptedLLM('{"standalone_query": "Can I export my data after I cancel?"}')
    await condense_follow_up(FOLLOW_UP, short, history_turns=6, timeout_seconds=1, max_chars=500)
    assert short.params[0].max_tokens == 64


def test_every_setting_of_the_rewrite_is_a_required_argument() -> None:
    # The defaults live in `Settings` alone; a call names each value (`MultiTurnConfig`).
    keywords = [
        p
        for p in inspect.signature(condense_follow_up).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    assert [p.name for p in keywords] == ["history_turns", "timeout_seconds", "max_chars"]
    assert all(p.default is inspect.Parameter.empty for p in keywords)
