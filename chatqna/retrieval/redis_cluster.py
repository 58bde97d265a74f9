"""The retriever on a Redis Cluster: one RediSearch index per primary, searched by all of them.

Redis 7.4's search module has no coordinator: an index covers the keys of the node it
lives on. So every primary gets the index (`redis_cluster_topology`: under a name hashed
into one of its slots, since the module routes its commands by the index name), and a
search sends the KNN and the BM25 query to every primary concurrently, one pipelined round
trip each, for each leg's best `max(k, rrf_candidates)` passages. The client merges each
leg (by similarity, and by BM25 score with ties ordered by chunk id, as one node orders
them), fuses the two with `reciprocal_rank_fusion` exactly as `RedisHybridIndex` does, and
reads the `k` fused passages through the cluster client. A passage found twice (a slot in
migration) counts once.

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
search reads it. A primary that cannot be reached fails the search with `IndexUnavailable`
(503) and the next search rereads the topology from any node: while its replica is being
promoted (about `cluster-node-timeout` plus a second of election), searches fail, then they
succeed again. Writes go to the primary that owns the source's slot
(`redis_cluster_writes`), atomically, and are acknowledged once a replica has them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
from typing import Any, cast
from urllib.parse import urlsplit

import numpy as np
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AskError, ConnectionError, MovedError, ResponseError, TryAgainError

from chatqna.backends.protocols import SearchQuery, SourceBatch, SourceInfo
from chatqna.documents import ScoredChunk
from chatqna.errors import IndexUnavailable
from chatqna.retrieval.bm25 import WeightedQuery
from chatqna.retrieval.fusion import DEFAULT_RRF_K, FUSION_CANDIDATES, reciprocal_rank_fusion
from chatqna.retrieval.redis_cluster_topology import (
    ClusterNode,
    Shard,
    own_view,
    parse_cluster_nodes,
    shards_of,
)
from chatqna.retrieval.redis_cluster_writes import (
    DELETE_SCRIPT,
    REDIRECT_ATTEMPTS,
    REPLACE_SCRIPT,
    ClusterLayout,
    replace_call,
)
from chatqna.retrieval.redis_query import (
    RETURNED,
    bm25_query,
    bm25_search,
    knn_search,
)
from chatqna.retrieval.redis_replies import (
    hybrid_results,
    knn_hits,
    redact_url,
    scored_chunk,
    scored_hits,
    stored_fields,
    straddles,
    top_bm25,
    unavailable_on_error,
)
from chatqna.retrieval.redis_schema import (
    DEFAULT_INDEX_NAME,
    FORMAT_VERSION,
    IndexInfo,
    IndexSchema,
    VectorIndexParams,
    index_info,
    text,
)
from chatqna.retrieval.redis_store import query_vector
from chatqna.retrieval.redis_writes import check_batches, glob_prefix

logger = logging.getLogger(__name__)

REPLICA_WAIT_MS = 2000  # how long a write waits for its replica's acknowledgement


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


@dataclasses.dataclass
class _Round:
    """What one search round found on the primaries, merged, by chunk id."""

    dense: dict[str, float]  # id: cosine similarity
    bm25: dict[str, float]
    keys: dict[str, str]  # id: key
    views: list[ClusterNode | None]
    nodes_reply: bytes


class RedisClusterHybridIndex:
    """KNN + BM25 over one RediSearch index per primary of a Redis Cluster, fused by RRF."""

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
    ) -> None:
        if min(dimension, rrf_k, rrf_candidates) < 1:
            raise ValueError("dimension, rrf_k and rrf_candidates must be at least 1")
        if not index_name or any(c.isspace() for c in index_name):
            raise ValueError(f"invalid index name {index_name!r}")
        self.cluster = cluster
        self.url = url
        self.embedder_name = embedder_name
        self.dimension = dimension
        self.index_name = index_name
        self.vector = vector if vector is not None else VectorIndexParams()
        self.rrf_k = rrf_k
        self.rrf_candidates = rrf_candidates
        self.timeout_seconds = timeout_seconds
        self.location = redact_url(url)
        self.layout = ClusterLayout(index_name)
        self.schema = IndexSchema(
            index_name, self.layout.chunk_prefix, embedder_name, dimension, self.vector
        )
        self._nodes: list[ClusterNode] = []
        self._shards: list[Shard] = []
        self._ready: set[tuple[str, str]] = set()  # (address, index) with the index built
        self._clients: dict[str, aioredis.Redis] = {}
        self._writers: dict[str, aioredis.Redis] = {}
        self._stale = True
        self._topology_lock = asyncio.Lock()
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
        timeout_seconds: float = 10.0,
    ) -> RedisClusterHybridIndex:
        """Connect to the cluster `url` names a node of, and build the index on every
        primary (checking an existing one fits)."""
        cluster = RedisCluster.from_url(
            url,
            protocol=2,
            decode_responses=False,
            socket_timeout=timeout_seconds,
            socket_connect_timeout=timeout_seconds,
        )
        index = cls(
            cluster,
            url,
            embedder_name=embedder_name,
            dimension=dimension,
            index_name=index_name,
            vector=vector,
            rrf_k=rrf_k,
            rrf_candidates=rrf_candidates,
            timeout_seconds=timeout_seconds,
        )
        try:
            await index.ensure_index()
        except BaseException:
            await index.aclose()
            raise
        return index

    def _redis(self, action: str) -> Any:
        return unavailable_on_error(self.index_name, self.location, action)

    # --- connections and topology ------------------------------------------------------------
    def _client(self, address: str) -> aioredis.Redis:
        """The search connection pool of one node: one immediate retry (a pooled connection
        the node closed), no backoff, so a primary that is gone fails the search at once."""
        client = self._clients.get(address)
        if client is None:
            client = self._connect(address, retry=Retry(NoBackoff(), 1))
            self._clients[address] = client
        return client

    def _connect(self, address: str, **extra: Any) -> aioredis.Redis:
        host, _, port = address.rpartition(":")
        parts = urlsplit(self.url)
        return aioredis.Redis(
            host=host,
            port=int(port),
            username=parts.username,
            password=parts.password,
            protocol=2,
            decode_responses=False,
            socket_timeout=self.timeout_seconds,
            socket_connect_timeout=self.timeout_seconds,
            **extra,
        )

    def _writer(self, address: str) -> aioredis.Redis:
        """A connection of its own per primary: `WAIT` counts that connection's writes."""
        writer = self._writers.get(address)
        if writer is None:
            no_retry = Retry(NoBackoff(), 0)
            writer = self._connect(address, single_connection_client=True, retry=no_retry)
            self._writers[address] = writer
        return writer

    async def ensure_index(self) -> None:
        """Check or write the meta, then build the index on every primary."""
        async with self._redis("opening the index"):
            meta = cast(dict[bytes, bytes], await self.cluster.hgetall(self.layout.meta_key))
            if meta:
                self.schema.check_meta(meta, FORMAT_VERSION)
            else:
                await self.cluster.hset(self.layout.meta_key, mapping=self.schema.meta())
            await self._refresh()
            for shard in self._shards:
                info = await index_info(self._client(shard.address), shard.index)
                if info is not None:
                    self.schema.check_info(info, meta)

    async def _nodes_reply(self) -> bytes:
        """`CLUSTER NODES` from the first node that answers: known nodes, then the URL's."""
        parts = urlsplit(self.url)
        addresses = [node.address for node in self._nodes if not node.failed]
        addresses += [node.address for node in self._nodes if node.failed]
        addresses.append(f"{parts.hostname or '127.0.0.1'}:{parts.port or 6379}")
        error: Exception | None = None
        for address in dict.fromkeys(addresses):
            try:
                reply = await self._client(address).execute_command("CLUSTER", "NODES")  # type: ignore[no-untyped-call]
                return cast(bytes, reply)
            except (ConnectionError, OSError) as exc:
                error = exc
        raise ConnectionError(f"no cluster node answers CLUSTER NODES: {error}")

    async def _refresh(self, reply: bytes | None = None, views: Sequence[Any] = ()) -> None:
        """Reread the topology (from `reply` and each primary's own `views` when given) and
        build the index on every primary that lacks it, before searching it."""
        async with self._topology_lock:
            nodes = parse_cluster_nodes(reply if reply is not None else await self._nodes_reply())
            own = {view.node_id: view for view in views if view is not None}
            nodes = [own.get(node.node_id, node) for node in nodes]
            shards = shards_of(nodes, self.index_name)
            for shard in shards:
                if (shard.address, shard.index) not in self._ready:
                    await self._build(shard)
            self._nodes, self._shards, self._stale = nodes, shards, False

    async def _build(self, shard: Shard) -> IndexInfo:
        client = self._client(shard.address)
        info = await dataclasses.replace(self.schema, name=shard.index).ensure(client)
        self._ready.add((shard.address, shard.index))
        logger.info("Redis index %r ready on primary %s", shard.index, shard.address)
        return info

    async def _current_shards(self) -> list[Shard]:
        if self._stale:
            await self._refresh()
        return self._shards

    # --- reads ---------------------------------------------------------------------------
    async def search(self, query: SearchQuery) -> list[ScoredChunk]:
        vector = query_vector(query, self.dimension)
        hybrid = query.hybrid
        depth = max(query.k, self.rrf_candidates) if hybrid else query.k
        text_query = None
        if hybrid:
            lexical = WeightedQuery.parse(query.text, query.bm25_history, query.bm25_history_weight)
            text_query = bm25_query(lexical)
        async with self._redis("search"):
            found = await self._search_rounds(vector, depth, text_query)
            dense = dict(sorted(found.dense.items(), key=lambda hit: (-hit[1], hit[0]))[:depth])
            if not hybrid:
                rows = await self._read([found.keys[i] for i in dense])
                return [
                    scored_chunk(fields, {"dense": similarity}, "dense")
                    for similarity, fields in zip(dense.values(), rows, strict=True)
                    if fields is not None
                ]
            bm25 = dict(sorted(found.bm25.items(), key=lambda hit: (-hit[1], hit[0]))[:depth])
            fused = reciprocal_rank_fusion(
                [list(dense), list(bm25)], k=self.rrf_k, weights=query.fusion_weights
            )[: query.k]
            stored = await self._read([found.keys[i] for i, _ in fused])
        return hybrid_results(fused, dense, bm25, stored, vector)

    async def _search_rounds(
        self, vector: np.ndarray, depth: int, text_query: str | None
    ) -> _Round:
        shards = await self._current_shards()
        try:
            found = await self._round(shards, vector, depth, text_query)
        except MovedError:  # an index name whose slot moved: reread, search again
            await self._refresh()
            return await self._round(self._shards, vector, depth, text_query)
        except ResponseError as exc:
            if "no such index" not in str(exc).lower() and "unknown index" not in str(exc).lower():
                raise
            self._ready.clear()  # flushed behind our back: build again
            await self._refresh()
            return await self._round(self._shards, vector, depth, text_query)
        except (ConnectionError, OSError):
            self._stale = True  # a primary is gone: the next search rereads the topology
            raise
        moved = any(
            view is None or view.migrating or view.slots != shard.slots
            for view, shard in zip(found.views, shards, strict=True)
        )
        if not moved:
            return found
        await self._refresh(found.nodes_reply, found.views)
        again = await self._round(self._shards, vector, depth, text_query)
        for chunk_id, similarity in again.dense.items():
            found.dense[chunk_id] = max(similarity, found.dense.get(chunk_id, similarity))
        for chunk_id, score in again.bm25.items():
            found.bm25[chunk_id] = max(score, found.bm25.get(chunk_id, score))
        found.keys.update(again.keys)
        return found

    async def _round(
        self,
        shards: Sequence[Shard],
        vector: np.ndarray,
        depth: int,
        text_query: str | None,
    ) -> _Round:
        replies = await asyncio.gather(
            *(self._search_shard(s, vector, depth, text_query) for s in shards)
        )
        found = _Round({}, {}, {}, [], b"")
        for dense, bm25, nodes_reply in replies:
            for key, similarity in dense:
                chunk_id = self.layout.chunk_id_of(key)
                found.keys[chunk_id] = key
                found.dense[chunk_id] = max(similarity, found.dense.get(chunk_id, similarity))
            for key, score in bm25.items():
                chunk_id = self.layout.chunk_id_of(key)
                found.keys[chunk_id] = key
                found.bm25[chunk_id] = max(score, found.bm25.get(chunk_id, score))
            found.views.append(own_view(nodes_reply))
            found.nodes_reply = found.nodes_reply or nodes_reply
        return found

    async def _search_shard(
        self, shard: Shard, vector: np.ndarray, depth: int, text_query: str | None
    ) -> tuple[list[tuple[str, float]], dict[str, float], bytes]:
        """One primary's best `depth` per leg (BM25 ties by chunk id), and its view.

        Only ids and scores: in cluster mode this build of the search module cannot load a
        document's fields (they come back empty, from FT.AGGREGATE's LOAD too), so passages
        are read with HMGET, and a BM25 tie that straddles the cut is resolved by asking
        that primary for more hits until the tie ends, then sorting by chunk id."""
        client = self._client(shard.address)
        pipe = client.pipeline(transaction=False)
        pipe.execute_command(*knn_search(shard.index, vector, depth, fields=False))
        if text_query is not None:
            pipe.execute_command(*bm25_search(shard.index, text_query, depth))
        pipe.execute_command("CLUSTER", "NODES")
        replies = await pipe.execute()
        bm25: dict[str, float] = {}
        if text_query is not None:
            hits = scored_hits(replies[1])
            wanted = depth
            while straddles(hits, depth) and len(hits) > wanted:
                wanted *= 2  # the tie goes on past the cut: ask for more of it
                args = bm25_search(shard.index, text_query, wanted)
                hits = scored_hits(await client.execute_command(*args))  # type: ignore[no-untyped-call]
                if hits[-1][1] != hits[depth][1]:
                    break
            bm25 = top_bm25(hits, depth, None, order_key=self.layout.chunk_id_of)
        dense = [(key, similarity) for key, similarity, _ in knn_hits(replies[0])]
        return dense, bm25, cast(bytes, replies[-1])

    async def _read(self, keys: Sequence[str]) -> list[dict[str, Any] | None]:
        if not keys:
            return []
        pipe = self.cluster.pipeline(transaction=False)
        for key in keys:
            pipe.hmget(key, list(RETURNED))
        return stored_fields(await pipe.execute())

    async def list_sources(self) -> list[SourceInfo]:
        async with self._redis("listing sources"):
            members = await self.cluster.smembers(self.layout.sources_key)
            names = sorted(text(s) for s in members)
            pipe = self.cluster.pipeline(transaction=False)
            for source in names:
                pipe.hmget(self.layout.source_key(source), ["content_hash", "chunks"])
            rows = await pipe.execute() if names else []
        return [
            SourceInfo(source=s, chunks=int(text(n or b"0")), content_hash=text(h or b""))
            for s, (h, n) in zip(names, rows, strict=True)
            if h is not None or n is not None
        ]

    async def describe(self) -> dict[str, Any]:
        async with self._redis("describe"):
            shards = await self._current_shards()
            infos = [await index_info(self._client(s.address), s.index) for s in shards]
            sources = int(await self.cluster.scard(self.layout.sources_key))
        if any(info is None for info in infos):
            raise IndexUnavailable(f"the Redis index {self.index_name!r} is missing on a primary")
        present = [info for info in infos if info is not None]
        return {
            "kind": "redis-cluster",
            "url": self.location,
            "index": self.index_name,
            "primaries": [s.address for s in shards],
            "chunks": sum(info.documents for info in present),
            "sources": sources,
            "dimension": self.dimension,
            "algorithm": self.vector.algorithm,
            "indexing": any(info.indexing for info in present),
            "percent_indexed": min((info.percent_indexed for info in present), default=1.0),
        }

    # --- writes ------------------------------------------------------------------------------
    async def replace_sources(self, batches: Sequence[SourceBatch]) -> None:
        check_batches(batches, self.dimension)
        async with self._write_lock, self._redis("replacing sources"):
            for batch in batches:
                await self._replace_one(batch)
                await self.cluster.sadd(self.layout.sources_key, batch.source)

    async def _replace_one(self, batch: SourceBatch) -> None:
        pipe = self.cluster.pipeline(transaction=False)
        pipe.smembers(self.layout.source_chunks_key(batch.source))
        for chunk in batch.chunks:
            pipe.hget(self.layout.chunk_key(batch.source, chunk.id), "digest")
        old, *digests = await pipe.execute()
        keys, argv = replace_call(self.layout, batch, digests, {text(m) for m in old})
        await self._script(REPLACE_SCRIPT, keys, argv)

    async def delete_sources(self, sources: Sequence[str] | None) -> int:
        async with self._write_lock, self._redis("deleting sources"):
            if sources is None:
                return await self._delete_everything()
            removed = 0
            for source in dict.fromkeys(sources):
                members = await self.cluster.smembers(self.layout.source_chunks_key(source))
                keys = [
                    self.layout.source_key(source),
                    self.layout.source_chunks_key(source),
                    *(self.layout.chunk_key(source, text(m)) for m in sorted(members)),
                ]
                removed += int(await self._script(DELETE_SCRIPT, keys, []))
                await self.cluster.srem(self.layout.sources_key, source)
            return removed

    async def _delete_everything(self) -> int:
        """Every source, then any key of this index left on a primary (SCAN), but the meta."""
        names = [text(s) for s in await self.cluster.smembers(self.layout.sources_key)]
        removed = 0
        for source in names:
            members = await self.cluster.smembers(self.layout.source_chunks_key(source))
            keys = [
                self.layout.source_key(source),
                self.layout.source_chunks_key(source),
                *(self.layout.chunk_key(source, text(m)) for m in sorted(members)),
            ]
            removed += int(await self._script(DELETE_SCRIPT, keys, []))
        for shard in await self._current_shards():
            client = self._client(shard.address)
            for prefix in (
                self.layout.chunk_prefix,
                f"{self.index_name}:source:",
                f"{self.index_name}:source-chunks:",
            ):
                async for key in client.scan_iter(match=glob_prefix(prefix), count=1000):
                    deleted = int(await self.cluster.delete(key))
                    removed += deleted if prefix == self.layout.chunk_prefix else 0
        await self.cluster.delete(self.layout.sources_key)
        return removed

    async def _script(self, script: str, keys: list[str], argv: list[Any]) -> Any:
        """Run a write script on the primary that owns `keys[0]`'s slot, then wait for a
        replica; `MOVED` rereads the topology, `ASK` and `TRYAGAIN` retry."""
        slot = self.cluster.keyslot(keys[0])
        asking: str | None = None
        for attempt in range(REDIRECT_ATTEMPTS):
            shards = await self._current_shards()
            owner = next((s for s in shards if slot in s.slots), None)
            if owner is None:
                await self._refresh()
                continue
            address = asking or owner.address
            writer = self._writer(address)
            try:
                if asking is not None:
                    await writer.execute_command("ASKING")  # type: ignore[no-untyped-call]
                result = await writer.eval(script, len(keys), *keys, *argv)
            except MovedError:
                await self._refresh()
                asking = None
                continue
            except AskError as exc:
                asking = f"{exc.host}:{exc.port}"
                continue
            except TryAgainError:
                await asyncio.sleep(0.05 * (attempt + 1))
                asking = None
                continue
            except (ConnectionError, OSError):
                self._stale = True
                await self._drop_writer(address)
                raise
            target = next((s for s in shards if s.address == address), None)
            await self._wait_for_replica(writer, target)
            return result
        raise IndexUnavailable(
            f"Redis index {self.index_name!r}: slot {slot} kept moving; the write was not done"
        )

    async def _wait_for_replica(self, writer: aioredis.Redis, owner: Shard | None) -> None:
        """`WAIT` for one replica of `owner` (none to wait for: no live replica known)."""
        replicas = 0 if owner is None else min(owner.replicas, 1)
        if replicas == 0:
            return
        acked = int(await writer.execute_command("WAIT", replicas, REPLICA_WAIT_MS))  # type: ignore[no-untyped-call]
        if acked < replicas:
            raise IndexUnavailable(
                f"Redis index {self.index_name!r}: a write was not confirmed by a replica "
                f"within {REPLICA_WAIT_MS} ms and could be lost in a failover; retry it"
            )

    async def _drop_writer(self, address: str) -> None:
        writer = self._writers.pop(address, None)
        if writer is not None:
            await writer.aclose()

    async def aclose(self) -> None:
        for client in [*self._clients.values(), *self._writers.values()]:
            await client.aclose()
        self._clients.clear()
        self._writers.clear()
        await self.cluster.aclose()
