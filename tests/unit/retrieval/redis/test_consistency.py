"""Checking a search's passages against the versions its ranking saw."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from chatqna.retrieval.redis.consistency import (
    DISAGREED,
    Ranking,
    current_rows,
    read_ranked,
    seen_digests,
)
from chatqna.retrieval.redis.replies import aggregate_digests, digest_hits


def ranking(digests: dict[str, Any]) -> Ranking:
    return Ranking([(key, 1.0) for key in digests], {}, {}, digests)


def test_replies_carry_each_hits_digest() -> None:
    reply = [2, b"k:a", b"2.5", [b"digest", b"d1"], b"k:b", b"1.0", None]
    assert digest_hits(reply) == ([("k:a", 2.5), ("k:b", 1.0)], {"k:a": b"d1", "k:b": None})
    rows = [2, [b"__key", b"k:b", b"__score", b"1", b"digest", b"d2"], [b"__key", b"k:a"]]
    assert aggregate_digests(rows) == {"k:b": b"d2", "k:a": None}


def test_a_passage_two_legs_saw_at_two_versions_matches_no_stored_one() -> None:
    seen = seen_digests({"k:a": b"d1", "k:b": b"d2"}, {"k:b": b"d3", "k:c": b"d4"})
    assert seen == {"k:a": b"d1", "k:b": DISAGREED, "k:c": b"d4"}
    rows = [{"digest": b"d1"}, {"digest": b"d3"}, None]
    assert current_rows(ranking(seen), rows) == [{"digest": b"d1"}, None, None]


@pytest.mark.anyio
async def test_a_read_that_finds_another_version_ranks_once_more_then_drops_it() -> None:
    rankings = iter([{"k:a": b"old", "k:b": b"b"}, {"k:a": b"older", "k:b": b"b"}])
    rounds: list[list[str]] = []

    async def rank() -> Ranking:
        return ranking(next(rankings))

    async def read(keys: Sequence[str]) -> list[dict[str, Any] | None]:
        rounds.append(list(keys))
        return [{"digest": b"new" if key == "k:a" else b"b"} for key in keys]

    final, rows = await read_ranked(rank, read)
    assert len(rounds) == 2 and final.digests["k:a"] == b"older"
    assert rows == [None, {"digest": b"b"}]
