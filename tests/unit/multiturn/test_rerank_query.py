"""The reranker's conversation text: the follow-up, then the newest earlier question."""

from chatqna.multiturn.rerank_query import conversation_text

ASKED = ("How do I export my data?", "  ", "Can we use single sign-on with Okta?")
FOLLOW_UP = "Which plans include it?"


def test_the_follow_up_then_the_newest_earlier_question() -> None:
    assert conversation_text(FOLLOW_UP, ASKED) == f"{FOLLOW_UP}\n{ASKED[2]}"
    assert conversation_text(FOLLOW_UP, (*ASKED, " ")) == f"{FOLLOW_UP}\n{ASKED[2]}"


def test_without_earlier_questions_the_follow_up_stands_alone() -> None:
    assert conversation_text(FOLLOW_UP, ()) == FOLLOW_UP
    assert conversation_text(FOLLOW_UP, ("  ",)) == FOLLOW_UP
