"""What the cluster store knows of a Redis Cluster: its primaries, their slots, migrations.

The search module of Redis 7.4 has no coordinator, and its commands are routed by the index
name's slot: a node answers `FT.SEARCH name` only when it owns `name`'s slot (else `MOVED`).
So each primary gets its own index, named with a hash tag in a slot that primary owns
(`<name>-shard-{<n>}`, `n` the smallest integer whose slot it owns: every client derives the
same names from the same slot map), over the same key prefix: each covers that node's
passages. Resharding moves passages between primaries and each node's index follows; when
it moves the slot of a primary's index name, that primary gets an index under its next name
(a new `FT.CREATE`, which scans its keys) and the old one stays behind, unreachable, until
the node's data is flushed or the node restarts without persistence.

The view comes from `CLUSTER NODES`, which every search also asks each primary for, in the
same pipeline: a slot map that changed or a slot being migrated is seen in-band. An index
found is checked as at start-up: one of other fields is refused until it is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot
from redis.exceptions import AskError, ConnectionError, MovedError, TryAgainError
from redis.exceptions import TimeoutError as RedisTimeoutError

from chatqna.retrieval.redis.cluster_nodes import ClusterNode, parse_cluster_nodes
from chatqna.retrieval.redis.schema import IndexSchema

logger = logging.getLogger(__name__)

REDIRECTS = 5  # how many ASK, MOVED or TRYAGAIN a keyed read follows
_REDIRECTS = (AskError, MovedError, TryAgainError)
# A node that is gone (refused, reset) or hangs (a socket's timeout, or a deadline's).
UNREACHABLE = (ConnectionError, OSError, RedisTimeoutError)
T = TypeVar("T")


@cache
def _tag_slot(number: int) -> int:
    return key_slot(str(number).encode())


def shard_index_name(base: str, slots: frozenset[int]) -> str:
    """The name of the index on the primary that owns `slots` (which must not be empty)."""
    if not slots:
        raise ValueError("a primary without slots holds no index")
    number = 0
    while _tag_slot(number) not in slots:
        number += 1
        if number > 50 * REDIS_CLUSTER_HASH_SLOTS:  # unreachable: some number hashes there
            raise ValueError("no hash tag found for these slots")
    return f"{base}-shard-{{{number}}}"


@dataclass(frozen=True)
class Shard:
    """A primary that owns slots, with the name of its index."""

    node_id: str
    host: str
    port: int
    index: str
    slots: frozenset[int]
    replicas: int  # live replicas: how many a write waits for (at most one)
    # A primary that owns no slot yet and imports its first: its commands need ASKING.
    asking: bool = False

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def shards_of(nodes: list[ClusterNode], base: str) -> list[Shard]:
    """Every primary that owns slots (a failed one included: its slots have no other
    owner until its replica takes over, so searching without it would drop passages), and
    every primary that owns none but imports one (its index named after what it imports)."""
    replicas: dict[str, int] = {}
    importing: dict[str, set[int]] = {}
    for node in nodes:
        if not node.primary and not node.failed and node.primary_id is not None:
            replicas[node.primary_id] = replicas.get(node.primary_id, 0) + 1
        for slot, target in node.moving_to:
            importing.setdefault(target, set()).add(slot)
    shards = []
    for node in nodes:
        named_by = node.slots or frozenset(importing.get(node.node_id, ()))
        if not node.primary or not named_by:
            continue
        shards.append(
            Shard(
                node.node_id,
                node.host,
                node.port,
                shard_index_name(base, named_by),
                node.slots,
                replicas.get(node.node_id, 0),
                asking=not node.slots,
            )
        )
    return sorted(shards, key=lambda shard: shard.address)


class ClusterTopology:
    """The nodes, the primaries with their index, and one connection pool per node.

    `refresh()` rereads `CLUSTER NODES` (from a reply at hand, or from the first node that
    answers) and builds the index on every primary that lacks it, waiting for its initial
    scan, or checks the one it has, before that primary is searched. `stale` makes the next
    `shards()` reread; a node that is gone or hangs sets it (`marks_stale`), on every path.
    `meta` is the index's `N:meta` hash, which names the embedder in a refusal.
    """

    def __init__(
        self, url: str, schema: IndexSchema, timeout_seconds: float, max_connections: int = 256
    ) -> None:
        self.url = url
        self.max_connections = max_connections
        self.schema = schema
        self.timeout_seconds = timeout_seconds
        self.nodes: list[ClusterNode] = []
        self.primaries: list[Shard] = []
        self.stale = True
        self.meta: dict[bytes, bytes] = {}
        self._ready: set[tuple[str, str]] = set()  # (address, index) with the index built
        self._clients: dict[str, aioredis.Redis] = {}
        self._writers: dict[str, aioredis.Redis] = {}
        self._lock = asyncio.Lock()
        self._asks: set[asyncio.Task[bytes]] = set()  # `CLUSTER NODES` still being cancelled
        self._refreshes = 0  # refreshes done (or failed) so far
        self._refresh_error: Exception | None = None  # the last one's, when it failed

    def _options(self, address: str) -> dict[str, Any]:
        host, _, port = address.rpartition(":")
        parts = urlsplit(self.url)
        return {
            "host": host,
            "port": int(port),
            "username": parts.username,
            "password": parts.password,
            "protocol": 2,
            "decode_responses": False,
            "socket_connect_timeout": self.timeout_seconds,
            "socket_timeout": self.timeout_seconds,
        }

    def connect(
        self, address: str, kind: type[aioredis.Redis] = aioredis.Redis, **extra: Any
    ) -> aioredis.Redis:
        return kind(**{**self._options(address), **extra})

    def client(self, address: str) -> aioredis.Redis:
        """The search connection pool of one node: at most `max_connections`, a caller
        waiting up to the timeout for a free one; one immediate retry on a connection error
        (a pooled connection the node closed), no backoff, so a primary that is gone fails
        the search at once; none on a timeout, so one that hangs fails it after one."""
        client = self._clients.get(address)
        if client is None:
            pool = aioredis.BlockingConnectionPool(
                max_connections=self.max_connections,
                timeout=self.timeout_seconds,
                retry=Retry(NoBackoff(), 1, (ConnectionError,)),
                **self._options(address),
            )
            client = aioredis.Redis.from_pool(pool)
            self._clients[address] = client
        return client

    def writer(self, address: str) -> aioredis.Redis:
        """A connection of its own per primary: `WAIT` counts that connection's writes. It
        has no socket timeout: each write bounds its calls with deadlines of its own."""
        writer = self._writers.get(address)
        if writer is None:
            no_retry = Retry(NoBackoff(), 0)
            writer = self.connect(
                address, single_connection_client=True, retry=no_retry, socket_timeout=None
            )
            self._writers[address] = writer
        return writer

    async def drop_writer(self, address: str) -> None:
        writer = self._writers.pop(address, None)
        if writer is not None:
            await writer.aclose()

    async def keyed(self, address: str, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """Keyed commands on the node at `address`, one pipeline; a key whose slot moved
        follows its `MOVED` or `ASK` (with `ASKING`) to the node named, `TRYAGAIN` retries.
        redis-py's cluster client cannot follow an `ASK` to a primary that owns no slot
        yet (it does not know the node), which a slot's first import into one gives."""
        replies = await self._pipeline(address, commands, asking=False)
        for attempt in range(REDIRECTS):
            redirected = [i for i, r in enumerate(replies) if isinstance(r, _REDIRECTS)]
            if not redirected:
                break
            for i in redirected:
                error = replies[i]
                if isinstance(error, TryAgainError):
                    await asyncio.sleep(0.02 * (attempt + 1))
                    retry = await self._pipeline(address, [commands[i]], asking=False)
                else:
                    target = f"{error.host}:{error.port}"
                    asking = isinstance(error, AskError)
                    retry = await self._pipeline(target, [commands[i]], asking=asking)
                replies[i] = retry[0]
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    async def owner(self, key: str) -> str:
        """The address of the primary that owns `key`'s slot (a redirect corrects it)."""
        slot = key_slot(key.encode())
        for attempt in range(2):
            shards = await self.shards()
            found = next((s.address for s in shards if slot in s.slots), None)
            if found is not None:
                return found
            if attempt == 0:
                await self.refresh()
        return self.primaries[0].address if self.primaries else self._nodes_fallback()

    def _nodes_fallback(self) -> str:
        parts = urlsplit(self.url)
        return f"{parts.hostname or '127.0.0.1'}:{parts.port or 6379}"

    async def run(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """Keyed commands (the key second), each on its key's primary, one pipeline per
        primary; in order."""
        by_node: dict[str, list[int]] = {}
        for position, command in enumerate(commands):
            by_node.setdefault(await self.owner(str(command[1])), []).append(position)
        replies: list[Any] = [None] * len(commands)
        for address, positions in by_node.items():
            done = await self.keyed(address, [commands[p] for p in positions])
            for position, reply in zip(positions, done, strict=True):
                replies[position] = reply
        return replies

    async def _pipeline(
        self, address: str, commands: Sequence[Sequence[Any]], *, asking: bool
    ) -> list[Any]:
        pipe = self.client(address).pipeline(transaction=False)
        for command in commands:
            if asking:
                pipe.execute_command("ASKING")
            pipe.execute_command(*command)
        with self.marks_stale():
            replies = await pipe.execute(raise_on_error=False)
        return list(replies[1::2] if asking else replies)

    @contextlib.contextmanager
    def marks_stale(self) -> Iterator[None]:
        """A node that is gone or hangs makes the next `shards()` reread the topology: either
        way the cluster may fail it over, and the old primary must not be asked for ever."""
        try:
            yield
        except UNREACHABLE:
            self.stale = True
            raise

    async def on_primaries(self, call: Callable[[list[Shard]], Awaitable[T]]) -> T:
        """`call` on the current primaries. A node that is gone or hangs rereads the topology,
        and `call` is tried once more when another node has taken over; else its error stands
        (a primary that hangs costs one timeout, not two)."""
        shards = await self.shards()
        try:
            with self.marks_stale():
                return await call(shards)
        except UNREACHABLE:
            again = await self.shards()
            if [s.address for s in again] == [s.address for s in shards]:
                self.stale = True  # not failed over yet: the next call rereads again
                raise
        with self.marks_stale():
            return await call(again)

    async def shards(self) -> list[Shard]:
        if self.stale:
            await self.refresh()
        return self.primaries

    async def _nodes_reply(self) -> bytes:
        """`CLUSTER NODES` from the first node that answers: every known node and the URL's
        asked at once, within the timeout, so one that is gone or hangs delays no refresh."""
        addresses = [*(node.address for node in self.nodes), self._nodes_fallback()]
        asks = [asyncio.ensure_future(self._cluster_nodes(a)) for a in dict.fromkeys(addresses)]
        error: BaseException | None = None
        try:
            async with asyncio.timeout(self.timeout_seconds):
                for answer in asyncio.as_completed(asks):
                    try:
                        return await answer
                    except UNREACHABLE as exc:
                        error = exc
        except TimeoutError as exc:  # the deadline's: every node left hangs
            error = exc
        finally:
            for ask in asks:  # not awaited: redis-py may finish one it is connecting on at
                ask.cancel()  # its own timeout; `aclose()` awaits what is left
                self._asks.add(ask)
                ask.add_done_callback(_forget_ask(self._asks))
        raise ConnectionError(f"no cluster node answers CLUSTER NODES: {error!r}")

    async def _cluster_nodes(self, address: str) -> bytes:
        reply = await self.client(address).execute_command("CLUSTER", "NODES")  # type: ignore[no-untyped-call]
        return cast(bytes, reply)

    async def refresh(
        self, reply: bytes | None = None, views: Sequence[ClusterNode | None] = ()
    ) -> None:
        """Reread the topology (from `reply`, with each primary's own line in `views`
        preferred) and build the index on every primary that lacks it. Without a `reply`, a
        caller that waited for another refresh takes that one's outcome (its topology, or its
        error) rather than asking again: searches that all find a node gone reread once."""
        asked = self._refreshes
        async with self._lock:
            if reply is None and self._refreshes != asked:
                if self._refresh_error is not None:
                    raise self._refresh_error
                return
            try:
                await self._reread(reply, views)
            except Exception as exc:
                self._refresh_error, self._refreshes = exc, self._refreshes + 1
                raise
            self._refresh_error, self._refreshes = None, self._refreshes + 1

    async def _reread(self, reply: bytes | None, views: Sequence[ClusterNode | None]) -> None:
        nodes = parse_cluster_nodes(reply if reply is not None else await self._nodes_reply())
        own = {view.node_id: view for view in views if view is not None}
        nodes = [own.get(node.node_id, node) for node in nodes]
        shards = shards_of(nodes, self.schema.name)
        for shard in shards:
            if (shard.address, shard.index) not in self._ready:
                await self._build(shard)
        self.nodes, self.primaries, self.stale = nodes, shards, False

    def forget_indexes(self) -> None:
        """Every index is checked (and built) again at the next refresh (its topology
        must be reread: set `stale`)."""
        self._ready.clear()

    async def _build(self, shard: Shard) -> None:
        schema = dataclasses.replace(self.schema, name=shard.index)
        if shard.asking:  # the index name's slot is being imported: ASKING before each
            asking = self.connect(shard.address, _AskingRedis, single_connection_client=True)
            try:
                info = await schema.ensure(asking)
            finally:
                await asking.aclose()
        else:
            info = await schema.ensure(self.client(shard.address))
        # One of other fields is refused, in the words of the start-up check.
        self.schema.check_info(info, self.meta)
        self._ready.add((shard.address, shard.index))
        logger.info("Redis index %r ready on primary %s", shard.index, shard.address)

    async def aclose(self) -> None:
        await asyncio.gather(*self._asks, return_exceptions=True)
        for client in [*self._clients.values(), *self._writers.values()]:
            await client.aclose()
        self._clients.clear()
        self._writers.clear()


def _forget_ask(asks: set[asyncio.Task[bytes]]) -> Callable[[asyncio.Task[bytes]], None]:
    def forget(ask: asyncio.Task[bytes]) -> None:
        asks.discard(ask)
        if not ask.cancelled():
            ask.exception()  # retrieved: another node answered first

    return forget


class _AskingRedis(aioredis.Redis):
    """A client (single connection) that sends `ASKING` before every command."""

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        await super().execute_command("ASKING")  # type: ignore[no-untyped-call]
        return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
