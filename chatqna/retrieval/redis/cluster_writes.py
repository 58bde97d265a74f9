"""Writes of the cluster store: a source replaced or deleted atomically on its primary.

Layout, for an index name `N` and a source whose tag `T` is a hash of its name (so all its
keys share one slot, and one primary):

    N:chunk:{T}:<chunk id>   hash: the chunk (`redis_writes.chunk_hash`)
    N:source:{T}             hash: source, content_hash, chunks
    N:source-chunks:{T}      set of the source's chunk ids
    N:sources:{n}            set of the names of the sources in one slot, where `n` is the
                             smallest integer that hashes to that slot
    N:sources                set of source names written by earlier versions (still listed)
    N:meta                   hash: embedder, dimension, format

A replace reads which chunks are stored unchanged (their digest), then one Lua script
checks those digests are still stored, writes the changed chunks, deletes the chunks the
source's set holds that the new version has not, and rewrites the source's set, hash and
membership: a reader sees the old source or the new one, never a mix. A digest changed by
another process since it was read makes the script change nothing and the replace read
again (`CONFLICT_ATTEMPTS` times at most). The script runs on a connection of its own to
the primary that owns the source's slot, followed by `WAIT 1` on that same connection when
the primary has a live replica, so a write is acknowledged only once a replica holds it and
a failover cannot lose it. `MOVED` refreshes the slot map and `ASK`/`TRYAGAIN` (a slot in
migration) retry, for at most `REDIRECT_ATTEMPTS`. Each source is atomic on its own: a
request of several sources, on several primaries, is applied source by source.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from functools import cache
from typing import Any

import redis.asyncio as aioredis
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot
from redis.exceptions import (
    AskError,
    ConnectionError,
    MovedError,
    ResponseError,
    TryAgainError,
)

from chatqna.backends.protocols import SourceBatch
from chatqna.errors import IndexUnavailable
from chatqna.retrieval.redis.schema import text
from chatqna.retrieval.redis.topology import ClusterTopology, Shard
from chatqna.retrieval.redis.writes import chunk_digest, chunk_hash, glob_prefix, vector_rows

REDIRECT_ATTEMPTS = 20
CONFLICT_ATTEMPTS = 20  # tries of one replace while other processes rewrite its chunks
REPLICA_WAIT_MS = 2000  # how long a write waits for its replica's acknowledgement
FIELDS = ("content", "terms", "chunk_id", "source", "title", "chunk_index", "embedding", "digest")
CONFLICT = -1  # what `REPLACE_SCRIPT` returns when an unchanged chunk changed meanwhile

# KEYS: source hash, source chunk set, the slot's membership set, the changed chunks' keys.
# ARGV: content hash, chunk count, source name, chunk key prefix (`N:chunk:{T}:`),
# #changed, #members, #unchanged, the members (chunk ids), the unchanged chunks' ids and
# digests (pairs), then the changed chunks' fields in FIELDS order. Chunk keys that are not
# in KEYS are built from the prefix: they share the source's hash tag, so its slot.
REPLACE_SCRIPT = """
local prefix = ARGV[4]
local changed, members, unchanged = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local at = 8
local new = {}
for i = at, at + members - 1 do
  new[ARGV[i]] = true
end
at = at + members
for i = 0, unchanged - 1 do
  local id, digest = ARGV[at + 2 * i], ARGV[at + 2 * i + 1]
  if redis.call('HGET', prefix .. id, 'digest') ~= digest then
    return %d
  end
end
at = at + 2 * unchanged
local stale = 0
for _, id in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  if not new[id] then
    redis.call('DEL', prefix .. id)
    stale = stale + 1
  end
end
redis.call('DEL', KEYS[2])
for first = 0, members - 1, 500 do
  local last = math.min(first + 499, members - 1)
  redis.call('SADD', KEYS[2], unpack(ARGV, 8 + first, 8 + last))
