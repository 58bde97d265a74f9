"""Key names of the cluster store, for an index name `N` and a source whose tag `T` is a
hash of its name (so all its keys share one slot, and one primary):

    N:chunk:{T}:<chunk id>   hash: the chunk (`redis_writes.chunk_hash`)
    N:source:{T}             hash: source, content_hash, chunks
    N:source-chunks:{T}      set of the source's chunk ids
    N:sources:{n}            set of the names of the sources in one slot, where `n` is the
                             smallest integer that hashes to that slot
    N:meta                   hash: embedder, dimension, format
"""

from __future__ import annotations

import hashlib
from functools import cache

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot


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


def source_slot(source: str) -> int:
    """The slot of every key of `source`, its listing's included."""
    return key_slot(source_tag(source).encode())


class ClusterLayout:
    """Key names of the cluster store; a source's keys by its name or by its tag."""

    def __init__(self, index_name: str) -> None:
        self.index_name = index_name
        self.chunk_prefix = f"{index_name}:chunk:"
        self.source_prefix = f"{index_name}:source:"
        self.source_chunks_prefix = f"{index_name}:source-chunks:"
        self.membership_prefix = f"{index_name}:sources:"
        self.meta_key = f"{index_name}:meta"

    def chunk_key(self, source: str, chunk_id: str) -> str:
        return f"{self.chunk_key_prefix(source)}{chunk_id}"

    def chunk_id_of(self, key: str) -> str:
        """The chunk id in a chunk key (after its `{tag}:`)."""
        return key[len(self.chunk_prefix) :].split("}:", 1)[1]

    def source_key(self, source: str) -> str:
        return self.tag_source_key(source_tag(source))

    def source_chunks_key(self, source: str) -> str:
        return self.tag_source_chunks_key(source_tag(source))

    def chunk_key_prefix(self, source: str) -> str:
        return self.tag_chunk_key_prefix(source_tag(source))

    def tag_source_key(self, tag: str) -> str:
        return f"{self.source_prefix}{{{tag}}}"

    def tag_source_chunks_key(self, tag: str) -> str:
        return f"{self.source_chunks_prefix}{{{tag}}}"

    def tag_chunk_key_prefix(self, tag: str) -> str:
        return f"{self.chunk_prefix}{{{tag}}}:"

    def tag_of(self, key: str) -> str | None:
        """The source tag of a chunk key, a source hash or a chunk set; None for any other
        key (one an earlier layout wrote without a tag)."""
        for prefix in (self.chunk_prefix, self.source_prefix, self.source_chunks_prefix):
            rest = key[len(prefix) :] if key.startswith(prefix) else ""
            tag, brace, after = rest[1:].partition("}")
            chunk = prefix == self.chunk_prefix
            ends = after.startswith(":") if chunk else not after
            if rest.startswith("{") and brace and tag and ends:
                return tag
        return None

    def membership_key(self, source: str) -> str:
        """The set that lists the source, in the source's own slot."""
        return self.slot_membership_key(source_slot(source))

    def tag_membership_key(self, tag: str) -> str:
        return self.slot_membership_key(key_slot(tag.encode()))

    def slot_membership_key(self, slot: int) -> str:
        return f"{self.membership_prefix}{{{slot_tags()[slot]}}}"

    def membership_keys(self) -> list[str]:
        """Every slot's membership set."""
        return [self.slot_membership_key(slot) for slot in range(REDIS_CLUSTER_HASH_SLOTS)]
