"""The tantivy BM25 leg: incremental writes, deletes by source, boosted history terms, and
the same tokens as the query tokeniser."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from chatqna.retrieval.embedded.lexical import LexicalIndex, analyzer, words
from chatqna.retrieval.query import STOP_WORDS, WeightedQuery, tokenize

ANALYZER_INSTANCE = analyzer()
# Letters, marks, digits, punctuation, spaces, and whole stop words and long words.
ALPHABET = [*"aZé_ 9.,-'\tİıßΣσςǅﬃ\u0301\u0307日本", *sorted(STOP_WORDS)[:20], "x" * 70, "é" * 33]


@pytest.fixture
def lexical(tmp_path: Path) -> LexicalIndex:
    index = LexicalIndex(tmp_path)
    index.write(
        [],
        [
            (1, "a.md", "Refunds reach the original card within ten days."),
            (2, "a.md", "Shipping takes three days by courier."),
            (3, "b.md", "Passwords are reset from the login page."),
            (4, "b.md", "Refund requests need the invoice number."),
        ],
    )
    return index


def test_top_ranks_matching_rows_best_first(lexical: LexicalIndex) -> None:
    rows, scores = lexical.top(WeightedQuery.parse("How do I get a refund for my card?"), 10)
    assert sorted(rows.tolist()) == [1, 4]  # "card" in 1, "refund" in 4 ("refunds" differs)
    rows, scores = lexical.top(WeightedQuery.parse("refund to the original card"), 10)
    assert rows.tolist() == [1, 4]  # two terms beat one
    assert scores[0] > scores[1] > 0
    assert lexical.top(WeightedQuery.parse("the and of"), 10)[0].tolist() == []
    assert lexical.top(WeightedQuery.parse("courier"), 0)[0].tolist() == []


def test_writes_replace_a_source_and_persist(lexical: LexicalIndex, tmp_path: Path) -> None:
    lexical.write(["a.md"], [(5, "a.md", "Couriers now deliver parcels on Sundays.")])
    assert lexical.count() == 3
    assert lexical.top(WeightedQuery.parse("courier shipping"), 10)[0].tolist() == []
    assert lexical.top(WeightedQuery.parse("sundays"), 10)[0].tolist() == [5]
    reopened = LexicalIndex(tmp_path)
    assert reopened.count() == 3
    assert reopened.top(WeightedQuery.parse("sundays"), 10)[0].tolist() == [5]


def test_history_terms_count_at_their_weight(lexical: LexicalIndex) -> None:
    alone = lexical.top(WeightedQuery.parse("invoice"), 10)
    history_only = WeightedQuery((), ("invoice",), 0.3)
    weighted = lexical.top(history_only, 10)
    assert weighted[0].tolist() == alone[0].tolist() == [4]
    assert weighted[1][0] == pytest.approx(0.3 * alone[1][0], rel=1e-5)
    both = lexical.top(WeightedQuery.parse("login", "invoice number", 0.3), 10)
    assert both[0].tolist() == [3, 4]  # its own word weighs more than an earlier one


def test_rebuild_replaces_everything(lexical: LexicalIndex) -> None:
    lexical.rebuild([[(10, "c.md", "Zebras graze at dawn.")], [(11, "c.md", "Lions hunt.")]])
    assert lexical.count() == 2
    assert lexical.top(WeightedQuery.parse("zebras lions refund"), 10)[0].tolist() in (
        [10, 11],
        [11, 10],
    )


@given(st.lists(st.sampled_from(ALPHABET), max_size=60).map("".join))
@example("How do I get a REFUND? naïve café straße σοφία x_y İstanbul " + "z" * 70 + " ǅ ﬃ")
def test_indexed_tokens_are_the_query_tokenisers(text: str) -> None:
    assert list(ANALYZER_INSTANCE.analyze(words(text))) == tokenize(text)
