"""Writes of the cluster store: a source replaced or deleted atomically on its primary.

Layout, for an index name `N` and a source whose tag `T` is a hash of its name (so all its
keys share one slot, and one primary):

    N:chunk:{T}:<chunk id>   hash: the chunk (`redis_writes.chunk_hash`)
    N:source:{T}             hash: source, content_hash, chunks
    N:source-chunks:{T}      set of the source's chunk ids
    N:sources                set of source names (its own slot; updated after the source)
    N:meta                   hash: embedder, dimension, format

A replace reads which chunks are stored unchanged (their digest), then one Lua script
writes the changed chunks, deletes the stale ones and rewrites the source's set and hash:
a reader sees the old source or the new one, never a mix. The script runs on a connection
of its own to the primary that owns the source's slot, followed by `WAIT 1` on that same
connection when the primary has a live replica, so a write is acknowledged only once a
replica holds it and a failover cannot lose it. `MOVED` refreshes the slot map and
`ASK`/`TRYAGAIN` (a slot in migration) retry, for at most `REDIRECT_ATTEMPTS`.
"""

from __future__ import annotations

import hashlib
from typing import Any

from chatqna.backends.protocols import SourceBatch
from chatqna.retrieval.redis_writes import chunk_digest, chunk_hash, vector_rows

REDIRECT_ATTEMPTS = 20
FIELDS = ("content", "terms", "chunk_id", "source", "title", "chunk_index", "embedding", "digest")

# KEYS: source hash, source chunk set, the changed chunks' keys, the stale chunks' keys.
# ARGV: content hash, chunk count, source name, #changed, #stale, #members, the members
# (chunk ids), then the changed chunks' fields in FIELDS order.
REPLACE_SCRIPT = """
local changed, stale, members = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local at = 7
redis.call('DEL', KEYS[2])
for first = 0, members - 1, 500 do
  local last = math.min(first + 499, members - 1)
  redis.call('SADD', KEYS[2], unpack(ARGV, at + first, at + last))
end
at = at + members
local fields = {%s}
for i = 1, changed do
  local row = {}
  for f = 1, #fields do
    row[#row + 1] = fields[f]
    row[#row + 1] = ARGV[at + f - 1]
  end
  redis.call('HSET', KEYS[2 + i], unpack(row))
  at = at + #fields
end
for i = 1, stale do
  redis.call('DEL', KEYS[2 + changed + i])
end
redis.call('HSET', KEYS[1], 'source', ARGV[3], 'content_hash', ARGV[1], 'chunks', ARGV[2])
return stale
""" % ", ".join(f"'{name}'" for name in FIELDS)  # noqa: UP031

# KEYS: source hash, source chunk set, the chunks' keys. Returns how many chunks existed.
DELETE_SCRIPT = """
local removed = 0
for i = 3, #KEYS do
  removed = removed + redis.call('DEL', KEYS[i])
end
redis.call('DEL', KEYS[1], KEYS[2])
return removed
"""


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


def replace_call(
    layout: ClusterLayout,
    batch: SourceBatch,
    stored_digests: list[bytes | None],
    old_members: set[str],
) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of `REPLACE_SCRIPT` for one source, given its stored chunks' digests
    (in `batch.chunks` order) and the chunk ids its set holds now."""
    rows = vector_rows(batch)
    changed_keys: list[str] = []
    fields: list[Any] = []
    for chunk, row, old in zip(batch.chunks, rows, stored_digests, strict=True):
        digest = chunk_digest(chunk, row)
        if old is not None and old.decode() == digest:
            continue  # unchanged: rewriting it would only skew BM25 until the GC runs
        changed_keys.append(layout.chunk_key(batch.source, chunk.id))
        values = chunk_hash(chunk, row, digest)
        fields += [values[name] for name in FIELDS]
    members = [chunk.id for chunk in batch.chunks]
    stale = sorted(old_members - set(members))
    stale_keys = [layout.chunk_key(batch.source, chunk_id) for chunk_id in stale]
    keys = [
        layout.source_key(batch.source),
        layout.source_chunks_key(batch.source),
        *changed_keys,
        *stale_keys,
    ]
    argv: list[Any] = [
        batch.content_hash,
        len(batch.chunks),
        batch.source,
        len(changed_keys),
        len(stale_keys),
        len(members),
        *members,
        *fields,
    ]
    return keys, argv
