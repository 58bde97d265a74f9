"""The automatic standalone rule."""

from __future__ import annotations

from benchmarks.experiments.standalone import judge_standalone


def test_a_rewrite_that_restores_the_subject_is_standalone() -> None:
    verdict, why = judge_standalone(
        "How long is my data kept after I cancel my plan?",
        "How long do I have?",
        "How long is my data kept after I cancel my plan?",
    )
    assert verdict and why == "standalone"


def test_pronouns_left_in_the_rewrite() -> None:
    verdict, why = judge_standalone(
        "Is that possible after I cancel?",
        "Is that possible after I cancel?",
        "Can I export my data after I cancel?",
    )
    assert not verdict and "that" in why


def test_subject_not_restored() -> None:
    verdict, why = judge_standalone(
        "How long do I have left?",
        "How long do I have?",
        "How long is my data kept after cancelling?",
    )
    assert not verdict and why == "subject not restored"


def test_already_standalone_message_returned_unchanged() -> None:
    question = "Do promo credits expire?"
    assert judge_standalone(question, question, question) == (True, "standalone")


def test_failed_rewrite() -> None:
    assert judge_standalone(None, "And then?", "What happens next?") == (False, "rewrite failed")
