"""Parsing the RESP2 replies of the Redis stores' searches into hits and `ScoredChunk`s.

Replies are not decoded (stored vectors are raw float32 bytes). A hit is identified by its
key; `id_of` maps a key to the identity the rankings use (the key itself on one node, the
chunk id on a cluster, whose keys carry a hash tag). A reply of a shape these parsers do
not know raises `UnexpectedReply`, a Redis error: `unavailable_on_error` turns it into
`IndexUnavailable` (HTTP 503) like any other failure of the index. Only the functions that
read a reply (`parses_reply`) say so: they index into it and decode its values, and build
nothing but the plain values they return. The records (`ScoredChunk`, `SourceInfo`) are
built from those outside them, so an error of that code is raised as it is (a 500).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any, NamedTuple, ParamSpec, TypeVar
from urllib.parse import urlsplit, urlunsplit

import numpy as np
from redis.exceptions import RedisClusterException, RedisError, ResponseError

from chatqna.backends.protocols import SourceInfo
from chatqna.documents import Chunk, ScoredChunk
from chatqna.errors import IndexUnavailable, QueryNotSearchable, ServiceUnavailable
from chatqna.retrieval.redis.query import RETURNED
from chatqna.retrieval.redis.schema import pairs, text

P = ParamSpec("P")
R = TypeVar("R")
# A KNN hit that came back without its distance ranks after every other (cosine similarity
# is at least -1); its digest is missing too, so the read finds it changed.
UNSCORED = -1.0


class UnexpectedReply(RedisError):
    """A search or read reply of a shape the store does not know (missing entries, wrong
    types): an index or server other than the one this version expects."""


def parses_reply(parse: Callable[P, R]) -> Callable[P, R]:
    """`parse`, with the errors a malformed reply makes it raise turned into
    `UnexpectedReply` naming it. `parse` only reads the reply (indexes into it, decodes
    its values) into plain values: whatever it raises is blamed on the reply, so the code
    that builds records from those values runs outside it."""

    @functools.wraps(parse)
    def parsed(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return parse(*args, **kwargs)
        except (TypeError, KeyError, ValueError, IndexError, AttributeError) as exc:
            raise UnexpectedReply(f"unexpected reply ({parse.__name__}: {exc!r})") from exc

    return parsed


@parses_reply
def knn_hits(reply: Sequence[Any]) -> list[tuple[str, float, dict[str, Any]]]:
    """`(key, cosine similarity, returned fields)` of a KNN `FT.SEARCH`, nearest first.

    A hit without its fields (a cluster node whose index does not hold `digest` returns
    none, not even `dist`) is kept, `UNSCORED` and without a digest, as `digest_hits`
    keeps one: the read then finds it changed, and ranks again or drops it."""
    hits = []
    for at in range(1, len(reply), 2):
        fields = pairs(reply[at + 1] or [])
        dist = fields.get("dist")
        similarity = UNSCORED if dist is None else 1.0 - float(text(dist))
        hits.append((text(reply[at]), similarity, fields))
    return hits


def unscored(hits: Iterable[tuple[str, float, dict[str, Any]]]) -> bool:
    """Whether a KNN hit came back without its distance (see `knn_hits`)."""
    return any("dist" not in fields for _, _, fields in hits)


@parses_reply
def digest_hits(reply: Sequence[Any]) -> tuple[list[tuple[str, float]], dict[str, Any]]:
    """`(key, score)` of a `WITHSCORES RETURN 1 digest` `FT.SEARCH`, in the server's order,
    and each hit's `digest` (None when the hash has none)."""
    hits, digests = [], {}
    for at in range(1, len(reply), 3):
        key = text(reply[at])
        hits.append((key, float(text(reply[at + 1]))))
        digests[key] = pairs(reply[at + 2] or []).get("digest")
    return hits, digests


@parses_reply
def aggregate_digests(reply: Sequence[Any]) -> dict[str, Any]:
    """The `digest` loaded with each `FT.AGGREGATE` row, by its `__key`."""
    rows = [pairs(row) for row in reply[1:]]
    return {text(row["__key"]): row.get("digest") for row in rows}


