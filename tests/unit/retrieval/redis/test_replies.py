"""Parsing search replies: hits that come back without their fields, and replies of a shape
the store does not know."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from chatqna.errors import IndexUnavailable
from chatqna.retrieval.redis.consistency import Ranking, read_ranked, seen_digests
from chatqna.retrieval.redis.replies import (
    UNSCORED,
    UnexpectedReply,
    dense_results,
    digest_hits,
    knn_hits,
    unavailable_on_error,
    unscored,
)

# What a cluster node whose index does not hold `digest` (format 2) returns for a KNN search:
# no field at all, not even the distance.
WITHOUT_FIELDS = [2, b"k:a", [b"dist", b"0.25", b"digest", b"da"], b"k:b", None]


def test_a_knn_hit_without_its_fields_is_kept_unscored_and_without_a_digest() -> None:
    hits = knn_hits(WITHOUT_FIELDS)
    assert hits == [("k:a", 0.75, {"dist": b"0.25", "digest": b"da"}), ("k:b", UNSCORED, {})]
    assert unscored(hits) and not unscored(hits[:1])
    # A dense-only search skips a hit it has no fields of, as one since deleted.
    assert dense_results([(UNSCORED, {}), (0.5, None)]) == []


@pytest.mark.anyio
async def test_a_knn_hit_without_a_digest_counts_as_changed_and_is_dropped() -> None:
    hits = knn_hits(WITHOUT_FIELDS)
    rankings: list[Ranking] = []

    async def rank() -> Ranking:
        digests = seen_digests({key: fields.get("digest") for key, _, fields in hits})
        rankings.append(Ranking([(key, s) for key, s, _ in hits], {}, {}, digests))
        return rankings[-1]

    async def read(keys: Sequence[str]) -> list[dict[str, Any] | None]:
        return [{"digest": b"d" + key[-1:].encode()} for key in keys]  # every passage stored

    final, rows = await read_ranked(rank, read)
    assert len(rankings) == 2  # ranked once more, then dropped
    assert rows == [{"digest": b"da"}, None]
    assert final.keys == ["k:a", "k:b"]


@pytest.mark.parametrize(
    ("parse", "reply"),
    [
        (knn_hits, [1, b"k:a", [b"dist", b"far"]]),
        (knn_hits, [1, b"k:a", 7]),
        (digest_hits, [1, b"k:a"]),
        (digest_hits, None),
    ],
)
@pytest.mark.anyio
async def test_a_reply_of_an_unknown_shape_is_the_index_being_unavailable(
    parse: Any, reply: Any
) -> None:
    with pytest.raises(UnexpectedReply, match=parse.__name__):
        parse(reply)
    with pytest.raises(IndexUnavailable, match="search failed: unexpected reply") as raised:
        async with unavailable_on_error("rag-redis", "127.0.0.1:6379", "search"):
            parse(reply)
    assert (raised.value.status_code, raised.value.code) == (503, "index_unavailable")
