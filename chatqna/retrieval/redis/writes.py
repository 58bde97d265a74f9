"""Writes of the single-node Redis store: replacing and deleting sources, chunk by chunk.

Layout, for an index name `N`:

    N:chunk:<chunk id>      hash: `chunk_hash` (content, terms, chunk_id, source, title,
                            chunk_index, embedding, digest of all the others: an unchanged
                            chunk is not rewritten)
    N:sources               set of source names
    N:source:<source>       hash: content_hash, chunks
    N:source-chunks:<src>   set of the source's chunk ids (what a replace or delete removes)

Writes are pipelined, not transactional: a reader may briefly see a source half replaced.
A source's content hash is cleared before its chunks change and written last, so a replace
that fails half-way is redone by the next ingestion instead of being skipped as unchanged.
(The cluster store, `chatqna.retrieval.redis.cluster`, replaces a source atomically.)
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import numpy as np
import redis.asyncio as aioredis
from redis.typing import EncodableT, FieldT

from chatqna.backends.protocols import SourceBatch
from chatqna.documents import INDEXED_TEXT_VERSION, Chunk
from chatqna.retrieval.query import tokenize
from chatqna.retrieval.redis.schema import FORMAT_VERSION, text

_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")


def chunk_digest(chunk: Chunk, vector: bytes) -> str:
    digest = hashlib.blake2b(digest_size=16)
    parts = (FORMAT_VERSION, INDEXED_TEXT_VERSION, chunk.text, chunk.source, chunk.title)
    for part in (*parts, str(chunk.index)):
        digest.update(part.encode("utf-8"))
        digest.update(b"\0")
    digest.update(vector)
    return digest.hexdigest()


def chunk_hash(chunk: Chunk, vector: bytes, digest: str) -> dict[FieldT, EncodableT]:
    """The fields of a chunk's hash; `terms` is what BM25 indexes (its title line and text),
    `content` what a user sees."""
    return {
        "content": chunk.text,
        "terms": " ".join(tokenize(chunk.indexed_text)),
        "chunk_id": chunk.id,
        "source": chunk.source,
        "title": chunk.title,
        "chunk_index": chunk.index,
        "embedding": vector,
        "digest": digest,
    }


def glob_prefix(prefix: str) -> str:
    """A SCAN pattern for every key starting with `prefix`."""
    return _GLOB_SPECIAL.sub(r"\\\1", prefix) + "*"


def check_batches(batches: Sequence[SourceBatch], dimension: int) -> None:
    for batch in batches:
        if batch.embeddings.shape != (len(batch.chunks), dimension):
            raise ValueError(f"{batch.source}: embeddings do not match its chunks")


def vector_rows(batch: SourceBatch) -> list[bytes]:
    vectors = np.ascontiguousarray(batch.embeddings, dtype=np.float32)
    return [vectors[row].tobytes() for row in range(len(batch.chunks))]


class SingleNodeWriter:
    """The writes of `RedisHybridIndex`, pipelined in batches of `write_batch` chunks."""

    def __init__(self, client: aioredis.Redis, index_name: str, write_batch: int) -> None:
        self.client = client
        self.index_name = index_name
        self.write_batch = write_batch
        self.chunk_prefix = f"{index_name}:chunk:"
        self.sources_key = f"{index_name}:sources"

    def chunk_key(self, chunk_id: str) -> str:
        return self.chunk_prefix + chunk_id

    def source_key(self, source: str) -> str:
        return f"{self.index_name}:source:{source}"

    def source_chunks_key(self, source: str) -> str:
        return f"{self.index_name}:source-chunks:{source}"

    async def replace_sources(self, batches: Sequence[SourceBatch]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for batch in batches:
            pipe.smembers(self.source_chunks_key(batch.source))
            pipe.hset(self.source_key(batch.source), "content_hash", "")
        replies = await pipe.execute()
        for batch, old in zip(batches, replies[::2], strict=True):
            await self._write_chunks(batch)
            stale = {text(i) for i in old} - {c.id for c in batch.chunks}
            await self._remove_chunks(batch.source, sorted(stale))
        pipe = self.client.pipeline(transaction=False)
        for batch in batches:
            pipe.hset(
                self.source_key(batch.source),
                mapping={"content_hash": batch.content_hash, "chunks": len(batch.chunks)},
            )
            pipe.sadd(self.sources_key, batch.source)
        await pipe.execute()

    async def _write_chunks(self, batch: SourceBatch) -> None:
        members = self.source_chunks_key(batch.source)
        all_rows = vector_rows(batch)
        for start in range(0, len(batch.chunks), self.write_batch):
            chunks = batch.chunks[start : start + self.write_batch]
            rows = all_rows[start : start + len(chunks)]
            digests = [chunk_digest(c, row) for c, row in zip(chunks, rows, strict=True)]
            pipe = self.client.pipeline(transaction=False)
            for chunk in chunks:
                pipe.hget(self.chunk_key(chunk.id), "digest")
            stored = await pipe.execute()
            pipe = self.client.pipeline(transaction=False)
            # The set first: every chunk key that exists is reachable from its source.
            pipe.sadd(members, *(c.id for c in chunks))
            for chunk, row, digest, old in zip(chunks, rows, digests, stored, strict=True):
                if old is not None and text(old) == digest:
                    continue  # unchanged: rewriting it would only skew BM25 until the GC runs
                pipe.hset(self.chunk_key(chunk.id), mapping=chunk_hash(chunk, row, digest))
            await pipe.execute()

    async def _remove_chunks(self, source: str, chunk_ids: Sequence[str]) -> int:
        removed = 0
        for start in range(0, len(chunk_ids), self.write_batch):
            ids = chunk_ids[start : start + self.write_batch]
            pipe = self.client.pipeline(transaction=False)
            pipe.delete(*(self.chunk_key(i) for i in ids))
            pipe.srem(self.source_chunks_key(source), *ids)
            deleted, _ = await pipe.execute()
            removed += int(deleted)
        return removed

    async def delete_sources(self, sources: Sequence[str] | None) -> int:
        if sources is None:
            return await self._delete_everything()
        removed = 0
        for source in dict.fromkeys(sources):
            members = await self.client.smembers(self.source_chunks_key(source))
            removed += await self._remove_chunks(source, sorted(text(m) for m in members))
            pipe = self.client.pipeline(transaction=False)
            pipe.delete(self.source_chunks_key(source), self.source_key(source))
            pipe.srem(self.sources_key, source)
            await pipe.execute()
        return removed

    async def _delete_everything(self) -> int:
        """Every key of this index but its meta, found by SCAN (orphans included)."""
        removed = await self._delete_matching(self.chunk_prefix)
        for prefix in (f"{self.index_name}:source:", f"{self.index_name}:source-chunks:"):
            await self._delete_matching(prefix)
        await self.client.delete(self.sources_key)
        return removed

    async def _delete_matching(self, prefix: str) -> int:
        removed = 0
        keys: list[bytes] = []
        async for key in self.client.scan_iter(match=glob_prefix(prefix), count=1000):
            keys.append(key)
            if len(keys) >= self.write_batch:
                removed += int(await self.client.delete(*keys))
                keys = []
        if keys:
            removed += int(await self.client.delete(*keys))
        return removed
