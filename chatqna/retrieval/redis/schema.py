"""The RediSearch index's schema and lifecycle, shared by the single-node and cluster stores.

One index covers the hashes under a key prefix: `terms` (the passage pre-tokenised by the
embedded BM25's tokeniser, full text, unstemmed), `chunk_id`, `source` (tags),
`chunk_index` (numeric), `embedding` (a FLOAT32 cosine vector field, HNSW or FLAT) and
`digest` (a case-sensitive tag, sortable and not indexed: a search returns it from the
index itself, which a cluster node does for no other stored field). It is
created with `STOPWORDS 0`: stop words are dropped client-side, and an OR query that starts
with two stop words crashes RediSearch 2.10 (see site/docs/retrieval.md).

`FT.INFO` is read and parsed once per call into `IndexInfo`; `ensure_index` creates the
index when missing, waits for `FT.CREATE`'s scan of existing keys, and refuses an index
built for another embedder, dimension or layout format. On a Redis Cluster the same index is
created on every primary (the search module of Redis 7.4 has no coordinator), so all of it
takes a client connected to one node.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Literal

import redis.asyncio as aioredis
from redis.commands.search.field import NumericField, TagField, TextField, VectorField
from redis.commands.search.index_definition import IndexDefinition, IndexType
from redis.exceptions import ResponseError
from redis.typing import EncodableT, FieldT

from chatqna.errors import EvictingIndexServer, IndexUnavailable

logger = logging.getLogger(__name__)

DEFAULT_INDEX_NAME = "rag-redis"
# The layout format `<name>:meta` records (and each chunk's digest covers): the pre-tokenised
# `terms` field is the only full-text field, so BM25 matches the embedded index's, and
# `digest` is a sortable field, which a search on a cluster node can return. An index of any
# other format is refused.
FORMAT_VERSION = "3"
# Textbook BM25 (the classic `BM25` scorer has no per-passage length normalisation and an
# integer idf); the tests' reference model (`tests/oracles/redisearch_bm25.py`) mirrors it.
BM25_SCORER = "BM25STD"


def text(value: Any) -> str:
    """A reply value as text (replies are bytes: the client does not decode)."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def pairs(flat: Any) -> dict[str, Any]:
    """A RESP2 flat `[name, value, name, value, ...]` list (or a dict) as a dict."""
    if isinstance(flat, dict):
        return {text(k): v for k, v in flat.items()}
    items = list(flat)
    return dict(zip(map(text, items[::2]), items[1::2], strict=False))


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

    def field(self, dimension: int) -> VectorField:
        attributes: dict[str, Any] = {"TYPE": "FLOAT32", "DIM": dimension}
        attributes["DISTANCE_METRIC"] = "COSINE"
        if self.algorithm == "HNSW":
            attributes |= {"M": self.m, "EF_CONSTRUCTION": self.ef_construction}
            attributes["EF_RUNTIME"] = self.ef_runtime
        return VectorField("embedding", self.algorithm, attributes)


@dataclass(frozen=True)
class IndexInfo:
    """What `FT.INFO` says that the stores use, parsed once."""

    documents: int
    indexing: bool
    percent_indexed: float
    vector_dimension: str | None  # None: no `embedding` vector field
    has_terms: bool
    sortable_digest: bool  # `digest` is held in the index, as it was stored

    @classmethod
    def parse(cls, reply: Any) -> IndexInfo:
        fields = pairs(reply)
        attributes: dict[str, dict[str, Any]] = {}
        flags: dict[str, set[str]] = {}  # trailing words of each attribute (SORTABLE, UNF)
        for attribute in fields.get("attributes", []):
            described = pairs(attribute)
            name = text(described.get("identifier", ""))
            attributes[name] = described
            flags[name] = {text(item) for item in attribute}
        vector = attributes.get("embedding")
        dimension = None
        if vector is not None and text(vector.get("type", "VECTOR")).upper() == "VECTOR":
            dimension = text(vector.get("dim", ""))
        return cls(
            documents=int(float(text(fields.get("num_docs", 0)))),
            indexing=text(fields.get("indexing", 0)) not in ("0", "0.0"),
            percent_indexed=float(text(fields.get("percent_indexed", 1))),
            vector_dimension=dimension,
            has_terms="terms" in attributes,
            sortable_digest={"SORTABLE", "UNF"} <= flags.get("digest", set()),
        )


async def index_info(client: aioredis.Redis, name: str) -> IndexInfo | None:
    """The index's `FT.INFO`, or None when there is no such index on this node."""
    try:
        # The raw reply: redis-py's own FT.INFO parsing differs between versions.
        reply = await client.execute_command("FT.INFO", name)  # type: ignore[no-untyped-call]
    except ResponseError as exc:
        if "unknown index" in str(exc).lower() or "no such index" in str(exc).lower():
            return None
        raise
    return IndexInfo.parse(reply)


