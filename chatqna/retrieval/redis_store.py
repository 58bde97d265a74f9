"""The remote retriever: a RediSearch index (Redis Stack 7.4+) searched by KNN + BM25 and RRF.

Layout, for an index name `N` (default `rag-redis`):

    N:chunk:<chunk id>      hash: content, terms, chunk_id, source, title, chunk_index,
                            embedding, digest (of all the others: an unchanged chunk is not
                            rewritten)
    N:meta                  hash: the embedder name and dimension the index was built for,
                            and the layout's format version
    N:sources               set of source names
    N:source:<source>       hash: content_hash, chunks
    N:source-chunks:<src>   set of the source's chunk ids (what a replace or delete removes)

The RediSearch index `N` covers the `N:chunk:` keys only. Its one full-text field, `terms`,
holds the passage already tokenised by the embedded BM25's tokeniser (lower-cased words,
stop words dropped), unstemmed, and queries run `VERBATIM` with the `BM25STD` scorer: the
two indexes then see the same tokens and compute the same BM25 (`chatqna.retrieval.bm25`
evaluates RediSearch's formula with its precision), so a hybrid search ranks exactly as the
embedded index does. The index is created with `STOPWORDS 0` (stop words are dropped
client-side, and an OR query that starts with two stop words crashes RediSearch 2.10; see
shared/notes/redis-stack.md).

A hybrid search sends the KNN and the BM25 query in one pipelined round trip, each for its
best `max(k, rrf_candidates)` passages (ids and scores only), fuses the two rankings in the
client with `reciprocal_rank_fusion`, exactly as `InMemoryHybridIndex` does, and then reads
the `k` fused passages in a second round trip; a Redis 8.4+ server-side fusion (`FT.HYBRID`)
can replace `_fuse` later. BM25 ties are ordered by passage id in both indexes: RediSearch
orders them by insertion, so the client re-sorts, and when a tie straddles the cut it asks
`FT.AGGREGATE` for the exact order instead.

RediSearch's BM25 statistics lag behind deletes and overwrites: a replaced or deleted
passage keeps counting in its document frequencies until the GC cleans it (every 30 s once
100 such passages accumulate, by default), and in the average passage length for good. So
unchanged chunks are never rewritten, and rankings equal the embedded index's as long as no
passage was replaced or deleted; after that, BM25 scores drift slightly until the index is
rebuilt. A restart that replays `FT.CREATE` from the append-only file (no AOF rewrite since
the index was created) indexes every passage twice, and BM25 scores shift for good; so does
writing while `FT.CREATE` still scans the keyspace, which is why `ensure_index` waits for
that scan. After a restart RediSearch may index in the background for a while (`describe()`
reports `indexing`). Dense search is unaffected by all of this.

Writes are pipelined, not transactional: a reader may briefly see a source half replaced.
A source's content hash is cleared before its chunks change and written last, so a replace
that fails half-way is redone by the next ingestion instead of being skipped as unchanged.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal, cast
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from chatqna.backends.protocols import SearchQuery, SourceBatch, SourceInfo
from chatqna.documents import Chunk, ScoredChunk
from chatqna.errors import IndexUnavailable
from chatqna.retrieval.bm25 import TermUnion, WeightedQuery, query_tree, tokenize
from chatqna.retrieval.fusion import DEFAULT_RRF_K, FUSION_CANDIDATES, reciprocal_rank_fusion

logger = logging.getLogger(__name__)

DEFAULT_INDEX_NAME = "rag-redis"
# Format 2: the pre-tokenised `terms` field is the only full-text field (format 1 indexed
# `content` and `title`, whose BM25 cannot match the embedded index's).
FORMAT_VERSION = "2"
# Textbook BM25 (the classic `BM25` scorer has no per-passage length normalisation and an
# integer idf); `chatqna.retrieval.bm25` mirrors it.
BM25_SCORER = "BM25STD"
_RETURNED = ("chunk_id", "content", "source", "title", "chunk_index", "embedding")
_QUERY_SPECIAL = re.compile(r"[^0-9A-Za-z\u0080-\U0010ffff]")
_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")


@dataclass(frozen=True)
class VectorIndexParams:
    """How the `embedding` field is indexed: HNSW (approximate, fast) or FLAT (exact).

    `m`, `ef_construction` and `ef_runtime` are HNSW's graph degree, build-time and
    query-time candidate list sizes; FLAT ignores them. They apply when the index is
    created: an existing index keeps the parameters it was created with.
    """

    algorithm: Literal["HNSW", "FLAT"] = "HNSW"
    m: int = 16
    ef_construction: int = 200
    ef_runtime: int = 10

    def __post_init__(self) -> None:
        if self.algorithm not in ("HNSW", "FLAT"):
            raise ValueError(f"algorithm must be HNSW or FLAT, got {self.algorithm!r}")
        if min(self.m, self.ef_construction, self.ef_runtime) < 1:
            raise ValueError("m, ef_construction and ef_runtime must be at least 1")

    def field_args(self, dimension: int) -> list[str | int]:
        args: list[str | int] = ["TYPE", "FLOAT32", "DIM", dimension, "DISTANCE_METRIC", "COSINE"]
        if self.algorithm == "HNSW":
            args += ["M", self.m, "EF_CONSTRUCTION", self.ef_construction]
            args += ["EF_RUNTIME", self.ef_runtime]
        return ["embedding", "VECTOR", self.algorithm, len(args), *args]


def _escape(token: str) -> str:
    return _QUERY_SPECIAL.sub(lambda m: "\\" + m.group(0), token)


def _render(node: str | TermUnion) -> str:
    if isinstance(node, str):
        return _escape(node)
    inner = " | ".join(_render(child) for child in node.children)
    if node.weight == 1.0:
        return f"({inner})"
    # repr() round-trips the float, so RediSearch multiplies by exactly the same weight.
    return f"({inner}) => {{ $weight: {node.weight!r}; }}"


def bm25_query(query: WeightedQuery) -> str | None:
    """The RediSearch query for a BM25 query tree (`query_tree`); None when it has no term.

    Terms come from the embedded BM25's tokeniser (lower-cased `\\w+`, stop words dropped),
    so no query syntax in user text survives (`@`, `|`, `-`, `%`, parentheses), and every
    character other than an ASCII letter or digit is escaped all the same. The history's
    terms form a union with a `$weight` attribute.
    """
    tree = query_tree(query)
    return None if tree is None else "@terms:" + _render(tree)


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


def _chunk_digest(chunk: Chunk, vector: bytes) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for part in (FORMAT_VERSION, chunk.text, chunk.source, chunk.title, str(chunk.index)):
        digest.update(part.encode("utf-8"))
        digest.update(b"\0")
    digest.update(vector)
    return digest.hexdigest()


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


class RedisHybridIndex:
    """KNN + BM25 over a RediSearch index, fused with reciprocal rank fusion, in Redis.

    Build it with `open()`, which connects, creates the index when it is missing and refuses
    an index built for another embedder. The client must not decode responses: stored
    vectors come back as raw float32 bytes, and are handed to the reranker with each hit.
    """

    supports_bm25_history = True

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        embedder_name: str,
        dimension: int,
        index_name: str = DEFAULT_INDEX_NAME,
        vector: VectorIndexParams | None = None,
        rrf_k: int = DEFAULT_RRF_K,
        rrf_candidates: int = FUSION_CANDIDATES,
        write_batch: int = 500,
        location: str = "",
    ) -> None:
        if min(dimension, write_batch, rrf_k, rrf_candidates) < 1:
            raise ValueError("dimension, write_batch, rrf_k and rrf_candidates must be at least 1")
        if not index_name or any(c.isspace() for c in index_name):
            raise ValueError(f"invalid index name {index_name!r}")
        self.client = client
        self.embedder_name = embedder_name
        self.dimension = dimension
        self.index_name = index_name
        self.vector = vector if vector is not None else VectorIndexParams()
        self.rrf_k = rrf_k
        self.rrf_candidates = rrf_candidates
        self.write_batch = write_batch
        self.location = location
        self._chunk_prefix = f"{index_name}:chunk:"
        self._meta_key = f"{index_name}:meta"
        self._sources_key = f"{index_name}:sources"
        self._write_lock = asyncio.Lock()

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        embedder_name: str,
        dimension: int,
        index_name: str = DEFAULT_INDEX_NAME,
        vector: VectorIndexParams | None = None,
        rrf_k: int = DEFAULT_RRF_K,
        rrf_candidates: int = FUSION_CANDIDATES,
        write_batch: int = 500,
        timeout_seconds: float = 10.0,
    ) -> RedisHybridIndex:
        """Connect to `url` (RESP2), create the index if missing, and check it fits."""
        client = aioredis.Redis.from_url(
            url,
            protocol=2,
            decode_responses=False,
            socket_timeout=timeout_seconds,
            socket_connect_timeout=timeout_seconds,
        )
        index = cls(
            client,
            embedder_name=embedder_name,
            dimension=dimension,
            index_name=index_name,
            vector=vector,
            rrf_k=rrf_k,
            rrf_candidates=rrf_candidates,
            write_batch=write_batch,
            location=redact_url(url),
        )
        try:
            await index.ensure_index()
        except BaseException:
            await client.aclose()
            raise
        return index

    # --- keys and errors -----------------------------------------------------------------
    def _chunk_key(self, chunk_id: str) -> str:
        return self._chunk_prefix + chunk_id

    def _source_key(self, source: str) -> str:
        return f"{self.index_name}:source:{source}"

    def _source_chunks_key(self, source: str) -> str:
        return f"{self.index_name}:source-chunks:{source}"

    @asynccontextmanager
    async def _redis(self, action: str) -> AsyncIterator[None]:
        try:
            yield
        except RedisError as exc:
            where = f" at {self.location}" if self.location else ""
            raise IndexUnavailable(
                f"Redis index {self.index_name!r}{where}: {action} failed: {exc}"
            ) from exc

    # --- the index itself ------------------------------------------------------------------
    async def ensure_index(self) -> None:
        """Create the index when missing; refuse one built for another embedder or size."""
        async with self._redis("opening the index"):
            meta = cast(dict[bytes, bytes], await self.client.hgetall(self._meta_key))
            if meta:
                self._check_meta(meta)
            info = await self._index_info()
            if info is None:
                await self._write_meta()
                await self._create_index()
                await self._wait_for_initial_scan()
                info = await self._index_info()
            if info is None:
                raise IndexUnavailable(f"Redis index {self.index_name!r} was not created")
            self._check_vector_field(info, meta)
            if not meta:  # an index whose creator stopped before writing the meta
                await self._write_meta()

    async def _wait_for_initial_scan(self, timeout_seconds: float = 60.0) -> None:
        """Wait while `FT.CREATE` scans the keyspace for existing passages.

        A passage written during that scan is indexed twice (once by the write, once by the
        scan), which skews BM25's statistics for good; measured with 20,000 unrelated keys
        in the database.
        """
        deadline = time.monotonic() + timeout_seconds
        while True:
            info = await self._index_info()
            fields = dict(zip(map(_text, (info or [])[::2]), (info or [])[1::2], strict=False))
            if _text(fields.get("indexing", 0)) == "0":
                return
            if time.monotonic() > deadline:
                logger.warning(
                    "Redis index %r still scans existing keys after %.0f s; writing anyway",
                    self.index_name,
                    timeout_seconds,
                )
                return
            await asyncio.sleep(0.01)

    async def _write_meta(self) -> None:
        await self.client.hset(
            self._meta_key,
            mapping={
                "embedder": self.embedder_name,
                "dimension": self.dimension,
                "format": FORMAT_VERSION,
            },
        )

    async def _call(self, *args: str | int | bytes) -> Any:
        # redis-py leaves execute_command untyped; module commands go through it.
        execute = cast(Callable[..., Awaitable[Any]], self.client.execute_command)
        return await execute(*args)

    async def _index_info(self) -> list[Any] | None:
        try:
            return cast(list[Any], await self._call("FT.INFO", self.index_name))
        except ResponseError as exc:
            if "unknown index" in str(exc).lower() or "no such index" in str(exc).lower():
                return None
            raise

    async def _create_index(self) -> None:
        schema: list[str | int] = [
            "terms", "TEXT", "NOSTEM",
            "chunk_id", "TAG",
            "source", "TAG",
            "chunk_index", "NUMERIC",
            *self.vector.field_args(self.dimension),
        ]  # fmt: skip
        try:
            await self._call(
                "FT.CREATE", self.index_name, "ON", "HASH", "PREFIX", 1, self._chunk_prefix,
                "STOPWORDS", 0, "SCHEMA", *schema,
            )  # fmt: skip
        except ResponseError as exc:
            if "already exists" not in str(exc).lower():  # another process was first
                raise

    def _mismatch(self, embedder: str, dimension: str) -> IndexUnavailable:
        return IndexUnavailable(
            f"the Redis index {self.index_name!r} was built with embedder {embedder!r} "
            f"({dimension} dimensions); the configured embedder is {self.embedder_name!r} "
            f"({self.dimension}). Use another INDEX_NAME, delete the index, or switch the "
            "embedder back."
        )

    def _outdated(self, found: str) -> IndexUnavailable:
        return IndexUnavailable(
            f"the Redis index {self.index_name!r} has layout format {found}; this version "
            f"needs format {FORMAT_VERSION} (a pre-tokenised `terms` field for BM25). Use "
            f"another INDEX_NAME, or drop it with its passages (FT.DROPINDEX "
            f"{self.index_name} DD) and ingest again."
        )

    def _check_meta(self, meta: dict[bytes, bytes]) -> None:
        embedder = _text(meta.get(b"embedder", b""))
        dimension = _text(meta.get(b"dimension", b""))
        if embedder != self.embedder_name or dimension != str(self.dimension):
            raise self._mismatch(embedder, dimension)
        found = _text(meta.get(b"format", b"1"))
        if found != FORMAT_VERSION:
            raise self._outdated(found)

    def _check_vector_field(self, info: list[Any], meta: dict[bytes, bytes]) -> None:
        fields = dict(zip(map(_text, info[::2]), info[1::2], strict=False))
        attributes = {}
        for attribute in fields.get("attributes", []):
            pairs = dict(zip(map(_text, attribute[::2]), attribute[1::2], strict=False))
            attributes[_text(pairs.get("identifier", ""))] = pairs
        vector = attributes.get("embedding")
        if vector is not None:
            dimension = _text(vector.get("dim", ""))
            if dimension != str(self.dimension):
                raise self._mismatch(_text(meta.get(b"embedder", b"(unknown)")), dimension)
            if "terms" not in attributes:
                raise self._outdated(_text(meta.get(b"format", b"1")))
            return
        raise IndexUnavailable(
            f"the Redis index {self.index_name!r} has no `embedding` vector field: it was "
            "not created by ChatQnA. Use another INDEX_NAME."
        )

    # --- writes ------------------------------------------------------------------------------
    async def replace_sources(self, batches: Sequence[SourceBatch]) -> None:
        for batch in batches:
            if batch.embeddings.shape != (len(batch.chunks), self.dimension):
                raise ValueError(f"{batch.source}: embeddings do not match its chunks")
        async with self._write_lock, self._redis("replacing sources"):
            pipe = self.client.pipeline(transaction=False)
            for batch in batches:
                pipe.smembers(self._source_chunks_key(batch.source))
                pipe.hset(self._source_key(batch.source), "content_hash", "")
            replies = await pipe.execute()
            for batch, old in zip(batches, replies[::2], strict=True):
                await self._write_chunks(batch)
                stale = {_text(i) for i in old} - {c.id for c in batch.chunks}
                await self._remove_chunks(batch.source, sorted(stale))
            pipe = self.client.pipeline(transaction=False)
            for batch in batches:
                pipe.hset(
                    self._source_key(batch.source),
                    mapping={"content_hash": batch.content_hash, "chunks": len(batch.chunks)},
                )
                pipe.sadd(self._sources_key, batch.source)
            await pipe.execute()

    async def _write_chunks(self, batch: SourceBatch) -> None:
        vectors = np.ascontiguousarray(batch.embeddings, dtype=np.float32)
        members = self._source_chunks_key(batch.source)
        for start in range(0, len(batch.chunks), self.write_batch):
            chunks = batch.chunks[start : start + self.write_batch]
            rows = [vectors[start + offset].tobytes() for offset in range(len(chunks))]
            digests = [_chunk_digest(c, row) for c, row in zip(chunks, rows, strict=True)]
            pipe = self.client.pipeline(transaction=False)
            for chunk in chunks:
                pipe.hget(self._chunk_key(chunk.id), "digest")
            stored = await pipe.execute()
            pipe = self.client.pipeline(transaction=False)
            # The set first: every chunk key that exists is reachable from its source.
            pipe.sadd(members, *(c.id for c in chunks))
            for chunk, row, digest, old in zip(chunks, rows, digests, stored, strict=True):
                if old is not None and _text(old) == digest:
                    continue  # unchanged: rewriting it would only skew BM25 until the GC runs
                pipe.hset(
                    self._chunk_key(chunk.id),
                    mapping={
                        "content": chunk.text,
                        "terms": " ".join(tokenize(chunk.text)),
                        "chunk_id": chunk.id,
                        "source": chunk.source,
                        "title": chunk.title,
                        "chunk_index": chunk.index,
                        "embedding": row,
                        "digest": digest,
                    },
                )
            await pipe.execute()

    async def _remove_chunks(self, source: str, chunk_ids: Sequence[str]) -> int:
        removed = 0
        for start in range(0, len(chunk_ids), self.write_batch):
            ids = chunk_ids[start : start + self.write_batch]
            pipe = self.client.pipeline(transaction=False)
            pipe.delete(*(self._chunk_key(i) for i in ids))
            pipe.srem(self._source_chunks_key(source), *ids)
            deleted, _ = await pipe.execute()
            removed += int(deleted)
        return removed

    async def delete_sources(self, sources: Sequence[str] | None) -> int:
        async with self._write_lock, self._redis("deleting sources"):
            if sources is None:
                return await self._delete_everything()
            removed = 0
            for source in dict.fromkeys(sources):
                members = await self.client.smembers(self._source_chunks_key(source))
                removed += await self._remove_chunks(source, sorted(_text(m) for m in members))
                pipe = self.client.pipeline(transaction=False)
                pipe.delete(self._source_chunks_key(source), self._source_key(source))
                pipe.srem(self._sources_key, source)
                await pipe.execute()
            return removed

    async def _delete_everything(self) -> int:
        """Every key of this index but its meta, found by SCAN (orphans included)."""
        removed = await self._delete_matching(self._chunk_prefix)
        for prefix in (f"{self.index_name}:source:", f"{self.index_name}:source-chunks:"):
            await self._delete_matching(prefix)
        await self.client.delete(self._sources_key)
        return removed

    async def _delete_matching(self, prefix: str) -> int:
        pattern = _GLOB_SPECIAL.sub(r"\\\1", prefix) + "*"
        removed = 0
        keys: list[bytes] = []
        async for key in self.client.scan_iter(match=pattern, count=1000):
            keys.append(key)
            if len(keys) >= self.write_batch:
                removed += int(await self.client.delete(*keys))
                keys = []
        if keys:
            removed += int(await self.client.delete(*keys))
        return removed

    # --- reads -------------------------------------------------------------------------------
    def _queue(self, pipe: Any, *args: str | int | bytes) -> None:
        # Pipeline.execute_command is untyped in redis-py; it queues and returns the pipe.
        cast(Callable[..., object], pipe.execute_command)(*args)

    async def search(self, query: SearchQuery) -> list[ScoredChunk]:
        vector = np.asarray(query.embedding, dtype=np.float32).reshape(-1)
        if vector.shape[0] != self.dimension:
            raise IndexUnavailable(
                f"query vector has {vector.shape[0]} dimensions, the index {self.dimension}"
            )
        if not query.hybrid:
            return await self._dense_only(vector, query.k)
        depth = max(query.k, self.rrf_candidates)
        lexical = WeightedQuery.parse(query.text, query.bm25_history, query.bm25_history_weight)
        text_query = bm25_query(lexical)
        async with self._redis("search"):
            pipe = self.client.pipeline(transaction=False)
            self._queue(
                pipe, "FT.SEARCH", self.index_name, f"*=>[KNN {depth} @embedding $vec AS dist]",
                "PARAMS", 2, "vec", vector.tobytes(), "SORTBY", "dist", "RETURN", 1, "dist",
                "LIMIT", 0, depth, "DIALECT", 2,
            )  # fmt: skip
            if text_query is not None:
                # One more than needed: it tells whether a tie straddles the cut.
                self._queue(
                    pipe, "FT.SEARCH", self.index_name, text_query, "VERBATIM",
                    "SCORER", BM25_SCORER, "WITHSCORES", "NOCONTENT",
                    "LIMIT", 0, depth + 1, "DIALECT", 2,
                )  # fmt: skip
            replies = await pipe.execute()
            dense = {
                _text(replies[0][at]): 1.0 - float(_text(replies[0][at + 1][1]))
                for at in range(1, len(replies[0]), 2)
            }
            bm25: dict[str, float] = {}
            if text_query is not None:
                bm25 = await self._bm25_ranking(replies[1], text_query, depth)
            fused = reciprocal_rank_fusion(
                [list(dense), list(bm25)], k=self.rrf_k, weights=query.fusion_weights
            )[: query.k]
            stored = await self._read([key for key, _ in fused])
        results = []
        for (key, score), fields in zip(fused, stored, strict=True):
            if fields is None:  # deleted since the search
                continue
            # A passage only BM25 found gets its cosine from its stored vector.
            similarity = dense[key] if key in dense else float(self._vector(fields) @ vector)
            scores = {"dense": similarity, "bm25": bm25.get(key, 0.0), "fusion": score}
            results.append(self._scored(fields, scores, "fusion"))
        return results

    async def _bm25_ranking(
        self, reply: list[Any], text_query: str, depth: int
    ) -> dict[str, float]:
        """The best `depth` BM25 hits, ties ordered by key (the embedded index's order).

        RediSearch orders tied scores by insertion, so the client sorts; only when a tie
        group straddles the cut does it need the exact top from `FT.AGGREGATE`, which sorts
        by score and key on the server.
        """
        hits = [(_text(reply[at]), float(_text(reply[at + 1]))) for at in range(1, len(reply), 2)]
        if len(hits) > depth and hits[depth][1] == hits[depth - 1][1]:
            rows = await self._call(
                "FT.AGGREGATE", self.index_name, text_query, "VERBATIM", "SCORER", BM25_SCORER,
                "ADDSCORES", "LOAD", 1, "@__key", "SORTBY", 4, "@__score", "DESC",
                "@__key", "ASC", "LIMIT", 0, depth, "DIALECT", 2,
            )  # fmt: skip
            # FT.AGGREGATE prints scores to 12 digits. Every passage it adds beyond those
            # FT.SEARCH returned ties with the score at the cut, which FT.SEARCH gave exactly.
            exact, tied = dict(hits), hits[depth][1]
            keys = [_text(row[row.index(b"__key") + 1]) for row in rows[1:]]
            hits = [(key, exact.get(key, tied)) for key in keys]
        return dict(sorted(hits[:depth], key=lambda hit: (-hit[1], hit[0])))

    async def _read(self, keys: Sequence[str]) -> list[dict[str, Any] | None]:
        """The stored fields of each key (None for a key that no longer exists)."""
        if not keys:
            return []
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.hmget(key, list(_RETURNED))
        rows = await pipe.execute()
        return [None if row[0] is None else dict(zip(_RETURNED, row, strict=True)) for row in rows]

    async def _dense_only(self, vector: np.ndarray, k: int) -> list[ScoredChunk]:
        async with self._redis("search"):
            reply = await self._call(
                "FT.SEARCH", self.index_name, f"*=>[KNN {k} @embedding $vec AS dist]",
                "PARAMS", 2, "vec", vector.tobytes(), "SORTBY", "dist",
                "RETURN", len(_RETURNED) + 1, *_RETURNED, "dist", "LIMIT", 0, k, "DIALECT", 2,
            )  # fmt: skip
        results = []
        for at in range(1, len(reply), 2):
            values = reply[at + 1]
            fields = {_text(n): v for n, v in zip(values[::2], values[1::2], strict=True)}
            results.append(self._scored(fields, {"dense": 1.0 - float(fields["dist"])}, "dense"))
        return results

    def _vector(self, fields: dict[str, Any]) -> np.ndarray:
        return np.frombuffer(fields["embedding"], dtype=np.float32)

    def _scored(self, fields: dict[str, Any], scores: dict[str, float], stage: str) -> ScoredChunk:
        chunk = Chunk(
            id=_text(fields["chunk_id"]),
            text=_text(fields["content"]),
            source=_text(fields["source"]),
            title=_text(fields.get("title", b"")),
            index=int(_text(fields.get("chunk_index", b"0"))),
        )
        embedding = self._vector(fields) if "embedding" in fields else None
        return ScoredChunk(chunk, score=scores[stage], scores=scores, embedding=embedding)

    async def list_sources(self) -> list[SourceInfo]:
        async with self._redis("listing sources"):
            names = sorted(_text(s) for s in await self.client.smembers(self._sources_key))
            pipe = self.client.pipeline(transaction=False)
            for source in names:
                pipe.hmget(self._source_key(source), ["content_hash", "chunks"])
            rows = await pipe.execute()
        return [
            SourceInfo(source=s, chunks=int(_text(n or b"0")), content_hash=_text(h or b""))
            for s, (h, n) in zip(names, rows, strict=True)
        ]

    async def describe(self) -> dict[str, Any]:
        async with self._redis("describe"):
            info = await self._index_info()
            sources = int(await self.client.scard(self._sources_key))
        if info is None:
            raise IndexUnavailable(f"the Redis index {self.index_name!r} no longer exists")
        fields = dict(zip(map(_text, info[::2]), info[1::2], strict=False))
        return {
            "kind": "redis",
            "url": self.location,
            "index": self.index_name,
            "chunks": int(_text(fields.get("num_docs", 0))),
            "sources": sources,
            "dimension": self.dimension,
            "algorithm": self.vector.algorithm,
            # After a restart RediSearch re-indexes in the background; searches miss passages
            # until it is done.
            "indexing": _text(fields.get("indexing", 0)) != "0",
            "percent_indexed": float(_text(fields.get("percent_indexed", 1))),
        }

    async def aclose(self) -> None:
        await self.client.aclose()
