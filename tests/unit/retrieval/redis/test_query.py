"""The RediSearch commands of the Redis stores."""

from __future__ import annotations

import numpy as np
import pytest
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeout

from chatqna.backends.protocols import SearchQuery, SourceInfo
from chatqna.errors import IndexUnavailable, QueryNotSearchable
from chatqna.retrieval.query import WeightedQuery
from chatqna.retrieval.redis.query import (
    bm25_aggregate,
    bm25_query,
    bm25_search,
    knn_search,
    search_text,
)
from chatqna.retrieval.redis.replies import (
    dense_results,
    digest_hits,
    knn_hits,
    source_info,
    straddles,
    top_bm25,
    unavailable_on_error,
)
from tests.unit.retrieval.test_query import longest_message


def test_knn_search_asks_for_distances_and_digests_or_every_field() -> None:
    vector = np.ones(4, dtype=np.float64)
    args = knn_search("idx", vector, 7, fields=False)
    assert args[:3] == ["FT.SEARCH", "idx", "*=>[KNN 7 @embedding $vec AS dist]"]
    at = args.index("RETURN")
    assert args[at : at + 4] == ["RETURN", 2, "dist", "digest"]
    assert args[args.index("SORTBY") + 1] == "dist" and args[args.index("DIALECT") + 1] == 2
    assert args[args.index("LIMIT") + 1 : args.index("LIMIT") + 3] == [0, 7]
    assert args[-1] == np.ones(4, dtype=np.float32).tobytes()  # float32 whatever came in
    full = knn_search("idx", vector, 7, fields=True)
    assert full[full.index("RETURN") + 1] == 8 and {"embedding", "digest"} <= set(full)


def test_bm25_search_and_its_tie_breaker() -> None:
    query = bm25_query(WeightedQuery.parse("refund-policy @card", "", 0.0))
    assert query == "@terms:(refund | policy | card)"
    args = bm25_search("idx", query, 50)
    assert {"VERBATIM", "WITHSCORES"} <= set(map(str, args)) and "NOCONTENT" not in args
    assert args[args.index("SCORER") + 1] == "BM25STD"
    assert args[args.index("LIMIT") + 2] == 51  # one more: does a tie straddle the cut?
    assert args[args.index("RETURN") : args.index("RETURN") + 3] == ["RETURN", 1, "digest"]
    by_key = bm25_aggregate("idx", query, 50, "__key")
    assert by_key[by_key.index("LOAD") : by_key.index("LOAD") + 3] == ["LOAD", 1, "@__key"]
    with_digest = bm25_aggregate("idx", query, 50, "__key", digest=True)
    at = with_digest.index("LOAD")
    assert with_digest[at : at + 4] == ["LOAD", 2, "@__key", "@digest"]
    by_id = bm25_aggregate("idx", query, 50, "chunk_id")
    assert by_id[by_id.index("LOAD") + 1 : by_id.index("LOAD") + 4] == [2, "@__key", "@chunk_id"]
    assert by_id[by_id.index("SORTBY") + 1 : by_id.index("SORTBY") + 6] == [
        4, "@__score", "DESC", "@chunk_id", "ASC",
    ]  # fmt: skip
    assert bm25_query(WeightedQuery.parse("is it the", "", 0.0)) is None


