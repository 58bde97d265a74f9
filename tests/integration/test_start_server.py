"""The integration tests' server start survives a port taken between `free_port` and the
server's bind (the embedded LLM's own server may take it): it starts again on another."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from tests.integration import conftest


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


def test_a_taken_port_is_replaced_by_a_free_one(
    tmp_path: Path, taken_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    ports = iter([taken_port])
    found = conftest.free_port
    monkeypatch.setattr(conftest, "free_port", lambda: next(ports, None) or found())
    server = conftest.start_server(tmp_path / "data", tmp_path / "server.log", command="retriever")
    try:
        assert not server.url.endswith(f":{taken_port}")
        assert httpx2.get(f"{server.url}/v1/health_check", timeout=5).status_code == 200
    finally:
        server.stop()


def test_another_early_exit_is_not_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(RuntimeError, match="server exited early") as raised:
        conftest.start_server(
            tmp_path / "data", tmp_path / "server.log", CHATQNA_MAX_MESSAGES="not a number"
        )
    assert not isinstance(raised.value, conftest.PortTaken)
