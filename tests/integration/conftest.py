"""Real server processes: `python -m chatqna serve` on a free loopback port, embedded backends."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx2
import pytest
import redis

from tests.integration.redis_server import RedisStackProcess, redis_stack_server

REPO = Path(__file__).resolve().parents[2]
SAMPLE_CORPUS = REPO / "chatqna" / "sample_corpus"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def clean_env(**extra: str) -> dict[str, str]:
    """The parent environment without ChatQnA's own variables, plus `extra`."""
    from chatqna.settings import Settings

    names = {name.upper() for name in Settings.model_fields}
    env = {k: v for k, v in os.environ.items() if k not in names}
    env.update(extra)
    return env


@dataclass
class ServerProcess:
    """A running `chatqna serve`; `stop()` ends it and returns what it logged."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)

    def stop(self) -> str:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        return self.log_path.read_text(errors="replace")


# `free_port` frees the port it found, so another socket may take it before the server
# binds: above all the embedded LLM's own server, which the lifespan starts on a port the
# kernel picks, before uvicorn binds the service's. Such a start is tried again.
PORT_TAKEN = "address already in use"
START_ATTEMPTS = 3


def start_server(
    data_dir: Path,
    log_path: Path,
    timeout: float = 90.0,
    ready_path: str = "/v1/ready",
    command: str = "serve",
    launcher: Sequence[str] = (),
    **env: str,
) -> ServerProcess:
    """`chatqna <command>` on a free port (run by `launcher`, e.g. `opentelemetry-instrument`,
    when given), once it answers `ready_path`; on a new port if the one found was taken."""
    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            return _start_server_once(
                data_dir, log_path, timeout, ready_path, command, launcher, env
            )
        except PortTaken:
            if attempt == START_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


class PortTaken(RuntimeError):
    """The server could not bind the port `free_port` found: something took it first."""


def _start_server_once(
    data_dir: Path,
    log_path: Path,
    timeout: float,
    ready_path: str,
    command: str,
    launcher: Sequence[str],
    env: dict[str, str],
) -> ServerProcess:
    port = free_port()
    full_env = clean_env(
        CHATQNA_DATA_DIR=str(data_dir),
        MEGA_SERVICE_PORT=str(port),
        RETRIEVER_SERVICE_PORT=str(port),
        CHATQNA_HOST="127.0.0.1",
        CHATQNA_LLM_THREADS="1",
        **env,
    )
    log = log_path.open("wb")
    process = subprocess.Popen(
        [*launcher, sys.executable, "-m", "chatqna", command],
        cwd=REPO,
        env=full_env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    server = ServerProcess(f"http://127.0.0.1:{port}", process, log_path, full_env)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            logged = server.stop()
            if f"{port}): {PORT_TAKEN}" in logged:
                raise PortTaken(f"port {port} was taken:\n{logged}")
            raise RuntimeError(f"server exited early:\n{logged}")
        try:
            if httpx2.get(f"{server.url}{ready_path}", timeout=2).status_code == 200:
                return server
        except httpx2.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"server not ready in {timeout}s:\n{server.stop()}")


def ingest_cli(
    data_dir: Path, *paths: Path, rebuild: bool = False
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "chatqna",
            "ingest",
            *(["--rebuild"] if rebuild else []),
            *map(str, paths),
        ],
        cwd=REPO,
        env=clean_env(CHATQNA_DATA_DIR=str(data_dir)),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )


@pytest.fixture(scope="module")
def sample_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One embedded-default server with the sample corpus, shared by a module's tests."""
    root = tmp_path_factory.mktemp("sample-server")
    ingest_cli(root / "data", SAMPLE_CORPUS)
    server = start_server(root / "data", root / "server.log")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def redis_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisStackProcess]:
    """One Redis Stack server on a free loopback port, shared by a module's tests."""
    with redis_stack_server(tmp_path_factory.mktemp("redis")) as running:
        yield running


@pytest.fixture
def redis_url(redis_stack: RedisStackProcess) -> str:
    """The module's Redis Stack server, emptied (data and indexes) for each test."""
    with redis.Redis.from_url(redis_stack.url, protocol=2) as client:
        client.flushall()
    return redis_stack.url
