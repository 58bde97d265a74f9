"""The retriever on a Redis Cluster: one RediSearch index per primary, searched by all of them.

Redis 7.4's search module has no coordinator: an index covers the keys of the node it lives
on. So every primary gets the index (`topology`: under a name hashed into one of its slots,
since the module routes its commands by the index name), and a search sends the KNN and the
BM25 query to every primary concurrently, one pipelined round trip each, for each leg's
best `max(k, rrf_candidates)` passages (`cluster_search`). The client merges each leg (by
similarity, and by BM25 score with ties ordered by chunk id, as one node orders them),
fuses the two with `reciprocal_rank_fusion` exactly as `RedisHybridIndex` does, and reads
the `k` fused passages from the primaries that returned them (`ClusterTopology.keyed`
follows a passage that moved since), checking each against the digest its ranking saw, as
one node does (`consistency`; a dense-only search too, which reads in a second round trip
here). A passage found twice (a slot in migration) counts once. redis-py's cluster client
only opens the cluster and reads the meta: it cannot follow an `ASK` to a primary that owns
no slot yet.

Dense rankings equal one node's holding the same passages (with exact FLAT search). BM25
scores do not quite: each primary computes IDF and the average passage length from its own
passages, as Elasticsearch's default `query_then_fetch` does per shard, so the BM25 leg,
and the fused ranking through it, can differ from one node's; the Retrieval docs page has
the measured effect. A source's passages share a slot, so their own statistics never split.

Each primary also answers `CLUSTER NODES` in the same pipeline. When a primary reports a
slot in migration or a slot map other than the one searched with, the client refreshes its
view and searches every primary again, and merges both rounds: a passage moved between two
primaries' searches is found by the second round (it had to be on the source when the first
round read it, or on the destination when the second did). A primary that appears (or a new
index name after resharding) gets its index, and its initial scan is awaited, before any
search reads it; one that owns no slot yet but imports one is searched with `ASKING`. A
primary that cannot be reached, or hangs past the timeout, fails the search with
`IndexUnavailable` (503) and the next search rereads the topology from any node: while its
replica is being promoted (about `cluster-node-timeout` plus a second of election),
searches fail, then they succeed again. Listing and `describe()` (what `/v1/ready` asks)
reread the topology too, and try once more when another node took over: readiness recovers
without a search. Searches that find the topology stale together share one reread, which
asks every node at once and takes the first answer (`topology`), so a primary that hangs
fails each search after one timeout. A primary whose index was replaced by one of other
fields (its KNN hits come back without their distance) fails searches with
`IndexUnavailable` and the way out, as at start-up, until that index is dropped.
Writes go to the primary that owns the source's slot (`cluster_writes`), atomically per
source (a request of several sources is applied source by source), and are acknowledged
once a replica has them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any, Unpack

import numpy as np
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AskError, MovedError, ResponseError, TryAgainError
from redis.exceptions import TimeoutError as RedisTimeoutError

from chatqna.backends.protocols import SearchQuery, SourceInfo
from chatqna.documents import ScoredChunk
from chatqna.errors import IndexUnavailable
from chatqna.retrieval.fusion import DEFAULT_RRF_K, FUSION_CANDIDATES
from chatqna.retrieval.redis.base import (
    DEFAULT_MAX_CONNECTIONS,
    IndexOptions,
    RedisIndexBase,
    check_options,
    query_vector,
)
from chatqna.retrieval.redis.cluster_layout import ClusterLayout
from chatqna.retrieval.redis.cluster_search import Round, search_shard
from chatqna.retrieval.redis.cluster_writes import ClusterWriter
from chatqna.retrieval.redis.consistency import Ranking, read_ranked
from chatqna.retrieval.redis.query import RETURNED, search_text
from chatqna.retrieval.redis.replies import (
    dense_results,
    hybrid_results,
    is_missing_index,
    redact_url,
    source_info,
    stored_fields,
    unavailable_on_error,
)
from chatqna.retrieval.redis.schema import (
    DEFAULT_INDEX_NAME,
    IndexInfo,
    VectorIndexParams,
    index_info,
    refuse_eviction,
)
from chatqna.retrieval.redis.topology import ClusterTopology, Shard

logger = logging.getLogger(__name__)

ROUND_ATTEMPTS = 4  # tries of one search round while an index name's slot moves


async def cluster_enabled(url: str, timeout_seconds: float = 10.0) -> bool:
    """Whether the server at `url` is a node of a Redis Cluster (`INFO cluster`)."""
    client = aioredis.Redis.from_url(
        url, protocol=2, socket_timeout=timeout_seconds, socket_connect_timeout=timeout_seconds
    )
    try:
        async with unavailable_on_error("(probe)", redact_url(url), "INFO cluster"):
            info = await client.info("cluster")
    finally:
        await client.aclose()
    return str(info.get("cluster_enabled", 0)) == "1"


class ClusterOptions(IndexOptions, total=False):
    """`RedisClusterHybridIndex`'s options `open()` passes on: the shared ones and the
    connections of each primary's reading pool."""

    max_connections: int


