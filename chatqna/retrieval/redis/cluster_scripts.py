"""The Lua scripts of the cluster store's writes, and their KEYS and ARGV.

Each script's keys share one slot (a source's, `chatqna.retrieval.redis.cluster_layout`),
so it runs whole on the primary that owns it: a reader sees a source before or after it,
never in between. `ClusterWriter` (`chatqna.retrieval.redis.cluster_writes`) runs them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from chatqna.backends.protocols import SourceBatch
from chatqna.retrieval.redis.cluster_layout import ClusterLayout, source_slot
from chatqna.retrieval.redis.writes import KEYS_PER_COMMAND, chunk_digest, chunk_hash, vector_rows

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
