"""The previous answer as BM25 evidence: its few terms of highest IDF, nothing already asked."""

from __future__ import annotations

from chatqna.multiturn.evidence import answer_terms, informative_terms, previous_answer
from chatqna.multiturn.history import Conversation, Message
from chatqna.retrieval.query import tokenize

IDF = {"export": 1.0, "zip": 2.5, "workspace": 0.5, "archive": 2.5, "days": 0.2, "kept": 1.5}


def idf(term: str) -> float | None:
    return IDF.get(term)


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