class RedisClusterHybridIndex(RedisIndexBase):
    """KNN + BM25 over one RediSearch index per primary of a Redis Cluster, fused by RRF."""

    writer: ClusterWriter

    def __init__(
        self,
        cluster: RedisCluster,
        url: str,
        *,
        embedder_name: str,
        dimension: int,
        index_name: str = DEFAULT_INDEX_NAME,
        vector: VectorIndexParams | None = None,
        rrf_k: int = DEFAULT_RRF_K,
        rrf_candidates: int = FUSION_CANDIDATES,
        timeout_seconds: float = 10.0,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        check_options(index_name, dimension=dimension, rrf_k=rrf_k, rrf_candidates=rrf_candidates)
        self.cluster = cluster
        self.url = url
        self.timeout_seconds = timeout_seconds
        self.layout = ClusterLayout(index_name)
        super().__init__(
            embedder_name=embedder_name,
            dimension=dimension,
            index_name=index_name,
            vector=vector,
            rrf_k=rrf_k,
            rrf_candidates=rrf_candidates,
            location=redact_url(url),
            chunk_prefix=self.layout.chunk_prefix,
        )
        self.topology = ClusterTopology(url, self.schema, timeout_seconds, max_connections)
        self.writer = ClusterWriter(self.topology, self.layout)

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        timeout_seconds: float = 10.0,
        **options: Unpack[ClusterOptions],
    ) -> RedisClusterHybridIndex:
        """Connect to the cluster `url` names a node of, and build the index on every
        primary (checking an existing one fits). The other options are the constructor's."""
        # Keyed reads and writes (MOVED, ASK and TRYAGAIN handled inside); one retry without
        # backoff, so a primary that is gone fails the request instead of stalling it.
        cluster = RedisCluster.from_url(
            url,
            protocol=2,
            decode_responses=False,
            socket_timeout=timeout_seconds,
            socket_connect_timeout=timeout_seconds,
            retry=Retry(NoBackoff(), 1),
        )
        index = cls(cluster, url, timeout_seconds=timeout_seconds, **options)
        async with index._closed_on_failure():
            await index.ensure_index()
        return index

    async def ensure_index(self) -> None:
        """Check the meta and build (or check) the index on every primary, then write the
        meta when there was none."""
        async with self._redis("opening the index"):
            meta = await self._checked_meta(self.cluster)
            self.topology.meta = meta
            await self.topology.refresh()  # checks each primary's index
            for shard in self.topology.primaries:
                await refuse_eviction(self.topology.client(shard.address), shard.address)
            # Written once every primary's index fits: a start with the wrong embedder must
            # not leave its meta behind for the right one to be refused by.
            if not meta:
                await self._write_meta(self.cluster)

    # --- reads ---------------------------------------------------------------------------
    async def search(self, query: SearchQuery) -> list[ScoredChunk]:
        vector = query_vector(query, self.dimension)
        hybrid = query.hybrid
        depth = max(query.k, self.rrf_candidates) if hybrid else query.k
        text_query = search_text(query) if hybrid else None
        rounds: list[Round] = []  # the ranking's, read from the primaries that returned them

        async def rank() -> Ranking:
            rounds.append(await self._search_rounds(vector, depth, text_query))
            return rounds[-1].ranking(query, depth, self.rrf_k)

        async with self._redis("search"):
            ranking, stored = await read_ranked(rank, lambda ids: self._read(rounds[-1], ids))
            if not hybrid:
                return dense_results(
                    (similarity, fields)
                    for (_, similarity), fields in zip(ranking.fused, stored, strict=True)
                )
            return hybrid_results(ranking.fused, ranking.dense, ranking.bm25, stored, vector)

    async def _search_rounds(self, vector: np.ndarray, depth: int, text_query: str | None) -> Round:
        shards, found = await self._retried_round(vector, depth, text_query)
        moved = any(
            view is None or view.migrating or view.slots != shard.slots
            for view, shard in zip(found.views, shards, strict=True)
        )
        if not moved:
            return found
        await self.topology.refresh(found.nodes_reply, found.views)
        _, again = await self._retried_round(vector, depth, text_query)
        found.add(again)
        return found

    async def _retried_round(
        self, vector: np.ndarray, depth: int, text_query: str | None
    ) -> tuple[list[Shard], Round]:
        """One round on the current primaries. An index name whose slot moved or is moving
        (`MOVED`, `ASK`, `TRYAGAIN`) or an index gone missing rereads the topology (and
        builds what is missing) and tries again, as does a primary whose KNN hits came back
        without their distance, after checking every index again (one of other fields raises
        `IndexUnavailable`); a primary that is gone or hangs fails the search at once and
        makes the next one reread the topology."""
        for attempt in range(ROUND_ATTEMPTS):
            shards = await self.topology.shards()
            last = attempt == ROUND_ATTEMPTS - 1
            try:
                with self.topology.marks_stale():  # gone or hung: may be failed over
                    found = await self._round(shards, vector, depth, text_query)
                if not found.unscored or last:
                    return shards, found  # unscored hits left: the read drops them
                logger.warning(
                    "Redis primaries %s return KNN hits without a distance: checking their indexes",
                    ", ".join(found.unscored),
                )
                self.topology.forget_indexes()
            except (MovedError, AskError, TryAgainError):
                if last:
                    raise
                await asyncio.sleep(0.02 * (attempt + 1))
            except ResponseError as exc:
                if not is_missing_index(exc) or last:
                    raise
                self.topology.forget_indexes()  # flushed or dropped: build it again
            self.topology.stale = True
        raise AssertionError("unreachable")

    async def _round(
        self,
        shards: Sequence[Shard],
        vector: np.ndarray,
        depth: int,
        text_query: str | None,
    ) -> Round:
        """Every primary searched concurrently, all within one `timeout_seconds`: a primary
        slow on each of its commands cannot stretch the search past it."""
        order_key = self.layout.chunk_id_of
        try:
            async with asyncio.timeout(self.timeout_seconds):
                replies = await asyncio.gather(
                    *(
                        search_shard(
                            self.topology.client(s.address), s, vector, depth, text_query, order_key
                        )
                        for s in shards
                    )
                )
        except TimeoutError as exc:  # the deadline's (a socket's is redis' TimeoutError)
            raise RedisTimeoutError(
                f"not every primary answered within {self.timeout_seconds:g} s"
            ) from exc
        return Round.merged(shards, replies, order_key)

    async def _read(self, found: Round, ids: Sequence[str]) -> list[dict[str, Any] | None]:
        """The stored fields of each passage, read from the primary that returned it (a
        passage moved since follows its `ASK` or `MOVED`)."""
        by_node: dict[str, list[int]] = {}
        for position, chunk_id in enumerate(ids):
            by_node.setdefault(found.where[chunk_id], []).append(position)
        rows: list[Any] = [None] * len(ids)
        for address, positions in by_node.items():
            commands = [("HMGET", found.keys[ids[p]], *RETURNED) for p in positions]
            replies = await self.topology.keyed(address, commands)
            for position, row in zip(positions, replies, strict=True):
                rows[position] = row
        return stored_fields(rows)

    async def list_sources(self) -> list[SourceInfo]:
        async with self._redis("listing sources"):
            names = await self.writer.source_names()
            rows = await self.topology.run(
                [("HMGET", self.layout.source_key(n), "content_hash", "chunks") for n in names]
            )
            return [
                source_info(s, row)
                for s, row in zip(names, rows, strict=True)
                if any(value is not None for value in row)
            ]

    async def describe(self) -> dict[str, Any]:
        async with self._redis("describe"):
            for attempt in range(ROUND_ATTEMPTS):
                try:
                    shards, infos = await self.topology.on_primaries(self._index_infos)
                    break
                except (MovedError, AskError, TryAgainError):  # an index name's slot moved
                    if attempt == ROUND_ATTEMPTS - 1:
                        raise
                    self.topology.stale = True
                    await asyncio.sleep(0.02 * (attempt + 1))
            sources = len(await self.writer.source_names())
        if any(info is None for info in infos):
            raise IndexUnavailable(f"the Redis index {self.index_name!r} is missing on a primary")
        present = [info for info in infos if info is not None]
        return self._description(
            "redis-cluster", present, int(sources), primaries=[s.address for s in shards]
        )

    async def _index_infos(self, shards: list[Shard]) -> tuple[list[Shard], list[IndexInfo | None]]:
        infos = [await index_info(self.topology.client(s.address), s.index) for s in shards]
        return shards, infos

    async def _close_clients(self) -> None:
        await self.topology.aclose()
        await self.cluster.aclose()
