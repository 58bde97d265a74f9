"""BM25: the shared tokeniser and hand-computed Okapi scores over a tiny corpus."""

from __future__ import annotations

import math

import pytest

from chatqna.retrieval.bm25 import STOP_WORDS, BM25Index, tokenize

K1 = 1.2
B = 0.75

# Token lists after stop-word removal (pinned by test_corpus_tokens below):
#   0: cat sat mat                 (3 tokens)
#   1: dogs chase cat cat runs     (5 tokens)
#   2: birds sing                  (2 tokens)
CORPUS = [
    "The cat sat on the mat.",
    "Dogs chase the cat, and the cat runs!",
    "Birds sing.",
]
N = 3
AVG_LEN = (3 + 5 + 2) / 3


def idf(df: int, n: int = N) -> float:
    return math.log(1 + (n - df + 0.5) / (df + 0.5))


def term_score(df: int, tf: int, length: int, avg: float = AVG_LEN) -> float:
    return idf(df) * tf * (K1 + 1) / (tf + K1 * (1 - B + B * length / avg))


# --- tokenize -------------------------------------------------------------------------------


def test_tokenize_lowercases() -> None:
    assert tokenize("Refund POLICY Invoice") == ["refund", "policy", "invoice"]


def test_tokenize_drops_stop_words() -> None:
    assert tokenize("How long do I have to return it?") == ["long", "return"]
    assert {"the", "and", "how", "do", "i"} <= STOP_WORDS


def test_tokenize_splits_on_non_word_characters() -> None:
    assert tokenize("e-mail: support@example.com/help (24h)") == [
        "e",
        "mail",
        "support",
        "example",
        "com",
        "help",
        "24h",
    ]
    # Underscores and digits are word characters.
    assert tokenize("snake_case v2.0") == ["snake_case", "v2", "0"]


def test_tokenize_stop_words_are_matched_after_lowercasing() -> None:
    assert tokenize("THE And OF") == []


def test_tokenize_empty() -> None:
    assert tokenize("") == []
    assert tokenize("  ... !!! ") == []


def test_corpus_tokens() -> None:
    assert [tokenize(text) for text in CORPUS] == [
        ["cat", "sat", "mat"],
        ["dogs", "chase", "cat", "cat", "runs"],
        ["birds", "sing"],
    ]


# --- scoring --------------------------------------------------------------------------------


def test_idf_matches_documented_formula() -> None:
    index = BM25Index(CORPUS)
    assert len(index) == 3
    assert index.idf("cat") == pytest.approx(math.log(1 + 1.5 / 2.5))
    assert index.idf("mat") == pytest.approx(math.log(1 + 2.5 / 1.5))
    assert index.idf("unknown") == pytest.approx(math.log(1 + 3.5 / 0.5))
    # The non-negative variant: even a term in every document has a positive idf.
    assert BM25Index(["cat", "cat", "cat"]).idf("cat") > 0


def test_hand_computed_scores_for_three_documents() -> None:
    index = BM25Index(CORPUS)
    scores = index.scores(["cat", "mat"])
    expected_0 = term_score(df=2, tf=1, length=3) + term_score(df=1, tf=1, length=3)
    expected_1 = term_score(df=2, tf=2, length=5)
    assert set(scores) == {0, 1}  # document 2 has neither term
    assert scores[0] == pytest.approx(expected_0, rel=1e-12)
    assert scores[1] == pytest.approx(expected_1, rel=1e-12)
    # Literal values, so the test does not only mirror the formula.
    assert scores[0] == pytest.approx(0.4901 + 1.0227, abs=1e-3)
    assert scores[1] == pytest.approx(0.5666, abs=1e-3)


def test_term_frequency_and_length_normalisation() -> None:
    index = BM25Index(CORPUS)
    scores = index.scores(["cat"])
    # tf=2 in a longer document still beats tf=1 in a shorter one with these constants.
    assert scores[1] == pytest.approx(term_score(2, 2, 5))
    assert scores[0] == pytest.approx(term_score(2, 1, 3))
    assert scores[1] > scores[0]
    # With b=0 length no longer matters: only tf does.
    flat = BM25Index(CORPUS, b=0.0).scores(["cat"])
    assert flat[0] == pytest.approx(idf(2) * 1 * 2.2 / (1 + 1.2))
    assert flat[1] == pytest.approx(idf(2) * 2 * 2.2 / (2 + 1.2))


def test_repeated_query_terms_count_once() -> None:
    index = BM25Index(CORPUS)
    assert index.scores(["cat", "cat", "cat"]) == index.scores(["cat"])


def test_documents_without_query_terms_are_absent() -> None:
    index = BM25Index(CORPUS)
    assert index.scores(["birds"]) == {2: pytest.approx(term_score(1, 1, 2))}
    assert index.scores(["zebra"]) == {}
    assert index.top("zebra giraffe", 10) == []


def test_stop_word_only_query_has_no_hits() -> None:
    index = BM25Index(CORPUS)
    # "the", "on" and "and" occur in the corpus text but are never indexed.
    assert index.top("the on and of", 10) == []
    assert index.scores(["the"]) == {}


def test_top_orders_by_score_and_applies_k() -> None:
    index = BM25Index(CORPUS)
    hits = index.top("Cat MAT", 10)
    assert [position for position, _ in hits] == [0, 1]
    assert hits[0][1] > hits[1][1]
    assert index.top("cat mat", 1) == [hits[0]]
    assert index.top("cat mat", 0) == []


def test_top_uses_the_tokeniser_on_the_query() -> None:
    index = BM25Index(CORPUS)
    assert index.top("Where is the CAT?", 5) == index.top("cat", 5)


def test_top_breaks_ties_by_position() -> None:
    index = BM25Index(["pie crust", "apple pie", "banana", "apple pie", "pie apple"])
    hits = index.top("apple", 10)
    assert [position for position, _ in hits] == [1, 3, 4]
    assert hits[0][1] == hits[1][1] == hits[2][1]
    assert [position for position, _ in index.top("apple", 2)] == [1, 3]


def test_empty_index() -> None:
    index = BM25Index([])
    assert len(index) == 0
    assert index.top("anything", 5) == []


def test_history_terms_are_weighted_and_never_override_query_terms() -> None:
    from chatqna.retrieval.bm25 import BM25Index, query_term_weights

    assert query_term_weights("How long do I have?", "export my data long", 0.5) == {
        "long": 1.0,
        "export": 0.5,
        "data": 0.5,
    }
    assert query_term_weights("How long?", "export data", 0.0) == {"long": 1.0}
    index = BM25Index(["export your data", "how long is data kept", "cats"])
    plain = index.weighted_scores({"long": 1.0})
    weighted = index.weighted_scores({"long": 1.0, "export": 0.5})
    assert weighted[1] == plain[1]
    assert weighted[0] == 0.5 * index.scores(["export"])[0]
    assert index.top("how long", 3, "export", 0.0) == index.top("how long", 3)
