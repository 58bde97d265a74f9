"""The candidates measured against the shipped blend: the adaptive alphas and the previous
answer's terms as BM25 evidence."""

from __future__ import annotations

import math

import pytest

from chatqna.evaluation.follow_up_variants.candidates import (
    answer_terms,
    content_word_alpha,
    corpus_idf,
    informative_terms,
    previous_answer,
    top_score_alpha,
)
from chatqna.multiturn.history import Conversation, Message
from chatqna.retrieval.query import tokenize

IDF = {"export": 1.0, "zip": 2.5, "workspace": 0.5, "archive": 2.5, "days": 0.2, "kept": 1.5}
ASKED = ("How do I export my data?", "  ", "Can we use single sign-on with Okta?")
FOLLOW_UP = "Which plans include it?"


def idf(term: str) -> float | None:
    return IDF.get(term)


# --- the adaptive alpha -----------------------------------------------------------------
def test_content_word_alpha_grows_with_what_the_follow_up_says() -> None:
    assert content_word_alpha(0) == 0.0
    assert content_word_alpha(3, half=3.0) == pytest.approx(0.5)
    values = [content_word_alpha(words) for words in range(12)]
    assert values == sorted(values) and len(set(values)) == len(values)
    assert 0.65 < content_word_alpha(3) < 0.7 < content_word_alpha(4) < 0.75
    assert values[-1] < 1.0
    with pytest.raises(ValueError, match="half"):
        content_word_alpha(2, half=0.0)


def test_top_score_alpha_moves_the_fixed_alpha_by_how_sure_the_own_hit_is() -> None:
    assert top_score_alpha(0.57, 0.7) == pytest.approx(0.7)
    assert top_score_alpha(0.67, 0.7) == pytest.approx(0.8)
    assert top_score_alpha(0.37, 0.7) == pytest.approx(0.5)
    assert top_score_alpha(0.99, 0.9, typical=0.5) == 1.0
    assert top_score_alpha(-0.5, 0.2, typical=0.5) == 0.0


# --- the previous answer as BM25 evidence -----------------------------------------------
def test_informative_terms_keeps_the_rarest_known_terms_in_order_of_idf() -> None:
    tokens = ["workspace", "zip", "unknown", "archive", "export", "zip", "days"]
    assert informative_terms(tokens, idf, (), 3) == ("zip", "archive", "export")
    assert informative_terms(tokens, idf, ["zip"], 2) == ("archive", "export")
    assert informative_terms(tokens, idf, (), 0) == ()


def test_previous_answer_is_the_newest_assistant_message() -> None:
    history = (
        Message("user", "q1"),
        Message("assistant", "first answer"),
        Message("user", "q2"),
        Message("assistant", "  "),
    )
    assert previous_answer(Conversation("q3", history)) == "first answer"
    assert previous_answer(Conversation("q1", ())) == ""


def test_answer_terms_leave_out_what_the_follow_up_and_the_questions_hold() -> None:
    history = (
        Message("user", "How do I export my workspace?"),
        Message("assistant", "The export is a zip archive of the workspace, kept 30 days."),
    )
    conversation = Conversation("How long is the zip kept?", history)
    terms = answer_terms(conversation, tokenize, idf, ["How do I export my workspace?"], 5)
    assert terms == ("archive", "days")
    assert answer_terms(Conversation("And then?", ()), tokenize, idf) == ()


def test_corpus_idf_is_the_bm25_idf_of_the_terms_the_corpus_holds() -> None:
    idf_of = corpus_idf(["Export the workspace.", "The export zip.", "Billing plans."])
    assert idf_of("export") == pytest.approx(math.log(1.0 + 1.5 / 2.5))
    assert idf_of("zip") == pytest.approx(math.log(1.0 + 2.5 / 1.5))
    assert idf_of("okta") is None
