"""Writes of the cluster store: a source replaced or deleted atomically on its primary.

The layout is `chatqna.retrieval.redis.cluster_layout`'s: a source's keys share one slot.

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

Deleting is one script per slot: it removes each named source of that slot (the chunks its
set names, its set, its hash, its listing). Deleting everything deletes every listed source
so, then sweeps what no listing names (an earlier version's cut-off write): SCAN finds the
index's keys on each primary, and one script per source tag (per 1,000 chunk keys) deletes
that source's keys unless its slot's set lists it by then, in which case a write came after
the delete and only chunk keys its chunk set does not name go. Every change to a source's
keys is one script, so a write racing a delete of everything leaves the source whole and
listed (it came last) or wholly gone, never searchable but unlisted or listed but short.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.crc import key_slot
from redis.exceptions import (
    AskError,
    ConnectionError,
    MovedError,
    ResponseError,
    TryAgainError,
)

from chatqna.backends.protocols import SourceBatch
from chatqna.errors import IndexUnavailable
from chatqna.retrieval.redis.cluster_layout import ClusterLayout, source_slot
from chatqna.retrieval.redis.schema import text
from chatqna.retrieval.redis.topology import ClusterTopology, Shard
from chatqna.retrieval.redis.writes import (
    KEYS_PER_COMMAND,
    chunk_digest,
    chunk_hash,
    glob_prefix,
    vector_rows,
)

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

# KEYS: the slot's membership set, then each source's hash and chunk set; ARGV: each
# source's chunk key prefix and name. All in one slot. Returns how many chunks existed.
DELETE_SCRIPT = """
local removed = 0
for i = 1, #ARGV / 2 do
  local chunks = KEYS[2 * i + 1]
  for _, id in ipairs(redis.call('SMEMBERS', chunks)) do
    removed = removed + redis.call('DEL', ARGV[2 * i - 1] .. id)
  end
  redis.call('DEL', KEYS[2 * i], chunks)
  redis.call('SREM', KEYS[1], ARGV[2 * i])
end
return removed
"""

# KEYS: a source tag's hash, chunk set and slot's membership set, then chunk keys of the tag
# found by SCAN; ARGV: the tag's chunk key prefix, then those keys' chunk ids. A source its
# membership set lists loses only the chunk keys its chunk set does not name; any other
# loses every key. Returns how many chunks it deleted.
SWEEP_SCRIPT = """
local removed = 0
local name = redis.call('HGET', KEYS[1], 'source')
if name and redis.call('SISMEMBER', KEYS[3], name) == 1 then
  for i = 4, #KEYS do
    if redis.call('SISMEMBER', KEYS[2], ARGV[i - 2]) == 0 then
      removed = removed + redis.call('DEL', KEYS[i])
    end
  end
  return removed
end
for _, id in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  removed = removed + redis.call('DEL', ARGV[1] .. id)
end
for i = 4, #KEYS do
  removed = removed + redis.call('DEL', KEYS[i])
end
redis.call('DEL', KEYS[1], KEYS[2])
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


ScriptCall = tuple[list[str], list[str]]  # KEYS, ARGV


def by_slot(sources: Iterable[str]) -> dict[int, list[str]]:
    """Source names grouped by the slot of their keys, each once, in order."""
    groups: dict[int, list[str]] = {}
    for source in dict.fromkeys(sources):
        groups.setdefault(source_slot(source), []).append(source)
    return groups


def delete_call(layout: ClusterLayout, sources: Sequence[str]) -> ScriptCall:
    """KEYS and ARGV of `DELETE_SCRIPT` for sources of one slot."""
    keys = [layout.membership_key(sources[0])]
    argv: list[str] = []
    for source in sources:
        keys += [layout.source_key(source), layout.source_chunks_key(source)]
        argv += [layout.chunk_key_prefix(source), source]
    return keys, argv


def sweep_calls(layout: ClusterLayout, found: Iterable[str]) -> tuple[list[ScriptCall], list[str]]:
    """KEYS and ARGV of `SWEEP_SCRIPT` for the keys SCAN `found` (every tag, at most
    `KEYS_PER_COMMAND` chunk keys a call), and the keys without a tag."""
    tagged: dict[str, list[str]] = {}
    untagged: list[str] = []
    for key in dict.fromkeys(found):
        tag = layout.tag_of(key)
        if tag is None:
            untagged.append(key)
        else:
            chunks = tagged.setdefault(tag, [])
            if key.startswith(layout.chunk_prefix):
                chunks.append(key)
    calls: list[ScriptCall] = []
    for tag, chunk_keys in tagged.items():
        head = [
            layout.tag_source_key(tag),
            layout.tag_source_chunks_key(tag),
            layout.tag_membership_key(tag),
        ]
        prefix = layout.tag_chunk_key_prefix(tag)
        for start in range(0, max(len(chunk_keys), 1), KEYS_PER_COMMAND):
            batch = chunk_keys[start : start + KEYS_PER_COMMAND]
            calls.append(([*head, *batch], [prefix, *(layout.chunk_id_of(k) for k in batch)]))
    return calls, untagged


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
        return await self._delete(sources)

    async def _delete(self, sources: Iterable[str]) -> int:
        """One script per slot on its primary, for the named sources listed or not; then the
        names leave the set of earlier versions (which lists only sources whose hash exists,
        so order is no matter)."""
        removed = 0
        names: list[str] = []
        for group in by_slot(sources).values():
            keys, argv = delete_call(self.layout, group)
            removed += int(await self._script(DELETE_SCRIPT, keys, argv))
            names += group
        for start in range(0, len(names), KEYS_PER_COMMAND):
            batch = names[start : start + KEYS_PER_COMMAND]
            await self.topology.run([("SREM", self.layout.sources_key, *batch)])
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
        """Every listed source, then every key of this index no listing names (SCAN), but
        the meta; a source written meanwhile stays, whole (see the module's docstring)."""
        removed = await self._delete(await self.source_names())
        prefixes = (
            self.layout.chunk_prefix,
            self.layout.source_prefix,
            self.layout.source_chunks_prefix,
        )
        found: list[str] = []
        for shard in await self.topology.shards():
            client = self.topology.client(shard.address)
            for prefix in prefixes:
                async for key in client.scan_iter(match=glob_prefix(prefix), count=1000):
                    found.append(text(key))
        calls, untagged = sweep_calls(self.layout, found)
        for keys, argv in calls:
            removed += int(await self._script(SWEEP_SCRIPT, keys, argv))
        for key in untagged:  # no write of this version makes such a key
            (deleted,) = await self.topology.run([("DEL", key)])
            removed += int(deleted) if key.startswith(self.layout.chunk_prefix) else 0
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
