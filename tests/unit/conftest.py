"""Unit tests never touch the network: any attempt to open an internet socket fails."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from chatqna.settings import Settings


class NetworkBlocked(RuntimeError):
    """Raised when a unit test tries to open a network connection."""


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    real_connect = socket.socket.connect

    def guarded(self: socket.socket, address: object) -> None:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            raise NetworkBlocked(f"unit tests must not open network connections ({address!r})")
        real_connect(self, address)  # type: ignore[arg-type]

    monkeypatch.setattr(socket.socket, "connect", guarded)
    yield


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings read the environment: start every test from the documented defaults."""
    for name in Settings.model_fields:
        monkeypatch.delenv(name.upper(), raising=False)