end
local fields = {%s}
for i = 1, changed do
  local row = {}
  for f = 1, #fields do
    row[#row + 1] = fields[f]
    row[#row + 1] = ARGV[at + f - 1]
  end
  redis.call('HSET', KEYS[3 + i], unpack(row))
  at = at + #fields
end
redis.call('HSET', KEYS[1], 'source', ARGV[3], 'content_hash', ARGV[1], 'chunks', ARGV[2])
redis.call('SADD', KEYS[3], ARGV[3])
return stale
""" % (CONFLICT, ", ".join(f"'{name}'" for name in FIELDS))  # noqa: UP031

# KEYS: source hash, source chunk set, the slot's membership set. ARGV: chunk key prefix,
# source name. Returns how many chunks existed.
DELETE_SCRIPT = """
local removed = 0
for _, id in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  removed = removed + redis.call('DEL', ARGV[1] .. id)
end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('SREM', KEYS[3], ARGV[2])
return removed
"""

# ARGV: membership sets, of any slots this primary owns (not KEYS: the server would refuse
# keys of several slots before the script's flag is looked at). Returns their members.
MEMBERS_SCRIPT = """#!lua flags=no-writes,allow-cross-slot-keys
local names = {}
for i = 1, #ARGV do
  for _, name in ipairs(redis.call('SMEMBERS', ARGV[i])) do
    names[#names + 1] = name
  end
end
return names
"""


@cache
def slot_tags() -> tuple[int, ...]:
    """For each hash slot, the smallest integer whose text hashes to it (about 110,000
    integers cover all 16,384 slots; 0.07 s, once)."""
    tags: dict[int, int] = {}
    number = 0
    while len(tags) < REDIS_CLUSTER_HASH_SLOTS:
        tags.setdefault(key_slot(str(number).encode()), number)
        number += 1
    return tuple(tags[slot] for slot in range(REDIS_CLUSTER_HASH_SLOTS))


def source_tag(source: str) -> str:
    """The hash tag of a source's keys: 16 hex digits of its name's hash."""
    return hashlib.blake2b(source.encode("utf-8"), digest_size=8).hexdigest()


class ClusterLayout:
    """Key names of the cluster store."""

    def __init__(self, index_name: str) -> None:
        self.index_name = index_name
        self.chunk_prefix = f"{index_name}:chunk:"
        self.sources_key = f"{index_name}:sources"
        self.meta_key = f"{index_name}:meta"

    def chunk_key(self, source: str, chunk_id: str) -> str:
        return f"{self.chunk_prefix}{{{source_tag(source)}}}:{chunk_id}"

    def chunk_id_of(self, key: str) -> str:
        """The chunk id in a chunk key (after its `{tag}:`)."""
        return key[len(self.chunk_prefix) :].split("}:", 1)[1]

    def source_key(self, source: str) -> str:
        return f"{self.index_name}:source:{{{source_tag(source)}}}"

    def source_chunks_key(self, source: str) -> str:
        return f"{self.index_name}:source-chunks:{{{source_tag(source)}}}"

    def chunk_key_prefix(self, source: str) -> str:
        return f"{self.chunk_prefix}{{{source_tag(source)}}}:"

    def membership_key(self, source: str) -> str:
        """The set that lists the source, in the source's own slot."""
        slot = key_slot(source_tag(source).encode())
        return self.slot_membership_key(slot)

    def slot_membership_key(self, slot: int) -> str:
        return f"{self.sources_key}:{{{slot_tags()[slot]}}}"

    def membership_keys(self) -> list[str]:
        """Every slot's membership set, and the set of earlier versions."""
        slots = range(REDIS_CLUSTER_HASH_SLOTS)
        return [*(self.slot_membership_key(slot) for slot in slots), self.sources_key]


def replace_call(
    layout: ClusterLayout, batch: SourceBatch, stored_digests: list[bytes | None]
) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of `REPLACE_SCRIPT` for one source, given its stored chunks' digests
    (in `batch.chunks` order)."""
    rows = vector_rows(batch)
    changed_keys: list[str] = []
    fields: list[Any] = []
    unchanged: list[str] = []
    for chunk, row, old in zip(batch.chunks, rows, stored_digests, strict=True):
        digest = chunk_digest(chunk, row)
        if old is not None and old.decode() == digest:
            unchanged += [chunk.id, digest]  # not rewritten: it would skew BM25 until the GC
            continue
        changed_keys.append(layout.chunk_key(batch.source, chunk.id))
        values = chunk_hash(chunk, row, digest)
        fields += [values[name] for name in FIELDS]
    members = [chunk.id for chunk in batch.chunks]
    keys = [
        layout.source_key(batch.source),
        layout.source_chunks_key(batch.source),
        layout.membership_key(batch.source),
        *changed_keys,
    ]
    argv: list[Any] = [
        batch.content_hash,
        len(batch.chunks),
        batch.source,
        layout.chunk_key_prefix(batch.source),
        len(changed_keys),
        len(members),
        len(unchanged) // 2,
        *members,
        *unchanged,
        *fields,
    ]
    return keys, argv


class ClusterWriter:
    """Replaces and deletes sources, each atomically on the primary that owns its slot."""

    def __init__(self, topology: ClusterTopology, layout: ClusterLayout) -> None:
        self.topology = topology
        self.layout = layout

    async def replace_sources(self, batches: Sequence[SourceBatch]) -> None:
        for batch in batches:
            await self._replace(batch)

    async def _replace(self, batch: SourceBatch) -> None:
        reads = [
            ("HGET", self.layout.chunk_key(batch.source, c.id), "digest") for c in batch.chunks
        ]
        for _ in range(CONFLICT_ATTEMPTS):
            digests = await self.topology.run(reads) if reads else []
            keys, argv = replace_call(self.layout, batch, digests)
            if await self._script(REPLACE_SCRIPT, keys, argv) != CONFLICT:
                return
        raise IndexUnavailable(
            f"Redis index {self.layout.index_name!r}: other processes kept rewriting "
            f"{batch.source!r}; it was not replaced after {CONFLICT_ATTEMPTS} attempts, retry it"
        )

    async def delete_sources(self, sources: Sequence[str] | None) -> int:
        if sources is None:
            return await self._delete_everything()
        removed = 0
        for source in dict.fromkeys(sources):
            removed += await self._delete_source(source)
        return removed

    async def _delete_source(self, source: str) -> int:
        """One script on the source's primary, listed or not; then the name leaves the set of
        earlier versions (which lists only sources whose hash exists, so order is no matter)."""
        keys = [
            self.layout.source_key(source),
            self.layout.source_chunks_key(source),
            self.layout.membership_key(source),
        ]
        argv = [self.layout.chunk_key_prefix(source), source]
        removed = int(await self._script(DELETE_SCRIPT, keys, argv))
        await self.topology.run([("SREM", self.layout.sources_key, source)])
        return removed

    async def source_names(self) -> list[str]:
        """The names in every membership set, sorted: one script per primary reads the sets
        of the slots it owns; while slots move, one keyed `SMEMBERS` per set instead (16,385
        commands: about 0.7 s, against some 10 ms)."""
        shards = await self.topology.shards()
        try:
            replies = await asyncio.gather(
                *(
                    self.topology.client(shard.address).eval(MEMBERS_SCRIPT, 0, *keys)
                    for shard in shards
                    for keys in [self._membership_keys_of(shard)]
                )
            )
        except ResponseError:  # a slot moved (MOVED, ASK, TRYAGAIN)
            self.topology.stale = True
            replies = await self.topology.run(
                [("SMEMBERS", key) for key in self.layout.membership_keys()]
            )
        return sorted({text(name) for members in replies for name in members})

    def _membership_keys_of(self, shard: Shard) -> list[str]:
        keys = [self.layout.slot_membership_key(slot) for slot in sorted(shard.slots)]
        if key_slot(self.layout.sources_key.encode()) in shard.slots:
            keys.append(self.layout.sources_key)
        return keys

    async def _delete_everything(self) -> int:
        """Every source, then any key of this index left on a primary (SCAN), but the meta."""
        removed = 0
        for source in await self.source_names():
            removed += await self._delete_source(source)
        name = self.layout.index_name
        prefixes = (
            self.layout.chunk_prefix,
            f"{name}:source:",
            f"{name}:source-chunks:",
            f"{name}:sources:",
        )
        for shard in await self.topology.shards():
            client = self.topology.client(shard.address)
            for prefix in prefixes:
                async for key in client.scan_iter(match=glob_prefix(prefix), count=1000):
                    (deleted,) = await self.topology.run([("DEL", text(key))])
                    removed += int(deleted) if prefix == self.layout.chunk_prefix else 0
        await self.topology.run([("DEL", self.layout.sources_key)])
        return removed

    async def _script(self, script: str, keys: list[str], argv: list[Any]) -> Any:
        """Run a write script on the primary that owns `keys[0]`'s slot, then wait for a
        replica; `MOVED` rereads the topology, `ASK` and `TRYAGAIN` retry."""
        slot = key_slot(keys[0].encode())
        asking: str | None = None
        for attempt in range(REDIRECT_ATTEMPTS):
            shards = await self.topology.shards()
            owner = next((s for s in shards if slot in s.slots), None)
            if owner is None:
                await self.topology.refresh()
                continue
            address = asking or owner.address
            writer = self.topology.writer(address)
            try:
                if asking is not None:
                    await writer.execute_command("ASKING")  # type: ignore[no-untyped-call]
                result = await writer.eval(script, len(keys), *keys, *argv)
            except MovedError:
                await self.topology.refresh()
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
                self.topology.stale = True
                await self.topology.drop_writer(address)
                raise
            target = next((s for s in shards if s.address == address), None)
            await self._wait_for_replica(writer, target)
            return result
        raise IndexUnavailable(
            f"Redis index {self.layout.index_name!r}: slot {slot} kept moving; "
            "the write was not done"
        )

    async def _wait_for_replica(self, writer: aioredis.Redis, owner: Shard | None) -> None:
        """`WAIT` for one replica of `owner` (none to wait for: no live replica known)."""
        replicas = 0 if owner is None else min(owner.replicas, 1)
        if replicas == 0:
            return
        acked = int(await writer.execute_command("WAIT", replicas, REPLICA_WAIT_MS))  # type: ignore[no-untyped-call]
        if acked < replicas:
            raise IndexUnavailable(
                f"Redis index {self.layout.index_name!r}: a write was not confirmed by a "
                f"replica within {REPLICA_WAIT_MS} ms and could be lost in a failover; retry it"
            )
