"""The remote retriever: a RediSearch index (Redis Stack 7.4+) searched by KNN + BM25 and RRF.

Layout, for an index name `N` (default `rag-redis`): the passages' hashes under `N:chunk:`
(see `chatqna.retrieval.redis.writes`), `N:meta` (the embedder name and dimension the index
was built for, and the layout's format version), and the RediSearch index `N` over the
`N:chunk:` keys (`chatqna.retrieval.redis.schema`). Its one full-text field, `terms`, holds
the passage already tokenised by the embedded BM25's tokeniser (lower-cased words, stop
words dropped), unstemmed, and queries run `VERBATIM` with the `BM25STD` scorer: the two
indexes then see the same tokens (`chatqna.retrieval.query`) and the same query tree, and
the tests check the server's scores against a reference model of RediSearch's formula.

A hybrid search sends the KNN and the BM25 query in one pipelined round trip, each for its
best `max(k, rrf_candidates)` passages (ids, scores and digests), fuses the two rankings in
the client with `reciprocal_rank_fusion`, exactly as `EmbeddedHybridIndex` does, and then
reads the `k` fused passages in a second round trip, checking each against the digest it
was ranked at (`consistency`: a write in between makes it rank once more); a Redis 8.4+
server-side fusion (`FT.HYBRID`) can replace the fusion later. A dense-only search is one
`FT.SEARCH` that returns the passages' fields itself. BM25 ties are ordered by passage id
in both indexes: RediSearch orders them by insertion, so the client re-sorts, and when a
tie straddles the cut it asks `FT.AGGREGATE` for the exact order (and digests) instead.

RediSearch's BM25 statistics lag behind deletes and overwrites: a replaced or deleted
passage keeps counting in its document frequencies until the GC cleans it (every 30 s once
100 such passages accumulate, by default), and in the average passage length for good. So
unchanged chunks are never rewritten, and rankings equal the embedded index's as long as no
passage was replaced or deleted; after that, BM25 scores drift slightly until the index is
rebuilt. A restart that replays `FT.CREATE` from the append-only file (no AOF rewrite since
the index was created) indexes every passage twice, and BM25 scores shift for good; so does
writing while `FT.CREATE` still scans the keyspace, which is why `ensure_index` waits for
that scan. After a restart RediSearch may index in the background for a while (`describe()`
reports `indexing`). Dense search is unaffected by all of this. An index that is gone (a
restart without persistence, `FLUSHALL`, `FT.DROPINDEX`) is built again by the next
search, `describe()` or write, over the passages still stored.

A Redis Cluster is served by `chatqna.retrieval.redis.cluster.RedisClusterHybridIndex`,
which shares the schema, the queries and the reply parsing.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar, Unpack

import numpy as np
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError, ResponseError

from chatqna.backends.protocols import SearchQuery, SourceInfo
from chatqna.documents import ScoredChunk
from chatqna.errors import IndexUnavailable
from chatqna.retrieval.fusion import DEFAULT_RRF_K, FUSION_CANDIDATES, reciprocal_rank_fusion
from chatqna.retrieval.redis.base import (
    DEFAULT_MAX_CONNECTIONS,
    IndexOptions,
    RedisIndexBase,
    check_options,
    query_vector,
)
from chatqna.retrieval.redis.consistency import Ranking, read_ranked, seen_digests
from chatqna.retrieval.redis.query import (
    RETURNED,
    bm25_aggregate,
    bm25_query,
    bm25_search,
    knn_search,
    search_text,
)
from chatqna.retrieval.redis.replies import (
    aggregate_digests,
    dense_results,
    digest_hits,
    hybrid_results,
    is_missing_index,
    knn_hits,
    redact_url,
    source_info,
    stored_fields,
    straddles,
    top_bm25,
)
from chatqna.retrieval.redis.schema import (
    DEFAULT_INDEX_NAME,
    VectorIndexParams,
    index_info,
    refuse_eviction,
    text,
)
from chatqna.retrieval.redis.writes import SingleNodeWriter

__all__ = ["DEFAULT_INDEX_NAME", "RedisHybridIndex", "VectorIndexParams", "bm25_query"]

logger = logging.getLogger(__name__)
T = TypeVar("T")


def connect(url: str, connect_timeout: float, *, socket_timeout: float | None) -> aioredis.Redis:
    """A RESP2 client of `url` that does not decode responses."""
    return aioredis.Redis.from_url(
        url,
        protocol=2,
        decode_responses=False,
        socket_timeout=socket_timeout,
        socket_connect_timeout=connect_timeout,
    )


def connect_pooled(url: str, timeout_seconds: float, max_connections: int) -> aioredis.Redis:
    """The reading client of `url`: at most `max_connections` connections, a caller waiting
    up to `timeout_seconds` for a free one (redis-py's default pool fails at once past 100),
    and a command sent again, at once, after a connection error (a pooled connection the
    server closed by restarting), never after a timeout."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=timeout_seconds,
        protocol=2,
        decode_responses=False,
        socket_timeout=timeout_seconds,
        socket_connect_timeout=timeout_seconds,
        retry=Retry(NoBackoff(), 1, (ConnectionError,)),
    )
    return aioredis.Redis.from_pool(pool)