def top_bm25(
    hits: Sequence[tuple[str, float]],
    depth: int,
    exact_order: Sequence[str] | None = None,
    order_key: Callable[[str], str] = str,
) -> dict[str, float]:
    """The best `depth` hits, ties ordered by `order_key(key)` (the embedded index's order).

    `hits` are `depth + 1` hits of `FT.SEARCH`, which orders ties by insertion. When a tie
    straddles the cut (`straddles`), `exact_order` is the keys of `FT.AGGREGATE`'s exact
    top, sorted on the server: every key it adds beyond those FT.SEARCH returned ties with
    the score at the cut, which FT.SEARCH gave exactly (FT.AGGREGATE prints 12 digits).
    """
    chosen = list(hits)
    if exact_order is not None and straddles(hits, depth):
        exact, tied = dict(hits), hits[depth][1]
        chosen = [(key, exact.get(key, tied)) for key in exact_order]
    ranked = sorted(chosen, key=lambda hit: (-hit[1], order_key(hit[0])))[:depth]
    return dict(ranked)


def straddles(hits: Sequence[tuple[str, float]], depth: int) -> bool:
    """Whether the hit after the cut ties with the last one kept."""
    return len(hits) > depth and hits[depth][1] == hits[depth - 1][1]


@parses_reply
def stored_fields(rows: Sequence[Sequence[Any]]) -> list[dict[str, Any] | None]:
    """`HMGET key RETURNED...` rows as fields (None for a key that no longer exists).

    A field the hash lacks (HMGET's nil) is left out, as `FT.SEARCH` leaves it out of a
    hit's fields: `stored_chunk` then reads a passage alike from either reply, so a missing
    `content` is an `UnexpectedReply`, never the text "None"."""
    return [None if row[0] is None else present_fields(row) for row in rows]


def present_fields(row: Sequence[Any]) -> dict[str, Any]:
    """An `HMGET key RETURNED...` row's fields the hash holds."""
    return {name: value for name, value in zip(RETURNED, row, strict=True) if value is not None}


