"""The RediSearch BM25STD reference model: the formula, weighted queries and ties."""

from __future__ import annotations

import math

import pytest

from chatqna.retrieval.query import TermUnion, WeightedQuery, query_tree, tokenize
from tests.oracles.redisearch_bm25 import BM25Index, bm25_idf

K1 = 1.2
B = 0.5

# Token lists after stop-word removal (pinned by test_corpus_tokens below):
#   0: cat sat mat                       (3 tokens)
#   1: dogs chase cat cat runs           (5 tokens)
#   2: birds sing                        (2 tokens)
#   3: export data csv export takes minute (6 tokens)
#   4: long data kept cancel             (4 tokens)
CORPUS = [
    "The cat sat on the mat.",
    "Dogs chase the cat, and the cat runs!",
    "Birds sing.",
    "Export your data as CSV; export takes a minute.",
    "How long is data kept after you cancel?",
]
N = 5
AVG_LEN = (3 + 5 + 2 + 6 + 4) / 5


def idf(df: int, n: int = N) -> float:
    return math.log(1 + (n - df + 0.5) / (df + 0.5))


def term_score(df: int, tf: int, length: int, avg: float = AVG_LEN) -> float:
    return idf(df) * tf * (K1 + 1) / (tf + K1 * (1 - B + B * length / avg))


def q(text: str, history: str = "", weight: float = 0.0) -> WeightedQuery:
    return WeightedQuery.parse(text, history, weight)


def test_corpus_tokens() -> None:
    assert [tokenize(text) for text in CORPUS] == [
        ["cat", "sat", "mat"],
        ["dogs", "chase", "cat", "cat", "runs"],
        ["birds", "sing"],
        ["export", "data", "csv", "export", "takes", "minute"],
        ["long", "data", "kept", "cancel"],
    ]


# --- scoring --------------------------------------------------------------------------------


def test_idf_is_the_documented_formula_in_single_precision() -> None:
    index = BM25Index(CORPUS)
    assert len(index) == N
    assert index.idf("cat") == pytest.approx(idf(2), rel=1e-7)
    assert index.idf("mat") == pytest.approx(idf(1), rel=1e-7)
    assert index.idf("unknown") == pytest.approx(idf(0), rel=1e-7)
    # RediSearch computes the ratio in single precision: ln(1 + 3.5 / 4.5) is 0.57536414490...
    # in double precision, 0.57536415235... as RediSearch (and the embedded index) has it.
    assert bm25_idf(7, 4) == 0.5753641523541424
    assert idf(4, 7) == 0.5753641449035618
    # The non-negative variant: even a term in every document has a positive idf.
    assert BM25Index(["cat", "cat", "cat"]).idf("cat") > 0


def test_hand_computed_scores() -> None:
    index = BM25Index(CORPUS)
    scores = index.scores(q("cat mat"))
    assert set(scores) == {0, 1}  # no other document has either term
    assert scores[0] == pytest.approx(term_score(2, 1, 3) + term_score(1, 1, 3), rel=1e-6)
    assert scores[1] == pytest.approx(term_score(2, 2, 5), rel=1e-6)


def test_scores_are_bit_for_bit_those_of_redisearch() -> None:
    """Literal BM25STD scores from RediSearch 2.10.5 (FT.SEARCH ... VERBATIM SCORER BM25STD
    WITHSCORES) over the same five passages; the integration tests check this live."""
    index = BM25Index(CORPUS)
    assert index.scores(q("cat mat")) == {0: 2.4272580051895893, 1: 1.1498694450760754}
    assert index.scores(q("cat")) == {0: 0.939527469338628, 1: 1.1498694450760754}
    assert index.scores(q("how long", "export data", 0.5)) == {
        3: 1.2565912921216413,
        4: 1.8240287496650551,
    }
    assert index.scores(q("what about runs", "cat sat birds", 0.3)) == {
        0: 0.7281774015568768,
        1: 1.6427683190324425,
        2: 0.4815548847097278,
    }


def test_term_frequency_and_length_normalisation() -> None:
    index = BM25Index(CORPUS)
    scores = index.scores(q("cat"))
    # tf=2 in a longer passage beats tf=1 in a shorter one with these constants.
    assert scores[1] > scores[0]
    # Same tf, same df: the shorter passage scores higher.
    index = BM25Index(["zebra", "zebra plains plains plains", "lions"])
    short, long = index.scores(q("zebra"))[0], index.scores(q("zebra"))[1]
    assert short > long


