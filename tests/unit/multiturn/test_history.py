"""Splitting a chat: the query is the last user message; system messages are not history."""

import pytest

from chatqna.multiturn.history import (
    CUT_MARK,
    Conversation,
    Message,
    cut_on_word,
    shortened,
    split_conversation,
)


def test_query_history_and_system_are_split() -> None:
    conversation = split_conversation(
        [
            Message("system", "Be brief."),
            Message("user", "How do I export?"),
            Message("assistant", "Settings > Export."),
            Message("user", "After I cancel?"),
        ]
    )
    assert conversation.query == "After I cancel?"
    assert conversation.system == ("Be brief.",)
    assert [m.role for m in conversation.history] == ["user", "assistant"]
    assert conversation.window(1, "user_assistant") == (Message("assistant", "Settings > Export."),)
    assert conversation.window(0, "user_assistant") == ()


def test_the_last_message_must_be_the_users() -> None:
    with pytest.raises(ValueError, match="must come from the user"):
        split_conversation([Message("user", "hi"), Message("assistant", "hello")])
    with pytest.raises(ValueError):
        split_conversation([])
    assert Conversation("q", ()).window(3, "user_assistant") == ()


def test_shortened_keeps_the_start_and_marks_the_cut() -> None:
    answer = Message("assistant", "Open Settings and choose Export. " * 10)
    short = shortened(answer, 50)
    assert short.role == "assistant" and len(short.content) <= 50
    assert short.content == "Open Settings and choose Export. Open" + CUT_MARK
    assert shortened(answer, 1000) is answer


def test_a_cut_between_words_keeps_the_last_whole_word() -> None:
    assert cut_on_word("alpha beta gamma", 10) == "alpha beta"
    assert cut_on_word("alpha beta gamma", 12) == "alpha beta"
    assert cut_on_word("alphabetagamma", 5) == "alpha"
    assert shortened(Message("user", "word " * 20), 16).content == "word word" + CUT_MARK


def test_a_greeting_alone_does_not_make_a_follow_up() -> None:
    greeting = Message("assistant", "Hi! How can I help?")
    assert not Conversation("How do I export?", (greeting,)).follows_up
    assert Conversation("And then?", (Message("user", "How do I export?"), greeting)).follows_up


EXCHANGES = (
    Message("user", "q1 refunds"),
    Message("assistant", "a1 refunds take days"),
    Message("user", "q2 export"),
    Message("assistant", "a2 export zip"),
)


def test_the_window_counts_messages_of_the_chosen_roles() -> None:
    conversation = Conversation("and then?", EXCHANGES)
    assert conversation.window(2, "user_assistant") == EXCHANGES[2:]
    assert conversation.window(2, "separate") == EXCHANGES[2:]
    assert conversation.window(2, "user") == (EXCHANGES[0], EXCHANGES[2])
    assert conversation.window(1, "user") == (EXCHANGES[2],)
    assert conversation.window(0, "user_assistant") == ()


def test_the_window_never_holds_a_system_message() -> None:
    conversation = split_conversation(
        [Message("system", "be brief"), *EXCHANGES, Message("user", "Can you elaborate?")]
    )
    assert conversation.window(3, "user_assistant") == EXCHANGES[1:]
    assert conversation.system == ("be brief",)
    # Built by hand, a history may hold one; the window still leaves it out.
    by_hand = Conversation("and then?", (EXCHANGES[0], Message("system", "be brief")))
    assert by_hand.window(2, "user_assistant") == (EXCHANGES[0],)


def test_a_greeting_alone_leaves_the_window_empty() -> None:
    greeting = Message("assistant", "Hi! How can I help?")
    assert Conversation("How do I export?", (greeting,)).window(2, "user_assistant") == ()
    asked = Conversation("And then?", (Message("user", "How do I export?"), greeting))
    assert asked.window(1, "user_assistant") == (greeting,)