def vector_of(fields: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(fields["embedding"], dtype=np.float32)


class StoredChunk(NamedTuple):
    """A passage's stored fields, decoded."""

    chunk_id: str
    content: str
    source: str
    title: str
    chunk_index: int
    embedding: np.ndarray | None


@parses_reply
def stored_chunk(fields: dict[str, Any]) -> StoredChunk:
    """A hit's stored fields (a row of `stored_fields`, or a KNN hit's fields), decoded."""
    return StoredChunk(
        text(fields["chunk_id"]),
        text(fields["content"]),
        text(fields["source"]),
        text(fields.get("title", b"")),
        int(text(fields.get("chunk_index", b"0"))),
        vector_of(fields) if "embedding" in fields else None,
    )


@parses_reply
def stored_similarity(fields: dict[str, Any], vector: np.ndarray) -> float:
    """A passage's cosine with the query's `vector`, from its stored vector."""
    return float(vector_of(fields) @ vector)


def scored_chunk(fields: dict[str, Any], scores: dict[str, float], stage: str) -> ScoredChunk:
    """A hit's stored fields as a `ScoredChunk` scored by `scores[stage]`."""
    stored = stored_chunk(fields)
    chunk = Chunk(
        id=stored.chunk_id,
        text=stored.content,
        source=stored.source,
        title=stored.title,
        index=stored.chunk_index,
    )
    return ScoredChunk(chunk, score=scores[stage], scores=scores, embedding=stored.embedding)


def dense_results(hits: Iterable[tuple[float, dict[str, Any] | None]]) -> list[ScoredChunk]:
    """A dense-only search's passages from `(cosine similarity, stored fields)`, in order;
    a passage without fields (deleted, dropped by `consistency.current_rows`, or a KNN hit
    that came back without them) is skipped."""
    return [
        scored_chunk(fields, {"dense": similarity}, "dense")
        for similarity, fields in hits
        if fields  # None, or a hit's empty fields
    ]


@parses_reply
def source_row(row: Sequence[Any]) -> tuple[int, str]:
    """A source's `HMGET <source key> content_hash chunks` row: its chunks and its hash."""
    content_hash, chunks = row
    return int(text(chunks or b"0")), text(content_hash or b"")


def source_info(source: str, row: Sequence[Any]) -> SourceInfo:
    """A source's `HMGET <source key> content_hash chunks` row as a `SourceInfo`."""
    chunks, content_hash = source_row(row)
    return SourceInfo(source=source, chunks=chunks, content_hash=content_hash)


def redact_url(url: str) -> str:
    """The URL without its password, for readiness output and errors."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.hostname or ""
    if parts.port is not None:
        netloc += f":{parts.port}"
    netloc = f"{parts.username or ''}:***@{netloc}"
    return urlunsplit(parts._replace(netloc=netloc))


# How RediSearch words an error of the query string itself (redis-py's pipeline puts the
# command in front of it).
_QUERY_SYNTAX_ERRORS = ("syntax error", "parser stack overflow")


def is_query_syntax_error(exc: BaseException) -> bool:
    """Whether a Redis error is RediSearch refusing the query string (the server is fine)."""
    message = str(exc).lower()
    return isinstance(exc, ResponseError) and any(e in message for e in _QUERY_SYNTAX_ERRORS)


def is_missing_index(exc: BaseException) -> bool:
    """Whether a Redis error says the index does not exist (a restart without persistence,
    `FLUSHALL`, `FT.DROPINDEX`): the store can build it again."""
    message = str(exc).lower()
    missing = "no such index" in message or "unknown index name" in message
    return isinstance(exc, ResponseError) and missing


@asynccontextmanager
async def unavailable_on_error(
    index: str, location: str, action: str, closed: Callable[[], bool] | None = None
) -> AsyncIterator[None]:
    """Any Redis failure inside becomes `IndexUnavailable` (HTTP 503) naming the index,
    except, in a search, a query RediSearch cannot parse: `QueryNotSearchable` (HTTP 500).

    Once `closed()` holds (the store was closed), work is refused with `ServiceUnavailable`
    before it starts (a closed redis-py client would open new connections), and a failure
    of work already under way is that refusal too: closing the clients cut its connection."""
    if closed is not None and closed():
        raise ServiceUnavailable.closed(f"the Redis index {index!r}")
    try:
        yield
    except (RedisError, RedisClusterException) as exc:
        if closed is not None and closed():
            raise ServiceUnavailable.closed(f"the Redis index {index!r}") from exc
        where = f" at {location}" if location else ""
        if action == "search" and is_query_syntax_error(exc):
            # RediSearch's words only: redis-py's prefix repeats the whole query.
            said = str(exc).rpartition("caused error: ")[2][:160]
            raise QueryNotSearchable(
                f"Redis index {index!r}{where} could not parse the search built from the "
                f"text: {said}"
            ) from exc
        raise IndexUnavailable(
            f"Redis index {index!r}{where}: {action} failed: {exc or type(exc).__name__}"
        ) from exc


def hybrid_results(
    fused: Sequence[tuple[str, float]],
    dense: dict[str, float],
    bm25: dict[str, float],
    stored: Sequence[dict[str, Any] | None],
    vector: np.ndarray,
) -> list[ScoredChunk]:
    """The fused passages with their three scores; a passage without fields (deleted, or
    dropped by `consistency.current_rows`) is skipped, and one only BM25 found gets its
    cosine from its stored vector."""
    results = []
    for (key, score), fields in zip(fused, stored, strict=True):
        if fields is None:
            continue
        similarity = dense[key] if key in dense else stored_similarity(fields, vector)
        scores = {"dense": similarity, "bm25": bm25.get(key, 0.0), "fusion": score}
        results.append(scored_chunk(fields, scores, "fusion"))
    return results