def test_repeated_query_terms_count_once() -> None:
    index = BM25Index(CORPUS)
    assert index.scores(q("cat cat cat")) == index.scores(q("cat"))


def test_documents_without_query_terms_are_absent() -> None:
    index = BM25Index(CORPUS)
    assert set(index.scores(q("birds"))) == {2}
    assert index.scores(q("zebra")) == {}
    assert index.top(q("zebra giraffe"), 10) == []


def test_stop_word_only_query_has_no_hits() -> None:
    index = BM25Index(CORPUS)
    # "the", "on" and "and" occur in the corpus text but are never indexed.
    assert index.top(q("the on and of"), 10) == []
    assert index.scores(q("the")) == {}


def test_top_orders_by_score_and_applies_k() -> None:
    index = BM25Index(CORPUS)
    hits = index.top(q("Cat MAT"), 10)
    assert [position for position, _ in hits] == [0, 1]
    assert hits[0][1] > hits[1][1]
    assert index.top(q("cat mat"), 1) == [hits[0]]
    assert index.top(q("cat mat"), 0) == []


def test_top_uses_the_tokeniser_on_the_query() -> None:
    index = BM25Index(CORPUS)
    assert index.top(q("Where is the CAT?"), 5) == index.top(q("cat"), 5)


def test_ties_go_to_the_smaller_key_even_across_the_cut() -> None:
    texts = ["pie crust", "apple pie", "banana", "apple pie", "pie apple"]
    by_position = BM25Index(texts)
    hits = by_position.top(q("apple"), 10)
    assert [position for position, _ in hits] == [1, 3, 4]
    assert hits[0][1] == hits[1][1] == hits[2][1]
    assert [position for position, _ in by_position.top(q("apple"), 2)] == [1, 3]
    by_key = BM25Index(texts, keys=["e", "d", "c", "b", "a"])
    assert [position for position, _ in by_key.top(q("apple"), 10)] == [4, 3, 1]
    assert [position for position, _ in by_key.top(q("apple"), 2)] == [4, 3]


def test_keys_must_match_the_documents() -> None:
    with pytest.raises(ValueError):
        BM25Index(["a", "b"], keys=["only one"])


def test_empty_index() -> None:
    index = BM25Index([])
    assert len(index) == 0
    assert index.top(q("anything"), 5) == []
    assert index.scores(q("anything")) == {}


# --- weighted queries: the history-aware leg ------------------------------------------------


def test_history_terms_add_their_scores_times_the_weight() -> None:
    index = BM25Index(CORPUS)
    plain = index.scores(q("how long"))
    weighted = index.scores(q("how long", "export data", 0.5))
    export = index.scores(q("export"))[3]
    data = index.scores(q("data"))
    # Passage 4 holds "long" and "data": query score plus half the history score.
    assert weighted[4] == pytest.approx(plain[4] + 0.5 * data[4], rel=1e-12)
    # Passage 3 only holds history terms.
    assert weighted[3] == pytest.approx(0.5 * (export + data[3]), rel=1e-12)
    assert index.top(q("how long", "export", 0.0), 3) == index.top(q("how long"), 3)


def test_only_history_terms_match() -> None:
    index = BM25Index(CORPUS)
    # "zebra" is nowhere; the history words alone rank the passages.
    scores = index.scores(q("zebra", "export data", 0.5))
    assert set(scores) == {3, 4}
    assert scores[4] == 0.5 * index.scores(q("data"))[4]
    assert index.top(q("zebra", "unknown words", 0.5), 3) == []


def test_a_single_history_term_keeps_its_weight() -> None:
    index = BM25Index(CORPUS)
    single = index.scores(q("birds", "export", 0.3))
    assert single[3] == 0.3 * index.scores(q("export"))[3]
    assert query_tree(q("birds", "export", 0.3)) == TermUnion(
        ("birds", TermUnion(("export", "export"), 0.15))
    )


def test_many_terms_score_the_same_however_the_tree_nests() -> None:
    texts = [" ".join(f"w{(i * j) % 23}" for j in range(1, 12)) for i in range(40)]
    index = BM25Index(texts)
    words = [f"w{i}" for i in range(23)]
    nested = index.scores(WeightedQuery(tuple(words)))
    for position, score in nested.items():
        flat = sum(index.scores(WeightedQuery((w,))).get(position, 0.0) for w in words)
        assert score == pytest.approx(flat, rel=1e-12)
