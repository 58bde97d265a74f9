"""The reranker's conversation text: the shipped form and the measured alternatives."""

import pytest

from chatqna.multiturn.rerank_query import TEXT_FORMS, conversation_text

ASKED = ("How do I export my data?", "  ", "Can we use single sign-on with Okta?")
FOLLOW_UP = "Which plans include it?"


def test_the_shipped_form_is_the_follow_up_then_the_newest_earlier_question() -> None:
    assert conversation_text(FOLLOW_UP, ASKED) == f"{FOLLOW_UP}\n{ASKED[2]}"


@pytest.mark.parametrize(
    ("form", "expected"),
    [
        ("query", FOLLOW_UP),
        ("query_newest", f"{FOLLOW_UP}\n{ASKED[2]}"),
        ("newest_query", f"{ASKED[2]}\n{FOLLOW_UP}"),
        ("all_query", f"{ASKED[0]}\n{ASKED[2]}\n{FOLLOW_UP}"),
    ],
)
def test_each_form_blank_questions_skipped(form: str, expected: str) -> None:
    assert form in TEXT_FORMS
    assert conversation_text(FOLLOW_UP, ASKED, form) == expected


def test_without_earlier_questions_the_follow_up_stands_alone() -> None:
    for form in TEXT_FORMS:
        assert conversation_text(FOLLOW_UP, (), form) == FOLLOW_UP
    with pytest.raises(ValueError, match="unknown rerank text form"):
        conversation_text(FOLLOW_UP, ASKED, "sideways")
