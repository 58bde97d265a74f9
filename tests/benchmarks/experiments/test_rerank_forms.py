"""The reranker's text forms `benchmarks/rerank_query.py` measures."""

from __future__ import annotations

import pytest

from benchmarks.experiments.rerank_forms import TEXT_FORMS, rerank_text
from chatqna.multiturn.rerank_query import conversation_text

ASKED = ("How do I export my data?", "  ", "Can we use single sign-on with Okta?")
FOLLOW_UP = "Which plans include it?"


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
    assert rerank_text(FOLLOW_UP, ASKED, form) == expected


def test_the_shipped_form_is_the_services_conversation_text() -> None:
    assert rerank_text(FOLLOW_UP, ASKED, "query_newest") == conversation_text(FOLLOW_UP, ASKED)


def test_without_earlier_questions_every_form_is_the_follow_up_alone() -> None:
    for form in TEXT_FORMS:
        assert rerank_text(FOLLOW_UP, (), form) == FOLLOW_UP
    with pytest.raises(ValueError, match="unknown rerank text form"):
        rerank_text(FOLLOW_UP, ASKED, "sideways")
