"""The remote retriever: a RediSearch index (Redis Stack 7.4+) searched by KNN + BM25 and RRF.

Layout, for an index name `N` (default `rag-redis`):

    N:chunk:<chunk id>      hash: content, chunk_id, source, title, chunk_index, embedding,
                            digest (of all the others: an unchanged chunk is not rewritten)
    N:meta                  hash: the embedder name and dimension the index was built for
    N:sources               set of source names
    N:source:<source>       hash: content_hash, chunks
    N:source-chunks:<src>   set of the source's chunk ids (what a replace or delete removes)

The RediSearch index `N` covers the `N:chunk:` keys only. It is created with `STOPWORDS 0`
and stop words are dropped client-side, because an OR query that starts with two stop words
crashes RediSearch 2.10 (see shared/notes/redis-stack.md). `content` is not stemmed, like
the embedded BM25, so both retrievers rank alike (not identically: RediSearch's BM25
normalises lengths its own way, and counts stop words and the title in them). A hybrid
search sends the KNN and the BM25 query in one pipelined round trip and fuses the two
rankings in the client with `reciprocal_rank_fusion`, exactly as `InMemoryHybridIndex`
does; a Redis 8.4+ server-side fusion (`FT.HYBRID`) can replace `_fuse` later.

RediSearch keeps an overwritten or deleted passage in its BM25 statistics until its GC
cleans it (every 30 s once 100 such passages accumulate, by default), so unchanged chunks
are never rewritten. A restart that replays `FT.CREATE` from the append-only file (no AOF
rewrite since the index was created) indexes every passage twice, and BM25 scores shift for
good. After a restart RediSearch may index in the background for a while (`describe()`
reports `indexing`). Dense search is unaffected by all of this.

Writes are pipelined, not transactional: a reader may briefly see a source half replaced.
A source's content hash is cleared before its chunks change and written last, so a replace
that fails half-way is redone by the next ingestion instead of being skipped as unchanged.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
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
from chatqna.retrieval.bm25 import query_term_weights
from chatqna.retrieval.fusion import DEFAULT_RRF_K, reciprocal_rank_fusion

DEFAULT_INDEX_NAME = "rag-redis"
FORMAT_VERSION = "1"
# RediSearch 2.10 keeps a deleted or overwritten document in its BM25 statistics until its
# GC runs. `BM25STD` ranks closer to the embedded index on a fresh index, but after a few
# overwrites its scores drift far off and the GC does not restore them; `BM25` recovers
# exactly once the GC has run. Measured on the sample corpus, 18 questions, top 5.
BM25_SCORER = "BM25"
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


def bm25_query(text: str, history: str = "", history_weight: float = 0.0) -> str | None:
    """`@content:(t1 | t2 ...)` from the text's tokens, escaped; None when none is left.

    Tokens come from the embedded BM25's tokeniser (lower-cased `\\w+`, stop words dropped),
    so no query syntax in user text survives (`@`, `|`, `-`, `%`, parentheses), and every
    character other than an ASCII letter or digit is escaped all the same.
    """
    weights = query_term_weights(text, history, history_weight)
    if not weights:
        return None
    query_terms = [_escape(t) for t, w in weights.items() if w == 1.0]
    history_terms = [_escape(t) for t, w in weights.items() if w != 1.0]
    parts = list(query_terms)
    if history_terms:
        # RediSearch query attributes: the history's terms count at their weight.
        parts.append(f"({' | '.join(history_terms)}) => {{ $weight: {history_weight:g}; }}")
    return "@content:(" + " | ".join(parts) + ")"


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
    for part in (chunk.text, chunk.source, chunk.title, str(chunk.index)):
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

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        embedder_name: str,
        dimension: int,
        index_name: str = DEFAULT_INDEX_NAME,
        vector: VectorIndexParams | None = None,
        rrf_k: int = DEFAULT_RRF_K,
        write_batch: int = 500,
        location: str = "",
    ) -> None:
        if dimension < 1 or write_batch < 1 or rrf_k < 1:
            raise ValueError("dimension, write_batch and rrf_k must be at least 1")
        if not index_name or any(c.isspace() for c in index_name):
            raise ValueError(f"invalid index name {index_name!r}")
        self.client = client
        self.embedder_name = embedder_name
        self.dimension = dimension
        self.index_name = index_name
        self.vector = vector if vector is not None else VectorIndexParams()
        self.rrf_k = rrf_k
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
                info = await self._index_info()
            if info is None:
                raise IndexUnavailable(f"Redis index {self.index_name!r} was not created")
            self._check_vector_field(info, meta)
            if not meta:  # an index whose creator stopped before writing the meta
                await self._write_meta()

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
            "content", "TEXT", "NOSTEM",
            "chunk_id", "TAG",
            "source", "TAG",
            "title", "TEXT", "NOSTEM",
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

    def _check_meta(self, meta: dict[bytes, bytes]) -> None:
        embedder = _text(meta.get(b"embedder", b""))
        dimension = _text(meta.get(b"dimension", b""))
        if embedder != self.embedder_name or dimension != str(self.dimension):
            raise self._mismatch(embedder, dimension)

    def _check_vector_field(self, info: list[Any], meta: dict[bytes, bytes]) -> None:
        fields = dict(zip(map(_text, info[::2]), info[1::2], strict=False))
        for attribute in fields.get("attributes", []):
            pairs = dict(zip(map(_text, attribute[::2]), attribute[1::2], strict=False))
            if _text(pairs.get("identifier", "")) != "embedding":
                continue
            dimension = _text(pairs.get("dim", ""))
            if dimension != str(self.dimension):
                raise self._mismatch(_text(meta.get(b"embedder", b"(unknown)")), dimension)
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
    async def search(self, query: SearchQuery) -> list[ScoredChunk]:
        vector = np.asarray(query.embedding, dtype=np.float32).reshape(-1)
        if vector.shape[0] != self.dimension:
            raise IndexUnavailable(
                f"query vector has {vector.shape[0]} dimensions, the index {self.dimension}"
            )
        text_query = (
            bm25_query(query.text, query.bm25_history, query.bm25_history_weight)
            if query.hybrid
            else None
        )
        async with self._redis("search"):
            pipe = self.client.pipeline(transaction=False)
            # Pipeline.execute_command is untyped in redis-py; it queues and returns the pipe.
            command = cast(Callable[..., object], pipe.execute_command)
            command(
                "FT.SEARCH", self.index_name, f"*=>[KNN {query.k} @embedding $vec AS dist]",
                "PARAMS", 2, "vec", vector.tobytes(), "SORTBY", "dist",
                "RETURN", len(_RETURNED) + 1, *_RETURNED, "dist",
                "LIMIT", 0, query.k, "DIALECT", 2,
            )  # fmt: skip
            if text_query is not None:
                command(
                    "FT.SEARCH", self.index_name, text_query, "SCORER", BM25_SCORER, "WITHSCORES",
                    "RETURN", len(_RETURNED), *_RETURNED, "LIMIT", 0, query.k, "DIALECT", 2,
                )  # fmt: skip
            replies = await pipe.execute()
        dense = self._hits(replies[0], with_scores=False)
        if not query.hybrid:
            return [
                self._scored(fields, {"dense": 1.0 - float(fields["dist"])}, "dense")
                for fields in dense.values()
            ]
        lexical = self._hits(replies[1], with_scores=True) if text_query is not None else {}
        return self._fuse(dense, lexical, vector, query.k, query.fusion_weights)

    def _fuse(
        self,
        dense: dict[str, dict[str, Any]],
        lexical: dict[str, dict[str, Any]],
        vector: np.ndarray,
        k: int,
        weights: tuple[float, float],
    ) -> list[ScoredChunk]:
        """RRF of the KNN and BM25 hits (in rank order), scored like the embedded index."""
        fused = reciprocal_rank_fusion([list(dense), list(lexical)], k=self.rrf_k, weights=weights)[
            :k
        ]
        results = []
        for key, score in fused:
            if key in dense:
                fields = dense[key]
                similarity = 1.0 - float(fields["dist"])
            else:  # only BM25 found it: its cosine, from the vector it came back with
                fields = lexical[key]
                similarity = float(self._vector(fields) @ vector)
            bm25 = float(lexical[key]["score"]) if key in lexical else 0.0
            scores = {"dense": similarity, "bm25": bm25, "fusion": score}
            results.append(self._scored(fields, scores, "fusion"))
        return results

    @staticmethod
    def _hits(reply: list[Any], *, with_scores: bool) -> dict[str, dict[str, Any]]:
        """An FT.SEARCH reply as {key: fields} in rank order; `score` added WITHSCORES."""
        hits: dict[str, dict[str, Any]] = {}
        step = 3 if with_scores else 2
        for at in range(1, len(reply), step):
            values = reply[at + step - 1]
            fields: dict[str, Any] = {
                _text(name): value for name, value in zip(values[::2], values[1::2], strict=True)
            }
            if with_scores:
                fields["score"] = _text(reply[at + 1])
            hits[_text(reply[at])] = fields
        return hits

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
