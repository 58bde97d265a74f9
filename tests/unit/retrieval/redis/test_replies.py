"""Parsing search replies: hits that come back without their fields, replies of a shape
the store does not know, and errors of the code that builds records from a well-formed
reply, which are not blamed on the reply."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from chatqna.errors import IndexUnavailable
from chatqna.retrieval.redis import replies
from chatqna.retrieval.redis.consistency import Ranking, read_ranked, seen_digests
from chatqna.retrieval.redis.query import RETURNED
from chatqna.retrieval.redis.replies import (
    UNSCORED,
    UnexpectedReply,
    dense_results,
    digest_hits,
    hybrid_results,
    knn_hits,
    source_info,
    stored_fields,
    unavailable_on_error,
    unscored,
)

# What a cluster node whose index does not hold `digest` returns for a KNN search:
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


VECTOR = np.array([0.6, 0.8], dtype=np.float32)
STORED = {
    "chunk_id": b"c1",
    "content": b"Export from Settings.",
    "source": b"export.md",
    "title": b"Export",
    "chunk_index": b"0",
    "embedding": VECTOR.tobytes(),
    "digest": b"d1",
}


def test_well_formed_rows_become_records() -> None:
    (dense,) = dense_results([(0.5, STORED)])
    assert (dense.chunk.id, dense.chunk.source, dense.score) == ("c1", "export.md", 0.5)
    assert dense.embedding is not None and dense.embedding.tolist() == VECTOR.tolist()
    (fused,) = hybrid_results([("k:c1", 0.03)], {}, {"k:c1": 2.0}, [STORED], VECTOR)
    assert fused.scores == {"dense": pytest.approx(1.0), "bm25": 2.0, "fusion": 0.03}
    info = source_info("export.md", [b"h1", b"3"])
    assert (info.source, info.chunks, info.content_hash) == ("export.md", 3, "h1")


@pytest.mark.parametrize(
    ("build", "name"),
    [
        (lambda: dense_results([(0.5, {"content": b"no id"})]), "stored_chunk"),
        (lambda: dense_results([(0.5, {**STORED, "chunk_index": b"first"})]), "stored_chunk"),
        (lambda: dense_results([(0.5, {**STORED, "embedding": b"odd"})]), "stored_chunk"),
        (
            lambda: hybrid_results([("k", 0.1)], {}, {}, [{**STORED, "embedding": b"odd"}], VECTOR),
            "stored_similarity",
        ),
        (lambda: source_info("export.md", [b"h1"]), "source_row"),
        (lambda: source_info("export.md", [b"h1", b"many"]), "source_row"),
    ],
)
def test_a_malformed_row_is_still_an_unexpected_reply(build: Any, name: str) -> None:
    with pytest.raises(UnexpectedReply, match=name):
        build()


class BuildBug(TypeError):
    """A programming error in our own record-building code."""


def broken(*args: Any, **kwargs: Any) -> Any:
    raise BuildBug("a record built with the wrong arguments")


@pytest.mark.parametrize("record", ["Chunk", "ScoredChunk"])
@pytest.mark.anyio
async def test_an_error_building_a_chunk_from_a_good_reply_is_not_blamed_on_the_reply(
    monkeypatch: pytest.MonkeyPatch, record: str
) -> None:
    monkeypatch.setattr(replies, record, broken)
    with pytest.raises(BuildBug):
        dense_results([(0.5, STORED)])
    with pytest.raises(BuildBug):  # raised as it is, not as the index being unavailable
        async with unavailable_on_error("rag-redis", "127.0.0.1:6379", "search"):
            hybrid_results([("k:c1", 0.03)], {"k:c1": 1.0}, {}, [STORED], VECTOR)


def test_an_error_building_a_source_from_a_good_reply_is_not_blamed_on_the_reply(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(replies, "SourceInfo", broken)
    with pytest.raises(BuildBug):
        source_info("export.md", [b"h1", b"3"])


def hmget_row(fields: dict[str, Any]) -> list[Any]:
    """What `HMGET key RETURNED...` returns for a hash of `fields`: nil for each one it lacks."""
    return [fields.get(name) for name in RETURNED]


def without(name: str) -> dict[str, Any]:
    return {key: value for key, value in STORED.items() if key != name}


# Not `chunk_id`: HMGET answers a key that no longer exists with nil for every field, so a
# row without it is a passage deleted since the ranking, skipped (`stored_fields`).
@pytest.mark.parametrize("missing", ["content", "source"])
@pytest.mark.anyio
async def test_a_passage_without_a_required_field_is_an_unexpected_reply_from_either_read(
    missing: str,
) -> None:
    read = stored_fields([hmget_row(without(missing))])  # the hybrid search's read
    knn = without(missing)  # a dense-only search's KNN hit, which leaves the field out
    for build in (
        lambda: hybrid_results([("k:c1", 0.03)], {"k:c1": 0.9}, {}, read, VECTOR),
        lambda: dense_results([(0.9, knn)]),
    ):
        with pytest.raises(IndexUnavailable, match="unexpected reply") as raised:
            async with unavailable_on_error("rag-redis", "127.0.0.1:6379", "search"):
                build()
        assert (raised.value.status_code, raised.value.code) == (503, "index_unavailable")


def test_a_passage_without_an_optional_field_reads_alike_from_either_read() -> None:
    bare = {key: STORED[key] for key in ("chunk_id", "content", "source", "digest")}
    assert stored_fields([hmget_row(bare)]) == [bare]
    (fused,) = hybrid_results([("k:c1", 0.03)], {"k:c1": 0.9}, {}, [bare], VECTOR)
    (dense,) = dense_results([(0.9, bare)])
    for found in (fused, dense):
        assert (found.chunk.text, found.chunk.title, found.chunk.index) == (
            "Export from Settings.",
            "",
            0,
        )
        assert found.embedding is None
