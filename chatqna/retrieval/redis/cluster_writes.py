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
a failover cannot lose it (a replica that does not acknowledge makes the store reread the
topology: a primary left without a live replica takes writes unconfirmed). That connection
has no socket timeout: the primary indexes the chunks before it answers, so the script is
waited for up to its `transaction_deadline` (the store's timeout plus an allowance per
chunk key it writes or deletes), and the `WAIT` up to 2 s plus the same allowance, the
replica indexing them too. A primary busy with a script answers no other client and no
cluster gossip: one that outlasts `cluster-node-timeout` gets the primary failed over, and
the write fails (seen with a 1 s node timeout and a 30,000-chunk script of 5 s: the replica
took over without the write).
`MOVED` refreshes the slot map and `ASK`/`TRYAGAIN` (a slot in migration) retry, for at
most `REDIRECT_ATTEMPTS`. Each source is atomic on its own: a request of several sources,
on several primaries, is applied source by source.

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
import logging
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
from chatqna.retrieval.redis.cluster_layout import ClusterLayout
from chatqna.retrieval.redis.cluster_scripts import (
    CONFLICT,
    DELETE_SCRIPT,
    MEMBERS_SCRIPT,
    REPLACE_SCRIPT,
    SWEEP_SCRIPT,
    by_slot,
    delete_call,
    replace_call,
    sweep_calls,
)
from chatqna.retrieval.redis.schema import text
from chatqna.retrieval.redis.topology import ClusterTopology, Shard
from chatqna.retrieval.redis.writes import (
    bounded,
    glob_prefix,
    transaction_deadline,
)

logger = logging.getLogger(__name__)

REDIRECT_ATTEMPTS = 20
CONFLICT_ATTEMPTS = 20  # tries of one replace while other processes rewrite its chunks
# How long a write waits for its replica's acknowledgement, plus the replica's indexing
# time (`transaction_deadline`'s allowance per chunk key).
REPLICA_WAIT_MS = 2000


class ClusterWriter:
    """Replaces and deletes sources, each atomically on the primary that owns its slot."""

    def __init__(self, topology: ClusterTopology, layout: ClusterLayout) -> None:
        self.topology = topology
        self.layout = layout

    async def replace_sources(self, batches: Sequence[SourceBatch]) -> None:
        for batch in batches:
            await self._replace(batch)

    async def _replace(self, batch: SourceBatch) -> None:
        reads: list[tuple[str, ...]] = [
            ("HGET", self.layout.chunk_key(batch.source, c.id), "digest") for c in batch.chunks
        ]
        reads.append(("SCARD", self.layout.source_chunks_key(batch.source)))
        for _ in range(CONFLICT_ATTEMPTS):
            *digests, stored = await self.topology.run(reads)
            keys, argv = replace_call(self.layout, batch, digests)
            chunk_keys = len(keys) - 3 + int(stored)  # written, and at most that many stale
            if await self._script(REPLACE_SCRIPT, keys, argv, chunk_keys) != CONFLICT:
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
        """One script per slot on its primary, for the named sources listed or not."""
        removed = 0
        for group in by_slot(sources).values():
            keys, argv = delete_call(self.layout, group)
            sizes = await self.topology.run([("SCARD", key) for key in keys[2::2]])
            removed += int(await self._script(DELETE_SCRIPT, keys, argv, sum(map(int, sizes))))
        return removed

    async def source_names(self) -> list[str]:
        """The names in every membership set, sorted: one script per primary reads the sets
        of the slots it owns; while slots move, one keyed `SMEMBERS` per set instead (16,385
        commands: about 0.7 s, against some 10 ms). A primary that is gone or hangs rereads
        the topology (`ClusterTopology.on_primaries`)."""
        try:
            replies = await self.topology.on_primaries(self._members)
        except ResponseError:  # a slot moved (MOVED, ASK, TRYAGAIN)
            self.topology.stale = True
            replies = await self.topology.run(
                [("SMEMBERS", key) for key in self.layout.membership_keys()]
            )
        return sorted({text(name) for members in replies for name in members})

    async def _members(self, shards: list[Shard]) -> list[Any]:
        return await asyncio.gather(
            *(
                self.topology.client(shard.address).eval(MEMBERS_SCRIPT, 0, *keys)
                for shard in shards
                for keys in [self._membership_keys_of(shard)]
            )
        )

    def _membership_keys_of(self, shard: Shard) -> list[str]:
        return [self.layout.slot_membership_key(slot) for slot in sorted(shard.slots)]

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
            (stored,) = await self.topology.run([("SCARD", keys[1])])
            removed += int(
                await self._script(SWEEP_SCRIPT, keys, argv, len(keys) - 3 + int(stored))
            )
        for key in untagged:  # no write of this version makes such a key
            (deleted,) = await self.topology.run([("DEL", key)])
            removed += int(deleted) if key.startswith(self.layout.chunk_prefix) else 0
        return removed

    async def _script(self, script: str, keys: list[str], argv: list[Any], chunk_keys: int) -> Any:
        """Run a write script that writes or deletes about `chunk_keys` chunk keys on the
        primary that owns `keys[0]`'s slot, within its `transaction_deadline`, then wait for
        a replica; `MOVED` rereads the topology, `ASK` and `TRYAGAIN` retry."""
        slot = key_slot(keys[0].encode())
        timeout = self.topology.timeout_seconds
        deadline = transaction_deadline(timeout, chunk_keys)
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
                with self.topology.marks_stale():
                    async with bounded(deadline, timeout, f"a script over {chunk_keys} chunk keys"):
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
                await self.topology.drop_writer(address)
                raise
            target = next((s for s in shards if s.address == address), None)
            await self._wait_for_replica(writer, target, chunk_keys)
            return result
        raise IndexUnavailable(
            f"Redis index {self.layout.index_name!r}: slot {slot} kept moving; "
            "the write was not done"
        )

    async def _wait_for_replica(
        self, writer: aioredis.Redis, owner: Shard | None, chunk_keys: int
    ) -> None:
        """`WAIT` for one replica of `owner` (none to wait for: no live replica known), which
        indexes the write's `chunk_keys` chunk keys before it acknowledges them. A replica
        that does not acknowledge rereads the topology: when the primary has no live replica
        left, the write is done (with a warning: a failover would now lose it, but no replica
        could take over anyway); else it fails, applied on the primary but not confirmed."""
        if owner is None or min(owner.replicas, 1) == 0:
            return
        wait_ms = round(1000 * transaction_deadline(REPLICA_WAIT_MS / 1000, chunk_keys))
        timeout = self.topology.timeout_seconds
        async with bounded(wait_ms / 1000 + timeout, timeout, "WAIT"):
            acked = int(await writer.execute_command("WAIT", 1, wait_ms))  # type: ignore[no-untyped-call]
        if acked >= 1:
            return
        await self.topology.refresh()
        now = next((s for s in self.topology.primaries if s.address == owner.address), None)
        if now is not None and now.replicas == 0:
            logger.warning(
                "Redis index %r: primary %s has no live replica; writes to it are applied "
                "without a replica's confirmation until one joins",
                self.layout.index_name,
                owner.address,
            )
            return
        raise IndexUnavailable(
            f"Redis index {self.layout.index_name!r}: a write was applied on the primary "
            f"{owner.address} but not confirmed by a replica within {wait_ms} ms, so a "
            "failover could still lose it; retry it (writing it again is safe)"
        )
