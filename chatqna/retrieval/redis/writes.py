"""Writes of the single-node Redis store: replacing and deleting sources, one transaction
per request.

Layout, for an index name `N`:

    N:chunk:<chunk id>      hash: `chunk_hash` (content, terms, chunk_id, source, title,
                            chunk_index, embedding, digest of all the others: an unchanged
                            chunk is not rewritten)
    N:sources               set of source names
    N:source:<source>       hash: content_hash, chunks
    N:source-chunks:<src>   set of the source's chunk ids (what a replace or delete removes)
    N:writes                a counter every write transaction increments

A write request (`replace_sources` or `delete_sources`, all its sources together) is one
`MULTI`/`EXEC` transaction: a reader sees every source of it as it was or as it is now, and
a failure leaves the index as it was. Redis refuses an `EXEC` as a whole when it is out of
memory (`maxmemory`), and drops the queued commands of a client that goes away before its
`EXEC` (a killed process). What the transaction writes depends on what is stored (the
stale chunk ids, the digests of unchanged chunks), read after `WATCH`ing the request's
source hashes, which every write of a source changes: a write that another process changed
a source under aborts and is prepared again (`WATCH_ATTEMPTS` times at most). Deleting
everything watches `N:writes`, so it conflicts with any write.

The price of one transaction: Redis holds the queued commands until the `EXEC` (about the
size of the changed chunks, vectors included), then indexes them all before it answers any
other client; searches wait meanwhile. On 2 cores, in HNSW with 384 dimensions, that is
about 0.3 ms a chunk for 10,000 chunks and 0.8-1.2 ms a chunk for 100,000 (82-118 s). So
a transaction is sent and waited for on a connection without a socket timeout, under a
deadline of its own that grows with the chunk keys it writes or deletes
(`transaction_deadline`); a `WATCH` waits up to the store's timeout, and every read on the
other connection up to its socket timeout. A transaction past its deadline fails, and Redis
may still apply it whole (as after a connection lost once its `EXEC` is sent).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
from collections.abc import AsyncIterator, Sequence
from typing import Any

import numpy as np
import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.exceptions import WatchError
from redis.typing import EncodableT, FieldT

from chatqna.backends.protocols import SourceBatch
from chatqna.documents import INDEXED_TEXT_VERSION, Chunk
from chatqna.errors import IndexUnavailable
from chatqna.retrieval.query import tokenize
from chatqna.retrieval.redis.schema import FORMAT_VERSION, text

_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")
WATCH_ATTEMPTS = 20  # tries of one write while other processes write the same sources
KEYS_PER_COMMAND = 1000  # keys or members per DEL, SADD or WATCH
# What a transaction may take per chunk key it writes or deletes, beyond the store's timeout:
# about four times the slowest rate measured on 2 cores (1.2 ms a chunk: 100,000 chunks of
# 384 dimensions written to HNSW in one transaction took 82-118 s; 50,000 of 768, 56 s;
# deleting 100,000, 48 s), for larger vectors and indexes, slower machines and load.
TRANSACTION_SECONDS_PER_KEY = 0.005


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


def transaction_deadline(timeout_seconds: float, keys: int) -> float:
    """How long a write transaction that writes or deletes `keys` chunk keys may take from
    its `MULTI` to its `EXEC`'s answer: the store's timeout, plus Redis' indexing time."""
    return timeout_seconds + keys * TRANSACTION_SECONDS_PER_KEY


@contextlib.asynccontextmanager
async def bounded(seconds: float, grace: float, what: str) -> AsyncIterator[None]:
    """The block within `seconds`, and what redis-py does once it cancelled the block within
    `grace` more: a transaction cancelled while it watches keys resets its connection with
    an `UNWATCH` sent on a new one, which waits for ever on a server that stopped answering
    when the connection has no socket timeout. Past either, redis' `TimeoutError`."""
    try:
        async with asyncio.timeout(seconds + grace):
            async with asyncio.timeout(seconds):
                yield
    except TimeoutError as exc:  # the deadline's (a socket's is redis' TimeoutError)
        raise RedisTimeoutError(f"no answer to {what} in {seconds:g} s") from exc


