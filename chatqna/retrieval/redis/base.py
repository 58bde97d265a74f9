"""What the single-node and the cluster Redis store share, so that it is written once.

Both stores check their options the same way, turn every Redis failure into the same error
envelope (`replies.unavailable_on_error`), read and write the `N:meta` hash alike, take one
write lock per store around the writer's transactions, report `describe()` in the same
shape (one node is a cluster of one index), and close the same way: new work is refused,
a write in progress ends, then the clients are closed. Searching and reading differ (one
node answers both legs in one pipeline; a cluster asks every primary and merges), so each
store keeps its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol, Required, TypedDict, cast

import numpy as np
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from chatqna.backends.protocols import SearchQuery, SourceBatch
from chatqna.errors import IndexUnavailable
from chatqna.retrieval.redis.replies import unavailable_on_error
from chatqna.retrieval.redis.schema import (
    FORMAT_VERSION,
    IndexInfo,
    IndexSchema,
    VectorIndexParams,
)
from chatqna.retrieval.redis.writes import check_batches

# Connections of one store's reading pool (per node on a cluster): the default of
# `CHATQNA_MAX_CONCURRENT_CHATS`, which the composition root passes.
DEFAULT_MAX_CONNECTIONS = 256


def query_vector(query: SearchQuery, dimension: int) -> np.ndarray:
    vector = np.asarray(query.embedding, dtype=np.float32).reshape(-1)
    if vector.shape[0] != dimension:
        raise IndexUnavailable(
            f"query vector has {vector.shape[0]} dimensions, the index {dimension}"
        )
    return vector


def check_options(index_name: str, **sizes: int) -> None:
    """Refuse an index name RediSearch cannot take, and any of `sizes` below 1 (named in
    the error in the order given)."""
    if min(sizes.values()) < 1:
        *first, last = sizes
        raise ValueError(f"{', '.join(first)} and {last} must be at least 1")
    if not index_name or any(c.isspace() for c in index_name):
        raise ValueError(f"invalid index name {index_name!r}")


class IndexOptions(TypedDict, total=False):
    """The keyword options of both stores' constructors that their `open()` passes on
    unchanged (the defaults are the constructors')."""

    embedder_name: Required[str]
    dimension: Required[int]
    index_name: str
    vector: VectorIndexParams | None
    rrf_k: int
    rrf_candidates: int


class SourceWriter(Protocol):
    """A store's writer: applies whole sources' passages, or deletes sources."""

    async def replace_sources(self, batches: Sequence[SourceBatch]) -> None: ...

    async def delete_sources(self, sources: Sequence[str] | None) -> int: ...


class RedisIndexBase:
    """The part of a Redis store that does not depend on how many nodes hold the index.

    A subclass checks its options with `check_options`, builds its writer and calls this
    `__init__`; it provides `ensure_index`, `search`, `list_sources`, `describe` (through
    `_description`) and `_close_clients`, and may do work before each replacement in
    `_before_replace`. Every Redis call runs inside `_redis(action)`, which maps failures to
    `IndexUnavailable` (or `ServiceUnavailable` once the store is closed).
    """

    supports_bm25_history = True
    writer: SourceWriter

    def __init__(
        self,
        *,
        embedder_name: str,
        dimension: int,
        index_name: str,
        vector: VectorIndexParams | None,
        rrf_k: int,
        rrf_candidates: int,
        location: str,
        chunk_prefix: str,
    ) -> None:
        self.embedder_name = embedder_name
        self.dimension = dimension
        self.index_name = index_name
        self.vector = vector if vector is not None else VectorIndexParams()
        self.rrf_k = rrf_k
        self.rrf_candidates = rrf_candidates
        self.location = location
        self.schema = IndexSchema(index_name, chunk_prefix, embedder_name, dimension, self.vector)
        self.meta_key = f"{index_name}:meta"
        self._write_lock = asyncio.Lock()
        self._closed = False

    def _redis(self, action: str) -> Any:
        return unavailable_on_error(self.index_name, self.location, action, lambda: self._closed)

    @asynccontextmanager
    async def _closed_on_failure(self) -> AsyncIterator[None]:
        """What `open()` checks after connecting: a failure closes the clients, then raises."""
        try:
            yield
        except BaseException:
            await self.aclose()
            raise

    async def _checked_meta(self, client: aioredis.Redis | RedisCluster) -> dict[bytes, bytes]:
        """The `N:meta` hash (empty when there is none), refused when it was written for
        another embedder, dimension or layout format."""
        meta = cast(dict[bytes, bytes], await client.hgetall(self.meta_key))
        if meta:
            self.schema.check_meta(meta, FORMAT_VERSION)
        return meta

    async def _write_meta(self, client: aioredis.Redis | RedisCluster) -> None:
        await client.hset(self.meta_key, mapping=self.schema.meta())

    def _description(
        self, kind: str, infos: Sequence[IndexInfo], sources: int, **placement: Any
    ) -> dict[str, Any]:
        """`describe()`'s report over the index's `FT.INFO` (one per primary on a cluster)."""
        return {
            "kind": kind,
            "url": self.location,
            "index": self.index_name,
            **placement,
            "chunks": sum(info.documents for info in infos),
            "sources": sources,
            "dimension": self.dimension,
            "algorithm": self.vector.algorithm,
            # After a restart RediSearch re-indexes in the background; searches miss passages
            # until it is done.
            "indexing": any(info.indexing for info in infos),
            "percent_indexed": min((info.percent_indexed for info in infos), default=1.0),
        }

    # --- writes ------------------------------------------------------------------------------
    async def replace_sources(self, batches: Sequence[SourceBatch]) -> None:
        check_batches(batches, self.dimension)
        async with self._write_lock, self._redis("replacing sources"):
            await self._before_replace()
            await self.writer.replace_sources(batches)

    async def _before_replace(self) -> None:
        """Work a replacement needs first, under the write lock (none by default)."""

    async def delete_sources(self, sources: Sequence[str] | None) -> int:
        async with self._write_lock, self._redis("deleting sources"):
            return await self.writer.delete_sources(sources)

    async def aclose(self) -> None:
        """Refuse new work, let a write in progress end, then close every client."""
        self._closed = True
        async with self._write_lock:
            await self._close_clients()

    async def _close_clients(self) -> None:
        raise NotImplementedError