class NodeOptions(IndexOptions, total=False):
    """`RedisHybridIndex`'s options `open()` passes on: the shared ones and `write_batch`."""

    write_batch: int


class RedisHybridIndex(RedisIndexBase):
    """KNN + BM25 over a RediSearch index, fused with reciprocal rank fusion, in Redis.

    Build it with `open()`, which connects, creates the index when it is missing and refuses
    an index built for another embedder. The clients must not decode responses: stored
    vectors come back as raw float32 bytes, and are handed to the reranker with each hit.
    `client` answers within its socket timeout, `timeout_seconds`; `transactions`, a client
    of the same server without one, runs the write transactions under deadlines of their own
    (`chatqna.retrieval.redis.writes`).
    """

    writer: SingleNodeWriter

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        transactions: aioredis.Redis,
        embedder_name: str,
        dimension: int,
        index_name: str = DEFAULT_INDEX_NAME,
        vector: VectorIndexParams | None = None,
        rrf_k: int = DEFAULT_RRF_K,
        rrf_candidates: int = FUSION_CANDIDATES,
        write_batch: int = 500,
        timeout_seconds: float = 10.0,
        location: str = "",
    ) -> None:
        check_options(
            index_name,
            dimension=dimension,
            write_batch=write_batch,
            rrf_k=rrf_k,
            rrf_candidates=rrf_candidates,
        )
        self.client = client
        self.write_batch = write_batch
        self.writer = SingleNodeWriter(
            client, transactions, index_name, write_batch, timeout_seconds
        )
        super().__init__(
            embedder_name=embedder_name,
            dimension=dimension,
            index_name=index_name,
            vector=vector,
            rrf_k=rrf_k,
            rrf_candidates=rrf_candidates,
            location=location,
            chunk_prefix=self.writer.chunk_prefix,
        )

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        timeout_seconds: float = 10.0,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        **options: Unpack[NodeOptions],
    ) -> RedisHybridIndex:
        """Connect to `url` (RESP2), create the index if missing, and check it fits.
        Searches share a pool of `max_connections`; writes have a connection of their own.
        The other options are the constructor's."""
        client = connect_pooled(url, timeout_seconds, max_connections)
        transactions = connect(url, timeout_seconds, socket_timeout=None)
        index = cls(
            client,
            transactions=transactions,
            timeout_seconds=timeout_seconds,
            location=redact_url(url),
            **options,
        )
        async with index._closed_on_failure():
            async with index._redis("opening the index"):
                await refuse_eviction(client, index.location)
            await index.ensure_index()
        return index

    async def ensure_index(self) -> None:
        """Create the index when missing; refuse one built for another embedder or size."""
        async with self._redis("opening the index"):
            meta = await self._checked_meta(self.client)
            info = await index_info(self.client, self.index_name)
            if info is None:
                await self._write_meta(self.client)
                info = await self.schema.ensure(self.client)
            self.schema.check_info(info, meta)
            if not meta:  # an index whose creator stopped before writing the meta
                await self._write_meta(self.client)

    async def _rebuilt_if_missing(self, call: Callable[[], Awaitable[T]]) -> T:
        """`call()`; when it finds the index gone (a restart without persistence,
        `FLUSHALL`, `FT.DROPINDEX`), build it again, under the write lock, and call once
        more. `FT.CREATE` indexes the passages still stored."""
        try:
            return await call()
        except ResponseError as exc:
            if not is_missing_index(exc):
                raise
        async with self._write_lock:
            await self._rebuild()
        return await call()

    async def _rebuild(self) -> None:
        """Build the index again if it is still missing (the write lock held)."""
        if await index_info(self.client, self.index_name) is None:
            logger.warning(
                "Redis index %r at %s no longer exists; building it again",
                self.index_name,
                self.location,
            )
            await self.ensure_index()

    async def _before_replace(self) -> None:
        await self._rebuild()  # passages written without their index would stay unseen

    # --- reads -------------------------------------------------------------------------------
    def _queue(self, pipe: Any, args: Sequence[Any]) -> None:
        pipe.execute_command(*args)

    async def _call(self, args: Sequence[Any]) -> Any:
        return await self.client.execute_command(*args)  # type: ignore[no-untyped-call]

    async def search(self, query: SearchQuery) -> list[ScoredChunk]:
        vector = query_vector(query, self.dimension)
        async with self._redis("search"):
            if not query.hybrid:
                return await self._rebuilt_if_missing(lambda: self._dense_only(vector, query.k))
            return await self._rebuilt_if_missing(lambda: self._hybrid(query, vector))

    async def _hybrid(self, query: SearchQuery, vector: np.ndarray) -> list[ScoredChunk]:
        ranking, stored = await read_ranked(lambda: self._rank(query, vector), self._read)
        return hybrid_results(ranking.fused, ranking.dense, ranking.bm25, stored, vector)

    async def _rank(self, query: SearchQuery, vector: np.ndarray) -> Ranking:
        """The fused top `k` of the KNN and BM25 legs, with the digests they saw."""
        depth = max(query.k, self.rrf_candidates)
        text_query = search_text(query)
        pipe = self.client.pipeline(transaction=False)
        self._queue(pipe, knn_search(self.index_name, vector, depth, fields=False))
        if text_query is not None:
            self._queue(pipe, bm25_search(self.index_name, text_query, depth))
        replies = await pipe.execute()
        knn = knn_hits(replies[0])
        dense = {key: similarity for key, similarity, _ in knn}
        legs = [{key: fields.get("digest") for key, _, fields in knn}]
        bm25: dict[str, float] = {}
        if text_query is not None:
            hits, digests = digest_hits(replies[1])
            legs.append(digests)
            exact: list[str] | None = None
            if straddles(hits, depth):
                args = bm25_aggregate(self.index_name, text_query, depth, "__key", digest=True)
                ordered = aggregate_digests(await self._call(args))
                legs.append(ordered)
                exact = list(ordered)
            bm25 = top_bm25(hits, depth, exact)
        fused = reciprocal_rank_fusion(
            [list(dense), list(bm25)], k=self.rrf_k, weights=query.fusion_weights
        )[: query.k]
        return Ranking(fused, dense, bm25, seen_digests(*legs))

    async def _read(self, keys: Sequence[str]) -> list[dict[str, Any] | None]:
        """The stored fields of each key (None for a key that no longer exists)."""
        if not keys:
            return []
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.hmget(key, list(RETURNED))
        return stored_fields(await pipe.execute())

    async def _dense_only(self, vector: np.ndarray, k: int) -> list[ScoredChunk]:
        reply = await self._call(knn_search(self.index_name, vector, k, fields=True))
        return dense_results((similarity, fields) for _, similarity, fields in knn_hits(reply))

    async def list_sources(self) -> list[SourceInfo]:
        async with self._redis("listing sources"):
            members = await self.client.smembers(self.writer.sources_key)
            names = sorted(text(s) for s in members)
            pipe = self.client.pipeline(transaction=False)
            for source in names:
                pipe.hmget(self.writer.source_key(source), ["content_hash", "chunks"])
            rows = await pipe.execute()
            return [source_info(s, row) for s, row in zip(names, rows, strict=True)]

    async def describe(self) -> dict[str, Any]:
        async with self._redis("describe"):
            info = await index_info(self.client, self.index_name)
            if info is None:
                async with self._write_lock:
                    await self._rebuild()
                info = await index_info(self.client, self.index_name)
            sources = int(await self.client.scard(self.writer.sources_key))
        if info is None:
            raise IndexUnavailable(f"the Redis index {self.index_name!r} no longer exists")
        return self._description("redis", [info], sources)

    async def _close_clients(self) -> None:
        await self.client.aclose()
        await self.writer.transactions.aclose()