def vector_rows(batch: SourceBatch) -> list[bytes]:
    vectors = np.ascontiguousarray(batch.embeddings, dtype=np.float32)
    return [vectors[row].tobytes() for row in range(len(batch.chunks))]


class SingleNodeWriter:
    """The writes of `RedisHybridIndex`: each request one `MULTI`/`EXEC` transaction; reads
    are pipelined in batches of `write_batch` commands.

    `client` answers within its socket timeout, `timeout_seconds`; `transactions` (the same
    server) must have no socket timeout: each `WATCH` on it waits up to `timeout_seconds`
    and each transaction up to its `transaction_deadline`.
    """

    def __init__(
        self,
        client: aioredis.Redis,
        transactions: aioredis.Redis,
        index_name: str,
        write_batch: int,
        timeout_seconds: float,
    ) -> None:
        self.client = client
        self.transactions = transactions
        self.index_name = index_name
        self.write_batch = write_batch
        self.timeout_seconds = timeout_seconds
        self.chunk_prefix = f"{index_name}:chunk:"
        self.sources_key = f"{index_name}:sources"
        self.writes_key = f"{index_name}:writes"

    def chunk_key(self, chunk_id: str) -> str:
        return self.chunk_prefix + chunk_id

    def source_key(self, source: str) -> str:
        return f"{self.index_name}:source:{source}"

    def source_chunks_key(self, source: str) -> str:
        return f"{self.index_name}:source-chunks:{source}"

    async def replace_sources(self, batches: Sequence[SourceBatch]) -> None:
        watched = [self.source_key(batch.source) for batch in batches]
        for _ in range(WATCH_ATTEMPTS):
            async with self._transaction() as pipe:
                await self._watch(pipe, watched)
                members = await self._read(
                    [("SMEMBERS", self.source_chunks_key(b.source)) for b in batches]
                )
                pipe.multi()  # type: ignore[no-untyped-call]
                keys = 0
                for batch, old in zip(batches, members, strict=True):
                    keys += await self._queue_replace(pipe, batch, {text(i) for i in old})
                if await self._commit(pipe, [], keys) is not None:
                    return
        raise self._contended()

    async def _queue_replace(self, pipe: Any, batch: SourceBatch, old: set[str]) -> int:
        """Queue one source's replacement: its chunk set, the changed chunks (those whose
        stored digest differs), the stale chunks' deletion, its hash and its membership;
        return how many chunk keys it writes or deletes."""
        rows = vector_rows(batch)
        digests = [chunk_digest(c, row) for c, row in zip(batch.chunks, rows, strict=True)]
        stored = await self._read([("HGET", self.chunk_key(c.id), "digest") for c in batch.chunks])
        members = [chunk.id for chunk in batch.chunks]
        pipe.delete(self.source_chunks_key(batch.source))
        for start in range(0, len(members), KEYS_PER_COMMAND):
            pipe.sadd(
                self.source_chunks_key(batch.source), *members[start : start + KEYS_PER_COMMAND]
            )
        changed = 0
        for chunk, row, digest, found in zip(batch.chunks, rows, digests, stored, strict=True):
            if found is not None and text(found) == digest:
                continue  # unchanged: rewriting it would only skew BM25 until the GC runs
            pipe.hset(self.chunk_key(chunk.id), mapping=chunk_hash(chunk, row, digest))
            changed += 1
        stale = sorted(old - set(members))
        for start in range(0, len(stale), KEYS_PER_COMMAND):
            pipe.delete(*(self.chunk_key(i) for i in stale[start : start + KEYS_PER_COMMAND]))
        pipe.hset(
            self.source_key(batch.source),
            mapping={"content_hash": batch.content_hash, "chunks": len(batch.chunks)},
        )
        pipe.sadd(self.sources_key, batch.source)
        return changed + len(stale)

    async def _read(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Read-only commands, pipelined (not in the transaction: on another connection)."""
        replies: list[Any] = []
        for start in range(0, len(commands), self.write_batch):
            pipe = self.client.pipeline(transaction=False)
            for command in commands[start : start + self.write_batch]:
                pipe.execute_command(*command)
            replies += await pipe.execute()
        return replies

    async def delete_sources(self, sources: Sequence[str] | None) -> int:
        """Delete these sources' chunks, sets and hashes, listed or not, in one transaction;
        return how many chunks existed."""
        if sources is None:
            return await self._delete_everything()
        names = list(dict.fromkeys(sources))
        watched = [self.source_key(name) for name in names]
        for _ in range(WATCH_ATTEMPTS):
            async with self._transaction() as pipe:
                await self._watch(pipe, watched)
                members = await self._read([("SMEMBERS", self.source_chunks_key(n)) for n in names])
                pipe.multi()  # type: ignore[no-untyped-call]
                counted: list[int] = []  # positions of the chunk DELs among the replies
                for name, ids in zip(names, members, strict=True):
                    chunk_ids = sorted(text(i) for i in ids)
                    for start in range(0, len(chunk_ids), KEYS_PER_COMMAND):
                        counted.append(len(pipe.command_stack))
                        batch = chunk_ids[start : start + KEYS_PER_COMMAND]
                        pipe.delete(*(self.chunk_key(i) for i in batch))
                    pipe.delete(self.source_chunks_key(name), self.source_key(name))
                    pipe.srem(self.sources_key, name)
                removed = await self._commit(pipe, counted, sum(len(ids) for ids in members))
                if removed is not None:
                    return removed
        raise self._contended()

    async def _delete_everything(self) -> int:
        """Every key of this index but its meta and write counter, found by SCAN (orphans
        included), in one transaction that any other write in the meantime aborts."""
        prefixes = (
            self.chunk_prefix,
            f"{self.index_name}:source:",
            f"{self.index_name}:source-chunks:",
        )
        for _ in range(WATCH_ATTEMPTS):
            async with self._transaction() as pipe:
                await self._watch(pipe, [self.writes_key])
                found = [await self._matching(prefix) for prefix in prefixes]
                pipe.multi()  # type: ignore[no-untyped-call]
                counted: list[int] = []
                for prefix, keys in zip(prefixes, found, strict=True):
                    for start in range(0, len(keys), KEYS_PER_COMMAND):
                        if prefix == self.chunk_prefix:
                            counted.append(len(pipe.command_stack))
                        pipe.delete(*keys[start : start + KEYS_PER_COMMAND])
                pipe.delete(self.sources_key)
                removed = await self._commit(pipe, counted, len(found[0]))
                if removed is not None:
                    return removed
        raise self._contended()

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[Pipeline]:
        """A transaction pipeline on `transactions`, reset within the timeout on the way out
        (a reset cut short drops its connection, and the keys it watched with it)."""
        pipe = self.transactions.pipeline(transaction=True)
        try:
            yield pipe
        finally:
            with contextlib.suppress(RedisTimeoutError):
                async with bounded(self.timeout_seconds, self.timeout_seconds, "UNWATCH"):
                    await pipe.reset()  # type: ignore[no-untyped-call]

    async def _watch(self, pipe: Any, keys: Sequence[str]) -> None:
        async with bounded(self.timeout_seconds, self.timeout_seconds, "WATCH"):
            for start in range(0, len(keys), KEYS_PER_COMMAND):
                await pipe.watch(*keys[start : start + KEYS_PER_COMMAND])

    async def _commit(self, pipe: Any, counted: Sequence[int], keys: int) -> int | None:
        """Count the write and run the transaction queued on `pipe`, which writes or deletes
        `keys` chunk keys, within its `transaction_deadline`: the chunks removed by its DELs
        at the positions `counted`, or None when a watched key changed in the meantime (read
        and prepare again). Past the deadline the write fails, and Redis may still apply it
        whole, as when the connection breaks after the `EXEC` was sent."""
        pipe.incr(self.writes_key)
        deadline = transaction_deadline(self.timeout_seconds, keys)
        try:
            async with bounded(
                deadline, self.timeout_seconds, f"a transaction of {keys} chunk keys"
            ):
                replies = await pipe.execute()
        except WatchError:
            return None
        return sum(int(replies[i]) for i in counted)

    async def _matching(self, prefix: str) -> list[bytes]:
        return [key async for key in self.client.scan_iter(match=glob_prefix(prefix), count=1000)]

    def _contended(self) -> IndexUnavailable:
        return IndexUnavailable(
            f"Redis index {self.index_name!r}: other processes kept writing the same sources; "
            f"the write was not done after {WATCH_ATTEMPTS} attempts, retry it"
        )