def test_replies_parse_and_ties_order_by_the_given_key() -> None:
    assert knn_hits([2, b"k:a", [b"dist", b"0.25"], b"k:b", [b"dist", b"0.5"]]) == [
        ("k:a", 0.75, {"dist": b"0.25"}),
        ("k:b", 0.5, {"dist": b"0.5"}),
    ]
    hits, _ = digest_hits(
        [4, b"k:c", b"2.0", [b"digest", b"dc"], b"k:b", b"1.0", [b"digest", b"db"],
         b"k:a", b"1.0", [b"digest", b"da"], b"k:d", b"1.0", None]
    )  # fmt: skip
    assert hits == [("k:c", 2.0), ("k:b", 1.0), ("k:a", 1.0), ("k:d", 1.0)]
    assert straddles(hits, 2) and not straddles(hits, 1)
    # Ties by key; by a key's last part when the order key says so.
    assert list(top_bm25(hits, 3)) == ["k:c", "k:a", "k:b"]
    assert list(top_bm25(hits, 3, order_key=lambda k: k[::-1])) == ["k:c", "k:a", "k:b"]
    # The exact order of FT.AGGREGATE replaces FT.SEARCH's when the tie straddles.
    assert top_bm25(hits, 2, ["k:c", "k:a"]) == {"k:c": 2.0, "k:a": 1.0}


def nesting(query: str) -> int:
    deepest = level = 0
    for at, char in enumerate(query):
        if query[at - 1 : at] == "\\":
            continue
        level += {"(": 1, ")": -1}.get(char, 0)
        deepest = max(deepest, level)
    return deepest


def test_the_query_of_any_accepted_message_nests_shallowly() -> None:
    text = longest_message()
    for weighted in (WeightedQuery.parse(text), WeightedQuery.parse(text, text + " extra", 0.3)):
        query = bm25_query(weighted)
        assert query is not None and nesting(query) <= 21


@pytest.mark.anyio
async def test_a_query_redisearch_cannot_parse_is_not_an_outage() -> None:
    overflow = ResponseError(
        "Command # 2 (FT.SEARCH idx @terms:(w0 | w1 ...) of pipeline caused error: "
        "Parser stack overflow. Try moving nested parentheses more to the left"
    )
    for error in (overflow, ResponseError("Syntax error at offset 9 near w1")):
        with pytest.raises(QueryNotSearchable) as caught:
            async with unavailable_on_error("idx", "redis://h:1", "search"):
                raise error
        assert caught.value.status_code == 500 and "w0 | w1" not in caught.value.message
    # Outside a search (writes, listing, opening) the same words are an outage of the index.
    with pytest.raises(IndexUnavailable):
        async with unavailable_on_error("idx", "redis://h:1", "replacing sources"):
            raise overflow
    for error in (ResponseError("Unknown index name"), RedisTimeout("Timeout reading")):
        with pytest.raises(IndexUnavailable):
            async with unavailable_on_error("idx", "redis://h:1", "search"):
                raise error


def test_a_searchs_bm25_query_blends_its_history_at_the_historys_weight() -> None:
    query = SearchQuery(
        "refund policy", np.ones(4, np.float32), 4, bm25_history="card", bm25_history_weight=0.5
    )
    assert search_text(query) == bm25_query(WeightedQuery.parse("refund policy", "card", 0.5))
    alone = SearchQuery("refund policy", np.ones(4, np.float32), 4)
    assert search_text(alone) == "@terms:(refund | policy)" != search_text(query)
    assert search_text(SearchQuery("is it the", np.ones(4, np.float32), 4)) is None


def test_dense_results_keep_the_order_and_skip_passages_without_fields() -> None:
    fields = {
        "chunk_id": b"c1",
        "content": b"text",
        "source": b"a.md",
        "chunk_index": b"2",
        "embedding": np.ones(4, np.float32).tobytes(),
    }
    results = dense_results([(0.9, fields), (0.8, None), (0.7, {**fields, "chunk_id": b"c2"})])
    assert [(r.chunk.id, r.score, r.scores) for r in results] == [
        ("c1", 0.9, {"dense": 0.9}),
        ("c2", 0.7, {"dense": 0.7}),
    ]
    assert results[0].chunk.index == 2 and results[0].embedding is not None


def test_a_source_row_becomes_its_source_info() -> None:
    assert source_info("a.md", [b"h1", b"3"]) == SourceInfo("a.md", 3, "h1")
    assert source_info("b.md", [None, None]) == SourceInfo("b.md", 0, "")