@dataclass(frozen=True)
class IndexSchema:
    """The index a store needs: its name, key prefix, embedder and vector field."""

    name: str
    chunk_prefix: str
    embedder_name: str
    dimension: int
    vector: VectorIndexParams

    def meta(self) -> dict[FieldT, EncodableT]:
        """The `<name>:meta` hash: what the index was built for, in which layout format."""
        return {
            "embedder": self.embedder_name,
            "dimension": self.dimension,
            "format": FORMAT_VERSION,
        }

    async def create(self, client: aioredis.Redis) -> None:
        fields = [
            TextField("terms", no_stem=True),
            TagField("chunk_id"),
            TagField("source"),
            NumericField("chunk_index"),
            self.vector.field(self.dimension),
            # A case-sensitive sortable tag keeps the value as stored (UNF).
            TagField("digest", case_sensitive=True, sortable=True, no_index=True),
        ]
        definition = IndexDefinition(  # type: ignore[no-untyped-call]
            prefix=[self.chunk_prefix], index_type=IndexType.HASH
        )
        try:
            await client.ft(self.name).create_index(fields, definition=definition, stopwords=[])
        except ResponseError as exc:
            if "already exists" not in str(exc).lower():  # another process was first
                raise

    async def ensure(self, client: aioredis.Redis) -> IndexInfo:
        """Create the index on this node when missing, and check the one found."""
        info = await index_info(client, self.name)
        if info is None:
            await self.create(client)
            info = await self.wait_for_initial_scan(client)
        if info is None:
            raise IndexUnavailable(f"Redis index {self.name!r} was not created")
        return info

    async def wait_for_initial_scan(
        self, client: aioredis.Redis, timeout_seconds: float = 60.0
    ) -> IndexInfo | None:
        """Wait while `FT.CREATE` scans the keyspace for existing passages.

        A passage written during that scan is indexed twice (once by the write, once by the
        scan), which skews BM25's statistics for good; measured with 20,000 unrelated keys
        in the database.
        """
        deadline = time.monotonic() + timeout_seconds
        while True:
            info = await index_info(client, self.name)
            if info is None or not info.indexing:
                return info
            if time.monotonic() > deadline:
                logger.warning(
                    "Redis index %r still scans existing keys after %.0f s; writing anyway",
                    self.name,
                    timeout_seconds,
                )
                return info
            await asyncio.sleep(0.01)

    def mismatch(self, embedder: str, dimension: str) -> IndexUnavailable:
        return IndexUnavailable(
            f"the Redis index {self.name!r} was built with embedder {embedder!r} "
            f"({dimension} dimensions); the configured embedder is {self.embedder_name!r} "
            f"({self.dimension}). Use another INDEX_NAME, delete the index, or switch the "
            "embedder back."
        )

    def unfit(self, found: str) -> IndexUnavailable:
        """The refusal of an index that `found` shows is not of this version's format."""
        return IndexUnavailable(
            f"the Redis index {self.name!r} {found}; this version needs layout format "
            f"{FORMAT_VERSION} (a pre-tokenised `terms` field for BM25, and a sortable "
            "`digest` field a search returns). Use another INDEX_NAME, or drop it with its "
            f"passages (FT.DROPINDEX {self.name} DD; on a cluster, each primary's "
            f"{self.name}-shard-{{n}} of FT._LIST), delete {self.name}:meta and ingest again."
        )

    def check_meta(self, meta: dict[bytes, bytes], format_version: str) -> None:
        """Refuse an index built for another embedder, dimension or layout format."""
        embedder = text(meta.get(b"embedder", b""))
        dimension = text(meta.get(b"dimension", b""))
        if embedder != self.embedder_name or dimension != str(self.dimension):
            raise self.mismatch(embedder, dimension)
        found = text(meta.get(b"format", b"none"))
        if found != format_version:
            raise self.unfit(f"has layout format {found}")

    def check_info(self, info: IndexInfo, meta: dict[bytes, bytes]) -> None:
        """Refuse an index whose fields are not the ones this version creates."""
        if info.vector_dimension is None:
            raise IndexUnavailable(
                f"the Redis index {self.name!r} has no `embedding` vector field: it was "
                "not created by ChatQnA. Use another INDEX_NAME."
            )
        if info.vector_dimension != str(self.dimension):
            embedder = text(meta.get(b"embedder", b"(unknown)"))
            raise self.mismatch(embedder, info.vector_dimension)
        if not info.has_terms or not info.sortable_digest:
            # The index's own fields are checked too: its meta may be another's, or gone.
            missing = "`terms` field" if not info.has_terms else "sortable `digest` field"
            raise self.unfit(f"has no {missing}")


async def eviction_policy(client: aioredis.Redis) -> str | None:
    """The server's `maxmemory-policy`: `CONFIG GET`, or `INFO memory` where `CONFIG` is
    renamed or disabled (managed services), or None when neither tells."""
    try:
        policy = (await client.config_get("maxmemory-policy")).get("maxmemory-policy")
        if policy is not None:
            return str(policy)
    except ResponseError:
        pass
    try:
        found = (await client.info("memory")).get("maxmemory_policy")
    except ResponseError:
        return None
    return None if found is None else str(found)


async def refuse_eviction(client: aioredis.Redis, where: str) -> None:
    """Refuse a server that may evict the index's keys; warn when its policy is unknown.
    A `volatile-*` policy evicts only keys with a time to live, which the index never sets,
    so it is as safe as `noeviction` (a Redis shared with a cache may well run one)."""
    policy = await eviction_policy(client)
    if policy is None:
        logger.warning(
            "Redis at %s does not tell its maxmemory-policy; it must be noeviction", where
        )
    elif policy != "noeviction" and not policy.startswith("volatile-"):
        raise EvictingIndexServer(
            f"Redis at {where} runs with maxmemory-policy {policy}: under memory pressure it "
            "would silently evict passages and leave the index half-visible. Start it with "
            "`--maxmemory-policy noeviction` (or `CONFIG SET maxmemory-policy noeviction`, "
            "on every node of a cluster; a volatile-* policy also does); a full server then "
            "refuses writes instead."
        )
